"""Drain straggler suspects from the admin host: `slurm-hooks report --stragglers --drain` with [fleet] drain = true.

Each suspect node is drained through the shared drain library (drainer.drain: etiquette, circuit
breaker, observe mode) with an automatic reason of ours naming the pseudo-check fleet.straggler:

    slurm-hooks: fleet.straggler: throttle_frac.hw_slowdown 0.21 vs 0 of its job peers, 7 of its last 10 jobs,
    worst z 41 (job 4411) -> drain

Rules on top of the library's (docs/records.md "Acting on suspects"):
- only a node that is not drained at all: Slurm's own "Prolog error" is not refined (that drain is
  the node's hooks' to explain), an admin's or another slurm-hooks drain is left as it is;
- only on evidence from at least [fleet] drain_min_users users (one user's jobs can make a node
  look slow on purpose), at most [fleet] max_drains_per_run nodes per run, costliest first (the others
  get a row saying so), and never on a [fleet] report_only figure;
- what clears a straggler drain is an admin: `slurm-hooks resume NODE` (or scontrol). A node's
  health run never resumes it: its own checks passing proves nothing about being slower than its
  peers (policy.FLEET_CHECK; hooks/recovery.py leaves it alone). After a straggler drain, only jobs that
  STARTED after it count against the node again, so a node an admin resumed is not drained again
  on the evidence it was drained for; that drain time is kept in <[paths] state_dir>/fleet-state.json
  on the admin host (with Slurm's reason and reason time: the proof a drain is ours).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..core import atomicio, locks, logs
from ..core.structs import Struct
from ..records.stragglers import METRIC_BY_NAME, Suspect, by_cost
from ..result import Action, Result, Status
from . import policy
from .policy import Outcome

STATE_NAME = "fleet-state.json"
_ALARMING = frozenset(
    {
        Outcome.BREAKER,
        Outcome.BREAKER_UNDONE,
        Outcome.SLURM_UNAVAILABLE,
        Outcome.SLURM_ERROR,
        Outcome.CANNOT_COUNT,
    }
)  # logged as errors: an admin should look
LOCK_TIMEOUT_S = 5.0
CLOCK_SLACK_S = 600.0  # a state time this far after now is still believed (clocks differ a little)


class FleetDrain(Struct):
    """What was done about one suspect node: the drainer's outcome value, or one of the fleet's own:
    disabled, report-only, too-little-evidence, waiting-after-reboot, state-corrupt,
    invalid-node-name, left-alone, fleet-budget-full, per-run-cap, not-attempted."""

    node: str
    metric: str
    outcome: str
    message: str

    def to_dict(self) -> Dict[str, str]:
        return {
            "node": self.node,
            "metric": self.metric,
            "outcome": self.outcome,
            "message": self.message,
        }


def reason_for(suspect: Suspect, prefix: str, max_length: int) -> str:
    """'slurm-hooks: fleet.straggler: <metric> <value> vs <median> of its job peers, ... -> drain' (bounded)."""
    mark, flag = suspect.evidence[-1]
    metric = METRIC_BY_NAME.get(suspect.metric)
    summary = (
        "%s %.4g vs %.4g of its job peers (%s is worse), %d of its last %d jobs, worst z %.0f (job %s)"
        % (
            suspect.metric,
            flag.value,
            flag.median,
            "higher" if metric is None or metric.worse > 0 else "lower",
            suspect.flagged,
            suspect.window,
            suspect.worst_z,
            mark.job,
        )
    )
    result = Result(policy.FLEET_CHECK, Status.FAIL, summary, action=Action.DRAIN)
    return policy.format_reason(result, prefix, min(max_length, policy.REASON_LIMIT))


def fresh(suspect: Suspect, since: Optional[float]) -> Tuple[int, int]:
    """(flagged jobs, distinct users) of the suspect's evidence from jobs that started after `since`."""
    marks = [mark for mark, _ in suspect.evidence if since is None or (mark.start or 0) > since]
    return len(marks), len({m.user for m in marks if m.user})


