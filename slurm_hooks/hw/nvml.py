"""The one NVML choke point: the only module that imports pynvml (from the nvidia-ml-py package).

- Lazy: pynvml is imported and nvmlInit() called once per process, on first use.
- Every NVMLError code is mapped through ERROR_TABLE (reviewed, tested row by row) to a Status,
  an Action and who is to blame, so checks never invent their own meaning for an error.
- Versioned functions are probed here (VERSIONED): a function missing from an older driver is
  logged once and the caller gets NvmlError(FUNCTION_NOT_FOUND) -> UNKNOWN, never a crash.
- Calls can hang (a GPU falling off the bus); they run inside the runner's check threads, whose
  timeouts abandon them.

Data comes from libnvidia-ml.so.1 (the driver's library; `nvidia-smi -q` reads the same).
"""

from __future__ import annotations

import ctypes
import threading

from ..core.structs import Struct
from ..result import Action, Blame, Status

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

# NVML return codes (nvml.h nvmlReturn_t; the same numbers pynvml exposes as NVML_ERROR_*).
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 1, 2, 3, 4
ALREADY_INITIALIZED, NOT_FOUND, INSUFFICIENT_SIZE, INSUFFICIENT_POWER = 5, 6, 7, 8
DRIVER_NOT_LOADED, TIMEOUT, IRQ_ISSUE, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND = 9, 10, 11, 12, 13
CORRUPTED_INFOROM, GPU_IS_LOST, RESET_REQUIRED, OPERATING_SYSTEM = 14, 15, 16, 17
LIB_RM_VERSION_MISMATCH, IN_USE, MEMORY, NO_DATA, VGPU_ECC_NOT_SUPPORTED = 18, 19, 20, 21, 22
INSUFFICIENT_RESOURCES, FREQ_NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH, DEPRECATED = 23, 24, 25, 26
NOT_READY, GPU_NOT_FOUND, INVALID_STATE, RESET_TYPE_NOT_SUPPORTED, UNKNOWN_ERROR = (
    27,
    28,
    29,
    30,
    999,
)
NOT_LIVE = (
    -100
)  # ours, not an nvmlReturn_t: a root other than / is read, and NVML only knows this machine


class ErrorOutcome(Struct):
    name: str
    status: Status
    action: Action
    blame: Blame
    meaning: str  # what an operator should read


def _row(name: str, status: Status, action: Action, blame: Blame, meaning: str) -> ErrorOutcome:
    return ErrorOutcome(name, status, action, blame, meaning)


