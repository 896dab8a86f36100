"""Drain etiquette, the breaker, ownership and resume, against an in-memory slurmctld
(tests/doubles/memory_slurm.py, which says where it follows node_mgr.c). The same flows run against the
real slurmctld in tests/test_e2e_slurm.py, tests/test_drain_slurm.py and tests/test_breaker_concurrency.py.
"""

from __future__ import annotations

import time

import pytest

from slurm_hooks.slurm import drainer, nodelock
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.drainer import UNDONE_REASON, Outcome
from slurm_hooks.slurm.errors import SlurmClientMissing
from slurm_hooks.slurm.node_state import NodeInfo
from tests.doubles.memory_slurm import REASON, T0, MemoryBackend, cluster, settings, stamp

OTHER = "slurm-hooks: gpu.ecc: GPU 1 DBE -> reset-gpu"


def drained(backend):
    return sorted(n for n, node in backend.nodes.items() if node.is_drained)


# ------------------------------------------------------------------------------------------------
# the drain and its etiquette


def test_drain_sets_our_reason_in_four_calls_and_waits_for_the_controllers_clock():
    backend = cluster()
    client = SlurmClient(backend)
    enacted = drainer.drain(client, "node1", REASON, settings())
    assert enacted.outcome is Outcome.DRAINED and enacted.node_drained and enacted.confirmed
    assert backend.nodes["node1"].reason == REASON and backend.nodes["node1"].is_drained
    assert backend.log == ["show", "list", "drain", "list"] and client.calls == 4
    # the re-count ran after the controller's clock passed the second of our drain
    assert int(backend.clock) > int(T0 + 0.25) and enacted.node.reason_time == stamp(T0 + 0.25)
    assert enacted.breaker.phase == "rank" and enacted.breaker.drained_by_us == 0


def test_existing_drains():
    cases = [
        ("bad PSU, ticket 4711", None, True, Outcome.FOREIGN_DRAIN, True),
        (
            "slurm-hooks: manual: fan 3",
            None,
            True,
            Outcome.FOREIGN_DRAIN,
            True,
        ),  # an admin's, through our verb
        (OTHER, "recorded", True, Outcome.ALREADY_OURS, True),
        (
            OTHER,
            None,
            False,
            Outcome.ALREADY_OURS,
            True,
        ),  # local state lost: our automatic reason is ours
        (
            OTHER,
            None,
            True,
            Outcome.FOREIGN_DRAIN,
            True,
        ),  # state known, no record: prefix alone proves nothing
        (OTHER, "other-time", True, Outcome.FOREIGN_DRAIN, True),  # same text, another drain
        ("Prolog error", None, True, Outcome.REFINED, False),
    ]
    for reason, record, known, outcome, kept in cases:
        backend = cluster()
        backend.admin_drain("node1", reason)
        recorded = []
        if record == "recorded":
            recorded = [{"reason": reason, "reason_time": backend.nodes["node1"].reason_time}]
        elif record == "other-time":
            recorded = [{"reason": reason, "reason_time": "2026-01-01T00:00:00"}]
        enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(), recorded, known)
        assert (enacted.outcome, enacted.node_drained) == (outcome, True), (
            reason,
            record,
            known,
            enacted,
        )
        assert (backend.nodes["node1"].reason == reason) is kept, (reason, backend.nodes["node1"])


@pytest.mark.parametrize(
    "state,flags,word",
    [
        ("DOWN", {"NOT_RESPONDING"}, "DOWN"),
        ("IDLE", {"MAINTENANCE", "RESERVED"}, "MAINTENANCE"),  # in a MAINT reservation
        ("IDLE", {"FAIL"}, "FAIL"),  # an admin's State=FAIL: someone else's
        (
            "IDLE",
            {"EXTERNAL"},
            "EXTERNAL",
        ),  # 26.05: a node without slurmd; not in skip_states, but not ours
        ("IDLE", {"FROBNICATED"}, "FROBNICATED"),  # a state word we do not know
    ],
)
def test_states_we_do_not_handle_are_left_alone(state, flags, word):
    backend = cluster()
    backend.nodes["node1"] = NodeInfo(
        "node1", state, frozenset(flags), "admin: work" if "FAIL" in flags else None
    )
    enacted = drainer.drain(
        SlurmClient(backend),
        "node1",
        REASON,
        settings(drain={"skip_states": ["DOWN", "MAINTENANCE"]}),
    )
    assert enacted.outcome is Outcome.SKIPPED_STATE and word in enacted.message, enacted
    assert (
        not enacted.node_drained
        and not backend.nodes["node1"].is_drained
        and backend.log == ["show"]
    )


