"""The remediation ladder (slurm/repair.py, tracker 27): opt-in rungs after a drain of ours, with
Slurm in memory (tests/doubles/memory_slurm.py follows what 22.05 does with `scontrol reboot`,
measured in docs/slurm.md) and nvidia-smi replaced by a recording runner. The reboot request against
the real slurmctld: tests/test_repair_slurm.py.
"""

from __future__ import annotations

import os
import subprocess

from slurm_hooks.result import Action
from slurm_hooks.slurm import drainer, repair
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.node_state import NodeInfo
from tests import flow_rig
from tests.doubles.memory_slurm import cluster, settings

weeks = flow_rig.weeks  # fixtures: the hooks' flow with Slurm in memory, clock and boot injected
rig = flow_rig.rig
REASON = "sh:gpu.ecc g3: gpu:3 DBE -> reset-gpu"
IDLE = NodeInfo("node1", "IDLE", frozenset({"DRAIN"}))
BUSY = NodeInfo("node1", "MIXED", frozenset({"DRAIN"}))
AT = 1796256000.0


class Runner:
    def __init__(self, rc=0):
        self.argv, self.rc = [], rc

    def __call__(self, argv, **kw):
        self.argv.append(argv)
        return subprocess.CompletedProcess(argv, self.rc, "", "GPU reset failed" if self.rc else "")


def ladder(on=("reboot", "reset_gpu"), **extra):
    values = settings()["repair"]
    values.update({k: True for k in on}, **extra)
    return values


def run(
    backend, node, limits, history=(), observe=False, root="/nonexistent", action=Action.RESET_GPU
):
    runner = Runner()
    steps = repair.run_ladder(
        SlurmClient(backend),
        "node1",
        REASON,
        action,
        3,
        node,
        limits,
        history,
        AT,
        observe,
        root,
        runner,
    )
    return steps, runner


def test_reset_gpu_on_an_idle_node_with_no_gpu_holder(tmp_path):
    (tmp_path / "proc").mkdir()
    backend = cluster()
    steps, runner = run(backend, IDLE, ladder(), root=str(tmp_path))
    assert runner.argv == [["nvidia-smi", "-r", "-i", "3"]] and backend.reboots == []
    assert [(s["rung"], s["result"]) for s in steps] == [("reset-gpu", "done")]


def test_a_job_on_the_node_or_a_gpu_holder_falls_back_to_the_reboot(tmp_path):
    fd = tmp_path / "proc" / "4242" / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidia3", str(fd / "7"))  # a process holds GPU 3
    for node, why in (
        (BUSY, "a job runs on the node"),
        (IDLE, "a process holds a GPU (4242:/dev/nvidia3)"),
    ):
        backend = cluster()
        steps, runner = run(backend, node, ladder(), root=str(tmp_path))
        assert runner.argv == [], steps
        assert steps[0]["result"] == "skip reset-gpu: " + why, steps
        assert (steps[1]["rung"], steps[1]["result"]) == ("reboot", "requested")
        assert backend.reboots == [("node1", REASON, "DOWN")]


def test_off_by_default_observe_says_what_it_would_do_and_the_cap_holds():
    backend = cluster()
    assert run(backend, IDLE, settings()["repair"])[0] == [] and backend.log == []
    steps, runner = run(backend, BUSY, ladder(), observe=True)
    assert [s["result"] for s in steps] == [
        "skip reset-gpu: a job runs on the node",
        "observe: would reboot",
    ]
    assert backend.log == [] and runner.argv == []
    history = [{"time": AT - 86400 * d, "checks": ["gpu.ecc"], "repair": "reboot"} for d in (1, 3)]
    steps, runner = run(backend, BUSY, ladder(), history=history)
    assert steps[0]["result"] == "cap: 2 repairs within 7 d" and backend.log == []
    steps, _ = run(backend, BUSY, ladder(), history=history[:1])  # one in the window: one more
    assert steps[-1]["result"] == "requested"


def test_a_refused_reboot_is_recorded_not_hidden():
    backend = cluster()
    steps, _ = run(backend, BUSY, ladder(on=("reboot",), next_state="DRAIN"), action=Action.REBOOT)
    assert steps[0]["rung"] == "reboot" and steps[0]["result"].startswith("failed: scontrol reboot")


def test_the_hooks_reboot_through_slurm_record_it_and_keep_the_drain_ours(weeks):
    config = {"repair": {"reboot": True}}
    weeks.at(0)
    weeks.run("prolog", "node", **config)  # the demo check asks for a reboot
    assert weeks.backend.reboots == [
        ("node1", "sh:demo.gpu g0: gpu:0 GPU 0 fell off the bus -> reboot", "DOWN")
    ]
    record = weeks.state()["drained"]
    assert record["repair"][0]["result"] == "requested"
    assert record["reason"] == weeks.node().reason and record["reason"].endswith(" : reboot issued")
    assert record["reason_time"] == weeks.node().reason_time  # still provably ours
    # a lemon is never repaired
    shown = drainer.node_status(
        SlurmClient(weeks.backend), "node1", weeks.config(**config), True, (weeks.state(), True)
    )
    assert shown["repair"][0]["rung"] == "reboot" and shown["local_record"].startswith("matches")
    held = weeks.run("health", "ok", **config)  # the reboot is pending: the node is left alone
    assert held.enacted.outcome.value == "skipped-state" and weeks.node().is_drained, held.enacted
    for day in (1, 2):
        weeks.backend.nodes["node1"] = NodeInfo("node1", "IDLE")  # rebooted, resumed by an admin
        weeks.at(day)
        weeks.run("prolog", "node", **config)
    assert len(weeks.backend.reboots) == 2 and "lemon:" in weeks.node().reason
