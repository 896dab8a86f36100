#!/usr/bin/env python3
"""Nodes with ~25,000-100,000 processes: system.processes and numa.housekeeping against their timeouts.

    .venv/bin/python bench/process_scale.py                  # fake node with 25,000 extra processes
    .venv/bin/python bench/process_scale.py --processes 100000 --runs 3   # the issue 24 scale
    .venv/bin/python bench/process_scale.py --live 5000      # also 5,000 real sleeping processes, and psutil
    .venv/bin/python bench/process_scale.py --processes 2000 --runs 2   # quick

What is timed is what a run pays: the check with its gatherer (a fresh run each time, so nothing is
cached), in-process, medians of --runs. The fake node (tests/fakenode, `[node] extra_processes`) is
read under --root: every path is resolved inside the tree, so it costs more per file than the live
/proc. --live N forks N real processes that sleep (a small C helper; pid_max permitting) and times
the same checks on Host("/"), then psutil's enumeration of the same processes (psutil is what the
issue asked us to weigh: `process_iter(["name"])`, and `cpu_affinity()` of each, which is what
housekeeping needs besides the cgroup psutil cannot give), and psutil's import time, the cost a
prolog would pay to use it. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from slurm_hooks.core.config import validate  # noqa: E402
from slurm_hooks.core.runner import run_checks  # noqa: E402
from slurm_hooks.hw.host import Host  # noqa: E402
from slurm_hooks.registry import load_builtin_checks  # noqa: E402

SLEEPERS_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {       /* fork N children that sleep; print "ready"; exit on SIGTERM */
    int n = atoi(argv[1]);
    setpgid(0, 0);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) { for (;;) pause(); }
        if (pid < 0) { perror("fork"); break; }
    }
    printf("ready\n"); fflush(stdout);
    for (;;) pause();
}
"""
CONFIG = {
    "checks": {
        "system.processes": {"required": ["sshd", "munged", "slurmd"], "forbidden": ["Xorg"]},
        "numa.housekeeping": {"housekeeping_cpus": "0-1"},
    }
}


def median_s(func: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_checks(root: str, runs: int) -> Dict[str, float]:
    """Wall-clock medians per check; the CPU time of each run (process_time, all threads) is kept
    in CPU_MEDIANS: on a shared, loaded machine the wall clock mostly measures the neighbours."""
    from slurm_hooks.core.structs import replace

    registry = load_builtin_checks()
    config = validate(registry, CONFIG)
    out = {}
    for name in ("system.processes", "numa.housekeeping"):
        # no per-check timeout here: a run past it is measured, not cut (and reported in %)
        spec = replace(registry.checks[name], timeout=300.0)
        cpu: List[float] = []

        # spec bound here (ruff B023), though median_s calls once() in this iteration only
        def once(spec=spec, cpu=cpu):
            start = time.process_time()
            run_checks(registry, config, Host(root), "manual", [spec], deadline=300.0)
            cpu.append(time.process_time() - start)

        out[name] = median_s(once, runs)
        CPU_MEDIANS[(root, name)] = statistics.median(cpu)
    return out


CPU_MEDIANS: Dict[tuple, float] = {}


def fake_node_figures(processes: int, runs: int) -> List[str]:
    from tests.fakenode import FakeNode

    start = time.perf_counter()
    node = FakeNode.build_temp("cpu-only", {"node": {"extra_processes": processes}})
    built = time.perf_counter() - start
    try:
        figures = time_checks(str(node.root), runs)
    finally:
        node.cleanup()
    registry = load_builtin_checks()
    return [
        "fake node (cpu-only + %d processes, built in %.1f s), --root, median of %d:"
        % (processes, built, runs)
    ] + [
        "  %-18s %7.3f s   timeout %.1f s (%.0f%%)   cpu %.3f s"
        % (
            name,
            s,
            registry.checks[name].timeout,
            100 * s / registry.checks[name].timeout,
            CPU_MEDIANS[(str(node.root), name)],
        )
        for name, s in figures.items()
    ]


def start_sleepers(count: int, workdir: str) -> subprocess.Popen:
    source = os.path.join(workdir, "sleepers.c")
    binary = os.path.join(workdir, "sleepers")
    with open(source, "w") as handle:
        handle.write(SLEEPERS_C)
    subprocess.run(["gcc", "-O1", "-o", binary, source], check=True)
    proc = subprocess.Popen([binary, str(count)], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit("sleepers did not start")
    return proc


def live_figures(count: int, runs: int) -> List[str]:
    with tempfile.TemporaryDirectory() as workdir:
        sleepers = start_sleepers(count, workdir)
        try:
            total = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
            ours = time_checks("/", runs)
            psutil_figures = psutil_scan(runs)
        finally:
            os.killpg(sleepers.pid, signal.SIGTERM)
            sleepers.wait()
    registry = load_builtin_checks()
    lines = [
        "live /proc with %d processes (%d started), Host('/'), median of %d:" % (total, count, runs)
    ]
    lines += [
        "  %-18s %7.3f s   timeout %.1f s (%.0f%%)"
        % (name, s, registry.checks[name].timeout, 100 * s / registry.checks[name].timeout)
        for name, s in ours.items()
    ]
    lines += ["  %-40s %7.3f s" % (what, s) for what, s in psutil_figures.items()]
    return lines


def psutil_scan(runs: int) -> Dict[str, float]:
    import psutil

    def names():
        return {p.info["name"] for p in psutil.process_iter(["name"])}

    def affinities():
        out = {}
        for proc in psutil.process_iter():
            try:
                out[proc.pid] = proc.cpu_affinity()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return out

    host = Host("/")

    def comm_scan():
        return {
            host.read_text("/proc/%s/comm" % e, default="", max_bytes=64)
            for e in os.listdir("/proc")
            if e.isdigit()
        }

    return {
        "our comm scan (system.processes' read)": median_s(comm_scan, runs),
        "psutil process_iter(['name'])": median_s(names, runs),
        "psutil cpu_affinity() of each": median_s(affinities, runs),
    }


def import_cost(runs: int) -> List[str]:
    """`import slurm_hooks.cli.main` with and without `import psutil`, interleaved (medians, ms)."""
    python = sys.executable
    cases = {
        "slurm_hooks.cli.main": "import slurm_hooks.cli.main",
        "slurm_hooks.cli.main + psutil": "import slurm_hooks.cli.main, psutil",
    }
    times: Dict[str, List[float]] = {case: [] for case in cases}
    for _ in range(runs):
        for case, code in cases.items():
            start = time.perf_counter()
            subprocess.run([python, "-s", "-c", code], check=True, cwd=REPO)
            times[case].append(time.perf_counter() - start)
    base = statistics.median(times["slurm_hooks.cli.main"])
    with_psutil = statistics.median(times["slurm_hooks.cli.main + psutil"])
    return [
        "process start + import, interleaved, median of %d:" % runs,
        "  import slurm_hooks.cli.main           %6.1f ms" % (base * 1000),
        "  import slurm_hooks.cli.main, psutil   %6.1f ms   (+%.1f ms, %.2fx)"
        % (with_psutil * 1000, (with_psutil - base) * 1000, with_psutil / base),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--processes", type=int, default=25000, help="extra processes on the fake node"
    )
    parser.add_argument(
        "--live", type=int, default=0, metavar="N", help="also fork N real processes (0 = don't)"
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    lines = fake_node_figures(args.processes, args.runs)
    if args.live:
        lines += live_figures(args.live, args.runs)
        lines += import_cost(max(args.runs * 6, 20))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
