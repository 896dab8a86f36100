"""Build a job record (schema slurm-hooks.job-record/1, see docs/records.md) from two snapshots.

Pure functions: store.py does the I/O. `summarize` computes the record's "summary" block, the
only part `slurm-hooks report` reads, so the report stays fast over thousands of records.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import __version__
from ..result import Status
from ..slurm.policy import DELIVERED
from . import ib_counter_trust
from .counters import CLOCK_EVENT_FIELDS, THROTTLE_REASONS, deltas
from .perf import cpu_window, hardware_class, ib_traffic, perf_block

RECORD_SCHEMA = "slurm-hooks.job-record/1"
MAX_EVENTS = 100  # Xid/SXid events kept in one record (the count is always exact)
THROTTLE_ABNORMAL_FRACTION = 0.05  # clocks held down for 5% of the job's GPU-time is worth a look
DRAIN_OUTCOMES = frozenset(
    outcome.value for outcome in DELIVERED
)  # as the record's decision.outcome spells them


def build_record(
    job,
    node: str,
    before: Optional[Dict[str, Any]],
    prolog_state: str,
    after: Optional[Dict[str, Any]],
    epilog_why: str,
    report,
    decision,
    enacted,
    settings: Mapping[str, Mapping[str, Any]],
    now: Optional[float] = None,
) -> Dict[str, Any]:
    now = time.time() if now is None else now
    end = after.get("time", now) if after else now
    start = before.get("time") if before else None
    rebooted = _rebooted(before, after)
    comparable = before is not None and after is not None and not rebooted
    record: Dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "version": __version__,
        "job": {
            "id": job.job_id,
            "user": job.user,
            "gpus": list(job.gpus) if job.gpus is not None else None,
        },
        "node": node,
        "start": start,
        "end": round(end, 3),
        "end_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)),
        "duration_s": round(end - start, 3) if start is not None else None,
        "prolog_snapshot": prolog_state,
        "epilog_snapshot": "ok" if after is not None else "failed: %s" % epilog_why,
        "rebooted_during_job": rebooted,
        # the boot the job ended in (/proc/sys/kernel/random/boot_id at the epilog, else the prolog):
        # report --stragglers starts a node's window again when it changes (a repair reboots)
        "boot_id": (after or {}).get("boot_id") or (before or {}).get("boot_id"),
        "notes": list((before or {}).get("notes", [])) + list((after or {}).get("notes", [])),
    }
    record["gpus"] = _gpu_entries(before, after, comparable)
    record["ib"] = _ib_entries(before, after, comparable)
    record["cpu"] = (
        cpu_window((before or {}).get("cpu"), (after or {}).get("cpu")) if comparable else None
    )
    record.update(_kernel_events(before, after, comparable, record["gpus"]))
    record["clock_max_error_s"] = (after or {}).get(
        "clock_max_error_s"
    )  # counters.wall_clock_error
    record["checks"] = _checks(report)
    record["decision"] = _decision(decision, enacted)
    record["timings"] = {
        "prolog_snapshot_s": (before or {}).get("duration_s"),
        "epilog_snapshot_s": (after or {}).get("duration_s"),
        "checks_s": round(report.duration, 4) if report is not None else None,
    }
    record["summary"] = summarize(record, settings["records"]["leftover_memory_mib"] << 20)
    record["perf_unavailable"] = perf_block(record)[1]
    return record


def _rebooted(before: Optional[Dict[str, Any]], after: Optional[Dict[str, Any]]) -> bool:
    """Different boot ids, or (boot id unreadable) a kernel log position that went backwards."""
    if not before or not after:
        return False
    if before.get("boot_id") and after.get("boot_id"):
        return before["boot_id"] != after["boot_id"]
    b, a = before.get("kmsg_seq"), after.get("kmsg_seq")
    return b is not None and a is not None and a < b


def _gpu_entries(before, after, comparable: bool) -> List[Dict[str, Any]]:
    start = {g.get("index"): g for g in (before or {}).get("gpus", [])}
    out = []
    for gpu in (after or before or {}).get("gpus", []):
        entry = {k: gpu.get(k) for k in ("index", "uuid", "serial", "bus_id", "name")}
        entry["end"] = gpu.get("counters", {}) if after else None
        entry["flags"] = gpu.get("flags", {}) if after else {}
        entry["unavailable"] = gpu.get("unavailable", {})
        old = start.get(gpu.get("index"))
        same_gpu = old is not None and old.get("uuid") == gpu.get("uuid")
        if comparable and same_gpu:
            entry["delta"], entry["counter_resets"] = deltas(
                old.get("counters", {}), gpu.get("counters", {})
            )
            entry["nvlink_delta"] = _link_deltas(old.get("nvlink", {}), gpu.get("nvlink", {}))
        else:
            entry["delta"], entry["counter_resets"], entry["nvlink_delta"] = None, [], {}
        if after:
            entry["processes"] = gpu.get("processes", [])
            entry["memory_used_bytes"] = gpu.get("memory_used_bytes")
        out.append(entry)
    return out


def _link_deltas(
    before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]]
) -> Dict[str, Dict[str, int]]:
    """Only links whose error counters moved: which link is bad is what the operator needs."""
    out = {}
    for link, values in after.items():
        moved = {k: v for k, v in deltas(before.get(link, {}), values)[0].items() if v}
        if moved:
            out[link] = moved
    return out


def _ib_entries(before, after, comparable: bool) -> List[Dict[str, Any]]:
    """Per port: error counter deltas (`delta`) and, apart, traffic deltas (`traffic`: perf only)."""
    start = (before or {}).get("ib", {})
    start_traffic = (before or {}).get("ib_perf") or {}
    end_traffic = (after or {}).get("ib_perf") or {}
    out = []
    for port, values in sorted(((after or {}).get("ib") or {}).items()):
        delta, resets = (
            deltas(start.get(port, {}), values) if comparable and port in start else (None, [])
        )
        entry = {"port": port, "delta": delta, "counter_resets": resets}
        if comparable and port in start_traffic and port in end_traffic:
            entry["traffic"] = ib_traffic(start_traffic[port], end_traffic[port])
            untrusted = ib_counter_trust.judge(start_traffic[port], end_traffic[port])
            if untrusted:  # saturated or cleared: perf reports the figure as unmeasurable
                entry["traffic_untrusted"] = untrusted
                bounds = ib_counter_trust.lower_bounds(start_traffic[port], end_traffic[port])
                if bounds:  # what it surely counted: perf's lower bound on the stall rate
                    entry["traffic_lower_bound"] = bounds
        out.append(entry)
    return out


def _kernel_events(before, after, comparable: bool, gpus: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Xids/SXids since the prolog's kernel log position; without one, those of the whole boot,
    marked scope "boot" (they are listed but not counted against the job)."""
    from ..xid.catalog import classify_all, classify_sxid
    from ..xid.kmsg import scan_all

    lines = (after or {}).get("xid_lines")
    if lines is None:
        return {
            "events_scope": None,
            "xid_count": None,
            "sxid_count": None,
            "xids": [],
            "sxids": [],
        }
    since = before.get("kmsg_seq") if comparable else None
    scope = "job" if since is not None else "boot"
    xids, sxids = scan_all(lines, since_seq=since)
    by_bus = {g["bus_id"]: g["index"] for g in gpus if g.get("bus_id")}
    dated = _kernel_time(after)
    xid_rows = []
    for event, cls in zip(xids[:MAX_EVENTS], classify_all(xids[:MAX_EVENTS])):
        xid_rows.append(
            {
                "xid": event.xid,
                "pci": event.pci,
                "job_gpu": by_bus.get(event.pci),
                "seq": event.seq,
                "time": dated(event.usec),
                "pid": event.pid,
                "text": event.text[:200],
                "status": cls.status,
                "action": cls.action,
                "blame": cls.blame,
            }
        )
    sxid_rows = []
    for event in sxids[:MAX_EVENTS]:
        cls = classify_sxid(event)
        sxid_rows.append(
            {
                "sxid": event.sxid,
                "pci": event.pci,
                "switch": event.switch,
                "link": event.link,
                "severity": event.severity,
                "seq": event.seq,
                "text": event.text[:200],
                "status": cls.status,
                "action": cls.action,
            }
        )
    return {
        "events_scope": scope,
        "xid_count": len(xids),
        "sxid_count": len(sxids),
        "xids": xid_rows,
        "sxids": sxid_rows,
    }