def test_breaker_stops_mass_drains():
    backend = cluster()
    for i in (2, 3):
        backend.admin_drain("node%d" % i, "slurm-hooks: gpu.x: y")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert (
        enacted.outcome is Outcome.BREAKER
        and enacted.breaker.drained_by_us == 2
        and not enacted.node_drained
    )
    assert not backend.nodes["node1"].is_drained and backend.log == ["show", "list"]
    enacted = drainer.drain(
        SlurmClient(backend), "node1", REASON, settings(breaker={"min_nodes": 3})
    )
    assert enacted.outcome is Outcome.DRAINED


def test_manual_drains_and_foreign_drains_do_not_count_for_the_breaker():
    backend = cluster()
    backend.admin_drain("node2", "slurm-hooks: manual: BIOS update")
    backend.admin_drain("node3", "bad PSU")
    backend.admin_drain("node4", "slurm-hooks: garbage without a check name")
    assert (
        drainer.drain(SlurmClient(backend), "node1", REASON, settings()).outcome is Outcome.DRAINED
    )


def test_breaker_cannot_count_means_no_drain():
    backend = cluster()
    backend.failing.add("list")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert enacted.outcome is Outcome.CANNOT_COUNT and not enacted.node_drained
    assert "cannot count" in enacted.message and not backend.nodes["node1"].is_drained


def test_admin_drain_between_our_read_and_our_drain_is_kept():
    """The node list is our re-read right before draining: an admin drain that landed after our first
    read is seen there and kept (before: show -> list -> drain overwrote it 14 ms later)."""
    backend = cluster()
    backend.before["list"] = lambda: backend.admin_drain("node1", "admin: reseat GPU 3")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert (
        enacted.outcome is Outcome.FOREIGN_DRAIN
        and backend.nodes["node1"].reason == "admin: reseat GPU 3"
    )
    assert "drain" not in backend.log


def test_observe_mode_makes_no_call():
    backend = cluster()
    client = SlurmClient(backend)
    enacted = drainer.drain(client, "node1", REASON, settings(general={"mode": "observe"}))
    assert (
        enacted.outcome is Outcome.OBSERVE
        and client.calls == 0
        and not backend.nodes["node1"].is_drained
    )


def test_slurm_down_is_an_outcome_not_a_crash():
    backend = cluster()
    backend.down = True
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert (
        enacted.outcome is Outcome.SLURM_UNAVAILABLE and "slurmctld unreachable" in enacted.message
    )
    assert not enacted.node_drained
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), by_admin=True).outcome
        is Outcome.SLURM_UNAVAILABLE
    )


def test_missing_client_is_not_called_an_unreachable_controller():
    class NoScontrol(MemoryBackend):
        def show_node(self, name):
            raise SlurmClientMissing(
                "cannot run scontrol: [Errno 2] No such file or directory: 'scontrol'"
            )

    for call in (
        lambda c: drainer.drain(c, "node1", REASON, settings()),
        lambda c: drainer.resume(c, "node1", settings(), by_admin=True),
    ):
        enacted = call(SlurmClient(NoScontrol([])))
        assert enacted.outcome is Outcome.SLURM_UNAVAILABLE
        assert (
            enacted.message.startswith("Slurm client unusable: cannot run scontrol")
            and "slurmctld" not in enacted.message
        )


# ------------------------------------------------------------------------------------------------
# the breaker under concurrency: rank by (reason time, node name), undo past the limit


