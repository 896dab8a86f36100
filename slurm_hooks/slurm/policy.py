"""Policy: what to do about a run's results. Pure functions only; hooks/ carries decisions out.

- Only node-broken FAILs (blame NODE) lead to a drain. Job-broken results fail nobody's node;
  check-broken ones (UNKNOWN: our bug, a missing NVML function) alert and are recorded.
- Timeouts alert by default ([drain] on_timeout = "drain" makes them node-broken).
- Etiquette: a drain whose reason does not start with our prefix belongs to someone else (an admin):
  never overwritten, never resumed. Slurm's own bare "Prolog error"/"Epilog error" may be refined.
  Our reasons lead with what broke, for the 20 characters `sinfo -R` shows ('sh:gpu.remap g3 ...'),
  and name every check that caused the drain ('sh:gpu.count +gpu.ecc: ...'), so a node that lost
  its local state can still tell which checks must pass before it resumes; an admin's drain
  through `slurm-hooks drain` reads 'sh:manual: ...' and is never resumed automatically
  (read_reason tells the kinds apart, and reads the format of the release before too).
- Circuit breaker: when too many nodes are already drained by us, a new failure is far more likely a
  bad check or config than bad hardware: do not drain, alert loudly. Under concurrency the drainer
  drains, then ranks every automatic drain of ours by (Slurm's reason time, node name) and undoes its
  own when it ranks at or past the limit (breaker_rank; the argument is in docs/slurm.md).
"""

from __future__ import annotations

import enum
import math

from ..core.structs import Struct, replace
from ..result import Action, Blame, Result, Status
from .reasons import (  # noqa: F401 - the reason's format and reading, used as policy.X everywhere
    FLEET_CHECK,
    LEGACY_PREFIX,
    MANUAL,
    REASON_LIMIT,
    REFINABLE_REASONS,
    ReasonOwner,
    format_manual_reason,
    format_reason,
    gpu_index,
    is_ours,
    is_refinable,
    read_reason,
    sanitize,
)

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Iterable, List, Mapping, Optional, Sequence, Tuple


class Verdict(enum.Enum):
    PASS = "pass"  # nothing to do
    ALERT = "alert"  # log and record, touch nothing (WARN, UNKNOWN, job-broken)
    DRAIN = "drain"  # node-broken: take the node out of service


class Outcome(enum.Enum):
    """What carrying out a decision did (drainer.py). Compare members, never their strings: the
    values are what logs, records and metrics show, and a renamed value must not change a decision."""

    DRAINED = "drained"  # we set DRAIN with our reason
    REFINED = "refined"  # replaced Slurm's bare "Prolog error" with our reason
    ALREADY_OURS = "already-drained-by-us"
    FOREIGN_DRAIN = (
        "foreign-drain-kept"  # someone else's drain (or an admin's manual one): untouched
    )
    SKIPPED_STATE = (
        "skipped-state"  # DOWN, FAIL, rebooting, powered down, maintenance...: untouched
    )
    BREAKER = "breaker-tripped"  # too many nodes drained by us: not drained
    BREAKER_UNDONE = "breaker-undone"  # drained, then ranked past the limit: our drain was undone
    CANNOT_COUNT = (
        "cannot-count"  # the node list could not be read: the breaker cannot count, no drain
    )
    OBSERVE = "observe"  # observe mode: logged only
    SLURM_UNAVAILABLE = "slurm-unavailable"  # could not reach slurmctld (record kept locally)
    SLURM_ERROR = "slurm-error"
    RESUMED = "resumed"
    NOT_OURS = "not-ours"  # resume refused: the drain is not provably ours
    NOT_DRAINED = "not-drained"
    UNPROVEN = (
        "kept-unproven"  # health: the checks that drained the node did not all pass: drain kept
    )


DELIVERED = frozenset(
    {Outcome.DRAINED, Outcome.REFINED, Outcome.ALREADY_OURS}
)  # the node carries our drain
NEW_DRAINS = frozenset({Outcome.DRAINED, Outcome.REFINED})  # ... set by this run
UNDELIVERED = frozenset(
    {Outcome.SLURM_UNAVAILABLE, Outcome.SLURM_ERROR, Outcome.CANNOT_COUNT}
)  # kept as 'pending'
BREAKER_HELD = frozenset(
    {Outcome.BREAKER, Outcome.BREAKER_UNDONE, Outcome.CANNOT_COUNT}
)  # the breaker stopped a drain
NOT_OURS_NOW = frozenset(
    {Outcome.RESUMED, Outcome.NOT_DRAINED, Outcome.NOT_OURS}
)  # no drain of ours to track


