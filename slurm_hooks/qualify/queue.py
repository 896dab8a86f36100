"""Straggler suspects waiting for proof: `report --stragglers --drain` with [fleet] confirm_with =
"qualify" queues a suspect here instead of draining it on statistics alone; `qualify --due` runs
the qualification when the node is idle and enacts it (qualify/due.py).

The file: <[paths] state_dir>/qualify-queue.json on the admin host, written atomically under a lock
beside it (as fleet-state.json), at most MAX_NODES entries per table (the oldest dropped):
    {"queued": {node: {"time", "metric", "straggler": <the straggler reason>, "jobs": [...]}},
     "passed": {node: {"time", "metric"}}}
A node that passed is not queued again on the same evidence: only jobs that started after its
pass count (straggler_drain.fresh), as after a drain of ours.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..core import atomicio, locks

NAME = "qualify-queue.json"
MAX_NODES = 1000
LOCK_TIMEOUT_S = 5.0
TABLES = ("queued", "passed")


def path_for(settings: Mapping[str, Mapping[str, Any]]) -> str:
    return os.path.join(settings["paths"]["state_dir"], NAME)


def read(path: str) -> Dict[str, Dict[str, Any]]:
    """The queue; ValueError naming the file for content of another shape (a hand edit)."""
    state = atomicio.read_json(path, default={})
    if not isinstance(state, dict):
        raise ValueError("%s: not a JSON object" % path)
    out: Dict[str, Dict[str, Any]] = {}
    for table in TABLES:
        entries = state.get(table, {})
        if not isinstance(entries, dict) or not all(
            isinstance(e, dict) and type(e.get("time")) in (int, float) for e in entries.values()
        ):
            raise ValueError("%s: %r is not an object of nodes with a time each" % (path, table))
        out[table] = entries
    return out


def update(path: str, change: Callable[[Dict[str, Dict[str, Any]]], Any]) -> Any:
    """Read, change in place, bound and write the queue under its lock; change's result.
    OSError (the lock held past LOCK_TIMEOUT_S, an unwritable directory) and ValueError propagate."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with locks.locked(path + ".lock", LOCK_TIMEOUT_S):
        state = read(path)
        result = change(state)
        for table in TABLES:
            entries = state[table]
            for node in sorted(entries, key=lambda n: entries[n]["time"])[:-MAX_NODES]:
                del entries[node]
        atomicio.write_json_atomic(path, state)
    return result


def offer(
    settings: Mapping[str, Mapping[str, Any]],
    suspect,
    straggler_reason: str,
    fresh: Callable[[Any, Optional[float]], Tuple[int, int]],
    now: Optional[float] = None,
) -> Tuple[str, str]:
    """Queue a suspect for qualification instead of draining it: (outcome, message) for its row.
    Outcomes: queued-for-qualification, already-queued, passed-qualification (not queued again:
    too few flagged jobs since its pass), queue-unusable."""
    fleet = settings["fleet"]
    now = time.time() if now is None else now

    def change(state):
        passed = state["passed"].get(suspect.node)
        if passed is not None:
            flagged, users = fresh(suspect, passed["time"])
            if flagged < fleet["k"] or users < fleet["drain_min_users"]:
                return (
                    "passed-qualification",
                    "passed its qualification at %s; %d flagged job(s) of %d user(s) since, "
                    "queued again at k = %d jobs of drain_min_users = %d users"
                    % (_utc(passed["time"]), flagged, users, fleet["k"], fleet["drain_min_users"]),
                )
        queued = state["queued"].get(suspect.node)
        if queued is not None:
            return (
                "already-queued",
                "queued for qualification since %s (qualify --due)" % _utc(queued["time"]),
            )
        state["queued"][suspect.node] = {
            "time": now,
            "metric": suspect.metric,
            "straggler": straggler_reason,
            "jobs": [mark.job for mark, _ in suspect.evidence][-20:],
        }
        return (
            "queued-for-qualification",
            'not drained on statistics alone ([fleet] confirm_with = "qualify"): qualified when '
            "idle by `slurm-hooks qualify --due`",
        )

    try:
        return update(path_for(settings), change)
    except (OSError, ValueError) as exc:
        return (
            "queue-unusable",
            "cannot queue it for qualification (%s): neither queued nor drained" % exc,
        )


def settle(settings: Mapping[str, Mapping[str, Any]], node: str, verdict: str, now=None) -> None:
    """After a qualification of a queued node: a pass moves it to "passed" (the same evidence does
    not queue it again), a fail takes it off (it is drained now); anything else keeps it queued."""
    now = time.time() if now is None else now

    def change(state):
        entry = state["queued"].get(node)
        if verdict == "pass":
            state["queued"].pop(node, None)
            state["passed"][node] = {"time": now, "metric": (entry or {}).get("metric")}
        elif verdict == "fail":
            state["queued"].pop(node, None)

    update(path_for(settings), change)


def _utc(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))