def test_drains_ranked_past_the_limit_undo_themselves():
    backend = cluster()

    def two_others_drain_first():
        backend.clock -= 0.2  # they were served before ours, in the same second
        backend.admin_drain("node5", OTHER)
        backend.admin_drain("node6", OTHER)
        backend.clock += 0.2

    backend.before["settle"] = two_others_drain_first  # they happened while we waited
    backend.clock = T0 + 0.5
    enacted = drainer.drain(SlurmClient(backend), "node4", REASON, settings())
    # node4, node5, node6 share a second: node4 sorts first and keeps its drain
    assert enacted.outcome is Outcome.DRAINED and enacted.breaker.drained_by_us == 0, enacted
    backend = cluster()
    backend.admin_drain("node2", OTHER)
    backend.clock += 1
    backend.before["drain"] = lambda: backend.admin_drain(
        "node3", OTHER
    )  # same second as ours, smaller name
    enacted = drainer.drain(SlurmClient(backend), "node7", REASON, settings())
    assert enacted.outcome is Outcome.BREAKER_UNDONE and not enacted.node_drained, enacted
    assert enacted.breaker.drained_by_us == 2 and "undone" in enacted.message
    assert backend.nodes["node7"].is_drained is False and backend.log[-1] == "resume"
    assert drained(backend) == ["node2", "node3"]


def test_a_later_drain_in_the_same_second_with_a_smaller_name_is_counted():
    """The tie problem: node 'n2' drains at second S; 'n1' drains later in the same second S and sorts
    ahead of n2. n2's re-count waits until the controller's clock has passed S, so it sees n1."""
    backend = MemoryBackend([NodeInfo("n%d" % i, "IDLE") for i in range(1, 10)])
    backend.admin_drain("n9", OTHER)  # one drain of ours already there (limit 2)
    backend.clock += 1.0
    seen = {}

    def n1_drains_in_our_second():
        assert int(backend.clock) == int(T0 + 1.25), (
            "the settle wait must start within our drain's second"
        )
        backend.clock += 0.5
        backend.admin_drain("n1", OTHER)
        seen["n1"] = backend.nodes["n1"].reason_time

    backend.before["settle"] = n1_drains_in_our_second
    enacted = drainer.drain(SlurmClient(backend), "n2", REASON, settings())
    assert seen["n1"] == enacted.node.reason_time  # same second: ranked by name, n1 first
    assert enacted.outcome is Outcome.BREAKER_UNDONE and enacted.breaker.drained_by_us == 2, enacted
    assert drained(backend) == ["n1", "n9"]


def test_undo_only_when_the_reason_is_still_exactly_ours():
    """An admin re-drains our node while we wait for the re-count: the drain is theirs now; even
    ranked past the limit, it is not ours to undo."""
    backend = cluster()
    backend.before["settle"] = lambda: backend.admin_drain("node1", "admin: keep this node out")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert enacted.outcome is Outcome.FOREIGN_DRAIN and enacted.node_drained
    assert (
        backend.nodes["node1"].reason == "admin: keep this node out" and "resume" not in backend.log
    )


def test_refined_drain_past_the_limit_gets_slurms_reason_back():
    backend = cluster()
    backend.ctld_drain("node9", "Prolog error")
    backend.clock += 1
    backend.before["drain"] = lambda: [backend.admin_drain(n, OTHER) for n in ("node2", "node3")]
    enacted = drainer.drain(SlurmClient(backend), "node9", REASON, settings())
    assert enacted.outcome is Outcome.BREAKER_UNDONE and enacted.node_drained, enacted
    assert backend.nodes["node9"].reason == "Prolog error" and backend.nodes["node9"].is_drained
    assert "put back" in enacted.message


def _after_recount(client, action):
    """Run `action` once slurmctld answered the breaker's re-count (the second node listing)."""
    lists = []

    def hook(op):
        if op[0] == "list_nodes":
            lists.append(op)
            if len(lists) == 2:
                action()

    client.after_request = hook


def test_an_admin_drain_after_the_recount_is_not_undone_on_a_refined_drain_either():
    """Tracker 24: the undo of a refined "Prolog error" drain puts Slurm's reason back with a DRAIN
    request; an admin who drained the node after the re-count must keep their reason."""
    backend = cluster()
    backend.ctld_drain("node9", "Prolog error")
    backend.clock += 1
    backend.before["drain"] = lambda: [backend.admin_drain(n, OTHER) for n in ("node2", "node3")]
    client = SlurmClient(backend)
    _after_recount(client, lambda: backend.admin_drain("node9", "admin: reseat GPU 3"))
    enacted = drainer.drain(client, "node9", REASON, settings())
    assert enacted.outcome is Outcome.FOREIGN_DRAIN and enacted.node_drained, enacted
    assert backend.nodes["node9"].reason == "admin: reseat GPU 3"
    assert [op[0] for op in client.ops][-1] == "show_node", client.ops


