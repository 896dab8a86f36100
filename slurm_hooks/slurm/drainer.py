"""Carry out a DRAIN decision (or a resume) through Slurm, with etiquette and the circuit breaker.

An automatic drain (docs/slurm.md, "The circuit breaker", has the argument why this holds):
 1. read the node: leave it alone when it is in a state we do not handle (skip_states, FAIL, a state
    word we do not know), drained by someone else, or already drained by us;
 2. list every node: re-read our own node right before draining, and count the other nodes drained
    automatically by us; at a limit (the share, max_nodes, the rate window, a common cause:
    slurm/breaker.py), do not drain (BREAKER);
 3. drain;
 4. wait until slurmctld's clock has passed the second of our drain (SETTLE_S after the request
    returned), so that every drain that could sort ahead of ours is visible;
 5. list again and rank every automatic drain of ours by (Slurm's reason time, node name); when ours
    ranks at or past a limit (counting only drains ranked ahead of it), undo it at once, only if its reason is still exactly ours
    (BREAKER_UNDONE, logged CRITICAL).
Slurm calls: 1 when already drained or left alone, 2 when the breaker stops us, 4 for a drain that
stays, 6 for one undone (the node is read once more right before the undo). The happy path (no drain) makes none. Every Slurm error is typed
(slurm.SlurmUnavailable, NodeNotFound, SlurmCommandError) and becomes an Outcome, not a crash; when
the node list cannot be read the breaker cannot count, and we do not drain (CANNOT_COUNT).

A drain is ours when its reason is exactly the one we recorded locally (Slurm's reason time
included), or, when the local state is lost, when the reason is one of our automatic ones (it names
the checks that caused it). The prefix alone proves nothing: Slurm 24.11/25.11 with
accounting_storage/none keep the old reason on a resumed node until its next job, and show it again,
with its old time and user, when slurmctld itself drains the node (node_mgr.c _drain_node keeps an
existing reason): tests/test_slurm_versions.py reproduces it on 24.11.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, List, Mapping, Optional, Sequence

from ..core.structs import Struct
from . import breaker, policy
from .budget import SETTLE_S, slurm_budget  # noqa: F401 (slurm_budget: drainer.slurm_budget callers)
from .client import SlurmClient
from .errors import InvalidNodeState, SlurmClientMissing, SlurmError, SlurmUnavailable
from .node_state import NodeInfo
from .policy import Outcome

RESUMED_REASON = "resumed by slurm-hooks: %s passed"
UNDONE_REASON = "drain undone by the slurm-hooks circuit breaker"
ADMIN_RESUMED_REASON = "resumed by an admin with slurm-hooks resume"
_sleep = time.sleep


class Enacted(Struct):
    outcome: Outcome
    message: str
    node: Optional[NodeInfo] = None  # Slurm's latest view of the node
    breaker: Optional[policy.BreakerState] = None
    node_drained: bool = (
        False  # the node carries DRAIN now (by us or anyone): the job must not run here
    )
    confirmed: bool = (
        True  # False: drained, but the breaker's re-count could not be made (redone later)
    )


def make_client(settings: Mapping[str, Mapping[str, Any]]) -> SlurmClient:
    drain = settings["drain"]
    return SlurmClient(
        preferred=drain["backend"],
        timeout=drain["timeout"],
        attempts=drain["attempts"],
        bin_dir=drain.get("slurm_bin_dir", ""),
    )


# ---------------------------------------------------------------------------------------------
# whose drain is it


def _same_drain(node: NodeInfo, entry: Optional[Mapping[str, Any]]) -> bool:
    """Slurm shows exactly the drain recorded in `entry` (reason, and Slurm's reason time when known)."""
    if not entry or node.reason is None or node.reason != entry.get("reason"):
        return False
    return not entry.get("reason_time") or entry.get("reason_time") == node.reason_time


def leave_alone(node: NodeInfo, skip_states: Iterable[str]) -> Optional[str]:
    """Why no action of ours may touch this node (None: one may); qualify/through_slurm.py too."""
    return _leave_alone(node, skip_states)


def _leave_alone(node: NodeInfo, skip_states: Iterable[str]) -> Optional[str]:
    """Why we must not touch this node (None: we may)."""
    if not node.known_state:
        return "in a state we do not know (%s)" % node.state_string
    if node.is_failed:
        return "FAIL (set by someone else)"
    if "EXTERNAL" in node.flags:  # 26.05: no slurmd there, so no hook of ours either
        return "EXTERNAL (a node without slurmd)"
    blocking = policy.blocking_state(node.flags, node.state, skip_states)
    return blocking and "%s" % blocking


def _existing_drain(
    node: NodeInfo, prefix: str, recorded: Sequence[Optional[Mapping[str, Any]]], state_known: bool
) -> str:
    """'ours' | 'manual' | 'unrecorded' (our prefix, not our drain) | 'refinable' | 'foreign'."""
    owner = policy.read_reason(node.reason, prefix)
    if owner.automatic:
        if any(_same_drain(node, e) for e in recorded) or not state_known:
            return "ours"
        return "unrecorded"
    if owner.kind == "manual":
        return "manual"
    return "refinable" if policy.is_refinable(node.reason) else "foreign"


def _before_drain(
    node: NodeInfo,
    prefix: str,
    settings: Mapping[str, Mapping[str, Any]],
    recorded: Sequence[Optional[Mapping[str, Any]]],
    state_known: bool,
    refine: bool = True,
) -> Optional[Enacted]:
    """What to do instead of draining (an Enacted), or None to go on. refine=False: Slurm's own
    "Prolog error" is left as it is too (the fleet report drains only nodes that are not drained)."""
    why = _leave_alone(node, settings["drain"]["skip_states"])
    if why:
        return Enacted(
            Outcome.SKIPPED_STATE,
            "node %s is %s: not draining" % (node.name, why),
            node,
            node_drained=node.is_drained,
        )
    if not node.is_drained:
        return None
    kind = _existing_drain(node, prefix, recorded, state_known)
    if kind == "ours":
        return Enacted(
            Outcome.ALREADY_OURS, "already drained by us: %s" % node.reason, node, node_drained=True
        )
    if kind == "refinable" and refine:
        return None
    what = {
        "manual": "an admin with slurm-hooks drain",
        "unrecorded": "slurm-hooks in a drain this node did not record (re-reasoned, or Slurm kept an old "
        "reason)",
    }.get(kind, "someone else")
    return Enacted(
        Outcome.FOREIGN_DRAIN,
        "drained by %s (%s): left as is" % (what, node.reason),
        node,
        node_drained=True,
    )


def slurm_failure(exc: SlurmError, what: str = "") -> Enacted:
    if isinstance(exc, SlurmClientMissing):
        return Enacted(Outcome.SLURM_UNAVAILABLE, "%sSlurm client unusable: %s" % (what, exc))
    if isinstance(exc, SlurmUnavailable):
        return Enacted(Outcome.SLURM_UNAVAILABLE, "%sslurmctld unreachable: %s" % (what, exc))
    return Enacted(Outcome.SLURM_ERROR, "%sSlurm refused: %s" % (what, exc))


def _find(nodes: List[NodeInfo], name: str) -> Optional[NodeInfo]:
    return next((n for n in nodes if n.name == name), None)


# ---------------------------------------------------------------------------------------------
# drain


def drain(
    client: SlurmClient,
    node_name: str,
    reason: str,
    settings: Mapping[str, Mapping[str, Any]],
    recorded: Sequence[Optional[Mapping[str, Any]]] = (),
    state_known: bool = True,
    refine: bool = True,
) -> Enacted:
    """Drain node_name with reason unless etiquette or the breaker says no (steps in the module doc).

    recorded: this node's local records of drains we made or tried (hooks: 'drained', 'pending');
    state_known: False when the local state is lost, and then an automatic reason of ours counts as ours.
    """
    drain_settings = settings["drain"]
    prefix = drain_settings["reason_prefix"]
    if len(reason) > policy.REASON_LIMIT:  # a config that let it grow: cut, never crash the drain
        reason = reason[: policy.REASON_LIMIT - 3].rstrip() + "..."
    if settings["general"]["mode"] == "observe":
        return Enacted(Outcome.OBSERVE, "observe mode: would drain %s: %s" % (node_name, reason))
    try:
        node = client.show_node(node_name)
    except SlurmError as exc:
        return slurm_failure(exc)
    stop = _before_drain(node, prefix, settings, recorded, state_known, refine)
    if stop is not None:
        entry = next((e for e in recorded if e and _same_drain(node, e)), None)
        if (
            stop.outcome is Outcome.ALREADY_OURS
            and entry is not None
            and entry.get("confirmed") is False
        ):
            return confirm(client, node, settings)  # a drain of ours the breaker never re-counted
        return stop
    try:
        nodes = client.list_nodes()
    except SlurmError as exc:
        return Enacted(
            Outcome.CANNOT_COUNT,
            "circuit breaker cannot count (%s): not draining %s" % (exc, node_name),
            node,
        )
    me = _find(nodes, node_name)
    if me is None:
        return Enacted(
            Outcome.CANNOT_COUNT,
            "node %s is missing from the node list: not draining" % node_name,
            node,
        )
    stop = _before_drain(
        me, prefix, settings, recorded, state_known, refine
    )  # re-read right before draining
    if stop is not None:
        return stop
    state = breaker.assess(nodes, node_name, reason, prefix, settings["breaker"], _now(client))
    if state.tripped:
        return Enacted(
            Outcome.BREAKER,
            "circuit breaker: %s; not draining %s" % (state.describe(), node_name),
            me,
            state,
            node_drained=me.is_drained,
        )
    original = me.reason if me.is_drained else None  # refining Slurm's own "Prolog error"
    try:
        client.drain(node_name, reason)
    except SlurmError as exc:
        return slurm_failure(exc, "drain not confirmed: ")
    drained_at = time.monotonic()
    outcome = Outcome.REFINED if original is not None else Outcome.DRAINED
    _settle(client, max(0.0, SETTLE_S - (time.monotonic() - drained_at)))
    return _rank(client, node_name, reason, outcome, original, settings)


def _settle(client: SlurmClient, seconds: float) -> None:
    """Wait for slurmctld's clock to pass our drain's second. A test backend that simulates that clock
    (tests/test_drainer.py MemoryBackend.advance_clock) advances it instead."""
    advance = getattr(client.backend, "advance_clock", None)
    if advance is not None:
        advance(seconds)
    else:
        _sleep(seconds)


def _now(client: SlurmClient) -> float:
    """This host's clock: where the breaker's windows end before our drain (after it, our drain's own
    reason time does). A test backend that simulates slurmctld's clock gives that instead."""
    clock = getattr(client.backend, "controller_time", None)
    return float(clock()) if clock is not None else time.time()


def _rank(
    client: SlurmClient,
    node_name: str,
    reason: str,
    outcome: Outcome,
    original: Optional[str],
    settings: Mapping[str, Mapping[str, Any]],
) -> Enacted:
    """Step 5: re-count and rank; undo our own drain when it ranks at or past the limit."""
    prefix = settings["drain"]["reason_prefix"]
    try:
        nodes = client.list_nodes()
    except SlurmError as exc:
        return Enacted(
            outcome,
            "%s %s: %s -- but the circuit breaker's re-count failed (%s); it is redone by "
            "the next run of slurm-hooks on this node" % (outcome.value, node_name, reason, exc),
            node_drained=True,
            confirmed=False,
        )
    mine = _find(nodes, node_name)
    if mine is None or not mine.is_drained or mine.reason != reason:
        now = mine.reason if mine is not None else "node missing"
        return Enacted(
            Outcome.FOREIGN_DRAIN if mine is not None and mine.is_drained else Outcome.NOT_DRAINED,
            "our drain of %s was changed by someone else right after it (now: %s)"
            % (node_name, now),
            mine,
            node_drained=bool(mine and mine.is_drained),
        )
    rank = breaker.assess(
        nodes,
        node_name,
        reason,
        prefix,
        settings["breaker"],
        _now(client),
        policy.drain_key(mine.reason_epoch, node_name),
    )
    if rank.tripped:
        return _undo(client, mine, original, rank, outcome)
    return Enacted(
        outcome, "%s %s: %s" % (outcome.value, node_name, reason), mine, rank, node_drained=True
    )


def _undo(
    client: SlurmClient,
    mine: NodeInfo,
    original: Optional[str],
    rank: policy.BreakerState,
    outcome: Outcome,
) -> Enacted:
    """Lift our own drain (or put Slurm's own reason back on a refined one): we rank past the limit.

    The node is read once more right before: an admin who drained (or resumed and drained again)
    after our re-count owns the node now, and RESUME would put it back into service. Only a reason
    that is still exactly ours -- text and Slurm's reason time -- is undone. Slurm has no
    compare-and-set, so what stays open is the gap between this read and the RESUME reaching
    slurmctld (docs/slurm.md, "What no compare-and-set leaves open")."""
    try:
        now = client.show_node(mine.name)
    except SlurmError as exc:
        return Enacted(
            outcome,
            "circuit breaker: %s, but %s could not be read again before undoing our drain (%s); "
            "it is redone by the next run of slurm-hooks on this node"
            % (rank.describe(), mine.name, exc),
            mine,
            rank,
            node_drained=True,
            confirmed=False,
        )
    if not (now.is_drained and now.reason == mine.reason and now.reason_time == mine.reason_time):
        return Enacted(
            Outcome.FOREIGN_DRAIN if now.is_drained else Outcome.NOT_DRAINED,
            "circuit breaker: %s; our drain of %s was changed by someone else before the undo "
            "(now: %s, %s): left as is"
            % (rank.describe(), mine.name, now.state_string, now.reason),
            now,
            rank,
            node_drained=now.is_drained,
        )
    try:
        if original is None:
            client.resume(mine.name, UNDONE_REASON)
        else:
            client.drain(mine.name, original)
    except SlurmError as exc:
        return Enacted(
            outcome,
            "circuit breaker: %s, but undoing our drain of %s failed (%s); it is redone by the "
            "next run of slurm-hooks on this node" % (rank.describe(), mine.name, exc),
            mine,
            rank,
            node_drained=True,
            confirmed=False,
        )
    return Enacted(
        Outcome.BREAKER_UNDONE,
        "circuit breaker: %s; our drain of %s was undone%s"
        % (
            rank.describe(),
            mine.name,
            "" if original is None else " (Slurm's reason %r put back)" % original,
        ),
        mine,
        rank,
        node_drained=original is not None,
    )


def confirm(
    client: SlurmClient, node: NodeInfo, settings: Mapping[str, Mapping[str, Any]]
) -> Enacted:
    """Redo the breaker's ranking for a drain of ours that was never re-counted (step 5 failed)."""
    outcome = _rank(client, node.name, node.reason or "", Outcome.ALREADY_OURS, None, settings)
    if outcome.outcome is Outcome.ALREADY_OURS:
        return Enacted(
            Outcome.ALREADY_OURS,
            "already drained by us (circuit breaker re-count done): %s" % node.reason,
            outcome.node,
            outcome.breaker,
            node_drained=True,
            confirmed=outcome.confirmed,
        )
    return outcome


def drain_manual(
    client: SlurmClient,
    node_name: str,
    text: str,
    settings: Mapping[str, Mapping[str, Any]],
    force: bool = False,
) -> Enacted:
    """`slurm-hooks drain --reason TEXT`: an admin's deliberate drain, 'slurm-hooks: manual: TEXT'.

    Same etiquette as an automatic drain (skip states and FAIL refused; someone else's drain only
    replaced with `force`); one of our own drains is replaced without force. The circuit breaker does
    not apply (it guards against automatic mass drains) and such drains are never resumed automatically.
    Acts in observe mode too (observe only quiets the hooks).
    """
    drain_settings = settings["drain"]
    prefix = drain_settings["reason_prefix"]
    reason = policy.format_manual_reason(text, prefix, int(drain_settings["max_reason_length"]))
    try:
        node = client.show_node(node_name)
        why = _leave_alone(node, drain_settings["skip_states"])
        if why:
            return Enacted(
                Outcome.SKIPPED_STATE,
                "node %s is %s: not draining" % (node_name, why),
                node,
                node_drained=node.is_drained,
            )
        if node.is_drained and not policy.is_ours(node.reason, prefix) and not force:
            return Enacted(
                Outcome.FOREIGN_DRAIN,
                "%s is already drained by someone else (%s); use --force to "
                "replace" % (node_name, node.reason),
                node,
                node_drained=True,
            )
        client.drain(node_name, reason)
    except SlurmError as exc:
        return slurm_failure(exc)
    return Enacted(Outcome.DRAINED, "drained %s: %s" % (node_name, reason), node, node_drained=True)


# ---------------------------------------------------------------------------------------------
# resume


def resume(
    client: SlurmClient,
    node_name: str,
    settings: Mapping[str, Mapping[str, Any]],
    force: bool = False,
    by_admin: bool = False,
    expected: Optional[Mapping[str, Any]] = None,
) -> Enacted:
    """Resume node_name if (and only if) the drain is provably ours; `force` is for an admin at the keyboard.

    expected: the local record of our drain (hooks): Slurm's current reason must be exactly that one,
    reason time included -- read right before resuming. Without it only an admin (by_admin) resumes,
    and only drains carrying our prefix (automatic or manual) unless force. FAIL is someone else's.
    Observe mode only logs the health mode's automatic resumes; an admin's `slurm-hooks resume`
    (by_admin) acts, because it is how nodes drained before a switch back to observe come back.
    """
    prefix = settings["drain"]["reason_prefix"]
    if settings["general"]["mode"] == "observe" and not (force or by_admin):
        return Enacted(Outcome.OBSERVE, "observe mode: would resume %s" % node_name)
    try:
        node = client.show_node(node_name)
        if not node.is_drained:
            return Enacted(
                Outcome.NOT_DRAINED,
                "node %s is not drained (%s)" % (node_name, node.state_string),
                node,
            )
        if expected is not None:
            ours = _same_drain(node, expected)
        else:
            ours = by_admin and policy.read_reason(node.reason, prefix).kind in ("auto", "manual")
        if node.is_failed and not force:
            return Enacted(
                Outcome.NOT_OURS,
                "node %s is FAIL (set by someone else): not resuming" % node_name,
                node,
            )
        if not ours and not force:
            return Enacted(
                Outcome.NOT_OURS,
                "drain reason is not ours (%s%s): not resuming"
                % (node.reason, " [%s]" % node.reason_time if node.reason_time else ""),
                node,
            )
        why = _leave_alone(node, settings["drain"]["skip_states"])
        if why and not force:
            return Enacted(
                Outcome.SKIPPED_STATE,
                "node %s is %s: not resuming" % (node_name, why),
                node,
                node_drained=True,
            )
        marker = (
            ADMIN_RESUMED_REASON
            if by_admin or expected is None
            else RESUMED_REASON % ",".join(expected.get("checks") or ["the checks"])
        )
        client.resume(node_name, _resume_reason(marker, prefix))
    except InvalidNodeState as exc:  # resumed by someone else between our read and our request
        return Enacted(Outcome.NOT_DRAINED, "node %s is no longer drained: %s" % (node_name, exc))
    except SlurmError as exc:
        return slurm_failure(exc)
    return Enacted(Outcome.RESUMED, "resumed %s (was: %s)" % (node_name, node.reason), node)


def _is_lemon(reason: Optional[str], prefix: str) -> bool:
    from .lemon import is_lemon

    return is_lemon(reason, prefix)


def _resume_reason(marker: str, prefix: str) -> Optional[str]:
    """The reason sent with RESUME: what Slurm may keep afterwards instead of our drain reason. Never
    one that reads as ours (then nothing is sent)."""
    text = policy.sanitize(marker)[:200]
    return None if not text or policy.is_ours(text, prefix) else text


def node_status(client, name: str, config, local: bool, local_state) -> dict:
    """What Slurm says about one node and whose drain it is, in words that do not overclaim."""
    prefix = config.get("drain", "reason_prefix")
    info = {"node": name}
    try:
        node = client.show_node(name)
    except SlurmError as exc:
        what = (
            "Slurm client unusable"
            if isinstance(exc, SlurmClientMissing)
            else "slurmctld unreachable"
            if isinstance(exc, SlurmUnavailable)
            else "Slurm refused"
        )
        info["error"] = "%s: %s" % (what, exc)
        return info
    owner = policy.read_reason(node.reason, prefix)
    info.update(
        state=node.state_string,
        reason=node.reason,
        reason_time_utc=node.reason_time,
        reason_user=node.reason_user,
    )
    if not node.is_drained:
        info["drain"] = "not drained"
    elif owner.kind == "manual":
        info["drain"] = "slurm-hooks, by an admin (slurm-hooks drain): never resumed automatically"
    elif owner.automatic and node.is_failed:
        info["drain"] = "someone else's: the node is FAIL"
    elif owner.automatic:
        checks = ",".join(owner.checks) + ("" if owner.complete else ",...")
        info["drain"] = "slurm-hooks, automatic (%s)" % checks
        if _is_lemon(node.reason, prefix):
            info["drain"] += ": a lemon held for RMA, never resumed automatically"
        if local:
            record = (local_state[0] or {}).get("drained") if local_state[1] else None
            if not local_state[1]:
                info["local_record"] = "lost: the next health run rebuilds it from this reason"
            elif (
                record
                and record.get("reason") == node.reason
                and (not record.get("reason_time") or record.get("reason_time") == node.reason_time)
            ):
                info["local_record"] = "matches: resumed once %s pass" % ",".join(
                    record.get("checks") or []
                )
            else:
                info["local_record"] = (
                    "does not match: not provably ours (re-reasoned, or a reason Slurm kept "
                    "from an earlier drain); never resumed automatically"
                )
            if record and record.get("repair"):
                info["repair"] = record[
                    "repair"
                ]  # the remediation ladder's steps (slurm/repair.py)
    else:
        info["drain"] = "someone else's"
    info["drained_by_us"] = bool(
        node.is_drained and owner.kind in ("auto", "manual") and not node.is_failed
    )
    return info
