"""`slurm-hooks status`: a table for people, one JSON shape (schema slurm-hooks.status/1) for one node or many.

Slurm is the in-memory controller of tests/doubles/memory_slurm.py (the same verb runs against the real
slurmctld in tests/test_drain_slurm.py and tests/test_e2e_slurm.py)."""

from __future__ import annotations

import json

import pytest

from slurm_hooks.cli.main import main
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.node_state import NodeInfo
from tests.doubles.memory_slurm import REASON, cluster


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A config, and node1 (drained by our gpu.memory check), node2 (an admin's `slurm-hooks drain`),
    node3 idle, node4 drained by someone else."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nmode = "enforce"\n[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
        % (tmp_path / "state")
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "node3")
    backend = cluster()
    backend.nodes["node1"] = NodeInfo(
        "node1", "IDLE", frozenset({"DRAIN"}), REASON, "root", "2026-12-02T00:00:01"
    )
    backend.nodes["node2"] = NodeInfo(
        "node2",
        "IDLE",
        frozenset({"DRAIN"}),
        "slurm-hooks: manual: PDU swap",
        "alice",
        "2026-12-02T00:00:02",
    )
    backend.nodes["node4"] = NodeInfo(
        "node4", "IDLE", frozenset({"DRAIN"}), "bad fan", None, "2026-12-02T00:00:03"
    )
    monkeypatch.setattr(
        "slurm_hooks.slurm.drainer.make_client", lambda settings: SlurmClient(backend)
    )
    monkeypatch.setattr(
        "slurm_hooks.slurm.client.expand_hostlist", lambda text, **kw: text.split(",")
    )
    return config


def _status(config, capsys, *args):
    code = main(["--config", str(config), "status"] + list(args))
    return code, capsys.readouterr()


def test_status_is_a_table_not_json_blobs(site, capsys):
    code, out = _status(site, capsys, "--node", "node1,node2,node3,node4")
    lines = out.out.splitlines()
    assert code == 0 and "{" not in out.out, out.out
    assert lines[0].split() == ["NODE", "STATE", "DRAIN"]
    rows = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(" ")}
    assert rows["node1"].split()[1] == "IDLE+DRAIN", out.out
    assert "automatic (gpu.memory)" in rows["node1"], out.out
    assert "by an admin" in rows["node2"] and "not drained" in rows["node3"]
    assert "someone else's" in rows["node4"]
    assert "reason: %s (2026-12-02T00:00:01, root)" % REASON in out.out
    assert "reason: bad fan (2026-12-02T00:00:03)" in out.out
    assert any(
        line.startswith("breaker:") and "1 of 9 nodes drained by slurm-hooks checks" in line
        for line in lines
    ), out.out
    assert "mode:        enforce" in lines
    assert "local state: nothing drained or pending" in lines  # no state file: nothing recorded


def test_status_json_has_one_shape_for_one_node_or_many(site, capsys):
    one = json.loads(_status(site, capsys, "--node", "node1", "--json")[1].out)
    many = json.loads(_status(site, capsys, "--node", "node1,node2", "--json")[1].out)
    here = json.loads(_status(site, capsys, "--json")[1].out)  # this node (SLURMD_NODENAME)
    for doc in (one, many, here):
        assert doc["schema"] == "slurm-hooks.status/1"
        assert sorted(doc) == ["breaker", "local_state", "mode", "nodes", "schema"], doc
    assert [n["node"] for n in one["nodes"]] == ["node1"]
    assert [n["node"] for n in many["nodes"]] == ["node1", "node2"]
    assert [n["node"] for n in here["nodes"]] == ["node3"]
    assert one["nodes"][0] == many["nodes"][0]
    assert one["nodes"][0]["drained_by_us"] is True and one["breaker"]["drained_by_us"] == 1


def test_status_of_an_unreachable_controller_exits_unknown_in_both_forms(site, capsys, monkeypatch):
    backend = cluster()
    backend.down = True
    monkeypatch.setattr(
        "slurm_hooks.slurm.drainer.make_client", lambda settings: SlurmClient(backend)
    )
    code, out = _status(site, capsys, "--node", "node1")
    assert code == 3 and "slurmctld unreachable" in out.out and "{" not in out.out
    code, out = _status(site, capsys, "--node", "node1", "--json")
    doc = json.loads(out.out)
    assert code == 3 and "error" in doc["nodes"][0] and "error" in doc["breaker"]


def test_drain_and_resume_json(site, capsys):
    """Schemas slurm-hooks.drain/1 and slurm-hooks.resume/1: every node's outcome, message and
    exit code, and the worst code; nothing else on stdout."""
    code = main(
        ["--config", str(site), "drain", "--node", "node3,node4", "--reason", "PSU", "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "slurm-hooks.drain/1" and code == doc["exit_code"] == 1
    by = {n["node"]: n for n in doc["nodes"]}
    assert (by["node3"]["outcome"], by["node3"]["exit_code"]) == ("drained", 0)
    assert "sh:manual: PSU" in by["node3"]["message"]
    assert (by["node4"]["outcome"], by["node4"]["exit_code"]) == ("foreign-drain-kept", 1)
    code = main(["--config", str(site), "resume", "--node", "node3,node4", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "slurm-hooks.resume/1" and code == doc["exit_code"] == 1
    by = {n["node"]: n for n in doc["nodes"]}
    assert by["node3"]["outcome"] == "resumed" and by["node4"]["outcome"] == "not-ours"


def test_a_reason_with_line_breaks_and_escapes_stays_on_its_line(site, capsys, monkeypatch):
    backend = cluster()
    backend.nodes["node1"] = NodeInfo(
        "node1", "IDLE", frozenset({"DRAIN"}), "fan\nnode9  IDLE  not drained\x1b[2J", "bob"
    )
    monkeypatch.setattr(
        "slurm_hooks.slurm.drainer.make_client", lambda settings: SlurmClient(backend)
    )
    code, out = _status(site, capsys, "--node", "node1")
    assert "\x1b" not in out.out and "reason: fan?node9  IDLE  not drained?[2J (bob)" in out.out
    assert [line.split()[0] for line in out.out.splitlines()[1:3]] == ["node1", "reason:"]
