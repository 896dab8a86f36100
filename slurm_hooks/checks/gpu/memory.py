"""Family `gpu` (memory health): ECC, row remapping / page retirement, and NVML's recovery action.

One gatherer (`gpu.memory_health`) reads, for each GPU the run looks at (gpu.selection):
nvmlDeviceGetEccMode, nvmlDeviceGetTotalEccErrors (volatile/aggregate x corrected/uncorrected),
nvmlDeviceGetMemoryErrorCounter (DRAM and SRAM), nvmlDeviceGetRemappedRows (Ampere and later),
nvmlDeviceGetRetiredPages[_v2] and ...PendingStatus (before Ampere), and the field
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R560+). By hand: `nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`.
"""

from __future__ import annotations

from ...hw import nvml
from ...registry import CONTEXTS, Param, check, gatherer
from ...result import Action, Result, Status
from .common import (
    NOT_SUPPORTED_PARAM,
    GpuReadings,
    as_dict,
    error_result,
    failed,
    finding,
    first_error,
    per_gpu,
    read_gpus,
)
from .inventory import GpuDevice

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, List, Mapping

ALL = CONTEXTS  # every context
_LOCATIONS = (("dram", nvml.MEMORY_LOCATION_DRAM), ("sram", nvml.MEMORY_LOCATION_SRAM))


def _ecc_total(error_type: int, counter: int):
    return lambda s, h: s.call("nvmlDeviceGetTotalEccErrors", h, error_type, counter)


def _aggregate_uncorrected_by_location(session: nvml.NvmlSession, handle: Any) -> Mapping[str, int]:
    """{'dram': n, 'sram': n} for the locations this GPU counts (others answer NOT_SUPPORTED and are left out)."""
    out = {}
    for name, location in _LOCATIONS:
        try:
            out[name] = int(
                session.call(
                    "nvmlDeviceGetMemoryErrorCounter",
                    handle,
                    nvml.MEMORY_ERROR_UNCORRECTED,
                    nvml.AGGREGATE_ECC,
                    location,
                )
            )
        except nvml.NvmlError as exc:
            if exc.outcome.status is not Status.SKIP:
                raise
    return out


def _retired_count(cause: int):
    return lambda s, h: len(s.call_versioned("retired_pages", h, cause))


READERS = {
    "ecc_mode": lambda s, h: s.call("nvmlDeviceGetEccMode", h),
    "volatile_uncorrected": _ecc_total(nvml.MEMORY_ERROR_UNCORRECTED, nvml.VOLATILE_ECC),
    "volatile_corrected": _ecc_total(nvml.MEMORY_ERROR_CORRECTED, nvml.VOLATILE_ECC),
    "aggregate_uncorrected": _ecc_total(nvml.MEMORY_ERROR_UNCORRECTED, nvml.AGGREGATE_ECC),
    "aggregate_uncorrected_by_location": _aggregate_uncorrected_by_location,
    "remapped_rows": lambda s, h: s.call("nvmlDeviceGetRemappedRows", h),
    "retired_pending": lambda s, h: s.call("nvmlDeviceGetRetiredPagesPendingStatus", h),
    "retired_single_bit": _retired_count(nvml.PAGE_RETIREMENT_SINGLE_BIT),
    "retired_double_bit": _retired_count(nvml.PAGE_RETIREMENT_DOUBLE_BIT),
    "recovery_action": lambda s, h: s.field_value(h, nvml.FI_DEV_GET_GPU_RECOVERY_ACTION),
}


@gatherer("gpu.memory_health")
def read_memory_health(ctx) -> GpuReadings:
    return read_gpus(ctx, READERS)


# -- gpu.ecc -------------------------------------------------------------------------------------


