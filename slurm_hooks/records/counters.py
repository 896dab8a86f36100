"""Counter snapshots of a node and a job's GPUs: taken in the prolog and again in the epilog, then diffed.

Where each value comes from (all read-only; a counter we cannot read is left out and the reason is
recorded under ``unavailable``, never guessed):

- ECC error totals, volatile (since the last driver load) and aggregate (lifetime):
  nvmlDeviceGetTotalEccErrors (`nvidia-smi -q -d ECC`).
- Remapped rows and their pending/failure flags: nvmlDeviceGetRemappedRows (`nvidia-smi -q -d ROW_REMAPPER`).
- Retired pages (pre-Ampere GPUs): nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus
  (`nvidia-smi -q -d PAGE_RETIREMENT`).
- NVLink error counters per active link (replay, recovery, CRC flit/data, ECC data):
  nvmlDeviceGetNvLinkState, then one nvmlDeviceGetFieldValues per GPU with per-link
  nvmlDeviceGetNvLinkErrorCounter calls where fields are missing (nvlink_errors.py; `nvidia-smi nvlink -e`).
- PCIe replay counter: nvmlDeviceGetPcieReplayCounter (`nvidia-smi -q -d PCIE`, "Replays Since Reset").
- Time the clocks were held down, per reason (power, thermal, sync boost, board limit, low utilisation,
  reliability), in ns: nvmlDeviceGetViolationStatus (`nvidia-smi -q -d PERFORMANCE`); plus the newer
  per-reason clock-event duration fields NVML_FI_DEV_CLOCKS_EVENT_REASON_* (nvmlDeviceGetFieldValues)
  where the driver exposes them.
- Energy since driver load (mJ): nvmlDeviceGetTotalEnergyConsumption (`nvidia-smi -q -d POWER`).
- Epilog only: processes still on the GPU and memory still in use: nvmlDeviceGet{Compute,Graphics}-
  RunningProcesses, nvmlSystemGetProcessName, nvmlDeviceGetMemoryInfo (`nvidia-smi --query-compute-apps`).
- Kernel log position: the sequence number of the last /dev/kmsg record and the boot id
  (/proc/sys/kernel/random/boot_id), so the epilog lists exactly the Xids logged during the job.
  When the hook's Xid checks have just read /dev/kmsg, their read is reused (kmsg.KmsgView):
  reading a live /dev/kmsg costs one system call per record.
- InfiniBand port error counters: /sys/class/infiniband/<hca>/ports/<port>/counters/<name>
  (`perfquery`, `ibstat`). Older kernels report some as saturating 16/32-bit values: a counter stuck
  at its maximum shows no delta, and `perfquery -x`/`-R` is the place to look.
- InfiniBand traffic, always (IB_PERF_COUNTERS, same directory, kernel ABI
  Documentation/ABI/stable/sysfs-class-infiniband): port_xmit_data / port_rcv_data (octets / 4, 64-bit)
  and port_xmit_wait (ticks the port had data to send but no credit: a bad cable or switch port).
  Kept apart from the error counters (`ib_perf`), so `ib_errors` stays a count of errors.
  port_xmit_wait is 32 bits on every kernel (no 64-bit sysfs version): ib_counter_trust.py judges
  each traffic counter saturated or cleared between the snapshots, and perf reports such a figure
  as unmeasurable.
- CPU time per CPU (/proc/stat) and of Slurm's jobs (cgroup v2 cpu.stat): cpustat.read_cpu_times.

A snapshot is a plain JSON-able dict (schema SNAPSHOT_SCHEMA) with flat counter names, so the
epilog's deltas are a key-by-key difference (`deltas`). NVML calls may hang; store.py runs
`take` in a forked child bounded in time (isolation.run_isolated).
"""

from __future__ import annotations

import time

