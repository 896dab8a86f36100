"""Exit codes that say what a report found (docs/cli.md has the table): `report` and `report --stragglers`
exit FOUND (1) when they name nodes to look at, OK (0) when not, UNKNOWN (3) when they could not do
their work (bad input; --drain that could not reach Slurm)."""

from __future__ import annotations

import os

import pytest

from bench import fleet_synth
from slurm_hooks.cli.main import main
from slurm_hooks.records.store import encode_record
from slurm_hooks.result import ExitCode
from tests.straggler_records import KEY, NOW, write_jobs, write_key


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(
        '[general]\nmode = "enforce"\n[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
        '[records]\nkey_file = "%s"\n' % (tmp_path / "state", write_key(tmp_path / "records.key"))
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(path))
    return path


def _abnormal_record(directory, node, job_id):
    """A job record whose epilog found 2 uncorrectable ECC errors (records/build.py's summary)."""
    record = fleet_synth.header_record(job_id, "alice", node, NOW - 7200, NOW - 3600, {})
    record["summary"].update(abnormal=["ecc_uncorrected"], ecc_uncorrected=2)
    path = os.path.join(directory, node, "%s.json" % job_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        # signed as the epilog signs with [records] key_file
        handle.write(encode_record(record, KEY, node, os.path.basename(path)))


def test_found_is_the_warn_code():
    assert ExitCode.FOUND is ExitCode.WARN and int(ExitCode.FOUND) == 1


def test_report_exits_found_when_a_node_had_abnormal_jobs(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=4, slow=None)
    assert main(["report", d]) == ExitCode.OK
    _abnormal_record(d, "n02", "900")
    assert main(["report", d]) == ExitCode.FOUND
    assert main(["report", d, "--json"]) == ExitCode.FOUND
    assert "n02" in capsys.readouterr().out
    assert main(["report", d, "--job", "900"]) == ExitCode.FOUND
    assert main(["report", d, "--job", "100"]) == ExitCode.OK
    assert main(["report", d, "--since", "yesterday-ish"]) == ExitCode.UNKNOWN


def test_stragglers_exit_found_with_suspects(tmp_path, config, capsys):
    clean, slow = str(tmp_path / "clean"), str(tmp_path / "slow")
    write_jobs(clean, jobs=12, slow=None)
    write_jobs(slow, jobs=12)
    assert main(["report", "--stragglers", clean]) == ExitCode.OK
    assert main(["report", "--stragglers", slow]) == ExitCode.FOUND
    assert main(["report", "--stragglers", slow, "--json"]) == ExitCode.FOUND
    assert "n03" in capsys.readouterr().out


def test_stragglers_drain_that_cannot_reach_slurm_exits_unknown(tmp_path, config, monkeypatch):
    """--drain with [fleet] drain = true and no scontrol to run: the drains were not made, and the
    exit code must not look like a run that only found suspects."""
    slow = str(tmp_path / "slow")
    write_jobs(slow, jobs=12)
    config.write_text(config.read_text() + '[drain]\nbackend = "scontrol"\n[fleet]\ndrain = true\n')
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    assert main(["report", "--stragglers", slow, "--drain"]) == ExitCode.UNKNOWN