_U, _F, _S = Status.UNKNOWN, Status.FAIL, Status.SKIP
_NODE, _CHECK = Blame.NODE, Blame.CHECK
ERROR_TABLE: Dict[int, ErrorOutcome] = {
    UNINITIALIZED: _row(
        "UNINITIALIZED", _U, Action.NONE, _CHECK, "NVML used before nvmlInit (a slurm-hooks bug)"
    ),
    INVALID_ARGUMENT: _row(
        "INVALID_ARGUMENT", _U, Action.NONE, _CHECK, "bad argument to NVML (a slurm-hooks bug)"
    ),
    NOT_SUPPORTED: _row(
        "NOT_SUPPORTED", _S, Action.NONE, _CHECK, "not supported on this GPU/driver"
    ),
    NO_PERMISSION: _row("NO_PERMISSION", _U, Action.NONE, _CHECK, "no permission: run as root"),
    ALREADY_INITIALIZED: _row(
        "ALREADY_INITIALIZED", _U, Action.NONE, _CHECK, "NVML initialised twice (obsolete)"
    ),
    NOT_FOUND: _row("NOT_FOUND", _U, Action.NONE, _CHECK, "the requested object was not found"),
    INSUFFICIENT_SIZE: _row(
        "INSUFFICIENT_SIZE", _U, Action.NONE, _CHECK, "buffer too small (a slurm-hooks bug)"
    ),
    INSUFFICIENT_POWER: _row(
        "INSUFFICIENT_POWER",
        _F,
        Action.DRAIN,
        _NODE,
        "GPU power cables not connected or power supply failing: check the chassis",
    ),
    DRIVER_NOT_LOADED: _row(
        "DRIVER_NOT_LOADED",
        _F,
        Action.REBOOT,
        _NODE,
        "NVIDIA kernel driver not loaded: modprobe nvidia / check dmesg, then reboot",
    ),
    TIMEOUT: _row("TIMEOUT", _U, Action.NONE, _CHECK, "NVML call timed out"),
    IRQ_ISSUE: _row(
        "IRQ_ISSUE", _F, Action.REBOOT, _NODE, "kernel reported an interrupt problem with a GPU"
    ),
    LIBRARY_NOT_FOUND: _row(
        "LIBRARY_NOT_FOUND",
        _F,
        Action.DRAIN,
        _NODE,
        "libnvidia-ml.so.1 not found: NVIDIA driver user space missing (reinstall the driver)",
    ),
    FUNCTION_NOT_FOUND: _row(
        "FUNCTION_NOT_FOUND",
        _U,
        Action.NONE,
        _CHECK,
        "this driver's NVML lacks the function (older driver)",
    ),
    CORRUPTED_INFOROM: _row(
        "CORRUPTED_INFOROM", _F, Action.RMA, _NODE, "GPU infoROM corrupted: RMA the board"
    ),
    GPU_IS_LOST: _row(
        "GPU_IS_LOST",
        _F,
        Action.REBOOT,
        _NODE,
        "GPU fell off the bus or is otherwise inaccessible: reboot; RMA if it recurs",
    ),
    RESET_REQUIRED: _row(
        "RESET_REQUIRED",
        _F,
        Action.RESET_GPU,
        _NODE,
        "GPU needs a reset (nvidia-smi -r -i N, or reboot)",
    ),
    OPERATING_SYSTEM: _row(
        "OPERATING_SYSTEM", _U, Action.NONE, _CHECK, "the OS blocked the NVML call"
    ),
    LIB_RM_VERSION_MISMATCH: _row(
        "LIB_RM_VERSION_MISMATCH",
        _F,
        Action.REBOOT,
        _NODE,
        "driver library and kernel module versions differ (upgrade without reboot)",
    ),
    IN_USE: _row(
        "IN_USE", _U, Action.NONE, _CHECK, "GPU busy: operation not possible while in use"
    ),
    MEMORY: _row("MEMORY", _U, Action.NONE, _CHECK, "host out of memory during the NVML call"),
    NO_DATA: _row("NO_DATA", _U, Action.NONE, _CHECK, "NVML has no data for this query yet"),
    VGPU_ECC_NOT_SUPPORTED: _row(
        "VGPU_ECC_NOT_SUPPORTED", _S, Action.NONE, _CHECK, "ECC not supported with vGPU"
    ),
    INSUFFICIENT_RESOURCES: _row(
        "INSUFFICIENT_RESOURCES", _U, Action.NONE, _CHECK, "NVML ran out of resources"
    ),
    FREQ_NOT_SUPPORTED: _row(
        "FREQ_NOT_SUPPORTED", _S, Action.NONE, _CHECK, "frequency not supported"
    ),
    ARGUMENT_VERSION_MISMATCH: _row(
        "ARGUMENT_VERSION_MISMATCH",
        _U,
        Action.NONE,
        _CHECK,
        "struct version not accepted by this driver (pynvml/driver mismatch)",
    ),
    DEPRECATED: _row(
        "DEPRECATED", _U, Action.NONE, _CHECK, "NVML function deprecated on this driver"
    ),
    NOT_READY: _row(
        "NOT_READY", _U, Action.NONE, _CHECK, "system not ready (e.g. fabric manager starting)"
    ),
    GPU_NOT_FOUND: _row(
        "GPU_NOT_FOUND", _F, Action.REBOOT, _NODE, "NVML found no GPU where one was expected"
    ),
    INVALID_STATE: _row(
        "INVALID_STATE", _U, Action.NONE, _CHECK, "resource in an unexpected state"
    ),
    RESET_TYPE_NOT_SUPPORTED: _row(
        "RESET_TYPE_NOT_SUPPORTED", _U, Action.NONE, _CHECK, "reset type not supported"
    ),
    UNKNOWN_ERROR: _row(
        "UNKNOWN", _U, Action.NONE, _CHECK, "NVML reported an unknown internal error"
    ),
}
_NOT_LIVE_OUTCOME = _row(
    "NOT_LIVE",
    _S,
    Action.NONE,
    _CHECK,
    "not read: NVML answers for the running machine, not for the tree under --root",
)