@check(
    name="gpu.ecc",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.memory_health",),
    params=(
        Param("require_enabled", bool, True, "ECC must be on (FAIL, drain when it is off)"),
        Param(
            "max_volatile_uncorrected",
            int,
            0,
            "FAIL (reset-gpu) above this many uncorrectable errors since the "
            "last driver load (DCGM: any volatile DBE fails)",
            minimum=0,
            maximum=1 << 32,
        ),
        Param(
            "max_aggregate_uncorrected_sram",
            int,
            0,
            "WARN above this many lifetime uncorrectable SRAM errors (-1 = don't check)",
            minimum=-1,
            maximum=1 << 32,
        ),
        Param(
            "max_aggregate_uncorrected_dram",
            int,
            -1,
            "WARN above this many lifetime uncorrectable DRAM errors "
            "(-1 = don't check: row remapping handles DRAM, see gpu.remap)",
            minimum=-1,
            maximum=1 << 32,
        ),
        Param(
            "max_volatile_corrected",
            int,
            10000,
            "WARN above this many corrected errors since the last driver load "
            "(corrected errors are normal; a flood is a sign of a failing part)",
            minimum=0,
            maximum=1 << 32,
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_ecc(readings: GpuReadings, params) -> List[Result]:
    """ECC is enabled and no uncorrectable memory error happened since the driver loaded.

    Sources: nvmlDeviceGetEccMode, nvmlDeviceGetTotalEccErrors, nvmlDeviceGetMemoryErrorCounter
    (`nvidia-smi -q -d ECC`). ECC off -> FAIL drain: enable with `nvidia-smi -e 1` and reset the GPU.
    A mode change waiting for a reset -> WARN. Volatile uncorrectable errors -> FAIL reset-gpu: the
    data of the last job may be corrupt; drain, reset the GPU (`nvidia-smi -r -i N`) or reboot, and RMA
    if they recur. Lifetime (aggregate) SRAM uncorrectables and floods of corrected errors -> WARN.
    """
    return per_gpu("gpu.ecc", readings, params, _judge_ecc, "ECC on, no uncorrectable errors")


def _judge_ecc(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.ecc"
    bad = first_error(name, device, v, ("ecc_mode",), params)
    if bad is not None:
        return [bad]
    current, pending = v["ecc_mode"]
    out = []
    if not current:
        if params.require_enabled:
            out.append(
                finding(
                    name,
                    device,
                    Status.FAIL,
                    "ECC is disabled (enable: nvidia-smi -e 1 -i %d, then "
                    "reset the GPU)" % device.index,
                    Action.DRAIN,
                    ecc_pending=bool(pending),
                )
            )
        return out  # the counters are meaningless (and unsupported) with ECC off
    if pending != current:
        out.append(
            finding(
                name,
                device,
                Status.WARN,
                "ECC mode change pending a GPU reset",
                ecc_pending=bool(pending),
            )
        )
    bad = first_error(
        name,
        device,
        v,
        ("volatile_uncorrected", "volatile_corrected", "aggregate_uncorrected"),
        params,
    )
    if bad is not None:
        return out + [bad]
    counts = as_dict(
        *(
            (k, v[k])
            for k in ("volatile_uncorrected", "volatile_corrected", "aggregate_uncorrected")
        )
    )
    locations = v["aggregate_uncorrected_by_location"]
    counts["aggregate_uncorrected_by_location"] = (
        locations if not failed(locations) else locations.outcome.name
    )
    if v["volatile_uncorrected"] > params.max_volatile_uncorrected:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "%d uncorrectable ECC errors since the driver loaded: reset "
                "the GPU (nvidia-smi -r -i %d) or reboot"
                % (v["volatile_uncorrected"], device.index),
                Action.RESET_GPU,
                **counts,
            )
        )
    if not failed(locations):
        for where, limit in (
            ("sram", params.max_aggregate_uncorrected_sram),
            ("dram", params.max_aggregate_uncorrected_dram),
        ):
            if limit >= 0 and locations.get(where, 0) > limit:
                out.append(
                    finding(
                        name,
                        device,
                        Status.WARN,
                        "%d lifetime uncorrectable %s errors (limit %d)"
                        % (locations[where], where.upper(), limit),
                        **counts,
                    )
                )
    if v["volatile_corrected"] > params.max_volatile_corrected:
        out.append(
            finding(
                name,
                device,
                Status.WARN,
                "%d corrected ECC errors since the driver loaded (limit %d)"
                % (v["volatile_corrected"], params.max_volatile_corrected),
                **counts,
            )
        )
    return out


# -- gpu.remap -----------------------------------------------------------------------------------


@check(
    name="gpu.remap",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.memory_health",),
    params=(
        Param(
            "max_uncorrectable_remaps",
            int,
            512,
            "WARN at this many rows remapped for uncorrectable errors",
            minimum=1,
            maximum=1 << 20,
        ),
        Param(
            "max_retired_pages",
            int,
            63,
            "FAIL (rma) at this many retired pages, single + double bit "
            "(DCGM's DCGM_LIMIT_MAX_RETIRED_PAGES; pre-Ampere GPUs)",
            minimum=1,
            maximum=1 << 20,
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_remap(readings: GpuReadings, params) -> List[Result]:
    """No pending or failed row remapping (Ampere+), no pending page retirement (older GPUs).

    Sources: nvmlDeviceGetRemappedRows (`nvidia-smi -q -d ROW_REMAPPER`); before Ampere
    nvmlDeviceGetRetiredPages[_v2] and nvmlDeviceGetRetiredPagesPendingStatus (`nvidia-smi -q -d
    PAGE_RETIREMENT`). A remap (or retirement) pending -> FAIL reset-gpu: it takes effect only after a
    GPU reset (`nvidia-smi -r -i N`) or reboot. Remapping failure (a bank ran out of spare rows) ->
    FAIL rma. Many uncorrectable remaps -> WARN; retired pages at DCGM's limit -> FAIL rma.
    """
    return per_gpu("gpu.remap", readings, params, _judge_remap, "no pending or failed row remaps")


def _judge_remap(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.remap"
    rows = v["remapped_rows"]
    if not failed(rows):
        corrected, uncorrected, pending, failure = rows
        info = {
            "corrected_remaps": corrected,
            "uncorrectable_remaps": uncorrected,
            "pending": bool(pending),
            "failure": bool(failure),
        }
        out = []
        if failure:
            out.append(
                finding(
                    name,
                    device,
                    Status.FAIL,
                    "row remapping failed: a memory bank has no spare rows left; RMA the GPU",
                    Action.RMA,
                    **info,
                )
            )
        if pending:
            out.append(
                finding(
                    name,
                    device,
                    Status.FAIL,
                    "row remap pending: reset the GPU (nvidia-smi -r -i %d) or "
                    "reboot to apply it" % device.index,
                    Action.RESET_GPU,
                    **info,
                )
            )
        if uncorrected >= params.max_uncorrectable_remaps:
            out.append(
                finding(
                    name,
                    device,
                    Status.WARN,
                    "%d rows remapped for uncorrectable errors (limit %d)"
                    % (uncorrected, params.max_uncorrectable_remaps),
                    **info,
                )
            )
        return out
    if rows.code != nvml.NOT_SUPPORTED:
        return [error_result(name, device, "remapped_rows", rows, params)]
    return _judge_retired(device, v, params)


def _judge_retired(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    """Page retirement: what GPUs before Ampere use instead of row remapping."""
    name = "gpu.remap"
    bad = first_error(
        name, device, v, ("retired_pending", "retired_single_bit", "retired_double_bit"), params
    )
    if bad is not None:
        return [bad]
    total = v["retired_single_bit"] + v["retired_double_bit"]
    info = {
        "retired_single_bit": v["retired_single_bit"],
        "retired_double_bit": v["retired_double_bit"],
        "pending": bool(v["retired_pending"]),
    }
    out = []
    if total >= params.max_retired_pages:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "%d retired pages (limit %d): RMA the GPU" % (total, params.max_retired_pages),
                Action.RMA,
                **info,
            )
        )
    if v["retired_pending"]:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "page retirement pending: reset the GPU (nvidia-smi -r -i %d) "
                "or reboot" % device.index,
                Action.RESET_GPU,
                **info,
            )
        )
    return out


# -- gpu.recovery --------------------------------------------------------------------------------

# nvmlDeviceGpuRecoveryAction_t (nvml.h) -> what we do about it
RECOVERY_ACTIONS = {
    0: ("NONE", Action.NONE, "no action needed"),
    1: ("GPU_RESET", Action.RESET_GPU, "reset the GPU (nvidia-smi -r -i N)"),
    2: ("NODE_REBOOT", Action.REBOOT, "reboot the node"),
    3: (
        "DRAIN_P2P",
        Action.DRAIN,
        "stop peer-to-peer traffic to this GPU (drain) until it is reset",
    ),
    4: ("DRAIN_AND_RESET", Action.RESET_GPU, "drain, then reset the GPU"),
    5: (
        "RECOVER_IMEX_DOMAIN",
        Action.DRAIN,
        "recover the IMEX domain (restart nvidia-imex on its nodes)",
    ),
    6: ("BUS_RESET", Action.REBOOT, "reset the GPU's PCIe bus (a reboot does that)"),
    7: ("SYSTEM_REBOOT", Action.REBOOT, "reboot the system"),
}


@check(
    name="gpu.recovery",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.memory_health",),
    params=(NOT_SUPPORTED_PARAM,),
)
def gpu_recovery(readings: GpuReadings, params) -> List[Result]:
    """The driver does not ask for a recovery action (GPU reset, reboot, drain) on any GPU.

    Source: nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), R560 and later
    (`nvidia-smi -q`, "Recovery Action"; older drivers: NOT_SUPPORTED -> the `not_supported` outcome).
    Anything but NONE -> FAIL with the driver's action (reset-gpu, reboot or drain); an action code
    newer than this table -> UNKNOWN.
    """
    return per_gpu(
        "gpu.recovery", readings, params, _judge_recovery, "no recovery action requested"
    )


def _judge_recovery(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    value = v["recovery_action"]
    if failed(value):
        return [error_result("gpu.recovery", device, "recovery action", value, params)]
    known = RECOVERY_ACTIONS.get(int(value))
    if known is None:
        return [
            Result(
                "gpu.recovery",
                Status.UNKNOWN,
                "driver asks for recovery action %d, unknown to slurm-hooks" % value,
                component=device.component,
                details={"recovery_action": value},
            )
        ]
    label, action, advice = known
    if action is Action.NONE:
        return []
    return [
        finding(
            "gpu.recovery",
            device,
            Status.FAIL,
            "driver requests recovery action %s: %s" % (label, advice),
            action,
            recovery_action=label,
        )
    ]
