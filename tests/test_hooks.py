"""prolog/epilog/health flows (hooks.run_hook) with checks driven by a file, and Slurm in memory."""
from __future__ import annotations

import json
import os

import pytest
from test_drainer import REASON, cluster

from slurm_hooks.config import validate
from slurm_hooks.drainer import Outcome
from slurm_hooks.hooks import EXIT_NODE_BROKEN, main_hook, run_hook
from slurm_hooks.registry import Registry
from slurm_hooks.result import Action, Blame, Result, Status
from slurm_hooks.slurm import NodeInfo, SlurmClient

JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_JOB_GPUS": "0,1"}


@pytest.fixture
def setup(tmp_path):
    """A registry whose one check reads its verdict from a file the test writes (the check runs in a child)."""
    verdict = tmp_path / "verdict"
    verdict.write_text("ok")
    reg = Registry()

    @reg.check(name="demo.gpu", contexts=("prolog", "epilog", "health"), timeout=2)
    def demo(params):
        """demo"""
        what = verdict.read_text().strip()
        if what == "node":
            return Result("demo.gpu", Status.FAIL, "row-remap pending", component="gpu:3 0000:3b:00.0",
                          action=Action.RESET_GPU)
        if what == "job":
            return Result("demo.gpu", Status.FAIL, "job asked for a GPU that is not there", blame=Blame.JOB)
        if what == "crash":
            os.abort()
        if what == "hang":
            import time
            time.sleep(60)
        return Result("demo.gpu", Status.OK, "fine")

    def config(**sections):
        data = {"paths": {"state_dir": str(tmp_path / "state"), "log_file": str(tmp_path / "log" / "hooks.log"),
                          "syslog": False},
                "records": {"dir": str(tmp_path / "jobs")},
                "deadline": {"prolog": 1.0, "health": 1.0, "epilog": 1.0}}
        for key, value in sections.items():
            data.setdefault(key, {}).update(value)
        return validate(reg, data)

    return reg, config, verdict, tmp_path


def test_healthy_prolog_makes_no_slurm_call(setup):
    reg, config, verdict, _ = setup
    backend = cluster()
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert outcome.exit_code == 0 and outcome.slurm_calls == 0 and backend.calls == 0
    assert outcome.report.job.gpus == (0, 1)


def test_node_broken_prolog_drains_then_exits_1(setup):
    reg, config, verdict, tmp = setup
    verdict.write_text("node")
    backend = cluster()
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.DRAINED and outcome.exit_code == EXIT_NODE_BROKEN
    assert backend.nodes["node1"].reason == REASON.replace("gpu.memory", "demo.gpu")
    state = json.loads((tmp / "state" / "node-state.json").read_text())
    assert state["drained"]["checks"] == ["demo.gpu"] and state["drained"]["job"] == "42"
    log = (tmp / "log" / "hooks.log").read_text()
    assert "decision=drain" in log and "outcome=drained" in log and "job=42" in log


def test_job_broken_prolog_never_drains(setup):
    reg, config, verdict, _ = setup
    verdict.write_text("job")
    backend = cluster()
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert outcome.exit_code == 0 and backend.calls == 0 and outcome.decision.blame is Blame.JOB


def test_crash_in_check_process_is_contained(setup):
    reg, config, verdict, _ = setup
    verdict.write_text("crash")
    backend = cluster()
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    result = outcome.report.results()[0]
    assert result.status is Status.UNKNOWN and "signal 6 (SIGABRT)" in result.summary
    assert outcome.exit_code == 0 and backend.calls == 0  # alert by default
    outcome = run_hook("prolog", reg, config(drain={"on_timeout": "drain"}), JOB_ENV, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.DRAINED and outcome.exit_code == EXIT_NODE_BROKEN


def test_hang_is_bounded_by_deadline(setup):
    import time
    reg, config, verdict, _ = setup
    verdict.write_text("hang")
    started = time.monotonic()
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(cluster()))
    assert time.monotonic() - started < 1.0 + 1.0 + 0.5
    assert outcome.report.results()[0].details["timed_out"] and outcome.exit_code == 0