def outcome(code: int) -> ErrorOutcome:
    """The reviewed meaning of an NVML return code; codes we have never seen are UNKNOWN."""
    if code == NOT_LIVE:
        return _NOT_LIVE_OUTCOME
    return ERROR_TABLE.get(
        code,
        ErrorOutcome(
            "CODE_%d" % code,
            Status.UNKNOWN,
            Action.NONE,
            Blame.CHECK,
            "unrecognised NVML return code %d" % code,
        ),
    )


# Enum values from nvml.h that checks pass as arguments (ABI: they never change meaning).
MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED = 0, 1  # nvmlMemoryErrorType_t
VOLATILE_ECC, AGGREGATE_ECC = 0, 1  # nvmlEccCounterType_t
MEMORY_LOCATION_DRAM, MEMORY_LOCATION_SRAM = 2, 7  # nvmlMemoryLocation_t
CLOCK_GRAPHICS, CLOCK_MEM = 0, 2  # nvmlClockType_t
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
TEMPERATURE_THRESHOLD_SLOWDOWN = 1  # nvmlTemperatureThresholds_t
PAGE_RETIREMENT_SINGLE_BIT, PAGE_RETIREMENT_DOUBLE_BIT = 0, 1  # nvmlPageRetirementCause_t
FI_DEV_NVLINK_LINK_COUNT = 91  # nvmlDeviceGetFieldValues field ids
# Time (ns) the clocks were held down, per reason, since the driver loaded: nvmlDeviceGetFieldValues ids from
# nvml.h (nvidia-nvml-dev 13.5.37, the same numbers nvidia-ml-py 13.615 exposes). 74 and 76 are the
# NVML_FI_DEV_PERF_POLICY_POWER / _SYNC_BOOST counters (old: every driver with field values); 269-271 came with
# the clocks-event rename (R535): older drivers answer NOT_SUPPORTED for each of them.
FI_CLOCKS_EVENT_SW_POWER_CAP = (
    74  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = NVML_FI_DEV_PERF_POLICY_POWER
)
FI_CLOCKS_EVENT_SYNC_BOOST = (
    76  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST = NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
)
FI_CLOCKS_EVENT_SW_THERM_SLOWDOWN = 269  # NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
FI_CLOCKS_EVENT_HW_THERM_SLOWDOWN = 270  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
FI_CLOCKS_EVENT_HW_POWER_BRAKE_SLOWDOWN = (
    271  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
)
FI_DEV_GET_GPU_RECOVERY_ACTION = (
    230  # NVML >= 12.560 (R560); older drivers answer NOT_SUPPORTED per value
)
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS


class NvmlError(Exception):
    """An NVML call failed; `outcome` says what that means."""

    def __init__(self, code: int, function: str, message: str = ""):
        self.code = code
        self.function = function
        self.outcome = outcome(code)
        super().__init__(
            "%s: %s (NVML %d: %s)"
            % (function, self.outcome.meaning, code, message or self.outcome.name)
        )


class NvmlUnavailable(NvmlError):
    """NVML could not be initialised at all (no library, no driver, version mismatch)."""


# What an operator should do when nvmlInit fails, by return code: shown in gpu.count's summary.
INIT_ADVICE: Dict[int, str] = {
    LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 could not be loaded: the NVIDIA driver's user-space libraries are not "
    "installed (or not on the loader path); reinstall the driver package, or point "
    "[nvml] library at the file",
    DRIVER_NOT_LOADED: "the NVIDIA kernel module is not loaded: check `lsmod | grep nvidia` and `dmesg | grep NVRM`, "
    "then `modprobe nvidia` or reboot",
    LIB_RM_VERSION_MISMATCH: "libnvidia-ml.so.1 and the loaded kernel module are different driver versions (the "
    "driver was upgraded without a reboot; compare `cat /proc/driver/nvidia/version`): "
    "reboot the node",
    NO_PERMISSION: "no permission to open /dev/nvidia*: run slurm-hooks as root (slurmd's prolog does)",
}


def init_advice(code: int) -> str:
    return INIT_ADVICE.get(code, outcome(code).meaning)


def refuse_under_root(ctx) -> Optional["NvmlUnavailable"]:
    """NvmlUnavailable(NOT_LIVE) when the run reads a tree (--root, [general] root) and was not told to use
    this machine's NVML anyway ([general] root_live_sources = ["nvml"], `--live nvml`: the fake node)."""
    if ctx.host.is_live or "nvml" in ctx.config.get("general", "root_live_sources"):
        return None
    return NvmlUnavailable(
        NOT_LIVE,
        "nvmlInit",
        "reading the tree %s, not this machine: GPU checks need the live "
        "driver (pass --live nvml to use this machine's NVML)" % ctx.host.root,
    )


