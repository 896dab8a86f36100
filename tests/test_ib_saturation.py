"""A saturated or cleared InfiniBand counter is an unmeasurable figure, with its reason, never a
smaller figure taken from the ports that are left (issue 30, "a saturated counter hides the worst
port").

Facts from the kernel (drivers/infiniband/core/sysfs.c, the PORT_PMA_ATTR table): sysfs
`counters/port_xmit_wait` is PortCounters' 32-bit PortXmitWait; only port_xmit_data/port_rcv_data
and the packet counters get 64-bit versions (PORT_PMA_ATTR_EXT). PMA counters stop at their
maximum (they do not wrap), so a stalled port sticks at 4294967295 until an SM or perfquery -R
clears it.
"""

from __future__ import annotations

from slurm_hooks.records import build, ib_counter_trust, perf, stall_bounds, straggler_scan
from tests.straggler_records import NOW, healthy, settings, write_untrusted

MAX32 = (1 << 32) - 1
HEALTHY_PORT = {"port_xmit_wait": 1000, "port_xmit_data": 10**9, "port_rcv_data": 10**9}


def snapshots(stalled_before, stalled_after):
    """Prolog and epilog snapshots' ib_perf: a healthy port and a stalled one."""
    before = {
        "ib_perf": {
            "mlx5_0:1": HEALTHY_PORT,
            "mlx5_1:1": dict(HEALTHY_PORT, port_xmit_wait=stalled_before),
        },
        "ib": {"mlx5_0:1": {}, "mlx5_1:1": {}},
    }
    after = {
        "ib_perf": {
            "mlx5_0:1": dict(HEALTHY_PORT, port_xmit_wait=51000),
            "mlx5_1:1": dict(HEALTHY_PORT, port_xmit_wait=stalled_after),
        },
        "ib": {"mlx5_0:1": {}, "mlx5_1:1": {}},
    }
    return before, after


def figures(stalled_before, stalled_after):
    before, after = snapshots(stalled_before, stalled_after)
    record = {"duration_s": 100.0, "gpus": [], "cpu": None}
    record["ib"] = build._ib_entries(before, after, True)
    result, missing = perf.perf_block(record)
    summary = build.summarize(record, 1 << 30)
    return result, missing, summary


def test_a_port_stuck_at_the_32bit_maximum_makes_the_stall_figure_unmeasurable():
    result, missing, summary = figures(MAX32, MAX32)
    # before: the stuck port was dropped and the figure came from the healthy one (500/s: "fine")
    assert "ib_xmit_wait_per_s" not in result
    assert missing["ib_xmit_wait_per_s"].startswith(
        "not scored: saturated (mlx5_1:1 port_xmit_wait"
    )
    assert summary["perf_untrusted"] == {"ib_xmit_wait_per_s": missing["ib_xmit_wait_per_s"]}
    assert result["ib_xmit_bytes_per_s"] == 0.0  # the data counters did not move: measured


def test_a_counter_that_reaches_its_maximum_during_the_job_is_saturated_too():
    result, missing, _ = figures(MAX32 - 4_000_000, MAX32)
    assert "ib_xmit_wait_per_s" not in result  # 40,000/s would be a lower bound, not a figure
    assert "reached the 32-bit maximum" in missing["ib_xmit_wait_per_s"]


def test_a_counter_cleared_during_the_job_is_named_as_cleared():
    result, missing, summary = figures(3_000_000_000, 20)
    assert "ib_xmit_wait_per_s" not in result
    assert missing["ib_xmit_wait_per_s"].startswith("not scored: cleared (mlx5_1:1 port_xmit_wait")
    assert (
        "3000000000 at the prolog, 20 at the epilog"
        in summary["perf_untrusted"]["ib_xmit_wait_per_s"]
    )


def test_counters_that_moved_normally_are_trusted():
    result, missing, summary = figures(5_000, 9_000_000)
    assert result["ib_xmit_wait_per_s"] == 90_000 - 50.0
    assert "perf_untrusted" not in summary and "ib_xmit_wait_per_s" not in missing
    assert ib_counter_trust.judge({"port_xmit_wait": 0}, {"port_xmit_wait": MAX32 - 1}) == {}


write = write_untrusted  # a record of one job, as the epilog wrote it (tests/straggler_records.py)