from ..core.lazyre import lazy_compile
from ..hw import nvml
from ..hw.cpustat import read_cpu_times
from ..hw.host import Host, HostError
from ..xid.kmsg import KmsgView, view
from . import nvlink_errors
from .nvlink_errors import MAX_NVLINKS, NVLINK_COUNTERS  # noqa: F401 (their old home)

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SNAPSHOT_SCHEMA = "slurm-hooks.snapshot/1"
KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
IB_ROOT = "/sys/class/infiniband"
# nvmlPerfPolicyType_t 0..5, the order nvml.h gives them
VIOLATION_POLICIES = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
)
# Violation reasons that mean the clocks were lowered below what the job asked for (low_utilization
# is the GPU idling, not a limit).
THROTTLE_REASONS = ("power", "thermal", "board_limit", "reliability", "sync_boost")
# clock_event_ns.<name> counters: nvmlDeviceGetFieldValues ids (nvml.FI_CLOCKS_EVENT_*, from nvml.h)
CLOCK_EVENT_FIELDS = (
    ("sw_power_cap", nvml.FI_CLOCKS_EVENT_SW_POWER_CAP),
    ("sw_therm_slowdown", nvml.FI_CLOCKS_EVENT_SW_THERM_SLOWDOWN),
    ("hw_therm_slowdown", nvml.FI_CLOCKS_EVENT_HW_THERM_SLOWDOWN),
    ("hw_power_brake_slowdown", nvml.FI_CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN),
    ("sync_boost", nvml.FI_CLOCKS_EVENT_SYNC_BOOST),
)
IB_PERF_COUNTERS = ("port_xmit_wait", "port_xmit_data", "port_rcv_data")
GPU_BUDGET_S = (
    2.0  # seconds before a GPU that does not answer is given up (store.py passes its own)
)
_COUNTER_NAME = lazy_compile(r"^[A-Za-z0-9_]{1,64}$")
_TEXT_CALLS = (
    ("uuid", "nvmlDeviceGetUUID"),
    ("serial", "nvmlDeviceGetSerial"),
    ("name", "nvmlDeviceGetName"),
)


def take(
    host: Host,
    library: str = "",
    gpus: Optional[Sequence[int]] = None,
    ib_counters: Sequence[str] = (),
    processes: bool = False,
    clock: Callable[[], float] = time.time,
    kernel_log: Optional[KmsgView] = None,
    gpu_budget: float = GPU_BUDGET_S,
    job_id: Optional[str] = None,
) -> Dict[str, Any]:
    """One snapshot of the node (kernel log position, IB ports, CPU times; `job_id`: that job's cgroup too)
    and of the GPUs `gpus` (None = all).

    `kernel_log` is a read of /dev/kmsg taken moments before in this hook (the Xid checks'); without
    it /dev/kmsg is read here. Never raises for a missing or failing source: the snapshot says what
    it could not read.
    """
    started = time.monotonic()
    snap: Dict[str, Any] = {"schema": SNAPSHOT_SCHEMA, "time": round(clock(), 3), "notes": []}
    snap["kernel_clock_s"] = round(kernel_log_clock(), 6)  # with "time": dates the Xids (build.py)
    if (
        processes
    ):  # the epilog's snapshot, the one that dates the job's Xids (ctypes: not in prologs)
        snap["clock_max_error_s"] = wall_clock_error()
    snap["boot_id"], snap["kmsg_seq"] = kernel_log_position(host, snap["notes"], kernel_log)
    snap["ib"], snap["ib_perf"] = _split_ib(
        read_ib_counters(host, _with_perf(ib_counters), snap["notes"]), ib_counters
    )
    snap["cpu"] = read_cpu_times(host, job_id, snap["notes"])
    snap["gpus"] = read_gpus(library, gpus, processes, snap["notes"], gpu_budget)
    snap["duration_s"] = round(time.monotonic() - started, 4)
    return snap


# -- kernel log and InfiniBand (files) --------------------------------------------------------


