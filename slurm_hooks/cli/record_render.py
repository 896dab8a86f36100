"""`record show`'s text form: one job record (schema slurm-hooks.job-record/1, docs/records.md),
as the epilog wrote it, laid out for a person. Every field is read defensively: a record is input
from a shared file system, and a missing or mistyped field shows as "?" rather than stopping."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List


def verified_label(verifier, path: str) -> str:
    """'verified', or why not: the whole file against the records key (signing.verify_file)."""
    from ..records import signing

    if verifier.key is None:
        return "NOT verified: %s" % verifier.why_not
    try:
        with open(path, "rb") as handle:
            data = handle.read(16 << 20)
    except OSError as exc:
        return "NOT verified: %s" % (exc.strerror or exc)
    node, name = os.path.basename(os.path.dirname(os.path.abspath(path))), os.path.basename(path)
    status = signing.verify_file(data, verifier.key, node, name)
    return status if status == signing.VERIFIED else "NOT verified: %s" % status


def render_record(record: Dict[str, Any], path: str = "", verified: str = "") -> str:
    """One record readably. The header is checked (fleet_report.header_problem); the body's parts
    of another shape are left out (_objects), never a traceback."""
    job, summary = _object(record.get("job")), _object(record.get("summary"))
    lines = [
        "job %s on %s (user %s, GPUs %s)%s"
        % (
            job.get("id"),
            record.get("node"),
            job.get("user"),
            _gpus(job.get("gpus")),
            "  [%s]" % path if path else "",
        ),
        "  %s -> %s (%s)"
        % (
            _when(record.get("start")),
            _when(record.get("end")),
            _duration(record.get("duration_s")),
        ),
    ]
    if verified:
        lines.append("  record %s (records key: docs/records.md)" % verified)
    if record.get("prolog_snapshot") != "ok":
        lines.append(
            "  prolog snapshot: %s -- no deltas for this job" % record.get("prolog_snapshot")
        )
    if str(record.get("epilog_snapshot", "ok")) != "ok":
        lines.append("  epilog snapshot: %s" % record.get("epilog_snapshot"))
    if record.get("rebooted_during_job"):
        lines.append("  the node rebooted during the job: counters not comparable")
    lines.append("  abnormal: %s" % (", ".join(summary.get("abnormal") or []) or "nothing"))
    lines.append(
        "  throttle %.1fs, energy %.0f J, leftover processes %d, leftover memory %s"
        % (
            summary.get("throttle_s") or 0,
            summary.get("energy_j") or 0,
            summary.get("leftover_processes") or 0,
            _bytes(summary.get("leftover_memory_bytes") or 0),
        )
    )
    for gpu in _objects(record.get("gpus")):
        lines.extend(_gpu_lines(gpu))
    for port in _objects(record.get("ib")):
        moved = {k: v for k, v in _object(port.get("delta")).items() if v}
        if moved:
            lines.append("  ib %s: %s" % (port.get("port"), _pairs(moved)))
    lines.extend(_event_lines(record))
    lines.extend(_check_lines(record))
    for note in _list(record.get("notes")):
        lines.append("  note: %s" % (note,))
    return "\n".join(lines) + "\n"


def _gpu_lines(gpu: Dict[str, Any]) -> List[str]:
    lines = [
        "  gpu %s %s %s serial %s"
        % (gpu.get("index"), gpu.get("bus_id"), gpu.get("uuid"), gpu.get("serial"))
    ]
    delta = gpu.get("delta")
    moved = {
        k: v
        for k, v in _object(delta).items()
        if v and not k.startswith(("energy", "violation_ns.low"))
    }
    if delta is None:
        lines.append("    no deltas")
    elif moved:
        lines.append("    changed: %s" % _pairs(moved))
    links = _object(gpu.get("nvlink_delta"))
    for link in sorted(links, key=lambda k: (len(k), k)):
        lines.append("    nvlink %s: %s" % (link, _pairs(_object(links[link]))))
    flags = [k for k, v in _object(gpu.get("flags")).items() if v]
    if flags:
        lines.append("    flags: %s" % ", ".join(flags))
    for proc in _objects(gpu.get("processes")):
        lines.append(
            "    leftover process %s (%s) using %s"
            % (proc.get("pid"), proc.get("name"), _bytes(proc.get("used_memory_bytes")))
        )
    if gpu.get("counter_resets"):
        lines.append(
            "    counters reset during the job: %s"
            % ", ".join(str(c) for c in _list(gpu["counter_resets"]))
        )
    if gpu.get("unavailable"):
        lines.append("    not readable: %s" % _pairs(_object(gpu["unavailable"])))
    return lines


def _event_lines(record: Dict[str, Any]) -> List[str]:
    lines = []
    scope = record.get("events_scope")
    suffix = "" if scope == "job" else " (no prolog position: whole boot shown)"
    for event in _objects(record.get("xids")):
        lines.append(
            "  Xid %s on %s%s%s: %s -> %s/%s%s"
            % (
                event.get("xid"),
                event.get("pci"),
                " (gpu %s)" % (event["job_gpu"],) if event.get("job_gpu") is not None else "",
                " at %s" % _when(event["time"]) if event.get("time") is not None else "",
                event.get("text"),
                event.get("status"),
                event.get("action"),
                suffix,
            )
        )
    for event in _objects(record.get("sxids")):
        lines.append(
            "  SXid %s on switch %s link %s: %s -> %s%s"
            % (
                event.get("sxid"),
                event.get("switch"),
                event.get("link"),
                event.get("text"),
                event.get("status"),
                suffix,
            )
        )
    return lines


def _check_lines(record: Dict[str, Any]) -> List[str]:
    checks, decision = _object(record.get("checks")), _object(record.get("decision"))
    lines = []
    if checks:
        lines.append(
            "  epilog checks: %s (%d passed)"
            % (checks.get("status"), len(_list(checks.get("passed"))))
        )
        for result in _objects(checks.get("results")):
            lines.append(
                "    %-7s %s %s: %s"
                % (
                    result.get("status"),
                    result.get("check"),
                    result.get("component") or "node",
                    result.get("summary"),
                )
            )
    if decision:
        lines.append(
            "  decision: %s%s%s"
            % (
                decision.get("verdict"),
                " (%s)" % (decision["outcome"],) if decision.get("outcome") else "",
                ": %s" % (decision["reason"],) if decision.get("reason") else "",
            )
        )
    return lines


def _object(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def _objects(value: Any) -> List[Dict[str, Any]]:
    """The objects of a list: what a body part of another shape leaves to show."""
    return [item for item in _list(value) if isinstance(item, dict)]


def _pairs(values: Dict[str, Any]) -> str:
    return ", ".join("%s=%s" % (k, v) for k, v in values.items())


def _gpus(gpus: Any) -> str:
    if gpus is None:
        return "all"
    if not isinstance(gpus, list):
        return "?"
    return ",".join(str(g) for g in gpus) or "none"


def _when(epoch: Any) -> str:
    from ..records.header_check import number

    if not number(epoch) or not 0 <= epoch < 1 << 36:  # time_t and the calendar both end
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _duration(seconds: Any) -> str:
    from ..records.header_check import number

    if not number(seconds):
        return "duration unknown"
    hours, rest = divmod(int(seconds), 3600)
    return "%dh%02dm%02ds" % (hours, rest // 60, rest % 60)


def _bytes(value: Any) -> str:
    from ..records.header_check import number

    if not number(value):
        return "?" if value else "0 B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return "%.0f %s" % (value, unit) if unit == "B" else "%.1f %s" % (value, unit)
        value /= 1024.0
    return str(value)
