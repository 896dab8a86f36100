"""The names of our qualification reservations and what they say of their run:
`slurm-hooks-qualify-<node>-<UTC start>+<level>+<pid>+<host>` (names of the first version end at
the time). through_slurm.py makes them, sweep.py judges them; both import them from here, so that
neither imports the other's judgement (no import cycle)."""

from __future__ import annotations

import calendar
import os
import re
import time
from typing import Any, Callable, Dict, Mapping, Optional

RESERVATION_PREFIX = "slurm-hooks-qualify-"
LEVEL_MINUTES = {"quick": 30, "standard": 60, "long": 300}


def reservation_name(node: str, now: Optional[float] = None, level: Optional[str] = None) -> str:
    """slurm-hooks-qualify-<node>-<UTC time>, and with `level` the run's owner after it
    (+<level>+<pid>+<host>): what the stale-reservation sweep judges (qualify/sweep.py)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    name = "%s%s-%s" % (RESERVATION_PREFIX, node, stamp)
    if level is None:
        return name
    return "%s+%s+%d+%s" % (name, level, os.getpid(), owner_host())


def owner_host() -> str:
    """This host as a reservation name records it: the short name, at most 64 characters."""
    import socket

    return socket.gethostname().split(".")[0][:64] or "localhost"


MARGIN_S = 600  # sbatch's own slack (through_slurm._run_job waits minutes*60 + 120) and clock skew
OURS = re.compile(
    r"^%s(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,127})-(?P<stamp>\d{8}T\d{6}Z)"
    r"(?:\+(?P<level>quick|standard|long)\+(?P<pid>\d{1,10})\+(?P<host>[A-Za-z0-9._-]{1,255}))?$"
    % re.escape(RESERVATION_PREFIX)
)


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
