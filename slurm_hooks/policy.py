"""Policy: what to do about a run's results. Pure functions only; hooks.py carries decisions out.

- Only node-broken FAILs (blame NODE) lead to a drain. Job-broken results fail nobody's node;
  check-broken ones (UNKNOWN: our bug, a missing NVML function) alert and are recorded.
- Timeouts alert by default ([drain] on_timeout = "drain" makes them node-broken).
- Etiquette: a drain whose reason does not start with our prefix belongs to someone else (an admin):
  never overwritten, never resumed. Slurm's own bare "Prolog error"/"Epilog error" may be refined.
- Circuit breaker: when too many nodes are already drained by us, a new failure is far more likely a
  bad check or config than bad hardware: do not drain, alert loudly.
"""
from __future__ import annotations

import enum
import math
import re
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from .result import Action, Blame, Result, Status
from .structs import Struct

SLURM_OWN_REASONS = ("Prolog error", "Epilog error", "Not responding", "Kill task failed")
REFINABLE_REASONS = ("Prolog error", "Epilog error")


class Verdict(enum.Enum):
    PASS = "pass"  # nothing to do
    ALERT = "alert"  # log and record, touch nothing (WARN, UNKNOWN, job-broken)
    DRAIN = "drain"  # node-broken: take the node out of service


class Decision(Struct):
    verdict: Verdict
    blame: Optional[Blame]
    findings: Tuple[Result, ...]  # the results that led to the verdict, worst first
    reason: str = ""  # the drain reason, when verdict is DRAIN

    @property
    def checks(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(r.check for r in self.findings))


def is_node_broken(result: Result, on_timeout: str) -> bool:
    if (result.details.get("timed_out") or result.details.get("crashed")) and on_timeout == "drain":
        return True
    return result.status is Status.FAIL and result.effective_blame is Blame.NODE


def decide(results: Sequence[Result], settings: Mapping[str, Mapping[str, object]]) -> Decision:
    """Turn a run's results into a verdict. `settings` is Config.settings (uses [drain])."""
    drain_settings = settings["drain"]
    on_timeout = str(drain_settings["on_timeout"])
    node_broken = [r for r in results if is_node_broken(r, on_timeout)]
    if node_broken:
        ordered = sorted(node_broken, key=_action_rank, reverse=True)
        reason = format_reason(ordered[0], str(drain_settings["reason_prefix"]),
                               int(drain_settings["max_reason_length"]), more=len(ordered) - 1)
        return Decision(Verdict.DRAIN, Blame.NODE, tuple(ordered), reason)
    troubled = [r for r in results if r.status in (Status.FAIL, Status.UNKNOWN, Status.WARN)]
    if troubled:
        blame = Blame.JOB if any(r.effective_blame is Blame.JOB for r in troubled) else \
            (Blame.CHECK if any(r.effective_blame is Blame.CHECK for r in troubled) else None)
        return Decision(Verdict.ALERT, blame, tuple(sorted(troubled, key=lambda r: -r.status.severity)))
    return Decision(Verdict.PASS, None, ())


_ACTION_RANK = {Action.RMA: 4, Action.REBOOT: 3, Action.RESET_GPU: 2, Action.DRAIN: 1, Action.NONE: 0}


def _action_rank(result: Result) -> int:
    return _ACTION_RANK[result.action]


_UNSAFE = re.compile(r"[^A-Za-z0-9 .,:;_=+/@%()\[\]<>#|-]")


def sanitize(text: str) -> str:
    """Reasons go through scontrol/RPC and into sinfo tables: no newlines, quotes or control bytes."""
    for quote in ('"', "'", "`"):  # quoting marks carry no meaning in a reason: dropped, not '?'
        text = text.replace(quote, "")
    return re.sub(r"\s+", " ", _UNSAFE.sub("?", text)).strip()


def format_reason(result: Result, prefix: str, max_length: int, more: int = 0) -> str:
    """'slurm-hooks: gpu.memory: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu' (bounded, sanitized).

    A long summary is cut, not the end: the action and the '(+N more)' count are what an admin
    reading `sinfo -R` acts on, so they survive the cut ('... redirected to the root c... -> drain').
    """
    parts = [prefix.strip(), result.check + ":"]
    if result.component:
        parts.append(result.component)
    parts.append(result.summary)
    tail = []
    if result.action is not Action.NONE:
        tail.append("-> " + result.action.value)
    if more:
        tail.append("(+%d more)" % more)
    head = sanitize(" ".join(parts))
    end = sanitize(" ".join(tail))
    reason = (head + " " + end).strip()
    if len(reason) > max_length:
        keep = max_length - 3 - (len(end) + 1 if end else 0)
        if keep < len(prefix.strip()) + len(result.check) + 2:  # too short for the tail: plain cut
            return reason[: max(max_length - 3, 0)].rstrip() + "..."
        reason = head[:keep].rstrip() + "..." + (" " + end if end else "")
    return reason


def is_ours(reason: Optional[str], prefix: str) -> bool:
    return bool(reason) and reason.startswith(prefix.strip())


def is_refinable(reason: Optional[str]) -> bool:
    """Slurm's own generic drain reason after a failed prolog/epilog: ours to replace with a precise one."""
    return bool(reason) and reason.strip() in REFINABLE_REASONS


def checks_in_reason(reason: str, prefix: str) -> List[str]:
    """The check named in one of our reasons ('slurm-hooks: gpu.ecc: ...' -> ['gpu.ecc'])."""
    if not is_ours(reason, prefix):
        return []
    rest = reason[len(prefix.strip()):].strip()
    name = rest.split(":", 1)[0].strip()
    return [name] if re.fullmatch(r"[a-z0-9_-]+(\.[a-z0-9_-]+)+", name) else []


def blocking_state(flags: Iterable[str], state: str, skip_states: Iterable[str]) -> Optional[str]:
    """The first node state/flag we must not act in (e.g. DOWN, REBOOT_REQUESTED), or None."""
    skip = {s.upper() for s in skip_states}
    for word in [state] + sorted(flags):
        if word.upper() in skip:
            return word.upper()
    return None


class BreakerState(Struct):
    drained_by_us: int  # other nodes currently drained with our prefix
    total_nodes: int
    limit: int

    @property
    def tripped(self) -> bool:
        return self.drained_by_us >= self.limit

    def describe(self) -> str:
        return "%d of %d nodes already drained by slurm-hooks (limit %d)" % (self.drained_by_us, self.total_nodes,
                                                                             self.limit)


def breaker_state(nodes: Iterable[Tuple[str, bool, Optional[str]]], this_node: str, prefix: str,
                  max_percent: float, min_nodes: int) -> BreakerState:
    """`nodes` = (name, is_drained, reason). The limit is max(min_nodes, floor(max_percent% of nodes))."""
    nodes = list(nodes)
    ours = sum(1 for name, drained, reason in nodes if name != this_node and drained and is_ours(reason, prefix))
    limit = max(min_nodes, int(math.floor(len(nodes) * max_percent / 100.0)))
    return BreakerState(ours, len(nodes), limit)
