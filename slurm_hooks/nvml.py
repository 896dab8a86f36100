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
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from .result import Action, Blame, Status

log = logging.getLogger(__name__)

# NVML return codes (nvml.h nvmlReturn_t; the same numbers pynvml exposes as NVML_ERROR_*).
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 1, 2, 3, 4
ALREADY_INITIALIZED, NOT_FOUND, INSUFFICIENT_SIZE, INSUFFICIENT_POWER = 5, 6, 7, 8
DRIVER_NOT_LOADED, TIMEOUT, IRQ_ISSUE, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND = 9, 10, 11, 12, 13
CORRUPTED_INFOROM, GPU_IS_LOST, RESET_REQUIRED, OPERATING_SYSTEM = 14, 15, 16, 17
LIB_RM_VERSION_MISMATCH, IN_USE, MEMORY, NO_DATA, VGPU_ECC_NOT_SUPPORTED = 18, 19, 20, 21, 22
INSUFFICIENT_RESOURCES, FREQ_NOT_SUPPORTED, ARGUMENT_VERSION_MISMATCH, DEPRECATED = 23, 24, 25, 26
NOT_READY, GPU_NOT_FOUND, INVALID_STATE, RESET_TYPE_NOT_SUPPORTED, UNKNOWN_ERROR = 27, 28, 29, 30, 999


@dataclass(frozen=True)
class ErrorOutcome:
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
    UNINITIALIZED: _row("UNINITIALIZED", _U, Action.NONE, _CHECK, "NVML used before nvmlInit (a slurm-hooks bug)"),
    INVALID_ARGUMENT: _row("INVALID_ARGUMENT", _U, Action.NONE, _CHECK, "bad argument to NVML (a slurm-hooks bug)"),
    NOT_SUPPORTED: _row("NOT_SUPPORTED", _S, Action.NONE, _CHECK, "not supported on this GPU/driver"),
    NO_PERMISSION: _row("NO_PERMISSION", _U, Action.NONE, _CHECK, "no permission: run as root"),
    ALREADY_INITIALIZED: _row("ALREADY_INITIALIZED", _U, Action.NONE, _CHECK, "NVML initialised twice (obsolete)"),
    NOT_FOUND: _row("NOT_FOUND", _U, Action.NONE, _CHECK, "the requested object was not found"),
    INSUFFICIENT_SIZE: _row("INSUFFICIENT_SIZE", _U, Action.NONE, _CHECK, "buffer too small (a slurm-hooks bug)"),
    INSUFFICIENT_POWER: _row("INSUFFICIENT_POWER", _F, Action.DRAIN, _NODE,
                             "GPU power cables not connected or power supply failing: check the chassis"),
    DRIVER_NOT_LOADED: _row("DRIVER_NOT_LOADED", _F, Action.REBOOT, _NODE,
                            "NVIDIA kernel driver not loaded: modprobe nvidia / check dmesg, then reboot"),
    TIMEOUT: _row("TIMEOUT", _U, Action.NONE, _CHECK, "NVML call timed out"),
    IRQ_ISSUE: _row("IRQ_ISSUE", _F, Action.REBOOT, _NODE, "kernel reported an interrupt problem with a GPU"),
    LIBRARY_NOT_FOUND: _row("LIBRARY_NOT_FOUND", _F, Action.REBOOT, _NODE,
                            "libnvidia-ml.so.1 not found: NVIDIA driver user space missing"),
    FUNCTION_NOT_FOUND: _row("FUNCTION_NOT_FOUND", _U, Action.NONE, _CHECK,
                             "this driver's NVML lacks the function (older driver)"),
    CORRUPTED_INFOROM: _row("CORRUPTED_INFOROM", _F, Action.RMA, _NODE, "GPU infoROM corrupted: RMA the board"),
    GPU_IS_LOST: _row("GPU_IS_LOST", _F, Action.REBOOT, _NODE,
                      "GPU fell off the bus or is otherwise inaccessible: reboot; RMA if it recurs"),
    RESET_REQUIRED: _row("RESET_REQUIRED", _F, Action.RESET_GPU, _NODE,
                         "GPU needs a reset (nvidia-smi -r -i N, or reboot)"),
    OPERATING_SYSTEM: _row("OPERATING_SYSTEM", _U, Action.NONE, _CHECK, "the OS blocked the NVML call"),
    LIB_RM_VERSION_MISMATCH: _row("LIB_RM_VERSION_MISMATCH", _F, Action.REBOOT, _NODE,
                                  "driver library and kernel module versions differ (upgrade without reboot)"),
    IN_USE: _row("IN_USE", _U, Action.NONE, _CHECK, "GPU busy: operation not possible while in use"),
    MEMORY: _row("MEMORY", _U, Action.NONE, _CHECK, "host out of memory during the NVML call"),
    NO_DATA: _row("NO_DATA", _U, Action.NONE, _CHECK, "NVML has no data for this query yet"),
    VGPU_ECC_NOT_SUPPORTED: _row("VGPU_ECC_NOT_SUPPORTED", _S, Action.NONE, _CHECK, "ECC not supported with vGPU"),
    INSUFFICIENT_RESOURCES: _row("INSUFFICIENT_RESOURCES", _U, Action.NONE, _CHECK, "NVML ran out of resources"),
    FREQ_NOT_SUPPORTED: _row("FREQ_NOT_SUPPORTED", _S, Action.NONE, _CHECK, "frequency not supported"),
    ARGUMENT_VERSION_MISMATCH: _row("ARGUMENT_VERSION_MISMATCH", _U, Action.NONE, _CHECK,
                                    "struct version not accepted by this driver (pynvml/driver mismatch)"),
    DEPRECATED: _row("DEPRECATED", _U, Action.NONE, _CHECK, "NVML function deprecated on this driver"),
    NOT_READY: _row("NOT_READY", _U, Action.NONE, _CHECK, "system not ready (e.g. fabric manager starting)"),
    GPU_NOT_FOUND: _row("GPU_NOT_FOUND", _F, Action.REBOOT, _NODE, "NVML found no GPU where one was expected"),
    INVALID_STATE: _row("INVALID_STATE", _U, Action.NONE, _CHECK, "resource in an unexpected state"),
    RESET_TYPE_NOT_SUPPORTED: _row("RESET_TYPE_NOT_SUPPORTED", _U, Action.NONE, _CHECK, "reset type not supported"),
    UNKNOWN_ERROR: _row("UNKNOWN", _U, Action.NONE, _CHECK, "NVML reported an unknown internal error"),
}


