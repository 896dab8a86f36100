"""Lemon nodes: a node drained by us again and again, or whose fault survives a reboot, is held for RMA.

Judged by a node's own hook when it decides to drain (hooks/enactment.py), from the node's drain history:
`<[paths] state_dir>/drain-history.json`, a bounded list (HISTORY_MAX entries, none older than
[lemon] days) of the drains this node made, each with its time (this host's clock), the checks
that caused it, the GPU its reason leads with, and the boot it happened in
(/proc/sys/kernel/random/boot_id: a new value after every boot). Written by the hook after a drain
reached Slurm (atomic replace, bounded by [deadline] files like the state file); read under the
node's lock. Lost with the state directory (a diskless node's tmpfs): then counting starts again,
the safe direction for a node that is not judged a lemon.

A lemon is drained with a reason that says so and asks for RMA ('sh:gpu.xid g3: gpu:3 ... lemon:
3rd drain in 30 d; ... -> rma'); the health mode never resumes it and no repair rung acts on it:
an admin clears it (`slurm-hooks resume`). Rules (docs/slurm.md, "Lemon nodes"):
 - N drains in D days: this drain is the [lemon] drains-th of ours on this node within [lemon] days;
 - the same fault after a reboot: an earlier drain within [lemon] days named the same check (and
   the same GPU, when both name one) in another boot.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..core.structs import replace
from ..result import Action, Result
from .reasons import REASON_LIMIT, format_reason, gpu_index, read_reason

HISTORY_FILE = "drain-history.json"
HISTORY_MAX = 32  # entries kept: far more than any threshold needs, and a bounded file
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MARK = "lemon:"  # in the summary of a lemon's reason; with '-> rma' at its end it reads as a lemon
now = time.time  # the clock of the history; a test sets its own to play weeks in a second


def history_path(state_dir: str) -> str:
    return os.path.join(state_dir, HISTORY_FILE)


def boot_id(root: str) -> Optional[str]:
    """This boot's id (/proc/sys/kernel/random/boot_id under `root`), None when unreadable."""
    from ..hw.host import Host

    try:
        text = Host(root).read_text(BOOT_ID, default="", max_bytes=64) or ""
    except OSError:
        return None
    return text.strip()[:40] or None


def clean(history: Any, days: float, at: float) -> List[Dict[str, Any]]:
    """The history as read (anything from a file), keeping well-formed entries within `days`, the
    newest HISTORY_MAX."""
    if not isinstance(history, list):
        return []
    kept = [
        e
        for e in history
        if isinstance(e, dict)
        and isinstance(e.get("time"), (int, float))
        and isinstance(e.get("checks"), list)
        and at - float(e["time"]) < days * 86400.0
    ]
    return sorted(kept, key=lambda e: float(e["time"]))[-HISTORY_MAX:]


def judge(
    history: Sequence[Mapping[str, Any]],
    checks: Sequence[str],
    gpu: Optional[int],
    boot: Optional[str],
    settings: Mapping[str, Any],
    at: float,
) -> str:
    """Why a drain for `checks` (leading GPU `gpu`, in boot `boot`) makes this node a lemon, or ''.
    `history` holds this node's earlier drains (clean() already applied)."""
    if not settings["enabled"]:
        return ""
    days = float(settings["days"])
    recent = [e for e in history if at - float(e["time"]) < days * 86400.0]
    count = len(recent) + 1
    if settings["drains"] and count >= int(settings["drains"]):
        return "%s drain in %g d" % (_ordinal(count), days)
    if not settings["same_fault_after_reboot"] or not boot:
        return ""
    lead = checks[0] if checks else ""
    for entry in reversed(recent):
        other_gpu = entry.get("gpu")
        same_gpu = gpu is None or other_gpu is None or other_gpu == gpu
        if (
            lead in entry["checks"]
            and same_gpu
            and entry.get("boot_id")
            and entry["boot_id"] != boot
        ):
            return "%s again after a reboot (first %s)" % (
                lead,
                time.strftime("%Y-%m-%d", time.gmtime(float(entry["time"]))),
            )
    return ""


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return "%d%s" % (n, suffix)


