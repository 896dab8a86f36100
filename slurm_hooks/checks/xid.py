"""Family `xid`: NVIDIA Xid (GPU) and NVSwitch SXid errors in the kernel log since boot.

Where the data comes from: the kernel ring buffer, read from /dev/kmsg (the records `dmesg` and
`journalctl -k -b` show; `dmesg | grep -E 'NVRM: Xid|SXid'` by hand); the boot id from
/proc/sys/kernel/random/boot_id; and the acknowledgement file <[paths] state_dir>/xid-ack.json that
`slurm-hooks xid ack` writes when an admin has fixed a GPU. Parsing is slurm_hooks.xid.kmsg, meaning
(NVIDIA's Xid catalog) is slurm_hooks.xid.catalog; `slurm-hooks explain xid N` prints what one code means.

Position and acknowledgement: everything still in the ring buffer counts (it starts empty at boot,
so "since boot"); an admin clears events with `slurm-hooks xid ack` (entries {boot_id, seq}: the
kmsg sequence number of one record in one boot). A reboot clears everything, since sequence
numbers restart and the boot id changes. Limit: an old Xid that the ring buffer has overwritten
is no longer seen (a GPU that fell off the bus still fails gpu.count).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping

from ..core.atomicio import read_ours
from ..core.structs import Struct, field
from ..hw.host import HostError
from ..registry import CONTEXTS, Deprecated, Param, check, gatherer
from ..result import Action, Blame, Result, Status
from ..xid.kmsg import KmsgView, SxidEvent, XidEvent, gc_paused, scan_all
from ..xid.kmsg import view as kmsg_view
from .gpu import inventory as _inventory  # noqa: F401  (registers the gpu.inventory gatherer we map bus ids with)

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple


def _catalog():
    """slurm_hooks.xid.catalog (its module, its patterns): imported when an Xid, an SXid or an
    override needs it, so a healthy prolog's processes never import it (round 8)."""
    from ..xid import catalog

    return catalog


KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
ACK_FILE = "xid-ack.json"
ACK_SCHEMA = "slurm-hooks.xid-ack/1"
NVML_WAIT_S = (
    1.5  # a GPU that fell off the bus can hang NVML: map bus ids without it rather than hang
)
MAX_LISTED = 20  # events listed in one result's details
ALL = CONTEXTS  # every context
_ACTION_RANK = {"none": 0, "drain": 1, "reset-gpu": 2, "reboot": 3, "rma": 4}


# -- gatherers ---------------------------------------------------------------------------------


class KernelLog(Struct):
    """The Xid/SXid lines of the kernel log, and which of them an admin acknowledged.

    `xids` and `sxids` are parsed when first asked for, each on its own: xid.sxid does not wait for
    the Xid lines of a flooded log to be parsed (100,000 of them: bench/xid_scale.py), nor xid.events
    for the SXids. Parsing is pure, so two threads asking at once at worst both parse.
    """

    boot_id: Optional[str]
    lines: Tuple[str, ...]  # the message line of every record mentioning Xid or SXid, oldest first
    acked: FrozenSet[int]  # kmsg sequence numbers acknowledged for this boot
    notes: Tuple[str, ...] = ()  # problems worth showing (corrupt ack file, unknown boot id)
    kmsg: Optional[KmsgView] = None  # the read itself: the hooks' counter snapshot reuses it
    parsed: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def xids(self) -> Tuple[XidEvent, ...]:
        if "xids" not in self.parsed:
            self.parsed["xids"] = tuple(scan_all(self.lines, kinds=("xid",))[0])
        return self.parsed["xids"]

    @property
    def sxids(self) -> Tuple[SxidEvent, ...]:
        if "sxids" not in self.parsed:
            self.parsed["sxids"] = tuple(scan_all(self.lines, kinds=("sxid",))[1])
        return self.parsed["sxids"]


class GpuMap(Struct):
    """PCI bus id (0000:3b:00.0) -> NVML GPU index; `by_bus` is None when NVML could not tell."""

    by_bus: Optional[Mapping[str, int]]
    error: Optional[str] = None


def ack_path(state_dir: str) -> str:
    return state_dir.rstrip("/") + "/" + ACK_FILE


