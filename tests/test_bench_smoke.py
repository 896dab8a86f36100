"""bench/run.py --smoke: the benchmark still runs end to end (a few iterations, no results file).

Timings are not asserted (they depend on the machine and its load); only that every section is
produced and the Slurm-call counts, which are not timings, are what the design promises.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # runs the benchmarks (smoke sizes)


def test_benchmark_smoke_run_produces_every_section(tmp_path):
    output = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--output", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for title in (
        "1. Whole-process latency",
        "2. Where a prolog's time goes",
        "2b. Imports of one prolog",
        "2c. Slowest checks",
        "3. Cost growth",
        "4. Epilog record",
        "5. Slurm calls per hook run",
    ):
        assert "== " + title in proc.stdout, title
    assert not output.exists()  # --smoke writes nothing
    calls = {
        m.group(1).strip(): int(m.group(2))
        for m in re.finditer(
            r"^  (prolog, healthy|epilog, healthy|health, healthy|GPU lost: prolog drains)\s+\S+(?: \d+)?"
            r"\s+(\d+)",
            proc.stdout,
            re.M,
        )
    }
    assert calls == {
        "prolog, healthy": 0,
        "epilog, healthy": 0,
        "health, healthy": 0,
        "GPU lost: prolog drains": 4,
    }, proc.stdout  # show, count, drain, re-count
    assert re.search(
        r"prolog decision lines: \d+, with status != OK or slurm_calls != 0: 0", proc.stdout
    )
    assert re.search(r"prolog vs GPU: -?[0-9.]+ ms per GPU", proc.stdout)


def test_compare_runs_a_revision_against_the_working_tree():
    proc = subprocess.run(
        [sys.executable, "bench/compare.py", "HEAD", "--runs", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^HEAD +median +[0-9.]+ ms .*\(1 runs\)$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^ratio working tree / HEAD: [0-9.]+ \(medians\)$", proc.stdout, re.M), (
        proc.stdout
    )
    assert re.search(  # the CPU time of both sides' process trees, and its ratio
        r"^CPU of the process tree, medians: floor [0-9.]+ ms, HEAD [0-9.]+ ms, working tree "
        r"[0-9.]+ ms, ratio [0-9.]+$",
        proc.stdout,
        re.M,
    ), proc.stdout


def test_compare_refuses_a_revision_that_does_not_exist():
    proc = subprocess.run(
        [sys.executable, "bench/compare.py", "no-such-revision", "--runs", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "no-such-revision" in proc.stderr