def test_a_failed_read_before_the_undo_leaves_the_drain_unconfirmed():
    backend = cluster()
    backend.before["drain"] = lambda: [backend.admin_drain(n, OTHER) for n in ("node2", "node3")]
    client = SlurmClient(backend)
    _after_recount(client, lambda: backend.failing.add("show"))
    enacted = drainer.drain(client, "node9", REASON, settings())  # node9 ranks after node2, node3
    assert enacted.outcome is Outcome.DRAINED and not enacted.confirmed, enacted
    assert backend.nodes["node9"].is_drained and "resume" not in backend.log


def test_recount_failure_leaves_an_unconfirmed_drain_that_the_next_run_confirms():
    backend = cluster()
    client = SlurmClient(backend)
    backend.before["drain"] = lambda: backend.failing.add("list")
    enacted = drainer.drain(client, "node1", REASON, settings())
    assert enacted.outcome is Outcome.DRAINED and enacted.node_drained and not enacted.confirmed
    assert "re-count failed" in enacted.message
    backend.failing.clear()
    for name in (
        "node2",
        "node3",
    ):  # meanwhile two earlier drains show up (e.g. slurmctld was slow)
        n = backend.nodes[name]
        backend.nodes[name] = NodeInfo(
            name, n.state, n.flags | {"DRAIN"}, OTHER, "root", stamp(T0 - 1)
        )
    record = {
        "reason": REASON,
        "reason_time": backend.nodes["node1"].reason_time,
        "confirmed": False,
    }
    again = drainer.drain(SlurmClient(backend), "node1", REASON, settings(), [record])
    assert again.outcome is Outcome.BREAKER_UNDONE and not backend.nodes["node1"].is_drained
    record["confirmed"] = True  # a confirmed drain is not re-ranked
    backend.admin_drain("node1", REASON)
    record["reason_time"] = backend.nodes["node1"].reason_time
    assert (
        drainer.drain(SlurmClient(backend), "node1", REASON, settings(), [record]).outcome
        is Outcome.ALREADY_OURS
    )


# ------------------------------------------------------------------------------------------------
# resume: only on proof, only what is provably ours


def test_resume_only_the_exact_drain_we_recorded():
    backend = cluster()
    backend.admin_drain("node1", REASON)
    record = {
        "reason": REASON,
        "reason_time": backend.nodes["node1"].reason_time,
        "checks": ["gpu.memory"],
    }
    wrong_time = dict(record, reason_time="2026-01-01T00:00:00")
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), expected=wrong_time).outcome
        is Outcome.NOT_OURS
    )
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings()).outcome is Outcome.NOT_OURS
    )  # no proof
    assert backend.nodes["node1"].is_drained
    enacted = drainer.resume(SlurmClient(backend), "node1", settings(), expected=record)
    assert enacted.outcome is Outcome.RESUMED and not backend.nodes["node1"].is_drained
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), expected=record).outcome
        is Outcome.NOT_DRAINED
    )


def test_admin_resume_verb_rules():
    backend = cluster()
    backend.admin_drain("node1", "admin: reseat GPU 3")
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), by_admin=True).outcome
        is Outcome.NOT_OURS
    )
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), by_admin=True, force=True).outcome
        is Outcome.RESUMED
    )
    for reason in (REASON, "slurm-hooks: manual: fan"):
        backend.admin_drain("node1", reason)
        assert (
            drainer.resume(SlurmClient(backend), "node1", settings(), by_admin=True).outcome
            is Outcome.RESUMED
        )
    backend.admin_drain("node1", "admin: rack power", flag="FAIL")
    enacted = drainer.resume(SlurmClient(backend), "node1", settings(), by_admin=True)
    assert enacted.outcome is Outcome.NOT_DRAINED and backend.nodes["node1"].is_failed


