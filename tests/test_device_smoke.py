"""tools/device_smoke.py, the script a session lent a GPU machine runs first, on the fake node: it
must produce every fixture and talk to the library on LD_LIBRARY_PATH (the fake's sentinel driver
version proves which), so that the one device run a session gets is not spent on a broken script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # a capture, a check, a qualify and ~60 NVML names x 8 GPUs


def test_device_smoke_writes_every_fixture_against_the_library_it_finds(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    out = tmp_path / "out"
    env = node.subprocess_env()
    env["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"] = "1"
    env["SLURM_HOOKS_CONFIG"] = str(tmp_path / "none.toml")
    (tmp_path / "none.toml").write_text("[paths]\nstate_dir = %r\nlog_file = ''\n" % str(tmp_path))
    done = subprocess.run(
        [
            sys.executable,
            "tools/device_smoke.py",
            "--out",
            str(out),
            "--root",
            str(node.root),
            "--prolog-runs",
            "2",
            "--compare-tree",  # the same tree: both sides must run, and come out alike
            REPO,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"]["check"]["rc"] in (0, 1, 2), summary  # judged, not UNKNOWN or a crash
    assert summary["steps"]["capture"]["rc"] == 0, summary
    assert (out / "capture.tar.gz").stat().st_size > 0
    check = json.loads((out / "check.json").read_text())
    by_name = {c["name"]: c for c in check["checks"]}
    assert by_name["gpu.count"]["status"] == "OK", by_name["gpu.count"]  # the driver was read
    json.loads((out / "qualify.json").read_text())  # no tools on the fake node: SKIPs, still JSON
    calls = json.loads((out / "nvml-calls.json").read_text())
    assert "error" not in calls["init"] and calls["count"]["value"] == "8"
    functions = calls["functions"]
    assert functions["nvmlSystemGetDriverVersion"]["system"]["value"] == "'550.54.15'"  # the fake
    names = functions["nvmlDeviceGetName"]["per_gpu"]
    assert len(names) == 8 and all("H100" in n["value"] for n in names), names
    assert all(f["in_pynvml"] for f in functions.values() if f.get("per_gpu")), functions
    # the multi-argument getters get their arguments: an answer, not a TypeError of ours
    temperature = functions["nvmlDeviceGetTemperature"]["per_gpu"][0]
    assert "value" in temperature, temperature
    # the getters asked with several argument sets (DRAM and SRAM counters, as checks/gpu/memory.py)
    by_args = functions["nvmlDeviceGetMemoryErrorCounter"]["per_gpu_by_args"]
    assert set(by_args) == {"(1, 1, 2)", "(1, 1, 7)"}, by_args
    assert all("value" in answer for answers in by_args.values() for answer in answers), by_args
    # every field id we ask, with the id the driver echoed and its own return
    fields = functions["nvmlDeviceGetFieldValues"]["per_gpu"][0]["fields"]
    assert fields["FI_DEV_NVLINK_LINK_COUNT"] == {
        "asked": 91,
        "fieldId": 91,
        "nvmlReturn": 0,
        "valueType": 1,
        "value": 18,
    }
    assert all(f["asked"] == f["fieldId"] for f in fields.values()), fields
    # the prolog as slurmd runs it, timed against the interpreter floor, every run judged OK
    timing = json.loads((out / "prolog-timing.json").read_text())
    assert timing["prolog_exit_codes"] == [0], timing
    assert timing["gpus"] == 8 and timing["runs"] == 2
    assert timing["ratio_wall"] > 1 and "decision=pass" in timing["last_stderr"], timing
    assert timing["compare_tree"] == REPO and 0.2 < timing["vs_compare_cpu"] < 5, timing