def lemon_reason(
    first: Result, why: str, prefix: str, max_length: int, more: int, checks: Sequence[str]
) -> str:
    """The drain reason of a lemon: the worst finding, marked and asking for RMA."""
    marked = replace(first, summary="%s %s; %s" % (MARK, why, first.summary), action=Action.RMA)
    return format_reason(marked, prefix, max_length, more=more, checks=checks)


def is_lemon(reason: Optional[str], prefix: str) -> bool:
    """One of our automatic reasons, marked as a lemon's and asking for RMA (lemon_reason)."""
    if not reason or not read_reason(reason, prefix).automatic:
        return False
    head, _, rest = reason.partition(": ")
    tail = rest.split(" (+", 1)[0] if rest.rstrip().endswith(" more)") else rest
    return (" %s " % MARK in " " + rest) and tail.rstrip().endswith("-> rma")


def entry(
    reason: str, checks: Sequence[str], gpu: Optional[int], boot: Optional[str], why: str, at: float
) -> dict:
    """One drain of this node, for the history."""
    return {
        "time": at,
        "checks": list(checks),
        "gpu": gpu,
        "boot_id": boot,
        "reason": reason,
        "lemon": why,
    }


def read_history(path: str, days: float, timeout: float) -> Optional[List[Dict[str, Any]]]:
    """The history file, read in a child bounded by `timeout` ([deadline] files): a state directory
    that hangs costs that much once, and the drain goes on judged on no history. None when the file
    was there but could not be read (or did not answer): unknown, not empty."""
    from ..core.atomicio import read_json
    from ..core.isolation import run_isolated

    def read() -> Any:
        try:
            return {"history": read_json(path, default=None)}
        except ValueError:  # not JSON: nothing to keep, the next write starts it again
            return {"history": None}
        except OSError:  # there but not readable: unknown, and not to be overwritten
            return None

    try:
        answer, _ = run_isolated(read, timeout, "reading the drain history")
    except OSError:
        answer = None
    return None if answer is None else clean(answer["history"], days, now())


def decide(
    config: Any, first: Result, checks: Sequence[str], reason: str, more: int, read: bool = True
) -> dict:
    """Judge a drain about to be made: {'reason': the reason to drain with, 'why': '' or why this
    node is a lemon, 'history', 'history_unknown', 'boot', 'gpu', 'time'} (hooks/enactment.py). read=False
    (the state directory did not answer this run) judges on an unknown history without waiting."""
    settings = config.settings["lemon"]
    at = now()
    history: Optional[List[Dict[str, Any]]] = []
    if keeps_history(config):
        history = (
            read_history(
                history_path(config.get("paths", "state_dir")),
                max(float(settings["days"]), float(config.get("repair", "window_days"))),
                config.get("deadline", "files"),
            )
            if read
            else None
        )
    unknown = history is None
    history = history or []
    boot = boot_id(config.get("general", "root")) if settings["enabled"] else None
    gpu = gpu_index(first.component)
    why = judge(history, checks, gpu, boot, settings, at)
    if why:
        prefix = config.get("drain", "reason_prefix")
        length = min(int(config.get("drain", "max_reason_length")), REASON_LIMIT)
        reason = lemon_reason(first, why, prefix, length, more, checks)
    return {
        "reason": reason,
        "why": why,
        "history": history,
        "history_unknown": unknown,
        "boot": boot,
        "gpu": gpu,
        "time": at,
    }


def keeps_history(config: Any) -> bool:
    """The drain history is read and written for the lemon rules and for the repair cap."""
    repair = config.settings["repair"]
    return bool(config.get("lemon", "enabled") or repair["reboot"] or repair["reset_gpu"])


def history_step(config: Any, judged: Mapping[str, Any], reason: str, checks: Sequence[str]):
    """The bounded step that appends a drain that reached Slurm to the history file."""
    from ..core.atomicio import write_json_atomic
    from ..core.isolation import Step

    path = history_path(config.get("paths", "state_dir"))
    added = entry(reason, checks, judged["gpu"], judged["boot"], judged["why"], judged["time"])
    added["repair"] = judged.get("repair", "")
    history = list(judged["history"]) + [added]

    def write() -> None:
        try:
            write_json_atomic(path, history[-HISTORY_MAX:])
        except OSError:  # full or read-only disk: counting starts again, the drain stands
            pass

    return Step("drain-history", path, write)
