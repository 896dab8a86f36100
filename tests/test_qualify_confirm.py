"""From suspicion to proof (tracker 30): with [fleet] confirm_with = "qualify" (the default) a
straggler suspect that `report --stragglers --drain` would drain is queued for qualification
instead (qualify/queue.py), never drained on statistics alone; `qualify --due` picks it and the
nodes drained by us for reboot/reset-gpu that have rebooted since (qualify/due.py).

Records: tests/straggler_records (signed, as the epilogs write them); Slurm: the in-memory
slurmctld (tests/doubles/memory_slurm) for the enactment, and the real `scontrol show node -o`
lines of tests/captures/slurm for what `--due` reads. On the real slurmctld: test_qualify_slurm."""

from __future__ import annotations

import json
import os

import pytest

from slurm_hooks.qualify import due, queue
from slurm_hooks.records import straggler_scan as fleet
from slurm_hooks.slurm import straggler_drain
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.node_state import NodeInfo, parse_node_line
from tests.doubles.memory_slurm import MemoryBackend
from tests.helpers import default_settings
from tests.straggler_records import NOW, settings, write_jobs

CAPTURES = os.path.join(os.path.dirname(__file__), "captures", "slurm")
NODES = ["node%d" % i for i in range(1, 7)]


def suspects(tmp_path):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12, names=NODES, slow="node3")
    found = fleet.scan([d], settings(), now=NOW).suspects()
    assert {s.node for s in found} == {"node3"}
    return found


def drain_settings(tmp_path, **fleet_changes):
    values = default_settings()  # mode enforce
    values["paths"]["state_dir"] = str(tmp_path / "state")
    values["fleet"].update(drain=True, **fleet_changes)
    return values


def memory_client():
    backend = MemoryBackend([NodeInfo(name, "IDLE") for name in NODES])
    return SlurmClient(backend=backend), backend


def test_a_suspect_is_queued_for_qualification_not_drained(tmp_path):
    found = suspects(tmp_path)
    config = drain_settings(tmp_path)
    assert config["fleet"]["confirm_with"] == "qualify"  # the default
    client, backend = memory_client()
    (row,) = straggler_drain.enact(config, found, client=client)
    assert (row.node, row.outcome) == ("node3", "queued-for-qualification"), row
    assert "DRAIN" not in backend.nodes["node3"].flags  # not drained on statistics alone
    with open(os.path.join(config["paths"]["state_dir"], queue.NAME)) as handle:
        saved = json.load(handle)
    entry = saved["queued"]["node3"]
    assert entry["metric"] == "throttle_frac.hw_slowdown"
    assert entry["straggler"].startswith("sh:fleet.straggler: throttle_frac.hw_slowdown 0.2 vs 0")
    (again,) = straggler_drain.enact(config, found, client=client)
    assert again.outcome == "already-queued"
    # a pass is remembered: the same evidence does not queue it again
    queue.settle(config, "node3", "pass")
    (after_pass,) = straggler_drain.enact(config, found, client=client)
    assert after_pass.outcome == "passed-qualification", after_pass
    assert "0 flagged job(s) of 0 user(s) since" in after_pass.message
    assert queue.read(queue.path_for(config))["queued"] == {}


def test_confirm_with_none_drains_as_before(tmp_path):
    found = suspects(tmp_path)
    client, backend = memory_client()
    (row,) = straggler_drain.enact(
        drain_settings(tmp_path, confirm_with="none"), found, client=client
    )
    assert row.outcome == "drained" and "DRAIN" in backend.nodes["node3"].flags
    assert backend.nodes["node3"].reason.startswith("sh:fleet.straggler: ")


def test_a_queue_of_another_shape_queues_nothing_and_drains_nothing(tmp_path):
    found = suspects(tmp_path)
    config = drain_settings(tmp_path)
    os.makedirs(config["paths"]["state_dir"])
    with open(queue.path_for(config), "w") as handle:
        handle.write('{"queued": ["node3"]}')
    client, backend = memory_client()
    (row,) = straggler_drain.enact(config, found, client=client)
    assert row.outcome == "queue-unusable" and "qualify-queue.json" in row.message
    assert "'queued' is not an object of nodes" in row.message
    assert "DRAIN" not in backend.nodes["node3"].flags


