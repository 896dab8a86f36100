"""Application Xids (13, 31, 43) repeating on one GPU across jobs and users (xid/pattern.py, tracker
27), through the hooks' flow with Slurm in memory. xid.events is stood in by a check that reports what
a file says, in the shape checks/xid.py gives (WARN blamed on the job, details.events with the kernel
log sequence numbers), with a real Xid 13 line as its text.
"""

from __future__ import annotations

import json

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.hooks import run_hook
from slurm_hooks.registry import Registry
from slurm_hooks.result import Blame, ExitCode, Result, Status
from slurm_hooks.slurm import lemon
from slurm_hooks.slurm.client import SlurmClient
from tests.doubles.memory_slurm import cluster

GPU = "gpu:3 0000:3b:00.0"
# a real Xid 13 line, as quoted in leptonai/gpud's docs (components/accelerator/nvidia/xid README)
TEXT = "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7"


@pytest.fixture
def site(tmp_path, monkeypatch):
    events = tmp_path / "events.json"
    events.write_text("[]")
    monkeypatch.setattr(lemon, "boot_id", lambda root: "boot-a")
    reg = Registry()

    @reg.check(name="xid.events", contexts=("prolog", "epilog", "health"), timeout=2)
    def xid_events(params):
        """stand-in"""
        seen = json.loads(events.read_text())
        if not seen:
            return Result("xid.events", Status.OK, "no Xid")
        listed = [
            {"code": code, "seq": seq, "pci": "0000:3b:00.0", "text": TEXT} for code, seq in seen
        ]
        return Result(
            "xid.events",
            Status.WARN,
            "Xid 13: " + TEXT,
            component=GPU,
            blame=Blame.JOB,
            details={"events": listed},
        )

    backend = cluster()

    def run(job, user, seen, context="epilog"):
        events.write_text(json.dumps(seen))
        config = validate(
            reg,
            {
                "general": {"mode": "enforce"},
                "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
                "records": {"enabled": False},
            },
        )
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_USER": user, "SLURMD_NODENAME": "node1"}
        return run_hook(context, reg, config, env, client=SlurmClient(backend))

    run.backend = backend
    run.registry = reg
    return run


def test_the_same_gpu_under_three_jobs_of_two_users_is_drained_with_the_evidence(site):
    assert site("101", "alice", [[13, 10]]).exit_code == ExitCode.OK
    # job 102 still sees job 101's Xid (unacknowledged until a reboot): only seq 20 is new
    assert site("102", "alice", [[13, 10], [43, 20]]).exit_code == ExitCode.OK
    out = site("103", "bob", [[13, 10], [43, 20], [13, 30]])
    node = site.backend.nodes["node1"]
    assert out.exit_code == ExitCode.NODE_BROKEN and node.is_drained, out.decision
    assert node.reason == (
        "sh:xid.pattern g3: gpu:3 0000:3b:00.0 Xid 13,43 in 3 jobs of 2 users within 7 d: "
        "jobs 101,102,103 -> drain"
    ), node.reason


def test_one_users_jobs_do_not(site):
    for job in ("201", "202", "203", "204"):
        assert site(job, "alice", [[13, int(job)]]).exit_code == ExitCode.OK  # one user
    assert not site.backend.nodes["node1"].is_drained
    assert site("205", "bob", [[13, 205]]).exit_code == ExitCode.NODE_BROKEN  # a second user


def test_prologs_and_health_runs_record_nothing(site):
    """A prolog sees the Xids of the job before (unacknowledged until a reboot): counting them
    would blame the new job; a health run has no job at all."""
    site("401", "alice", [[13, 1]])
    for job, user in (("402", "bob"), ("403", "carol"), ("404", "dave")):
        assert site(job, user, [[13, 1], [13, int(job)]], context="prolog").exit_code == ExitCode.OK
        assert site(job, user, [[13, 1], [13, int(job)]], context="health").exit_code == ExitCode.OK
    assert not site.backend.nodes["node1"].is_drained


def test_one_xid_seen_by_many_jobs_counts_once(site):
    for job, user in (("301", "bob"), ("302", "carol"), ("303", "dave")):
        # the same event (seq 7) reported by every later hook: one job's, not three
        assert site(job, user, [[31, 7]]).exit_code == ExitCode.OK
    assert not site.backend.nodes["node1"].is_drained


def test_a_failing_pattern_step_leaves_the_epilog_judged_by_its_checks(site, monkeypatch, capsys):
    """The pattern step is an addition to the epilog: its own bug (here: apply raises) is logged
    and the run's other findings still drain, as they would without it."""
    from slurm_hooks.xid import pattern

    @site.registry.check(name="gpu.fell_off", contexts=("epilog",), timeout=2)
    def fell_off(params):
        """stand-in: a GPU gone from the bus"""
        return Result("gpu.fell_off", Status.FAIL, "GPU 3 fell off the bus", component=GPU)

    def broken(*args, **kwargs):
        raise KeyError("seq")

    monkeypatch.setattr(pattern, "apply", broken)
    out = site("501", "alice", [[13, 1]])
    node = site.backend.nodes["node1"]
    assert out.exit_code == ExitCode.NODE_BROKEN and node.is_drained, out.decision
    assert "gpu.fell_off" in node.reason and "xid.pattern" not in node.reason, node.reason
    said = capsys.readouterr().err
    assert "event=xid-pattern-failed error=KeyError('seq')" in said, said
