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
    # 2 of its last 10: not a k-of-m suspect; a suspect by its rate, drained like the others
    (found,) = result.suspects()
    assert found.basis == "rate" and result.rate_suspects() == [found]
    assert (found.node, found.metric, found.flagged, found.window) == ("n03", HW, 10, 40)
    assert "n03 throttle_frac.hw_slowdown: 10 of 40 scored jobs" in straggler_scan.render(result)
    assert straggler_scan.to_dict(result)["rate_suspects"][0]["node"] == "n03"


def test_a_node_flagged_as_often_as_the_fleet_is_not_a_rate_suspect(tmp_path):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=40, nodes=6, slow="n03", slow_in=lambda j: j in (3, 17, 33))
    result = straggler_scan.scan([d], settings(window_days=30.0), now=NOW)
    assert result.rate_suspects() == []  # 3 glitches in 40 jobs, spread: chance, not a fault


def test_a_power_cap_flag_rate_without_a_power_cost_makes_no_suspect():
    """A leaky GPU at its cap is flagged on throttle_frac.power in many jobs without drawing less
    power than its peers: its rate stands out, its cost does not (slowness.costly). A low power
    limit flagged as often, each time drawing 10 % less, is a suspect by its rate."""
    from slurm_hooks.core.structs import replace
    from slurm_hooks.records import slowness, stragglers

    rates = rate_test.FlagRates()
    every = stragglers.ALL_METRICS
    capped = stragglers.Flag("throttle_frac.power", 30.0, 0.4, 0.0, 19)
    for j in range(200):
        for n in range(20):
            flags = ()
            if n == 3 and j % 8 == 0:
                flags = (replace(capped, cost=0.004),)  # power as its peers': odd, not slow
            if n == 7 and j % 8 == 0:
                flags = (replace(capped, cost=0.1),)  # 10 % less power: slowed
            rates.add("n%02d" % n, stragglers.JobMark(str(j), NOW, 20, "u", flags, None, every))
    found = {s.node: s for s in rates.suspects(3, [])}
    assert set(found) == {"n03", "n07"}  # both flagged far more often than the fleet
    assert not slowness.costly(found["n03"]) and slowness.costly(found["n07"])
    assert found["n07"].cost == 0.1 and found["n07"].basis == "rate"


def test_the_fleet_rate_leaves_out_the_nodes_a_suspect_switch_explains():
    """A degraded leaf flags its nodes in a third of their jobs; counted in the fleet's rate it
    hid a node stalling in 1 of 20 jobs elsewhere (harsh fleet seed 33)."""
    from slurm_hooks.records import stragglers

    rates = rate_test.FlagRates()
    every = stragglers.ALL_METRICS
    stall = stragglers.Flag("ib_xmit_wait_per_s", 9.0, 9e5, 1e5, 19)
    under_leaf = ["n%02d" % i for i in range(4)]
    for j in range(200):
        for n in range(20):
            node = "n%02d" % n
            slow = (node in under_leaf and j % 3 == 0) or (node == "n10" and j % 20 == 0)
            mark = stragglers.JobMark(str(j), NOW, 20, "u", (stall,) if slow else (), None, every)
            rates.add(node, mark)
    plain = {s.node for s in rates.suspects(3, [])}
    assert "n10" not in plain  # 10 of 200 against a fleet rate of 6 %
    explained = {"ib_xmit_wait_per_s": under_leaf}
    assert "n10" in {s.node for s in rates.suspects(3, [], explained=explained)}


def test_a_clean_run_after_a_reboot_is_a_repair_only_when_the_nodes_rate_makes_it_unlikely():
    from slurm_hooks.records import stragglers

    window = stragglers.NodeWindow("n03", 10, 3)
    window.scored, window.reboot_at, window.on_probation = 200, 197, 0  # 4 clean jobs since
    assert rate_test._repaired(window, 150, 200, 0)  # slow in 3 of 4: 4 clean is a repair
    assert not rate_test._repaired(window, 10, 200, 0)  # slow in 1 of 20: 4 clean is chance
    window.reboot_at = 120  # 81 clean jobs since
    assert rate_test._repaired(window, 10, 200, 0)


def test_a_rate_suspect_flagged_only_in_one_users_jobs_is_not_drained(tmp_path):
    """Red team, round 3: the rate test is a suspect path that drains; [fleet] drain_min_users
    still holds for it (one user can make a node look slow in its own jobs)."""
    from slurm_hooks.slurm import straggler_drain

    d = str(tmp_path / "jobs")
    # write_jobs gives job j to user j % 3: slow only in user0's jobs, twice in the last 10
    write_jobs(d, jobs=40, nodes=6, slow="n03", slow_in=lambda j: j % 6 == 0)
    result = straggler_scan.scan([d], settings(window_days=30.0), now=NOW)
    (found,) = result.suspects()
    assert (found.basis, found.users, found.flagged) == ("rate", 1, 7)
    wanted, (row,) = straggler_drain.choose([found], settings(drain=True), {})
    assert wanted == [] and row.outcome == "too-little-evidence" and "1 user(s)" in row.message