def choose(
    suspects: List[Suspect], fleet: Mapping[str, Any], state: Mapping[str, Any]
) -> Tuple[List[Suspect], List[FleetDrain]]:
    """The suspects worth draining: one per node (its worst figure), on fresh evidence from enough
    users, costliest first (stragglers.by_cost) (not yet cut to max_drains_per_run: nodes Slurm already holds come out first);
    and a row for each node left out for too little evidence."""
    drains = state.get("drains") or {}
    best: Dict[str, Suspect] = {}
    short: Dict[str, FleetDrain] = {}
    held = state.get("held") or {}
    now = time.time()
    for suspect in suspects:
        since = _moment((drains.get(suspect.node) or {}).get("time"), now)
        after = " since our drain of it"
        seen = _moment(held.get(suspect.node), now)
        if seen is not None and (since is None or seen > since):
            since, after = seen, " since Slurm held it (drained or down: a repair, perhaps)"
        flagged, users = fresh(suspect, since)
        if suspect.after_reboot == 0:  # rebooted and not flagged since: a repair, perhaps
            short.setdefault(
                suspect.node,
                FleetDrain(
                    suspect.node,
                    suspect.metric,
                    "waiting-after-reboot",
                    "rebooted after its %d flagged job(s) and not flagged since: a repair, "
                    "perhaps; drained only if a job after the reboot flags it again" % flagged,
                ),
            )
            continue
        if flagged < fleet["k"] or users < fleet["drain_min_users"]:
            short.setdefault(
                suspect.node,
                FleetDrain(
                    suspect.node,
                    suspect.metric,
                    "too-little-evidence",
                    "%d flagged job(s) of %d user(s)%s; draining takes k = %d jobs of "
                    "drain_min_users = %d users"
                    % (
                        flagged,
                        users,
                        after if since is not None else "",
                        fleet["k"],
                        fleet["drain_min_users"],
                    ),
                ),
            )
            continue
        if suspect.node not in best:
            best[suspect.node] = suspect
    rows = [row for node, row in sorted(short.items()) if node not in best]
    # by cost, as the report ranks them: a rate suspect's flag count covers the whole report
    # window (not m jobs), so ordering by flags let it, or a costless figure, take the only drain
    # ([fleet] max_drained) before a node losing a quarter of its jobs' time
    return sorted(best.values(), key=by_cost), rows


def _held(node) -> Optional[str]:
    """Why a node Slurm lists must not be drained now (None: it may): already drained, DOWN, FAIL."""
    if node.is_drained:
        return "already drained (%s)" % (node.reason or "no reason")
    if node.is_down or node.is_failed:
        return "%s (%s)" % (node.state_string, node.reason or "no reason")
    return None


def _checked(state: Any, path: str) -> Dict[str, Any]:
    """The state file's content, or ValueError naming what is wrong with it: JSON of another shape
    (a hand edit, another program's file) is as unusable as a corrupt one, and must stop the drains
    the same way instead of crashing the whole report."""
    if not isinstance(state, dict):
        raise ValueError("%s: not a JSON object" % path)
    for key in ("drains", "held"):
        table = state.get(key, {})
        if not isinstance(table, dict):
            raise ValueError("%s: %r is not an object of nodes" % (path, key))
        for node, entry in table.items():
            moment = entry.get("time") if key == "drains" and isinstance(entry, dict) else entry
            if key == "drains" and not isinstance(entry, dict):
                raise ValueError("%s: drains[%r] is not an object" % (path, node))
            if moment is not None and (type(moment) not in (int, float) or moment != moment):
                raise ValueError("%s: %s[%r] has no usable time: %r" % (path, key, node, moment))
    return state


