"""Application-class Xids repeating on one GPU across jobs and users point at the GPU (tracker 27).

xid.events reports Xid 13, 31 and 43 (NVIDIA's catalog: the application's fault) as a WARN blamed on
the job: one job crashing its GPU context says nothing about the GPU. The same GPU doing it under
several jobs of several users does. An epilog that sees such Xids (its xid.events results, blame
JOB) records each new one -- (boot id, kernel log sequence number) says which are new: an
unacknowledged Xid is reported by every hook until a reboot -- with its job and user (the first
epilog to see an Xid is that of the job it happened in; hooks/flow.py calls this from epilogs only), in
`<[paths] state_dir>/xid-app-history.json` (bounded: XID_HISTORY_MAX entries, none older than
[xid_pattern] days). When one GPU's entries within `days` span `jobs` distinct jobs of `users`
distinct users, the run gets a FAIL `xid.pattern` result for that GPU, blamed on the node, whose
summary is the evidence ('Xid 13,43 in 3 jobs of 2 users within 7 d: jobs 101,102,103'); it drains
like any node-broken finding (breaker, observe mode, lemon rules). It is not a registered check, so
no health run proves it passing: an admin clears the drain. The happy path (no such Xid) reads and
writes nothing.

Xid 43 is also what a node's GPUs log when another node's fault kills a multi-node job and its
processes here are torn down (records/xid_lineup.py). Before a GPU is judged to fail, the jobs of
its Xid 43 entries are looked up in the records ([records] dir, shared by the nodes): a job whose
records, verified with the records key, show this node's Xids all following another node's earlier
cause (the line-up of `report --xids`) is a victim's, and its entries leave the count. Without a
key, a shared records directory, or this node's own record of the job, or when the lookup does not
finish within what is left of [deadline] files (a hung or huge records directory), nothing is
proven and every entry counts as before.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..result import Action, Blame, Result, Status

CHECK = "xid.pattern"
# NVIDIA's Xid catalog: 13 Graphics Engine Exception, 31 GPU memory page fault, 43 GPU stopped
# processing -- each usually the application's own fault
APP_XIDS = (13, 31, 43)
HISTORY_FILE = "xid-app-history.json"
XID_HISTORY_MAX = 256


def seen_events(results: Sequence[Result], xids: Sequence[int]) -> List[Tuple[str, Dict[str, Any]]]:
    """(component, event) for every application-class Xid in this run's xid.events results."""
    wanted = set(int(x) for x in xids)
    out = []
    for r in results:
        if r.check != "xid.events" or r.effective_blame is not Blame.JOB or not r.component:
            continue
        for event in r.details.get("events") or []:
            if isinstance(event, dict) and event.get("code") in wanted:
                out.append((r.component, event))
    return out


def add(
    history: List[Dict[str, Any]],
    seen: Sequence[Tuple[str, Dict[str, Any]]],
    boot: Optional[str],
    job: Optional[str],
    user: Optional[str],
    at: float,
) -> bool:
    """Append the events not in the history yet (by boot id and sequence number); True if any."""
    known = {(e.get("boot"), e.get("seq"), e.get("gpu")) for e in history}
    added = False
    for component, event in seen:
        key = (boot, event.get("seq"), component)
        if event.get("seq") is None or key in known:
            continue
        known.add(key)
        history.append(
            {
                "time": at,
                "boot": boot,
                "seq": event["seq"],
                "gpu": component,
                "xid": event["code"],
                "job": job,
                "user": user,
            }
        )
        added = True
    return added


def judge(
    history: Sequence[Mapping[str, Any]], settings: Mapping[str, Any], at: float
) -> List[Result]:
    """A FAIL xid.pattern result for every GPU whose recent entries span enough jobs and users."""
    window = float(settings["days"]) * 86400.0
    by_gpu: Dict[str, List[Mapping[str, Any]]] = {}
    for e in history:
        if at - float(e.get("time", 0)) < window and e.get("job"):
            by_gpu.setdefault(str(e.get("gpu")), []).append(e)
    results = []
    for gpu, entries in sorted(by_gpu.items()):
        jobs = sorted({str(e["job"]) for e in entries})
        users = {str(e.get("user")) for e in entries if e.get("user")}
        if len(jobs) < int(settings["jobs"]) or len(users) < int(settings["users"]):
            continue
        codes = ",".join(str(c) for c in sorted({int(e["xid"]) for e in entries}))
        summary = "Xid %s in %d jobs of %d users within %g d: jobs %s" % (
            codes,
            len(jobs),
            len(users),
            float(settings["days"]),
            ",".join(jobs[-6:]),
        )
        results.append(
            Result(
                CHECK,
                Status.FAIL,
                summary,
                component=gpu,
                action=Action.DRAIN,
                blame=Blame.NODE,
                details={"jobs": jobs, "users": len(users), "xids": codes},
            )
        )
    return results


