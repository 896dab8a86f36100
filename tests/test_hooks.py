"""prolog/epilog/health flows (hooks.run_hook) with checks driven by a file, and Slurm in memory."""

from __future__ import annotations

import json
import os

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.hooks import main_hook, run_hook
from slurm_hooks.registry import Registry
from slurm_hooks.result import Action, Blame, ExitCode, Result, Status
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.drainer import Outcome
from slurm_hooks.slurm.node_state import NodeInfo
from tests.doubles.memory_slurm import REASON, cluster
from tests.helpers import DEMO_PROLOG_SCRIPT, abort_on_purpose, enforcing

JOB_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_USER": "alice",
    "SLURMD_NODENAME": "node1",
    "SLURM_JOB_GPUS": "0,1",
}


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
            return Result(
                "demo.gpu",
                Status.FAIL,
                "row-remap pending",
                component="gpu:3 0000:3b:00.0",
                action=Action.RESET_GPU,
            )
        if what == "job":
            return Result(
                "demo.gpu", Status.FAIL, "job asked for a GPU that is not there", blame=Blame.JOB
            )
        if what == "crash":
            abort_on_purpose()
        if what == "hang":
            import time

            time.sleep(60)
        return Result("demo.gpu", Status.OK, "fine")

    def config(**sections):
        data = {
            "paths": {
                "state_dir": str(tmp_path / "state"),
                "log_file": str(tmp_path / "log" / "hooks.log"),
                "syslog": False,
            },
            "records": {"dir": str(tmp_path / "jobs")},
            "deadline": {"prolog": 1.0, "health": 1.0, "epilog": 1.0},
        }
        for key, value in sections.items():
            data.setdefault(key, {}).update(value)
        return validate(reg, enforcing(data))

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
    assert outcome.enacted.outcome is Outcome.DRAINED and outcome.exit_code == ExitCode.NODE_BROKEN
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
    outcome = run_hook(
        "prolog", reg, config(drain={"on_timeout": "drain"}), JOB_ENV, client=SlurmClient(backend)
    )
    assert outcome.enacted.outcome is Outcome.DRAINED and outcome.exit_code == ExitCode.NODE_BROKEN


