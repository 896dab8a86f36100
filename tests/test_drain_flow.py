"""The hooks' drain/resume flow (hooks.run_hook) and the admin verbs' helpers, with Slurm in memory
(tests/test_drainer.py MemoryBackend, which follows slurmctld's node_mgr.c) and checks driven by a file.

Issue 12 §2: resume only on proof (every check that caused the drain ran and passed), only what is
provably ours (Slurm's exact reason and reason time, or our reason when the local state is lost),
and never an exit code that makes slurmctld drain a node we decided to leave alone. The same flows
against the real slurmctld: tests/test_drain_slurm.py and tests/test_e2e_slurm.py.
"""

from __future__ import annotations

import errno
import json

import pytest

from slurm_hooks import hooks
from slurm_hooks.hooks import state as hook_state
from slurm_hooks.result import ExitCode
from slurm_hooks.slurm import drainer, nodelock
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.drainer import Outcome, node_status
from slurm_hooks.slurm.node_state import NodeInfo
from tests import flow_rig
from tests.doubles.memory_slurm import MemoryBackend, cluster

JOB_ENV, HEALTH_ENV = flow_rig.JOB_ENV, flow_rig.HEALTH_ENV
rig = flow_rig.rig  # the fixture: Slurm in memory, one check driven by a file (tests/flow_rig.py)


# ------------------------------------------------------------------------------------------------
# resume only on proof


@pytest.mark.parametrize("what", ["unknown", "hang", "crash"])
def test_unknown_or_timeout_keeps_the_drain(rig, what):
    """Before: any health run that was not node-broken resumed, so a check that hung or crashed
    released the node it had drained."""
    assert rig.run("prolog", "node").exit_code == ExitCode.NODE_BROKEN and rig.node().is_drained
    out = rig.run("health", what)
    assert out.enacted.outcome is Outcome.UNPROVEN and out.calls == 0, out.enacted
    assert "demo.gpu: UNKNOWN" in out.enacted.message or "did not run" in out.enacted.message, (
        out.enacted.message
    )
    assert rig.node().is_drained and rig.state()["drained"]["checks"] == ["demo.gpu"]
    out = rig.run("health", "ok")
    assert (
        out.enacted.outcome is Outcome.RESUMED and not rig.node().is_drained and rig.state() == {}
    )


def test_unknown_keeps_a_pending_drain(rig):
    rig.backend.down = True
    out = rig.run("prolog", "node")
    assert out.enacted.outcome is Outcome.SLURM_UNAVAILABLE and out.exit_code == 0
    assert rig.state()["pending"]["checks"] == ["demo.gpu"]
    rig.backend.down = False
    out = rig.run("health", "unknown")
    assert (
        out.enacted is None and out.calls == 0 and rig.state()["pending"]["checks"] == ["demo.gpu"]
    )
    out = rig.run("health", "node")  # still broken and Slurm is back: delivered
    assert (
        out.enacted.outcome is Outcome.DRAINED
        and rig.node().is_drained
        and "pending" not in rig.state()
    )
    rig.backend.down = True
    rig.run(
        "prolog", "node"
    )  # (already drained: nothing pending) -- now a repaired node drops a pending one
    rig.backend.down = False
    rig.state_file.write_text(json.dumps({"pending": {"reason": "x", "checks": ["demo.gpu"]}}))
    out = rig.run("health", "ok")
    assert "pending" not in rig.state()


# ------------------------------------------------------------------------------------------------
# only what is provably ours


def test_an_admins_drain_through_our_verb_is_never_resumed(rig):
    """Before: an automatic drain, then `slurm-hooks drain --reason ...` by an admin: the next passing
    health run resumed the admin's drain, because it carried our prefix and we had a record."""
    rig.run("prolog", "node")
    enacted = drainer.drain_manual(
        SlurmClient(rig.backend), "node1", "BIOS update, ticket 4711", rig.config().settings
    )
    assert (
        enacted.outcome is Outcome.DRAINED
        and rig.node().reason == "sh:manual: BIOS update, ticket 4711"
    )
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.NOT_OURS and rig.node().is_drained, out.enacted
    assert "drained" not in rig.state()
    assert rig.run("health", "ok").calls == 0  # and then it is left alone


