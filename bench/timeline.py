#!/usr/bin/env python3
"""A timeline of one prolog's processes: when each phase starts and ends, from the interpreter's spawn.

    .venv/bin/python bench/timeline.py              # 7 prologs on the example node, medians
    .venv/bin/python bench/timeline.py --runs 15 --all

The prolog runs as `python -s bench/timeline.py --inside prolog` on the fake 8-GPU node
(bench/nodeenv.py): an import hook wraps the functions in WRAPPED as their modules load, and each
call's entry and exit is appended to a file as "pid thread ms event", ms counted from the moment
this runner spawned the interpreter (CLOCK_MONOTONIC is shared by every process of the machine), in
the hook's process, its check process and the sysfs helper alike. The hook and its
wrapping add ~10 ms to the hook's own imports, so the marks are late by that much; the intervals
after them are what they are. A mark's key names its thread, so a phase that another thread
reaches first in some runs (the pynvml import) is listed only if one thread had it in half of them
(--all keeps repeated marks). Used for issue 29's round 7 (docs/performance.md).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# module -> functions (or Class.method) whose calls are marked
WRAPPED = {
    "slurm_hooks.registry": ["load_builtin_checks"],
    "slurm_hooks.core.config": ["load_registry_and_config", "load_config", "validate"],
    "slurm_hooks.hooks.bounded": [
        "run_isolated_checks",
        "_snapshot_start",
        "_snapshot_finish",
        "_store_bounded",
    ],
    "slurm_hooks.core.isolation": ["run_isolated", "_fork", "_collect"],
    "slurm_hooks.core.prefetch": ["_serve", "Prefetch.start", "Prefetch.stop"],
    "slurm_hooks.core.runner": ["run_checks", "_execute"],
    "slurm_hooks.records.store": ["take_snapshot"],
    "slurm_hooks.records.counters": ["take", "read_ib_counters", "read_gpus"],
    "slurm_hooks.slurm.policy": ["decide"],
    "slurm_hooks.hooks.decision_log": ["log_decision"],
    "slurm_hooks.hooks.flow": ["_after_decision"],
    "pynvml": ["nvmlInit"],
}


def inside(argv: List[str]) -> None:
    """The prolog, marked (run by the runner below in a fresh interpreter)."""
    import importlib.util
    import threading

    spawned = int(os.environ["TIMELINE_T0"]) / 1e9
    out = os.environ["TIMELINE_OUT"]

    def mark(what: str) -> None:
        line = "%d %s %.2f %s\n" % (
            os.getpid(),
            threading.current_thread().name.replace(" ", "_"),
            (time.monotonic() - spawned) * 1e3,
            what,
        )
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)  # one open per mark: the helper closes every descriptor it inherits

    def wrap(name, func):
        def marked(*args, **kwargs):
            label = name
            if name == "_execute" and args:
                label += " " + getattr(args[0], "name", "")
            mark("> " + label)
            try:
                return func(*args, **kwargs)
            finally:
                mark("< " + label)

        return marked

    class Finder:
        def find_spec(self, fullname, path, target=None):
            if fullname not in WRAPPED:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            load = spec.loader.exec_module

            def exec_module(module):
                mark("import " + fullname)
                load(module)
                for name in WRAPPED[fullname]:
                    owner, _, attr = name.rpartition(".")
                    holder = getattr(module, owner) if owner else module
                    raw = holder.__dict__.get(attr)
                    if isinstance(raw, classmethod):
                        setattr(holder, attr, classmethod(wrap(name, raw.__func__)))
                    elif raw is not None:
                        setattr(holder, attr, wrap(name, raw))

            spec.loader.exec_module = exec_module
            return spec

    mark("interpreter up")
    sys.meta_path.insert(0, Finder())
    fork = os.fork

    def marked_fork():
        pid = fork()
        mark("forked" if pid == 0 else "fork -> %d" % pid)
        return pid

    os.fork = marked_fork
    exit_now = os._exit

    def marked_exit(code):
        mark("exit")
        exit_now(code)

    os._exit = marked_exit
    sys.argv = ["slurm-hooks"] + argv
    from slurm_hooks.cli.main import run

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="every mark, not only the first of each")
    args = parser.parse_args()
    sys.path.insert(0, REPO)
    from bench.nodeenv import BenchNode

    node = BenchNode.create()
    marks: Dict[str, List[float]] = collections.defaultdict(list)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for run in range(args.runs):
                out = os.path.join(scratch, "run%d" % run)
                env = node.hook_env("prolog", 100 + run)
                env.update(TIMELINE_OUT=out, PYTHONPATH=REPO)
                env["TIMELINE_T0"] = str(time.monotonic_ns())
                done = subprocess.run(
                    [sys.executable, "-s", os.path.abspath(__file__), "--inside", "prolog"],
                    env=env,
                    capture_output=True,
                )
                if done.returncode != 0:
                    print(done.stderr.decode()[-2000:])
                    return 1
                _collect_marks(out, marks, args.all)
    finally:
        node.cleanup()
    rows = sorted(marks.items(), key=lambda item: statistics.median(item[1]))
    print("median ms from spawn (%d prologs); H hook, C check process, S sysfs helper" % args.runs)
    for key, values in rows:
        if len(values) * 2 >= args.runs:
            print("%7.1f  %s" % (statistics.median(values), key))
    return 0


def _collect_marks(path: str, marks: Dict[str, List[float]], every: bool) -> None:
    with open(path) as handle:
        lines = [line.split(None, 3) for line in handle if line.strip()]
    pids: List[str] = []
    for pid, _thread, _ms, _what in lines:
        if pid not in pids:
            pids.append(pid)
    roles = dict(zip(pids, ("H", "C", "S")))
    seen = set()
    for pid, thread, ms, what in lines:
        what = re.sub(r"fork -> \d+", "fork", what.strip())
        key = "%s %-22s %s" % (roles.get(pid, "X"), thread[:22], what)
        if key in seen and not every:
            continue
        seen.add(key)
        marks[key].append(float(ms))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        inside(sys.argv[2:])
    else:
        sys.exit(main())
