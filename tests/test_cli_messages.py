"""Messages that name the real cause: permission denied as a user other than root (not "no record" or an
empty report), no Slurm configuration (not scontrol's four lines), a SLURM_CONF naming no file (not a
60 s wait), a [metrics] directory that does not exist (a typo)."""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from slurm_hooks.cli.main import main
from slurm_hooks.result import ExitCode
from slurm_hooks.slurm.client import SlurmClient
from tests.doubles.memory_slurm import cluster
from tests.helpers import REPO
from tests.straggler_records import write_jobs

NOBODY = 65534

# What scontrol (Slurm 22.05, Debian bookworm) prints on a host with no slurm.conf and no configless DNS SRV
# record: captured from this project's build host with `scontrol show node node1` (exit 1).
SCONTROL_WITHOUT_CONFIG = (
    "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "scontrol: error: fetch_config: DNS SRV lookup failed\n"
    "scontrol: error: _establish_config_source: failed to fetch config\n"
    "scontrol: fatal: Could not establish a configuration source\n"
)


@pytest.fixture
def config(monkeypatch):
    """Records and state as the hooks leave them: root's, directories 0700 (under a directory the
    unprivileged user may traverse: pytest's own temp directory is 0700)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="cli-messages-", dir="/tmp"))
    yield from _records_and_state(base, monkeypatch)
    shutil.rmtree(str(base))


def _records_and_state(base, monkeypatch):
    jobs, state = base / "jobs", base / "state"
    write_jobs(str(jobs), jobs=12)
    for directory in [jobs] + list(jobs.iterdir()):
        os.chmod(directory, 0o700)
    state.mkdir(mode=0o700)
    (state / "node-state.json").write_text("{}")
    path = base / "config.toml"
    path.write_text(
        '[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n[records]\ndir = "%s"\n'
        % (state, jobs)
    )
    os.chmod(base, 0o755)
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(path))
    yield path


def as_nobody(argv):
    """main(argv) in a forked child that dropped root for uid/gid 65534: (exit code, stdout+stderr).

    The interpreter's own files may be unreadable to that user (a pyenv under /root), so what the
    verbs import lazily is imported first, here, as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to drop privileges in a child")
    for name in (
        "slurm_hooks.cli.record_verbs",
        "slurm_hooks.cli.straggler_verbs",
        "slurm_hooks.cli.hook_verbs",
        "slurm_hooks.records.fleet_report",
        "slurm_hooks.records.straggler_scan",
        "slurm_hooks.records.store",
        "slurm_hooks.hooks",
        "slurm_hooks.hooks.state",
        "slurm_hooks.hooks.enactment",
        "slurm_hooks.slurm.drainer",
        "slurm_hooks.core.logs",
        "slurm_hooks.core.isolation",
    ):
        __import__(name)
    from slurm_hooks.cli.main import build_parser
    from slurm_hooks.core.config import load_registry_and_config

    build_parser()  # argparse and every verb module
    load_registry_and_config(os.environ.get("SLURM_HOOKS_CONFIG"))  # the registry, tomllib
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(read)
            out = io.TextIOWrapper(os.fdopen(write, "wb"), write_through=True)
            sys.stdout = sys.stderr = out
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = int(main(list(argv)))
        except SystemExit as exc:
            code = int(exc.code or 0)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever it is
            print("child: %r" % exc)
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def test_record_show_as_nobody_says_permission_denied(config, capsys):
    capsys.readouterr()
    code, text = as_nobody(["record", "show", "100"])
    assert code == ExitCode.UNKNOWN, text
    assert "permission denied reading %s" % (config.parent / "jobs") in text, text
    assert "run this as root" in text


@pytest.mark.parametrize("verb", [["report"], ["report", "--stragglers"]])
def test_reports_as_nobody_refuse_instead_of_reporting_nothing(config, verb):
    code, text = as_nobody(verb)
    assert code == ExitCode.UNKNOWN, text
    assert "permission denied reading %s" % (config.parent / "jobs") in text, text
    assert "0 records" not in text and "no straggler suspects" not in text


def test_a_node_directory_root_kept_to_itself_is_named(config, capsys):
    jobs = config.parent / "jobs"
    os.chmod(jobs, 0o755)  # the top is readable, node directories are not
    code, text = as_nobody(["report", "--stragglers"])
    assert "warning: left out: permission denied reading %s/n0" % jobs in text, text


