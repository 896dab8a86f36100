"""Family `gpu` (inventory): the GPUs NVML sees, which of them belong to the job, and the count check.

NVML calls go through slurm_hooks.nvml (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
nvmlDeviceGetName/UUID/PciInfo/MinorNumber; `nvidia-smi -L`, `nvidia-smi -q | grep Minor`); the PCI
view comes from sysfs (`lspci -d 10de:`).

Job GPUs: slurmd gives the prolog SLURM_JOB_GPUS (else CUDA_VISIBLE_DEVICES), the job's GPU indices
*on this node*. Slurm numbers a node's GPUs in the order of their device files in gres.conf (or as
AutoDetect=nvml found them): /dev/nvidia0, /dev/nvidia1, ... - so index N means the GPU whose device
file is /dev/nvidiaN, i.e. NVML *minor number* N. That is usually, but not always, its NVML index
(NVML enumerates in PCI bus order, and when one GPU falls off the bus every later NVML index shifts
while minor numbers stay). We therefore match on minor number, and fall back to the NVML index only
when minor numbers are unavailable. A Slurm index with no matching GPU is node-broken (gpu.count).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .. import nvml
from ..registry import Param, check, gatherer
from ..result import Action, Blame, Result, Status
from ..structs import Struct, field
from .pci import PciDevice, normalize_bus_id

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


class GpuDevice(Struct):
    index: int  # NVML index
    name: str
    uuid: str
    bus_id: str  # sysfs form, 0000:18:00.0
    minor: int = -1  # /dev/nvidia<minor>; -1 when NVML could not tell

    @property
    def component(self) -> str:
        return "gpu:%d %s" % (self.index, self.bus_id)


class GpuInventory(Struct):
    """What NVML reported. `error` is set when NVML is unusable (then `devices` is empty)."""

    error: Optional[nvml.NvmlError] = None
    driver_version: str = ""
    nvml_version: str = ""
    devices: Tuple[GpuDevice, ...] = ()
    device_errors: Tuple[Tuple[int, nvml.NvmlError], ...] = ()  # (index, error) for unreadable GPUs
    count: int = 0
    handles: Dict[int, Any] = field(default_factory=dict, compare=False, repr=False)
    kernel_module: str = ""  # first line of /proc/driver/nvidia/version, read when NVML init failed

    def device(self, index: int) -> Optional[GpuDevice]:
        return next((d for d in self.devices if d.index == index), None)


class GpuSelection(Struct):
    """The GPUs per-GPU checks look at: all of them, or the job's (matched by `method`)."""

    devices: Tuple[GpuDevice, ...]
    requested: Optional[Tuple[int, ...]]  # Slurm's indices; None = every GPU (no job)
    missing: Tuple[int, ...] = ()  # requested indices no NVML device matches
    method: str = "all"  # all | minor | index


@gatherer("gpu.inventory")
def read_inventory(ctx) -> GpuInventory:
    session = nvml.session(ctx.config.get("nvml", "library"))
    try:
        session.open()
        driver = session.call("nvmlSystemGetDriverVersion")
        version = session.call("nvmlSystemGetNVMLVersion")
        count = session.call("nvmlDeviceGetCount")
    except nvml.NvmlError as exc:
        module = (ctx.host.read_text(DRIVER_VERSION_FILE, default="") or "").split("\n", 1)[0].strip()
        return GpuInventory(error=exc, kernel_module=module)
    devices, errors, handles = [], [], {}
    for index in range(count):
        try:
            handle = session.call("nvmlDeviceGetHandleByIndex", index)
            pci = session.call("nvmlDeviceGetPciInfo", handle)
            devices.append(GpuDevice(index, nvml_text(session.call("nvmlDeviceGetName", handle)),
                                     nvml_text(session.call("nvmlDeviceGetUUID", handle)),
                                     normalize_bus_id(nvml_text(pci.busId)), _minor(session, handle)))
            handles[index] = handle
        except nvml.NvmlError as exc:
            errors.append((index, exc))
    return GpuInventory(None, nvml_text(driver), nvml_text(version), tuple(devices), tuple(errors), count, handles)


def _minor(session: nvml.NvmlSession, handle: Any) -> int:
    try:
        return int(session.call("nvmlDeviceGetMinorNumber", handle))
    except nvml.NvmlError:  # NOT_SUPPORTED on some platforms: selection falls back to NVML indices
        return -1


def nvml_text(value: Any) -> str:
    """pynvml returns str for names and bus ids (nvidia-ml-py >= 11.515); older releases gave bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def select_gpus(devices: Tuple[GpuDevice, ...], requested: Optional[Tuple[int, ...]]) -> GpuSelection:
    """Map Slurm's GPU indices to NVML devices: by minor number when every device has a distinct one."""
    if requested is None:
        return GpuSelection(devices, None)
    minors = [d.minor for d in devices]
    by_minor = bool(devices) and min(minors) >= 0 and len(set(minors)) == len(minors)
    key = {(d.minor if by_minor else d.index): d for d in devices}
    chosen = tuple(key[i] for i in requested if i in key)
    missing = tuple(i for i in requested if i not in key)
    return GpuSelection(chosen, tuple(requested), missing, "minor" if by_minor else "index")