def _clamp_future(state: Dict[str, Any], now: float) -> List[str]:
    """Bring every state time after now (+ CLOCK_SLACK_S) back to now, in place; the nodes changed.

    A drain or hold recorded while this host's clock ran ahead is still a drain or hold: dropping
    its time made all the old evidence count again, and a node an admin had resumed was drained
    again on it. Now is the earliest moment the clock can vouch for; once written back, the next
    runs count only jobs that started after it, as after any drain of ours."""
    changed = []
    for node, entry in sorted((state.get("drains") or {}).items()):
        moment = entry.get("time")
        if type(moment) in (int, float) and moment > now + CLOCK_SLACK_S:
            entry["time"] = now
            changed.append(node)
    held = state.get("held") or {}
    for node, moment in sorted(held.items()):
        if type(moment) in (int, float) and moment > now + CLOCK_SLACK_S:
            held[node] = now
            changed.append(node)
    return changed


def _moment(value: Any, now: float) -> Optional[float]:
    """A time from the state file that may be trusted as "since": a finite number not after now (a
    clock that ran ahead for one run must not keep a node from ever being drained; enact brings such
    a time back to now first, _clamp_future, so it is not lost either)."""
    if type(value) not in (int, float) or not -1e12 < value <= now + CLOCK_SLACK_S:
        return None
    return float(value)


def state_path(settings: Mapping[str, Mapping[str, Any]]) -> str:
    return os.path.join(settings["paths"]["state_dir"], STATE_NAME)


def enact(
    settings: Mapping[str, Mapping[str, Any]],
    suspects: List[Suspect],
    client=None,
    log: Optional[logging.Logger] = None,
) -> List[FleetDrain]:
    """Drain the chosen suspects (or say why not). One run at a time (a lock beside the state file)."""
    from . import drainer
    from .client import check_node_name
    from .errors import SlurmError

    log = log or logging.getLogger(logs.LOGGER_NAME)
    fleet = settings["fleet"]
    if not fleet["drain"]:
        return [
            FleetDrain(s.node, s.metric, "disabled", "[fleet] drain = false: reported only")
            for s in _one_per_node(suspects)
        ]
    suspects, rows = _drainable(suspects, fleet["report_only"])
    directory = settings["paths"]["state_dir"]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = state_path(settings)
    try:
        with locks.locked(path + ".lock", LOCK_TIMEOUT_S):
            try:
                state = _checked(atomicio.read_json(path, default={}), path)
            except (
                ValueError
            ) as exc:  # whose drains are ours is unknown: draining now could repeat one
                log.error(
                    logs.kv(event="fleet-state-corrupt", path=path, error=exc, decision="no-drain")
                )
                return rows + [
                    FleetDrain(s.node, s.metric, "state-corrupt", str(exc))
                    for s in _one_per_node(suspects)
                ]
            clamped = _clamp_future(state, time.time())
            if clamped:
                log.warning(
                    logs.kv(
                        event="fleet-state-time-ahead",
                        path=path,
                        nodes=",".join(clamped),
                        decision="set-to-now",
                    )
                )
            # The state is written before any drain: where it cannot be (a full or read-only
            # disk), a drain of ours would go unremembered, and after an admin's resume the next
            # run would drain the node again on the same evidence. OSError: no drain (below).
            atomicio.write_json_atomic(path, state)
            client = client or drainer.make_client(settings)
            rows.extend(_confirm_earlier(client, state, settings))
            have_row = {row.node for row in rows}  # one row per node
            chosen = []
            wanted, short = choose(suspects, fleet, state)
            rows.extend(row for row in short if row.node not in have_row)
            for suspect in wanted:
                if suspect.node in have_row:  # an earlier drain of ours, just re-counted
                    continue
                try:
                    check_node_name(
                        suspect.node
                    )  # a directory name: a hostlist or odd text never reaches Slurm
                    chosen.append(suspect)
                except ValueError as exc:
                    rows.append(
                        FleetDrain(suspect.node, suspect.metric, "invalid-node-name", str(exc))
                    )
            prefix, length = (
                settings["drain"]["reason_prefix"],
                settings["drain"]["max_reason_length"],
            )
            listed = _listing(client, suspects, drainer.slurm_budget(settings), state, prefix)
            if (
                chosen
            ):  # one listing: nodes Slurm already holds never take a place of max_drains_per_run
                chosen, ours = _not_held(listed, chosen, rows, prefix)
                room = max(0, fleet["max_drained"] - ours)
                rows.extend(
                    FleetDrain(
                        s.node,
                        s.metric,
                        "fleet-budget-full",
                        "%d node(s) already carry a fleet.straggler drain of ours ([fleet] "
                        "max_drained = %d): an admin clears those first"
                        % (ours, fleet["max_drained"]),
                    )
                    for s in chosen[room:]
                )
                chosen = chosen[:room]
            cap = fleet["max_drains_per_run"]
            rows.extend(
                FleetDrain(
                    s.node,
                    s.metric,
                    "per-run-cap",
                    "[fleet] max_drains_per_run = %d: worse suspects came first; the next run "
                    "looks again" % cap,
                )
                for s in chosen[cap:]
            )
            chosen = chosen[:cap]
            for suspect in chosen:
                reason = reason_for(suspect, prefix, length)
                if fleet["confirm_with"] == "qualify":  # proof before a drain (qualify/queue.py)
                    from ..qualify import queue

                    outcome, message = queue.offer(settings, suspect, reason, fresh)
                    rows.append(FleetDrain(suspect.node, suspect.metric, outcome, message))
                    continue
                client.set_budget(drainer.slurm_budget(settings))
                entry = (state.get("drains") or {}).get(suspect.node)
                try:
                    enacted = drainer.drain(
                        client, suspect.node, reason, settings, (entry,), True, refine=False
                    )
                except (
                    SlurmError
                ) as exc:  # typed errors become outcomes in drainer; this is a last resort
                    enacted = drainer.slurm_failure(exc)
                _remember(state, suspect, enacted, reason)
                rows.append(
                    FleetDrain(suspect.node, suspect.metric, enacted.outcome.value, enacted.message)
                )
                level = (
                    logging.WARNING
                    if enacted.outcome in (Outcome.DRAINED, Outcome.OBSERVE)
                    else logging.ERROR
                    if enacted.outcome in _ALARMING
                    else logging.INFO
                )
                log.log(
                    level,
                    logs.kv(
                        context="fleet",
                        event="straggler-drain",
                        node=suspect.node,
                        metric=suspect.metric,
                        outcome=enacted.outcome.value,
                        detail=enacted.message,
                    ),
                )
            atomicio.write_json_atomic(path, state)
    except OSError as exc:  # LockTimeout (another run), an unwritable state directory
        log.error(logs.kv(event="fleet-drain-skipped", path=path, error=exc))
        return rows + [
            FleetDrain(s.node, s.metric, "not-attempted", str(exc))
            for s in _one_per_node(suspects)
            if s.node not in {r.node for r in rows}
        ]
    return rows