@pytest.mark.slow
def test_crashing_on_purpose_prints_no_fatal_error_dump(tmp_path):
    """The deliberate crashes used to print pytest's faulthandler thread dump ("Fatal Python error:
    Aborted" and every thread's stack) straight into the CI log, though the tests passed. Every test
    crashes through tests.helpers.abort_on_purpose, and the crashing tests run clean."""
    import re
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name != "helpers.py":
            with open(os.path.join(here, name)) as handle:
                assert not re.search(r"\bos\.abort\(\)", handle.read()), (
                    "%s: use tests.helpers.abort_on_purpose()" % name
                )
    crashing = [
        os.path.join(here, "test_hooks.py") + "::test_crash_in_check_process_is_contained",
        os.path.join(here, "test_drain_flow.py")
        + "::test_unknown_or_timeout_keeps_the_drain[crash]",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + crashing,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "Fatal Python error" not in proc.stdout + proc.stderr


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
    # not drained: exit 0 (the job runs) so that slurmctld does not drain it with "Prolog error" instead,
    # behind the circuit breaker's back; the pending record is retried by the health run
    assert outcome.enacted.outcome is Outcome.SLURM_UNAVAILABLE and outcome.exit_code == 0
    state = json.loads((tmp / "state" / "node-state.json").read_text())
    assert state["pending"]["reason"].startswith("sh:demo.gpu g3:")
    backend.down = False
    outcome = run_hook(
        "health", reg, config(), {"SLURMD_NODENAME": "node1"}, client=SlurmClient(backend)
    )
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
    outcome = run_hook(
        "prolog", reg, config(general={"mode": "observe"}), JOB_ENV, client=SlurmClient(backend)
    )
    assert (
        outcome.enacted.outcome is Outcome.OBSERVE and outcome.exit_code == 0 and backend.calls == 0
    )


def test_hostile_environment_and_opt_out(setup):
    reg, config, verdict, _ = setup
    verdict.write_text("node")
    backend = cluster()
    bad = dict(JOB_ENV, SLURM_JOB_GPUS="0;reboot")
    assert run_hook("prolog", reg, config(), bad, client=SlurmClient(backend)).exit_code == 0
    opt = dict(JOB_ENV, SLURM_JOB_EXTRA="slurm_hooks=skip")
    assert (
        run_hook("prolog", reg, config(), opt, client=SlurmClient(backend)).exit_code
        == ExitCode.NODE_BROKEN
    )  # off by default
    backend = cluster()
    out = run_hook(
        "prolog", reg, config(drain={"allow_job_opt_out": True}), opt, client=SlurmClient(backend)
    )
    assert out.exit_code == 0 and backend.calls == 0


@pytest.mark.parametrize(
    "broken",
    [
        '[checks."gpu.nope"]\n',  # an unknown check
        "[deadline]\nprolog = inf\n",  # used to crash `check` and make every prolog fail open with a traceback only
        "[deadline]\nprolog = nan\n",
        "[deadline]\nprolog = -1\n",
        "[breaker]\nmax_percent = 500\n",
        "[drain]\nattempts = 0\n",
        '[drain]\nreason_prefix = "slurm \\"hooks\\":"\n',  # the reason cleaner drops the quotes: unrecognisable
        "[drain]\nmax_reason_length = 8\n",
        '[checks."xid.events"]\noverrides = ["79=BROKEN:rma"]\n',
        "this is not TOML",
    ],
)
def test_broken_config_fails_open_with_one_critical_line_and_a_metric(
    tmp_path, monkeypatch, capsys, broken
):
    """Issue 14 section 2: a refused configuration lets the job run (exit 0), and says so once, CRITICAL, in the
    log file and syslog (where the [paths] of the broken file still say, if they are valid on their own), with
    slurm_hooks_config_error 1 in the metrics; no traceback."""
    import syslog as real_syslog

    from slurm_hooks.core import logs

    sent = []
    monkeypatch.setattr(real_syslog, "syslog", lambda *args: sent.append(args))
    monkeypatch.setattr(
        logs, "SYSLOG_SOCKET", str(tmp_path)
    )  # exists: this machine may have no /dev/log
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    log, prom = tmp_path / "log" / "hooks.log", tmp_path / "prom"
    log.parent.mkdir()  # as on an installed node (the package makes /var/log/slurm-hooks)
    prom.mkdir()  # and node_exporter's package its textfile directory (a missing one is logged)
    bad = tmp_path / "config.toml"
    paths = (
        '[paths]\nlog_file = "%s"\nstate_dir = "%s"\nsyslog = true\n[metrics]\ntextfile_dir = "%s"\n'
        % (log, tmp_path / "state", prom)
    )
    if "TOML" in broken:  # the main file does not parse: the [paths] of a valid drop-in still count
        (tmp_path / "conf.d").mkdir()
        (tmp_path / "conf.d" / "10-paths.toml").write_text(paths)
        bad.write_text(broken)
    else:
        bad.write_text(paths + broken)
    assert main_hook("prolog", str(bad), JOB_ENV) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "failing open" in err
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and " CRITICAL " in lines[0], lines
    assert (
        "context=prolog" in lines[0] and "job=42" in lines[0] and "decision=fail-open" in lines[0]
    )
    assert "event=config-error" in lines[0] and "ConfigError" in lines[0]
    assert [p for p, text in sent if "event=config-error" in text] == [real_syslog.LOG_CRIT]
    assert "slurm_hooks_config_error 1.0" in (prom / "slurm_hooks.prom").read_text()


@pytest.mark.parametrize("user", ["CORP\\alice", "jos\u00e9", "x" * 80])
def test_an_unusual_user_name_never_skips_the_checks(setup, user):
    """Issue 14: these names made job_from_env refuse the job and every prolog fail open unchecked."""
    reg, config, verdict, tmp = setup
    verdict.write_text("node")
    backend = cluster()
    outcome = run_hook(
        "prolog", reg, config(), dict(JOB_ENV, SLURM_JOB_USER=user), client=SlurmClient(backend)
    )
    assert (
        outcome.report is not None and outcome.enacted.outcome is Outcome.DRAINED
    )  # the checks ran and decided
    line = [
        entry
        for entry in (tmp / "log" / "hooks.log").read_text().splitlines()
        if "decision=drain" in entry
    ][0]
    assert "user=%s " % user.replace("\\", "\\\\") in line


def test_decision_log_escapes_what_a_user_can_put_in_it(setup, monkeypatch):
    """A NUL made syslog(3) raise and the decision line was lost from journald; control characters and bidi
    overrides made the line read differently from what it holds. One line, escaped, in both places."""
    import syslog as real_syslog

    from slurm_hooks.core import logs

    sent = []

    def strict_syslog(priority, message):  # what CPython's syslog.syslog does with these
        if "\x00" in message:
            raise ValueError("embedded null character")
        message.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
        sent.append(message)

    monkeypatch.setattr(real_syslog, "syslog", strict_syslog)
    monkeypatch.setattr(real_syslog, "openlog", lambda *args: None)
    reg, config, verdict, tmp = setup
    monkeypatch.setattr(logs, "SYSLOG_SOCKET", str(tmp))
    user = "eve\x00\x1b[2J\u202eexe.gnp\udcff\nNodeName=x decision=pass"
    outcome = run_hook(
        "prolog",
        reg,
        config(paths={"syslog": True}),
        dict(JOB_ENV, SLURM_JOB_USER=user),
        client=SlurmClient(cluster()),
    )
    assert outcome.report is not None
    [line] = [
        entry
        for entry in (tmp / "log" / "hooks.log").read_text().splitlines()
        if "context=prolog" in entry
    ]
    assert 'user="eve\\x00\\x1b[2J\\u202eexe.gnp\\udcff NodeName=x decision=pass"' in line, line
    assert line.count("decision=") == 2  # ours, and the quoted text inside the user's value
    assert (
        len(sent) == 1 and "\\x00" in sent[0] and "\x00" not in sent[0] and "\u202e" not in sent[0]
    )


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


def test_what_the_check_process_logs_reaches_the_log_file(setup):
    """The check process is forked before the hook sets its logger up (that overlaps the checks):
    a problem it logs, here the start snapshot it cannot write, still reaches the log file."""
    reg, config, verdict, tmp = setup
    (tmp / "state").mkdir()
    (tmp / "state" / "snapshots").write_text("a file where the snapshot directory should be")
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(cluster()))
    assert outcome.exit_code == 0
    log = (tmp / "log" / "hooks.log").read_text()
    assert "event=snapshot-not-written job=42" in log, log
    assert "context=prolog job=42" in log