def test_an_admins_fail_is_someone_elses():
    backend = cluster()
    backend.admin_drain("node1", REASON)  # ours...
    record = {
        "reason": REASON,
        "reason_time": backend.nodes["node1"].reason_time,
        "checks": ["gpu.memory"],
    }
    backend.nodes["node1"] = NodeInfo(
        "node1", "IDLE", frozenset({"DRAIN", "FAIL"}), REASON, "root", record["reason_time"]
    )  # ...then FAILed by an admin keeping the text
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), expected=record).outcome
        is Outcome.NOT_OURS
    )
    backend.nodes["node1"] = NodeInfo(
        "node1", "IDLE", frozenset({"FAIL"}), "admin: dying DIMM", "root", stamp(backend.clock)
    )
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert (
        enacted.outcome is Outcome.SKIPPED_STATE
        and backend.nodes["node1"].reason == "admin: dying DIMM"
    )


def test_our_resume_leaves_no_reason_of_ours_where_slurm_keeps_it():
    """24.11/25.11 with accounting_storage/none keep the Reason after RESUME until the node's next job.
    We send a reason that is not ours with the RESUME, so when slurmctld later drains the node itself
    and keeps the old text, it is not mistaken for one of our drains."""
    backend = cluster(keep_reason_on_resume=True)
    backend.admin_drain("node1", REASON)
    record = {
        "reason": REASON,
        "reason_time": backend.nodes["node1"].reason_time,
        "checks": ["gpu.memory"],
    }
    assert (
        drainer.resume(SlurmClient(backend), "node1", settings(), expected=record).outcome
        is Outcome.RESUMED
    )
    kept = backend.nodes["node1"].reason
    assert (
        kept == "resumed by slurm-hooks: gpu.memory passed"
        and not backend.nodes["node1"].is_drained
    )
    backend.ctld_drain("node1", "Kill task failed")
    assert backend.nodes["node1"].reason == kept  # Slurm kept the old text
    for name in ("node2",):
        backend.admin_drain(name, OTHER)
    # not counted as ours by anyone's breaker, never resumed by us
    state = drainer.policy.breaker_state(
        ((n.name, n.is_drained, n.reason) for n in backend.nodes.values()),
        "node2",
        "slurm-hooks:",
        10.0,
        2,
    )
    assert state.drained_by_us == 0
    assert (
        drainer.drain(SlurmClient(backend), "node1", REASON, settings(), (), False).outcome
        is Outcome.FOREIGN_DRAIN
    )


def test_breaker_undo_leaves_no_reason_of_ours_behind():
    backend = cluster(keep_reason_on_resume=True)
    for name in ("node2", "node3"):
        backend.admin_drain(name, OTHER)
    backend.clock += 2
    backend.before["settle"] = lambda: backend.admin_drain(
        "node4", OTHER
    )  # same second, sorts before node9
    enacted = drainer.drain(
        SlurmClient(backend), "node9", REASON, settings(breaker={"min_nodes": 3})
    )
    assert enacted.outcome is Outcome.BREAKER_UNDONE and enacted.breaker.drained_by_us == 3
    assert backend.nodes["node9"].reason == UNDONE_REASON and not backend.nodes["node9"].is_drained


def test_resume_race_with_someone_elses_resume():
    backend = cluster()
    backend.admin_drain("node1", REASON)
    record = {
        "reason": REASON,
        "reason_time": backend.nodes["node1"].reason_time,
        "checks": ["gpu.memory"],
    }
    backend.before["resume"] = lambda: backend.admin_resume("node1")
    enacted = drainer.resume(SlurmClient(backend), "node1", settings(), expected=record)
    assert enacted.outcome is Outcome.NOT_DRAINED and "no longer drained" in enacted.message


# ------------------------------------------------------------------------------------------------
# the admin verb's drain


def test_manual_drain_goes_through_the_etiquette_and_not_the_breaker():
    backend = cluster()
    for i in (2, 3, 4):
        backend.admin_drain(
            "node%d" % i, OTHER
        )  # the breaker would trip: an admin's act is not stopped
    enacted = drainer.drain_manual(SlurmClient(backend), "node1", "fan 3 at 0 rpm", settings())
    assert (
        enacted.outcome is Outcome.DRAINED
        and backend.nodes["node1"].reason == "sh:manual: fan 3 at 0 rpm"
    )
    backend.admin_drain("node5", "admin: rack 7")
    assert (
        drainer.drain_manual(SlurmClient(backend), "node5", "x", settings()).outcome
        is Outcome.FOREIGN_DRAIN
    )
    assert (
        drainer.drain_manual(SlurmClient(backend), "node5", "x", settings(), force=True).outcome
        is Outcome.DRAINED
    )
    backend.nodes["node6"] = NodeInfo("node6", "IDLE", frozenset({"MAINTENANCE", "RESERVED"}))
    enacted = drainer.drain_manual(SlurmClient(backend), "node6", "x", settings())
    assert enacted.outcome is Outcome.SKIPPED_STATE and not backend.nodes["node6"].is_drained
    # one of our automatic drains becomes the admin's (and is then never resumed automatically)
    enacted = drainer.drain_manual(SlurmClient(backend), "node2", "keep out: RMA", settings())
    assert (
        enacted.outcome is Outcome.DRAINED
        and backend.nodes["node2"].reason == "sh:manual: keep out: RMA"
    )
    long = drainer.drain_manual(SlurmClient(backend), "node7", "x" * 1000, settings())
    assert long.outcome is Outcome.DRAINED and len(backend.nodes["node7"].reason) <= 200


