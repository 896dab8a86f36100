"""Lemon nodes (slurm/lemon.py, tracker 27) over simulated weeks: the hooks' own drain/resume flow
(tests/flow_rig.py's rig: Slurm in memory, one check driven by a file), with the history's
clock and the boot id injected, so months pass in a second.
"""

from __future__ import annotations

import json
import time

from slurm_hooks.result import ExitCode
from slurm_hooks.slurm import drainer, lemon
from slurm_hooks.slurm.client import SlurmClient
from slurm_hooks.slurm.drainer import Outcome
from tests import flow_rig

rig = flow_rig.rig  # the fixture: Slurm in memory, one check driven by a file

DAY, START = flow_rig.DAY, flow_rig.START
weeks = flow_rig.weeks  # rig plus a settable clock and boot id
fail_and_repair = flow_rig.fail_and_repair


def test_a_node_drained_three_times_in_thirty_days_is_held_for_rma(weeks):
    config = {"lemon": {"same_fault_after_reboot": False}}
    for day in (0, 12):
        reason, health = fail_and_repair(weeks, day)
        assert "lemon" not in reason and health.enacted.outcome is Outcome.RESUMED, reason
    weeks.at(24)
    out = weeks.run("prolog", "node", **config)
    reason = weeks.node().reason
    assert out.exit_code == ExitCode.NODE_BROKEN and lemon.is_lemon(reason, "sh:"), reason
    assert reason.startswith("sh:demo.gpu g0: gpu:0 lemon: 3rd drain in 30 d;") and reason.endswith(
        "-> rma"
    )
    for day in (25, 40, 90):  # the checks pass every day after: never resumed automatically
        weeks.at(day)
        held = weeks.run("health", "ok", **config)
        assert held.enacted.outcome is Outcome.UNPROVEN and "lemon" in held.enacted.message
        assert weeks.node().is_drained and weeks.node().reason == reason
    history = json.loads((weeks.state_file.parent / "drain-history.json").read_text())
    assert [round((e["time"] - START) / DAY) for e in history] == [0, 12, 24]
    assert history[-1]["lemon"] == "3rd drain in 30 d" and history[0]["boot_id"] == "boot-a"
    # an admin clears it
    done = drainer.resume(
        SlurmClient(weeks.backend), "node1", weeks.config().settings, by_admin=True
    )
    assert done.outcome is Outcome.RESUMED


def test_drains_spread_over_months_never_make_a_lemon(weeks):
    """Twenty weeks, a drain every 20 days: never three within 30 days."""
    outcomes = []
    for day in range(0, 140, 20):
        reason, health = fail_and_repair(weeks, day)
        outcomes.append(health.enacted.outcome)
        assert "lemon" not in reason
    assert outcomes == [Outcome.RESUMED] * 7
    history = json.loads((weeks.state_file.parent / "drain-history.json").read_text())
    assert len(history) == 2  # bounded: only the drains within 30 days are kept


def test_the_same_fault_after_a_reboot_makes_a_lemon_another_gpu_does_not(weeks):
    reason, health = fail_and_repair(weeks, 0, boot="boot-a")
    assert health.enacted.outcome is Outcome.RESUMED
    reason, health = fail_and_repair(weeks, 3, boot="boot-b", what="node-gpu1")  # GPU 1 this time
    assert "lemon" not in reason and health.enacted.outcome is Outcome.RESUMED, reason
    weeks.at(5, boot="boot-c")
    weeks.run("prolog", "node", lemon={"drains": 0})  # GPU 0 again, after two reboots
    reason = weeks.node().reason
    first = time.strftime("%Y-%m-%d", time.gmtime(START))
    assert "lemon: demo.gpu again after a reboot (first %s)" % first in reason, reason
    assert lemon.is_lemon(reason, "sh:")


