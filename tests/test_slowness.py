"""Oddity is not slowness: a power-cap flag without a power cost is dropped (records/slowness.py; issue 30)."""

from __future__ import annotations

import random

from slurm_hooks.records import straggler_scan
from tests.straggler_records import HW, NOW, healthy, settings, write_jobs

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


def test_the_leaky_gpu_is_named_odd_but_not_slow_with_its_cost(tmp_path):
    d = str(tmp_path / "jobs")
    fleet(d, 1.0)
    result = straggler_scan.scan([d], settings(), now=NOW)
    (odd,) = result.odd_not_slow()
    assert (odd.node, odd.metric) == ("n03", CAPPED) and odd.cost < 0.03
    assert "odd but not slow" in straggler_scan.render(result)
    assert straggler_scan.to_dict(result)["odd_not_slow"][0]["node"] == "n03"


def test_a_power_cap_suspect_carries_its_cost_the_power_it_did_not_draw(tmp_path):
    d = str(tmp_path / "jobs")
    fleet(d, 0.9)
    result = straggler_scan.scan([d], settings(), now=NOW)
    (suspect,) = [s for s in result.suspects() if s.metric == CAPPED]
    assert 0.07 < suspect.cost < 0.13  # about 10 % of its peers' power
    assert result.odd_not_slow() == []


def test_suspects_are_ordered_by_their_cost_not_their_z(tmp_path):
    """A node held to a slower GPU's clocks 30 % of the job (sync boost: cost 0.3, z 15 on that
    figure's 0.02 floor) ranks above one 10 % of the job in HW slowdown (cost 0.1, z 20)."""
    sync = "throttle_frac.sync_boost"

    def perf_of(rng: random.Random):
        return dict(healthy(rng), **{sync: 0.0})

    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12, nodes=8, slow=None, perf_of=perf_of)
    import json
    import os

    from slurm_hooks.records.store import encode_record

    for node, key, value in (("n02", HW, 0.1), ("n05", sync, 0.3)):
        node_dir = os.path.join(d, node)
        for name in os.listdir(node_dir):
            path = os.path.join(node_dir, name)
            stamp = os.stat(path).st_mtime
            record = json.loads(open(path, "rb").read().decode())
            record["summary"]["perf"][key] = value
            with open(path, "wb") as handle:
                handle.write(encode_record(record))
            os.utime(path, (stamp, stamp))
    result = straggler_scan.scan([d], settings(), now=NOW)
    found = result.suspects()
    assert [(s.node, s.cost) for s in found] == [("n05", 0.3), ("n02", 0.1)]
    assert found[0].worst_z < found[1].worst_z  # the z alone would rank them the other way


def test_the_fleet_drains_the_costliest_suspect_first_not_the_one_with_most_flags(tmp_path):
    """Red team, round 3 (issue 30: rank and drain by cost): choose() ordered by flag count and
    z, so a rate suspect (its count covers the whole report window, here 12 flags at a 4 % power
    cost) took the one drain [fleet] max_drained allows before a node losing 25 % of its jobs'
    time in HW slowdown."""
    from slurm_hooks.records import stragglers
    from slurm_hooks.slurm import straggler_drain

    def suspect(node, metric, flags, cost, z, basis):
        evidence = tuple(
            (
                stragglers.JobMark(str(100 + j), NOW - j, 6, "user%d" % (j % 3), start=NOW - j),
                stragglers.Flag(metric, z, 0.0, 0.0, 5, cost=cost),
            )
            for j in range(flags)
        )
        return stragglers.Suspect(node, metric, flags, 40, evidence, 3, basis=basis)

    costly = suspect("n01", HW, 4, 0.25, 20.0, "k-of-m")
    frequent = suspect("n02", "gpu_power_w.mean", 12, 0.04, 40.0, "rate")
    unknown = suspect("n03", "ib_xmit_wait_per_s", 12, None, 60.0, "rate")
    fleet_settings = settings(drain=True)
    wanted, rows = straggler_drain.choose([unknown, frequent, costly], fleet_settings, {})
    assert [s.node for s in wanted] == ["n01", "n02", "n03"] and rows == []
    # the report lists them in the same order
    assert sorted([unknown, frequent, costly], key=straggler_scan._by_cost) == wanted