class Decision(Struct):
    verdict: Verdict
    blame: Optional[Blame]
    findings: Tuple[Result, ...]  # the results that led to the verdict, worst first
    reason: str = ""  # the drain reason, when verdict is DRAIN

    @property
    def checks(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(r.check for r in self.findings))


RUNNER_CHECK = "slurm-hooks.runner"  # the check process died or hit the deadline (hooks/bounded.py run_isolated_checks)
PASSING = (Status.OK, Status.WARN, Status.SKIP)


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
        checks = tuple(dict.fromkeys(r.check for r in ordered))
        reason = format_reason(
            ordered[0],
            str(drain_settings["reason_prefix"]),
            min(int(drain_settings["max_reason_length"]), REASON_LIMIT),
            more=len(ordered) - 1,
            checks=checks,
        )
        return Decision(Verdict.DRAIN, Blame.NODE, tuple(ordered), reason)
    troubled = [r for r in results if r.status in (Status.FAIL, Status.UNKNOWN, Status.WARN)]
    if troubled:
        blame = (
            Blame.JOB
            if any(r.effective_blame is Blame.JOB for r in troubled)
            else (Blame.CHECK if any(r.effective_blame is Blame.CHECK for r in troubled) else None)
        )
        return Decision(
            Verdict.ALERT, blame, tuple(sorted(troubled, key=lambda r: -r.status.severity))
        )
    return Decision(Verdict.PASS, None, ())


_ACTION_RANK = {
    Action.RMA: 4,
    Action.REBOOT: 3,
    Action.RESET_GPU: 2,
    Action.DRAIN: 1,
    Action.NONE: 0,
}


def _action_rank(result: Result) -> int:
    return _ACTION_RANK[result.action]


def unproven(checks: Iterable[str], results: Iterable[Result]) -> List[str]:
    """The checks in `checks` that this run does not show passing, each with why ('gpu.ecc: UNKNOWN').

    A drain is lifted only on proof: every check that caused it ran and came back OK, WARN or SKIP.
    UNKNOWN (hung, crashed, unreadable), a timeout, or not running at all keeps the drain. The
    runner's own entry (the check process died) is proven by this run's checks finishing.
    """
    by_check: dict = {}
    for r in results:
        by_check.setdefault(r.check, []).append(r)
    missing = []
    for name in dict.fromkeys(checks):
        got = by_check.get(name)
        if name == RUNNER_CHECK:
            if got:
                missing.append("%s: the check process did not finish" % name)
        elif not got:
            missing.append("%s: did not run" % name)
        else:
            bad = [
                r
                for r in got
                if r.status not in PASSING or r.details.get("timed_out") or r.details.get("crashed")
            ]
            if bad:
                missing.append(
                    "%s: %s"
                    % (
                        name,
                        bad[0].status.value
                        + (" (timed out)" if bad[0].details.get("timed_out") else ""),
                    )
                )
    return missing


def blocking_state(flags: Iterable[str], state: str, skip_states: Iterable[str]) -> Optional[str]:
    """The first node state/flag we must not act in (e.g. DOWN, REBOOT_REQUESTED), or None."""
    skip = {s.upper() for s in skip_states}
    for word in [state] + sorted(flags):
        if word.upper() in skip:
            return word.upper()
    return None


