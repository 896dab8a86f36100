#!/usr/bin/env python3
"""Prolog latency of a git revision against the working tree, as a ratio, on the same machine at the same time.

    .venv/bin/python bench/compare.py 4519b2a            # 100 interleaved runs of each, 8-GPU example node
    .venv/bin/python bench/compare.py HEAD~3 --runs 200
    .venv/bin/python bench/compare.py 4519b2a --gpus 72 --runs 10        # a 72-GPU node (bench/specs.py)
    .venv/bin/python bench/compare.py 4519b2a --extra-nvme 400 --runs 10 # the example node + 400 NVMe drives
    .venv/bin/python bench/compare.py ecdf49a --runs 40 --command check system   # another verb

Each round also runs the interpreter floor, `python -s -c pass` of the working tree's install (the
console script's interpreter, as slurmd starts it), so every median is also given as a multiple
of the floor measured in the same rounds: the figure issue #26's goals are stated in.

Absolute milliseconds on a shared VM move with its load (this project's 2-core VM has shown the
same prolog at 130 ms and at 470 ms hours apart); a ratio of runs interleaved one by one does not.
Both sides are regular installs made by bench/install.py (the revision's slurm_hooks/ and
pyproject.toml from `git archive`), run as slurmd runs the prolog on the 8-GPU example node (or
one of bench/specs.py's shapes) with the bench configuration (bench/nodeenv.py); every run must
exit 0 with status OK.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import specs  # noqa: E402
from bench.install import make_install  # noqa: E402
from bench.measure import Stats  # noqa: E402
from bench.nodeenv import BenchNode, log_fields  # noqa: E402

WARMUP = 3


def export_revision(revision: str, target: str) -> str:
    """slurm_hooks/ and pyproject.toml of `revision`, extracted under target."""
    archive = os.path.join(target, "source.tar")
    subprocess.run(
        [
            "git",
            "archive",
            "--format=tar",
            "-o",
            archive,
            revision,
            "slurm_hooks",
            "pyproject.toml",
        ],
        cwd=REPO,
        check=True,
        timeout=60,
    )
    source = os.path.join(target, "source")
    with tarfile.open(archive) as tar:
        tar.extractall(source)  # our own repository's files
    return source


def config_for(revision: str, config_path: str, base: str) -> str:
    """The bench configuration as `revision` understands it: a setting newer than the revision (an unknown
    key is a configuration error, and the prolog would fail open at once, measuring nothing) is left out.
    [general] root_live_sources: before it existed, NVML was read under any root, which is what it asks for."""
    known = (
        subprocess.run(
            ["git", "grep", "-q", "root_live_sources", revision, "--", "slurm_hooks"], cwd=REPO
        ).returncode
        == 0
    )
    with open(config_path) as handle:
        lines = handle.read().splitlines(True)
    path = os.path.join(base, "before-config.toml")
    with open(path, "w") as handle:
        handle.writelines(
            line for line in lines if known or not line.startswith("root_live_sources")
        )
    os.chmod(path, 0o644)
    return path


def compare(
    revision: str,
    runs: int,
    gpus: Optional[int] = None,
    extra_nvme: Optional[int] = None,
    command: Optional[List[str]] = None,
) -> int:
    verb = command or ["prolog"]
    base = tempfile.mkdtemp(prefix="slurm-hooks-compare-")
    if gpus is not None:
        node = BenchNode.create(specs.gpu_node_spec(gpus))
    else:
        node = BenchNode.create(
            "dgx-h100", specs.pcie_node_spec(extra_nvme) if extra_nvme else None
        )
    try:
        before = make_install(os.path.join(base, "before"), export_revision(revision, base))[1]
        after_python, after = make_install(os.path.join(base, "after"))
        floor = [after_python, "-s", "-c", "pass"]
        before_config = config_for(revision, node.config_path, base)
        times: Dict[str, List[float]] = {"before": [], "after": [], "floor": []}
        # CPU time of each run's whole process tree (getrusage of the reaped children: the hook's
        # check process and helper are reaped inside it): on a shared 2-core VM the wall time
        # follows the other users' load, the CPU time much less
        cpu: Dict[str, List[float]] = {"before": [], "after": [], "floor": []}
        job = 1000
        for i in range(runs + WARMUP):
            order = [
                ("floor", floor),
                ("before", before + verb),
                ("after", after + verb),
            ]
            order = order[i % 3 :] + order[: i % 3]  # rotate: no side always follows another
            for name, argv in order:
                job += 1
                env = node.hook_env("prolog", job)
                if name == "before":
                    env["SLURM_HOOKS_CONFIG"] = before_config
                used = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                done = subprocess.run(argv, env=env, capture_output=True)
                if i >= WARMUP:
                    times[name].append(time.perf_counter() - started)
                    now = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name].append(now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime)
                if done.returncode != 0 and verb == ["prolog"]:
                    print("%s exited %d: %s" % (name, done.returncode, done.stderr.decode()[-500:]))
                    return 1
        bad = [line for line in node.decision_lines() if log_fields(line).get("status") != "OK"]
        print("command: slurm-hooks %s" % " ".join(verb))
        stats = {name: Stats(values).ms() for name, values in times.items()}
        floor_ms = stats["floor"]["median"]
        for name, label in (
            ("floor", "python -s -c pass"),
            ("before", revision),
            ("after", "working tree"),
        ):
            st = stats[name]
            print(
                "%-18s median %6.1f ms (%5.2fx floor)  p90 %6.1f ms  p99 %6.1f ms  (%d runs)"
                % (label, st["median"], st["median"] / floor_ms, st["p90"], st["p99"], st["n"])
            )
        print(
            "ratio working tree / %s: %.3f (medians)"
            % (revision, stats["after"]["median"] / stats["before"]["median"])
        )
        cpu_ms = {name: Stats(values).ms()["median"] for name, values in cpu.items()}
        print(
            "CPU of the process tree, medians: floor %.1f ms, %s %.1f ms, working tree %.1f ms,"
            " ratio %.3f"
            % (
                cpu_ms["floor"],
                revision,
                cpu_ms["before"],
                cpu_ms["after"],
                cpu_ms["after"] / cpu_ms["before"],
            )
        )
        print("load average now: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
        if bad:
            print("non-OK decisions: %d, e.g. %s" % (len(bad), bad[0]))
            return 1
        return 0
    finally:
        node.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "revision", help="git revision to compare with (e.g. a commit, HEAD~3, a tag)"
    )
    parser.add_argument(
        "--runs", type=int, default=100, help="runs of each side after %d warm-up rounds" % WARMUP
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--gpus", type=int, metavar="N", help="a node of N GPUs, 4 per switch and NUMA node"
    )
    shape.add_argument(
        "--extra-nvme", type=int, metavar="N", help="the example node with N more NVMe drives"
    )
    parser.add_argument(
        "--command",
        nargs="+",
        metavar="WORD",
        help="the slurm-hooks arguments to time instead of `prolog` (e.g. check system); its exit "
        "status is not judged (a check verb exits non-zero on a WARN of the bench node)",
    )
    args = parser.parse_args(argv)
    return compare(args.revision, args.runs, args.gpus, args.extra_nvme, args.command)


if __name__ == "__main__":
    sys.exit(main())