def _drainable(
    suspects: List[Suspect], report_only: List[str]
) -> Tuple[List[Suspect], List[FleetDrain]]:
    """The suspects on figures that may drain, and a report-only row for each node suspected only
    on [fleet] report_only figures (foreign_cpu_frac by default: anyone's process outside Slurm's
    cgroups counts in it, so a user with a login could drain a node with it)."""
    drainable = [s for s in suspects if s.metric not in report_only]
    nodes = {s.node for s in drainable}
    rows = [
        FleetDrain(
            s.node,
            s.metric,
            "report-only",
            "[fleet] report_only names %s: reported, never drained for" % s.metric,
        )
        for s in _one_per_node([s for s in suspects if s.node not in nodes])
    ]
    return drainable, rows


def _confirm_earlier(
    client, state: Dict[str, Any], settings: Mapping[str, Mapping[str, Any]]
) -> List[FleetDrain]:
    """Redo the breaker's re-count of a drain of ours that never had it (slurmctld stopped answering
    right after the drain): as a node's next hook run does for its own drains (drainer.confirm)."""
    from . import drainer
    from .errors import SlurmError

    rows = []
    for name, entry in sorted((state.get("drains") or {}).items()):
        if not isinstance(entry, dict) or entry.get("confirmed") is not False:
            continue
        client.set_budget(drainer.slurm_budget(settings))
        try:
            node = client.show_node(name)
        except SlurmError as exc:
            rows.append(
                FleetDrain(
                    name,
                    str(entry.get("metric")),
                    drainer.slurm_failure(exc).outcome.value,
                    "breaker re-count of our earlier drain not done: %s" % exc,
                )
            )
            continue
        if not drainer._same_drain(
            node, entry
        ):  # resumed, or someone else's drain now: nothing to count
            entry["confirmed"] = True
            continue
        enacted = drainer.confirm(client, node, settings)
        entry["confirmed"] = enacted.confirmed
        rows.append(
            FleetDrain(name, str(entry.get("metric")), enacted.outcome.value, enacted.message)
        )
    return rows


