"""Shared plumbing of the per-GPU checks (gpu_memory, gpu_state, gpu_links, gpu_procs).

A gatherer reads a fixed set of NVML values for each GPU the run looks at (the job's GPUs in a
prolog/epilog, every GPU otherwise; see gpu.select_gpus); each value is the NVML answer or the
NvmlError it raised, so one unsupported or failing call never hides the others. Checks then turn an
error into a Result through the reviewed table in slurm_hooks.hw.nvml: GPU_IS_LOST -> FAIL reboot,
FUNCTION_NOT_FOUND -> UNKNOWN, NOT_SUPPORTED -> the check's `not_supported` parameter (SKIP by default).
"""

from __future__ import annotations

from ...core.structs import Struct, field
from ...hw import nvml
from ...registry import Param
from ...result import Action, Blame, Result, Status
from .inventory import GpuDevice, GpuInventory, GpuSelection

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

    Reader = Callable[[nvml.NvmlSession, Any], Any]  # (session, device handle) -> value

NOT_SUPPORTED_PARAM = Param(
    "not_supported",
    str,
    "skip",
    "outcome when NVML says a reading is not supported on this GPU or driver (NOT_SUPPORTED)",
    choices=("skip", "ok", "warn", "unknown"),
)
_NOT_SUPPORTED_STATUS = {
    "skip": Status.SKIP,
    "ok": Status.OK,
    "warn": Status.WARN,
    "unknown": Status.UNKNOWN,
}


class GpuReadings(Struct):
    """Per-GPU values: `gpus` pairs each selected device with {reading name: value or NvmlError}."""

    gpus: Tuple[Tuple[GpuDevice, Mapping[str, Any]], ...] = ()
    error: Optional[nvml.NvmlError] = None  # NVML unusable: gpu.count says why
    selection: Optional[GpuSelection] = None
    node: Mapping[str, Any] = field(
        default_factory=dict
    )  # node-wide values (e.g. VBIOS of every GPU)


# Every check built on read_gpus has a 3 s timeout (test_gpu_checks checks this): a GPU whose NVML calls
# have not answered after GPU_READ_BUDGET_S is given up, and the other GPUs are still judged in time.
GPU_READ_BUDGET_S = 2.0
MIN_READ_BUDGET_S = 0.5


def read_gpus(
    ctx,
    readers: Mapping[str, Reader],
    devices: Optional[Iterable[GpuDevice]] = None,
    budget: float = GPU_READ_BUDGET_S,
) -> GpuReadings:
    """Run every reader on every selected GPU (or `devices`), keeping NvmlErrors as values.

    One hung GPU costs that GPU only: the GPUs are read one after the other on a worker thread, and
    a GPU still not answering after a moment gets a fresh worker for the GPUs behind it
    (isolation.map_bounded). Readings of a GPU that did not answer within `budget` are
    NvmlError(TIMEOUT) values (UNKNOWN, `details.timed_out`), so its checks report that GPU and
    judge the others normally.
    """
    from ...core.isolation import map_bounded

    inventory: GpuInventory = ctx.get("gpu.inventory")
    if inventory.error is not None:
        return GpuReadings(error=inventory.error)
    selection: GpuSelection = ctx.get("gpu.selection")
    session = nvml.session(ctx.config.get("nvml", "library"))
    chosen = list(selection.devices if devices is None else devices)
    # the first checks waited for the identification (a hung GPU: [nvml] identify_timeout) within
    # their own 3 s: the readings get what is left of GPU_READ_BUDGET_S
    budget = max(budget - inventory.identify_s, MIN_READ_BUDGET_S)
    tables: List[Dict[str, Any]] = [{} for _ in chosen]

    def read(i: int) -> None:
        handle = inventory.handles[chosen[i].index]
        for name, reader in readers.items():
            tables[i][name] = probe(reader, session, handle)

    gpus = []
    for device, table, (finished, value) in zip(
        chosen, tables, map_bounded(len(chosen), read, budget)
    ):
        if finished and isinstance(value, Exception):
            raise value  # our bug: every check of this gatherer reports it (runner: internal error)
        values = dict(table)  # a copy: a hung reader may still write into `table` later
        for name in readers:
            if name not in values:
                values[name] = nvml.NvmlError(
                    nvml.TIMEOUT,
                    name,
                    "GPU %d did not answer within %.3gs" % (device.index, budget),
                )
                values[name].waited = budget
        gpus.append((device, values))
    return GpuReadings(tuple(gpus), None, selection)


def probe(reader: Reader, session: nvml.NvmlSession, handle: Any) -> Any:
    try:
        return reader(session, handle)
    except nvml.NvmlError as exc:
        return exc


