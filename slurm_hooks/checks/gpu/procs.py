"""Family `gpu` (leftovers): nothing runs on, or holds memory of, the job's GPUs before it starts.

Gatherer `gpu.processes` reads, for each GPU the job got (gpu.selection):
nvmlDeviceGetComputeRunningProcesses_v3 (_v2 on older drivers), nvmlSystemGetProcessName, and
nvmlDeviceGetMemoryInfo with the v2 struct (`used` without the driver's reservation). By hand:
`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` and `nvidia-smi -q -d MEMORY`.
"""

from __future__ import annotations

from ...hw import nvml
from ...registry import Param, check, gatherer
from ...result import Action, Blame, Result, Status
from .common import NOT_SUPPORTED_PARAM, GpuReadings, error_result, failed, per_gpu, read_gpus
from .inventory import GpuDevice, nvml_text

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Tuple

MIB = 1 << 20


def _processes(session: nvml.NvmlSession, handle: Any) -> Tuple[Tuple[int, str, int], ...]:
    """(pid, name, used bytes) of every compute process on the GPU."""
    out = []
    for proc in session.call_versioned("compute_processes", handle):
        try:
            name = nvml_text(session.call("nvmlSystemGetProcessName", proc.pid))
        except nvml.NvmlError:  # it exited meanwhile, or lives in another PID namespace
            name = "?"
        out.append((int(proc.pid), name, int(proc.usedGpuMemory or 0)))
    return tuple(out)


def _used_memory(session: nvml.NvmlSession, handle: Any) -> Tuple[int, bool]:
    """(used bytes, whether that excludes the driver's reservation: only the v2 struct tells them apart)."""
    info = session.call_versioned("memory_info", handle)
    return int(info.used), hasattr(info, "reserved")


@gatherer("gpu.processes")
def read_processes(ctx) -> GpuReadings:
    return read_gpus(ctx, {"processes": _processes, "memory": _used_memory})


@check(
    name="gpu.leftovers",
    contexts=("prolog",),
    timeout=3.0,
    needs=("gpu.processes",),
    params=(
        Param(
            "max_used_mib",
            int,
            100,
            "FAIL when more GPU memory than this is in use before the job starts (MiB; "
            "driver bookkeeping outside the reservation stays well below it)",
            minimum=0,
            maximum=1 << 30,
        ),
        Param(
            "ignore_processes",
            list,
            [],
            "process names that may run on GPUs between jobs (e.g. a monitoring agent)",
            item_type=str,
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_leftovers(readings: GpuReadings, params) -> List[Result]:
    """No compute process runs on, and no memory is held on, the job's GPUs before it starts.

    Prolog only (during a job its own processes are expected). Sources:
    nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetMemoryInfo(v2) (`nvidia-smi
    --query-compute-apps=pid,process_name,used_memory --format=csv`). A leftover is a process of a
    previous job that outlived it (stuck in the driver, a zombie holding the device, a daemon someone
    started): this job would share the GPU or run out of memory, and nothing the job did caused it,
    so it is node-broken -> FAIL drain. Kill the process (`nvidia-smi --query-compute-apps=pid`,
    `fuser -v /dev/nvidia*`); if it cannot be killed, reset the GPU or reboot. Nodes that share GPUs
    between jobs (gres/shard, MPS, OverSubscribe) must disable this check.
    """
    return per_gpu(
        "gpu.leftovers", readings, params, _judge_leftovers, "no processes, no memory in use"
    )


def _judge_leftovers(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.leftovers"
    procs, memory = v["processes"], v["memory"]
    if failed(procs):
        return [error_result(name, device, "compute processes", procs, params)]
    foreign = [p for p in procs if p[1].rsplit("/", 1)[-1] not in params.ignore_processes]
    details = {
        "processes": [
            {"pid": pid, "name": pname, "used_mib": used // MIB} for pid, pname, used in foreign
        ]
    }
    if foreign:
        shown = ", ".join(
            "%s (pid %d, %d MiB)" % (pname, pid, used // MIB) for pid, pname, used in foreign[:5]
        )
        return [
            Result(
                name,
                Status.FAIL,
                "%d leftover process%s on the GPU before the job: %s"
                % (len(foreign), "es" if len(foreign) > 1 else "", shown),
                component=device.component,
                details=details,
                action=Action.DRAIN,
                blame=Blame.NODE,
            )
        ]
    if failed(memory):
        return [error_result(name, device, "memory usage", memory, params)]
    used, without_reserved = memory
    if without_reserved and used > params.max_used_mib * MIB and not procs:
        return [
            Result(
                name,
                Status.FAIL,
                "%d MiB of GPU memory in use with no process on the GPU (a leaked "
                "allocation or a process in another namespace): reset the GPU" % (used // MIB),
                component=device.component,
                details=dict(details, used_mib=used // MIB),
                action=Action.RESET_GPU,
                blame=Blame.NODE,
            )
        ]
    return []
