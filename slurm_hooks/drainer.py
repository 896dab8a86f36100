"""Carry out a DRAIN decision (or a resume) through Slurm, with etiquette and the circuit breaker.

Order for a drain: read the node (one call) -> leave it alone if it is in a state we do not handle
or drained by someone else -> count nodes drained by us (one call) -> drain (one call). So a drain
costs at most three Slurm calls, and the happy path (no drain) costs none. Every Slurm error is
typed (slurm.SlurmUnavailable, NodeNotFound, SlurmCommandError) and becomes an Outcome, not a crash.
"""
from __future__ import annotations

import enum
from typing import Any, Mapping, Optional

from . import policy
from .slurm import NodeInfo, SlurmClient, SlurmError, SlurmUnavailable
from .structs import Struct


class Outcome(enum.Enum):
    DRAINED = "drained"  # we set DRAIN with our reason
    REFINED = "refined"  # replaced Slurm's bare "Prolog error" with our reason
    ALREADY_OURS = "already-drained-by-us"
    FOREIGN_DRAIN = "foreign-drain-kept"  # someone else's drain: untouched
    SKIPPED_STATE = "skipped-state"  # DOWN, rebooting, powered down...: untouched
    BREAKER = "breaker-tripped"  # too many nodes drained by us: not drained
    OBSERVE = "observe"  # observe mode: logged only
    SLURM_UNAVAILABLE = "slurm-unavailable"  # could not reach slurmctld (record kept locally)
    SLURM_ERROR = "slurm-error"
    RESUMED = "resumed"
    NOT_OURS = "not-ours"  # resume refused: the drain is not ours
    NOT_DRAINED = "not-drained"
    STILL_FAILING = "still-failing"


class Enacted(Struct):
    outcome: Outcome
    message: str
    node: Optional[NodeInfo] = None
    breaker: Optional[policy.BreakerState] = None


def make_client(settings: Mapping[str, Mapping[str, Any]]) -> SlurmClient:
    drain = settings["drain"]
    return SlurmClient(preferred=drain["backend"], timeout=drain["timeout"], attempts=drain["attempts"])


def drain(client: SlurmClient, node_name: str, reason: str, settings: Mapping[str, Mapping[str, Any]]) -> Enacted:
    """Drain node_name with reason unless etiquette or the breaker says no."""
    drain_settings, breaker = settings["drain"], settings["breaker"]
    prefix = drain_settings["reason_prefix"]
    if settings["general"]["mode"] == "observe":
        return Enacted(Outcome.OBSERVE, "observe mode: would drain %s: %s" % (node_name, reason))
    try:
        node = client.show_node(node_name)
        blocking = policy.blocking_state(node.flags, node.state, drain_settings["skip_states"])
        if blocking:
            return Enacted(Outcome.SKIPPED_STATE, "node %s is %s: not draining" % (node_name, blocking), node)
        refine = False
        if node.is_drained:
            if policy.is_ours(node.reason, prefix):
                return Enacted(Outcome.ALREADY_OURS, "already drained by us: %s" % node.reason, node)
            if not policy.is_refinable(node.reason):
                return Enacted(Outcome.FOREIGN_DRAIN, "drained by someone else (%s): left as is" % node.reason, node)
            refine = True
        state = policy.breaker_state(((n.name, n.is_drained, n.reason) for n in client.list_nodes()),
                                     node_name, prefix, breaker["max_percent"], breaker["min_nodes"])
        if state.tripped:
            return Enacted(Outcome.BREAKER, "circuit breaker: %s; not draining %s" % (state.describe(), node_name),
                           node, state)
        client.drain(node_name, reason)
    except SlurmUnavailable as exc:
        return Enacted(Outcome.SLURM_UNAVAILABLE, "slurmctld unreachable: %s" % exc)
    except SlurmError as exc:
        return Enacted(Outcome.SLURM_ERROR, "Slurm refused: %s" % exc)
    outcome = Outcome.REFINED if refine else Outcome.DRAINED
    return Enacted(outcome, "%s %s: %s" % (outcome.value, node_name, reason), node, state)


def resume(client: SlurmClient, node_name: str, settings: Mapping[str, Mapping[str, Any]],
           force: bool = False, by_admin: bool = False) -> Enacted:
    """Resume node_name if (and only if) the drain is ours; `force` is for an admin at the keyboard.

    Observe mode only logs the health mode's automatic resumes; an admin's `slurm-hooks resume`
    (by_admin) acts, because it is how nodes drained before a switch back to observe come back.
    """
    prefix = settings["drain"]["reason_prefix"]
    if settings["general"]["mode"] == "observe" and not (force or by_admin):
        return Enacted(Outcome.OBSERVE, "observe mode: would resume %s" % node_name)
    try:
        node = client.show_node(node_name)
        if not (node.is_drained):
            return Enacted(Outcome.NOT_DRAINED, "node %s is not drained (%s)" % (node_name, node.state_string), node)
        if not policy.is_ours(node.reason, prefix) and not force:
            return Enacted(Outcome.NOT_OURS, "drain reason is not ours (%s): not resuming" % node.reason, node)
        blocking = policy.blocking_state(node.flags, node.state, settings["drain"]["skip_states"])
        if blocking and not force:
            return Enacted(Outcome.SKIPPED_STATE, "node %s is %s: not resuming" % (node_name, blocking), node)
        client.resume(node_name)
    except SlurmUnavailable as exc:
        return Enacted(Outcome.SLURM_UNAVAILABLE, "slurmctld unreachable: %s" % exc)
    except SlurmError as exc:
        return Enacted(Outcome.SLURM_ERROR, "Slurm refused: %s" % exc)
    return Enacted(Outcome.RESUMED, "resumed %s (was: %s)" % (node_name, node.reason), node)
