"""Where a prolog's time goes: `python -X importtime`, the in-process probe (bench/probe.py), and
per-check durations from `slurm-hooks check --json`."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from .nodeenv import BenchNode

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
IMPORT_LINE_PREFIX = "import time:"


def parse_importtime(text: str) -> List[Tuple[str, int, float, float]]:
    """`python -X importtime` lines -> [(module, depth, self_s, cumulative_s)], in output order.

    Every process writing to that stderr is included (the prolog's forked children import too)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith(IMPORT_LINE_PREFIX):
            continue
        fields = line[len(IMPORT_LINE_PREFIX) :].split("|")
        if len(fields) != 3:
            continue
        try:
            self_us, cumulative_us = int(fields[0]), int(fields[1])
        except ValueError:  # the header line: "self [us] | cumulative | imported package"
            continue
        name = fields[2].rstrip()
        stripped = name.lstrip(" ")
        depth = (len(name) - len(stripped) - 1) // 2
        rows.append((stripped, depth, self_us / 1e6, cumulative_us / 1e6))
    return rows


def importtime(
    python: Sequence[str], argv: Sequence[str], env: Mapping[str, str], runs: int
) -> Dict[str, Any]:
    """Median import total and the top-level-or-nested modules with the largest cumulative time
    (`python` is the interpreter and its flags, argv the script and its arguments)."""
    totals, counts = [], []
    per_module: Dict[str, List[float]] = {}
    self_times: Dict[str, List[float]] = {}
    for _ in range(runs):
        proc = subprocess.run(
            list(python) + ["-X", "importtime"] + list(argv),
            env=dict(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
        rows = parse_importtime(proc.stderr)
        totals.append(sum(cum for _, depth, _, cum in rows if depth == 0))
        counts.append(len(rows))
        seen: Dict[str, float] = {}
        for name, _depth, self_s, cum in rows:
            seen[name] = max(seen.get(name, 0.0), cum)
            self_times.setdefault(name, []).append(self_s)
        for name, cum in seen.items():
            per_module.setdefault(name, []).append(cum)
    top = sorted(((statistics.median(v), name) for name, v in per_module.items()), reverse=True)[
        :15
    ]
    return {
        "runs": runs,
        "total_s": statistics.median(totals),
        "modules": int(statistics.median(counts)),
        "top": [
            {"module": name, "cumulative_s": cum, "self_s": statistics.median(self_times[name])}
            for cum, name in top
        ],
    }


def probe(python: str, node: BenchNode, runs: int, repeat: int) -> Dict[str, Any]:
    """Median of each phase over `runs` probe processes (each phase repeated `repeat` times inside),
    run by `python` (the installed copy's interpreter, so slurm_hooks is imported from there)."""
    results: List[Dict[str, Any]] = []
    errors: Dict[str, str] = {}
    for _ in range(runs):
        proc = subprocess.run(
            [python, "-s", os.path.join(BENCH_DIR, "probe.py"), str(node.gpu_count), str(repeat)],
            env=node.base_env(),
            cwd=os.path.dirname(BENCH_DIR),
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            errors["probe"] = "exit %d: %s" % (proc.returncode, proc.stderr.strip()[-500:])
            continue
        data = json.loads(lines[-1])
        errors.update(data.pop("errors", {}))
        results.append(data)
    merged: Dict[str, Any] = {"errors": errors}
    if not results:
        return merged
    for key in results[0]:
        values = [r.get(key) for r in results]
        if all(isinstance(v, (int, float)) for v in values):
            merged[key] = statistics.median(values)
        elif all(isinstance(v, dict) for v in values):
            names = set().union(*values)
            merged[key] = {n: statistics.median([v.get(n, 0.0) for v in values]) for n in names}
    return merged


def check_durations(argv: Sequence[str], env: Mapping[str, str], runs: int) -> Dict[str, Any]:
    """Per-check duration_s medians from `check --json` (each check's own thread: its gatherers
    run inside the first check that needs them, concurrently with the others)."""
    per_check: Dict[str, List[float]] = {}
    totals: List[float] = []
    for _ in range(runs):
        proc = subprocess.run(
            list(argv), env=dict(env), capture_output=True, text=True, timeout=120
        )
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            continue
        totals.append(report.get("duration_s", 0.0))
        for entry in report.get("checks", []):
            per_check.setdefault(entry["name"], []).append(entry.get("duration_s", 0.0))
    medians = {name: statistics.median(v) for name, v in per_check.items()}
    return {
        "runs": len(totals),
        "run_checks_s": statistics.median(totals) if totals else None,
        "checks": dict(sorted(medians.items(), key=lambda kv: -kv[1])),
    }