def outcome(code: int) -> ErrorOutcome:
    """The reviewed meaning of an NVML return code; codes we have never seen are UNKNOWN."""
    return ERROR_TABLE.get(code, ErrorOutcome("CODE_%d" % code, Status.UNKNOWN, Action.NONE, Blame.CHECK,
                                              "unrecognised NVML return code %d" % code))


class NvmlError(Exception):
    """An NVML call failed; `outcome` says what that means."""

    def __init__(self, code: int, function: str, message: str = ""):
        self.code = code
        self.function = function
        self.outcome = outcome(code)
        super().__init__("%s: %s (NVML %d: %s)" % (function, self.outcome.meaning, code, message or self.outcome.name))


class NvmlUnavailable(NvmlError):
    """NVML could not be initialised at all (no library, no driver, version mismatch)."""


# Functions whose name changed between driver generations: newest first.
VERSIONED: Dict[str, Tuple[str, ...]] = {
    "clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    "memory_info": ("nvmlDeviceGetMemoryInfo",),
    "compute_processes": ("nvmlDeviceGetComputeRunningProcesses",),
}


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
        with self._lock:
            if self._pynvml is not None:
                return
            if self._init_error is not None:
                raise self._init_error
            try:
                import pynvml

                if self.library and pynvml.nvmlLib is None:
                    pynvml.nvmlLib = ctypes.CDLL(self.library)  # an explicit path wins over the loader
                pynvml.nvmlInit()
            except ImportError as exc:
                self._init_error = NvmlUnavailable(LIBRARY_NOT_FOUND, "import pynvml",
                                                   "nvidia-ml-py is not installed: %s" % exc)
                raise self._init_error from None
            except OSError as exc:
                self._init_error = NvmlUnavailable(LIBRARY_NOT_FOUND, "nvmlInit", str(exc))
                raise self._init_error from None
            except Exception as exc:
                code = getattr(exc, "value", UNKNOWN_ERROR)
                self._init_error = NvmlUnavailable(code, "nvmlInit", str(exc))
                raise self._init_error from None
            self._pynvml = pynvml

    def call(self, function: str, *args: Any) -> Any:
        """Call pynvml.<function>(*args), turning NVMLError into NvmlError with the reviewed outcome."""
        lib = self.pynvml
        fn: Optional[Callable[..., Any]] = getattr(lib, function, None)
        if fn is None:
            self._log_missing(function)
            raise NvmlError(FUNCTION_NOT_FOUND, function, "pynvml has no such function")
        try:
            return fn(*args)
        except lib.NVMLError as exc:
            if exc.value == FUNCTION_NOT_FOUND:
                self._log_missing(function)
            raise NvmlError(exc.value, function, str(exc)) from None

    def call_versioned(self, key: str, *args: Any) -> Any:
        """Call the newest available function of a VERSIONED family."""
        last: Optional[NvmlError] = None
        for function in VERSIONED[key]:
            try:
                return self.call(function, *args)
            except NvmlError as exc:
                if exc.code != FUNCTION_NOT_FOUND:
                    raise
                last = exc
        assert last is not None
        raise last

    def _log_missing(self, function: str) -> None:
        if function not in self._missing_logged:
            self._missing_logged.add(function)
            log.warning("NVML function %s is not available on this driver; checks using it report UNKNOWN",
                        function)


_sessions: Dict[str, NvmlSession] = {}
_sessions_lock = threading.Lock()


def session(library: str = "") -> NvmlSession:
    """The process-wide NVML session (per library path)."""
    with _sessions_lock:
        if library not in _sessions:
            _sessions[library] = NvmlSession(library)
        return _sessions[library]