def test_a_lemon_stays_held_when_the_local_state_is_lost(weeks):
    for day in (0, 1):
        fail_and_repair(weeks, day)
    weeks.at(2)
    weeks.run("prolog", "node")
    assert lemon.is_lemon(weeks.node().reason, "sh:")
    weeks.state_file.unlink()  # a diskless node rebooted, or the file was lost
    out = weeks.run("health", "ok")
    assert out.enacted.outcome is Outcome.UNPROVEN and weeks.node().is_drained, out.enacted


def test_reading_a_lemon_reason():
    assert lemon.is_lemon("sh:gpu.xid g3: gpu:3 x lemon: 3rd drain in 30 d; Xid 79 -> rma", "sh:")
    assert lemon.is_lemon("sh:gpu.xid: lemon: 4th drain in 30 d; y -> rma (+2 more)", "sh:")
    assert not lemon.is_lemon("sh:gpu.xid: row remap failure -> rma", "sh:")  # RMA, not a lemon
    assert not lemon.is_lemon("sh: see ticket lemon: x -> rma", "sh:")  # an admin's
    assert not lemon.is_lemon("sh:gpu.xid: lemon: x -> reboot", "sh:")


def test_a_history_file_from_elsewhere_is_data():
    junk = [{"time": "yesterday", "checks": []}, 5, {"time": START, "checks": "x"}, None]
    assert lemon.clean(junk, 30, START) == [] and lemon.clean({"a": 1}, 30, START) == []


def test_a_history_that_cannot_be_read_is_unknown_and_never_overwritten(weeks, monkeypatch):
    """A drain history that is there but does not answer (a hung or unreadable state directory)
    judges no lemon, climbs no repair rung, and is left as it is: rewriting it from what this run
    knows (nothing) would forget every earlier drain. Before, the drain wrote a one-entry file over
    it, and a hung directory cost [deadline] files twice more per drain (test_hangs.py)."""
    reason, health = fail_and_repair(weeks, 0)
    reason, health = fail_and_repair(weeks, 1)
    history_file = weeks.state_file.parent / "drain-history.json"
    before = history_file.read_text()
    assert len(json.loads(before)) == 2
    monkeypatch.setattr(lemon, "read_history", lambda *args: None)
    weeks.at(2)
    done = weeks.run("prolog", "node")  # a third drain in 30 days, on a history nobody could read
    assert done.exit_code == ExitCode.NODE_BROKEN
    assert "lemon" not in weeks.node().reason  # unknown is not evidence
    assert history_file.read_text() == before
    log = (weeks.state_file.parent.parent / "hooks.log").read_text()
    assert "event=drain-history-not-updated" in log


def test_a_state_directory_others_can_write_is_not_believed(weeks):
    """A user who can write [paths] state_dir (an admin's chmod 777, a typo'd path under a shared
    directory) can delete our drain history or put an older one of ours back: read_ours believes
    each file, since we wrote it. So the whole directory counts as lost (core/dir_trust.py): the
    third drain in 30 days judges no lemon on it, the history is not rewritten, no repair rung is
    climbed, and the hook's log names the directory. Before, the history there was believed."""
    reason, health = fail_and_repair(weeks, 0)
    reason, health = fail_and_repair(weeks, 1)
    state_dir = weeks.state_file.parent
    history_file = state_dir / "drain-history.json"
    before = history_file.read_text()
    state_dir.chmod(0o777)
    weeks.at(2)
    done = weeks.run("prolog", "node")
    assert done.exit_code == ExitCode.NODE_BROKEN and weeks.node().is_drained
    assert "lemon" not in weeks.node().reason, weeks.node().reason
    assert history_file.read_text() == before
    log = (state_dir.parent / "hooks.log").read_text()
    assert "event=state-dir-untrusted" in log and "is writable by others (mode 0777)" in log, log
    weeks.run("health", "ok")
    state_dir.chmod(0o700)  # the admin's fix: believed again; the next drain is the third on record
    weeks.at(3)
    weeks.run("prolog", "node")
    assert lemon.is_lemon(weeks.node().reason, "sh:"), weeks.node().reason