# ------------------------------------------------------------------------------------------------
# the node lock


def test_node_lock_serialises_and_is_bounded(tmp_path):
    import fcntl

    first = nodelock.NodeLock(str(tmp_path), "node1", 1.0)
    with first:
        assert first.acquired
        assert fcntl.fcntl(first.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # no command inherits it
        start = time.monotonic()
        with nodelock.NodeLock(str(tmp_path), "node1", 0.3) as second:
            assert not second.acquired and 0.25 < time.monotonic() - start < 2.0
            assert "still held" in second.error
        with nodelock.NodeLock(str(tmp_path), "node2", 0.3) as other:
            assert other.acquired  # another node name is another lock
    with nodelock.NodeLock(str(tmp_path), "node1", 0.3) as third:
        assert third.acquired


def test_node_lock_excludes_other_processes_and_leaves_no_file(tmp_path):
    """Eight processes of one node take the lock at once: no two inside at the same time (each one's
    read-modify-write of a counter survives), and the lock file is gone afterwards."""
    import os

    counter = tmp_path / "counter"
    counter.write_text("0")
    children = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with nodelock.NodeLock(str(tmp_path), "node1", 10.0) as lock:
                    if lock.acquired:
                        value = int(counter.read_text())
                        time.sleep(0.02)
                        counter.write_text(str(value + 1))
                        code = 0
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0] * 8 and counter.read_text() == "8"
    name = nodelock.NodeLock(str(tmp_path), "node1", 1.0).name
    assert not any(
        os.path.exists(os.path.join(d, name)) for d in (nodelock.LOCK_DIR, str(tmp_path))
    )


def test_the_lock_goes_to_run_unless_the_environment_names_another_directory(tmp_path, monkeypatch):
    """As installed: /run/slurm-hooks, then state_dir. $SLURM_HOOKS_LOCK_DIR names another directory
    for the first; "off" (or empty, or a relative path) leaves state_dir alone."""
    import os

    state = str(tmp_path / "state")
    monkeypatch.delenv(nodelock.LOCK_DIR_ENV, raising=False)
    assert nodelock.NodeLock(state, "node1", 1.0).dirs == ("/run/slurm-hooks", state)
    run = str(tmp_path / "run")
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, run)
    with nodelock.NodeLock(state, "node1", 1.0) as lock:
        assert lock.acquired and os.path.dirname(lock.path) == run
    for value in ("off", "", "relative/dir"):
        monkeypatch.setenv(nodelock.LOCK_DIR_ENV, value)
        with nodelock.NodeLock(state, "node1", 1.0) as lock:
            assert lock.dirs == (state,)
            assert lock.acquired and os.path.dirname(lock.path) == state