def kernel_log_position(
    host: Host, notes: List[str], seen: Optional[KmsgView] = None
) -> Tuple[Optional[str], Optional[int]]:
    """(boot id, sequence number of the newest /dev/kmsg record, from `seen` if given); None where unreadable."""
    boot_id = None
    try:
        boot_id = (host.read_text(BOOT_ID, default="") or "").strip() or None
    except HostError as exc:
        notes.append("boot id unreadable: %s" % exc)
    if seen is None:
        try:
            seen = read_kernel_log(host)
        except HostError as exc:
            notes.append("kernel log unreadable: %s" % exc)
            return boot_id, None
    return boot_id, seen.last_seq


def kernel_log_clock() -> float:
    """Seconds on the clock the kernel log stamps its records with (printk's local_clock, the
    `usec` of a /dev/kmsg record), read beside the wall clock so the epilog can date each Xid:
    wall time of an Xid = snapshot time - (this - the record's usec / 1e6). CLOCK_MONOTONIC_RAW
    runs at the same uncorrected hardware rate as printk's clock (x86 TSC, arm64 arch timer);
    CLOCK_MONOTONIC is slewed by NTP, which over weeks of uptime adds seconds. Neither counts
    suspended time, nor does the kernel log. Where RAW is missing, the monotonic clock."""
    raw = getattr(time, "CLOCK_MONOTONIC_RAW", None)
    if raw is not None:
        try:
            return time.clock_gettime(raw)
        except OSError:
            pass
    return time.monotonic()


STA_UNSYNC = 0x0040  # <linux/timex.h>: the kernel's clock is not synchronised (no NTP/PTP daemon)
TIME_ERROR = 5  # adjtimex's answer for an unsynchronised clock
UNSYNCED_ERROR_S = 16.0  # NTP_PHASE_LIMIT: the maxerror an unsynchronised kernel clock reports


def wall_clock_error() -> Optional[float]:
    """The kernel's bound on this node's wall-clock error, in seconds: adjtimex(2) read-only
    (modes 0; `chronyc tracking`, `adjtimex --print`), its maxerror as the NTP/PTP daemon keeps it;
    16 s when the clock is not synchronised; None where it cannot be asked (not Linux, or an
    interpreter built without ctypes: the snapshot goes on without the bound). report --xids does
    not order a node's Xids by a clock whose error exceeds its tolerance."""
    try:
        import ctypes
    except ImportError:
        return None

    class Timex(ctypes.Structure):  # struct timex up to `status`; the rest is room for the kernel
        _fields_ = [
            ("modes", ctypes.c_uint),
            ("offset", ctypes.c_long),
            ("freq", ctypes.c_long),
            ("maxerror", ctypes.c_long),
            ("esterror", ctypes.c_long),
            ("status", ctypes.c_int),
            ("rest", ctypes.c_char * 256),
        ]

    try:
        adjtimex = ctypes.CDLL(None, use_errno=True).adjtimex
    except (OSError, AttributeError):
        return None
    timex = Timex()
    state = adjtimex(ctypes.byref(timex))
    if state < 0:
        return None
    if state == TIME_ERROR or timex.status & STA_UNSYNC:
        return UNSYNCED_ERROR_S
    if not 0 <= timex.maxerror <= UNSYNCED_ERROR_S * 1e6:  # the kernel caps it there: another
        return UNSYNCED_ERROR_S  # field read as maxerror (a struct layout we did not expect)
    return round(timex.maxerror / 1e6, 6)


def read_kernel_log(host: Host) -> KmsgView:
    """One read of /dev/kmsg (HostError when it cannot be read)."""
    return view(host.read_kmsg(KMSG))


def read_xid_lines(host: Host, seen: Optional[KmsgView] = None) -> List[str]:
    """The /dev/kmsg records that mention an Xid or SXid (first line of each record), from `seen` if given."""
    return list((seen or read_kernel_log(host)).xid_lines)


