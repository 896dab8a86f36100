"""Slurm's topology.conf read (slurm/topology_conf.py), and a degraded leaf switch reported as one
switch suspect instead of each of its nodes (records/topology_groups.py; issue 30).

Real files: tests/captures/topology (sources in its README). The three-level tree with Switches=
and the block form below are as NVIDIA's topograph tests write them (GitHub code search)."""

from __future__ import annotations

import json
import os
import random

import pytest

from slurm_hooks.cli.main import main
from slurm_hooks.hw.host import HostError, ParseError
from slurm_hooks.records import straggler_scan
from slurm_hooks.result import ExitCode
from slurm_hooks.slurm import topology_conf
from tests.straggler_records import NOW, healthy, settings, write

CAPTURES = os.path.join(os.path.dirname(__file__), "captures", "topology")
TREE = """SwitchName=core Switches=spine
SwitchName=no-topology Nodes=node[13,23]
SwitchName=spine Switches=tor[1-2]
SwitchName=tor1 Nodes=node[11-12]
SwitchName=tor2 Nodes=node[21-22]
"""
BLOCK = """# block001=nvl1
BlockName=block001 Nodes=node[11-12]
# block002=nvl2
BlockName=block002 Nodes=node[21-22]
BlockSizes=2,4
"""


def test_a_real_superpod_file_with_a_node_under_two_leaves():
    topo = topology_conf.load(os.path.join(CAPTURES, "superpod-topology.conf"))
    assert topo.leaf_of["circe-n001"] == "s0" and topo.leaf_of["circe-n080"] == "s4"
    assert topo.leaf_of["n019"] == "s0"  # the file's own typo, kept as written
    assert topo.leaf_of["circe-n051"] == "s2"  # listed under s2 and again under s4
    assert topo.duplicates == [("circe-n051", "s2", "s4")]
    assert len(topo.members["s2"]) == 18 and "circe-n051" not in topo.members["s4"]


def test_a_real_puppet_file_with_a_comment_banner():
    topo = topology_conf.load(os.path.join(CAPTURES, "maatthias-topology.conf"))
    assert sorted(topo.members) == ["s0", "s1", "s2", "s3"]
    assert len(topo.members["s0"]) == 19 + 13 + 2 + 2 and topo.leaf_of["saturn4"] == "s3"


def test_tree_levels_and_blocks():
    tree = topology_conf.parse("topology.conf", TREE)
    assert tree.leaf_of == {
        "node13": "no-topology",
        "node23": "no-topology",
        "node11": "tor1",
        "node12": "tor1",
        "node21": "tor2",
        "node22": "tor2",
    }
    assert tree.parents == {"core": ["spine"], "spine": ["tor1", "tor2"]}
    block = topology_conf.parse("topology.conf", BLOCK)
    assert block.kind == "block" and block.leaf_of["node22"] == "block002"


@pytest.mark.parametrize(
    "text, named",
    [
        ("SwitchNme=s1 Nodes=a[1-2]\n", "SwitchNme"),
        ("SwitchName=s1 Nodes=a[1-2] Speed=4\n", "speed"),
        ("SwitchName=s1 Nodes=a[2-\n", "a[2-"),
    ],
)
def test_a_broken_line_is_an_error_naming_the_file_and_line(text, named):
    with pytest.raises(ParseError) as caught:
        topology_conf.parse("/etc/slurm/topology.conf", "# ok\n" + text)
    assert "/etc/slurm/topology.conf:2" in str(caught.value) and named in str(caught.value)


def fabric_fleet(directory, bad_leaf_nodes, lone="n02", jobs=12, seed=5):
    """16 nodes, leaf s0 = n00-n07, s1 = n08-n15; each job on 12 of them. `bad_leaf_nodes` (under
    s1) stall on the fabric in every job (a degraded leaf switch), and `lone` (under s0) too (its
    own cable)."""
    rng = random.Random(seed)
    names = ["n%02d" % i for i in range(16)]
    for j in range(jobs):
        end = NOW - (jobs - j) * 3600
        for node in rng.sample(names, 12):
            figures = healthy(rng)
            if node in bad_leaf_nodes or node == lone:
                figures["ib_xmit_wait_per_s"] = rng.uniform(2e6, 3e6)
            write(directory, node, 100 + j, figures, end, user="user%d" % (j % 3))
    return "SwitchName=s0 Nodes=n[00-07]\nSwitchName=s1 Nodes=n[08-15]\nSwitchName=top Switches=s[0-1]\n"


def test_a_degraded_leaf_switch_is_one_suspect_and_none_of_its_nodes(tmp_path):
    d = str(tmp_path / "jobs")
    text = fabric_fleet(d, ["n08", "n09", "n10", "n12"])
    result = straggler_scan.scan([d], settings(), now=NOW)
    before = {(s.node, s.metric) for s in result.suspects()}
    assert {n for n, _ in before} == {"n02", "n08", "n09", "n10", "n12"}  # each a node suspect
    result.leaf_of = topology_conf.parse("topology.conf", text).leaf_of
    after = {(s.node, s.metric) for s in result.suspects()}
    assert after == {("n02", "ib_xmit_wait_per_s")}  # its own fault: still the node's
    (switch,) = result.switches()
    assert (switch.switch, switch.metric, switch.nodes) == (
        "s1",
        "ib_xmit_wait_per_s",
        ["n08", "n09", "n10", "n12"],
    )
    assert switch.scored == 8
    shown = straggler_scan.render(result)
    assert "s1 ib_xmit_wait_per_s: 4 of its 8 scored nodes" in shown
    assert straggler_scan.to_dict(result)["switch_suspects"][0]["nodes"] == switch.nodes