def _listing(client, suspects: List[Suspect], budget: float, state: Dict[str, Any], prefix: str):
    """One node listing when there are suspects ({name: NodeInfo}, or the SlurmError), and the
    time in the state's "held" of every suspect Slurm holds now (drained by an admin or by its own
    checks, DOWN, FAIL), chosen or not: once resumed, only jobs that started later count against it
    (choose), as after a drain of ours. Without this, an admin who drained a suspect, repaired and
    resumed it saw it drained again by the next run, before it ran a job."""
    from .errors import SlurmError

    if not suspects:
        return {}
    client.set_budget(budget)
    try:
        listed = {node.name: node for node in client.list_nodes()}
    except SlurmError as exc:
        return exc
    now = time.time()
    for suspect in suspects:
        node = listed.get(suspect.node)
        if node is None or not _held(node) or _ours(node, prefix):
            continue  # a straggler drain of ours has its own time (state "drains")
        state.setdefault("held", {})[suspect.node] = now
    return listed


def _ours(node, prefix: str) -> bool:
    """A drain with a fleet.straggler reason of ours (the Reason can outlive a RESUME on 24.11 and
    25.11: only a drained node counts)."""
    return node.is_drained and policy.FLEET_CHECK in policy.read_reason(node.reason, prefix).checks


def _not_held(
    listed, chosen: List[Suspect], rows: List[FleetDrain], prefix: str
) -> Tuple[List[Suspect], int]:
    """The chosen suspects Slurm lists and does not already hold (a row for each of the others), and
    how many listed nodes carry a fleet.straggler drain of ours. When the node list could not be
    read (`listed` is the SlurmError), a row for every one and none is drained."""
    from . import drainer
    from .errors import SlurmError

    if isinstance(listed, SlurmError):
        failure = drainer.slurm_failure(listed, "cannot list the nodes: ")
        rows.extend(
            FleetDrain(s.node, s.metric, failure.outcome.value, failure.message) for s in chosen
        )
        return [], 0
    ours = sum(1 for node in listed.values() if _ours(node, prefix))
    free = []
    for suspect in chosen:
        node = listed.get(suspect.node)
        why = "not a node of this Slurm cluster" if node is None else _held(node)
        if why:
            rows.append(FleetDrain(suspect.node, suspect.metric, "left-alone", why))
        else:
            free.append(suspect)
    return free, ours


def _one_per_node(suspects: List[Suspect]) -> List[Suspect]:
    seen, out = set(), []
    for suspect in suspects:
        if suspect.node not in seen:
            seen.add(suspect.node)
            out.append(suspect)
    return out


def _remember(state: Dict[str, Any], suspect: Suspect, enacted, reason: str) -> None:
    """A drain that stands is recorded with Slurm's exact reason and reason time (the proof it is ours)."""
    if enacted.outcome not in (Outcome.DRAINED, Outcome.ALREADY_OURS):
        return
    drains = state.setdefault("drains", {})
    old = drains.get(suspect.node) or {}
    node = enacted.node
    if enacted.outcome is Outcome.ALREADY_OURS and old:
        return
    drains[suspect.node] = {
        "reason": node.reason if node is not None and node.reason else reason,
        "reason_time": node.reason_time if node is not None else None,
        "time": time.time(),
        "metric": suspect.metric,
        "confirmed": enacted.confirmed,
        "jobs": [mark.job for mark, _ in suspect.evidence],
    }