def test_the_queue_is_bounded(tmp_path, monkeypatch):
    config = drain_settings(tmp_path)
    monkeypatch.setattr(queue, "MAX_NODES", 3)
    for i in range(5):
        queue.update(
            queue.path_for(config),
            lambda state, i=i: state["queued"].__setitem__("n%d" % i, {"time": 100.0 + i}),
        )
    assert sorted(queue.read(queue.path_for(config))["queued"]) == ["n2", "n3", "n4"]


def capture(version, name, boot=None):
    """A real `scontrol show node -o` line; with `boot`, its BootTime set to that (the node
    rebooted: the only change)."""
    import re

    with open(os.path.join(CAPTURES, version, name)) as handle:
        line = handle.read().strip()
    if boot:
        line = re.sub(r"BootTime=\S+", "BootTime=" + boot, line)
    return parse_node_line(line)


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5", "26.05.5"])
def test_a_node_drained_by_us_for_a_reboot_is_due_once_it_has_rebooted(version):
    # the real line: drained by us '-> reboot', BootTime before the drain
    waiting = capture(version, "show-node-drained-ours.txt")
    ok, why = due.repaired(waiting, "sh:")
    assert not ok and why == "drained for reboot, not rebooted since"
    # the same line after the node rebooted (BootTime moved after the drain's time)
    rebooted = capture(version, "show-node-drained-ours.txt", boot="2026-12-03T02:10:00")
    ok, why = due.repaired(rebooted, "sh:")
    assert ok and "rebooted at 2026-12-03T02:10:00Z" in why, why
    # a reason asking only for a drain, an admin's reason, an idle node: not due
    plain = rebooted.__class__(**dict(rebooted.__dict__, reason="sh:gpu.count: x -> drain"))
    admins = rebooted.__class__(**dict(rebooted.__dict__, reason="admin: -> reboot tomorrow"))
    idle = capture(version, "show-node-idle.txt")
    for node in (plain, admins, idle):
        assert due.repaired(node, "sh:") == (False, "")
    due_list, waiting_list = due.pick(
        [waiting], {"node9": {"time": NOW, "metric": "m"}, "node1": {"time": NOW}}, "sh:"
    )
    assert due_list == []  # node1 is drained for a reboot that has not happened: not a suspect now
    assert [(w["node"], w["kind"], w["why"][:28]) for w in waiting_list] == [
        ("node1", "repaired", "drained for reboot, not rebo"),
        ("node1", "straggler", "drained (slurm-hooks: gpu.co"),
        ("node9", "straggler", "not a node Slurm lists"),
    ]
    due_list, _ = due.pick([rebooted], {"node1": {"time": NOW}}, "sh:")
    assert [(d["node"], d["kind"]) for d in due_list] == [("node1", "repaired")]


def test_a_confirmed_straggler_drain_names_the_test_and_both_figures(tmp_path):
    config = drain_settings(tmp_path)
    straggler = (
        "sh:fleet.straggler: throttle_frac.hw_slowdown 0.2 vs 0 of its job peers (higher is "
        "worse), 12 of its last 10 jobs, worst z 41 (job 111) -> drain"
    )
    reason = due.confirmed_reason(
        "nvbandwidth: nvbandwidth GPU 3 h2d 13.2 GB/s < 80% of the node's median 25.8",
        straggler,
        config,
    )
    assert reason.startswith("sh:fleet.straggler: qualify nvbandwidth: nvbandwidth GPU 3 h2d 13.2")
    assert "straggler throttle_frac.hw_slowdown 0.2 vs 0" in reason and reason.endswith("-> drain")
    assert len(reason) <= config["drain"]["max_reason_length"]
    from slurm_hooks.slurm import policy

    assert policy.read_reason(reason, "sh:").checks == (policy.FLEET_CHECK,)  # an admin clears it


def test_a_hand_edited_queue_name_is_never_qualified_or_sent(tmp_path):
    """A queue entry naming no node Slurm lists (a typo, '../x', a hostlist) waits with the reason;
    nothing reaches Slurm or the work directory for it."""
    config = drain_settings(tmp_path)
    for name in ("../etc", "node[1-3]", "nodeX"):
        queue.update(
            queue.path_for(config),
            lambda state, n=name: state["queued"].__setitem__(n, {"time": NOW}),
        )
    client, backend = memory_client()
    done = due.run_due(client, config, "quick", ["false"], str(tmp_path))
    assert done["due"] == []
    assert sorted(w["node"] for w in done["waiting"]) == sorted(["../etc", "node[1-3]", "nodeX"])
    assert {w["why"] for w in done["waiting"]} == {"not a node Slurm lists"}
