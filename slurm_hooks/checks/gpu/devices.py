"""The GPUs NVML lists, each identified on a thread of its own within one bound ([nvml] identify_timeout).

NVML calls (through slurm_hooks.hw.nvml): nvmlDeviceGetHandleByIndex, nvmlDeviceGetPciInfo,
nvmlDeviceGetMinorNumber, nvmlDeviceGetName, nvmlDeviceGetUUID (`nvidia-smi -L`,
`nvidia-smi -q | grep -e Minor -e Bus`), then nvmlDeviceGetPersistenceMode (`nvidia-smi -q | grep
Persistence`), which checks/gpu/wedged.py needs to tell a slow GPU from a hung one.
"""

from __future__ import annotations

import threading
import time

from ...core.structs import Struct
from ...hw import nvml
from ..pci import normalize_bus_id

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

MAX_IDENTIFIED = 64  # more than any node has (NVML counts per node); a driver saying 4 billion gets no thread each


class GpuDevice(Struct):
    index: int  # NVML index
    name: str
    uuid: str
    bus_id: str  # sysfs form, 0000:18:00.0
    minor: int = -1  # /dev/nvidia<minor>; -1 when NVML could not tell

    @property
    def component(self) -> str:
        return "gpu:%d %s" % (self.index, self.bus_id)


class HungGpu(Struct):
    """A GPU whose identification did not return within [nvml] identify_timeout."""

    index: int  # NVML index
    call: str  # the NVML function that did not return
    minor: int = -1  # /dev/nvidia<minor> when NVML said it before hanging
    waited: float = 0.0


def identify_all(
    session: nvml.NvmlSession,
    count: int,
    budget: float,
    pending: Optional[Dict[int, threading.Thread]] = None,
) -> List[Tuple[Optional[GpuDevice], Any, Optional[nvml.NvmlError], Dict[str, Any]]]:
    """(device, handle, None, partial) per NVML index, or (None, None, error, partial) for a GPU that failed
    or did not answer within `budget` (error NvmlError(TIMEOUT)); `partial` holds what it said before.

    Each GPU is identified on a thread of its own, all at once, and waited for until `budget` has
    passed: a GPU whose driver calls hang costs `budget` once, however many GPUs hang, and the others
    are judged (a shared worker would start the GPUs after a hung one late, and could run out of time
    before asking them). A GPU whose thread never made its first call is reported as not asked
    (`partial` has no "calling"), not as hung. The abandoned thread stays blocked in the C call - it
    cannot be interrupted - and dies with the process: the hooks run the checks in a forked child
    (core/isolation.run_isolated) that exits when the checks are done. `pending` receives the
    threads of the GPUs that did not answer in time (wedged.py waits a little longer on them).
    """
    tables: List[Dict[str, Any]] = [{} for _ in range(min(count, MAX_IDENTIFIED))]
    answers: Dict[int, Any] = {}

    def identify(index: int) -> None:
        table = tables[index]

        def call(function: str, *args: Any) -> Any:
            table["calling"] = function  # what a hang is reported as
            return session.call(function, *args)

        try:
            handle = call("nvmlDeviceGetHandleByIndex", index)
            table["bus_id"] = normalize_bus_id(
                nvml_text(call("nvmlDeviceGetPciInfo", handle).busId)
            )
            table["minor"] = _minor(call, handle)
            name = nvml_text(call("nvmlDeviceGetName", handle))
            uuid = nvml_text(call("nvmlDeviceGetUUID", handle))
            answers[index] = (GpuDevice(index, name, uuid, table["bus_id"], table["minor"]), handle)
            # read after the answer: a hang here costs nothing. wedged.py needs it: without persistence
            # an idle GPU is initialised by nvmlDeviceGetHandleByIndex (nvml.h) and may take seconds
            table["persistence"] = _persistence(call, handle)
        except (
            Exception
        ) as exc:  # NvmlError: that GPU's answer; anything else: our bug, raised below
            answers[index] = exc

    end = time.monotonic() + budget
    threads = []
    for index in range(min(count, MAX_IDENTIFIED)):
        thread = threading.Thread(
            target=identify, args=(index,), name="check:gpu-id-%d" % index, daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # no thread left (a pids limit): that GPU is not asked, not hung
            continue
        threads.append((index, thread))
    for _, thread in threads:
        thread.join(max(end - time.monotonic(), 0.0))
    if pending is not None:
        pending.update((i, t) for i, t in threads if t.is_alive() and i not in answers)
    out = []
    for index in range(
        min(count, MAX_IDENTIFIED + 1)
    ):  # one error stands for every GPU past the cap
        partial = (
            dict(tables[index]) if index < MAX_IDENTIFIED else {}
        )  # a copy: a hung thread may still write into its table later
        value = answers.get(index)
        if isinstance(value, nvml.NvmlError):
            out.append((None, None, value, partial))
        elif isinstance(value, Exception):
            raise value  # our bug: every GPU check reports it (runner: internal error)
        elif value is not None:
            out.append((value[0], value[1], None, partial))
        elif index >= MAX_IDENTIFIED:
            out.append(
                (
                    None,
                    None,
                    nvml.NvmlError(
                        nvml.UNKNOWN_ERROR,
                        "nvmlDeviceGetCount",
                        "NVML counts %d GPUs; only the first %d are identified, GPUs %d-%d are not"
                        % (count, MAX_IDENTIFIED, MAX_IDENTIFIED, count - 1),
                    ),
                    partial,
                )
            )
        else:
            asked = "calling" in partial
            error = nvml.NvmlError(
                nvml.TIMEOUT,
                partial.get("calling", "identification"),
                "GPU %d %s within %.3gs"
                % (index, "did not answer" if asked else "was not asked (no thread ran)", budget),
            )
            error.waited = budget
            out.append((None, None, error, partial))
    return out


def _persistence(call: Callable[..., Any], handle: Any) -> int:
    try:
        return int(call("nvmlDeviceGetPersistenceMode", handle))
    except nvml.NvmlError:  # not known: wedged.persistent() then counts no hang
        return -1


def _minor(call: Callable[..., Any], handle: Any) -> int:
    try:
        return int(call("nvmlDeviceGetMinorNumber", handle))
    except nvml.NvmlError:  # NOT_SUPPORTED on some platforms: selection falls back to NVML indices
        return -1


def nvml_text(value: Any) -> str:
    """pynvml returns str for names and bus ids (nvidia-ml-py >= 11.515); older releases gave bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