# printk's clock and CLOCK_MONOTONIC_RAW start at slightly different moments of the boot: a record
# stamped up to this much after the clock was read is still this boot's (dated a little late)
KERNEL_CLOCK_SLACK_S = 60.0


def _kernel_time(after: Dict[str, Any]):
    """A function: a kernel log record's `usec` -> its wall-clock time (Unix seconds, ms), from the
    epilog snapshot's wall time and kernel-log clock read together (counters.kernel_log_clock);
    None without them (a snapshot of an older version) or for a record without a time. Good to
    the node's NTP offset plus the drift between the two clocks since the Xid (docs/records.md,
    "One job's Xids, lined up")."""
    wall, kernel = after.get("time"), after.get("kernel_clock_s")
    known = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (wall, kernel))

    def dated(usec: Optional[int]) -> Optional[float]:
        if not known or usec is None or usec < 0 or usec / 1e6 > kernel + KERNEL_CLOCK_SLACK_S:
            return None  # well after the clock was read: not this boot's record, or a bad clock
        return round(wall - (kernel - usec / 1e6), 3)

    return dated


_QUIET = (Status.OK, Status.SKIP)  # a record lists these by check name only


def _checks(report) -> Optional[Dict[str, Any]]:
    """Non-passing results in full; passing checks by name only (keeps records small)."""
    if report is None:
        return None
    troubled, passed = [], []
    for run in report.runs:
        if run.status in _QUIET:
            passed.append(run.name)
        else:
            troubled.extend(r.to_dict() for r in run.results if r.status not in _QUIET)
    return {
        "context": report.context,
        "status": report.status.value,
        "deadline_hit": report.deadline_hit,
        "results": troubled,
        "passed": passed,
    }