def test_status_as_nobody_says_the_state_file_is_root_s(config, monkeypatch):
    backend = cluster()
    monkeypatch.setattr(
        "slurm_hooks.slurm.drainer.make_client", lambda settings: SlurmClient(backend)
    )
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    code, text = as_nobody(["status", "--json"])
    doc = json.loads(text[text.index("{") :])
    state = config.parent / "state" / "node-state.json"
    assert doc["local_state_error"] == "permission denied reading %s (run this as root)" % state
    assert doc["local_state"] is None  # unknown, not "nothing recorded"
    code, text = as_nobody(["status"])
    assert "local state: unknown: permission denied reading %s" % state in text, text


@pytest.fixture
def no_slurm_config(tmp_path, monkeypatch):
    """A scontrol that answers as Slurm 22.05 does on a host without any configuration."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(
        "#!%s\nimport sys\nsys.stderr.write(%r)\nsys.exit(1)\n"
        % (sys.executable, SCONTROL_WITHOUT_CONFIG)
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    conf = tmp_path / "slurm-hooks.toml"
    conf.write_text(
        '[drain]\nbackend = "scontrol"\nattempts = 1\n[paths]\nstate_dir = "%s"\nlog_file = ""\n'
        "syslog = false\n" % (tmp_path / "state")
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(conf))
    return conf


def test_no_slurm_configuration_is_said_in_one_line(no_slurm_config, capsys):
    code = main(["status", "--node", "node1"])
    out = capsys.readouterr()
    assert code == ExitCode.UNKNOWN
    assert "no Slurm configuration on this host: scontrol found no slurm.conf" in out.out
    assert "DNS SRV lookup failed" not in out.out + out.err, out
    code = main(["drain", "--node", "node1", "--reason", "fan"])
    out = capsys.readouterr()
    assert code == ExitCode.UNKNOWN and "no Slurm configuration on this host" in out.err, out
    assert "fetch_config" not in out.err


def test_a_slurm_conf_that_names_no_file_is_refused_at_once(no_slurm_config, monkeypatch, capsys):
    """scontrol would retry reading it for 60 s before its own error."""
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.cnof")
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:  # a usage error, as a bad --node is
        main(["status", "--node", "node1"])
    assert exited.value.code == ExitCode.UNKNOWN and time.monotonic() - started < 5
    assert "SLURM_CONF=/etc/slurm/slurm.cnof: no such file" in capsys.readouterr().err


def test_a_metrics_directory_that_does_not_exist_is_a_warning(tmp_path):
    real = tmp_path / "textfile_collector"
    real.mkdir()
    typo = tmp_path / "textfile_colector"
    conf = tmp_path / "config.toml"
    conf.write_text('[metrics]\ntextfile_dir = "%s"\n' % typo)
    env = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "--config", str(conf), "config", "check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "warning: [metrics] textfile_dir = %r does not exist" % str(typo) in proc.stderr
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "slurm_hooks", "--config", str(conf), "config", "check"]
            + ["--json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=60,
        ).stdout
    )
    assert any("textfile_colector" in w for w in doc["warnings"])
    conf.write_text('[metrics]\ntextfile_dir = "%s"\n' % real)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "--config", str(conf), "config", "check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert "warning" not in proc.stderr


def test_the_hook_logs_when_it_creates_the_metrics_directory(tmp_path, caplog):
    pytest.importorskip("prometheus_client")
    from slurm_hooks.core.config import SECTIONS
    from slurm_hooks.records import metrics

    settings = {s: {k: v.default for k, v in schema.items()} for s, schema in SECTIONS.items()}
    settings["paths"]["state_dir"] = str(tmp_path / "state")
    settings["metrics"]["textfile_dir"] = str(tmp_path / "textfile_colector")
    with caplog.at_level(logging.WARNING):
        assert metrics.write_config_error(settings, "prolog", "x") is not None
    assert "event=metrics-dir-created" in caplog.text and "textfile_colector" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        metrics.write_config_error(settings, "prolog", "x")
    assert "metrics-dir-created" not in caplog.text  # once: the directory exists now
