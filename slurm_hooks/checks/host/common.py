"""What the host checks share: the time of a run, the boot id, and the history of a counter family.

Time comes from `clock` (time.time: windows span runs, so wall time; tests replace it). The boot id
(/proc/sys/kernel/random/boot_id) tells a counter reset by a reboot from one that only went down.
"""

from __future__ import annotations

import os
import time

from ...core import atomicio
from ...hw import counter_window
from ...registry import Param
from ...result import Status

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, Optional

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
    if ctx.host.is_live:
        path = counter_window.state_path(state_dir, family)
        return counter_window.record(path, values, now, boot_id(ctx), keep_s, zero_at)
    # a captured or fake node keeps its history in its own tree: the directory resolved inside the
    # tree, then opened from the tree's root one component at a time without following a symlink
    # (one swapped in meanwhile by whoever can write the tree is refused, not followed out of it)
    inside = ctx.host.realpath(state_dir)
    path = counter_window.state_path(ctx.host.path(inside), family)
    try:
        dir_fd = _open_in_tree(ctx.host.root, inside)
    except OSError as exc:
        note = "history not saved (%s): %s" % (path, exc.strerror or exc)
        return counter_window.this_run_only(values, now, boot_id(ctx), keep_s, zero_at, note)
    try:
        return counter_window.record(path, values, now, boot_id(ctx), keep_s, zero_at, dir_fd)
    finally:
        os.close(dir_fd)


def _open_in_tree(root: str, host_dir: str) -> int:
    """A descriptor of `host_dir` under `root`, made if missing, no component a symlink."""
    fd = atomicio.open_dir(root)
    try:
        for name in [part for part in host_dir.split("/") if part]:
            below = atomicio.open_subdir(fd, name, create_mode=0o700, where=root)
            os.close(fd)
            fd = below
        return fd
    except BaseException:
        os.close(fd)
        raise


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
