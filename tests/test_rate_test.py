"""Intermittent slow nodes found by their flag rate against the fleet's (records/rate_test.py; issue 30)."""

from __future__ import annotations

import math

from slurm_hooks.records import rate_test, straggler_scan
from tests.straggler_records import HW, NOW, settings, write_jobs


def test_binomial_tail_equals_the_exact_sum():
    for flags, jobs, p in (
        (3, 12, 0.002),
        (0, 5, 0.5),
        (7, 7, 0.3),
        (4, 1000, 0.001),
        (2, 30, 0.25),
    ):
        exact = sum(
            math.comb(jobs, i) * p**i * (1 - p) ** (jobs - i) for i in range(flags, jobs + 1)
        )
        assert math.isclose(rate_test.binomial_tail(flags, jobs, p), exact, rel_tol=1e-9)


def slow_early_and_rarely_late(j):
    """Slow in a quarter of its 40 jobs, but only twice in the last 10 (k-of-m sees 2 < k = 3)."""
    return j % 4 == 0 and (j < 30 or j in (32, 36))


def test_a_node_slow_in_a_quarter_of_its_jobs_is_found_by_its_rate(tmp_path):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=40, nodes=6, slow="n03", slow_in=slow_early_and_rarely_late)
    result = straggler_scan.scan([d], settings(window_days=30.0), now=NOW)
    assert result.suspects() == []  # 2 of its last 10: not a k-of-m suspect
    (found,) = result.rate_suspects()
    assert (found.node, found.metric, found.flagged, found.window) == ("n03", HW, 10, 40)
    assert "n03 throttle_frac.hw_slowdown: 10 of 40 scored jobs" in straggler_scan.render(result)
    assert straggler_scan.to_dict(result)["rate_suspects"][0]["node"] == "n03"


def test_a_node_flagged_as_often_as_the_fleet_is_not_a_rate_suspect(tmp_path):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=40, nodes=6, slow="n03", slow_in=lambda j: j in (3, 17, 33))
    result = straggler_scan.scan([d], settings(window_days=30.0), now=NOW)
    assert result.rate_suspects() == []  # 3 glitches in 40 jobs, spread: chance, not a fault


def test_a_power_cap_flag_rate_alone_makes_no_rate_suspect():
    """A leaky GPU at its cap passes the power-cost gate by chance in a tenth of its jobs: over a
    long window that rate would stand out without costing the jobs anything."""
    from slurm_hooks.records import stragglers

    rates = rate_test.FlagRates()
    every = stragglers.ALL_METRICS
    for j in range(200):
        for n in range(20):
            flags = ()
            if n == 3 and j % 8 == 0:
                flags = (stragglers.Flag("throttle_frac.power", 30.0, 0.4, 0.0, 19),)
            rates.add("n%02d" % n, stragglers.JobMark(str(j), NOW, 20, "u", flags, None, every))
    assert rates.suspects(3, []) == []
    rate_test.SUPPORTING, saved = (), rate_test.SUPPORTING
    try:  # the same rate on a figure that costs time is a suspect
        assert [s.node for s in rates.suspects(3, [])] == ["n03"]
    finally:
        rate_test.SUPPORTING = saved
