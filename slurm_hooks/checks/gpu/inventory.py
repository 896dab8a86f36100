"""Family `gpu` (inventory): the GPUs NVML sees, which of them belong to the job, and the count check.

NVML calls go through slurm_hooks.hw.nvml (nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
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

import time

from ...core.structs import Struct, field
from ...hw import nvml
from ...registry import CONTEXTS, Param, check, gatherer
from ...result import Action, Blame, Result, Status
from ..pci import PciDevice
from . import wedged
from .devices import GpuDevice, HungGpu, identify_all, nvml_text

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


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
    error_bus_ids: Dict[int, str] = field(
        default_factory=dict
    )  # bus ids of unreadable GPUs, where NVML gave one
    hung: Tuple[
        HungGpu, ...
    ] = ()  # GPUs whose identification hung (also in device_errors, as TIMEOUT)
    identify_s: float = 0.0  # seconds identification took (a hung GPU: [nvml] identify_timeout)
    identify_started: float = 0.0  # time.time() when identification began (wedged.py's memory)
    persistence: Dict[int, int] = field(default_factory=dict)  # index -> persistence mode (1 on)
    pending: Dict[int, Any] = field(  # index -> the thread still identifying that GPU (wedged.py)
        default_factory=dict, compare=False, repr=False
    )

    def device(self, index: int) -> Optional[GpuDevice]:
        return next((d for d in self.devices if d.index == index), None)


class GpuSelection(Struct):
    """The GPUs per-GPU checks look at: all of them, or the job's (matched by `method`)."""

    devices: Tuple[GpuDevice, ...]
    requested: Optional[Tuple[int, ...]]  # Slurm's indices; None = every GPU (no job)
    missing: Tuple[int, ...] = ()  # requested indices no NVML device matches
    method: str = "all"  # all | minor | index
    unanswered: Tuple[int, ...] = ()  # requested indices that are (or may be) a GPU whose NVML hung


@gatherer("gpu.inventory")
def read_inventory(ctx) -> GpuInventory:
    refusal = nvml.refuse_under_root(
        ctx
    )  # a captured tree: this machine's NVML would answer for the wrong node
    if refusal is not None:
        return GpuInventory(error=refusal)
    session = nvml.session(ctx.config.get("nvml", "library"))
    try:
        session.open()
        driver = session.call("nvmlSystemGetDriverVersion")
        version = session.call("nvmlSystemGetNVMLVersion")
        count = session.call("nvmlDeviceGetCount")
    except nvml.NvmlError as exc:
        module = (
            (ctx.host.read_text(DRIVER_VERSION_FILE, default="") or "").split("\n", 1)[0].strip()
        )
        return GpuInventory(error=exc, kernel_module=module)
    budget = ctx.config.get("nvml", "identify_timeout")
    started, started_wall = time.monotonic(), time.time()
    pending: Dict[int, Any] = {}
    found = identify_all(session, count, budget, pending)
    devices, errors, handles, error_bus, hung, persistence = [], [], {}, {}, [], {}
    for index, (device, handle, error, partial) in enumerate(found):
        if device is not None:
            devices.append(device)
            handles[index] = handle
            if "persistence" in partial:
                persistence[index] = partial["persistence"]
            continue
        errors.append((index, error))
        if partial.get("bus_id"):
            error_bus[index] = partial["bus_id"]
        if error.code == nvml.TIMEOUT and "calling" in partial:  # asked, and never answered
            hung.append(
                HungGpu(index, partial.get("calling", ""), partial.get("minor", -1), budget)
            )
    return GpuInventory(
        None,
        nvml_text(driver),
        nvml_text(version),
        tuple(devices),
        tuple(errors),
        count,
        handles,
        error_bus_ids=error_bus,
        hung=tuple(hung),
        identify_s=time.monotonic() - started,
        identify_started=started_wall,
        persistence=persistence,
        pending=pending,
    )


def select_gpus(
    devices: Tuple[GpuDevice, ...],
    requested: Optional[Tuple[int, ...]],
    hung: Tuple[HungGpu, ...] = (),
) -> GpuSelection:
    """Map Slurm's GPU indices to NVML devices (nvml.slurm_to_nvml: by minor number when every device has a distinct one).

    A GPU whose identification hung (`hung`) is not "missing" (that is a reboot): a requested index
    that is such a GPU - by its minor number or index when NVML said it before hanging, or possibly,
    when it did not - is `unanswered`, judged by gpu.count's rule for hung GPUs.
    """
    if requested is None:
        return GpuSelection(devices, None)
    known = {d.index: d.minor for d in devices}
    known.update((h.index, h.minor) for h in hung if h.minor >= 0)
    to_nvml, method = nvml.slurm_to_nvml(known)
    if method == "index":  # a hung GPU's NVML index is always known
        to_nvml.update((h.index, h.index) for h in hung)
    by_index = {d.index: d for d in devices}
    faceless = method == "minor" and any(h.minor < 0 for h in hung)  # could be any unmatched index
    chosen = tuple(by_index[to_nvml[i]] for i in requested if to_nvml.get(i) in by_index)
    unmatched = [i for i in requested if to_nvml.get(i) not in by_index]
    unanswered = tuple(i for i in unmatched if i in to_nvml or faceless)
    missing = tuple(i for i in unmatched if i not in unanswered)
    return GpuSelection(chosen, tuple(requested), missing, method, unanswered)


