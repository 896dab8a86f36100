"""GPUs whose NVML identification hangs: what it means, and the node's memory of it.

A GPU whose driver calls hang while its siblings answer is the classic sign of a GPU that is
wedged or off the bus; one such run may still be a stall that passes. The rule (docs/gpu.md,
"A GPU that hangs"):

- a GPU that answers within 0.75 x [nvml] identify_timeout more (only gpu.count waits for it) is
  slow, not hung: UNKNOWN (blame check), and its entry is cleared;
- more than half of the node's GPUs hung (every GPU, on a one-GPU node): the driver as a whole is
  stuck; that is no evidence against any one GPU -> UNKNOWN (blame check), and the memory is left
  as it was;
- persistence mode not on (no answering GPU says it is): an idle GPU is initialised by the first
  NVML call and may be slow, not hung -> UNKNOWN with that advice, nothing remembered;
- otherwise a hung GPU is UNKNOWN the first time (an alert; [drain] on_timeout = "drain" drains, as
  for any hang) and FAIL with action reboot, blame node, when it hung in `hung_runs` (2)
  consecutive runs of this node; a run in which it answers clears it.

The memory is <[paths] state_dir>/gpu-hangs.json, one entry per hung GPU (at most 64), written
atomically (core/atomicio) under a bounded lock; the file work runs in a thread abandoned after
HISTORY_WAIT_S (the state directory may hang). Without a readable memory a hang counts as a first
one: never a FAIL without the earlier run on record. A run counts as the next one only when it
began after the previous observation was recorded, so two prologs that saw the same hang at the
same moment are one observation, not two.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

from ...core import atomicio, locks
from ...core.structs import Struct, field
from ...hw import nvml
from ...registry import gatherer
from ...result import Action, Blame, Result, Status

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

HISTORY_FILE = "gpu-hangs.json"
SCHEMA = "slurm-hooks.gpu-hangs/1"
HISTORY_WAIT_S = 0.5  # the state directory may hang: a hang then counts as a first one
CONFIRM_FACTOR = (
    0.75  # a GPU is hung when it has not answered within 1.75 x [nvml] identify_timeout
)
COUNT_WAIT_S = 2.0  # identification plus the extra wait, at most (gpu.count's timeout is 3 s)
CLEAR_WAIT_S = 0.05  # nothing hung: how long a healthy run waits for its clearing to be written
LOCK_WAIT_S = 0.3  # concurrent prologs of one node take turns; they hold it for milliseconds
MAX_ENTRIES = 64  # NVML's own limit on GPUs per node is lower; a bigger file is not ours
MAX_BYTES = 64 << 10
CLOCK_SLACK_S = 60.0  # an entry seen further in the future than this is not believed


class HangHistory(Struct):
    """What the node remembers of hung GPUs, this run counted: NVML index -> consecutive hung runs."""

    runs: Mapping[int, int] = field(default_factory=dict)
    driver_wide: bool = False  # most GPUs hung: nothing was counted against any one of them
    persistence_off: bool = False  # no answering GPU said persistence mode is on: nothing counted
    note: str = ""  # why the memory could not be used (then every hang counts as a first one)
    slow: Tuple[int, ...] = ()  # answered only in the extra wait: slow, not hung, not counted
    waited_more: float = 0.0  # seconds of that extra wait


def unanswered_indices(inventory: Any, slow: Iterable[int] = ()) -> set:
    """GPUs whose identification did not end in time (hung, or rarely never asked), less the `slow`."""
    late = set(slow)
    return {
        index
        for index, error in inventory.device_errors
        if error.code == nvml.TIMEOUT and index not in late
    }


def answered_late(inventory: Any, wait: float) -> Tuple[int, ...]:
    """The hung GPUs whose identification thread ended within `wait` more seconds: slow, not hung (a
    busy driver). A wedged GPU does not answer in minutes; only this check waits for it."""
    end = time.monotonic() + wait
    for thread in inventory.pending.values():
        thread.join(max(end - time.monotonic(), 0.0))
    return tuple(
        h.index
        for h in inventory.hung
        if h.index in inventory.pending and not inventory.pending[h.index].is_alive()
    )


def persistent(inventory: Any) -> bool:
    """Every answering GPU that said so has persistence mode on (nvmlDeviceGetPersistenceMode), and
    one at least said so. Without it an idle GPU is initialised by nvmlDeviceGetHandleByIndex (nvml.h:
    "this API causes NVML to initialize the target GPU"), which may take seconds: slow, not hung."""
    modes = list(inventory.persistence.values())
    return bool(modes) and all(mode == 1 for mode in modes)


def driver_wide(hung: int, count: int) -> bool:
    """More than half of the GPUs hung (all of a one-GPU node): the driver, not one GPU."""
    return hung > 0 and 2 * hung > count


def update_history(
    old: Any,
    hung: Mapping[int, str],
    answered: Iterable[int],
    count: int,
    started: float,
    now: float,
    calls: Optional[Mapping[int, str]] = None,
) -> Tuple[Dict[str, Any], Dict[int, int], str]:
    """(new file content, {index: consecutive hung runs}, note) after a run that saw `hung`.

    `hung`: NVML index -> bus id ("" unknown) of the GPUs that did not answer; `answered`: the GPUs
    that did (identified, or an NVML error: an answer too), whose entries are cleared. Entries of
    GPUs in neither (not asked this run) are kept as they are. `started`/`now`: when this run's
    identification began and ended (wall clock). An entry counts as an earlier run only when it was
    recorded before `started` (not by a run overlapping this one), for the same GPU count and bus
    id, and not in the future.
    """
    note = ""
    entries: Dict[str, Any] = {}
    if isinstance(old, dict) and old.get("schema") == SCHEMA and isinstance(old.get("gpus"), dict):
        entries = old["gpus"]
    elif old not in (None, {}):
        note = "%s was not ours (schema %r): started again" % (
            HISTORY_FILE,
            old.get("schema") if isinstance(old, dict) else type(old).__name__,
        )
    runs: Dict[int, int] = {}
    kept: Dict[str, Any] = {}
    for index, bus_id in sorted(hung.items())[:MAX_ENTRIES]:
        entry = entries.get(str(index))
        previous = _earlier_runs(entry, count, bus_id, now)
        if previous and entry["seen"] > started:  # a run overlapping ours recorded this hang
            runs[index] = previous
            first = entry["first"]
        else:
            runs[index] = previous + 1
            first = entry["first"] if previous else now
        kept[str(index)] = {
            "runs": runs[index],
            "first": first,
            "seen": now,
            "count": count,
            "bus_id": (bus_id or entry.get("bus_id") or "") if previous else bus_id,
            "call": (calls or {}).get(index, ""),
        }
    answered = set(answered)
    for key, entry in entries.items():
        if len(kept) >= MAX_ENTRIES:
            break
        if key not in kept and key.isdigit() and int(key) not in answered:
            if _earlier_runs(entry, count, "", now):  # still believable: kept
                kept[key] = entry
    return {"schema": SCHEMA, "gpus": kept}, runs, note


def _earlier_runs(entry: Any, count: int, bus_id: str, now: float) -> int:
    """The consecutive hung runs an entry vouches for, 0 when it cannot be believed."""
    if not isinstance(entry, dict):
        return 0
    runs, seen, first = entry.get("runs"), entry.get("seen"), entry.get("first")
    if not (
        isinstance(runs, int)
        and not isinstance(runs, bool)
        and 1 <= runs <= 1_000_000
        and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
            for t in (seen, first)
        )
        and first <= seen <= now + CLOCK_SLACK_S
        and entry.get("count") == count
        and isinstance(entry.get("bus_id", ""), str)
    ):
        return 0
    known = entry.get("bus_id") or ""
    if known and bus_id and known != bus_id:  # another GPU sits at this index now
        return 0
    return runs


def hung_results(
    inventory: Any, hangs: HangHistory, error_bus: Mapping[int, str], hung_runs: int
) -> List[Result]:
    """gpu.count's results for the GPUs whose identification hung (inventory.hung), by the module's rule."""
    if not inventory.hung:
        return []
    waited = max(h.waited for h in inventory.hung) + hangs.waited_more
    still = [h for h in inventory.hung if h.index not in hangs.slow]
    answered = inventory.count - len(unanswered_indices(inventory, hangs.slow))
    details: Dict[str, Any] = {
        "timed_out": True,
        "hung": [h.index for h in still],
        "slow": list(hangs.slow),
        "calls": {str(h.index): h.call for h in inventory.hung},
        "waited_s": waited,
        "answered": answered,
        "persistence": {str(i): mode for i, mode in sorted(inventory.persistence.items())},
    }
    out = [
        Result(
            "gpu.count",
            Status.UNKNOWN,
            "%s on GPU %d answered only after more than %gs: a slow driver, not a hung GPU (not "
            "counted); this GPU's other checks were not run this time"
            % (h.call, h.index, h.waited),
            component=_component(h.index, error_bus),
            blame=Blame.CHECK,
            details=dict(details, call=h.call),
        )
        for h in inventory.hung
        if h.index in hangs.slow
    ]
    if still and hangs.driver_wide:
        return out + [
            Result(
                "gpu.count",
                Status.UNKNOWN,
                "NVML identification hung on %d of %d GPUs (%gs): the driver as a whole is stuck, "
                "which is no evidence against one GPU (check `dmesg | grep NVRM`, nvidia-smi)"
                % (len(still), inventory.count, waited),
                component="gpu:" + ",".join(str(h.index) for h in still),
                blame=Blame.CHECK,
                details=details,
            )
        ]
    for gpu in still:
        runs = hangs.runs.get(gpu.index, 1)
        component = _component(gpu.index, error_bus)
        mine = dict(details, runs=runs, hung_runs=hung_runs, call=gpu.call)
        if hangs.note:
            mine["memory"] = hangs.note
        said = "%s on GPU %d did not return within %gs while %d other GPU%s answered" % (
            gpu.call,
            gpu.index,
            gpu.waited + hangs.waited_more,
            answered,
            "" if answered == 1 else "s",
        )
        if hangs.persistence_off:
            summary = (
                "%s; persistence mode is not on here, so an idle GPU is initialised by the first NVML "
                "call and may take seconds: a hang cannot be told from that (enable it: "
                "nvidia-smi -pm 1, or run nvidia-persistenced); not counted" % said
            )
            out.append(
                Result(
                    "gpu.count",
                    Status.UNKNOWN,
                    summary,
                    component=component,
                    details=mine,
                    blame=Blame.NODE,
                )
            )
        elif hung_runs and runs >= hung_runs:
            mine.pop("timed_out")  # judged on the evidence of several runs, not one timeout
            summary = (
                "%s, in %d consecutive runs: the GPU is wedged or off the bus (reboot; RMA if it "
                "recurs)" % (said, runs)
            )
            out.append(
                Result(
                    "gpu.count",
                    Status.FAIL,
                    summary,
                    component=component,
                    details=mine,
                    action=Action.REBOOT,
                    blame=Blame.NODE,
                )
            )
        else:
            summary = "%s (consecutive hung runs: %d; it fails at %s)" % (
                said,
                runs,
                hung_runs or "never",
            )
            out.append(
                Result(
                    "gpu.count",
                    Status.UNKNOWN,
                    summary,
                    component=component,
                    details=mine,
                    blame=Blame.NODE,
                )
            )
    return out


def _component(index: int, error_bus: Mapping[int, str]) -> str:
    bus_id = error_bus.get(index)
    return "gpu:%d %s" % (index, bus_id) if bus_id else "gpu:%d" % index


@gatherer("gpu.hangs")
def read_hang_history(ctx) -> HangHistory:
    """<[paths] state_dir>/gpu-hangs.json, updated with this run's hung GPUs (gpu.inventory)."""
    inventory = ctx.get("gpu.inventory")
    if inventory.error is not None:
        return HangHistory()
    identify = ctx.config.get("nvml", "identify_timeout")
    # gpu.count's 3 s hold identification, this wait and the memory's HISTORY_WAIT_S, with room left
    more = max(min(CONFIRM_FACTOR * identify, COUNT_WAIT_S - identify), 0.0)
    slow = answered_late(inventory, more)
    hung = {
        h.index: inventory.error_bus_ids.get(h.index, "")
        for h in inventory.hung
        if h.index not in slow
    }
    unanswered = unanswered_indices(inventory, slow)
    if driver_wide(len(unanswered), inventory.count):
        return HangHistory(driver_wide=True, slow=slow, waited_more=more)
    answered = [i for i in range(min(inventory.count, MAX_ENTRIES)) if i not in unanswered]
    if hung and not persistent(inventory):
        return HangHistory(persistence_off=True, slow=slow, waited_more=more)
    path = os.path.join(ctx.config.get("paths", "state_dir"), HISTORY_FILE)
    calls = {h.index: h.call for h in inventory.hung}
    box: List[Any] = []

    def work() -> None:
        try:
            box.append(
                _remember(
                    path,
                    hung,
                    answered,
                    inventory.count,
                    inventory.identify_started,
                    time.time(),
                    calls,
                )
            )
        except (OSError, ValueError) as exc:
            box.append(exc)

    worker = threading.Thread(target=work, name="check:gpu.hangs", daemon=True)
    worker.start()
    # nothing hung: only an old entry to clear, which nobody waits for long (a hung state directory
    # must not cost every healthy run HISTORY_WAIT_S); the thread finishes on its own, or dies with
    # the check process (an atomic write: the old file or the new one)
    worker.join(HISTORY_WAIT_S if hung else CLEAR_WAIT_S)
    if not hung:
        return HangHistory(slow=slow, waited_more=more)
    if not box:
        why = "%s did not answer within %.3gs" % (path, HISTORY_WAIT_S)
    elif isinstance(box[0], Exception):
        why = "%s: %s" % (path, box[0])
    else:
        runs, note = box[0]
        return HangHistory(runs=runs, note=note, slow=slow, waited_more=more)
    return HangHistory(
        runs={index: 1 for index in hung},
        note="cannot remember hung GPUs: " + why,
        slow=slow,
        waited_more=more,
    )


def _remember(
    path: str,
    hung: Mapping[int, str],
    answered: List[int],
    count: int,
    started: float,
    now: float,
    calls: Mapping[int, str],
) -> Tuple[Dict[int, int], str]:
    """Read, update and write the memory under its lock; the happy path (nothing hung, no file) writes nothing."""
    if not hung and not os.path.exists(path):
        return {}, ""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with locks.locked(path + ".lock", LOCK_WAIT_S):
        old, note = _read(path)
        new, runs, problem = update_history(old, hung, answered, count, started, now, calls)
        if new != old:
            atomicio.write_json_atomic(path, new)
    return runs, note or problem


def _read(path: str) -> Tuple[Any, str]:
    try:
        raw = atomicio.read_ours(path, MAX_BYTES + 1)
    except ValueError as exc:  # not a file we wrote: its word is not taken
        return None, "%s: started again" % exc
    if raw is None:
        return None, ""
    if len(raw) > MAX_BYTES:
        return None, "%s is larger than %d bytes: started again" % (path, MAX_BYTES)
    try:
        return json.loads(raw.decode("utf-8")), ""
    except (UnicodeDecodeError, ValueError) as exc:
        return None, "%s is not JSON (%s): started again" % (path, exc)
