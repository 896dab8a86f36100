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

import calendar
import os
import re
import time
from typing import Any, Callable, Dict, Mapping, Optional

from ..result import Action, Result, Status
from ..slurm import drainer, policy
from ..slurm.errors import SlurmError
from .through_slurm import (
    LEVEL_MINUTES,
    OUR_HOLD,
    RESERVATION_PREFIX,
    _delete_reservation,
    _slurm,
    owner_host,
)

MARGIN_S = 600  # sbatch's own slack (through_slurm._run_job waits minutes*60 + 120) and clock skew
OURS = re.compile(
    r"^%s(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,127})-(?P<stamp>\d{8}T\d{6}Z)"
    r"(?:\+(?P<level>quick|standard|long)\+(?P<pid>\d{1,10})\+(?P<host>[A-Za-z0-9._-]{1,255}))?$"
    % re.escape(RESERVATION_PREFIX)
)
_NAME = re.compile(r"(?:^|\s)ReservationName=(\S+)")


def parse_name(name: str) -> Optional[Dict[str, Any]]:
    """The run a reservation name of ours records, None for a name that is not ours."""
    match = OURS.match(name)
    if not match:
        return None
    try:
        started = calendar.timegm(time.strptime(match.group("stamp"), "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return None
    return {
        "name": name,
        "node": match.group("node"),
        "started": started,
        "level": match.group("level"),
        "pid": int(match.group("pid")) if match.group("pid") else None,
        "host": match.group("host"),
    }


def owner_alive(pid: int) -> bool:
    """A `slurm-hooks` process with this pid runs here (a reused pid of another program is not our
    owner; a pid we may not signal but that exists is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            argv = handle.read(4096)
    except OSError:
        return True  # cannot tell: not gone
    return b"slurm_hooks" in argv or b"slurm-hooks" in argv


def why_stale(
    run: Mapping[str, Any],
    now: float,
    this_host: str,
    alive: Callable[[int], bool] = owner_alive,
) -> Optional[str]:
    """Why this run of ours is over (None: it may still be running)."""
    bound = LEVEL_MINUTES.get(run["level"] or "", max(LEVEL_MINUTES.values())) * 60 + MARGIN_S
    age = now - run["started"]
    if age > bound:
        return "started %.0f min ago, past its %s bound of %.0f min" % (
            age / 60,
            run["level"] or "longest level's",
            bound / 60,
        )
    if run["pid"] is not None and run["host"] == this_host and not alive(run["pid"]):
        return "its owner (pid %d on %s) is gone" % (run["pid"], this_host)
    return None


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