@gatherer("gpu.selection")
def read_selection(ctx) -> GpuSelection:
    """The job's GPUs (JobContext.gpus from SLURM_JOB_GPUS) as NVML devices; every GPU outside a job."""
    inventory = ctx.get("gpu.inventory")
    return select_gpus(inventory.devices, ctx.job.gpus, inventory.hung)


def unavailable_result(name: str, inventory: GpuInventory, settings, pci_gpus: int) -> Result:
    """What a GPU check reports when NVML is unusable: SKIP on a CPU node, FAIL where GPUs belong."""
    error = inventory.error
    assert error is not None
    expected = settings["general"]["expect_gpus"] or pci_gpus > 0
    details = {"nvml_error": str(error), "advice": nvml.init_advice(error.code)}
    if inventory.kernel_module:
        details["kernel_module"] = inventory.kernel_module
    if error.code == nvml.NOT_LIVE:
        return Result(
            name,
            Status.SKIP,
            "NVML is live-only: not read under --root (--live nvml reads this machine's driver)",
            details=details,
        )
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED) and not expected:
        return Result(
            name, Status.SKIP, "no NVIDIA driver (%s)" % error.outcome.name, details=details
        )
    out = error.outcome
    status = out.status if out.status is not Status.SKIP else Status.UNKNOWN
    if error.code in (nvml.LIBRARY_NOT_FOUND, nvml.DRIVER_NOT_LOADED):
        status = Status.FAIL
    reason = "GPUs expected (%s) but NVML is unusable: %s" % (
        "%d NVIDIA GPUs on the PCI bus" % pci_gpus if pci_gpus else "general.expect_gpus",
        nvml.init_advice(error.code),
    )
    return Result(
        name,
        status,
        reason,
        action=out.action if status is Status.FAIL else Action.NONE,
        blame=Blame.NODE if status is Status.FAIL else out.blame,
        details=details,
    )


@check(
    name="gpu.count",
    contexts=CONTEXTS,
    timeout=3.0,
    needs=("gpu.inventory", "pci.devices", "settings", "gpu.selection", "gpu.hangs"),
    params=(
        Param(
            "expected",
            int,
            0,
            "GPUs this node must have (0 = whatever is on the PCI bus)",
            minimum=0,
            maximum=256,
        ),
        Param(
            "hung_runs",
            int,
            2,
            "a GPU whose NVML identification hangs while most of its siblings answer FAILs "
            "(reboot) when it hung in this many consecutive runs; UNKNOWN before (0 = never FAIL)",
            minimum=0,
            maximum=1000,
        ),
    ),
)
def gpu_count(
    inventory: GpuInventory,
    pci: Tuple[PciDevice, ...],
    settings,
    selection: GpuSelection,
    hangs: wedged.HangHistory,
    params,
) -> List[Result]:
    """NVML sees every GPU on the PCI bus, as many as configured, and every GPU Slurm gave the job.

    A GPU that NVML does not count but sysfs still lists has "fallen off the bus" (often XID 79):
    FAIL reboot, one result per GPU with component `pci:<bus id>`; a GPU missing from both is dead
    or unseated (`expected`). A GPU NVML counts but cannot read gets the reviewed outcome of its
    error instead (GPU_IS_LOST -> reboot, RESET_REQUIRED -> reset-gpu), named `gpu:<index> <bus id>`
    - it is not also "lost". Sources: nvmlDeviceGetCount (`nvidia-smi -L`) and
    /sys/bus/pci/devices/*/{vendor,class} (`lspci -d 10de: -nn`). Fix: reboot; if it recurs, RMA.
    In a prolog, a SLURM_JOB_GPUS index that matches no NVML device (by minor number, see the module
    docstring) is node-broken too: the GPU fell off, or gres.conf lists GPUs the node does not have.
    A GPU whose identification hung is judged by the rule in wedged.py (UNKNOWN the first time, FAIL
    reboot after `hung_runs` consecutive runs, UNKNOWN when most GPUs hung: the driver).
    """
    on_bus = sorted(d.bdf for d in pci if d.is_nvidia_gpu)
    if inventory.error is not None:
        return [unavailable_result("gpu.count", inventory, settings, len(on_bus))]
    error_bus = attribute_error_bus_ids(inventory, on_bus)
    unseen = sorted(set(on_bus) - {d.bus_id for d in inventory.devices} - set(error_bus.values()))
    details = {
        "nvml": inventory.count,
        "pci": len(on_bus),
        "expected": params.expected,
        "driver": inventory.driver_version,
        "nvml_version": inventory.nvml_version,
        "lost": unseen,
    }
    hung = {h.index for h in inventory.hung}
    results = [
        _device_error(index, error, error_bus.get(index))
        for index, error in inventory.device_errors
        if index not in hung
    ]
    results += wedged.hung_results(inventory, hangs, error_bus, params.hung_runs)
    results += _lost_gpus(inventory, on_bus, unseen, error_bus, details)
    if params.expected and inventory.count != params.expected:
        results.append(
            Result(
                "gpu.count",
                Status.FAIL,
                "%d GPUs, expected %d" % (inventory.count, params.expected),
                action=Action.REBOOT,
                details=details,
            )
        )
    if selection.missing:
        results.append(_missing_job_gpus(selection, details))
    return results or [
        Result(
            "gpu.count",
            Status.OK,
            "%d GPUs, driver %s" % (inventory.count, inventory.driver_version),
            details=details,
        )
    ]