def read_ib_counters(
    host: Host, names: Sequence[str], notes: List[str]
) -> Dict[str, Dict[str, int]]:
    """{"mlx5_0:1": {"symbol_error": 0, ...}} for every HCA port; counters missing on a port are left out."""
    ports: Dict[str, Dict[str, int]] = {}
    if not names:
        return ports
    for hca in host.listdir(IB_ROOT, default=[]):
        for port in host.listdir("%s/%s/ports" % (IB_ROOT, hca), default=[]):
            values: Dict[str, int] = {}
            base = "%s/%s/ports/%s/counters/" % (IB_ROOT, hca, port)
            for name in names:
                if not isinstance(name, str) or not _COUNTER_NAME.match(name):
                    notes.append(
                        "[records] ib_counters: %r is not a counter file name; skipped" % (name,)
                    )
                    continue
                try:
                    value = host.read_int(base + name, default=None)
                except HostError as exc:  # unparsable or unreadable: say so, keep the others
                    notes.append(str(exc))
                    continue
                if value is not None:
                    values[name] = value
            ports["%s:%s" % (hca, port)] = values
    return ports


def _with_perf(names: Sequence[str]) -> List[str]:
    return list(names) + [n for n in IB_PERF_COUNTERS if n not in names]


def _split_ib(
    ports: Dict[str, Dict[str, int]], error_names: Sequence[str]
) -> Tuple[Dict[str, Dict[str, int]], Dict[str, Dict[str, int]]]:
    """One read of every port's counters -> (the configured error counters, the traffic counters)."""
    errors = {
        port: {k: v for k, v in values.items() if k in error_names}
        for port, values in ports.items()
    }
    traffic = {
        port: {k: v for k, v in values.items() if k in IB_PERF_COUNTERS}
        for port, values in ports.items()
    }
    return errors, traffic


# -- GPUs (NVML) --------------------------------------------------------------------------------


def read_gpus(
    library: str,
    gpus: Optional[Sequence[int]],
    processes: bool,
    notes: List[str],
    budget: float = GPU_BUDGET_S,
) -> List[Dict[str, Any]]:
    """The GPUs Slurm gave the job (None = all). SLURM_JOB_GPUS counts gres.conf's /dev/nvidiaN files, i.e.
    NVML *minor numbers*, which need not equal NVML indices: nvml.slurm_to_nvml matches them (as
    for the gpu checks). A GPU whose
    NVML calls hang costs that GPU only: it is given up after `budget` seconds."""
    if gpus is not None and not gpus:
        return []  # a job without GPUs: no NVML at all
    session = nvml.session(library)
    try:
        count = session.call("nvmlDeviceGetCount")
    except nvml.NvmlError as exc:
        notes.append("NVML unusable: %s" % exc)
        return []
    if gpus is None:
        indices = list(range(count))
    else:
        by_slurm = _slurm_to_nvml(session, count, budget)
        indices = []
        for wanted in gpus:
            index = by_slurm.get(wanted)
            if index is None:
                notes.append(
                    "GPU %d of the job matches no GPU NVML sees (%d GPUs)" % (wanted, count)
                )
                continue
            indices.append(index)
    return _read_bounded(session, indices, processes, budget, notes)


def _read_bounded(
    session: nvml.NvmlSession, indices: List[int], processes: bool, budget: float, notes: List[str]
) -> List[Dict[str, Any]]:
    """read_gpu for each index; a GPU that has not answered within `budget` is recorded as unavailable
    (its partial readings are dropped), and the other GPUs' counters stand (isolation.map_bounded)."""
    from ..core.isolation import map_bounded

    out = []
    answers = map_bounded(len(indices), lambda i: read_gpu(session, indices[i], processes), budget)
    for index, (finished, value) in zip(indices, answers):
        if finished and isinstance(value, dict):
            out.append(value)
            continue
        why = (
            "did not answer within %.3gs" % budget if not finished else "read failed: %r" % (value,)
        )
        notes.append("GPU %d %s" % (index, why))
        out.append({"index": index, "counters": {}, "flags": {}, "unavailable": {"device": why}})
    return out


