"""Timing primitives for the benchmarks: run a command, take its wall time and peak RSS; summarise.

Each command runs under bench/launcher.c, a small C program that forks/execs it, waits, and
reports the wall time around fork/exec/wait (what a caller such as slurmd waits for) and
getrusage(RUSAGE_CHILDREN).ru_maxrss: the peak RSS of the command or of the largest child it waited
for (the prolog's forked check and snapshot processes). Launching from the small C process matters:
Linux carries the peak RSS across exec, so a command started straight from this Python process
would report at least this process's RSS.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass
class Sample:
    seconds: float
    max_rss_kb: int
    returncode: int
    stdout: str = ""


@dataclass
class Stats:
    """Summary of a list of durations in seconds (reported in ms)."""

    values: List[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.values)

    def percentile(self, p: float) -> float:
        """Linear interpolation between closest ranks (numpy's default), p in [0, 100]."""
        if not self.values:
            return math.nan
        ordered = sorted(self.values)
        rank = (len(ordered) - 1) * p / 100.0
        low = int(math.floor(rank))
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    def ms(self) -> Dict[str, float]:
        return {
            "n": self.n,
            "median": self.median * 1e3,
            "p90": self.percentile(90) * 1e3,
            "p99": self.percentile(99) * 1e3,
            "min": (min(self.values) if self.values else math.nan) * 1e3,
            "max": (max(self.values) if self.values else math.nan) * 1e3,
        }


def run_once(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Optional[str] = None,
    capture: bool = False,
    timeout: float = 120.0,
) -> Sample:
    """Run argv to completion through the launcher; its wall time, peak RSS (KiB) and exit status.

    Without a C compiler the wall time is taken here and the peak RSS is unknown (0)."""
    launcher = launcher_path()
    program = argv[0] if os.path.isabs(argv[0]) else (shutil.which(argv[0]) or argv[0])
    with tempfile.NamedTemporaryFile(prefix="bench-rusage-", delete=False) as handle:
        usage_file = handle.name
    try:
        full = (
            [launcher, usage_file, program] + list(argv[1:])
            if launcher
            else [program] + list(argv[1:])
        )
        stdout = subprocess.PIPE if capture else subprocess.DEVNULL
        started = time.perf_counter()
        proc = subprocess.Popen(
            full,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
        )
        out = _read_all(proc, timeout) if capture else b""
        proc.wait(timeout)
        elapsed = time.perf_counter() - started
        seconds, rss = elapsed, 0
        if launcher:
            with open(usage_file) as handle:
                fields = handle.read().split()
            if len(fields) == 2:
                seconds, rss = float(fields[0]), int(fields[1])
        return Sample(seconds, rss, proc.returncode, out.decode("utf-8", "replace"))
    finally:
        os.unlink(usage_file)


_LAUNCHER: List[Optional[str]] = []


def launcher_path() -> Optional[str]:
    """bench/launcher.c compiled once into a cache dir (by content hash); None without gcc."""
    if _LAUNCHER:
        return _LAUNCHER[0]
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")
    with open(source, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), "slurm-hooks-bench-%d" % os.getuid())
    binary = os.path.join(cache, "launcher-" + digest)
    if not os.access(binary, os.X_OK):
        os.makedirs(cache, mode=0o700, exist_ok=True)
        partial = binary + ".%d" % os.getpid()
        compiler = os.environ.get("CC", "gcc")
        try:
            subprocess.run(
                [compiler, "-O2", "-o", partial, source],
                check=True,
                capture_output=True,
                timeout=60,
            )
            os.replace(partial, binary)
        except (OSError, subprocess.SubprocessError):
            binary = None  # type: ignore[assignment]
    _LAUNCHER.append(binary)
    return binary


def _read_all(proc: subprocess.Popen, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    chunks = []
    assert proc.stdout is not None
    while True:
        chunk = proc.stdout.read(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        if time.monotonic() > deadline:
            proc.kill()
            break
    proc.stdout.close()
    return b"".join(chunks)


def interleaved(
    commands: Mapping[str, Tuple[Sequence[str], Mapping[str, str]]],
    runs: int,
    warmup: int = 2,
    before_each: Optional[Callable[[str, int], Mapping[str, str]]] = None,
    on_failure: Optional[Callable[[str, Sample], None]] = None,
) -> Dict[str, List[Sample]]:
    """Run each command `runs` times, round-robin, so that load from other work on the machine hits
    every command alike (their ratio stays fair). `before_each(name, i)` may return extra env vars."""
    samples: Dict[str, List[Sample]] = {name: [] for name in commands}
    for i in range(-warmup, runs):
        for name, (argv, env) in commands.items():
            extra = before_each(name, i) if before_each else {}
            sample = run_once(argv, dict(env, **extra))
            if sample.returncode != 0 and on_failure:
                on_failure(name, sample)
            if i >= 0:
                samples[name].append(sample)
    return samples


def stats_of(samples: Sequence[Sample]) -> Stats:
    return Stats([s.seconds for s in samples])


def least_squares(points: Sequence[Tuple[float, float]]) -> Tuple[float, float, float]:
    """(slope, intercept, r^2) of y = slope * x + intercept."""
    n = len(points)
    if n < 2:
        return math.nan, math.nan, math.nan
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return math.nan, mean_y, math.nan
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    ss_tot = sum((y - mean_y) ** 2 for _, y in points)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in points)
    return slope, intercept, (1 - ss_res / ss_tot) if ss_tot else 1.0
