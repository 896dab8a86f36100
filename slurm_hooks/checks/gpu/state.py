"""Family `gpu` (state): driver and firmware, GPU modes, and the clocks/power/thermal state of stragglers.

One gatherer (`gpu.state`) reads, for each GPU the run looks at (gpu.selection):
nvmlDeviceGetPersistenceMode, nvmlDeviceGetComputeMode, nvmlDeviceGetMigMode, the clocks event
reasons (nvmlDeviceGetCurrentClocksEventReasons; ...ThrottleReasons before R535), application clocks
(nvmlDeviceGetApplicationsClock / ...DefaultApplicationsClock), power limits
(nvmlDeviceGetEnforcedPowerLimit / ...PowerManagementDefaultLimit), the GPU temperature and its
slowdown threshold; and nvmlDeviceGetVbiosVersion of every GPU (firmware consistency is node-wide).
By hand: `nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE`, `nvidia-smi -q | grep -i -e vbios -e mode`.
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
    no_gpus_result,
    per_gpu,
    probe,
    read_gpus,
    severity_param,
    severity_status,
)
from .inventory import GpuDevice, GpuInventory

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping

ALL = CONTEXTS  # every context
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

# nvmlClocksEventReason* bits (nvml.h). Idle, application clocks, SW power cap and sync boost are normal.
GPU_IDLE = 0x1
SW_THERMAL_SLOWDOWN, HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE = 0x20, 0x8, 0x40, 0x80

READERS = {
    "persistence_mode": lambda s, h: s.call("nvmlDeviceGetPersistenceMode", h),
    "compute_mode": lambda s, h: s.call("nvmlDeviceGetComputeMode", h),
    "mig_mode": lambda s, h: s.call("nvmlDeviceGetMigMode", h),
    "clock_event_reasons": lambda s, h: s.call_versioned("clock_event_reasons", h),
    "app_clocks": lambda s, h: (
        s.call("nvmlDeviceGetApplicationsClock", h, nvml.CLOCK_GRAPHICS),
        s.call("nvmlDeviceGetApplicationsClock", h, nvml.CLOCK_MEM),
    ),
    "default_app_clocks": lambda s, h: (
        s.call("nvmlDeviceGetDefaultApplicationsClock", h, nvml.CLOCK_GRAPHICS),
        s.call("nvmlDeviceGetDefaultApplicationsClock", h, nvml.CLOCK_MEM),
    ),
    "enforced_power_limit_mw": lambda s, h: s.call("nvmlDeviceGetEnforcedPowerLimit", h),
    "default_power_limit_mw": lambda s, h: s.call("nvmlDeviceGetPowerManagementDefaultLimit", h),
    "temperature_c": lambda s, h: s.call_versioned("temperature", h, nvml.TEMPERATURE_GPU),
    "slowdown_c": lambda s, h: s.call(
        "nvmlDeviceGetTemperatureThreshold", h, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN
    ),
}


VBIOS_BUDGET_S = 0.5


@gatherer("gpu.state")
def read_state(ctx) -> GpuReadings:
    readings = read_gpus(ctx, READERS)
    if readings.error is not None:
        return readings
    inventory: GpuInventory = ctx.get("gpu.inventory")
    session = nvml.session(ctx.config.get("nvml", "library"))
    from ...core.isolation import map_bounded

    devices = list(inventory.devices)
    # every GPU of the node, not only the job's: one that hangs here is left out (VBIOS_BUDGET_S) and
    # the others are compared, within the checks' 3 s after the readings' own budget
    answers = map_bounded(
        len(devices),
        lambda i: probe(
            lambda s, h: s.call("nvmlDeviceGetVbiosVersion", h),
            session,
            inventory.handles[devices[i].index],
        ),
        VBIOS_BUDGET_S,
    )
    vbios = {}
    for device, (finished, value) in zip(devices, answers):
        if isinstance(value, Exception) and not isinstance(value, nvml.NvmlError):
            raise value  # our bug: the state checks report it (runner: internal error)
        if finished:  # an NvmlError is an answer too (probe); a hung GPU has none
            vbios[device.index] = value
    return GpuReadings(
        readings.gpus,
        None,
        readings.selection,
        {
            "driver": inventory.driver_version,
            "vbios": vbios,
            "models": {d.index: d.name for d in inventory.devices},
        },
    )


# -- gpu.driver ----------------------------------------------------------------------------------


@check(
    name="gpu.driver",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.state",),
    params=(
        Param(
            "allow",
            list,
            [],
            "driver versions allowed (shell patterns like '550.*'); empty = any",
            item_type=str,
        ),
        Param(
            "deny",
            list,
            [],
            "driver versions refused (shell patterns), e.g. a release with a known bug",
            item_type=str,
        ),
        Param(
            "same_vbios",
            bool,
            True,
            "WARN when GPUs of the same model run different VBIOS versions",
        ),
        Param(
            "persistence", str, "warn", "persistence mode off", choices=("fail", "warn", "ignore")
        ),
        Param(
            "compute_mode",
            str,
            "default",
            "required compute mode",
            choices=("default", "exclusive_process", "prohibited", "any"),
        ),
        Param("mig", str, "disabled", "required MIG mode", choices=("disabled", "enabled", "any")),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_driver(readings: GpuReadings, params) -> List[Result]:
    """The driver version is allowed, firmware is consistent, and GPU modes are as configured.

    Sources: nvmlSystemGetDriverVersion, nvmlDeviceGetVbiosVersion, nvmlDeviceGetPersistenceMode,
    nvmlDeviceGetComputeMode, nvmlDeviceGetMigMode (`nvidia-smi -q`). A refused driver -> FAIL drain
    (install an allowed one). Mixed VBIOS on one model -> WARN (flash them alike: `nvidia-smi -q | grep
    VBIOS`). Persistence mode off -> WARN: every job pays the driver's init and the GPU state resets
    between jobs (`nvidia-smi -pm 1`, or run nvidia-persistenced). Wrong compute or MIG mode -> FAIL
    drain: jobs would fail or see the wrong devices (`nvidia-smi -c 0`, `nvidia-smi -mig 0` + reset).
    """
    empty = no_gpus_result("gpu.driver", readings)
    if empty is not None:
        return [empty]
    found = _judge_node(readings.node, params)
    modes = per_gpu("gpu.driver", readings, params, _judge_modes, "modes as configured")
    found += [r for r in modes if r.status is not Status.OK]
    if found:
        return found
    return [
        Result(
            "gpu.driver",
            Status.OK,
            "driver %s, %s" % (readings.node["driver"], modes[0].summary),
            details={"driver": readings.node["driver"]},
        )
    ]


def _judge_node(node: Mapping[str, Any], params) -> List[Result]:
    driver = node["driver"]
    out = []
    denied = [p for p in params.deny if fnmatch.fnmatchcase(driver, p)]
    if denied or (params.allow and not any(fnmatch.fnmatchcase(driver, p) for p in params.allow)):
        out.append(
            Result(
                "gpu.driver",
                Status.FAIL,
                "driver %s is %s"
                % (driver, "denied (%s)" % denied[0] if denied else "not in the allow list"),
                action=Action.DRAIN,
                details={"driver": driver, "allow": params.allow, "deny": params.deny},
            )
        )
    if params.same_vbios:
        by_model: Dict[str, Dict[str, List[int]]] = {}
        for index, vbios in sorted(node["vbios"].items()):
            if not failed(vbios):
                by_model.setdefault(node["models"][index], {}).setdefault(str(vbios), []).append(
                    index
                )
        for model, versions in sorted(by_model.items()):
            if len(versions) > 1:
                out.append(
                    Result(
                        "gpu.driver",
                        Status.WARN,
                        "%s GPUs run %d VBIOS versions: %s"
                        % (
                            model,
                            len(versions),
                            "; ".join(
                                "%s on GPU %s" % (v, ",".join(map(str, g)))
                                for v, g in sorted(versions.items())
                            ),
                        ),
                        details={"model": model, "vbios": versions},
                    )
                )
    return out


def _judge_modes(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.driver"
    out = []
    status = severity_status(params.persistence)
    if failed(v["persistence_mode"]):
        out.append(error_result(name, device, "persistence mode", v["persistence_mode"], params))
    elif status is not None and not v["persistence_mode"]:
        out.append(
            finding(
                name,
                device,
                status,
                "persistence mode is off (nvidia-smi -pm 1, or run nvidia-persistenced)",
                Action.DRAIN,
            )
        )
    mode = v["compute_mode"]
    if failed(mode):
        out.append(error_result(name, device, "compute mode", mode, params))
    elif params.compute_mode != "any" and COMPUTE_MODES.get(mode, str(mode)) != params.compute_mode:
        out.append(
            finding(
                name,
                device,
                Status.FAIL,
                "compute mode is %s, expected %s (nvidia-smi -c)"
                % (COMPUTE_MODES.get(mode, mode), params.compute_mode),
                Action.DRAIN,
                compute_mode=mode,
            )
        )
    mig = v["mig_mode"]
    if failed(mig):
        if not (
            mig.code == nvml.NOT_SUPPORTED and params.mig != "enabled"
        ):  # no MIG on this GPU: nothing to check
            out.append(error_result(name, device, "MIG mode", mig, params))
    elif params.mig != "any":
        current, pending = (bool(m) for m in mig)
        if current != (params.mig == "enabled"):
            out.append(
                finding(
                    name,
                    device,
                    Status.FAIL,
                    "MIG is %s, expected %s" % ("enabled" if current else "disabled", params.mig),
                    Action.DRAIN,
                    mig_current=current,
                    mig_pending=pending,
                )
            )
        elif pending != current:
            out.append(
                finding(
                    name,
                    device,
                    Status.WARN,
                    "MIG mode change pending a GPU reset",
                    mig_pending=pending,
                )
            )
    return out


# -- gpu.clocks ----------------------------------------------------------------------------------


@check(
    name="gpu.clocks",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.state",),
    params=(
        severity_param(
            "hw_slowdown", "fail", "clocks event reason HW slowdown (clocks cut by half or more)"
        ),
        severity_param("hw_thermal_slowdown", "fail", "clocks event reason HW thermal slowdown"),
        severity_param(
            "hw_power_brake",
            "fail",
            "clocks event reason HW power brake (external power-brake signal)",
        ),
        severity_param("sw_thermal_slowdown", "warn", "clocks event reason SW thermal slowdown"),
        severity_param("application_clocks", "warn", "application clocks differ from the defaults"),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_clocks(readings: GpuReadings, params) -> List[Result]:
    """No hardware slowdown holds the clocks down, and application clocks are at their defaults.

    Sources: nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons before R535) and
    nvmlDeviceGetApplicationsClock / ...DefaultApplicationsClock (`nvidia-smi -q -d PERFORMANCE,CLOCK`).
    nvml.h: HW slowdown means temperature too high, an external power brake (e.g. the power supply)
    or power draw too high; on an idle GPU before a job, any of them makes this GPU the straggler of
    a synchronous job -> FAIL drain (check cooling, PSUs, `nvidia-smi -q -d PERFORMANCE`). SW thermal
    slowdown -> WARN. Application clocks left changed by someone -> WARN (`nvidia-smi -rac`).
    Severities are configurable (fail, warn, ignore).
    """
    return per_gpu(
        "gpu.clocks", readings, params, _judge_clocks, "no HW slowdown, default application clocks"
    )


def _judge_clocks(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    name = "gpu.clocks"
    out = []
    reasons = v["clock_event_reasons"]
    if failed(reasons):
        out.append(error_result(name, device, "clocks event reasons", reasons, params))
    else:
        for bit, label, choice in (
            (HW_SLOWDOWN, "HW slowdown", params.hw_slowdown),
            (HW_THERMAL_SLOWDOWN, "HW thermal slowdown", params.hw_thermal_slowdown),
            (HW_POWER_BRAKE, "HW power brake slowdown", params.hw_power_brake),
            (SW_THERMAL_SLOWDOWN, "SW thermal slowdown", params.sw_thermal_slowdown),
        ):
            status = severity_status(choice)
            if reasons & bit and status is not None:
                out.append(
                    finding(
                        name,
                        device,
                        status,
                        "%s active (clocks event reasons %#x)" % (label, reasons),
                        Action.DRAIN,
                        clock_event_reasons=reasons,
                        reason=label,
                    )
                )
    status = severity_status(params.application_clocks)
    bad = first_error(name, device, v, ("app_clocks", "default_app_clocks"), params)
    if bad is not None:
        out.append(bad)
    elif status is not None and tuple(v["app_clocks"]) != tuple(v["default_app_clocks"]):
        out.append(
            finding(
                name,
                device,
                status,
                "application clocks %s MHz (graphics, memory), default %s: reset "
                "with nvidia-smi -rac -i %d"
                % (tuple(v["app_clocks"]), tuple(v["default_app_clocks"]), device.index),
                Action.DRAIN,
                app_clocks=list(v["app_clocks"]),
                default_app_clocks=list(v["default_app_clocks"]),
            )
        )
    return out


# -- gpu.power -----------------------------------------------------------------------------------


@check(
    name="gpu.power",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.state",),
    params=(
        Param(
            "min_limit_percent",
            float,
            100.0,
            "WARN when the enforced power limit is below this percent of the default limit",
            minimum=0.0,
            maximum=200.0,
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_power(readings: GpuReadings, params) -> List[Result]:
    """The enforced power limit is not below the board's default (someone left it lowered).

    Sources: nvmlDeviceGetEnforcedPowerLimit and nvmlDeviceGetPowerManagementDefaultLimit
    (`nvidia-smi -q -d POWER`). A lowered limit makes this GPU slower than its peers -> WARN; restore
    it with `nvidia-smi -pl <default W> -i N` (or find the chassis power cap that lowered it).
    """
    return per_gpu("gpu.power", readings, params, _judge_power, "power limit at default")


def _judge_power(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    bad = first_error(
        "gpu.power", device, v, ("enforced_power_limit_mw", "default_power_limit_mw"), params
    )
    if bad is not None:
        return [bad]
    enforced, default = v["enforced_power_limit_mw"], v["default_power_limit_mw"]
    if default and enforced * 100.0 < default * params.min_limit_percent:
        return [
            finding(
                "gpu.power",
                device,
                Status.WARN,
                "power limit %d W is below the default %d W (nvidia-smi "
                "-pl %d -i %d)"
                % (enforced // 1000, default // 1000, default // 1000, device.index),
                enforced_limit_mw=enforced,
                default_limit_mw=default,
            )
        ]
    return []


# -- gpu.thermal ---------------------------------------------------------------------------------


@check(
    name="gpu.thermal",
    contexts=ALL,
    timeout=3.0,
    needs=("gpu.state",),
    params=(
        Param(
            "margin_c",
            int,
            10,
            "WARN when the GPU is within this many degrees C of its slowdown temperature",
            minimum=0,
            maximum=150,
        ),
        NOT_SUPPORTED_PARAM,
    ),
)
def gpu_thermal(readings: GpuReadings, params) -> List[Result]:
    """The GPU is not at (FAIL) or near (WARN) its own slowdown temperature.

    Sources: nvmlDeviceGetTemperatureV / nvmlDeviceGetTemperature and
    nvmlDeviceGetTemperatureThreshold(SLOWDOWN) (`nvidia-smi -q -d TEMPERATURE`: "GPU Slowdown
    Temp"). At the slowdown threshold the GPU cuts its clocks: FAIL drain, check fans, airflow and
    the data-center cooling. The threshold comes from the GPU itself, so it is right for every model.
    """
    return per_gpu(
        "gpu.thermal", readings, params, _judge_thermal, "temperature well below slowdown"
    )


def _judge_thermal(device: GpuDevice, v: Mapping[str, Any], params) -> List[Result]:
    bad = first_error("gpu.thermal", device, v, ("temperature_c", "slowdown_c"), params)
    if bad is not None:
        return [bad]
    temp, slowdown = int(v["temperature_c"]), int(v["slowdown_c"])
    info = {"temperature_c": temp, "slowdown_c": slowdown}
    if temp >= slowdown:
        return [
            finding(
                "gpu.thermal",
                device,
                Status.FAIL,
                "%d C, at or above the slowdown temperature %d C: check cooling" % (temp, slowdown),
                Action.DRAIN,
                **info,
            )
        ]
    if temp >= slowdown - params.margin_c:
        return [
            finding(
                "gpu.thermal",
                device,
                Status.WARN,
                "%d C, within %d C of the slowdown temperature %d C"
                % (temp, params.margin_c, slowdown),
                **info,
            )
        ]
    return []
