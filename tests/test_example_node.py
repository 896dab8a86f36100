"""`slurm-hooks check` as an admin (or slurmd) runs it: a subprocess, real pynvml, the fake library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

CLI = [sys.executable, "-m", "slurm_hooks"]


def run_cli(args, env=None, timeout=60):
    return subprocess.run(
        CLI + args, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )


def test_check_on_example_node_talks_to_the_fake_library(fake_node):
    node = fake_node("dgx-h100")
    proc = run_cli(
        ["check", "--json", "--root", str(node.root), "--live", "nvml"], env=node.subprocess_env()
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == "slurm-hooks.check/1" and report["status"] == "OK"
    count = next(c for c in report["checks"] if c["name"] == "gpu.count")["results"][0]
    assert count["summary"] == "8 GPUs, driver 550.54.15"
    assert "fakenvml" in count["details"]["nvml_version"]  # the sentinel: not a real driver
    cpu = next(c for c in report["checks"] if c["name"] == "system.cpu")["results"][0]
    assert cpu["details"]["sockets"] == 2 and cpu["details"]["online"] == 224


def test_example_node_without_library_is_a_gpu_failure(fake_node):
    node = fake_node("dgx-h100")
    env = node.subprocess_env()
    env["LD_LIBRARY_PATH"] = ""  # the driver's library is gone but the GPUs are on the PCI bus
    proc = run_cli(["check", "gpu.count", "--root", str(node.root), "--live", "nvml"], env=env)
    assert proc.returncode == 2, proc.stdout
    assert "GPUs expected (8 NVIDIA GPUs on the PCI bus) but NVML is unusable" in proc.stdout


def test_gpu_lost_from_nvml_is_caught(fake_node):
    node = fake_node("dgx-h100")
    node.inject_fault("nvmlDeviceGetHandleByIndex", 5, 15)  # GPU_IS_LOST
    proc = run_cli(
        ["check", "--json", "gpu.count", "--root", str(node.root), "--live", "nvml"],
        env=node.subprocess_env(),
    )
    results = json.loads(proc.stdout)["checks"][0]["results"]
    assert proc.returncode == 2
    # the bus id of a GPU whose handle fails is the one GPU on the bus NVML could not read (gpu.count docstring)
    assert any(
        r["component"] == "gpu:5 0000:9c:00.0" and r["action"] == "reboot" and r["status"] == "FAIL"
        for r in results
    )


def test_cpu_only_node_skips_gpu_checks_unless_gpus_expected(fake_node, tmp_path):
    node = fake_node("cpu-only")
    proc = run_cli(
        ["check", "gpu", "--root", str(node.root), "--live", "nvml"], env=node.subprocess_env()
    )
    assert proc.returncode == 0 and "SKIP" in proc.stdout and "no NVIDIA driver" in proc.stdout
    config = tmp_path / "config.toml"
    config.write_text("[general]\nexpect_gpus = true\n")
    env = dict(node.subprocess_env(), SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    proc = run_cli(
        ["--config", str(config), "check", "gpu", "--root", str(node.root), "--live", "nvml"],
        env=env,
    )
    assert proc.returncode == 2 and "FAIL" in proc.stdout and "general.expect_gpus" in proc.stdout


def test_this_machine_prints_a_sensible_table():
    proc = run_cli(["check"])
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "TIME", "SUMMARY"]
    assert lines[-1].startswith("overall: ")
    assert proc.returncode in (0, 1), (
        proc.stdout
    )  # a sane CI machine: OK or WARN, never FAIL/UNKNOWN
    if not os.path.exists("/proc/driver/nvidia"):
        assert any(line.startswith("SKIP") and "gpu.count" in line for line in lines)


@pytest.mark.slow
def test_hung_nvml_call_cannot_outlast_the_deadline(fake_node):
    node = fake_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetCount")
    started = time.monotonic()
    proc = run_cli(
        ["check", "--json", "--deadline", "2", "--root", str(node.root), "--live", "nvml"],
        env=node.subprocess_env(),
    )
    elapsed = time.monotonic() - started
    report = json.loads(proc.stdout)
    gpu = next(c for c in report["checks"] if c["name"] == "gpu.count")
    assert gpu["timed_out"] and gpu["status"] == "UNKNOWN"
    assert elapsed < 2 + 1.5  # deadline plus interpreter start-up
    assert next(c for c in report["checks"] if c["name"] == "system.cpu")["status"] == "OK"


def test_unknown_check_name_and_bad_usage_exit_unknown():
    assert run_cli(["check", "nope"]).returncode == 3
    assert run_cli(["check", "--bogus"]).returncode == 3


def test_hook_verbs_take_the_fast_parser_and_agree_with_the_full_one():
    from slurm_hooks.cli.main import build_parser, parse_hook_args

    for argv in (
        ["prolog"],
        ["--config", "/x.toml", "epilog"],
        ["health", "--node", "n1", "--root", "/r"],
        ["--config=/x.toml", "prolog", "--root=/r", "--node", "n1"],
        ["epilog", "--node", "a", "--node", "b"],
    ):
        fast = parse_hook_args(argv)
        assert fast is not None, argv
        full = vars(build_parser().parse_args(argv))
        assert all(full[key] == value for key, value in fast.items()), (fast, full)
    # help, other verbs, misplaced or incomplete options: left to argparse (which also words the errors)
    for argv in (
        ["check"],
        ["prolog", "--help"],
        ["--config", "prolog", "check"],
        [],
        ["prolog", "--config", "/x"],
        ["--root", "/r", "prolog"],
        ["prolog", "--node"],
        ["prolog", "--node", "-x"],
        ["prolog", "epilog"],
        ["prolog", "--bogus"],
        ["--version"],
    ):
        assert parse_hook_args(argv) is None, argv


def test_hook_verbs_do_not_import_argparse():
    code = (
        "import sys; from slurm_hooks.cli import main as cli; cli.parse_hook_args(['prolog']); "
        "import slurm_hooks.hooks; print('argparse' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