def test_same_text_later_is_not_our_drain(rig):
    """An admin resumes our drain and drains again with our very text: Slurm's reason time differs."""
    rig.run("prolog", "node")
    ours = rig.node().reason
    rig.backend.clock += 5
    rig.backend.admin_resume("node1")
    rig.backend.admin_drain("node1", ours)
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.NOT_OURS and rig.node().is_drained


def test_a_state_file_someone_else_wrote_never_lifts_an_admins_drain(rig):
    """The state file says which drain is ours to lift. One planted by another user (a state
    directory others can write: a typo'd [paths] state_dir under /tmp), naming an admin's drain
    with its exact reason and time, is not believed: the health run asks Slurm, whose reason is
    not ours, and the admin's drain stays."""
    import os

    rig.run("prolog", "node")
    planted = rig.state()
    rig.backend.clock += 5
    rig.backend.admin_resume("node1")
    rig.backend.admin_drain("node1", "DIMM B3 replaced, burn-in pending")
    node = rig.node()
    planted["drained"].update(reason=node.reason, reason_time=node.reason_time)
    rig.state_file.write_text(json.dumps(planted))
    os.chown(str(rig.state_file), 4242, 4242)
    out = rig.run("health", "ok")
    assert rig.node().is_drained and rig.node().reason == "DIMM B3 replaced, burn-in pending", (
        out.enacted
    )


def test_our_resume_leaves_nothing_that_reads_as_ours_on_2411(rig):
    """24.11 with accounting_storage/none keeps the Reason after RESUME; slurmctld's own later drain
    then shows it. Our RESUME carries its own reason, so what is kept is not ours."""
    rig.backend = cluster(keep_reason_on_resume=True)
    rig.run("prolog", "node")
    assert rig.run("health", "ok").enacted.outcome is Outcome.RESUMED
    assert (
        rig.node().reason == "resumed by slurm-hooks: demo.gpu passed" and not rig.node().is_drained
    )
    rig.backend.ctld_drain("node1", "Kill task failed")  # keeps the old reason, time and user
    out = rig.run("health", "ok")
    assert out.enacted is None and rig.node().is_drained  # not ours: no record, no call
    rig.state_file.unlink()  # even with the local state lost, it is not taken for ours
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.NOT_DRAINED and "no drain of ours" in out.enacted.message
    assert rig.node().is_drained
    out = rig.run("prolog", "node")
    assert out.enacted.outcome is Outcome.FOREIGN_DRAIN and out.exit_code == ExitCode.NODE_BROKEN


def test_lost_local_state_is_rebuilt_from_our_reason(rig):
    """A diskless node after the reboot our reason asked for: no state file. The health run asks
    Slurm once, takes our automatic drain back from its reason (it names the checks) and resumes it
    once they pass. `status` says so meanwhile."""
    rig.run("prolog", "node")
    rig.state_file.unlink()
    local = hooks.read_state(rig.config(), None)
    info = node_status(SlurmClient(rig.backend), "node1", rig.config(), True, local)
    assert info["drain"] == "slurm-hooks, automatic (demo.gpu)" and info["local_record"].startswith(
        "lost"
    )
    out = rig.run("health", "node")  # still broken: nothing to rebuild yet, the drain is ours
    assert (
        out.enacted.outcome is Outcome.ALREADY_OURS
        and rig.state()["drained"]["reason"] == rig.node().reason
    )
    rig.state_file.unlink()
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.RESUMED and not rig.node().is_drained, out.enacted
    assert out.calls == 3  # rebuild (show), re-read before resuming (show), resume
    assert rig.state() == {} and rig.run("health", "ok").calls == 0  # known again: no call