def test_two_bad_nodes_under_a_large_leaf_stay_node_suspects(tmp_path):
    d = str(tmp_path / "jobs")
    text = fabric_fleet(d, ["n08", "n09"], lone=None)
    result = straggler_scan.scan([d], settings(), now=NOW)
    result.leaf_of = topology_conf.parse("topology.conf", text).leaf_of
    assert {s.node for s in result.suspects()} == {"n08", "n09"} and not result.switches()


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(
        '[general]\nmode = "enforce"\n[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
        % (tmp_path / "state")
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(path))
    return path


def test_the_report_reads_topology_conf_from_the_config(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    topology = tmp_path / "topology.conf"
    topology.write_text(fabric_fleet(d, ["n08", "n09", "n10", "n12"]))
    config.write_text(config.read_text() + '[fleet]\ntopology_conf = "%s"\n' % topology)
    assert main(["report", "--stragglers", d, "--json"]) == ExitCode.FOUND
    data = json.loads(capsys.readouterr().out)
    assert [s["node"] for s in data["suspects"]] == ["n02"]
    assert data["switch_suspects"][0]["switch"] == "s1"
    topology.write_text("SwitchName=s0 Nodes=n[00-07\n")
    assert main(["report", "--stragglers", d]) == ExitCode.UNKNOWN
    assert "[fleet] topology_conf" in capsys.readouterr().err
    os.remove(str(topology))
    assert main(["report", "--stragglers", d]) == ExitCode.UNKNOWN
    with pytest.raises(HostError):
        topology_conf.load(str(topology))


def test_a_leaf_whose_nodes_saturate_their_counters_is_the_switch(tmp_path):
    """A degraded leaf stalls its nodes' ports hard enough to saturate their 32-bit
    port_xmit_wait: the figure is unmeasurable there, and the saturating nodes under one leaf
    are the switch's row, not six node rows."""
    from tests.straggler_records import write_untrusted

    rng = random.Random(8)
    reason = "not scored: saturated (mlx5_0:1 port_xmit_wait saturated: at the 32-bit maximum)"
    names = ["n%02d" % i for i in range(16)]
    for job in range(20):
        for node in rng.sample(names, 12):
            figures = healthy(rng)
            untrusted = None
            if node in ("n08", "n09", "n10", "n11", "n12", "n13"):
                del figures["ib_xmit_wait_per_s"]
                untrusted = {"ib_xmit_wait_per_s": reason}
            elif node == "n14":  # under the same leaf, its counter still measurable: stalled
                figures["ib_xmit_wait_per_s"] = rng.uniform(2e6, 3e6)
            write_untrusted(str(tmp_path), node, 100 + job, figures, untrusted)
    result = straggler_scan.scan([str(tmp_path)], settings(), now=NOW)
    assert len(result.saturating()[0]) == 6 and result.saturating()[1] == []
    assert [s.node for s in result.suspects()] == ["n14"]
    result.leaf_of = topology_conf.parse(
        "topology.conf", "SwitchName=s0 Nodes=n[00-07]\nSwitchName=s1 Nodes=n[08-15]\n"
    ).leaf_of
    rows, switches = result.saturating()
    assert rows == [] and [(w["switch"], w["nodes"]) for w in switches] == [
        ("s1", ["n08", "n09", "n10", "n11", "n12", "n13"])
    ]
    assert straggler_scan.to_dict(result)["switch_suspects"][0]["why"] == "saturating"
    assert result.suspects() == [] and [s.node for s in result.under_switch()] == ["n14"]
    assert "n14 ib_xmit_wait_per_s: under s1" in straggler_scan.render(result)
    assert "s1 ib_xmit_wait_per_s: 6 of its 8 nodes saturate" in straggler_scan.render(result)


def test_broken_gpus_under_one_small_leaf_stay_node_suspects(tmp_path):
    """Red team, round 3: a leaf switch stalls its nodes' fabric (or, a hot rack, heats their
    GPUs); it does not put a GPU in HW slowdown. Three such nodes of an 8-node leaf (a small
    cluster under one switch) were the switch's suspect, none a node suspect: none drained, and
    left out of the fleet's flag rate."""
    d = str(tmp_path / "jobs")
    rng = random.Random(7)
    names = ["n%02d" % i for i in range(8)]
    broken = {"n01", "n04", "n06"}
    for j in range(12):
        end = NOW - (12 - j) * 3600
        for node in names:
            figures = healthy(rng)
            if node in broken:
                figures["throttle_frac.hw_slowdown"] = rng.uniform(0.15, 0.25)
            write(d, node, 100 + j, figures, end, user="user%d" % (j % 3))
    result = straggler_scan.scan([d], settings(), now=NOW)
    result.leaf_of = topology_conf.parse("topology.conf", "SwitchName=s0 Nodes=n[00-07]\n").leaf_of
    assert {s.node for s in result.suspects()} == broken and not result.switches()
    assert result.under_switch() == []
