"""Prometheus metrics of the report's newer rows (records/report_metrics.py): the leaf switches blamed
instead of their nodes, the nodes under them, the rate-test suspects, the figures that could not be
judged and the counters that saturate, as `report --stragglers --prom FILE` writes them; each file
checked line by line against the text exposition format and read back with prometheus_client."""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_hooks.cli.main import main
from slurm_hooks.records import report_metrics, straggler_scan
from slurm_hooks.result import ExitCode
from slurm_hooks.slurm import topology_conf
from tests.helpers import assert_exposition
from tests.straggler_records import HW, NOW, healthy, settings, write, write_jobs, write_untrusted

TWO_LEAVES = (
    "SwitchName=s0 Nodes=n[00-07]\nSwitchName=s1 Nodes=n[08-15]\nSwitchName=top Switches=s[0-1]\n"
)
SATURATED = "not scored: saturated (mlx5_0:1 port_xmit_wait saturated: at the 32-bit maximum)"


def samples(text):
    """{(family, frozenset(labels)): value} of an exposition text, after checking its format."""
    assert_exposition(text)
    return {
        (family.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(
        '[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n' % (tmp_path / "state")
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(path))
    return path


def test_a_suspect_leaf_switch_and_its_nodes_are_metrics(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    rng = random.Random(5)
    names = ["n%02d" % i for i in range(16)]
    for j in range(12):  # leaf s1's n08-n10, n12 stall on the fabric in every job; n02 on its own
        for node in rng.sample(names, 12):
            figures = healthy(rng)
            if node in ("n08", "n09", "n10", "n12", "n02"):
                figures["ib_xmit_wait_per_s"] = rng.uniform(2e6, 3e6)
            write(d, node, 100 + j, figures, NOW - (12 - j) * 3600, user="user%d" % (j % 3))
    topology = tmp_path / "topology.conf"
    topology.write_text(TWO_LEAVES)
    config.write_text(config.read_text() + '[fleet]\ntopology_conf = "%s"\n' % topology)
    prom = tmp_path / "stragglers.prom"
    assert main(["report", "--stragglers", d, "--prom", str(prom)]) == ExitCode.FOUND
    found = samples(prom.read_text())
    wait = "ib_xmit_wait_per_s"
    assert (
        found[("slurm_hooks_fleet_switch_suspect", frozenset({("switch", "s1"), ("metric", wait)}))]
        == 1
    )
    assert (
        found[
            (
                "slurm_hooks_fleet_switch_suspect_nodes",
                frozenset({("switch", "s1"), ("metric", wait)}),
            )
        ]
        == 4
    )
    # the node suspects are the old families, and the switch's nodes are not among them
    stragglers = {dict(k[1])["node"] for k in found if k[0] == "slurm_hooks_fleet_straggler"}
    assert stragglers == {"n02"}
    capsys.readouterr()


def test_saturating_counters_and_blind_spots_are_metrics(tmp_path):
    rng = random.Random(8)
    names = ["n%02d" % i for i in range(16)]
    for job in range(20):
        for node in rng.sample(names, 12):
            figures = healthy(rng)
            untrusted = None
            if node in ("n08", "n09", "n10", "n11", "n12", "n13"):
                del figures["ib_xmit_wait_per_s"]
                untrusted = {"ib_xmit_wait_per_s": SATURATED}
            elif node == "n14":
                figures["ib_xmit_wait_per_s"] = rng.uniform(2e6, 3e6)
            write_untrusted(str(tmp_path), node, 100 + job, figures, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    found = samples(report_metrics.straggler_rows_text(result))
    saturating = {
        dict(k[1])["node"]: v
        for k, v in found.items()
        if k[0] == "slurm_hooks_fleet_saturating_ratio"
    }
    assert sorted(saturating) == ["n08", "n09", "n10", "n11", "n12", "n13"]
    assert all(0 < v <= 1 for v in saturating.values())
    blind = {
        (dict(k[1])["node"], dict(k[1])["why"]): v
        for k, v in found.items()
        if k[0] == "slurm_hooks_fleet_not_judged_jobs"
    }
    rows = {(r["node"], r["why"]): r["jobs"] for r in result.blind.rows()}
    assert blind == rows and blind[("n08", "saturated")] >= 3
    # under topology.conf the six are one switch's row, and n14 is a node under a suspect leaf
    result.leaf_of = topology_conf.parse("topology.conf", TWO_LEAVES).leaf_of
    found = samples(report_metrics.straggler_rows_text(result))
    assert not [k for k in found if k[0] == "slurm_hooks_fleet_saturating_ratio"]
    key = frozenset({("switch", "s1"), ("metric", "ib_xmit_wait_per_s")})
    assert found[("slurm_hooks_fleet_saturating_switch_nodes", key)] == 6
    under = frozenset({("node", "n14"), ("metric", "ib_xmit_wait_per_s")})
    assert found[("slurm_hooks_fleet_under_suspect_switch", under)] == 1


def test_a_rate_suspect_is_a_metric_and_empty_families_are_still_declared(tmp_path):
    d = str(tmp_path / "jobs")
    write_jobs(
        d, jobs=40, nodes=6, slow="n03", slow_in=lambda j: j % 4 == 0 and (j < 30 or j in (32, 36))
    )
    result = straggler_scan.scan([d], settings(window_days=30.0), now=NOW)
    text = report_metrics.straggler_rows_text(result)
    found = samples(text)
    key = (
        "slurm_hooks_fleet_rate_suspect_flagged_ratio",
        frozenset({("node", "n03"), ("metric", HW)}),
    )
    assert found[key] == 10 / 40
    for name in ("switch_suspect", "saturating_ratio", "under_suspect_switch"):
        assert "# TYPE slurm_hooks_fleet_%s gauge" % name in text  # declared, no samples
