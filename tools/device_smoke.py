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
- prolog-timing.json  with --prolog-runs N: `slurm-hooks prolog` as slurmd runs it for a job holding
                    every GPU (observe mode, state and log in a temporary folder), interleaved with
                    the interpreter floor `python -s -c pass`: medians of wall and CPU, and the ratio
                    issue 29 states its goal in, measured on the real driver; with --compare-tree
                    DIR, another checkout's prolog in the same rounds (vs_compare_wall/_cpu)
- summary.json      what ran, exit codes, seconds, versions

Bounds: capture 60 s, check 60 s, qualify 240 s, the NVML probe 90 s (5 s a call), each prolog
run 60 s: 8 minutes with every step hung and no --prolog-runs; 8 s on the H200 machine lent on
2026-12-04 (tests/captures/device/h200-vm). The device machine reaches no network; its image has
Python 3.12 and nvidia-ml-py. Elsewhere carry the two pure-Python dependencies with the tree
(`pip install --target .devicepy nvidia-ml-py toml` here, then PYTHONPATH=.:.devicepy and carry
[".devicepy"]). It changes nothing on the GPU: only getters are called (no set*, no reset,
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
# NVML_MEMORY_LOCATION_DRAM = 2 and _SRAM = 7 (checks/gpu/memory.py asks both), NVML_CLOCK_GRAPHICS = 0,
# NVML_PERF_POLICY_POWER = 0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1); still only reads. A list
# holds several argument sets, each recorded under its arguments (per_gpu_by_args).
EXTRA_ARGS: Dict[str, Any] = {
    "nvmlDeviceGetTemperature": (0,),
    "nvmlDeviceGetTemperatureThreshold": (1,),
    "nvmlDeviceGetNvLinkState": (0,),
    "nvmlDeviceGetNvLinkErrorCounter": (0, 0),
    "nvmlDeviceGetTotalEccErrors": [(1, 1), (1, 0), (0, 0)],
    "nvmlDeviceGetMemoryErrorCounter": [(1, 1, 2), (1, 1, 7)],
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
        elif name == "nvmlDeviceGetFieldValues" and function is not None:
            entry["per_gpu"] = [_field_values(function, h) for h in handles]
        elif function is not None:
            extra = EXTRA_ARGS.get(name, ())
            if isinstance(extra, list):
                entry["per_gpu_by_args"] = {
                    repr(args): [_plain(bounded(function, h, *args)) for h in handles]
                    for args in extra
                }
            else:
                entry["per_gpu"] = [_plain(bounded(function, h, *extra)) for h in handles]
        out["functions"][name] = entry
    bounded(pynvml.nvmlShutdown)
    return out


def field_ids() -> Dict[str, int]:
    """The nvmlDeviceGetFieldValues ids slurm_hooks asks for: hw/nvml.py's FI_* constants by name,
    and records/nvlink_errors.py's per-link error counters for link 0."""
    from slurm_hooks.hw import nvml
    from slurm_hooks.records import nvlink_errors

    ids = {
        name: value
        for name, value in vars(nvml).items()
        if name.startswith("FI_") and isinstance(value, int)
    }
    for counter in nvlink_errors.NVLINK_COUNTERS:
        ids["nvlink.%s.L0" % counter] = nvlink_errors.error_field_id(counter, 0)
    return ids


def _field_values(function, handle) -> Dict[str, Any]:
    """Each field id's own answer: nvmlReturn, valueType, the value's member for that type,
    and the fieldId the driver echoed (NvmlSession.field_values trusts the order)."""
    ids = field_ids()
    answer = bounded(function, handle, list(ids.values()))
    raw = answer.pop("raw", None)
    if raw is None:
        return answer
    from slurm_hooks.hw.nvml import FIELD_VALUE_MEMBERS

    entries = {}
    for (name, asked), value in zip(ids.items(), raw):
        member = FIELD_VALUE_MEMBERS.get(value.valueType)
        entries[name] = {
            "asked": asked,
            "fieldId": value.fieldId,
            "nvmlReturn": value.nvmlReturn,
            "valueType": value.valueType,
            "value": getattr(value.value, member) if member and value.nvmlReturn == 0 else None,
        }
    return {"seconds": answer.get("seconds"), "fields": entries}


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


def prolog_timing(
    runs: int, gpus: int, root: Optional[str], compare_tree: Optional[str] = None
) -> Dict[str, Any]:
    """`slurm-hooks prolog` for a job holding all `gpus` GPUs, as slurmd starts it (its environment,
    no PATH), in observe mode with state, log, records and the parsed-config cache in a temporary
    folder, interleaved run by run with the interpreter floor; 2 warm-up rounds not counted.
    compare_tree: another checkout's root (its slurm_hooks/), run the same way in the same rounds
    ("compare"), so two revisions are compared on the real driver as bench/compare.py does on the
    fake node."""
    import resource
    import shutil
    import statistics
    import tempfile

    base = tempfile.mkdtemp(prefix="slurm-hooks-smoke-")
    os.chmod(base, 0o755)  # the config's ownership check wants no group/world-writable folder
    config = os.path.join(base, "config.toml")
    general = 'mode = "observe"\n'
    if root:
        general += 'root = %s\nroot_live_sources = ["nvml"]\n' % json.dumps(root)
    with open(config, "w") as handle:
        handle.write(
            "[general]\n%s\n[paths]\nstate_dir = %s\nlog_file = %s\nsyslog = false\n\n"
            "[records]\ndir = %s\n"
            % (
                general,
                json.dumps(os.path.join(base, "state")),
                json.dumps(os.path.join(base, "hooks.log")),
                json.dumps(os.path.join(base, "jobs")),
            )
        )
    listed = ",".join(str(i) for i in range(gpus))
    env = {
        "SLURM_HOOKS_CONFIG": config,
        "SLURM_HOOKS_CONFIG_CACHE": os.path.join(base, "run"),
        "LANG": "C.UTF-8",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURMD_NODENAME": "node1",
        "SLURM_JOB_GPUS": listed,
        "CUDA_VISIBLE_DEVICES": listed,
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
    }
    for carried in ("PYTHONPATH", "LD_LIBRARY_PATH", "FAKE_NVML_STATE"):  # our tree, a fake node
        if carried in os.environ:
            env[carried] = os.environ[carried]
    if os.geteuid() != 0:
        env["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"] = "1"
    # name -> (argv, the tree it imports slurm_hooks from: cwd and first on PYTHONPATH)
    commands = {
        "prolog": (CLI + ["prolog"], REPO),
        "floor": ([sys.executable, "-s", "-c", "pass"], None),
    }
    if compare_tree:
        commands["compare"] = (CLI + ["prolog"], os.path.abspath(compare_tree))
    samples: Dict[str, List[float]] = {n + s: [] for n in commands for s in ("", "_cpu")}
    codes = set()
    last = None
    carried_path = env.get("PYTHONPATH", "")
    for round_number in range(runs + 2):
        for name, (argv, tree) in commands.items():
            env["SLURM_JOB_ID"] = str(1000 + round_number)
            if tree:
                env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, carried_path) if p)
            cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=60, cwd=tree or REPO
            )
            wall = time.perf_counter() - started
            cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
                cpu_after.ru_stime - cpu_before.ru_stime
            )
            if round_number < 2:
                continue
            samples[name].append(wall)
            samples[name + "_cpu"].append(cpu)
            if name != "floor":
                codes.add(done.returncode)
            if name == "prolog":
                last = done
    medians = {name: round(statistics.median(values), 4) for name, values in samples.items()}
    log_tail = ""
    if os.path.exists(os.path.join(base, "hooks.log")):
        with open(os.path.join(base, "hooks.log"), errors="replace") as handle:
            log_tail = handle.read()[-3000:]
    shutil.rmtree(base, ignore_errors=True)
    out = {
        "runs": runs,
        "gpus": gpus,
        "medians_s": medians,
        "ratio_wall": round(medians["prolog"] / medians["floor"], 2),
        "ratio_cpu": round(medians["prolog_cpu"] / max(medians["floor_cpu"], 1e-6), 2),
        "prolog_exit_codes": sorted(codes),
        "last_stdout": last.stdout[-2000:] if last else "",
        "last_stderr": last.stderr[-2000:] if last else "",
        "log_tail": log_tail,
    }
    if compare_tree:  # this tree against the other, as bench/compare.py prints it
        out["compare_tree"] = compare_tree
        out["vs_compare_wall"] = round(medians["prolog"] / medians["compare"], 3)
        out["vs_compare_cpu"] = round(medians["prolog_cpu"] / max(medians["compare_cpu"], 1e-6), 3)
    return out


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
    parser.add_argument(
        "--prolog-runs", type=int, default=0, help="time the prolog N times (prolog-timing.json)"
    )
    parser.add_argument(
        "--compare-tree",
        help="another checkout's root: its prolog timed in the same rounds (vs_compare_*)",
    )
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
    if args.prolog_runs > 0:
        timing_started = time.monotonic()
        gpus = int(calls.get("count", {}).get("value", 0) or 0)
        try:
            timing = prolog_timing(args.prolog_runs, gpus, args.root, args.compare_tree)
        except Exception as exc:  # recorded; the fixtures above still count
            timing = {"error": "%s: %s" % (type(exc).__name__, exc)}
        with open(os.path.join(args.out, "prolog-timing.json"), "w") as handle:
            json.dump(timing, handle, indent=1, sort_keys=True)
        steps["prolog-timing"] = {
            "seconds": round(time.monotonic() - timing_started, 2),
            "ratio_wall": timing.get("ratio_wall"),
        }
    summary["seconds"] = round(time.monotonic() - started, 2)
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    print("device smoke: %.1f s, fixtures in %s" % (summary["seconds"], args.out), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