def _slurm_to_nvml(session: nvml.NvmlSession, count: int, budget: float) -> Dict[int, int]:
    """Slurm GPU index -> NVML index (nvml.slurm_to_nvml), the minor numbers read within `budget`."""
    from ..core.isolation import map_bounded

    def minor(index: int) -> int:
        try:
            return int(
                session.call(
                    "nvmlDeviceGetMinorNumber", session.call("nvmlDeviceGetHandleByIndex", index)
                )
            )
        except nvml.NvmlError:
            return -1

    minors = [
        value if finished and isinstance(value, int) else -1
        for finished, value in map_bounded(count, minor, budget)
    ]
    return nvml.slurm_to_nvml(dict(enumerate(minors)))[0]


def read_gpu(session: nvml.NvmlSession, index: int, processes: bool) -> Dict[str, Any]:
    gpu: Dict[str, Any] = {
        "index": index,
        "counters": {},
        "flags": {},
        "nvlink": {},
        "unavailable": {},
    }
    try:
        handle = session.call("nvmlDeviceGetHandleByIndex", index)
    except nvml.NvmlError as exc:
        gpu["unavailable"]["device"] = _why(exc)
        return gpu
    gpu["minor"] = _guard(
        gpu, "minor", lambda: int(session.call("nvmlDeviceGetMinorNumber", handle))
    )
    for key, function in _TEXT_CALLS:
        gpu[key] = _guard(gpu, key, lambda f=function: _text(session.call(f, handle)))
    gpu["bus_id"] = _guard(
        gpu, "bus_id", lambda: _bus_id(session.call("nvmlDeviceGetPciInfo", handle).busId)
    )
    for group, reader in _COUNTER_GROUPS:
        _guard(gpu, group, lambda r=reader: r(session, handle, gpu))
    if processes:
        _guard(gpu, "processes", lambda: _read_processes(session, handle, gpu))
        _guard(gpu, "memory", lambda: _read_memory(session, handle, gpu))
    if not gpu["nvlink"]:
        del gpu["nvlink"]
    return gpu


def _guard(gpu: Dict[str, Any], what: str, read: Callable[[], Any]) -> Any:
    """Run one NVML read; an NvmlError is recorded under unavailable[what] and yields None."""
    try:
        return read()
    except nvml.NvmlError as exc:
        gpu["unavailable"][what] = _why(exc)
        return None


def _why(exc: nvml.NvmlError) -> str:
    return exc.outcome.name