@gatherer("gpu.selection")
def read_selection(ctx) -> GpuSelection:
    """The job's GPUs (JobContext.gpus from SLURM_JOB_GPUS) as NVML devices; every GPU outside a job."""
    inventory = ctx.get("gpu.inventory")
    return select_gpus(inventory.devices, ctx.job.gpus)


def unavailable_result(name: str, inventory: GpuInventory, settings, pci_gpus: int) -> Result:
    """What a GPU check reports when NVML is unusable: SKIP on a CPU node, FAIL where GPUs belong."""
    error = inventory.error
    assert error is not None
    expected = settings["general"]["expect_gpus"] or pci_gpus > 0
    details = {"nvml_error": str(error), "advice": nvml.init_advice(error.code)}
    if inventory.kernel_module:
        details["kernel_module"] = inventory.kernel_module
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED) and not expected:
        return Result(name, Status.SKIP, "no NVIDIA driver (%s)" % error.outcome.name, details=details)
    out = error.outcome
    status = out.status if out.status is not Status.SKIP else Status.UNKNOWN
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED):
        status = Status.FAIL
    reason = "GPUs expected (%s) but NVML is unusable: %s" % (
        "%d NVIDIA GPUs on the PCI bus" % pci_gpus if pci_gpus else "general.expect_gpus", nvml.init_advice(error.code))
    return Result(name, status, reason, action=out.action if status is Status.FAIL else Action.NONE,
                  blame=Blame.NODE if status is Status.FAIL else out.blame, details=details)


@check(name="gpu.count", contexts=("prolog", "epilog", "health", "manual"), timeout=3.0,
       needs=("gpu.inventory", "pci.devices", "settings", "gpu.selection"), params=(
           Param("expected", int, 0, "GPUs this node must have (0 = whatever is on the PCI bus)"),
       ))
def gpu_count(inventory: GpuInventory, pci: Tuple[PciDevice, ...], settings, selection: GpuSelection,
              params) -> List[Result]:
    """NVML sees every GPU on the PCI bus, as many as configured, and every GPU Slurm gave the job.

    A GPU that NVML lost but sysfs still lists has "fallen off the bus" (often XID 79); a GPU
    missing from both is dead or unseated. Sources: nvmlDeviceGetCount (`nvidia-smi -L`) and
    /sys/bus/pci/devices/*/{vendor,class} (`lspci -d 10de: -nn`). Fix: reboot; if it recurs, RMA.
    In a prolog, a SLURM_JOB_GPUS index that matches no NVML device (by minor number, see the module
    docstring) is node-broken too: the GPU fell off, or gres.conf lists GPUs the node does not have.
    """
    on_bus = sorted(d.bdf for d in pci if d.is_nvidia_gpu)
    if inventory.error is not None:
        return [unavailable_result("gpu.count", inventory, settings, len(on_bus))]
    seen = sorted(d.bus_id for d in inventory.devices)
    details = {"nvml": inventory.count, "pci": len(on_bus), "expected": params.expected,
               "driver": inventory.driver_version, "nvml_version": inventory.nvml_version,
               "lost": sorted(set(on_bus) - set(seen))}
    results = []
    for index, error in inventory.device_errors:
        results.append(Result("gpu.count", error.outcome.status if error.outcome.status is not Status.SKIP
                              else Status.UNKNOWN, "GPU %d: %s" % (index, error), component="gpu:%d" % index,
                              action=error.outcome.action, blame=error.outcome.blame))
    if details["lost"] or inventory.count < len(on_bus):
        results.append(Result("gpu.count", Status.FAIL, "NVML sees %d GPUs but %d are on the PCI bus (lost: %s)"
                              % (inventory.count, len(on_bus), ", ".join(details["lost"]) or "?"),
                              action=Action.REBOOT, details=details))
    if params.expected and inventory.count != params.expected:
        results.append(Result("gpu.count", Status.FAIL, "%d GPUs, expected %d" % (inventory.count, params.expected),
                              action=Action.REBOOT, details=details))
    if selection.missing:
        results.append(_missing_job_gpus(selection, details))
    return results or [Result("gpu.count", Status.OK, "%d GPUs, driver %s" % (inventory.count,
                                                                           inventory.driver_version), details=details)]


def _missing_job_gpus(selection: GpuSelection, details: Dict[str, Any]) -> Result:
    what = "minor number" if selection.method == "minor" else "NVML index"
    return Result("gpu.count", Status.FAIL, "Slurm allocated GPU %s to the job but NVML has no GPU with that %s "
                  "(fell off the bus, or gres.conf lists GPUs this node lacks)"
                  % (",".join(map(str, selection.missing)), what),
                  component="gpu:%s" % ",".join(map(str, selection.missing)), action=Action.REBOOT, blame=Blame.NODE,
                  details=dict(details, job_gpus=list(selection.requested or ()), missing=list(selection.missing),
                               matched_by=selection.method))
