"""Family `gpu` (links): the GPU's PCIe link, its NVLinks, and its NVLink fabric registration.

One gatherer (`gpu.links`) reads, for each GPU the run looks at (gpu.selection):
nvmlDeviceGetCurrPcieLinkGeneration/Width, nvmlDeviceGetMaxPcieLinkGeneration/Width,
nvmlDeviceGetGpuMaxPcieLinkGeneration, the clocks event reasons (to know whether the GPU is idle),
the NVLink count (field NVML_FI_DEV_NVLINK_LINK_COUNT) and nvmlDeviceGetNvLinkState of each link,
and nvmlDeviceGetGpuFabricInfoV (R550+). By hand: `nvidia-smi -q -d PCIE` (or `lspci -vvv -s BDF`,
LnkSta vs LnkCap), `nvidia-smi nvlink -s`, `nvidia-smi -q | grep -A3 Fabric`.
"""

from __future__ import annotations

import fnmatch

from ...hw import nvml
from ...registry import CONTEXTS, Param, check, gatherer
from ...result import Action, Result, Status
from .common import (
    NOT_SUPPORTED_PARAM,
    GpuReadings,
    error_result,
    failed,
    finding,
    first_error,
    per_gpu,
    read_gpus,
    severity_param,
    severity_status,
)
from .inventory import GpuDevice
from .state import GPU_IDLE

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Optional, Tuple

ALL = CONTEXTS  # every context
FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
FABRIC_COMPLETED = 3
DEGRADED_BW_TRUE = 1  # NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE, bits 0-1 of the health mask


def _nvlink_states(session: nvml.NvmlSession, handle: Any) -> Tuple[bool, ...]:
    """Active flag of every NVLink of the GPU; NvmlError(NOT_SUPPORTED) when it has none."""
    try:
        count: Optional[int] = int(session.field_value(handle, nvml.FI_DEV_NVLINK_LINK_COUNT))
    except nvml.NvmlError:  # older drivers: probe links until NVML says there are no more
        count = None
    states = []
    for link in range(count if count is not None else nvml.NVLINK_MAX_LINKS):
        try:
            states.append(bool(session.call("nvmlDeviceGetNvLinkState", handle, link)))
        except nvml.NvmlError as exc:
            if count is None and states and exc.code in (nvml.INVALID_ARGUMENT, nvml.NOT_SUPPORTED):
                break
            raise
    if not states:
        raise nvml.NvmlError(
            nvml.NOT_SUPPORTED, "nvmlDeviceGetNvLinkState", "the GPU reports no NVLinks"
        )
    return tuple(states)


READERS = {
    "gen": lambda s, h: s.call("nvmlDeviceGetCurrPcieLinkGeneration", h),
    "max_gen": lambda s, h: s.call("nvmlDeviceGetMaxPcieLinkGeneration", h),
    "gpu_max_gen": lambda s, h: s.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
    "width": lambda s, h: s.call("nvmlDeviceGetCurrPcieLinkWidth", h),
    "max_width": lambda s, h: s.call("nvmlDeviceGetMaxPcieLinkWidth", h),
    "clock_event_reasons": lambda s, h: s.call_versioned("clock_event_reasons", h),
    "nvlinks": _nvlink_states,
    "fabric": lambda s, h: s.fabric_info(h),
}


@gatherer("gpu.links")
def read_links(ctx) -> GpuReadings:
    return read_gpus(ctx, READERS)


# -- gpu.pcie ------------------------------------------------------------------------------------


@check(
    name="gpu.pcie",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.links",),
    params=(
        Param(
            "expected_gen",
            int,
            0,
            "FAIL when the link can train to less than this PCIe generation (0 = don't check)",
            minimum=0,
            maximum=7,
        ),
        severity_param(
            "link_below_gpu_max",
            "warn",
            "the link's maximum generation is below what the GPU supports "
            "(a slower slot, riser or switch port)",
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_pcie(readings: GpuReadings, params) -> List[Result]:
    """The GPU's PCIe link is not downtrained.

    Width: current < maximum is always a fault (`LnkSta` x8 where `LnkCap` says x16) -> FAIL drain:
    reseat the GPU/riser, check the slot. Generation: idle GPUs lower their link speed to save power,
    so current < maximum generation is judged only while the GPU is busy (clocks event reason "GPU
    idle" not set); on an idle GPU (every prolog) the load-independent comparisons are used instead:
    the link's maximum generation (nvmlDeviceGetMaxPcieLinkGeneration, what GPU and slot can both do)
    against `expected_gen` (FAIL) and against the GPU's own maximum
    (nvmlDeviceGetGpuMaxPcieLinkGeneration; default WARN, since some hosts are slower by design).
    """
    return per_gpu("gpu.pcie", readings, params, _judge_pcie, "PCIe links at full width")


def _judge_pcie(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.pcie"
    bad = first_error(name, device, v, ("width", "max_width", "gen", "max_gen"), params)
    if bad is not None:
        return [bad]
    reasons = v["clock_event_reasons"]
    idle = failed(reasons) or bool(
        reasons & GPU_IDLE
    )  # unknown load: treat as idle (no gen judgement)
    info = {
        "gen": v["gen"],
        "max_gen": v["max_gen"],
        "width": v["width"],
        "max_width": v["max_width"],
        "gpu_max_gen": None if failed(v["gpu_max_gen"]) else v["gpu_max_gen"],
        "idle": idle,
    }
    out = []
    if v["width"] < v["max_width"]:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "PCIe link downtrained: x%d of x%d (reseat the GPU, check the "
                "slot/riser)" % (v["width"], v["max_width"]),
                Action.DRAIN,
                **info,
            )
        )
    if not idle and v["gen"] < v["max_gen"]:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "PCIe link downtrained under load: Gen%d of Gen%d" % (v["gen"], v["max_gen"]),
                Action.DRAIN,
                **info,
            )
        )
    if params.expected_gen and v["max_gen"] < params.expected_gen:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "PCIe link can train only to Gen%d, expected Gen%d"
                % (v["max_gen"], params.expected_gen),
                Action.DRAIN,
                **info,
            )
        )
    status = severity_status(params.link_below_gpu_max)
    if status is not None and info["gpu_max_gen"] and v["max_gen"] < info["gpu_max_gen"]:
        out.append(
            finding(
                name,
                device,
                status,
                "PCIe link maximum is Gen%d, the GPU supports Gen%d"
                % (v["max_gen"], info["gpu_max_gen"]),
                Action.DRAIN,
                **info,
            )
        )
    return out


