"""The record's `summary.perf`: figures that compare one node of a job with its peers (fail-slow).

Pure functions over a built record (build.py): the GPUs' counter deltas, the InfiniBand traffic
deltas (`ib[].traffic`) and the CPU window (`cpu`, made here by `cpu_window` from the two snapshots).
The metric names and units are the contract with `slurm-hooks report` (docs/records.md, "perf"):
rates are per second of the job's wall time, fractions are of that wall time, and a figure that
could not be measured is ABSENT (never 0): its reason goes to the record's `perf_unavailable`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..hw.cpustat import parse_proc_stat
from ..hw.host import HostError, format_cpulist, parse_cpulist
from .ib_counter_trust import untrusted_figures

MIN_WALL_S = 1.0  # shorter jobs give no rates: two snapshots a few ms apart say nothing
IB_WORD_BYTES = (
    4  # port_xmit_data / port_rcv_data count octets divided by 4 (sysfs-class-infiniband ABI)
)
IB_SATURATED = (
    1 << 32
) - 1  # a 32-bit PMA counter stuck here stopped counting (kernels without 64-bit ones)
Perf = Dict[str, float]


def sig6(value: float) -> float:
    """Six significant digits (the contract's rounding)."""
    return float("%.6g" % value)


def perf_block(record: Dict[str, Any]) -> Tuple[Perf, Dict[str, str]]:
    """(perf, unavailable) for a record: {metric: number} and {metric: why it is absent}."""
    wall = record.get("duration_s")
    gpus = [g for g in record.get("gpus") or [] if g.get("delta") is not None]
    ports = [p for p in record.get("ib") or [] if p.get("traffic") is not None]
    cpu_known = (record.get("cpu") or {}).get("busy_s") is not None
    if not gpus and not ports and not cpu_known:
        return {}, {"*": "no comparable prolog snapshot (missing, corrupt, or the node rebooted)"}
    if wall is None or wall < MIN_WALL_S:
        return {}, {"*": "job shorter than %g s" % MIN_WALL_S}
    perf: Perf = {}
    missing: Dict[str, str] = {}
    _throttle(gpus, wall, perf, missing)
    _power_and_errors(gpus, wall, perf, missing)
    _infiniband(ports, wall, perf, missing)
    _cpu(record.get("cpu") or {}, wall, perf, missing)
    return {k: sig6(v) for k, v in sorted(perf.items())}, missing


def hardware_class(record: Dict[str, Any]) -> Optional[str]:
    """What the node's figures may be compared with in a job: the model and number of the job's
    GPUs, "NVIDIA H100 80GB HBM3 x8". The number is the job's allocation (SLURM_JOB_GPUS: a GPU
    that fell off the bus does not change it), the model nvmlDeviceGetName of those that answered;
    None where none did (a hung NVML at the epilog) or the job has no GPUs: report --stragglers
    then compares the node with the largest class of its job, so a sick node is never alone in a
    class of its own. Why classes at all: a job spanning A100 and H100 nodes would flag every A100
    on power, and a node given 4 GPUs among nodes given 8 on replays per hour. The number of IB
    ports is left out on purpose: a port that went down is a fault to find."""
    gpus = record.get("gpus") or []
    names = sorted({g["name"] for g in gpus if isinstance(g.get("name"), str) and g["name"]})
    allocated = (record.get("job") or {}).get("gpus")
    count = len(allocated) if isinstance(allocated, list) else len(gpus)
    if not names or not count:
        return None
    return "%s x%d" % ("+".join(names), count)


# -- GPUs ---------------------------------------------------------------------------------------


def gpu_throttle_ns(delta: Dict[str, int]) -> Dict[str, int]:
    """One GPU's held-down time per contract reason, from its counter deltas.

    The clock-event fields (R535+) split thermal into SW and HW and know the power brake; older drivers
    give only nvmlDeviceGetViolationStatus (whose "thermal" NVML maps to SW thermal). HW slowdown is
    NVML's HwSlowdown reason, engaged by HW thermal slowdown or the HW power brake: their sum (an upper
    bound should both hold the clocks at once; capped at the wall time by the caller).
    """

    def ce(name: str) -> Optional[int]:
        return delta.get("clock_event_ns." + name)

    out: Dict[str, int] = {}
    hw_thermal, brake, sw_thermal = (
        ce("hw_therm_slowdown"),
        ce("hw_power_brake_slowdown"),
        ce("sw_therm_slowdown"),
    )
    if hw_thermal is not None and brake is not None:
        out["hw_slowdown"] = hw_thermal + brake
    if brake is not None:
        out["power_brake"] = brake
    if hw_thermal is not None and sw_thermal is not None:
        out["thermal"] = hw_thermal + sw_thermal
    elif delta.get("violation_ns.thermal") is not None:
        out["thermal"] = delta["violation_ns.thermal"]
    for reason, field, violation in (
        ("power", "sw_power_cap", "power"),
        ("sync_boost", "sync_boost", "sync_boost"),
    ):
        value = ce(field) if ce(field) is not None else delta.get("violation_ns." + violation)
        if value is not None:
            out[reason] = value
    return out


THROTTLE_REASONS = ("hw_slowdown", "thermal", "power", "power_brake", "sync_boost")


def _throttle(gpus: List[Dict[str, Any]], wall: float, perf: Perf, missing: Dict[str, str]) -> None:
    per_gpu = [gpu_throttle_ns(g["delta"]) for g in gpus]
    for reason in THROTTLE_REASONS:
        values = [t[reason] for t in per_gpu if reason in t]
        key = "throttle_frac." + reason
        if values:
            perf[key] = min(1.0, max(values) / 1e9 / wall)
        else:
            missing[key] = (
                "no job GPU reports it (driver too old, or see gpus[].unavailable)"
                if gpus
                else "no GPU deltas"
            )


def _power_and_errors(
    gpus: List[Dict[str, Any]], wall: float, perf: Perf, missing: Dict[str, str]
) -> None:
    watts = [g["delta"]["energy_mj"] / 1000.0 / wall for g in gpus if "energy_mj" in g["delta"]]
    if watts:
        perf["gpu_power_w.mean"] = sum(watts) / len(watts)
        perf["gpu_power_w.min"] = min(watts)
    else:
        missing["gpu_power_w.mean"] = missing["gpu_power_w.min"] = (
            "no job GPU reports its energy counter"
        )
    # How long the most idle job GPU had its clocks lowered for lack of work: a GPU the job left
    # idle draws little power without being slow (stragglers.py does not score its power).
    idle = [
        g["delta"]["violation_ns.low_utilization"]
        for g in gpus
        if "violation_ns.low_utilization" in g["delta"]
    ]
    if idle:
        perf["gpu_idle_frac"] = min(1.0, max(idle) / 1e9 / wall)
    else:
        missing["gpu_idle_frac"] = "no job GPU reports low-utilization time (NVML 13 has none)"
    for key, prefix in (("pcie_replays_per_h", "pcie.replay"), ("nvlink_errors_per_h", "nvlink.")):
        counts = [
            v
            for g in gpus
            for k, v in g["delta"].items()
            if k == prefix or (prefix.endswith(".") and k.startswith(prefix))
        ]
        if counts:
            perf[key] = sum(counts) * 3600.0 / wall
        else:
            missing[key] = "no job GPU reports the counter"


# -- InfiniBand ------------------------------------------------------------------------------------


def _infiniband(
    ports: List[Dict[str, Any]], wall: float, perf: Perf, missing: Dict[str, str]
) -> None:
    waits = [p["traffic"]["port_xmit_wait"] for p in ports if "port_xmit_wait" in p["traffic"]]
    sent = [p["traffic"]["port_xmit_data"] for p in ports if "port_xmit_data" in p["traffic"]]
    received = [p["traffic"]["port_rcv_data"] for p in ports if "port_rcv_data" in p["traffic"]]
    untrusted = untrusted_figures(ports)  # a saturated or cleared counter: not a figure
    for key, values, make in (
        ("ib_xmit_wait_per_s", waits, lambda v: max(v) / wall),
        ("ib_xmit_bytes_per_s", sent, lambda v: sum(v) * IB_WORD_BYTES / wall),
        ("ib_rcv_bytes_per_s", received, lambda v: sum(v) * IB_WORD_BYTES / wall),
    ):
        if key in untrusted:
            missing[key] = untrusted[key]
            if key == WAIT:
                _wait_lower_bound(ports, wall, perf)
        elif values:
            perf[key] = make(values)
        else:
            missing[key] = (
                "no InfiniBand port with the counter in both snapshots"
                if ports
                else "no InfiniBand port"
            )


WAIT = "ib_xmit_wait_per_s"
WAIT_LOWER_BOUND = WAIT + ".lower_bound"  # ib_counter_trust.lower_bounds; scored by straggler_scan


def _wait_lower_bound(ports: List[Dict[str, Any]], wall: float, perf: Perf) -> None:
    """The least the worst port's stall rate can have been when a port's port_xmit_wait cannot be
    trusted: per port its measured delta or the ticks it surely counted (lower_bounds), the worst
    over ports, over the job's wall time. Absent when no port proves anything."""
    best = 0
    for port in ports:
        untrusted = (port.get("traffic_untrusted") or {}).get("port_xmit_wait")
        if untrusted:
            ticks = (port.get("traffic_lower_bound") or {}).get("port_xmit_wait")
        else:
            ticks = (port.get("traffic") or {}).get("port_xmit_wait")
        if type(ticks) is int and ticks > best:
            best = ticks
    if best > 0 and wall > 0:
        perf[WAIT_LOWER_BOUND] = best / wall


def ib_traffic(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    """Traffic counter deltas of one port; a counter that went down (reset) or sat at its 32-bit
    maximum in both snapshots (saturated: it stopped counting) is left out."""
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if not isinstance(value, int) or not isinstance(old, int) or value < old:
            continue
        if value == old == IB_SATURATED:
            continue
        out[name] = value - old
    return out


# -- CPUs ------------------------------------------------------------------------------------------


def cpu_window(before: Optional[Dict[str, Any]], after: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The record's `cpu`: CPU time on the job's CPUs between the snapshots, and the job's own.

    The CPUs are the job cgroup's cpuset (prolog's, else epilog's); without one ("scope": "node") every
    CPU of the node. The job's own time: its cgroup's usage_usec delta when the cgroup was there at both
    snapshots, its whole usage when it appeared after the prolog (a new cgroup starts at 0), else the
    slurmstepd scope's delta (every Slurm job's time: see cpustat's docstring). Values in seconds.
    """
    if not before or not after:
        return {
            "busy_s": None,
            "why": "no CPU times in %s snapshot" % ("the prolog" if not before else "the epilog"),
        }
    out: Dict[str, Any] = {}
    try:
        b, a = _per_cpu(before), _per_cpu(after)
        job_cpus = before.get("job_cpus") or after.get("job_cpus")
        wanted = parse_cpulist(job_cpus) if job_cpus else None
    except (HostError, ValueError, TypeError) as exc:
        return {"busy_s": None, "why": "CPU times unusable: %s" % exc}
    cpus = sorted(set(a) & set(b) & (wanted if wanted is not None else set(a)))
    if not cpus:
        return {"busy_s": None, "why": "no CPU in both snapshots"}
    hz = float(after.get("tick_hz") or 100)
    out.update(
        scope="job" if wanted is not None else "node", cpus=format_cpulist(cpus), ncpus=len(cpus)
    )
    busy = [a[c][0] - b[c][0] for c in cpus]
    steal = [a[c][1] - b[c][1] for c in cpus if a[c][1] is not None and b[c][1] is not None]
    if min(busy) < 0:
        return dict(out, busy_s=None, why="CPU times went backwards (not the same boot)")
    out["busy_s"] = round(sum(busy) / hz, 3)
    out["steal_s"] = (
        round(sum(steal) / hz, 3) if len(steal) == len(cpus) and min(steal) >= 0 else None
    )
    out["job_s"], out["job_from"] = _job_usage(
        before.get("usage_usec") or {}, after.get("usage_usec") or {}
    )
    return out


def _per_cpu(snap: Dict[str, Any]) -> Dict[int, Tuple[int, Optional[int]]]:
    text = snap.get("proc_stat")
    if not isinstance(text, str):
        raise ValueError("no /proc/stat text")
    return parse_proc_stat(text)


def _job_usage(
    before: Dict[str, int], after: Dict[str, int]
) -> Tuple[Optional[float], Optional[str]]:
    if "job" in after and "job" in before and after["job"] >= before["job"]:
        return round((after["job"] - before["job"]) / 1e6, 3), "job cgroup"
    if "job" in after and "job" not in before:
        return round(after["job"] / 1e6, 3), "job cgroup (created after the prolog)"
    if "slurm" in after and "slurm" in before and after["slurm"] >= before["slurm"]:
        return round(
            (after["slurm"] - before["slurm"]) / 1e6, 3
        ), "slurmstepd scope (every Slurm job)"
    return None, None


def _cpu(cpu: Dict[str, Any], wall: float, perf: Perf, missing: Dict[str, str]) -> None:
    if cpu.get("busy_s") is None:
        missing["foreign_cpu_frac"] = missing["cpu_steal_frac"] = cpu.get("why") or "no CPU times"
        return
    capacity = cpu["ncpus"] * wall
    if cpu.get("job_s") is None:
        missing["foreign_cpu_frac"] = "no cgroup v2 CPU usage of the job or of slurmstepd.scope"
    else:
        perf["foreign_cpu_frac"] = min(1.0, max(0.0, cpu["busy_s"] - cpu["job_s"]) / capacity)
    if cpu.get("steal_s") is None:
        missing["cpu_steal_frac"] = "no steal column in /proc/stat"
    else:
        perf["cpu_steal_frac"] = min(1.0, cpu["steal_s"] / capacity)
