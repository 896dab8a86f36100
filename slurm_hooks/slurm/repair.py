"""The remediation ladder: after a drain of ours, repair through Slurm, opt-in per rung ([repair]).

Rungs, tried in this order for the worst finding's action (Result.action):
 - reset-gpu (action reset-gpu, [repair] reset_gpu = true): `nvidia-smi -r -i N` for the GPU the
   reason leads with, only when Slurm shows no job on the node (not ALLOCATED, MIXED or COMPLETING)
   and no process holds any /dev/nvidiaN (/proc/*/fd, read under [general] root); else the next rung;
 - reboot (action reboot or reset-gpu, [repair] reboot = true): `scontrol reboot ASAP
   nextstate=<next_state> reason=<our reason> NODE`: slurmctld reboots the node once its jobs have
   ended (RebootProgram) and sets next_state after it. Slurm 22.05 accepts only DOWN or RESUME
   (nextstate=DRAIN: exit 1, no message; docs/slurm.md).
Never for a lemon (held for RMA), never past [repair] max_attempts within window_days on this node
(counted from the drain history, slurm/lemon.py), never in observe mode (logged as what it would do).
Every step is recorded with the drain (node-state.json, shown by `slurm-hooks status`) and in the
drain history.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..core.lazyre import lazy_compile
from ..result import Action
from .errors import SlurmError
from .node_state import NodeInfo

RESET_TIMEOUT_S = 15.0  # nvidia-smi -r takes seconds; a health run has 60 s in all
_NVIDIA_DEV = lazy_compile(r"/dev/nvidia\d+\Z")
_JOB_STATES = ("ALLOCATED", "MIXED")


def attempts(history: Sequence[Mapping[str, Any]], window_days: float, at: float) -> int:
    """Repairs made on this node within the window (each history entry records its rung)."""
    return sum(
        1
        for e in history
        if e.get("repair") in ("reboot", "reset-gpu")
        and at - float(e["time"]) < window_days * 86400
    )


def job_on(node: Optional[NodeInfo]) -> bool:
    """Slurm shows a job on the node (or cannot say: None counts as busy)."""
    return node is None or node.state in _JOB_STATES or "COMPLETING" in node.flags


def gpu_holders(root: str) -> List[str]:
    """'pid:/dev/nvidiaN' for every open descriptor of a GPU device under root's /proc (a process
    we cannot read counts as a holder only when its fd directory lists a GPU; unreadable ones are
    skipped: the job check above is the main guard)."""
    proc = os.path.join(root, "proc")
    held = []
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return ["/proc unreadable"]
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _NVIDIA_DEV.match(target):
                held.append("%s:%s" % (pid, target))
    return held


def choose(
    action: Action, gpu: Optional[int], node: Optional[NodeInfo], holders: Sequence[str], settings
) -> List[str]:
    """The rungs to try, in order, each with why the one before it was passed over: ['reset-gpu']
    or ['reboot'] or ['skip reset-gpu: ...', 'reboot'] or []."""
    rungs: List[str] = []
    if action is Action.RESET_GPU and settings["reset_gpu"]:
        why = (
            "no GPU named in the reason"
            if gpu is None
            else "a job runs on the node"
            if job_on(node)
            else "a process holds a GPU (%s)" % ", ".join(holders[:3])
            if holders
            else ""
        )
        if not why:
            return ["reset-gpu"]
        rungs.append("skip reset-gpu: %s" % why)
    if action in (Action.RESET_GPU, Action.REBOOT) and settings["reboot"]:
        rungs.append("reboot")
    return rungs


def reset_gpu(gpu: int, runner=None) -> str:
    """nvidia-smi -r -i N: '' when it worked, else why not."""
    argv = ["nvidia-smi", "-r", "-i", str(int(gpu))]
    try:
        done = (runner or subprocess.run)(
            argv, capture_output=True, text=True, timeout=RESET_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "%s: %s" % (" ".join(argv), exc)
    if done.returncode != 0:
        return "%s: exit %s: %s" % (
            " ".join(argv),
            done.returncode,
            (done.stdout + done.stderr)[-200:].strip(),
        )
    return ""


def run_ladder(
    client,
    name: str,
    reason: str,
    action: Action,
    gpu: Optional[int],
    node: Optional[NodeInfo],
    settings: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    at: float,
    observe: bool,
    root: str = "/",
    runner=None,
) -> List[Dict[str, Any]]:
    """Try the rungs for one drain; the steps taken, each {'time', 'rung', 'result'}."""
    if not (settings["reboot"] or settings["reset_gpu"]):
        return []
    made = attempts(history, float(settings["window_days"]), at)
    if made >= int(settings["max_attempts"]):
        return [
            {
                "time": at,
                "rung": "none",
                "result": "cap: %d repairs within %g d" % (made, settings["window_days"]),
            }
        ]
    holders = gpu_holders(root) if action is Action.RESET_GPU and settings["reset_gpu"] else []
    steps: List[Dict[str, Any]] = []
    for rung in choose(action, gpu, node, holders, settings):
        if rung.startswith("skip"):
            steps.append({"time": at, "rung": "reset-gpu", "result": rung})
            continue
        if observe:
            steps.append({"time": at, "rung": rung, "result": "observe: would %s" % rung})
            continue
        if rung == "reset-gpu":
            failed = reset_gpu(int(gpu), runner)  # choose() names reset-gpu only with a GPU
        else:
            try:
                client.reboot(name, reason, settings["next_state"])
                failed = ""
            except SlurmError as exc:
                failed = str(exc)
        steps.append(
            {
                "time": at,
                "rung": rung,
                "result": "failed: " + failed
                if failed
                else "done"
                if rung == "reset-gpu"
                else "requested",
            }
        )
        if not failed:
            break
    return steps


def made(steps: Sequence[Mapping[str, Any]]) -> str:
    """The rung that was carried out ('' when none), for the drain history's count."""
    for step in steps:
        if step.get("result") in ("done", "requested"):
            return str(step["rung"])
    return ""
