"""`slurm-hooks qualify --node N` from an admin host: the qualification as a Slurm job on a node held
in a maintenance reservation of ours, its outcome enacted through the drain library.

1. Etiquette first (slurm/drainer.py): a FAIL node, a node in a state we leave alone or a node
   drained by someone else (an admin's drain is theirs) is refused, untouched.
2. `scontrol create reservation ReservationName=slurm-hooks-qualify-<node>-<time> Nodes=<node>
   StartTime=now Duration=<minutes> Users=<us> Flags=MAINT,IGNORE_JOBS`: no other job can land on
   the node from now on.
3. Our own drain is lifted (drainer.resume, by_admin: only a drain carrying our prefix): a drained
   node takes no job at all, not even in a reservation. The reservation keeps the node to us.
   A node DOWN after our own reboot (down_after_our_reboot) is drained first with its reason
   (DOWN+DRAIN), then lifted the same way (RESUME takes it to IDLE).
4. `sbatch --wait --reservation=R --nodelist=<node> --exclusive` of a script that execs
   `slurm-hooks qualify --json`: visible in squeue/sacct; its exit code is the verdict.
5. pass: the node stays resumed. Anything else (fail, not qualified, the job failed or was killed,
   we were interrupted): the node is drained again, 'sh:qualify: <test>: <figure>'. A node
   that was in service before (not drained) is drained through drainer.drain (breaker and all); one
   that was drained by us is put back as it was, whatever the breaker says (not a new drain).
6. The reservation is deleted on every path: finally, with SIGINT/SIGTERM turned into an exception
   so the finally runs; the reservation's Duration bounds what a crash of this host can hold.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..records.store import safe_name
from ..result import Action, Result, Status
from ..slurm import drainer, policy
from ..slurm.client import SlurmClient, client_env
from ..slurm.errors import SlurmError
from ..slurm.policy import Outcome
from . import tools
from .rebooted import down_after_our_reboot
from .reservation_names import (  # noqa: F401 (re-exported: through_slurm.reservation_name)
    LEVEL_MINUTES,
    RESERVATION_PREFIX,
    owner_host,
    reservation_name,
)

SLURM_CALL_S = 30.0
# the node flags our own reservation gives the node (MAINT, a reservation): not someone's state
OUR_HOLD = frozenset(("MAINTENANCE", "RESERVED"))
DRAIN_BACK_FAILED = "drain back FAILED"


class Interrupted(Exception):
    """SIGINT/SIGTERM during a qualification: the finally blocks still run."""


def _on_signal(signum, _frame):
    raise Interrupted("interrupted by %s" % signal.Signals(signum).name)


def _slurm(
    argv: Sequence[str], env: Dict[str, str], timeout_s: float = SLURM_CALL_S
) -> tools.ToolRun:
    return tools.run(list(argv), timeout_s, env)


def qualify_node(
    client: SlurmClient,
    node: str,
    level: str,
    settings: Mapping[str, Mapping[str, Any]],
    command: List[str],
    work_dir: str,
    env: Optional[Dict[str, str]] = None,
    confirm: Optional[Callable[[Dict[str, Any]], str]] = None,
) -> Dict[str, Any]:
    """Qualify one node through Slurm; a dict of what happened (verdict, reason, enacted, job).
    With `confirm` (qualify/due.py: a straggler suspect in service), the node must be in service
    and idle; it is held by the reservation alone (no drain to lift) and confirm(out) enacts the
    verdict; an interrupted run leaves it in service as it was."""
    safe_name(node, "node name")  # ValueError: it names a file below work_dir
    env = client_env(env)
    prefix = settings["drain"]["reason_prefix"]
    out: Dict[str, Any] = {
        "node": node,
        "level": level,
        "verdict": "not qualified",
        "slurm_calls": 0,
    }
    try:
        info = client.show_node(node)
    except SlurmError as exc:
        out["reason"] = "cannot read %s from Slurm: %s" % (node, exc)
        return out
    out["slurm_calls"] += 1
    rebooted = confirm is None and down_after_our_reboot(info, prefix)
    held = without_our_hold(settings, rebooted)
    refused = why_not(info, held, prefix, rebooted) if confirm is None else why_not_idle(info, held)
    if refused:
        out["reason"] = "refused: %s is %s" % (node, refused)
        return out
    out["stale_reservations_deleted"], foreign, live = _sweep(node, env, out)
    if live:  # another run of ours (another host, another admin) holds it: not ours to take
        out["reason"] = "refused: %s is being qualified by %s" % (node, live)
        return out
    if foreign:
        out["reason"] = "refused: %s is in the reservation %s of someone else" % (node, foreign)
        return out
    name = reservation_name(node, level=level)
    previous = (
        {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if threading.current_thread() is threading.main_thread()  # signal() only works there
        else {}
    )
    created = resumed = enacted = False
    try:
        run = _slurm(
            [
                "scontrol",
                "create",
                "reservation",
                "ReservationName=" + name,
                "Nodes=" + node,
                "StartTime=now",
                "Duration=%d" % LEVEL_MINUTES[level],
                "Users=" + _user(),
                "Flags=MAINT,IGNORE_JOBS",
            ],
            env,
        )
        out["slurm_calls"] += 1
        if run.rc != 0:
            out["reason"] = "could not hold %s: %s" % (node, run.tail(2))
            return out
        created = True
        out["reservation"] = name
        if rebooted and not _drain_for_the_job(client, info, out):
            return out
        if confirm is None:
            lifted = drainer.resume(client, node, held, by_admin=True)
            out["slurm_calls"] += 2
            if lifted.outcome is not Outcome.RESUMED:
                out["reason"] = "could not lift our drain for the job: %s" % lifted.message
                return out
            resumed = True
        job = _run_job(name, node, level, command, work_dir, env)
        out["slurm_calls"] += 1
        out.update(job)
        if confirm is not None:
            out["enacted"] = confirm(out)
        elif out["verdict"] == "pass":
            out["enacted"] = "resumed"
        else:
            out["enacted"] = _drain_back(client, node, out, prefix, settings)
            out["slurm_calls"] += 1
        enacted = True
        return out
    except Interrupted as exc:
        out["verdict"], out["reason"] = "not qualified", str(exc)
        return out
    finally:
        try:
            if resumed and not enacted:  # interrupted between our resume and the verdict
                out["enacted"] = _drain_back(client, node, out, prefix, settings)
            if created and str(out.get("enacted", "")).startswith(DRAIN_BACK_FAILED):
                # deleting it would put a node we could not drain back in service: it holds the
                # node until the sweep (our pid gone, or past its bound) drains it, then deletes it
                out["reservation_deleted"] = False
                out["reservation_kept"] = "holds the node until the sweep drains it"
            elif created:
                out["reservation_deleted"] = _delete_reservation(name, env, out)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def why_not(
    info, settings: Mapping[str, Mapping[str, Any]], prefix: str, rebooted: bool = False
) -> Optional[str]:
    """Why this node may not be qualified now (None: it may), as every drain of ours decides it
    (drainer's leave-alone rule: FAIL, a skip state such as DOWN, a state we do not know), then:
    only a node drained by us (an admin's drain is theirs) whose jobs have ended (a reservation
    with IGNORE_JOBS would otherwise wait for them while holding the node). `rebooted`: the node
    is DOWN after our reboot (down_after_our_reboot; settings without DOWN): not drained yet."""
    leave_alone = drainer.leave_alone(info, settings["drain"]["skip_states"])
    if leave_alone:
        return leave_alone
    if info.is_not_responding:  # no slurmd answers: the job would wait for it, holding the node
        return "not responding (%s)" % info.state_string
    if rebooted:
        return None
    if not info.is_drained:
        return "in service (drain it first: slurm-hooks drain --node %s --reason ...)" % info.name
    if not policy.is_ours(info.reason, prefix):
        return "drained by someone else (%s)" % info.reason
    if info.is_draining:
        return "still running jobs (%s): qualify it once they end" % info.state_string
    return None


def without_our_hold(
    settings: Mapping[str, Mapping[str, Any]], rebooted: bool = False
) -> Dict[str, Any]:
    """The settings with the flags our own reservation gives the node (OUR_HOLD) taken out of
    [drain] skip_states: while we hold the node, MAINT is ours, not a state to respect. With
    `rebooted` (down_after_our_reboot) DOWN too: that DOWN is our repair's, ours to lift."""
    ours = OUR_HOLD | {"DOWN"} if rebooted else OUR_HOLD
    held = dict(settings, drain=dict(settings["drain"]))
    held["drain"]["skip_states"] = [
        s for s in settings["drain"]["skip_states"] if s.upper() not in ours
    ]
    return held


def _drain_for_the_job(client, info, out: Dict[str, Any]) -> bool:
    """DOWN after our reboot -> DOWN+DRAIN with the same reason (still out of service, still due
    if we stop here), so that drainer.resume lifts it as any drain of ours: Slurm's RESUME takes
    a DOWN+DRAIN node to IDLE (22.05, tests/test_qualify_due_slurm.py), inside our reservation."""
    if info.is_drained:
        return True
    try:
        # read again right before: an admin's DOWN set since our first read must not be overwritten
        now = client.show_node(info.name)
        out["slurm_calls"] += 1
        if (now.reason, now.reason_time, now.flags) != (info.reason, info.reason_time, info.flags):
            out["reason"] = "refused: %s changed since it was read (%s: %s)" % (
                info.name,
                now.state_string,
                now.reason,
            )
            return False
        out["slurm_calls"] += 1
        client.drain(info.name, info.reason.rstrip())
    except (SlurmError, ValueError) as exc:
        out["reason"] = "could not drain %s (DOWN after our reboot) for the job: %s" % (
            info.name,
            exc,
        )
        return False
    return True


def why_not_idle(info, settings: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """For a suspect to confirm: why it may not be qualified now (None: it may): as why_not, but
    the node must be in service (a drain is someone's decision already) and idle."""
    leave_alone = drainer.leave_alone(info, settings["drain"]["skip_states"])
    if leave_alone:
        return leave_alone
    if info.is_not_responding:  # no slurmd answers: the job would wait for it, holding the node
        return "not responding (%s)" % info.state_string
    if info.is_drained:
        return "drained (%s): not a suspect to confirm now" % (info.reason or "no reason")
    if info.state in ("ALLOCATED", "MIXED") or "COMPLETING" in info.flags:
        return "running jobs (%s): qualified when idle" % info.state_string
    return None


def _sweep(node: str, env: Dict[str, str], out: Dict[str, Any]) -> Tuple[List[str], str, str]:
    """Delete reservations of ours for this node left by a qualification that died with its host
    (SIGKILL, power). Safe here: the node is drained by us, and a qualification in progress would
    have lifted that drain (a second `qualify --node` of a node in progress is refused before this).
    Also the name of an active reservation of someone else that holds the node ('' if none): an
    admin's maintenance is theirs, as their drain is (the node's MAINT flag alone cannot tell
    theirs from ours). And the name of a reservation of ours whose run may still be going
    (sweep.why_stale: its owner on another host, or alive here, within its bound): never deleted
    (that would scancel its job), the node refused."""
    from ..hw.host import HostError
    from ..slurm.gres import expand_hostlist
    from .reservation_names import parse_name, why_stale

    now, here = time.time(), owner_host()

    run = _slurm(["scontrol", "-o", "show", "reservation"], env)
    out["slurm_calls"] += 1
    ours = re.compile(
        r"%s%s-\d{8}T\d{6}Z(\+\S+)?$" % (re.escape(RESERVATION_PREFIX), re.escape(node))
    )
    stale, foreign, live = [], "", ""
    for line in run.output.splitlines():
        fields = dict(re.findall(r"(?:^|\s)(ReservationName|Nodes|State)=(\S*)", line))
        name = fields.get("ReservationName", "")
        if ours.match(name):
            parsed = parse_name(name)
            if parsed is not None and why_stale(parsed, now, here) is None:
                live = live or name
            else:
                stale.append(name)
        elif name and not foreign and fields.get("State") == "ACTIVE":
            try:
                if node in expand_hostlist(fields.get("Nodes", ""), "reservation " + name):
                    foreign = name
            except HostError:  # a node list we cannot read: not known to hold it
                pass
    if live:
        return [], foreign, live
    return [name for name in stale if _delete_reservation(name, env, out)], foreign, live


def _delete_reservation(name: str, env: Dict[str, str], out: Dict[str, Any]) -> bool:
    """Delete our reservation; a job of ours still in it (we were interrupted during sbatch --wait)
    is cancelled first, since Slurm refuses to delete a reservation with a running job."""
    for attempt in range(10):
        gone = _slurm(["scontrol", "delete", "ReservationName=" + name], env)
        out["slurm_calls"] += 1
        if gone.rc == 0:
            return True
        if attempt == 0:
            _slurm(["scancel", "--reservation=" + name], env)
            out["slurm_calls"] += 1
        time.sleep(1.0)
    return False


def _write_new(path: str, text: str, mode: int) -> None:
    """Replace path with text, never through a symlink someone left there (we run as root)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _read_ours(path: str, limit: int = 1 << 20) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit).decode("utf-8", "replace")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _run_job(name, node, level, command, work_dir, env) -> Dict[str, Any]:
    script = os.path.join(work_dir, "qualify-%s.sh" % node)
    line = " ".join(shlex.quote(a) for a in command + ["--level", level, "--json"])
    _write_new(script, "#!/bin/sh\nexec %s\n" % line, 0o700)  # the only shell: sbatch's script
    output = os.path.join(work_dir, "qualify-%s.out" % node)
    errors = output[: -len(".out")] + ".err"
    for earlier in (output, errors):  # an earlier run's pass must never be read as this job's
        try:
            os.unlink(earlier)
        except FileNotFoundError:
            pass
    minutes = LEVEL_MINUTES[level]
    run = _slurm(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "--job-name=slurm-hooks-qualify",
            "--reservation=" + name,
            "--nodelist=" + node,
            # all CPUs and every GRES of the node (sbatch(1) of 22.05 and 25.11: an exclusive job
            # is allocated all GRES, so ConstrainDevices shows the job every GPU), and all its
            # memory: the tools' pinned buffers must not meet a cgroup's default memory limit
            "--exclusive",
            "--mem=0",
            "--chdir=" + work_dir,  # not the admin's directory (the job's Python runs with -I too)
            "--time=%d" % minutes,
            "--output=" + output,
            "--error=" + errors,  # warnings apart from the JSON
            script,
        ],
        env,
        timeout_s=minutes * 60 + 120,
    )
    job: Dict[str, Any] = {
        "job_id": run.output.strip().split(";")[0].splitlines()[0] if run.output.strip() else None,
        "job_rc": run.rc,
    }
    text = _read_ours(output)
    start = text.find("{")
    try:
        record = json.loads(text[start:]) if start != -1 else None
    except ValueError:
        record = None
    if isinstance(record, dict) and record.get("verdict") in ("pass", "fail", "not qualified"):
        job["verdict"], job["reason"] = record["verdict"], str(record.get("reason", ""))
        # a pass only with the job's exit code 0 (sbatch --wait gives the job's; a job that never
        # ran exits 0 there too, but then printed nothing: its earlier output was removed above)
        if job["verdict"] == "pass" and run.rc != 0:
            job["verdict"] = "not qualified"
            job["reason"] = "the job printed a pass but %s" % run.how_it_ended()
    else:
        job["verdict"] = "not qualified"
        job["reason"] = "the qualification job printed no result (%s): %s" % (
            run.how_it_ended(),
            (text.strip().splitlines() or [run.tail(2)])[-1][:200],
        )
    return job


def _drain_back(client, node, out, prefix, settings) -> str:
    """Put our drain back with the qualification's reason. Not a new drain (the node was drained by
    us when we began): the breaker's count is unchanged, so it is not asked; done while the
    reservation still holds the node, so no job lands in between."""
    result = Result(
        "qualify", Status.FAIL, out.get("reason") or out["verdict"], action=Action.DRAIN
    )
    reason = policy.format_reason(result, prefix, int(settings["drain"]["max_reason_length"]))
    try:
        client.drain(node, reason)
    except SlurmError as exc:
        return "%s (%s): the node is in service unqualified" % (DRAIN_BACK_FAILED, exc)
    return "drained: %s" % reason