def test_slurm_down_keeps_a_pending_record_and_health_delivers_it(setup):
    reg, config, verdict, tmp = setup
    verdict.write_text("node")
    backend = cluster()
    backend.down = True
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.SLURM_UNAVAILABLE and outcome.exit_code == EXIT_NODE_BROKEN
    state = json.loads((tmp / "state" / "node-state.json").read_text())
    assert state["pending"]["reason"].startswith("slurm-hooks: demo.gpu:")
    backend.down = False
    outcome = run_hook("health", reg, config(), {"SLURMD_NODENAME": "node1"}, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.DRAINED and backend.nodes["node1"].is_drained


def test_health_resumes_only_what_we_drained(setup):
    reg, config, verdict, tmp = setup
    verdict.write_text("node")
    backend = cluster()
    run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert backend.nodes["node1"].is_drained
    env = {"SLURMD_NODENAME": "node1"}
    outcome = run_hook("health", reg, config(), env, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.ALREADY_OURS and backend.nodes["node1"].is_drained
    verdict.write_text("ok")
    outcome = run_hook("health", reg, config(), env, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.RESUMED and not backend.nodes["node1"].is_drained
    # an admin drain on a healthy node: the next health run neither resumes nor re-reasons it
    backend.nodes["node1"] = NodeInfo("node1", "IDLE", frozenset({"DRAIN"}), "admin: BIOS update")
    before = backend.calls
    outcome = run_hook("health", reg, config(), env, client=SlurmClient(backend))
    assert outcome.enacted is None and backend.calls == before
    assert backend.nodes["node1"].reason == "admin: BIOS update"


def test_observe_mode_drains_nothing_and_exits_0(setup):
    reg, config, verdict, _ = setup
    verdict.write_text("node")
    backend = cluster()
    outcome = run_hook("prolog", reg, config(general={"mode": "observe"}), JOB_ENV, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.OBSERVE and outcome.exit_code == 0 and backend.calls == 0


def test_hostile_environment_and_opt_out(setup):
    reg, config, verdict, _ = setup
    verdict.write_text("node")
    backend = cluster()
    bad = dict(JOB_ENV, SLURM_JOB_GPUS="0;reboot")
    assert run_hook("prolog", reg, config(), bad, client=SlurmClient(backend)).exit_code == 0
    opt = dict(JOB_ENV, SLURM_JOB_EXTRA="slurm_hooks=skip")
    assert run_hook("prolog", reg, config(), opt, client=SlurmClient(backend)).exit_code == EXIT_NODE_BROKEN  # off by default
    backend = cluster()
    out = run_hook("prolog", reg, config(drain={"allow_job_opt_out": True}), opt, client=SlurmClient(backend))
    assert out.exit_code == 0 and backend.calls == 0


def test_broken_config_fails_open(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    bad = tmp_path / "config.toml"
    bad.write_text("[checks.\"gpu.nope\"]\n")
    assert main_hook("prolog", str(bad), JOB_ENV) == 0
    assert "failing open" in capsys.readouterr().err


def test_prolog_then_epilog_leaves_a_job_record(setup):
    reg, config, verdict, tmp = setup
    backend = cluster()
    run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    assert (tmp / "state" / "snapshots" / "42.json").exists()
    run_hook("epilog", reg, config(), JOB_ENV, client=SlurmClient(backend))
    record = json.loads((tmp / "jobs" / "node1" / "42.json").read_text())
    assert record["job"]["id"] == "42" and record["job"]["user"] == "alice"
    assert record["prolog_snapshot"] != "missing"
    assert not (tmp / "state" / "snapshots" / "42.json").exists()  # consumed by the epilog


def test_decisions_reach_syslog_with_their_priority(monkeypatch):
    import logging
    import syslog

    from slurm_hooks.logs import SyslogHandler

    sent = []
    monkeypatch.setattr(syslog, "openlog", lambda *args: sent.append(("open",) + args))
    monkeypatch.setattr(syslog, "syslog", lambda priority, message: sent.append((priority, message)))
    logger = logging.getLogger("test.syslog")
    logger.addHandler(SyslogHandler())
    logger.setLevel("INFO")
    logger.critical("decision=drain")
    logger.info("decision=pass")
    assert sent[0] == ("open", "slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)
    assert sent[1:] == [(syslog.LOG_CRIT, "decision=drain"), (syslog.LOG_INFO, "decision=pass")]