def test_the_report_names_the_node_it_could_not_judge_and_why(tmp_path):
    import random

    rng = random.Random(3)
    reason = "not scored: saturated (mlx5_1:1 port_xmit_wait saturated: at the 32-bit maximum)"
    for job in range(4):
        for i in range(6):
            figures_ = healthy(rng)
            untrusted = None
            if i == 2:
                del figures_["ib_xmit_wait_per_s"]
                untrusted = {"ib_xmit_wait_per_s": reason}
            write(str(tmp_path), "n%02d" % i, 100 + job, figures_, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    rows = straggler_scan.to_dict(result)["not_judged"]
    assert rows[0] == {
        "node": "n02",
        "metric": "ib_xmit_wait_per_s",
        "why": "saturated",
        "jobs": 4,
        "example": reason,
    }
    assert "n02 ib_xmit_wait_per_s: not scored: saturated in 4 job(s)" in straggler_scan.render(
        result
    )


def test_a_node_that_saturates_far_more_often_than_the_fleet_is_named(tmp_path):
    import random

    rng = random.Random(4)
    reason = "not scored: saturated (mlx5_1:1 port_xmit_wait saturated: at the 32-bit maximum)"
    for job in range(12):
        for i in range(8):
            figures_ = healthy(rng)
            untrusted = None
            if i == 5 or (i == 1 and job == 4):  # n05 always, n01 once (an idle weekend)
                del figures_["ib_xmit_wait_per_s"]
                untrusted = {"ib_xmit_wait_per_s": reason}
            write(str(tmp_path), "n%02d" % i, 100 + job, figures_, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    rows = straggler_scan.to_dict(result)["saturating"]
    assert [(r["node"], r["saturated_jobs"], r["jobs"]) for r in rows] == [("n05", 12, 12)]
    assert "n05 ib_xmit_wait_per_s: counter saturated in 12 of 12 jobs" in straggler_scan.render(
        result
    )


def test_eight_saturated_ports_keep_the_header_short():
    ports = [
        {"port": "mlx5_%d:1" % i, "traffic_untrusted": {"port_xmit_wait": "saturated: " + "x" * 80}}
        for i in range(8)
    ]
    reason = ib_counter_trust.untrusted_figures(ports)["ib_xmit_wait_per_s"]
    assert "mlx5_0:1" in reason and "mlx5_1:1" in reason and "and 6 more port(s)" in reason
    assert len(reason) < 300


def test_a_figure_a_node_never_has_is_a_blind_spot_not_a_clean_bill(tmp_path):
    """cgroup v1 (no foreign CPU time) on one node: the report says it cannot judge it there."""
    import random

    rng = random.Random(5)
    for job in range(5):
        for i in range(6):
            figures_ = healthy(rng)
            if i == 4:
                del figures_["foreign_cpu_frac"]
            write(str(tmp_path), "n%02d" % i, 100 + job, figures_)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    rows = straggler_scan.to_dict(result)["not_judged"]
    assert [(r["node"], r["metric"], r["why"], r["jobs"]) for r in rows] == [
        ("n04", "foreign_cpu_frac", "missing", 5)
    ]
    assert "n04 foreign_cpu_frac: not in its records while its peers had it in 5 job(s)" in (
        straggler_scan.render(result)
    )


# -- what a saturated or cleared counter still proves: a lower bound (issue 30, round 3) --------


def test_a_counter_that_hit_its_maximum_gives_the_ticks_it_surely_counted_as_a_lower_bound():
    result, _missing, _ = figures(MAX32 - 4_000_000, MAX32)  # 4e6 ticks in the job's 100 s
    assert result[perf.WAIT_LOWER_BOUND] == 40_000.0  # the figure stays absent: only "at least"
    result, _missing, _ = figures(3_000_000_000, 2_000_000)  # cleared, then counted 2e6
    assert result[perf.WAIT_LOWER_BOUND] == 20_000.0
    result, _missing, _ = figures(MAX32, MAX32)  # stuck before the job began: proves nothing
    assert result[perf.WAIT_LOWER_BOUND] == 500.0  # only the healthy port: 50,000 ticks measured
    assert ib_counter_trust.lower_bounds({"port_xmit_wait": MAX32}, {"port_xmit_wait": MAX32}) == {}


def _stalled_fleet(tmp_path, bound, jobs=4):
    """Six nodes per job; n02's stalled port saturated every job, its figure a bound only."""
    import random

    rng = random.Random(5)
    reason = "not scored: saturated (mlx5_1:1 port_xmit_wait saturated: reached the maximum)"
    for job in range(jobs):
        for i in range(6):
            figures_ = healthy(rng)
            untrusted = None
            if i == 2:
                del figures_["ib_xmit_wait_per_s"]
                figures_[perf.WAIT_LOWER_BOUND] = bound
                untrusted = {"ib_xmit_wait_per_s": reason}
            write(str(tmp_path), "n%02d" % i, 100 + job, figures_, untrusted)
    return straggler_scan.scan([str(tmp_path)], settings(), now=NOW)


def test_a_saturated_node_whose_least_stall_rate_is_far_above_its_peers_is_a_suspect(tmp_path):
    # before: its figure was unmeasurable in every job and the node was never scored on it
    result = _stalled_fleet(tmp_path, 2e6)  # at least 2e6/s against peers at 9e4-1.1e5/s
    found = {(s.node, s.metric): s for s in result.suspects()}
    suspect = found[("n02", "ib_xmit_wait_per_s")]
    assert suspect.flagged == 4 and all(flag.bound for _, flag in suspect.evidence)
    row = straggler_scan.to_dict(result)["suspects"][0]
    assert row["evidence"][0]["lower_bound"] is True
    assert ">= 2e+06 vs" in straggler_scan.render(result)


def test_a_lower_bound_near_its_peers_proves_nothing(tmp_path):
    result = _stalled_fleet(tmp_path / "a", 1.5e5)  # at least 1.5e5/s: maybe slow, maybe not
    assert result.suspects() == []
    # it was scored on the figure (in the k-of-m window as in the rate test): a scored bound
    # not far above its peers is a job that did not flag the node, like a measured one
    window = result.windows["n02"]
    assert window.window_start(stall_bounds.BIT)[1] == 4
    # for the rate test each scored bound is a trial, flagged or not (the fleet's rate is fair)
    index = stall_bounds.BIT.bit_length() - 1
    assert result.rates.scored()[0][("n02", index)] == 4


def test_a_crafted_bound_is_not_believed():
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: float("inf")}) is None
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: True}) is None
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: -5.0}) is None
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: 5.0, "ib_xmit_wait_per_s": 1.0}) is None
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: 7}) == 7.0


