"""The stale-reservation sweep: reservations of ours (through_slurm.RESERVATION_PREFIX and our name's
shape) whose qualification is over are deleted at the start of every `qualify --node`/`--due` run
and by `qualify --sweep`. A reservation whose name has our prefix but not our shape is not ours
and is never touched; neither is anyone else's.

Our reservation's name records its run: `slurm-hooks-qualify-<node>-<UTC start>+<level>+<pid>+<host>`
(through_slurm.reservation_name; names of the first version end at the time). It is over when
- it is older than its level's bound (the reservation's Duration, the job's --time) + MARGIN_S
  (no level recorded: the longest level's), or
- its owner ran on this host and that process is gone (a SIGKILL, a crash: no finally ran).
An owner on another host is judged by the age alone: we cannot see its processes.

Deleting it must not release an unqualified node: an owner that died between lifting our drain and
its verdict left the node in service, held only by the reservation. Such a node (in service, not
FAIL, not in a skip state) is drained again first, with our prefix ("qualify: the qualification
run R ended without a verdict"); a drained node is left as it is (ours or an admin's).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Dict, Mapping, Optional

from ..result import Action, Result, Status
from ..slurm import drainer, policy
from ..slurm.errors import SlurmError
from .reservation_names import (  # noqa: F401 (re-exported: sweep.parse_name, sweep.why_stale)
    RESERVATION_PREFIX,
    owner_alive,
    owner_host,
    parse_name,
    why_stale,
)
from .through_slurm import OUR_HOLD, _delete_reservation, _slurm

_NAME = re.compile(r"(?:^|\s)ReservationName=(\S+)")


def sweep(
    client,
    settings: Mapping[str, Mapping[str, Any]],
    env: Dict[str, str],
    now: Optional[float] = None,
    this_host: Optional[str] = None,
    alive: Callable[[int], bool] = owner_alive,
) -> Dict[str, Any]:
    """Delete our stale reservations; {deleted: [{name, node, why, node_action}], kept: [{name,
    why}], error?, slurm_calls}."""
    now = time.time() if now is None else now
    this_host = this_host or owner_host()
    out: Dict[str, Any] = {"deleted": [], "kept": [], "slurm_calls": 1}
    listing = _slurm(["scontrol", "-o", "show", "reservation"], env)
    if listing.rc != 0 and "No reservations" not in listing.output:
        out["error"] = "cannot list the reservations: %s" % listing.tail(2)
        return out
    for name in _NAME.findall(listing.output):
        if not name.startswith(RESERVATION_PREFIX):
            continue  # not ours: never looked at again
        run = parse_name(name)
        if run is None:
            out["kept"].append({"name": name, "why": "our prefix but not our name: not ours"})
            continue
        why = why_stale(run, now, this_host, alive)
        if why is None:
            out["kept"].append({"name": name, "why": "may still be running"})
            continue
        action = _hold_the_node(client, run, settings, out)
        if _delete_reservation(name, env, out):
            out["deleted"].append(
                {"name": name, "node": run["node"], "why": why, "node_action": action}
            )
        else:
            out["kept"].append({"name": name, "why": "stale (%s) but not deleted" % why})
    return out


def _hold_the_node(client, run, settings, out) -> str:
    """Before the reservation goes: a node its dead run left in service is drained again (never
    released on an unknown outcome); any other node is left as it is."""
    try:
        info = client.show_node(run["node"])
        out["slurm_calls"] += 1
    except SlurmError as exc:
        return "left as it is (cannot read it: %s)" % exc
    skip = [s for s in settings["drain"]["skip_states"] if s.upper() not in OUR_HOLD]
    blocked = drainer.leave_alone(info, skip)  # the MAINT flag is our reservation's
    if info.is_drained or blocked:
        return "left as it is (%s)" % (blocked or "drained: %s" % info.reason)
    result = Result(
        "qualify",
        Status.FAIL,
        "the qualification run %s ended without a verdict" % run["name"],
        action=Action.DRAIN,
    )
    reason = policy.format_reason(
        result, settings["drain"]["reason_prefix"], int(settings["drain"]["max_reason_length"])
    )
    try:
        client.drain(run["node"], reason)
        out["slurm_calls"] += 1
    except SlurmError as exc:
        return "drain FAILED (%s): in service unqualified" % exc
    return "drained: %s" % reason
