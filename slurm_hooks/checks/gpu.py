"""Family `gpu` (inventory): the GPUs NVML sees, and the count check.

NVML calls go through slurm_hooks.nvml (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
nvmlDeviceGetName/UUID/PciInfo; `nvidia-smi -L`); the PCI view comes from sysfs (`lspci -d 10de:`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .. import nvml
from ..registry import Param, check, gatherer
from ..result import Action, Blame, Result, Status
from .pci import PciDevice, normalize_bus_id


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    bus_id: str  # sysfs form, 0000:18:00.0

    @property
    def component(self) -> str:
        return "gpu:%d %s" % (self.index, self.bus_id)


@dataclass(frozen=True)
class GpuInventory:
    """What NVML reported. `error` is set when NVML is unusable (then `devices` is empty)."""

    error: Optional[nvml.NvmlError] = None
    driver_version: str = ""
    nvml_version: str = ""
    devices: Tuple[GpuDevice, ...] = ()
    device_errors: Tuple[Tuple[int, nvml.NvmlError], ...] = ()  # (index, error) for unreadable GPUs
    count: int = 0
    handles: Dict[int, Any] = field(default_factory=dict, compare=False, repr=False)

    def device(self, index: int) -> Optional[GpuDevice]:
        return next((d for d in self.devices if d.index == index), None)


@gatherer("gpu.inventory")
def read_inventory(ctx) -> GpuInventory:
    session = nvml.session(ctx.config.get("nvml", "library"))
    try:
        session.open()
        driver = session.call("nvmlSystemGetDriverVersion")
        version = session.call("nvmlSystemGetNVMLVersion")
        count = session.call("nvmlDeviceGetCount")
    except nvml.NvmlError as exc:
        return GpuInventory(error=exc)
    devices, errors, handles = [], [], {}
    for index in range(count):
        try:
            handle = session.call("nvmlDeviceGetHandleByIndex", index)
            pci = session.call("nvmlDeviceGetPciInfo", handle)
            devices.append(GpuDevice(index, _text(session.call("nvmlDeviceGetName", handle)),
                                     _text(session.call("nvmlDeviceGetUUID", handle)), normalize_bus_id(_text(pci.busId))))
            handles[index] = handle
        except nvml.NvmlError as exc:
            errors.append((index, exc))
    return GpuInventory(None, _text(driver), _text(version), tuple(devices), tuple(errors), count, handles)


def _text(value: Any) -> str:
    """pynvml returns str for names and bus ids (nvidia-ml-py >= 11.515); older releases gave bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def unavailable_result(name: str, inventory: GpuInventory, settings, pci_gpus: int) -> Result:
    """What a GPU check reports when NVML is unusable: SKIP on a CPU node, FAIL where GPUs belong."""
    error = inventory.error
    assert error is not None
    expected = settings["general"]["expect_gpus"] or pci_gpus > 0
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED) and not expected:
        return Result(name, Status.SKIP, "no NVIDIA driver (%s)" % error.outcome.name,
                      details={"nvml_error": str(error)})
    out = error.outcome
    status = out.status if out.status is not Status.SKIP else Status.UNKNOWN
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED):
        status = Status.FAIL
    reason = "GPUs expected (%s) but NVML is unusable: %s" % (
        "%d NVIDIA GPUs on the PCI bus" % pci_gpus if pci_gpus else "general.expect_gpus", out.meaning)
    return Result(name, status, reason, action=out.action if status is Status.FAIL else Action.NONE,
                  blame=Blame.NODE if status is Status.FAIL else out.blame, details={"nvml_error": str(error)})


@check(name="gpu.count", contexts=("prolog", "epilog", "health", "manual"), timeout=3.0,
       needs=("gpu.inventory", "pci.devices", "settings"), params=(
           Param("expected", int, 0, "GPUs this node must have (0 = whatever is on the PCI bus)"),
       ))
def gpu_count(inventory: GpuInventory, pci: Tuple[PciDevice, ...], settings, params) -> List[Result]:
    """NVML sees every GPU on the PCI bus, and as many as configured.

    A GPU that NVML lost but sysfs still lists has "fallen off the bus" (often XID 79); a GPU
    missing from both is dead or unseated. Sources: nvmlDeviceGetCount (`nvidia-smi -L`) and
    /sys/bus/pci/devices/*/{vendor,class} (`lspci -d 10de: -nn`). Fix: reboot; if it recurs, RMA.
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
    return results or [Result("gpu.count", Status.OK, "%d GPUs, driver %s" % (inventory.count,
                                                                           inventory.driver_version), details=details)]
