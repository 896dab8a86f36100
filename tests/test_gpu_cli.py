"""The GPU checks as slurmd and admins run them: `slurm-hooks prolog` in a subprocess with slurmd's
environment and the fake libnvidia-ml.so.1 on LD_LIBRARY_PATH, and `slurm-hooks check --json`."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.helpers import REPO

CLI = [sys.executable, "-m", "slurm_hooks"]


def prolog_env(node, tmp_path, gpus, mode="observe"):
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nmode = "%s"\nroot = "%s"\nroot_live_sources = ["nvml"]\n\n[paths]\nstate_dir = "%s"\nlog_file = "%s"\n'
        "syslog = false\n" % (mode, node.root, tmp_path / "state", tmp_path / "log" / "hooks.log")
    )
    env = node.subprocess_env()
    env.update(
        {
            "SLURM_HOOKS_CONFIG": str(config),
            "SLURM_HOOKS_ALLOW_INSECURE_CONFIG": "1",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_USER": "alice",
            "SLURMD_NODENAME": "dgx-h100-01",
            "SLURM_JOB_GPUS": gpus,
            "CUDA_VISIBLE_DEVICES": gpus,
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        }
    )
    return env


def run_prolog(node, tmp_path, gpus):
    env = prolog_env(node, tmp_path, gpus)
    proc = subprocess.run(
        CLI + ["prolog"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )
    log = (tmp_path / "log" / "hooks.log").read_text()
    return proc, log


def test_prolog_on_healthy_node_passes_and_logs(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    proc, log = run_prolog(node, tmp_path, "0,1,2,3")
    assert proc.returncode == 0, proc.stderr
    line = log.strip().splitlines()[-1]
    assert "context=prolog job=4242 user=alice node=dgx-h100-01 status=OK decision=pass" in line, (
        log
    )
    assert (
        "slurm_calls=0" in line or "slurm_calls" not in line
    )  # the happy path never talks to slurmctld


def test_prolog_catches_a_fault_on_the_jobs_gpu_and_only_there(fake_node, tmp_path):
    node = fake_node("dgx-h100", {"gpu": {5: {"remapped_rows": {"pending": True}}}})
    proc, log = run_prolog(node, tmp_path, "4,5")
    assert proc.returncode == 0, proc.stderr  # observe mode: never drains, never fails the job
    line = log.strip().splitlines()[-1]
    assert "status=FAIL decision=drain blame=node outcome=observe check=gpu.remap" in line, log
    assert 'component="gpu:5 0000:9c:00.0"' in line and "row remap pending" in line
    other = tmp_path / "other"
    other.mkdir()
    proc, log = run_prolog(node, other, "0,1")  # the same node, a job on other GPUs
    assert proc.returncode == 0 and "status=OK decision=pass" in log.strip().splitlines()[-1], log


def test_prolog_with_an_allocated_gpu_that_fell_off(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    node.inject_fault("nvmlDeviceGetHandleByIndex", 2, 15)  # GPU_IS_LOST
    proc, log = run_prolog(node, tmp_path, "2")
    line = log.strip().splitlines()[-1]
    assert (
        proc.returncode == 0 and "decision=drain blame=node outcome=observe check=gpu.count" in line
    ), log


def test_prolog_rejects_garbage_gpu_list_and_fails_open(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    env = prolog_env(node, tmp_path, "0;rm -rf /")
    proc = subprocess.run(
        CLI + ["prolog"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )
    assert proc.returncode == 0  # our input validation never drains or blocks the node
    log = (tmp_path / "log" / "hooks.log").read_text()
    assert "event=bad-job-environment" in log and "SLURM_JOB_GPUS" in log


def test_check_json_on_a_faulty_node(fake_node):
    overlay = {
        "gpu": {
            1: {"pcie": {"width": 8}},
            3: {"ecc": {"volatile": {"uncorrected": {"dram": 4}}}},
            6: {"temperature": {"gpu": 84}},
        }
    }
    node = fake_node("dgx-h100", overlay)
    proc = subprocess.run(
        CLI + ["check", "--json", "--root", str(node.root), "--live", "nvml", "gpu"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=node.subprocess_env(),
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    by = {c["name"]: c for c in report["checks"]}
    assert by["gpu.count"]["results"][0]["details"]["nvml_version"].endswith("fakenvml")
    pcie = by["gpu.pcie"]["results"]
    assert [(r["status"], r["component"], r["action"], r["blame"]) for r in pcie] == [
        ("FAIL", "gpu:1 0000:1a:00.0", "drain", "node")
    ]
    ecc = by["gpu.ecc"]["results"]
    assert [(r["status"], r["component"], r["action"]) for r in ecc] == [
        ("FAIL", "gpu:3 0000:44:00.0", "reset-gpu")
    ]
    assert ecc[0]["details"]["volatile_uncorrected"] == 4
    thermal = by["gpu.thermal"]["results"]
    assert [(r["status"], r["component"]) for r in thermal] == [("WARN", "gpu:6 0000:c4:00.0")]
    assert {
        name: c["status"]
        for name, c in by.items()
        if name not in ("gpu.pcie", "gpu.ecc", "gpu.thermal")
    } == {name: "OK" for name in by if name not in ("gpu.pcie", "gpu.ecc", "gpu.thermal")}
    assert report["duration_s"] < 2.0


def test_full_check_on_the_example_node_stays_fast(fake_node):
    """Wall time of `slurm-hooks check` (every check, 8 GPUs) including interpreter start: the median
    of 5 runs under 3 s. Runs stop once the median is known: 3 under 3 s (or 3 over) decide it,
    whatever the other runs would take, so a passing run usually needs 3, not 5."""
    node = fake_node("dgx-h100")
    times = []
    while sum(t < 3.0 for t in times) < 3 and sum(t >= 3.0 for t in times) < 3:
        started = time.monotonic()
        proc = subprocess.run(
            CLI + ["check", "--root", str(node.root), "--live", "nvml"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=node.subprocess_env(),
            timeout=60,
        )
        times.append(time.monotonic() - started)
        assert proc.returncode == 0, proc.stdout
    # 3 s: generous for loaded CI machines; typically ~0.3 s
    assert sum(t < 3.0 for t in times) >= 3, times