def attribute_error_bus_ids(inventory: GpuInventory, on_bus: List[str]) -> Dict[int, str]:
    """Bus ids of the GPUs NVML counts but cannot read: what NVML said, or - when exactly one such GPU
    has none (its handle failed) and exactly one GPU on the bus is unaccounted for - that one."""
    error_bus = dict(inventory.error_bus_ids)
    nameless = [index for index, _ in inventory.device_errors if index not in error_bus]
    unaccounted = sorted(
        set(on_bus) - {d.bus_id for d in inventory.devices} - set(error_bus.values())
    )
    if len(nameless) == 1 and len(unaccounted) == 1:
        error_bus[nameless[0]] = unaccounted[0]
    return error_bus


def _device_error(index: int, error: nvml.NvmlError, bus_id: Optional[str]) -> Result:
    """A GPU NVML counts but cannot read: the error's reviewed outcome (GPU_IS_LOST -> reboot,
    RESET_REQUIRED -> reset-gpu, ...). NVML sees it, so it is not also 'lost'."""
    out = error.outcome
    status = out.status if out.status is not Status.SKIP else Status.UNKNOWN
    return Result(
        "gpu.count",
        status,
        "GPU %d: %s" % (index, error),  # the bus id is in the component
        component="gpu:%d %s" % (index, bus_id) if bus_id else "gpu:%d" % index,
        action=out.action if status is Status.FAIL else Action.NONE,
        blame=out.blame,
        details={"nvml_error": str(error), "nvml_code": error.code},
    )


def _lost_gpus(
    inventory: GpuInventory,
    on_bus: List[str],
    unseen: List[str],
    error_bus: Dict[int, str],
    details: Dict[str, Any],
) -> List[Result]:
    """GPUs on the PCI bus that NVML does not count ('fell off the bus'), one result each, named in `component`.

    NVML counting as many GPUs as the bus has, yet with bus ids sysfs lacks, is a disagreement of
    the two views (an odd platform, or our normalisation): UNKNOWN, never a reboot.
    """
    missing = len(on_bus) - inventory.count
    if missing > 0:
        if len(unseen) == missing:
            return [
                Result(
                    "gpu.count",
                    Status.FAIL,
                    "GPU at %s is on the PCI bus but NVML does not see it (NVML "
                    "sees %d of %d GPUs)" % (bdf, inventory.count, len(on_bus)),
                    component="pci:" + bdf,
                    action=Action.REBOOT,
                    details=details,
                )
                for bdf in unseen
            ]
        return [
            Result(
                "gpu.count",
                Status.FAIL,
                "NVML sees %d GPUs but %d are on the PCI bus (not seen: %s)"
                % (inventory.count, len(on_bus), ", ".join(unseen) or "?"),
                component=",".join("pci:" + bdf for bdf in unseen) or None,
                action=Action.REBOOT,
                details=details,
            )
        ]
    nameless = [index for index, _ in inventory.device_errors if index not in error_bus]
    nvml_only = sorted(
        ({d.bus_id for d in inventory.devices} | set(error_bus.values())) - set(on_bus)
    )
    if (
        len(unseen) > len(nameless) or nvml_only
    ):  # unreadable GPUs without a bus id explain the rest
        return [
            Result(
                "gpu.count",
                Status.UNKNOWN,
                "NVML and sysfs disagree on GPU bus ids (only in sysfs: %s; only "
                "in NVML: %s)" % (", ".join(unseen) or "-", ", ".join(nvml_only) or "-"),
                blame=Blame.CHECK,
                details=details,
            )
        ]
    return []


def _missing_job_gpus(selection: GpuSelection, details: Dict[str, Any]) -> Result:
    what = "minor number" if selection.method == "minor" else "NVML index"
    return Result(
        "gpu.count",
        Status.FAIL,
        "Slurm allocated GPU %s to the job but NVML has no GPU with that %s "
        "(fell off the bus, or gres.conf lists GPUs this node lacks)"
        % (",".join(map(str, selection.missing)), what),
        component="gpu:%s" % ",".join(map(str, selection.missing)),
        action=Action.REBOOT,
        blame=Blame.NODE,
        details=dict(
            details,
            job_gpus=list(selection.requested or ()),
            missing=list(selection.missing),
            matched_by=selection.method,
        ),
    )
