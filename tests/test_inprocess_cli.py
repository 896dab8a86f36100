"""tests/inprocess_cli.py: a command run in the test process answers as its child would, and never
ends the process for a thread some earlier test left stuck."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.inprocess_cli import cli_in_child, cli_in_process


@pytest.fixture
def env(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("")
    return dict(os.environ, SLURM_HOOKS_CONFIG=str(config), SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")


def test_a_stuck_check_thread_of_an_earlier_test_does_not_end_the_process(env):
    """A hung-check test leaves a `check:` thread behind; check_verbs.finish would os._exit for it
    (the xdist worker crashed in test_xid_cli before the helper replaced finish)."""
    release = threading.Event()
    left = threading.Thread(target=release.wait, name="check:left-behind", daemon=True)
    left.start()
    try:
        proc = cli_in_process(["explain", "xid", "79"], env=env)
    finally:
        release.set()
        left.join()
    assert proc.returncode == 0 and proc.stdout.startswith("Xid 79"), proc


def test_the_answer_is_the_childs(env):
    argv = ["explain", "xid", "13", "--json"]
    child = cli_in_child(argv, env=env)
    here = cli_in_process(argv, env=env)
    assert (here.returncode, here.stdout, here.stderr) == (
        child.returncode,
        child.stdout,
        child.stderr,
    )
    usage = cli_in_process(["explain", "xid", "seventy-nine"], env=env)  # argparse's SystemExit
    assert usage.returncode == 3 and "invalid int value" in usage.stderr


def test_what_needs_a_fresh_process_is_refused(env):
    for argv in (["prolog"], ["check", "gpu", "--root", "/", "--live", "nvml"]):
        with pytest.raises(ValueError):
            cli_in_process(argv, env=env)
    assert os.environ.get("SLURM_HOOKS_CONFIG") != env["SLURM_HOOKS_CONFIG"]  # restored


def test_live_nvml_on_a_named_fake_node_answers_as_its_child(fake_node):
    """With the node named, pynvml reads that node's library here as the child finds it through
    LD_LIBRARY_PATH: the same report, timings aside; and an NVML fault planted on the node shows."""
    node = fake_node("dgx-h100")
    env = dict(node.subprocess_env(), SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    argv = ["check", "--json", "gpu", "--root", str(node.root), "--live", "nvml"]

    def report(proc):
        assert proc.returncode in (0, 1, 2), proc.stderr
        return [
            {key: value for key, value in check.items() if key != "duration_s"}
            for check in json.loads(proc.stdout)["checks"]
        ]

    codes = []
    for planted in (None, "nvmlDeviceGetEccMode"):
        if planted:
            node.inject_fault(planted, 5)
        child = cli_in_child(argv, env=env)
        here = cli_in_process(argv, env=env, nvml_node=node)
        assert here.returncode == child.returncode
        assert report(here) == report(child)
        codes.append(here.returncode)
    assert codes[0] == 0 and codes[1] != 0, codes  # the fault planted in the library counted
