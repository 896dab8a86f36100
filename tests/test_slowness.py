"""Oddity is not slowness: a power-cap flag without a power cost is dropped (records/slowness.py; issue 30)."""

from __future__ import annotations

import random

from slurm_hooks.records import straggler_scan
from tests.straggler_records import NOW, healthy, settings, write_jobs

CAPPED = "throttle_frac.power"


def fleet(directory, odd_power_factor):
    """6 nodes, 12 jobs; n03 has one GPU at its power cap 40 % of every job; its power is
    `odd_power_factor` of a healthy node's."""

    def perf_of(rng: random.Random):
        figures = healthy(rng)
        figures[CAPPED] = rng.uniform(0.0, 0.004)
        return figures

    write_jobs(directory, jobs=12, nodes=6, slow=None, perf_of=perf_of)
    # rewrite n03's records: capped, with or without the power it costs
    import json
    import os

    node_dir = os.path.join(directory, "n03")
    for name in os.listdir(node_dir):
        path = os.path.join(node_dir, name)
        stamp = os.stat(path).st_mtime
        with open(path, "rb") as handle:
            text = handle.read().decode()
        head, _, body = text.partition("\n")
        header = json.loads(head[:-1] + "}")
        perf = header["summary"]["perf"]
        perf[CAPPED] = 0.4
        perf["gpu_power_w.mean"] = round(perf["gpu_power_w.mean"] * odd_power_factor, 1)
        from slurm_hooks.records.store import encode_record

        record = json.loads(text)
        record["summary"] = header["summary"]
        with open(path, "wb") as handle:
            handle.write(encode_record(record))
        os.utime(path, (stamp, stamp))


def test_a_leaky_gpu_at_its_cap_with_full_power_is_not_a_suspect(tmp_path):
    d = str(tmp_path / "jobs")
    fleet(d, 1.0)
    result = straggler_scan.scan([d], settings(), now=NOW)
    assert [(s.node, s.metric) for s in result.suspects()] == []


def test_a_power_cap_that_costs_power_is_a_suspect(tmp_path):
    d = str(tmp_path / "jobs")
    fleet(d, 0.9)  # 10 % less power than its peers: the cap slows it
    result = straggler_scan.scan([d], settings(), now=NOW)
    assert (("n03", CAPPED)) in [(s.node, s.metric) for s in result.suspects()]