def test_full_disk_at_drain_time_loses_nothing(rig, monkeypatch):
    rig.run("health", "ok")  # a state file from an earlier run
    assert rig.state() == {}

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(hook_state, "write_json_atomic", full)
    assert rig.run("prolog", "node").enacted.outcome is Outcome.DRAINED
    assert (
        rig.state() is None
    )  # the outdated file is gone: it would claim nothing of ours is drained
    monkeypatch.undo()
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.RESUMED and not rig.node().is_drained


def test_an_admins_fail_is_never_overwritten_nor_resumed(rig):
    rig.backend.nodes["node1"] = NodeInfo(
        "node1", "IDLE", frozenset({"FAIL"}), "admin: DIMM errors", "root", "2026-12-02T10:00:00"
    )
    out = rig.run("prolog", "node")
    assert (
        out.enacted.outcome is Outcome.SKIPPED_STATE and out.exit_code == 0
    )  # FAIL is someone else's
    assert rig.node().reason == "admin: DIMM errors" and not rig.node().is_drained


# ------------------------------------------------------------------------------------------------
# no exit code that drains behind the breaker's back


@pytest.mark.parametrize(
    "setup,outcome",
    [
        ("maint", Outcome.SKIPPED_STATE),
        ("breaker", Outcome.BREAKER),
        ("cannot-count", Outcome.CANNOT_COUNT),
        ("down", Outcome.SLURM_UNAVAILABLE),
    ],
)
def test_when_we_do_not_drain_the_hook_exits_0(rig, setup, outcome):
    """Before: exit 1 (the script's 10) whenever a drain was wanted, so slurmctld drained the node
    itself with 'Prolog error' -- in a MAINT reservation, with the breaker tripped, or when the
    breaker could not count."""
    if setup == "maint":
        rig.backend.nodes["node1"] = NodeInfo(
            "node1", "IDLE", frozenset({"MAINTENANCE", "RESERVED"})
        )
    elif setup == "breaker":
        for name in ("node2", "node3"):
            rig.backend.admin_drain(name, "slurm-hooks: gpu.ecc: DBE -> reset-gpu")
    elif setup == "cannot-count":
        rig.backend.failing.add("list")
    else:
        rig.backend.down = True
    out = rig.run("prolog", "node")
    assert out.enacted.outcome is outcome and out.exit_code == 0 and not rig.node().is_drained, (
        out.enacted
    )
    if outcome in (Outcome.CANNOT_COUNT, Outcome.SLURM_UNAVAILABLE):
        assert rig.state()["pending"]["checks"] == ["demo.gpu"]


def test_the_node_drained_means_exit_10(rig):
    assert rig.run("prolog", "node").exit_code == ExitCode.NODE_BROKEN
    assert rig.run("epilog", "node").enacted.outcome is Outcome.ALREADY_OURS
    rig.backend.admin_resume("node1")
    rig.backend.admin_drain("node1", "admin: rack 7")
    out = rig.run("prolog", "node")
    assert out.enacted.outcome is Outcome.FOREIGN_DRAIN and out.exit_code == ExitCode.NODE_BROKEN


# ------------------------------------------------------------------------------------------------
# one node, two hooks at once


