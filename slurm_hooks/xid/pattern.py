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
"""

from __future__ import annotations

import os
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
    window = float(settings["days"]) * 86400.0

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
        history, _why = run_isolated(work, config.get("deadline", "files"), "the Xid history")
    except OSError:
        history = None
    return judge(history or [], settings, now)
