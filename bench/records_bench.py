"""Epilog record cost and `slurm-hooks report` over many records.

Records for the report are clones of one real record (written by a real prolog/epilog pair on the
fake node) with varied job ids, nodes, end times and counter deltas; each clone's summary is
recomputed with slurm_hooks.records.build.summarize and the file laid out by records.encode_record,
the code the epilog uses. About 10% of the jobs get correctable ECC errors, 2% Xids, 1% leftover
processes, so the report has nodes to rank.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List, Sequence

from .measure import Sample, Stats, run_once
from .nodeenv import NODE_NAME, BenchNode

JOBS_PER_NODE = 50
_REPORT_SECONDS = re.compile(r" in ([0-9.]+)s")


def epilog_runs(node: BenchNode, hook: Sequence[str], runs: int, first_job: int) -> Dict[str, Any]:
    """Prolog then epilog of job N, `runs` times; the epilog timed. Returns timings, size, record."""
    samples: List[Sample] = []
    sizes: List[int] = []
    build: List[float] = []
    snap: List[float] = []
    record: Dict[str, Any] = {}
    failures = 0
    for i in range(runs):
        job = first_job + i
        run_once(list(hook) + ["prolog"], node.hook_env("prolog", job))
        sample = run_once(list(hook) + ["epilog"], node.hook_env("epilog", job))
        failures += sample.returncode != 0
        samples.append(sample)
        path = os.path.join(node.records_dir, NODE_NAME, "%d.json" % job)
        try:
            sizes.append(os.path.getsize(path))
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            failures += 1
            continue
        timings = record.get("timings") or {}
        if isinstance(timings.get("record_build_s"), (int, float)):
            build.append(timings["record_build_s"])
        if isinstance(timings.get("epilog_snapshot_s"), (int, float)):
            snap.append(timings["epilog_snapshot_s"])
    return {
        "wall": Stats([s.seconds for s in samples]).ms(),
        "max_rss_kb": max((s.max_rss_kb for s in samples), default=0),
        "size_bytes": statistics.median(sizes) if sizes else None,
        "failures": failures,
        "record_build_ms": statistics.median(build) * 1e3 if build else None,
        "epilog_snapshot_ms": statistics.median(snap) * 1e3 if snap else None,
        "template": record,
    }


def generate(template: Dict[str, Any], count: int, directory: str, seed: int = 8) -> int:
    """Write `count` varied clones of `template` under directory/<node>/<job>.json; total bytes."""
    from slurm_hooks.records.build import summarize
    from slurm_hooks.records.store import encode_record

    rng = random.Random(seed)
    now = time.time()
    total = 0
    nodes = max(1, count // JOBS_PER_NODE)
    for i in range(count):
        record = copy.deepcopy(template)
        node = "gpu%04d" % (i % nodes)
        record["node"] = node
        record["job"] = dict(record.get("job") or {}, id=str(100000 + i))
        duration = rng.uniform(60, 86400)
        record["end"] = round(now - (count - i) * 30.0, 3)
        record["start"] = round(record["end"] - duration, 3)
        record["duration_s"] = round(duration, 3)
        _vary(record, rng)
        record["summary"] = summarize(record, 1024 << 20)
        data = encode_record(record)
        os.makedirs(os.path.join(directory, node), exist_ok=True)
        with open(os.path.join(directory, node, "%s.json" % record["job"]["id"]), "wb") as handle:
            handle.write(data)
        total += len(data)
    return total


def _vary(record: Dict[str, Any], rng: random.Random) -> None:
    gpus = record.get("gpus") or []
    for gpu in gpus:
        delta = gpu.get("delta")
        if isinstance(delta, dict) and "energy_mj" in delta:
            delta["energy_mj"] = int(rng.uniform(1e6, 7e8) * record["duration_s"] / 3600)
    roll = rng.random()
    if gpus and roll < 0.10 and isinstance(gpus[0].get("delta"), dict):
        gpu = rng.choice(gpus)
        gpu["delta"]["ecc.volatile.corrected"] = rng.randint(1, 500)
    if roll < 0.02:
        record["events_scope"] = "job"
        record["xid_count"] = rng.randint(1, 4)
    if gpus and roll < 0.01:
        gpu = rng.choice(gpus)
        gpu["processes"] = [
            {"pid": rng.randint(1000, 99999), "name": "python3", "used_memory": 2 << 30}
        ]
        gpu["memory_used_bytes"] = 2 << 30


def report_runs(
    hook: Sequence[str], env: Dict[str, str], directory: str, runs: int
) -> Dict[str, Any]:
    """`slurm-hooks report DIR` `runs` times (page cache warm after the first): wall, peak RSS, and
    the report's own processing time from its first line."""
    samples, inner = [], []
    for _ in range(runs):
        sample = run_once(
            list(hook) + ["report", "--top", "20", directory], env, capture=True, timeout=600
        )
        samples.append(sample)
        match = _REPORT_SECONDS.search(sample.stdout.split("\n", 1)[0])
        if match:
            inner.append(float(match.group(1)))
    first_line = samples[-1].stdout.split("\n", 1)[0] if samples else ""
    return {
        "wall": Stats([s.seconds for s in samples]).ms(),
        "max_rss_kb": max(s.max_rss_kb for s in samples),
        "report_s": statistics.median(inner) if inner else None,
        "first_line": first_line,
        # report exits 1 (FOUND) when it names nodes with abnormal jobs, as these records have
        "failures": sum(1 for s in samples if s.returncode not in (0, 1)),
    }


def report_benchmark(
    hook: Sequence[str],
    env: Dict[str, str],
    template: Dict[str, Any],
    counts: Sequence[int],
    runs: int,
) -> Dict[int, Dict[str, Any]]:
    out: Dict[int, Dict[str, Any]] = {}
    for count in counts:
        directory = tempfile.mkdtemp(prefix="slurm-hooks-records-")
        try:
            started = time.perf_counter()
            size = generate(template, count, directory)
            generated = time.perf_counter() - started
            result = report_runs(hook, env, directory, runs)
            result.update(records=count, bytes=size, generate_s=generated)
            out[count] = result
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return out
