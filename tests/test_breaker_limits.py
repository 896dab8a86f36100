"""The breaker's absolute cap, rate window and common-cause trip (slurm/breaker.py), against the
in-memory slurmctld (tests/doubles/memory_slurm.py: reason times in the controller's whole seconds).
The same limits under 20 simultaneous drains against the real slurmctld: tests/test_breaker_concurrency.py.
"""

from __future__ import annotations

from slurm_hooks.slurm import drainer
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.drainer import Outcome
from slurm_hooks.slurm.node_state import NodeInfo
from tests.doubles.memory_slurm import REASON, cluster, settings

XID = "sh:gpu.xid g%d: gpu:%d 0000:%02x:00.0 Xid 79 fell off the bus -> reboot"
WIDE = {"max_percent": 100.0, "min_nodes": 0, "max_nodes": 0}  # only the limit under test binds


def xid(gpu):
    return XID % (gpu, gpu, 0x18 + gpu)


def big_cluster(count):
    return cluster(*[NodeInfo("node%02d" % i, "IDLE") for i in range(10, 10 + count)])


def drain_at(backend, name, reason, seconds_ago):
    """An automatic drain of ours made `seconds_ago` on the controller's clock."""
    now = backend.clock
    backend.clock = now - seconds_ago
    backend.admin_drain(name, reason)
    backend.clock = now


def test_the_absolute_cap_binds_where_the_share_would_allow_more():
    backend = big_cluster(100)  # 109 nodes: 10 % would allow 10
    for i in range(3):
        drain_at(backend, "node%02d" % (10 + i), xid(i), 7200 + i)
    limits = dict(max_nodes=3, max_window_drains=0, common_cause_nodes=0)
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.BREAKER and enacted.breaker.limit == 3, enacted
    assert "3 of 109 nodes already drained" in enacted.message
    limits["max_nodes"] = 0  # no absolute cap: the share (10) applies
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.DRAINED and enacted.breaker.limit == 10, enacted


def test_the_rate_window_counts_recent_drains_by_slurms_reason_time():
    backend = big_cluster(20)
    for i, ago in enumerate((3000, 2000, 100)):  # three within the hour, by the reason time
        drain_at(backend, "node%02d" % (10 + i), xid(i), ago)
    drain_at(backend, "node20", xid(5), 5 * 3600)  # one long ago: not in the window
    limits = dict(WIDE, max_window_drains=3, window_s=3600.0, common_cause_nodes=0)
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.BREAKER and enacted.breaker.window_drains == 3, enacted
    assert "within 60 min (limit 3 per window)" in enacted.message
    assert not backend.nodes["node1"].is_drained
    backend.clock += 700  # the oldest (3000 s ago) leaves the hour
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.DRAINED and enacted.breaker.window_drains == 2, enacted


def test_a_drain_whose_time_cannot_be_read_counts_inside_the_window():
    backend = big_cluster(5)
    for i in range(2):
        backend.nodes["node%02d" % (10 + i)] = NodeInfo(
            "node%02d" % (10 + i), "IDLE", frozenset({"DRAIN"}), xid(i), "root", None
        )
    limits = dict(WIDE, max_window_drains=2, window_s=60.0, common_cause_nodes=0)
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.BREAKER and enacted.breaker.window_drains == 2


def test_the_same_check_on_many_nodes_within_minutes_is_held_as_a_common_cause():
    backend = big_cluster(20)
    for i in range(3):
        drain_at(backend, "node%02d" % (10 + i), xid(i), 60 * (i + 1))
    limits = dict(WIDE, max_window_drains=0, common_cause_nodes=3, common_cause_window_s=600.0)
    enacted = drainer.drain(SlurmClient(backend), "node1", xid(4), settings(breaker=limits))
    assert enacted.outcome is Outcome.BREAKER and enacted.breaker.common_cause, enacted
    assert "common cause: 3" in enacted.message and "gpu.xid" in enacted.message
    assert not backend.nodes["node1"].is_drained and backend.log == ["show", "list"]
    # another check is not held: the signature is the check that leads the reason
    enacted = drainer.drain(SlurmClient(backend), "node2", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.DRAINED and not enacted.breaker.common_cause, enacted
    # ten minutes later the burst is over: the same check drains again
    backend.clock += 600
    enacted = drainer.drain(SlurmClient(backend), "node1", xid(4), settings(breaker=limits))
    assert enacted.outcome is Outcome.DRAINED, enacted


def test_simultaneous_drains_of_one_check_rank_and_undo_past_the_common_cause_limit():
    """Two drains of the same check land in our second while we wait, with smaller names: they
    rank ahead of ours; with the limit at 2 ours is undone (phase rank)."""
    backend = big_cluster(5)

    def two_land_in_our_second():
        backend.admin_drain("node10", xid(0))
        backend.admin_drain("node11", xid(1))

    backend.before["drain"] = two_land_in_our_second
    limits = dict(WIDE, max_window_drains=0, common_cause_nodes=2, common_cause_window_s=600.0)
    enacted = drainer.drain(SlurmClient(backend), "node12", xid(2), settings(breaker=limits))
    assert enacted.outcome is Outcome.BREAKER_UNDONE and enacted.breaker.phase == "rank", enacted
    assert enacted.breaker.signature_drains == 2 and "common cause" in enacted.message
    assert not backend.nodes["node12"].is_drained and backend.log[-1] == "resume"


def test_the_rate_window_after_the_drain_ends_at_our_own_reason_time():
    """Before the drain the host's clock is an estimate; after it, the window ends at our drain's
    reason time (slurmctld's clock): a drain 3599 s before ours is in, 3600 s is out."""
    backend = big_cluster(5)
    backend.clock = float(int(backend.clock)) + 0.25
    drain_at(backend, "node10", xid(0), 3599)
    drain_at(backend, "node11", xid(1), 3600)
    limits = dict(WIDE, max_window_drains=2, window_s=3600.0, common_cause_nodes=0)
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker=limits))
    assert enacted.outcome is Outcome.DRAINED and enacted.breaker.window_drains == 1, enacted
