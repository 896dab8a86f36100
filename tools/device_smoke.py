#!/usr/bin/env python3
"""The one script a session lent a GPU machine runs first (DEVELOPERS.md, issue 26): everything we
read from a real NVIDIA node, kept as fixtures.

    python3 tools/device_smoke.py --out DIR [--level quick] [--root TREE]

In DIR (each step bounded; a step that fails or hangs is recorded, never a stop):
- capture.tar.gz    `slurm-hooks capture`: the files the checks read, redacted
- check.json        `slurm-hooks check --all-contexts --json` with the real driver
- qualify.json      `slurm-hooks qualify --level LEVEL --json --no-record`: whatever of dcgmi,
                    nvbandwidth, all_reduce_perf, ib_write_bw the machine has (a missing tool is SKIP)
- nvml-calls.json   every NVML function slurm_hooks names, against the real library: is it in
                    pynvml, does libnvidia-ml export it, and for the per-GPU getters that take only a
                    handle, what each GPU answers (value or NVML error name), each call bounded
- summary.json      what ran, exit codes, seconds, versions

Bounds: capture 60 s, check 60 s, qualify 240 s, the NVML probe 60 s (5 s a call): 7 minutes
with every step hung, about a minute on a healthy 8-GPU node with DCGM. The device machine reaches no network: carry the two pure-Python dependencies with the tree
(`pip install --target .devicepy nvidia-ml-py toml` here, then run with PYTHONPATH=.:.devicepy and
carry [".devicepy"]). It changes nothing on the GPU: only getters are called (no set*, no reset,
no clear*). --root and LD_LIBRARY_PATH run it on the fake node (tests/test_device_smoke.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "slurm_hooks"]
# NVML getters that take only a device handle: safe to call on every GPU, nothing is changed
NAME_PATTERN = re.compile(r"\bnvml(?:Device|System)Get[A-Za-z0-9_]*")
CALL_TIMEOUT_S = 5.0
PROBE_DEADLINE_S = (
    90.0  # all NVML calls together: a wedged driver costs 60 s, not 60 names x GPUs x 5 s
)
# the getters that need more than the handle, with the arguments our checks pass (nvml.h's enums:
# sensor 0 = GPU, link 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_AGGREGATE_ECC = 1,
# NVML_CLOCK_GRAPHICS = 0, NVML_PERF_POLICY_POWER = 0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1);
# still only reads
EXTRA_ARGS = {
    "nvmlDeviceGetTemperature": (0,),
    "nvmlDeviceGetTemperatureThreshold": (1,),
    "nvmlDeviceGetNvLinkState": (0,),
    "nvmlDeviceGetNvLinkErrorCounter": (0, 0),
    "nvmlDeviceGetTotalEccErrors": (1, 1),
    "nvmlDeviceGetMemoryErrorCounter": (1, 1, 0),
    "nvmlDeviceGetRetiredPages": (0,),
    "nvmlDeviceGetRetiredPages_v2": (0,),
    "nvmlDeviceGetApplicationsClock": (0,),
    "nvmlDeviceGetDefaultApplicationsClock": (0,),
    "nvmlDeviceGetViolationStatus": (0,),
    "nvmlDeviceGetCpuAffinity": (4,),
}
VALUE_CHARS = 400


def nvml_names(package_dir: str) -> List[str]:
    """Every nvmlDeviceGet*/nvmlSystemGet* name written in the package's sources, sorted."""
    names = set()
    for folder, _dirs, files in os.walk(package_dir):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    names.update(NAME_PATTERN.findall(handle.read()))
    return sorted(names)


