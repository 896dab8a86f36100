"""`--json` on the verbs an admin scripts: `list`, `config check`, `capture` (and `check`, `status`,
`explain`, `drain`, `resume`, tested beside their human output). Each document names its schema.

They run in this process (tests/inprocess_cli.py); each verb's subprocess test is elsewhere:
`list` test_plugins, `config check` test_cli_messages and test_cli_baseline, `capture`
test_capture's fixture."""

from __future__ import annotations

import json
import os

from tests.inprocess_cli import cli_in_process


def _run(args, env=None):
    env = dict(env or os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    return cli_in_process(args, env=env)


def test_list_json_names_every_check_with_its_parameters():
    human = _run(["list"]).stdout.splitlines()
    proc = _run(["list", "--json"])
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["schema"] == "slurm-hooks.list/1"
    assert [c["name"] for c in doc["checks"]] == [line.split()[0] for line in human]
    pcie = next(c for c in doc["checks"] if c["name"] == "gpu.pcie")
    assert pcie["family"] == "gpu" and "prolog" in pcie["contexts"]
    gen = next(p for p in pcie["params"] if p["name"] == "expected_gen")
    assert (gen["type"], gen["default"]) == ("int", 0) and "generation" in gen["help"]
    # the bounds a loaded config is held to, as numbers a script can compare with
    assert (gen["minimum"], gen["maximum"]) == (0, 7) and "\u2264 7" in gen["describe"]


def test_config_check_json_valid_and_invalid(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[general]\nmode = "observe"\n[checks."gpu.count"]\nexpected = 8\n')
    proc = _run(["--config", str(good), "config", "check", "--json"])
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["schema"] == "slurm-hooks.config/1" and doc["valid"]
    assert doc["sources"] == [str(good)] and doc["settings"]["general"]["mode"] == "observe"
    count = doc["checks"]["gpu.count"]
    assert count["enabled"] is True and count["params"]["expected"] == 8
    bad = tmp_path / "bad.toml"
    bad.write_text('[checks."gpu.count"]\nexpectd = 8\n')
    proc = _run(["--config", str(bad), "config", "check", "--json"])
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["valid"] is False
    assert "expectd" in doc["error"] and str(bad) in doc["error"]


def test_capture_json(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    out = tmp_path / "node.tar.gz"
    proc = _run(["capture", str(out), "--root", str(node.root), "--json"], node.subprocess_env())
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert doc["schema"] == "slurm-hooks.capture/1" and doc["archive"] == str(out)
    assert doc["node"] == "dgx-h100-01" and doc["entries"] > 100 and out.exists()
    proc = _run(
        ["capture", str(tmp_path / "no" / "such" / "x.tar.gz"), "--root", str(node.root), "--json"]
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["error"], proc.stdout