def apply(config: Any, job: Any, results: Sequence[Result], now: float) -> List[Result]:
    """The xid.pattern results of this run (bounded file work; nothing without such Xids)."""
    settings = config.settings["xid_pattern"]
    seen = seen_events(results, APP_XIDS) if settings["enabled"] else []
    if not seen:
        return []
    from ..core.atomicio import read_json, write_json_atomic
    from ..core.isolation import run_isolated
    from ..slurm.lemon import boot_id

    path = os.path.join(config.get("paths", "state_dir"), HISTORY_FILE)
    boot = boot_id(config.get("general", "root"))
    node = job.node_name or os.uname().nodename.split(".")[0]  # as hooks.node_name names it
    window = float(settings["days"]) * 86400.0
    budget = float(config.get("deadline", "files"))
    started = time.monotonic()

    def work() -> List[Dict[str, Any]]:
        try:
            old = read_json(path, default=None)
        except (OSError, ValueError):
            old = None
        history = [
            e
            for e in (old if isinstance(old, list) else [])
            if isinstance(e, dict)
            and isinstance(e.get("time"), (int, float))
            and isinstance(e.get("xid"), int)
            and now - e["time"] < window
        ]
        if add(history, seen, boot, job.job_id, job.user, now):
            history = history[-XID_HISTORY_MAX:]
            try:
                write_json_atomic(path, history)
            except OSError:
                pass
        return history

    try:
        history, _why = run_isolated(work, budget, "the Xid history")
    except OSError:
        history = None
    history = history or []
    if judge(history, settings, now):  # the rare path: would drain; are some a victim's?
        history = without_victims(history, config, node, budget - (time.monotonic() - started))
    return judge(history, settings, now)


MAX_JOBS_LOOKED_UP = 8  # the newest jobs of Xid 43 entries looked up per judgement


def without_victims(
    history: List[Dict[str, Any]], config: Any, node: str, timeout: float
) -> List[Dict[str, Any]]:
    """The history less the Xid 43 entries of jobs whose verified records make this node a victim
    of another node's earlier fault (module docstring); the history itself when nothing is proven.
    The records may sit on a shared file system that stops answering or a directory too large to
    search in time: the lookup runs in a child of its own (of the hook's, not of the history's
    child: a grandchild stuck on a dead file system would hold that child's pipe open) for at most
    `timeout` seconds -- what the history's child left of [deadline] files -- and one that does
    not finish proves nothing: every entry counts, as it did before the lookup (a hang must never
    excuse a GPU; killing the history's child with it lost the whole pattern)."""
    from ..core.isolation import run_isolated
    from ..records.xid_lineup import CONSEQUENCE_XIDS

    newest: Dict[str, float] = {}
    for e in history:
        if e.get("job") and e.get("xid") in CONSEQUENCE_XIDS:
            newest[str(e["job"])] = max(newest.get(str(e["job"]), 0.0), float(e["time"]))
    jobs = sorted(newest, key=lambda j: newest[j])[-MAX_JOBS_LOOKED_UP:]
    cleared: set = set()
    if jobs and timeout > 0:
        found, _why = run_isolated(
            lambda: sorted(victim_jobs(config, node, jobs)), timeout, "the records lookup"
        )
        cleared = set(found) if isinstance(found, list) else set()
    return [
        e
        for e in history
        if not (str(e.get("job")) in cleared and e.get("xid") in CONSEQUENCE_XIDS)
    ]


def victim_jobs(config: Any, node: str, jobs: Sequence[str]) -> set:
    """The jobs among `jobs` in every attempt of which the records ([records] dir, verified with
    [records] key_file) excuse this node's Xids. This node's own records are read first: a job
    where it logged a cause of its own costs no more. Then, per attempt, one name is tried in each
    node directory (listed once): a few thousand stat calls on a large shared directory, within
    the [deadline] files budget the caller runs this in."""
    from ..records import signing, xid_lineup
    from ..records.names import record_name, restart_count
    from ..records.store import find_records

    verifier = signing.Verifier.from_file(config.settings.records.key_file)
    if verifier.key is None:
        return set()
    tolerance = config.settings.records.xid_clock_tolerance_s
    top = config.settings.records.dir
    node_dirs: Optional[List[str]] = None
    cleared = set()
    for job in jobs:
        try:
            own = [_verified_row(p, verifier) for p in find_records([top], job, node)]
        except (ValueError, OSError):
            continue
        if not own or None in own:  # a record of this node's that does not verify proves nothing
            continue
        entries = [xid_lineup.entries_of(row[2]) for row in own]
        if not all(e and xid_lineup.NodeXids(node, e).only_consequences() for e in entries):
            continue
        if node_dirs is None:
            node_dirs = _node_dirs(top, node)
        attempts = {restart_count(row[3]) for row in own}
        rows = [row[:3] for row in own]
        for attempt in sorted(attempts):
            name = record_name(job, attempt)
            for directory in node_dirs:
                row = _verified_row(os.path.join(directory, name), verifier)
                if row is not None:
                    rows.append(row[:3])
        lineups = xid_lineup.line_up_all(rows, tolerance, True)
        excused = {j.job for j in lineups if j.excused.get(node)}
        # every attempt of this node's is lined up and excused: an attempt where it logged Xids
        # alone (no other node's record) has no line-up, and nothing explains its Xids
        if all(row[0] in excused for row in own):
            cleared.add(job)
    return cleared


def _node_dirs(top: str, node: str) -> List[str]:
    try:
        with os.scandir(top) as entries:
            return sorted(
                e.path
                for e in entries
                if e.name != node and not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
            )
    except OSError:
        return []


def _verified_row(path: str, verifier: Any) -> Optional[Tuple[str, str, Dict[str, Any], Any]]:
    """(job label, writer's node, summary, job) of a record the key verifies; None otherwise."""
    from ..records import signing
    from ..records.fleet_report import checked_header
    from ..records.names import job_label

    try:
        record, line = checked_header(path)
    except ValueError:
        return None  # absent, unreadable, or not a record
    if verifier.line(line, path) != signing.VERIFIED:
        return None
    writer = os.path.basename(os.path.dirname(path))  # the name the MAC vouches for
    return job_label(record.get("job")), writer, record["summary"], record.get("job")