def test_a_bound_too_large_for_a_float_is_not_believed_and_the_report_goes_on(tmp_path):
    # JSON carries integers of any length; float() of this one raised OverflowError, and the
    # report stopped for every node on one crafted record
    huge = 10**400
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: huge}) is None
    assert stall_bounds.bound_of({perf.WAIT_LOWER_BOUND: float("nan")}) is None
    reason = "not scored: saturated (mlx5_0:1 port_xmit_wait saturated: reached the maximum)"
    import random

    rng = random.Random(3)
    for i in range(6):
        figures_ = healthy(rng)
        untrusted = None
        if i == 0:
            del figures_["ib_xmit_wait_per_s"]
            figures_[perf.WAIT_LOWER_BOUND] = huge
            untrusted = {"ib_xmit_wait_per_s": reason}
        write_untrusted(str(tmp_path), "n%02d" % i, 100, figures_, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    assert result.node_jobs == 6 and result.suspects() == []


def test_three_bound_flags_in_thirty_jobs_are_not_three_of_the_last_ten(tmp_path):
    """Red team, round 3: a bound that did not stand out was no scored job in the k-of-m window,
    so a node whose counter a subnet manager clears in every job was a suspect on any 3 flags of
    the report window (3 of 3: the 27 jobs between them never counted), where a node with a
    measured counter needs 3 of its last 10. Transient congestion three times in a month, or a
    neighbour flooding its port now and then, in three users' jobs: drainable."""
    import random

    rng = random.Random(4)
    reason = "not scored: cleared (mlx5_0:1 port_xmit_wait cleared: reset during the job)"
    for job in range(30):
        for i in range(6):
            figures_ = healthy(rng)
            untrusted = None
            if i == 2:  # cleared in every job; its bound stands out in jobs 3, 14 and 27
                del figures_["ib_xmit_wait_per_s"]
                figures_[perf.WAIT_LOWER_BOUND] = 2e6 if job in (3, 14, 27) else 5e4
                untrusted = {"ib_xmit_wait_per_s": "%s" % reason}
            write_untrusted(str(tmp_path), "n%02d" % i, 100 + 10 * job, figures_, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    assert result.windows["n02"].window_start(stall_bounds.BIT)[1] == 10
    assert result.suspects() == []  # neither a k-of-m nor a rate suspect
    # the same node stalling in each of its 3 newest jobs still is one (4 of its last 10; a
    # record's end is NOW - 400 - its job number: lower numbers are newer)
    for job in (70, 80, 90):
        figures_ = healthy(rng)
        del figures_["ib_xmit_wait_per_s"]
        figures_[perf.WAIT_LOWER_BOUND] = 2e6
        write_untrusted(str(tmp_path), "n02", job, figures_, {"ib_xmit_wait_per_s": reason})
        for i in (0, 1, 3, 4, 5):
            write_untrusted(str(tmp_path), "n%02d" % i, job, healthy(rng))
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    (suspect,) = result.suspects()
    assert (suspect.node, suspect.flagged, suspect.window) == ("n02", 4, 10)
