"""Stand-ins for dcgmi, nvbandwidth, all_reduce_perf and ib_write_bw: they replay a real output from
tests/captures/diag (README there), plant a fault in it on demand, or hang, crash or print garbage.

Put this directory first on PATH. Environment:
  QUALIFY_STANDIN_<TOOL>   (DCGMI, NVBANDWIDTH, ALL_REDUCE_PERF, IB_WRITE_BW): a capture file name
                           to replay, or hang | crash | garbage | exit3
  QUALIFY_STANDIN_FAULT    comma-separated planted faults: slow_gpu=N (GPU N at half its
                           device<->device bandwidth, the all-reduce 40% slower), x8_link=N (GPU N's
                           host<->device copies halved), ib_half (the port at half rate), nccl_wrong
                           (#wrong > 0), dcgm_fail (DCGM's sm_stress fails, level 3),
                           dcgm_fail_memory (DCGM's memory plugin fails, level 2)
  QUALIFY_STANDIN_LOG      a file each stand-in appends its argv to
  QUALIFY_STANDIN_DELAY_S  seconds each stand-in takes before its output (the real tools take
                           minutes: a run long enough for something to happen during it)
  QUALIFY_STANDIN_CACHE    a directory of replays already rendered (prepare() writes them, in the
                           test's own process): the stand-in, a /bin/sh script, prints the one for
                           its arguments and environment (cache_path) with cat, and runs this
                           program only where there is none (a Python start costs ~20 ms of CPU
                           each, and a qualification runs four or five tools)
dcgmi replays only the categories its -r level runs (Deployment 1, Hardware and Integration 2,
Stress 3), as DCGM does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CAPTURES = os.path.join(os.path.dirname(HERE), "captures", "diag")
DEFAULTS = {
    "dcgmi": "dcgm-2.x-json-pass.json",
    "dcgmi-text": "dcgm-4.2.3-text.txt",
    "nvbandwidth": "nvbandwidth-v0.2-rtx4090x8.txt",
    "nvbandwidth-d2d": "nvbandwidth-v0.8-a6000x6-d2d.txt",
    "all_reduce_perf": "nccl-allreduce-ring-nccltests252.txt",
    "ib_write_bw": "ib_write_bw-loopback-8M-superbench.txt",
}
CATEGORY_LEVEL = {"deployment": 1, "hardware": 2, "integration": 2, "stress": 3}


def read(name: str) -> str:
    with open(os.path.join(CAPTURES, name), encoding="utf-8") as handle:
        return handle.read()


def faults(env) -> dict:
    out = {}
    for item in filter(None, env.get("QUALIFY_STANDIN_FAULT", "").split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


def misbehave(mode: str) -> int:
    if mode == "hang":
        sys.stdout.write("starting...\n")
        sys.stdout.flush()
        if os.fork() == 0:  # a child holding stdout: the whole group must be killed
            time.sleep(3600)
            os._exit(0)
        time.sleep(3600)
    if mode == "crash":
        sys.stdout.write("Running host_to_device_memcpy_ce.\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "garbage":
        sys.stdout.write("\x00\x7f%%%% not the tool's output\n" * 50)
        return 0
    if mode == "exit3":
        sys.stdout.write("Error: unable to establish a connection to the specified host\n")
        return 3
    return -1


def dcgmi(argv, fault, env) -> str:
    level = int(argv[argv.index("-r") + 1]) if "-r" in argv else 1
    if "-j" not in argv:
        return read(DEFAULTS["dcgmi-text"])
    name = env.get("QUALIFY_STANDIN_DCGMI") or DEFAULTS["dcgmi"]
    if "dcgm_fail" in fault:
        name = "dcgm-3.x-json-per-gpu.json"
    if "dcgm_fail_memory" in fault:
        name = "dcgm-4.x-json-composed.json"
    doc = json.loads(read(name))
    for body in doc.values():
        if isinstance(body, dict) and "test_categories" in body:
            body["test_categories"] = [
                c
                for c in body["test_categories"]
                if CATEGORY_LEVEL.get(c.get("category", "").lower(), 1) <= level
            ]
    return json.dumps(doc, indent=4) + "\n"


def scale_matrix(text: str, testcase: str, gpu: int, factor: float, both: bool) -> str:
    """GPU `gpu`'s figures in testcase's matrix times factor (its column; with both, its row too)."""
    out, inside, columns = [], False, []
    for line in text.splitlines():
        if line.startswith("Running "):
            inside = line.strip() == "Running %s." % testcase
            columns = []
        elif line.startswith("SUM ") or not line.strip():
            inside = inside and not line.startswith("SUM ")
        elif inside and re.match(r"^\s*\d+(\s+\d+)*\s*$", line) and not columns:
            columns = [int(c) for c in line.split()]
        elif inside and columns and re.match(r"^\s*\d+\s", line):
            tokens = line.split()
            row = int(tokens[0])
            values = tokens[1:]
            for i, column in enumerate(columns):
                if values[i] != "N/A" and (column == gpu or (both and row == gpu)):
                    values[i] = "%.2f" % (float(values[i]) * factor)
            line = "%2d" % row + "".join("%10s" % v for v in values)
        out.append(line)
    return "\n".join(out) + "\n"


def nvbandwidth(argv, fault, env) -> str:
    wanted = argv[argv.index("-t") + 1 :] if "-t" in argv else None
    base = read(env.get("QUALIFY_STANDIN_NVBANDWIDTH") or DEFAULTS["nvbandwidth"])
    d2d = read(DEFAULTS["nvbandwidth-d2d"])
    # the d2d capture lacks its "Running" line (the reporter cut it): give it one
    d2d_block = "Running device_to_device_memcpy_read_ce.\n" + d2d[d2d.index("memcpy CE GPU") :]
    head, _, rest = base.partition("Running ")
    blocks = ["Running " + b for b in ("Running " + rest).split("Running ")[1:]] + [d2d_block]
    text = head + "".join(b for b in blocks if wanted is None or b.split()[1].rstrip(".") in wanted)
    if "x8_link" in fault:
        gpu = int(fault["x8_link"])
        for testcase in ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce"):
            text = scale_matrix(text, testcase, gpu, 0.5, both=False)
    if "slow_gpu" in fault:
        text = scale_matrix(
            text, "device_to_device_memcpy_read_ce", int(fault["slow_gpu"]), 0.5, both=True
        )
    return text


def all_reduce_perf(argv, fault, env) -> str:
    text = read(env.get("QUALIFY_STANDIN_ALL_REDUCE_PERF") or DEFAULTS["all_reduce_perf"])
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) == 13 and tokens[0].isdigit():
            if "slow_gpu" in fault:
                for i in (6, 7, 10, 11):
                    tokens[i] = "%.2f" % (float(tokens[i]) * 0.6)
            if "nccl_wrong" in fault:
                tokens[8] = "17"
            line = "%12s%14s%10s%8s%8s%9s%8s%8s%7s%9s%8s%8s%7s" % tuple(tokens)
        elif "nccl_wrong" in fault and line.startswith("# Out of bounds values"):
            line = "# Out of bounds values : %d FAILED" % (
                17 * sum(1 for previous in out if "     17" in previous)
            )
        out.append(line)
    return "\n".join(out) + "\n"


def ib_write_bw(argv, fault, env) -> str:
    if "localhost" not in argv:  # the server side of the loopback pair (it waits: wait_s)
        return "\n************************************\n* Waiting for client to connect... *\n************************************\n"
    text = read(env.get("QUALIFY_STANDIN_IB_WRITE_BW") or DEFAULTS["ib_write_bw"])
    if "ib_half" not in fault:
        return text
    out = []
    for line in text.splitlines():
        match = re.match(r"^(\s*\d+\s+\d+\s+)([0-9.]+)(\s+)([0-9.]+)(.*)$", line)
        if match:
            line = "%s%.2f%s%.2f%s" % (
                match.group(1),
                float(match.group(2)) / 2,
                match.group(3),
                float(match.group(4)) / 2,
                match.group(5),
            )
        out.append(line)
    return "\n".join(out) + "\n"


RENDER = {
    "dcgmi": dcgmi,
    "nvbandwidth": nvbandwidth,
    "all_reduce_perf": all_reduce_perf,
    "ib_write_bw": ib_write_bw,
}
MODES = ("hang", "crash", "garbage", "exit3")


def wait_s(tool: str, argv) -> float:
    """How long `tool argv` waits before its output: the server side of the ib_write_bw pair
    waits for its client (the ib_write_bw script waits the same before a rendered replay)."""
    return 0.2 if tool == "ib_write_bw" and "localhost" not in argv else 0.0


def render(tool: str, argv, env) -> str:
    """What `tool argv` prints under env (its capture, with env's planted faults)."""
    return RENDER[tool](list(argv), faults(env), env)


def cache_path(cache: str, tool: str, argv, env):
    """Where the stand-in script looks for the replay of `tool argv` under env:
    CACHE/TOOL/f=FAULT/r=REPLAY/a ARG1 ARG2 ..., or None where a part holds a '/' (or an argument
    a ' ') and so no name can stand for it alone, or the name is too long (the script runs
    standin.py then)."""
    fault = env.get("QUALIFY_STANDIN_FAULT", "")
    replay = env.get("QUALIFY_STANDIN_" + tool.upper(), "")
    name = " ".join(["a"] + list(argv))
    parts = ["f=" + fault, "r=" + replay, name]
    if any("/" in p or len(p) > 200 for p in parts) or any(" " in a for a in argv):
        return None
    return os.path.join(cache, tool, *parts)


def prepare(tool: str, argv, env) -> None:
    """Render the replay of `tool argv` under env into env's QUALIFY_STANDIN_CACHE, where the
    stand-in script finds it; nothing for a hang, crash, garbage or exit3 (standin.py does those),
    a log or a delay."""
    cache = env.get("QUALIFY_STANDIN_CACHE")
    path = cache and cache_path(cache, tool, argv, env)
    if not path or os.path.exists(path):
        return
    if env.get("QUALIFY_STANDIN_" + tool.upper()) in MODES or env.get("QUALIFY_STANDIN_LOG"):
        return
    if env.get("QUALIFY_STANDIN_DELAY_S"):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".part", "w", encoding="utf-8") as handle:
        handle.write(render(tool, argv, env))
    os.replace(path + ".part", path)


def main(tool: str, argv) -> int:
    env = os.environ
    log = env.get("QUALIFY_STANDIN_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps([tool] + list(argv)) + "\n")
    time.sleep(float(env.get("QUALIFY_STANDIN_DELAY_S") or 0))
    mode = env.get("QUALIFY_STANDIN_" + tool.upper(), "")
    code = misbehave(mode)
    if code >= 0:
        return code
    text = render(tool, argv, env)
    time.sleep(wait_s(tool, argv))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # the stand-in scripts: standin.py TOOL ARGS
    sys.exit(main(sys.argv[1], sys.argv[2:]))