def bounded(function, *args) -> Dict[str, Any]:
    """function(*args) on a daemon thread, waited for CALL_TIMEOUT_S: a hung driver call is
    recorded as such and left behind (the process exits at the end)."""
    box: Dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        try:
            box["raw"] = function(*args)  # the caller's to keep (a handle); not in the fixture
            box["value"] = repr(box["raw"])[:VALUE_CHARS]
        except (
            Exception
        ) as exc:  # NVMLError_* (its class name says which), TypeError for a signature
            box["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
        box["seconds"] = round(time.monotonic() - started, 4)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(CALL_TIMEOUT_S)
    return box if not thread.is_alive() else {"error": "hung > %.0f s" % CALL_TIMEOUT_S}


def probe_nvml(names: List[str]) -> Dict[str, Any]:
    """Each name: in pynvml?, exported by the loaded libnvidia-ml?, and per-GPU answers."""
    import pynvml  # nvidia-ml-py

    out: Dict[str, Any] = {"functions": {}, "gpus": []}
    init = bounded(pynvml.nvmlInit)
    init.pop("raw", None)
    out["init"] = init
    if "error" in init:
        return out
    library = getattr(pynvml, "nvmlLib", None)
    count = bounded(pynvml.nvmlDeviceGetCount)
    out["count"] = {k: v for k, v in count.items() if k != "raw"}
    handles = []
    for index in range(count.get("raw", 0) if "raw" in count else 0):
        answer = bounded(pynvml.nvmlDeviceGetHandleByIndex, index)
        if "raw" in answer:
            handles.append(answer.pop("raw"))
        out["gpus"].append({"index": index, "handle": answer})
    deadline = time.monotonic() + PROBE_DEADLINE_S
    for name in names:
        entry: Dict[str, Any] = {"in_pynvml": hasattr(pynvml, name)}
        if time.monotonic() > deadline:
            entry["not_asked"] = "the probe's %.0f s were spent" % PROBE_DEADLINE_S
            out["functions"][name] = entry
            continue
        entry["exported"] = _exported(library, name)
        function = getattr(pynvml, name, None)
        if function is not None and name.startswith("nvmlSystemGet"):
            entry["system"] = _plain(bounded(function))
        elif function is not None:
            extra = EXTRA_ARGS.get(name, ())
            entry["per_gpu"] = [_plain(bounded(function, h, *extra)) for h in handles]
        out["functions"][name] = entry
    bounded(pynvml.nvmlShutdown)
    return out


def _plain(answer: Dict[str, Any]) -> Dict[str, Any]:
    answer.pop("raw", None)  # ctypes structs and handles do not go into JSON
    return answer


def _exported(library: Optional[ctypes.CDLL], name: str) -> Optional[bool]:
    if library is None:
        return None
    try:
        getattr(library, name)
        return True
    except AttributeError:
        return False


def step(name: str, argv: List[str], out_dir: str, stdout_file: Optional[str], timeout: float):
    """One CLI step, bounded; its stdout kept in stdout_file, stderr's tail in the summary."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, errors="replace"
        )
        result = {"rc": done.returncode, "stderr_tail": done.stderr[-2000:]}
        if stdout_file:
            with open(os.path.join(out_dir, stdout_file), "w") as handle:
                handle.write(done.stdout)
    except subprocess.TimeoutExpired as exc:
        result = {"rc": None, "error": "timed out after %.0f s" % timeout}
        if stdout_file and exc.stdout:
            with open(os.path.join(out_dir, stdout_file), "wb") as handle:
                handle.write(exc.stdout if isinstance(exc.stdout, bytes) else exc.stdout.encode())
    result["seconds"] = round(time.monotonic() - started, 2)
    print("%-10s rc=%s %.1f s" % (name, result.get("rc"), result["seconds"]), file=sys.stderr)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the fixtures (the run's $OUT)")
    parser.add_argument("--level", default="quick", choices=("quick", "standard", "long"))
    parser.add_argument("--root", help="a fake or captured tree (tests): --root/--live nvml")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    root = ["--root", args.root] if args.root else []
    live = root + (["--live", "nvml"] if args.root else [])
    summary: Dict[str, Any] = {"python": sys.version.split()[0], "steps": {}}
    steps = summary["steps"]
    started = time.monotonic()
    archive = os.path.join(os.path.abspath(args.out), "capture.tar.gz")
    steps["capture"] = step("capture", CLI + ["capture", archive] + root, args.out, None, 60)
    steps["check"] = step(
        "check", CLI + ["check", "--all-contexts", "--json"] + live, args.out, "check.json", 60
    )
    steps["qualify"] = step(
        "qualify",
        CLI + ["qualify", "--level", args.level, "--json", "--no-record"] + root,
        args.out,
        "qualify.json",
        240,
    )
    calls_started = time.monotonic()
    names = nvml_names(os.path.join(REPO, "slurm_hooks"))
    try:
        calls = probe_nvml(names)
    except Exception as exc:  # pynvml missing or broken: recorded, the other fixtures still count
        calls = {"error": "%s: %s" % (type(exc).__name__, exc)}
    with open(os.path.join(args.out, "nvml-calls.json"), "w") as handle:
        json.dump(calls, handle, indent=1, sort_keys=True)
    steps["nvml-calls"] = {
        "names": len(names),
        "seconds": round(time.monotonic() - calls_started, 2),
    }
    summary["seconds"] = round(time.monotonic() - started, 2)
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    print("device smoke: %.1f s, fixtures in %s" % (summary["seconds"], args.out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