def parse_acks(text: Optional[str]) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Entries of an ack file ({"schema", "acks": [{boot_id, seq, ...}]} or a bare list), and a problem.

    Never raises: a missing file is no entries; a corrupt one is no entries plus a message; bad
    entries are dropped (and counted in the message).
    """
    if text is None or not text.strip():
        return [], None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return [], "ack file is not JSON (%s); ignoring it" % exc
    entries = data.get("acks") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        return [], "ack file has no 'acks' list; ignoring it"
    good = [
        e
        for e in entries
        if isinstance(e, dict)
        and isinstance(e.get("boot_id"), str)
        and isinstance(e.get("seq"), int)
        and not isinstance(e.get("seq"), bool)
    ]
    bad = len(entries) - len(good)
    return good, ("ack file: %d malformed entries ignored" % bad if bad else None)


@gatherer("xid.log")
def read_kernel_log(ctx) -> KernelLog:
    """/dev/kmsg records mentioning Xid/SXid, /proc/sys/kernel/random/boot_id, <state_dir>/xid-ack.json."""
    host = ctx.host
    seen = kmsg_view(host.read_kmsg(KMSG))  # a live record's "\n KEY=value" lines are dropped there
    lines = list(seen.xid_lines)
    boot_id = (host.read_text(BOOT_ID, default="") or "").strip() or None
    path = ack_path(ctx.config.get("paths", "state_dir"))
    notes: List[str] = []
    try:  # an ack excuses an Xid: believed only from a file we wrote (atomicio.read_ours), so a
        # user who can write the state directory cannot plant one that acknowledges a real fault
        raw = read_ours(host.real(path), 1 << 20)
        text = None if raw is None else raw.decode("utf-8", errors="replace")
    except (
        HostError,
        OSError,
        ValueError,
    ) as exc:  # unreadable, or a relative state_dir: never hide an Xid over it
        text = None
        notes.append("cannot read the ack file: %s" % exc)
    entries, problem = parse_acks(text)
    if problem:
        notes.append("%s: %s" % (path, problem))
    if boot_id is None:
        notes.append("%s unreadable: acknowledgements not applied" % BOOT_ID)
    acked = frozenset(e["seq"] for e in entries if boot_id is not None and e["boot_id"] == boot_id)
    return KernelLog(boot_id, tuple(lines), acked, tuple(notes), seen)


@gatherer("xid.gpus")
def read_gpu_map(ctx) -> GpuMap:
    """Bus id -> GPU index from the gpu.inventory gatherer (NVML), waited for at most NVML_WAIT_S.

    NVML may hang on exactly the GPU an Xid is about; then events are reported per PCI address
    (and count for every job) instead of the whole check timing out. Without Xids, NVML is not asked.
    """
    try:
        if not ctx.get("xid.log").xids:
            return GpuMap({})
    except Exception:  # xid.events reports the unreadable log itself
        return GpuMap(None, "kernel log unreadable")
    box: List[Any] = []

    def work() -> None:
        try:
            box.append(ctx.get("gpu.inventory"))
        except Exception as exc:  # reported as "could not map", never fatal here
            box.append(exc)

    worker = threading.Thread(target=work, name="check:xid.gpus", daemon=True)
    worker.start()
    worker.join(NVML_WAIT_S)
    if not box:
        return GpuMap(None, "NVML did not answer within %gs" % NVML_WAIT_S)
    inventory = box[0]
    if isinstance(inventory, Exception):
        return GpuMap(None, "gpu.inventory failed: %s" % inventory)
    if inventory.error is not None:
        return GpuMap(None, str(inventory.error))
    return GpuMap({device.bus_id: device.index for device in inventory.devices})


# -- parameters --------------------------------------------------------------------------------


def parse_overrides(entries: Sequence[str], label: str = "overrides") -> Dict[int, Dict[str, str]]:
    """['79=FAIL:rma', '13=OK'] -> {79: {'status': 'FAIL', 'action': 'rma'}, 13: {'status': 'OK'}}.

    Syntax: CODE=STATUS[:ACTION], STATUS one of OK, WARN, FAIL, UNKNOWN; ACTION one of drain,
    reset-gpu, reboot, rma (FAIL without one keeps the catalog's action, or drain). Raises
    ValueError naming the entry.
    """
    out: Dict[int, Dict[str, str]] = {}
    for entry in entries:
        code, sep, value = entry.partition("=")
        status, _, action = value.partition(":")
        spec = {"status": status.strip()}
        if action.strip():
            spec["action"] = action.strip()
        try:
            if not sep or not status.strip():
                raise ValueError("expected CODE=STATUS[:ACTION], e.g. '79=FAIL:reboot' or '13=OK'")
            clean = _catalog().validate_overrides({code.strip(): spec})
            (number,) = clean
            if clean[number]["status"] == "FAIL" and clean[number].get("action") == "none":
                raise ValueError(
                    "FAIL needs an action (drain, reset-gpu, reboot, rma); leave it out to keep "
                    "the catalog's"
                )
            if number in out:
                raise ValueError("code %d is overridden twice" % number)
        except ValueError as exc:
            raise ValueError("%s entry %r: %s" % (label, entry, exc)) from None
        out.update(clean)
    return out


_SYNTAX = "(status: OK, WARN, FAIL, UNKNOWN; action: drain, reset-gpu, reboot, rma)"


def overrides_param(check_name: str, kind: str) -> Callable[[Any], Any]:
    """The converter of the `overrides` parameter, run when the config is loaded (registry.Param.convert).

    The form is a TOML table of tables keyed by code: ``79 = {status = "FAIL", action = "rma"}``
    (keys status, action, blame, reason: xid.validate_overrides). The earlier list of
    "CODE=STATUS[:ACTION]" strings is still accepted, with a deprecation warning that spells out
    the same entries as a table, so an existing configuration keeps working and says how to move on.
    A bad entry in either form is refused at load, naming the entry.
    """

    def convert(value: Any) -> Any:
        if isinstance(value, list):
            if not all(isinstance(entry, str) for entry in value):
                raise ValueError(
                    'expected a table of %s codes, e.g. 79 = {status = "FAIL", action = "rma"}'
                    % kind
                )
            clean = parse_overrides(value, "overrides")
            return Deprecated(
                clean,
                "the list of CODE=STATUS[:ACTION] strings is deprecated (still applied); "
                "write it as a table:\n%s" % _as_table(check_name, clean),
            )
        if not isinstance(value, Mapping):
            raise ValueError(
                'expected a table of %s codes, e.g. [checks."%s".overrides] 79 = {status = "FAIL", '
                'action = "rma"}, got %s %r' % (kind, check_name, type(value).__name__, value)
            )
        clean = _catalog().validate_overrides(value)
        for number, spec in clean.items():
            if spec.get("status") == "FAIL" and spec.get("action") == "none":
                raise ValueError(
                    "%s %d: status FAIL needs an action (drain, reset-gpu, reboot, rma); leave action "
                    "out to keep the catalog's" % (kind, number)
                )
        return clean

    return convert


def _as_table(check_name: str, overrides: Mapping[int, Mapping[str, str]]) -> str:
    lines = ['  [checks."%s".overrides]' % check_name]
    for number, spec in sorted(overrides.items()):
        lines.append(
            "  %d = {%s}" % (number, ", ".join('%s = "%s"' % item for item in spec.items()))
        )
    return "\n".join(lines)


def _overrides(params) -> Dict[int, Dict[str, str]]:
    """The validated overrides (config.py converted them at load); a raw list only from hand-built Params."""
    value = params.overrides
    return parse_overrides(value) if isinstance(value, list) else dict(value)


def _bad_params(name: str, exc: ValueError) -> Result:
    return Result(
        name,
        Status.UNKNOWN,
        '[checks."%s"] %s' % (name, exc),
        blame=Blame.CHECK,
        details={"error": str(exc)},
    )


# -- checks ------------------------------------------------------------------------------------


@check(
    name="xid.events",
    contexts=ALL,
    timeout=3.0,
    needs=("xid.log", "xid.gpus", "job"),
    params=(
        Param(
            "overrides",
            dict,
            {},
            "decisions replacing the catalog's, a table keyed by Xid: "
            '[checks."xid.events".overrides] 79 = {status = "FAIL", action = "rma"}, 13 = {status = "OK"} '
            + _SYNTAX
            + "; the older list of '79=FAIL:rma' strings is still read, with a deprecation warning",
            convert=overrides_param("xid.events", "Xid"),
        ),
        Param(
            "ignore",
            list,
            [],
            "Xids left out entirely (not reported, not counted)",
            item_type=int,
            minimum=1,
            maximum=100000,
        ),
    ),
)
def xid_events(log: KernelLog, gpus: GpuMap, job, params) -> List[Result]:
    """No GPU Xid error since boot that breaks the node (or, as a warning, the job).

    Each unacknowledged Xid in the kernel log (/dev/kmsg; `dmesg`, `journalctl -k -b`) is looked up
    in NVIDIA's Xid catalog. FAIL: the GPU needs a reset (`nvidia-smi -r -i N` with no process on
    it), the node a reboot, or a human (drain) - the action says which; once fixed, clear it with
    `slurm-hooks xid ack --all` (a reboot clears it anyway). WARN blamed on the job: the application
    crashed the GPU context (e.g. Xid 13, 31, 43); the node is fine, the user should debug their code.
    UNKNOWN: an Xid our catalog does not know (`slurm-hooks explain xid N`); never drains. In a job
    (prolog/epilog with GPUs), Xids on GPUs not allocated to it are left out; those NVML cannot map
    count for every job. Operators override decisions per Xid with `overrides`.
    """
    try:
        overrides = _overrides(params)
    except ValueError as exc:
        return [_bad_params("xid.events", exc)]
    with gc_paused():  # per-event tuples of a large log (bench/xid_scale.py); see kmsg.gc_paused
        return _xid_event_results(log, gpus, job, params, overrides)


def _xid_event_results(log: KernelLog, gpus: GpuMap, job, params, overrides) -> List[Result]:
    live, counts = _live(log.xids, params.ignore, log.acked)
    counts["other_gpus"] = 0
    findings = []
    by_bus = gpus.by_bus or {}
    components: Dict[
        Optional[str], Tuple[bool, Optional[str]]
    ] = {}  # bus id -> (the job's?, component)
    for event, cls in zip(live, _catalog().classify_all(live, overrides) if live else ()):
        known = components.get(event.pci)
        if known is None:
            index = by_bus.get(event.pci or "")
            mine = index is None or job.gpus is None or index in job.gpus
            known = components[event.pci] = (
                mine,
                "gpu:%d %s" % (index, event.pci)
                if index is not None
                else ("pci:%s" % event.pci if event.pci else None),
            )
        if not known[0]:
            counts["other_gpus"] += 1
            continue
        findings.append((known[1], event, cls))
    common = _common_details(log, counts, gpus.error if live else None)
    results = _group("xid.events", findings, "Xid", common)
    if results:
        return results
    return [Result("xid.events", Status.OK, _ok_summary("Xid", counts), details=common)]


@check(
    name="xid.sxid",
    contexts=ALL,
    timeout=2.0,
    needs=("xid.log",),
    params=(
        Param(
            "overrides",
            dict,
            {},
            "decisions replacing the severity-based ones, a table keyed by SXid: "
            '[checks."xid.sxid".overrides] 20034 = {status = "WARN"}, 12028 = {status = "FAIL", action = '
            '"drain"} '
            + _SYNTAX
            + "; the older list of '20034=WARN' strings is still read, with a deprecation "
            "warning",
            convert=overrides_param("xid.sxid", "SXid"),
        ),
        Param(
            "ignore",
            list,
            [],
            "SXids left out entirely (not reported, not counted)",
            item_type=int,
            minimum=1,
            maximum=100000,
        ),
    ),
)
def xid_sxid(log: KernelLog, params) -> List[Result]:
    """No fatal NVSwitch SXid error since boot.

    NVSwitch driver lines `nvidia-nvswitchN: SXid (PCI:...): CODE, Fatal|Non-fatal, ...` in the
    kernel log (/dev/kmsg; `dmesg | grep SXid`). Fatal -> FAIL, reboot: the fabric's GPUs and
    switches need a reset and Fabric Manager a restart, which a reboot does in one step (check
    `nv-fabricmanager` logs and the link/cable if it recurs). Non-fatal -> WARN (link errors that
    were corrected; watch for repeats). No severity printed -> UNKNOWN. NVSwitches serve every GPU,
    so SXids count for every job. Clear after repair with `slurm-hooks xid ack --all`.
    """
    try:
        overrides = _overrides(params)
    except ValueError as exc:
        return [_bad_params("xid.sxid", exc)]
    live, counts = _live(log.sxids, params.ignore, log.acked)
    findings = [(_switch_component(e), e, _catalog().classify_sxid(e, overrides)) for e in live]
    common = _common_details(log, counts, None)
    results = _group("xid.sxid", findings, "SXid", common)
    return results or [Result("xid.sxid", Status.OK, _ok_summary("SXid", counts), details=common)]


# -- helpers -----------------------------------------------------------------------------------


def _live(
    events: Sequence[Any], ignore: Sequence[int], acked: Any
) -> Tuple[List[Any], Dict[str, int]]:
    """Xid/SXid events neither ignored by number nor acknowledged (by kmsg sequence), and the counts."""
    ignored = set(ignore)
    kept = [e for e in events if _code(e) not in ignored] if ignored else list(events)
    live = [e for e in kept if e.seq is None or e.seq not in acked] if acked else kept
    return live, {
        "since_boot": len(kept),
        "acknowledged": len(kept) - len(live),
        "ignored": len(events) - len(kept),
    }


def _switch_component(event: SxidEvent) -> str:
    name = "nvswitch:%d" % event.switch if event.switch is not None else "nvswitch"
    return "%s %s" % (name, event.pci) if event.pci else name


def _code(event: Any) -> int:
    return event.xid if isinstance(event, XidEvent) else event.sxid


def _common_details(
    log: KernelLog, counts: Mapping[str, int], map_error: Optional[str]
) -> Dict[str, Any]:
    details: Dict[str, Any] = {"boot_id": log.boot_id}
    details.update(counts)
    notes = list(log.notes)
    if map_error:
        notes.append("GPU indices unknown (%s): events counted for every job" % map_error)
    if notes:
        details["notes"] = notes
    return details


def _ok_summary(kind: str, counts: Mapping[str, int]) -> str:
    if not counts["since_boot"]:
        return "no %s since boot" % kind
    parts = [
        "%d %s" % (counts[k], k.replace("_", " "))
        for k in ("acknowledged", "other_gpus")
        if counts.get(k)
    ]
    return "%d %s since boot, none needing action%s" % (
        counts["since_boot"],
        kind,
        " (%s)" % ", ".join(parts) if parts else "",
    )


def _group(
    name: str,
    findings: Iterable[Tuple[Optional[str], Any, Any]],
    kind: str,
    common: Mapping[str, Any],
) -> List[Result]:
    """One Result per (component, status, blame); OK classifications are left out.

    The result's head is its group's first event with the strongest action; its summary counts the
    events and names the other codes; its details list the first MAX_LISTED events. One pass: a
    flood of 100,000 Xids is a few groups.
    """
    groups: Dict[
        Tuple[Optional[str], str, str], List[Any]
    ] = {}  # key -> [items, head item, head rank, codes]
    for component, event, cls in findings:
        if cls.status == "OK":
            continue
        key = (component, cls.status, cls.blame)
        group = groups.get(key)
        rank = _ACTION_RANK.get(cls.action, 0)
        if group is None:
            groups[key] = [[(event, cls)], (event, cls), rank, {_code(event)}]
            continue
        group[0].append((event, cls))
        group[3].add(
            cls.xid if cls.xid is not None else _code(event)
        )  # an Xid's classification names it
        if rank > group[2]:
            group[1], group[2] = (event, cls), rank
    results = []
    for (component, status, blame), (items, (head_event, head), _rank, all_codes) in groups.items():
        codes = sorted(all_codes - {_code(head_event)})
        text = (head_event.text or head.reason)[:100]
        mig = getattr(head_event, "mig", None)  # e.g. "GI 5 CI 2" on a MIG GPU
        summary = "%s %d%s: %s" % (kind, _code(head_event), " (MIG %s)" % mig if mig else "", text)
        if len(items) > 1:
            summary += " (%d events%s)" % (
                len(items),
                "; also %s %s" % (kind, ", ".join(map(str, codes))) if codes else "",
            )
        details = dict(common)
        details["events"] = [_event_dict(event, cls) for event, cls in items[:MAX_LISTED]]
        details["reason"] = head.reason
        results.append(
            Result(
                name,
                Status(status),
                summary,
                component=component,
                details=details,
                action=Action(head.action) if status == "FAIL" else Action.NONE,
                blame=Blame(blame),
            )
        )
    return results


def _event_dict(event: Any, cls: Any) -> Dict[str, Any]:
    return {
        "code": _code(event),
        "pci": event.pci,
        "seq": event.seq,
        "usec": event.usec,
        "pid": getattr(event, "pid", None),
        "process": getattr(event, "process", None),
        "text": event.text,
        # MIG: the partition the driver attributed the Xid to (the GPU is still the one judged)
        "gpu_instance": getattr(event, "gpu_instance", None),
        "compute_instance": getattr(event, "compute_instance", None),
        "status": cls.status,
        "action": cls.action,
        "blame": cls.blame,
        "reason": cls.reason,
        "overridden": cls.overridden,
    }