def _decision(decision, enacted) -> Optional[Dict[str, Any]]:
    if decision is None:
        return None
    return {
        "verdict": decision.verdict.value,
        "blame": decision.blame.value if decision.blame else None,
        "reason": decision.reason or None,
        "checks": list(decision.checks),
        "outcome": enacted.outcome.value if enacted is not None else None,
        "message": enacted.message if enacted is not None else None,
    }


# -- summary -------------------------------------------------------------------------------------

_SUM_KEYS = {  # summary field -> delta counters summed over the job's GPUs
    "ecc_corrected": ("ecc.volatile.corrected",),
    "ecc_uncorrected": ("ecc.volatile.uncorrected",),
    "remapped_rows": ("remapped_rows.corrected", "remapped_rows.uncorrected"),
    "retired_pages": ("retired_pages.single_bit", "retired_pages.double_bit"),
    "nvlink_errors": (
        "nvlink.replay",
        "nvlink.recovery",
        "nvlink.crc_flit",
        "nvlink.crc_data",
        "nvlink.ecc_data",
    ),
    "pcie_replays": ("pcie.replay",),
}
ERROR_FIELDS = tuple(_SUM_KEYS) + ("ib_errors",)
# what `report` adds up per node (fleet_report folds them, fleet_output shows them)
SUM_FIELDS = ERROR_FIELDS + ("xids", "sxids", "throttle_s", "leftover_processes", "energy_j")


def _held_down_ns(delta: Dict[str, int]) -> int:
    """One GPU's time held below its clocks by a limit during the job: the larger of the violation
    counters' sum (nvmlDeviceGetViolationStatus: power, thermal, board limit, reliability, sync
    boost) and the clock-event fields' sum (R535+, nvmlDeviceGetFieldValues: SW power cap, SW and
    HW thermal, HW power brake, sync boost). Either may be missing: the violation API is deprecated
    in NVML 13, and a driver may answer only some violation counters, so taking only one source
    read 0 s for a GPU held down by HW slowdown. Reasons that overlap in time are summed in both,
    so this is an upper bound (as the violation counters always were)."""
    violations = sum(delta.get("violation_ns." + reason) or 0 for reason in THROTTLE_REASONS)
    events = sum(delta.get("clock_event_ns." + name) or 0 for name, _field in CLOCK_EVENT_FIELDS)
    return max(violations, events)