class BreakerState(Struct):
    """drained_by_us: before our drain, the other nodes drained automatically by us; after it
    (phase 'rank'), those of them that rank ahead of our own drain. tripped: do not drain / undo.
    The rate and common-cause limits (slurm/breaker.py) are counted the same way: window_drains of
    ours within window_s, signature_drains led by the same check within signature_window_s; a
    limit of 0 is off."""

    drained_by_us: int
    total_nodes: int
    limit: int
    phase: str = "count"  # 'count' (before draining) or 'rank' (after: the concurrency check)
    window_drains: int = 0
    window_limit: int = 0
    window_s: float = 0.0
    signature: str = ""  # the check that leads the reason of the drain being decided
    signature_drains: int = 0
    signature_limit: int = 0
    signature_window_s: float = 0.0

    @property
    def common_cause(self) -> bool:
        """The same check drained signature_limit nodes within the window: a shared cause, held."""
        return bool(self.signature_limit) and self.signature_drains >= self.signature_limit

    @property
    def rate_tripped(self) -> bool:
        return bool(self.window_limit) and self.window_drains >= self.window_limit

    @property
    def tripped(self) -> bool:
        return self.drained_by_us >= self.limit or self.rate_tripped or self.common_cause

    def replace(self, **changes: object) -> "BreakerState":
        return replace(self, **changes)

    def describe(self) -> str:
        if self.common_cause:
            return (
                "common cause: %d %s drains of %s within %s (limit %d): held, look for a shared "
                "cause (driver roll-out, file system, switch) before draining more"
                % (
                    self.signature_drains,
                    "automatic slurm-hooks" if self.phase == "count" else "ranked-ahead",
                    self.signature,
                    _span(self.signature_window_s),
                    self.signature_limit,
                )
            )
        if self.rate_tripped and self.drained_by_us < self.limit:
            return "%d automatic slurm-hooks drains %swithin %s (limit %d per window)" % (
                self.window_drains,
                "rank ahead of this one " if self.phase == "rank" else "",
                _span(self.window_s),
                self.window_limit,
            )
        if self.phase == "rank":
            return (
                "%d automatic slurm-hooks drains rank ahead of this one among %d nodes (limit %d)"
                % (self.drained_by_us, self.total_nodes, self.limit)
            )
        return "%d of %d nodes already drained by slurm-hooks (limit %d)" % (
            self.drained_by_us,
            self.total_nodes,
            self.limit,
        )


def _span(seconds: float) -> str:
    return "%g min" % (seconds / 60.0) if seconds >= 60 else "%g s" % seconds


def breaker_limit(total_nodes: int, max_percent: float, min_nodes: int, max_nodes: int = 0) -> int:
    """max(min_nodes, floor(max_percent % of the nodes)), capped at max_nodes when that is set."""
    limit = max(min_nodes, int(math.floor(total_nodes * max_percent / 100.0)))
    return min(limit, max_nodes) if max_nodes > 0 else limit


def breaker_state(
    nodes: Iterable[Tuple[str, bool, Optional[str]]],
    this_node: str,
    prefix: str,
    max_percent: float,
    min_nodes: int,
    max_nodes: int = 0,
) -> BreakerState:
    """`nodes` = (name, is_drained, reason). Counts the OTHER nodes drained automatically by us
    (manual drains through `slurm-hooks drain` are an admin's deliberate act and do not count).
    The share only (what `status` shows); a drain checks every limit (slurm/breaker.py)."""
    nodes = list(nodes)
    ours = sum(
        1
        for name, drained, reason in nodes
        if name != this_node and drained and read_reason(reason, prefix).automatic
    )
    return BreakerState(
        ours, len(nodes), breaker_limit(len(nodes), max_percent, min_nodes, max_nodes)
    )


def drain_key(reason_epoch: Optional[int], name: str) -> Tuple[int, str]:
    """The total order of drains every node computes alike: slurmctld's reason time (one clock),
    then node name. A drain whose time cannot be read sorts first (it counts against everyone)."""
    return (-1 if reason_epoch is None else int(reason_epoch), name)


def breaker_rank(
    nodes: Iterable[Tuple[str, bool, Optional[str], Optional[int]]],
    this_node: str,
    this_key: Tuple[int, str],
    prefix: str,
    max_percent: float,
    min_nodes: int,
) -> BreakerState:
    """After our drain: `nodes` = (name, is_drained, reason, reason_epoch); counts the other automatic
    drains of ours that sort before this_key. tripped means: we rank at or past the limit, undo."""
    nodes = list(nodes)
    ahead = sum(
        1
        for name, drained, reason, epoch in nodes
        if name != this_node
        and drained
        and read_reason(reason, prefix).automatic
        and drain_key(epoch, name) < this_key
    )
    return BreakerState(
        ahead, len(nodes), breaker_limit(len(nodes), max_percent, min_nodes), "rank"
    )
