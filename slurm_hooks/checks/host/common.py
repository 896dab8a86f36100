"""What the host checks share: the time of a run, the boot id, and the history of a counter family.

Time comes from `clock` (time.time: windows span runs, so wall time; tests replace it). The boot id
(/proc/sys/kernel/random/boot_id) tells a counter reset by a reboot from one that only went down.
"""

from __future__ import annotations

import time
from typing import Dict, Optional

from ...hw import counter_window
from ...registry import Param
from ...result import Status

clock = time.time
BOOT_ID = "/proc/sys/kernel/random/boot_id"
STATUS_CHOICES = ("fail", "warn", "ignore")
STATUS_OF = {"fail": Status.FAIL, "warn": Status.WARN, "ignore": Status.OK}


def boot_id(ctx) -> str:
    return (ctx.host.read_text(BOOT_ID, default="") or "").strip() or "unknown"


def record_history(
    ctx,
    family: str,
    values: Dict[str, int],
    keep_s: float,
    now: float,
    zero_at: Optional[Dict[str, float]] = None,
) -> counter_window.History:
    """This run's counter values appended to the family's history (slurm_hooks.hw.counter_window)."""
    state_dir = ctx.config.get("paths", "state_dir")
    if not ctx.host.is_live:  # a captured or fake node keeps its history in its own tree
        state_dir = ctx.host.real(state_dir)
    path = counter_window.state_path(state_dir, family)
    return counter_window.record(path, values, now, boot_id(ctx), keep_s, zero_at)


def window_param(default_hours: float, what: str) -> Param:
    return Param(
        "window_hours",
        float,
        default_hours,
        "count %s over this many hours (the history lives in [paths] state_dir)" % what,
        above=0,
        maximum=24 * 90,
    )


def status_param(name: str, default: str, what: str) -> Param:
    return Param(name, str, default, what, choices=STATUS_CHOICES)