def failed(value: Any) -> bool:
    return isinstance(value, nvml.NvmlError)


def error_result(name: str, device: GpuDevice, what: str, error: nvml.NvmlError, params) -> Result:
    """An NVML error reading `what` on `device`, judged by the reviewed table (NOT_SUPPORTED: by config)."""
    out = error.outcome
    details = {"reading": what, "nvml_error": str(error), "nvml_code": error.code}
    if (
        error.code == nvml.TIMEOUT
    ):  # a hung GPU: policy treats it like any timeout ([drain] on_timeout)
        details["timed_out"] = True
        if getattr(error, "waited", None):
            return Result(
                name,
                Status.UNKNOWN,
                "%s: this GPU did not answer within %.3gs (hung NVML call?); the "
                "other GPUs were judged" % (what, error.waited),
                component=device.component,
                details=details,
                blame=Blame.CHECK,
            )
    if out.status is Status.SKIP:
        status = _NOT_SUPPORTED_STATUS[params.not_supported]
        return Result(
            name,
            status,
            "%s not supported on this GPU/driver" % what,
            component=device.component,
            details=details,
            blame=Blame.CHECK if status is Status.UNKNOWN else None,
        )
    return Result(
        name,
        out.status,
        "%s: %s" % (what, out.meaning),
        component=device.component,
        details=details,
        action=out.action if out.status is Status.FAIL else Action.NONE,
        blame=out.blame,
    )


def no_gpus_result(name: str, readings: GpuReadings) -> Optional[Result]:
    """SKIP when there is nothing to look at: NVML unusable (gpu.count reports it) or a job without GPUs."""
    if readings.error is not None:
        return Result(
            name,
            Status.SKIP,
            "NVML unavailable (%s); see gpu.count" % readings.error.outcome.name,
            details={"nvml_error": str(readings.error)},
        )
    if not readings.gpus:
        selection = readings.selection
        if selection is not None and selection.unanswered and not selection.missing:
            return Result(
                name,
                Status.SKIP,
                "the job's GPU%s %s did not answer NVML; see gpu.count"
                % (
                    "s" if len(selection.unanswered) > 1 else "",
                    ",".join(map(str, selection.unanswered)),
                ),
            )
        if selection is not None and selection.missing:
            return Result(
                name,
                Status.SKIP,
                "none of the job's GPUs (%s) is visible to NVML; see gpu.count"
                % ",".join(map(str, selection.missing)),
            )
        job = selection is not None and selection.requested is not None
        return Result(name, Status.SKIP, "the job has no GPUs on this node" if job else "no GPUs")
    return None


def per_gpu(
    name: str,
    readings: GpuReadings,
    params,
    judge: Callable[[GpuDevice, Mapping[str, Any], Any], List[Result]],
    ok_summary: str,
) -> List[Result]:
    """Judge every GPU; only findings are returned, or one OK result for all GPUs."""
    empty = no_gpus_result(name, readings)
    if empty is not None:
        return [empty]
    findings = [r for device, values in readings.gpus for r in judge(device, values, params)]
    if findings:
        return findings
    gpus = [device.index for device, _ in readings.gpus]
    return [
        Result(
            name,
            Status.OK,
            "%s (GPU%s %s)" % (ok_summary, "s" if len(gpus) > 1 else "", ",".join(map(str, gpus))),
            details={"gpus": gpus},
        )
    ]


def first_error(
    name: str, device: GpuDevice, values: Mapping[str, Any], keys: Iterable[str], params
) -> Optional[Result]:
    """The Result for the first of `keys` whose reading failed, or None when all were read."""
    for key in keys:
        if failed(values.get(key)):
            return error_result(name, device, key, values[key], params)
    return None


def finding(
    name: str,
    device: GpuDevice,
    status: Status,
    summary: str,
    action: Action = Action.NONE,
    **details: Any,
) -> Result:
    return Result(
        name,
        status,
        summary,
        component=device.component,
        details=details,
        action=action if status is Status.FAIL else Action.NONE,
    )


def severity_param(name: str, default: str, help_text: str) -> Param:
    return Param(name, str, default, help_text, choices=("fail", "warn", "ignore"))


def severity_status(choice: str) -> Optional[Status]:
    return {"fail": Status.FAIL, "warn": Status.WARN}.get(choice)


def as_dict(*pairs: Tuple[str, Any]) -> Dict[str, Any]:
    """Readings for details: values as they are, errors as their NVML name."""
    return {k: (v.outcome.name if failed(v) else v) for k, v in pairs}