def test_decisions_reach_syslog_with_their_priority(monkeypatch):
    import logging
    import syslog

    from slurm_hooks.core.logs import SyslogHandler

    sent = []
    monkeypatch.setattr(syslog, "openlog", lambda *args: sent.append(("open",) + args))
    monkeypatch.setattr(
        syslog, "syslog", lambda priority, message: sent.append((priority, message))
    )
    logger = logging.getLogger("test.syslog")
    logger.addHandler(SyslogHandler())
    logger.setLevel("INFO")
    logger.critical("decision=drain")
    logger.info("decision=pass")
    assert sent[0] == ("open", "slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)
    assert sent[1:] == [(syslog.LOG_CRIT, "decision=drain"), (syslog.LOG_INFO, "decision=pass")]


def test_the_exit_code_never_depends_on_the_steps_after_the_decision(setup, monkeypatch):
    """A drained node must exit 10 even when nothing can be forked any more for the file steps (EAGAIN):
    the decision is made first, the lost steps are logged with their paths."""
    import errno as errnos

    from slurm_hooks.core import isolation

    reg, config, verdict, tmp = setup
    verdict.write_text("node")

    def no_fork(*args, **kwargs):
        raise BlockingIOError(errnos.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(isolation, "run_steps", no_fork)
    outcome = run_hook("prolog", reg, config(), JOB_ENV, client=SlurmClient(cluster()))
    assert outcome.exit_code == ExitCode.NODE_BROKEN and outcome.enacted.outcome is Outcome.DRAINED
    log = (tmp / "log" / "hooks.log").read_text()
    assert (
        "event=step-abandoned step=state path=%s state=not-started"
        % (tmp / "state" / "node-state.json")
        in log
    )


def test_a_healthy_prolog_loads_neither_the_state_nor_the_drain_modules(tmp_path):
    """The happy path loads only what it runs (README, Layout: hooks/): the state file's module,
    the enactment and recovery modules, the node lock, lemon and repair are imported only when a run
    drains, resumes or reads node-state.json. A fresh interpreter, so no other test has loaded them."""
    import subprocess
    import sys

    code = (
        DEMO_PROLOG_SCRIPT
        + """
outcome = run_hook("prolog", reg, config, env)
print(json.dumps([outcome.exit_code, sorted(m for m in sys.modules if m.startswith("slurm_hooks"))]))
"""
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    exit_code, loaded = json.loads(out.strip().splitlines()[-1])
    assert exit_code == ExitCode.OK
    assert "slurm_hooks.hooks.bounded" in loaded  # it did run the checks through the package
    unwanted = {
        "slurm_hooks.hooks.state",
        "slurm_hooks.hooks.enactment",
        "slurm_hooks.hooks.recovery",
        "slurm_hooks.slurm.nodelock",
        "slurm_hooks.slurm.lemon",
        "slurm_hooks.slurm.repair",
        # round 8: the steps after the decision import them only with a metrics textfile or a
        # dcgm-exporter mapping directory configured (the prolog's tail, which the job waits for)
        "slurm_hooks.records.metrics",
        "slurm_hooks.records.dcgm",
    }  # (slurm.drainer is loaded anyway: core/config.py's budget warning takes slurm_budget from it)
    assert not unwanted & set(loaded), sorted(unwanted & set(loaded))


def test_the_decision_logger_is_set_up_without_importing_traceback(tmp_path):
    """Round 7: `logging` is imported with a stand-in for `traceback` (~3.4 ms of its imports), which
    loads the real module the first time logging prints an exception: a healthy prolog's log line
    needs none, and a logged exception still carries its traceback. A fresh interpreter, so no other
    test has imported either."""
    import subprocess
    import sys

    code = """
import json, sys
from slurm_hooks.core import logs
settings = {"general": {"log_level": "info"},
            "paths": {"syslog": False, "log_file": sys.argv[1] + "/hook.log"}}
log = logs.setup(settings, stderr=False)
log.info("decision")
before = "traceback" in sys.modules
try:
    raise ValueError("boom")
except ValueError:
    log.exception("failed")
import traceback
print(json.dumps([before, "traceback" in sys.modules, hasattr(traceback, "print_exception")]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [False, True, True]
    text = (tmp_path / "hook.log").read_text()
    assert "INFO decision" in text and "Traceback (most recent call last)" in text
    assert 'File "<string>", line 10' in text and "ValueError: boom" in text