def summarize(record: Dict[str, Any], leftover_memory_bytes: int) -> Dict[str, Any]:
    """The numbers `report` aggregates, and `abnormal`: the names of those worth a look."""
    gpus = record.get("gpus") or []
    have_deltas = any(g.get("delta") is not None for g in gpus) or any(
        p.get("delta") is not None for p in record.get("ib") or []
    )
    summary: Dict[str, Any] = {"deltas": have_deltas}
    for field, keys in _SUM_KEYS.items():
        summary[field] = sum((g.get("delta") or {}).get(k, 0) for g in gpus for k in keys)
    summary["ib_errors"] = sum(sum((p.get("delta") or {}).values()) for p in record.get("ib") or [])
    throttle_ns = sum(_held_down_ns(g.get("delta") or {}) for g in gpus)
    summary["throttle_s"] = round(throttle_ns / 1e9, 3)
    summary["energy_j"] = round(
        sum((g.get("delta") or {}).get("energy_mj", 0) for g in gpus) / 1000.0, 1
    )
    scoped = record.get("events_scope") == "job"
    summary["xids"] = (record.get("xid_count") or 0) if scoped else 0
    summary["sxids"] = (record.get("sxid_count") or 0) if scoped else 0
    if summary["xids"]:  # in the header: report --xids lines up a job's nodes by it
        summary["xid_times"] = xid_times(record.get("xids") or [], summary["xids"])
        if record.get("clock_max_error_s") is not None:  # how far those times may be off
            summary["xid_clock_error_s"] = record["clock_max_error_s"]
    summary["leftover_processes"] = sum(len(g.get("processes") or []) for g in gpus)
    summary["leftover_memory_bytes"] = sum(g.get("memory_used_bytes") or 0 for g in gpus)
    summary["pending_repair"] = any(v for g in gpus for v in (g.get("flags") or {}).values())
    checks = record.get("checks") or {}
    decision = record.get("decision") or {}
    summary["status"] = checks.get("status")
    summary["drained"] = decision.get("outcome") in DRAIN_OUTCOMES
    summary["abnormal"] = _abnormal(summary, record, leftover_memory_bytes)
    summary["perf"] = perf_block(record)[0]
    summary["hw_class"] = hardware_class(record)
    untrusted = ib_counter_trust.untrusted_figures(record.get("ib") or [])
    if untrusted:  # in the header: report --stragglers names what it could not score, and why
        summary["perf_untrusted"] = untrusted
    return summary


MAX_XID_CODES = 16  # distinct Xid codes a summary dates (a record lists up to MAX_EVENTS events)


def xid_times(rows: List[Dict[str, Any]], count: int) -> List[List[Any]]:
    """[[xid, first time or None, events, blame of the first], ...] by first time: the job's Xids
    per code in the summary (the header the reports read alone). Events beyond the record's list
    (count > the rows) appear as one [null, null, n, null] entry: nothing is known of them."""
    codes: Dict[int, List[Any]] = {}
    for row in rows:
        xid, when = row.get("xid"), row.get("time")
        entry = codes.get(xid)
        if entry is None:
            codes[xid] = [xid, when, 1, row.get("blame")]
            continue
        entry[2] += 1
        if when is not None and (entry[1] is None or when < entry[1]):
            entry[1], entry[3] = when, row.get("blame")
    ordered = sorted(codes.values(), key=lambda e: (e[1] is None, e[1] or 0.0, e[0]))
    out = ordered[:MAX_XID_CODES]
    unlisted = count - sum(e[2] for e in out)
    if unlisted > 0:
        out.append([None, None, unlisted, None])
    return out


def _abnormal(
    summary: Dict[str, Any], record: Dict[str, Any], leftover_memory_bytes: int
) -> List[str]:
    found = [f for f in ERROR_FIELDS + ("xids", "sxids", "leftover_processes") if summary[f]]
    if summary["leftover_memory_bytes"] > leftover_memory_bytes:
        found.append("leftover_memory")
    gpu_seconds = (record.get("duration_s") or 0) * max(len(record.get("gpus") or []), 1)
    if gpu_seconds and summary["throttle_s"] > THROTTLE_ABNORMAL_FRACTION * gpu_seconds:
        found.append("throttle")
    if summary["pending_repair"]:
        found.append("pending_repair")
    if summary["status"] in ("FAIL", "UNKNOWN"):
        found.append("checks_" + summary["status"].lower())
    if summary["drained"]:
        found.append("drained")
    if record.get("rebooted_during_job"):
        found.append("rebooted")
    return found


def rank_key(summary: Mapping[str, Any]) -> Tuple[float, ...]:
    """Sort key of a node's badness: hard errors, soft errors, throttle, leftovers (report ranks by it).
    A field that is absent or not a number (null in an older record) counts 0."""

    def value(name: str) -> float:
        found = summary.get(name)
        return found if isinstance(found, (int, float)) and not isinstance(found, bool) else 0

    hard = sum(
        value(n) for n in ("xids", "sxids", "ecc_uncorrected", "remapped_rows", "retired_pages")
    )
    soft = sum(value(n) for n in ("ecc_corrected", "nvlink_errors", "pcie_replays", "ib_errors"))
    return hard, soft, value("throttle_s"), value("leftover_processes")
