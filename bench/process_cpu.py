#!/usr/bin/env python3
"""CPU time of each process of a prolog, a git revision against the working tree, alternated run by run.

    .venv/bin/python bench/process_cpu.py 6096f2c            # 30 pairs on the 8-GPU example node
    .venv/bin/python bench/process_cpu.py HEAD~1 --runs 60

bench/compare.py gives the whole process tree's CPU (~135 ms, which moves by a few ms with the
machine's load); a change of half a millisecond in one process is lost in it. Here each prolog runs
as `python -s -c "from bench.process_cpu import inside; inside()"` with PYTHONPATH on one side's
slurm_hooks/ first (this checkout's, or the revision's from `git archive`), on the bench node
(bench/nodeenv.py), and each process writes getrusage(RUSAGE_SELF) (user + system) when it leaves through os._exit: the hook
before its first fork (the check process's) and at its end, the check process at its end. Medians
of `--runs` pairs, the order of the two sides alternating. Used for issue 29's round 8
(docs/performance.md). "hook fork" includes the interpreter's start and this module's import.
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inside() -> None:
    """The prolog, with each process's CPU written to $PROCESS_CPU_OUT as it leaves."""
    import resource

    out = os.environ["PROCESS_CPU_OUT"]
    role = ["hook"]
    marks = []

    def used() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return (usage.ru_utime + usage.ru_stime) * 1e3

    exit_now, fork = os._exit, os.fork

    def leave(code: int) -> None:
        with open(out, "a") as handle:
            handle.write("%s %s end=%.2f\n" % (role[0], " ".join(marks), used()))
        exit_now(code)

    def forked() -> int:
        if role[0] == "hook" and not marks:
            marks.append("fork=%.2f" % used())
        pid = fork()
        if pid == 0:
            role[0] = "check" if role[0] == "hook" else "helper"
            del marks[:]
        return pid

    os._exit, os.fork = leave, forked
    sys.argv = ["slurm-hooks", "prolog"]
    from slurm_hooks.cli.main import run

    run()


def main() -> int:
    import argparse  # here, not at the top: the prolog runs this file too (inside), as light as it can
    import shutil
    import statistics
    import subprocess
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from bench.nodeenv import BenchNode

    scratch = tempfile.mkdtemp(prefix="process-cpu-")
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", args.revision, "slurm_hooks"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", scratch], input=archive, check=True)
    sides = {args.revision: scratch, "working tree": REPO}
    rows = {name: [] for name in sides}
    node = BenchNode.create()
    try:
        for run in range(args.runs + 2):  # the first pair warms the configuration cache and pages
            order = list(sides) if run % 2 else list(reversed(list(sides)))
            for name in order:
                out = os.path.join(scratch, "cpu.txt")
                if os.path.exists(out):
                    os.unlink(out)
                env = dict(
                    node.hook_env("prolog", 5000 + run),
                    PYTHONPATH=os.pathsep.join(dict.fromkeys((sides[name], REPO))),
                    PROCESS_CPU_OUT=out,
                )
                done = subprocess.run(  # imported, not run as a script: no compile of this file
                    [sys.executable, "-s", "-c", "from bench.process_cpu import inside; inside()"],
                    env=env,
                    capture_output=True,
                    cwd="/",  # -c puts the working directory first on sys.path: not a checkout
                )
                if done.returncode != 0:
                    print(done.stderr.decode()[-2000:])
                    return 1
                if run >= 2:
                    rows[name].append(_parse(out))
    finally:
        node.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)
    print("CPU ms per process (medians of %d alternated pairs)" % args.runs)
    print("%-14s %10s %10s %10s %10s" % ("", "hook fork", "hook after", "hook", "check"))
    for name, values in rows.items():
        print(
            "%-14s %10.2f %10.2f %10.2f %10.2f"
            % (
                name[:14],
                statistics.median(v[0] for v in values),
                statistics.median(v[1] - v[0] for v in values),
                statistics.median(v[1] for v in values),
                statistics.median(v[2] for v in values),
            )
        )
    return 0


def _parse(path: str):
    """(hook CPU at its first fork, hook CPU at its end, check process CPU at its end)."""
    fields = {}
    with open(path) as handle:
        for line in handle:
            role, *pairs = line.split()
            fields[role] = dict(pair.split("=") for pair in pairs)
    hook = fields["hook"]
    return float(hook["fork"]), float(hook["end"]), float(fields["check"]["end"])


if __name__ == "__main__":
    sys.exit(main())