def _read_ecc(session, handle, gpu) -> None:
    pynvml = session.pynvml
    for counter_name, counter in (
        ("volatile", pynvml.NVML_VOLATILE_ECC),
        ("aggregate", pynvml.NVML_AGGREGATE_ECC),
    ):
        for error_name, error in (
            ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            value = session.call("nvmlDeviceGetTotalEccErrors", handle, error, counter)
            gpu["counters"]["ecc.%s.%s" % (counter_name, error_name)] = int(value)


def _read_remapped_rows(session, handle, gpu) -> None:
    corrected, uncorrected, pending, failure = session.call("nvmlDeviceGetRemappedRows", handle)
    gpu["counters"]["remapped_rows.corrected"] = int(corrected)
    gpu["counters"]["remapped_rows.uncorrected"] = int(uncorrected)
    gpu["flags"]["remapped_rows.pending"] = bool(pending)
    gpu["flags"]["remapped_rows.failure"] = bool(failure)


def _read_retired_pages(session, handle, gpu) -> None:
    pynvml = session.pynvml
    for name, cause in (
        ("single_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("double_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ):
        gpu["counters"]["retired_pages.%s" % name] = len(
            session.call("nvmlDeviceGetRetiredPages", handle, cause)
        )
    gpu["flags"]["retired_pages.pending"] = bool(
        session.call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    )


def _read_pcie(session, handle, gpu) -> None:
    gpu["counters"]["pcie.replay"] = int(session.call("nvmlDeviceGetPcieReplayCounter", handle))


def _read_violations(session, handle, gpu) -> None:
    for code, name in enumerate(VIOLATION_POLICIES):
        try:
            status = session.call("nvmlDeviceGetViolationStatus", handle, code)
        except nvml.NvmlError as exc:
            if exc.code != nvml.NOT_SUPPORTED:
                raise
            gpu["unavailable"]["violation_ns.%s" % name] = _why(exc)
            continue
        gpu["counters"]["violation_ns.%s" % name] = int(status.violationTime)


def _read_clock_event_fields(session, handle, gpu) -> None:
    """NVML_FI_DEV_CLOCKS_EVENT_REASON_* durations (ns), one batched call; a field this driver does not
    know (pre-R535: the thermal and power-brake ones) is left out with its reason under unavailable."""
    values = session.field_values(handle, [field_id for _, field_id in CLOCK_EVENT_FIELDS])
    for name, field_id in CLOCK_EVENT_FIELDS:
        key = "clock_event_ns." + name
        value = values.get(field_id)
        if isinstance(value, nvml.NvmlError):
            gpu["unavailable"][key] = _why(value)
        elif isinstance(value, (int, float)) and value >= 0:
            gpu["counters"][key] = int(value)


def _read_energy(session, handle, gpu) -> None:
    gpu["counters"]["energy_mj"] = int(session.call("nvmlDeviceGetTotalEnergyConsumption", handle))


_COUNTER_GROUPS = (
    ("ecc", _read_ecc),
    ("remapped_rows", _read_remapped_rows),
    ("retired_pages", _read_retired_pages),
    ("pcie", _read_pcie),
    ("nvlink", nvlink_errors.read),
    ("violation", _read_violations),
    ("clock_events", _read_clock_event_fields),
    ("energy", _read_energy),
)


def _read_processes(session, handle, gpu) -> None:
    found: Dict[int, Dict[str, Any]] = {}
    for kind, function in (
        ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ):
        for proc in session.call(function, handle):
            used = proc.usedGpuMemory
            entry = found.setdefault(
                int(proc.pid), {"pid": int(proc.pid), "kind": kind, "used_memory_bytes": None}
            )
            if isinstance(used, int) and used < (
                1 << 63
            ):  # NVML_VALUE_NOT_AVAILABLE is ULL max: unknown
                entry["used_memory_bytes"] = used
    for entry in found.values():
        try:  # the executable's name only (not its arguments, which may hold secrets)
            entry["name"] = _text(session.call("nvmlSystemGetProcessName", entry["pid"]))[:128]
        except nvml.NvmlError:
            entry["name"] = None
    gpu["processes"] = sorted(found.values(), key=lambda e: e["pid"])


def _read_memory(session, handle, gpu) -> None:
    """Memory used; the v2 struct (R510+) leaves out the driver's reservation (nvml.VERSIONED "memory_info")."""
    info = session.call_versioned("memory_info", handle)
    gpu["memory_used_bytes"] = int(info.used)
    gpu["memory_total_bytes"] = int(info.total)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _bus_id(value: Any) -> str:
    """NVML's 00000000:3B:00.0 -> sysfs form 0000:3b:00.0 (what the kernel log's Xid lines use)."""
    text = _text(value).strip().lower()
    domain, _, rest = text.partition(":")
    return "%04x:%s" % (int(domain, 16), rest) if rest else text


# -- differences --------------------------------------------------------------------------------


def deltas(before: Dict[str, int], after: Dict[str, int]) -> Tuple[Dict[str, int], List[str]]:
    """Key-by-key after - before for keys in both; a counter that went down was reset (driver reload,
    GPU reset) and is listed instead of reported as a negative delta."""
    out: Dict[str, int] = {}
    reset: List[str] = []
    for key, value in after.items():
        if key not in before or not isinstance(value, int) or not isinstance(before[key], int):
            continue
        if value < before[key]:
            reset.append(key)
        else:
            out[key] = value - before[key]
    return out, reset