def test_the_suite_and_the_hooks_it_starts_lock_outside_the_hosts_run(tmp_path):
    """The suite runs as root: a node lock it takes, in this process or in a hook it starts (which
    inherits this environment), goes to the test's state_dir, never to the host's /run/slurm-hooks,
    which the drain tests used to leave behind (tests/conftest.py turns it off)."""
    import subprocess
    import sys

    with nodelock.NodeLock(str(tmp_path), "node1", 1.0) as lock:
        assert lock.acquired and lock.path.startswith(str(tmp_path) + "/")
    code = (
        "import sys\n"
        "from slurm_hooks.slurm import nodelock\n"
        "with nodelock.NodeLock(sys.argv[1], 'node1', 1.0) as lock:\n"
        "    print(lock.acquired, lock.path)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(tmp_path / lock.name)]


@pytest.mark.parametrize("mode", [0o1777, 0o777])
def test_a_lock_directory_others_can_write_is_passed_over(tmp_path, monkeypatch, mode):
    """$SLURM_HOOKS_LOCK_DIR=/tmp (a typo, or /tmp on purpose): the lock's name is predictable, so a
    user there could create and hold it first (every drain waits out its bound and goes on unlocked,
    two at once) or, in a 0777 directory, unlink it under its holder. Such a directory is passed
    over for state_dir (red team, 2026-12-04: the user's flock held root's hooks off)."""
    import fcntl
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), mode)
    state = str(tmp_path / "state")
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, str(shared))
    name = nodelock.NodeLock(state, "node1", 1.0).name
    planted = os.open(str(shared / name), os.O_RDWR | os.O_CREAT, 0o666)
    os.fchown(planted, 65534, 65534)  # nobody's, held by nobody
    fcntl.flock(planted, fcntl.LOCK_EX)
    try:
        with nodelock.NodeLock(state, "node1", 0.5) as lock:
            assert lock.acquired and os.path.dirname(lock.path) == state, lock.error
            assert lock.waited < 0.4
    finally:
        os.close(planted)


@pytest.mark.parametrize("planted", ["another user's file", "a hard link", "a directory"])
def test_a_lock_file_that_is_not_ours_alone_is_not_taken(tmp_path, monkeypatch, planted):
    """In a directory we trust the lock file is opened only if it is a regular file of ours with one
    link: a hard link to some other file (protected_hardlinks=0) or a file another user made is
    passed over, and with no directory left the hook goes on without the lock, saying why."""
    import os

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, "off")
    path = state / nodelock.NodeLock(str(state), "node1", 1.0).name
    if planted == "another user's file":
        path.write_text("")
        os.chown(str(path), 65534, 65534)
    elif planted == "a hard link":
        (tmp_path / "precious").write_text("keep")
        os.link(str(tmp_path / "precious"), str(path))
    else:
        path.mkdir()
    with nodelock.NodeLock(str(state), "node1", 0.3) as lock:
        assert not lock.acquired and lock.fd == -1
        assert str(state) in lock.error, lock.error
    assert (tmp_path / "precious").read_text() == "keep" if planted == "a hard link" else True


def test_a_long_summary_never_crashes_the_drain():
    """max_reason_length above what the client takes (a config the loader should refuse, or an older
    one) with a 2000-character summary: the reason is cut to 512, the drain happens."""
    from slurm_hooks.result import Action, Result, Status
    from slurm_hooks.slurm import policy

    s = settings(drain={"max_reason_length": 5000})
    decision = policy.decide([Result("gpu.xid", Status.FAIL, "x" * 2000, action=Action.REBOOT)], s)
    assert len(decision.reason) <= 512 and decision.reason.endswith("-> reboot")
    backend = cluster()
    enacted = drainer.drain(SlurmClient(backend), "node1", decision.reason, s)
    assert enacted.outcome is Outcome.DRAINED and len(backend.nodes["node1"].reason) <= 512
    enacted = drainer.drain(SlurmClient(cluster()), "node1", "slurm-hooks: gpu.x: " + "y" * 900, s)
    assert enacted.outcome is Outcome.DRAINED
    manual = drainer.drain_manual(SlurmClient(cluster()), "node1", "z" * 900, s)
    assert manual.outcome is Outcome.DRAINED


@pytest.fixture
def lock_state(tmp_path, monkeypatch):
    """A state directory of root's alone, the lock kept there ($SLURM_HOOKS_LOCK_DIR off)."""

    monkeypatch.setenv(nodelock.LOCK_DIR_ENV, "off")
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return str(path)