class Variant(Struct):
    """One way of asking NVML for a value: a pynvml wrapper, plus keyword arguments naming pynvml constants."""

    function: str
    constant_kwargs: Tuple[Tuple[str, str], ...] = ()  # (keyword, pynvml constant name)


# Families of functions whose name or struct version changed between driver generations, newest first.
# A variant answering FUNCTION_NOT_FOUND (symbol absent from an older libnvidia-ml) or
# ARGUMENT_VERSION_MISMATCH (struct version unknown to the driver) falls through to the next one.
VERSIONED: Dict[str, Tuple[Variant, ...]] = {
    # R535 renamed "throttle reasons" to "clocks event reasons"; the bits are the same.
    "clock_event_reasons": (
        Variant("nvmlDeviceGetCurrentClocksEventReasons"),
        Variant("nvmlDeviceGetCurrentClocksThrottleReasons"),
    ),
    # _v3 (R510+) carries GPU/compute instance ids; _v2 is the R470 layout.
    "compute_processes": (
        Variant("nvmlDeviceGetComputeRunningProcesses_v3"),
        Variant("nvmlDeviceGetComputeRunningProcesses_v2"),
    ),
    # v2 (R510+) reports `reserved` separately, so `used` is what processes hold.
    "memory_info": (
        Variant("nvmlDeviceGetMemoryInfo", (("version", "nvmlMemory_v2"),)),
        Variant("nvmlDeviceGetMemoryInfo"),
    ),
    "retired_pages": (
        Variant("nvmlDeviceGetRetiredPages_v2"),
        Variant("nvmlDeviceGetRetiredPages"),
    ),
    "temperature": (Variant("nvmlDeviceGetTemperatureV"), Variant("nvmlDeviceGetTemperature")),
}
_FALL_THROUGH = (FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH)
# nvmlValueType_t -> the nvmlValue_t member that holds it (nvml.h)
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


FIELD_VALUE_MEMBERS = _VALUE_MEMBERS  # for readers of raw nvmlDeviceGetFieldValues entries


def _field_entry(field_id: int, entry: Any) -> Any:
    """The nvmlFieldValue_t answered where `field_id` was asked, as a Python number, or the NvmlError
    that stands for that field: the entry's own nvmlReturn, a value type nvml.h does not define, or
    a fieldId other than the one asked (the driver echoes the id it answered in each entry; 580.159.04
    on an H200 echoes every asked id, in order). An entry that echoes another id, whether misplaced
    or foreign, says nothing about the field asked there and is never taken for it (UNKNOWN_ERROR:
    could not evaluate); records/nvlink_errors.py checks its own batch the same way."""
    name = "nvmlDeviceGetFieldValues(%d)" % field_id
    if entry.fieldId != field_id:
        return NvmlError(
            UNKNOWN_ERROR,
            name,
            "the driver answered with fieldId %d in the place of field %d"
            % (entry.fieldId, field_id),
        )
    if entry.nvmlReturn != 0:
        return NvmlError(entry.nvmlReturn, name)
    member = _VALUE_MEMBERS.get(entry.valueType)
    if member is None:
        return NvmlError(UNKNOWN_ERROR, name, "unknown value type %d" % entry.valueType)
    return getattr(entry.value, member)