# -- gpu.nvlink ----------------------------------------------------------------------------------


def parse_expected_links(entries: List[str]) -> List[Tuple[str, int]]:
    """['NVIDIA H100 NVL=12', '*A100*=12'] -> [(pattern, count)]; ValueError names the bad entry."""
    out = []
    for entry in entries:
        pattern, sep, count = entry.rpartition("=")
        if not sep or not pattern.strip() or not count.strip().isdigit():
            raise ValueError(
                'expected_links entry %r: expected "MODEL PATTERN=COUNT", e.g. "NVIDIA H100 NVL=12"'
                % entry
            )
        out.append((pattern.strip(), int(count)))
    return out


@check(
    name="gpu.nvlink",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.links",),
    params=(
        Param(
            "expected_links",
            list,
            [],
            "active NVLinks per GPU model as 'MODEL PATTERN=COUNT' (shell pattern on the "
            "NVML name, first match wins); a model not listed needs every link NVML reports",
            item_type=str,
            validate=parse_expected_links,
        ),
        Param(
            "fabric",
            bool,
            True,
            "check the GPU's NVLink fabric registration where NVML reports it (NVSwitch systems)",
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_nvlink(readings: GpuReadings, params) -> List[Result]:
    """Every expected NVLink is active and the GPU is registered with the NVLink fabric.

    Sources: nvmlDeviceGetNvLinkState per link (`nvidia-smi nvlink -s`) and
    nvmlDeviceGetGpuFabricInfoV (`nvidia-smi -q`, "Fabric"). Inactive links -> FAIL drain: P2P and
    NCCL traffic fall back to slower paths; check `nvidia-smi nvlink -s`, the fabric manager log, and
    reset or reseat. Fabric registration not completed or failed -> FAIL drain: CUDA cannot start
    on this GPU; check that nvidia-fabricmanager runs (`systemctl status nvidia-fabricmanager`).
    Degraded fabric bandwidth -> WARN. GPUs without NVLink -> the `not_supported` outcome.
    """
    try:
        expected = parse_expected_links(params.expected_links)
    except ValueError as exc:
        return [
            Result(
                "gpu.nvlink",
                Status.UNKNOWN,
                '[checks."gpu.nvlink"] %s' % exc,
                details={"error": str(exc)},
            )
        ]
    return per_gpu(
        "gpu.nvlink",
        readings,
        params,
        lambda d, v, p: _judge_nvlink(d, v, p, expected),
        "NVLinks active",
    )


def _judge_nvlink(
    device: GpuDevice, v: Mapping[str, Any], params, expected: List[Tuple[str, int]]
) -> List[Result]:
    name = "gpu.nvlink"
    out = []
    links = v["nvlinks"]
    if failed(links):
        out.append(error_result(name, device, "NVLink state", links, params))
    else:
        want = next(
            (n for pattern, n in expected if fnmatch.fnmatchcase(device.name, pattern)), len(links)
        )
        inactive = [i for i, up in enumerate(links) if not up]
        if len(links) - len(inactive) < want:
            out.append(
                finding(
                    name,
                    device,
                    Status.FAIL,
                    "%d of %d NVLinks active, %d expected (inactive: %s)"
                    % (len(links) - len(inactive), len(links), want, ",".join(map(str, inactive))),
                    Action.DRAIN,
                    inactive=inactive,
                    links=len(links),
                    expected=want,
                )
            )
    if params.fabric:
        out.extend(_judge_fabric(device, v["fabric"], params))
    return out


def _judge_fabric(device: GpuDevice, fabric: Any, params) -> List[Result]:
    name = "gpu.nvlink"
    if failed(fabric):
        if fabric.code in (nvml.NOT_SUPPORTED, nvml.FUNCTION_NOT_FOUND):
            return []  # no fabric on this system (or a driver before R550): nothing to judge
        return [error_result(name, device, "NVLink fabric state", fabric, params)]
    state, status, health = fabric
    info = {
        "fabric_state": FABRIC_STATES.get(state, state),
        "fabric_status": nvml.outcome(status).name if status else "SUCCESS",
        "fabric_health_mask": health,
    }
    if state == 0:
        return []
    if state != FABRIC_COMPLETED:
        return [
            finding(
                name,
                device,
                Status.FAIL,
                "NVLink fabric registration %s: is nvidia-fabricmanager running?"
                % info["fabric_state"],
                Action.DRAIN,
                **info,
            )
        ]
    if status:
        return [
            finding(
                name,
                device,
                Status.FAIL,
                "NVLink fabric registration failed: %s" % nvml.outcome(status).meaning,
                Action.DRAIN,
                **info,
            )
        ]
    if health & 0x3 == DEGRADED_BW_TRUE:
        return [finding(name, device, Status.WARN, "NVLink fabric bandwidth degraded", **info)]
    return []