def test_a_lock_file_its_holder_removes_as_it_is_opened_is_looked_for_again(
    lock_state, monkeypatch
):
    """The holder's __exit__ removes the file between the opener's open and fstat (no link left):
    the waiter looks again and takes a new file. It gave up at once and drained unlocked, while a
    third hook could hold the new file (red team, stop 35: 2-8 early give-ups in 720 rounds)."""
    import os

    marker = os.path.join(lock_state, "unlink-once")
    open(marker, "w").close()
    real_open = os.open

    def open_then_the_holder_removes_it(path, flags, mode=0o777, **kwargs):
        fd = real_open(path, flags, mode, **kwargs)
        if str(path).endswith(".lock") and os.path.exists(marker):
            os.unlink(marker)
            os.unlink(path)  # the holder releasing at this very moment
        return fd

    monkeypatch.setattr(nodelock.os, "open", open_then_the_holder_removes_it)
    with nodelock.NodeLock(lock_state, "node1", 2.0) as lock:
        assert lock.acquired, lock.error
    assert not os.path.exists(marker)  # the removal did happen under the opener


def test_a_lock_directory_whose_name_is_not_utf8_still_locks(tmp_path, monkeypatch):
    """$SLURM_HOOKS_LOCK_DIR is bytes in slurmd's environment: the opener's path comes back as the
    file system has it, not with '?' for each byte that is not UTF-8 (then the lock waited out its
    bound and left its file behind; red team, stop 35)."""
    import os

    weird = os.path.join(os.fsencode(str(tmp_path)), b"locks-\xe9")
    monkeypatch.setitem(os.environb, os.fsencode(nodelock.LOCK_DIR_ENV), weird)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with nodelock.NodeLock(str(state), "node1", 0.5) as lock:
        assert lock.acquired and os.fsencode(lock.path).startswith(weird + b"/"), lock.error
    assert os.listdir(weird) == []  # removed by its holder


def test_no_descriptor_left_for_the_opener_goes_on_unlocked_not_raising(lock_state, monkeypatch):
    """socketpair refused (EMFILE): the hook goes on without the lock, saying why, as when the fork
    is refused; it raised out of __enter__ and the draining hook failed open (red team, stop 35)."""
    import errno
    import socket

    def no_descriptors(*_args, **_kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(socket, "socketpair", no_descriptors)
    with nodelock.NodeLock(lock_state, "node1", 0.3) as lock:
        assert not lock.acquired and "Too many open files" in lock.error


def test_a_lock_directory_on_a_network_file_system_is_passed_over(lock_state, monkeypatch):
    """The lock is held while the hook talks to Slurm; on NFS a server that stops answering then
    would hang its flock, unlink or close, which nothing can bound (the descriptor is the hook's).
    A directory on a network file system is passed over: no lock, said why (red team, stop 35)."""
    monkeypatch.setattr(nodelock, "mount_type", lambda path, mounts=None: "nfs4")
    with nodelock.NodeLock(lock_state, "node1", 0.3) as lock:
        assert not lock.acquired and "on a nfs4 file system" in lock.error


# /proc/self/mounts as the kernel writes it (proc(5): device, mount point, type, options, 0 0) for
# the kinds of mount a node has: the root, tmpfs /run, an NFS home, a Lustre scratch, an sshfs
# (FUSE) state directory, a mount point with a space (written \\040), one mounted over another
MOUNTS = """\
/dev/root /mnt/parent ext3 rw,noatime 0 0
/dev/sda2 / xfs rw,attr2,inode64 0 0
tmpfs /run tmpfs rw,nosuid,nodev,size=26G,mode=755 0 0
fs1:/export/home /home nfs4 rw,vers=4.2,hard,proto=tcp 0 0
10.0.0.1@o2ib:/scratch /scratch lustre rw,flock 0 0
admin@fs2:/hooks /var/lib/slurm-hooks fuse.sshfs rw,user_id=0 0 0
/dev/sda3 /data\\040disk ext4 rw 0 0
/dev/sdb1 /mnt/parent ext4 rw 0 0
"""


@pytest.mark.parametrize(
    "path, kind, network",
    [
        ("/run/slurm-hooks", "tmpfs", False),
        ("/var/lib/slurm-hooks", "fuse.sshfs", True),
        ("/var/lib/slurm-hooks-other", "xfs", False),  # a prefix of the name is not the mount
        ("/home/alice/state", "nfs4", True),
        ("/scratch", "lustre", True),
        ("/mnt/parent/x", "ext4", False),  # the later mount over the same point
        ("/data disk/state", "ext4", False),
        ("/etc", "xfs", False),
    ],
)
def test_the_lock_directorys_file_system_is_read_from_the_mount_table(path, kind, network):
    assert nodelock.mount_type(path, MOUNTS) == kind
    assert nodelock.is_network_fs(kind) is network