class NvmlSession:
    """One NVML initialisation per process; `call` wraps every pynvml function."""

    def __init__(self, library: str = ""):
        self.library = library
        self._lock = threading.Lock()
        self._pynvml: Any = None
        self._init_error: Optional[NvmlUnavailable] = None
        self._missing_logged: set = set()

    @property
    def pynvml(self) -> Any:
        self.open()
        return self._pynvml

    def open(self) -> None:
        """Import pynvml and call nvmlInit once; raise NvmlUnavailable (cached) if that fails."""
        if self._pynvml is not None:  # set last, once nvmlInit returned: every call after the
            return  # first skips the lock (~900 calls per prolog on the 8-GPU example node)
        with self._lock:
            if self._pynvml is not None:
                return
            if self._init_error is not None:
                raise self._init_error
            try:
                from .pynvml_import import (
                    import_pynvml,
                )  # the node's nvidia-ml-py, else the RPM's bundled copy

                pynvml = import_pynvml()

                if self.library and pynvml.nvmlLib is None:
                    pynvml.nvmlLib = ctypes.CDLL(
                        self.library
                    )  # an explicit path wins over the loader
                pynvml.nvmlInit()
            except ImportError as exc:
                self._init_error = NvmlUnavailable(
                    LIBRARY_NOT_FOUND, "import pynvml", "nvidia-ml-py is not installed: %s" % exc
                )
                raise self._init_error from None
            except OSError as exc:  # only from our own CDLL(self.library)
                self._init_error = NvmlUnavailable(
                    LIBRARY_NOT_FOUND,
                    "nvmlInit",
                    "cannot load %s ([nvml] library): "
                    "%s; %s" % (self.library, exc, init_advice(LIBRARY_NOT_FOUND)),
                )
                raise self._init_error from None
            except Exception as exc:
                code = getattr(exc, "value", UNKNOWN_ERROR)
                self._init_error = NvmlUnavailable(
                    code, "nvmlInit", "%s; %s" % (exc, init_advice(code))
                )
                raise self._init_error from None
            self._pynvml = pynvml

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """Call pynvml.<function>(*args), turning NVMLError into NvmlError with the reviewed outcome."""
        # this run's memory, bound once: a call that hangs past the run (a check thread left
        # behind) stores its late answer there, never in a later run's nor into None
        shared = _shared
        if shared is not None and function in SHARED_WITHIN_RUN and not kwargs:
            key = (self.library, function) + tuple(_argument_key(a) for a in args)
            if key in shared:
                return shared[key]
            value = self._call(function, *args)
            shared[key] = value  # an answer only: an error is asked again by the next caller
            return value
        return self._call(function, *args, **kwargs)

    def _call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        lib = self.pynvml
        fn: Optional[Callable[..., Any]] = getattr(lib, function, None)
        if fn is None:
            self._log_missing(function)
            raise NvmlError(FUNCTION_NOT_FOUND, function, "pynvml has no such function")
        try:
            return fn(*args, **kwargs)
        except lib.NVMLError as exc:
            if exc.value == FUNCTION_NOT_FOUND:
                self._log_missing(function)
            raise NvmlError(exc.value, function, str(exc)) from None
        except getattr(
            lib, "NVMLLibraryMismatchError", ()
        ) as exc:  # an unversioned wrapper, symbol absent
            self._log_missing(function)
            raise NvmlError(FUNCTION_NOT_FOUND, function, str(exc)) from None

    def call_versioned(self, key: str, *args: Any) -> Any:
        """Call the newest variant of a VERSIONED family this driver answers."""
        last: Optional[NvmlError] = None
        for variant in VERSIONED[key]:
            kwargs = {
                name: getattr(self.pynvml, constant)
                for name, constant in variant.constant_kwargs
                if hasattr(self.pynvml, constant)
            }
            if len(kwargs) != len(
                variant.constant_kwargs
            ):  # this pynvml predates the struct version
                continue
            try:
                return self.call(variant.function, *args, **kwargs)
            except NvmlError as exc:
                if exc.code not in _FALL_THROUGH:
                    raise
                last = exc
        raise (
            last if last is not None else NvmlError(FUNCTION_NOT_FOUND, key, "no variant available")
        )

    def field_value(self, handle: Any, field_id: int) -> Any:
        """One nvmlDeviceGetFieldValues entry as a Python number; its own nvmlReturn, or an entry for
        another field than the one asked (_field_entry), becomes NvmlError."""
        values = self.call("nvmlDeviceGetFieldValues", handle, [field_id])
        value = _field_entry(field_id, values[0])
        if isinstance(value, NvmlError):
            raise value
        return value

    def field_values(self, handle: Any, field_ids: Sequence[int]) -> Dict[int, Any]:
        """Several nvmlDeviceGetFieldValues entries in one call: {field id: number, or NvmlError for an entry
        the driver refused (NOT_SUPPORTED on a driver that predates the field) or answered for another
        field (_field_entry)}. The call itself failing (FUNCTION_NOT_FOUND before R361, GPU_IS_LOST)
        raises NvmlError."""
        values = self.call("nvmlDeviceGetFieldValues", handle, list(field_ids))
        return {
            field_id: _field_entry(field_id, entry) for field_id, entry in zip(field_ids, values)
        }

    def fabric_info(self, handle: Any) -> Tuple[int, int, int]:
        """(state, status, health_mask) of the GPU's NVLink fabric registration (R550+, NVSwitch systems).

        nvmlDeviceGetGpuFabricInfoV with a v3 struct, then v2, then the original call (no health mask).
        """
        lib = self.pynvml
        for struct, version in (
            ("c_nvmlGpuFabricInfo_v3_t", "nvmlGpuFabricInfo_v3"),
            ("c_nvmlGpuFabricInfo_v2_t", "nvmlGpuFabricInfo_v2"),
        ):
            if not hasattr(lib, struct) or not hasattr(lib, version):
                continue
            info = getattr(lib, struct)()
            info.version = getattr(lib, version)
            try:
                self.call("nvmlDeviceGetGpuFabricInfoV", handle, ctypes.byref(info))
                return int(info.state), int(info.status), int(info.healthMask)
            except NvmlError as exc:
                if exc.code not in _FALL_THROUGH:
                    raise
        info = lib.c_nvmlGpuFabricInfo_t()
        self.call("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
        return int(info.state), int(info.status), 0

    def _log_missing(self, function: str) -> None:
        if function not in self._missing_logged:
            self._missing_logged.add(function)
            import logging  # only here: the prolog's process imports it after forking its checks

            logging.getLogger(__name__).warning(
                "NVML function %s is not available on this driver; checks using it report UNKNOWN",
                function,
            )


# Queries whose answer one hook run may share between its checks and its counter snapshot (the check
# process asks each twice or three times per GPU, from different threads): what identifies a GPU
# (fixed while the driver is loaded) and whether a link is up, read by the NVLink check and by the
# snapshot milliseconds apart, now one reading for both. Shared only while the hook's check
# process runs its checks and snapshot (share_within_run), never from one run to the next.
SHARED_WITHIN_RUN = frozenset(
    {
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetPersistenceMode",  # an admin's setting (nvidia-smi -pm), read by two checks
    }
)
_shared: Optional[Dict[Tuple[Any, ...], Any]] = None


class share_within_run:  # noqa: N801  (used as a function: `with nvml.share_within_run():`)
    """While this context lasts, SHARED_WITHIN_RUN queries this process has already made are answered
    from memory (the hook's check process, around its run: hooks/bounded.py). The memory goes with
    the context, so nothing is shared with a later run, even one in the same process."""

    def __enter__(self) -> None:
        global _shared
        self.previous, _shared = _shared, {}

    def __exit__(self, *_exc: Any) -> None:
        global _shared
        _shared = self.previous


def _argument_key(value: Any) -> Any:
    """A device handle by the address it points at (each nvmlDeviceGetHandleByIndex makes a new
    ctypes object for the same device); anything else as it is."""
    if isinstance(value, ctypes._Pointer):
        return bytes(value)  # the pointer's own bytes: its address, ~1 µs cheaper than a cast
    return value


_sessions: Dict[str, NvmlSession] = {}
_sessions_lock = threading.Lock()


def slurm_to_nvml(minors: Mapping[int, int]) -> Tuple[Dict[int, int], str]:
    """Slurm's GPU index -> NVML index, and how they were matched: "minor" or "index".

    `minors`: NVML index -> nvmlDeviceGetMinorNumber (-1 when unknown). Slurm's GPU indices
    (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES in the job) count gres.conf's /dev/nvidiaN files, i.e.
    minor numbers (`nvidia-smi -q | grep Minor`), which need not follow NVML's PCI-order indices.
    They are matched by minor number when every GPU has a distinct known one, else by index.
    The one place this rule lives: the checks' GPU selection and the records' snapshots use it.
    """
    values = list(minors.values())
    if values and min(values) >= 0 and len(set(values)) == len(values):
        return {minor: index for index, minor in minors.items()}, "minor"
    return {index: index for index in minors}, "index"


def session(library: str = "") -> NvmlSession:
    """The process-wide NVML session (per library path)."""
    with _sessions_lock:
        if library not in _sessions:
            _sessions[library] = NvmlSession(library)
        return _sessions[library]


def reset_sessions() -> None:
    """Forget every session (tests: the next use re-imports state and calls nvmlInit again)."""
    with _sessions_lock:
        _sessions.clear()