def test_a_hook_that_waited_for_the_lock_sees_the_drain_just_made(rig, monkeypatch):
    """Two prologs of one node deciding at once: the second waits for the first's lock, then finds
    the drain the first just recorded -- one drain, one count in the metrics."""
    assert rig.run("prolog", "node").enacted.outcome is Outcome.DRAINED
    drained_record = rig.state()["drained"]
    rig.state_file.write_text(json.dumps({}))  # as the second prolog saw it before taking the lock

    class SlowLock(nodelock.NodeLock):
        def __enter__(self):
            lock = super().__enter__()
            lock.waited = 0.5  # ...it waited while the first drained and wrote its record
            rig.state_file.write_text(
                json.dumps({"drained": dict(drained_record, time=lock.started + 0.1)})
            )
            return lock

    monkeypatch.setattr(nodelock, "NodeLock", SlowLock)
    calls = rig.backend.calls
    out = rig.run("prolog", "node")
    assert (
        out.enacted.outcome is Outcome.ALREADY_OURS
        and rig.backend.calls == calls
        and out.exit_code == 10
    )
    assert rig.metric("slurm_hooks_drains_total") == ["slurm_hooks_drains_total 1.0"]


def test_many_hostlist_words_are_refused_before_any_call():
    with pytest.raises(ValueError):
        from slurm_hooks.slurm.client import expand_hostlist

        expand_hostlist("node1;reboot")
    backend = MemoryBackend([])
    assert backend.calls == 0


def test_a_drain_that_landed_despite_a_timeout_is_ours_and_gets_ranked(rig):
    """The drain request timed out after slurmctld had acted: the pending record matches what Slurm
    shows, so the next run takes the drain as ours -- and, never ranked, re-ranks it."""
    backend = rig.backend

    def lands_then_times_out():
        backend.admin_drain("node1", rig.node_reason)
        backend.failing.add("drain")

    rig.node_reason = None
    out = rig.run("prolog", "node")  # a first drain tells us the reason text
    rig.node_reason = rig.node().reason
    backend.admin_resume("node1")
    rig.state_file.write_text("{}")
    backend.before["drain"] = lands_then_times_out
    out = rig.run("prolog", "node")
    backend.failing.clear()
    assert out.enacted.outcome is Outcome.SLURM_UNAVAILABLE and rig.node().is_drained
    assert rig.state()["pending"]["confirmed"] is False
    for name in ("node2", "node3"):  # two drains of ours ranked ahead of it meanwhile
        n = backend.nodes[name]
        backend.nodes[name] = NodeInfo(
            name,
            n.state,
            n.flags | {"DRAIN"},
            "slurm-hooks: gpu.ecc: x -> reboot",
            "root",
            "2026-01-01T00:00:00",
        )
    out = rig.run("health", "node")
    assert out.enacted.outcome is Outcome.BREAKER_UNDONE and not rig.node().is_drained, out.enacted


def test_the_second_hooks_record_keeps_slurms_exact_reason(rig, monkeypatch):
    """The hook that found the drain a moment old must not overwrite the record with its own wording
    (another job's GPUs make another reason text): the health run could not prove the drain then."""
    rig.run("prolog", "node")
    recorded = rig.state()["drained"]

    class SlowLock(nodelock.NodeLock):
        def __enter__(self):
            lock = super().__enter__()
            lock.waited = 0.5
            rig.state_file.write_text(
                json.dumps({"drained": dict(recorded, time=lock.started + 0.1)})
            )
            return lock

    monkeypatch.setattr(nodelock, "NodeLock", SlowLock)
    out = rig.run("prolog", "node-gpu1")
    assert out.enacted.outcome is Outcome.ALREADY_OURS and out.calls == 0
    assert out.decision.reason != recorded["reason"]
    assert rig.state()["drained"]["reason"] == recorded["reason"]
    assert rig.state()["drained"]["reason_time"] == recorded["reason_time"]
    monkeypatch.undo()
    assert rig.run("health", "ok").enacted.outcome is Outcome.RESUMED


def test_observe_mode_does_not_rebuild_lost_state(rig):
    """Observe mode resumes nothing, so a health run with no state file asks Slurm nothing either."""
    out = rig.run("health", "ok", general={"mode": "observe"})
    assert out.enacted is None and out.calls == 0
    out = rig.run("health", "ok")
    assert out.enacted.outcome is Outcome.NOT_DRAINED and out.calls == 1 and rig.state() == {}
