"""qualify/due.py on Slurm's real lines around the repair ladder's own reboot (`scontrol reboot ASAP
nextstate=DOWN`, 22.05; tests/captures/slurm/README.md says how they were taken): DOWN after a
completed reboot of ours is due, a pending or timed-out reboot is not, an admin's DOWN never is."""

from __future__ import annotations

import os
import re

import pytest

from slurm_hooks.qualify import due, rebooted, through_slurm
from slurm_hooks.slurm.node_state import parse_node_line

CAPTURES = os.path.join(os.path.dirname(__file__), "captures", "slurm", "22.05.8")


def capture(name, **changes):
    """The real line; each change replaces one field's value (Reason keeps its [user@time])."""
    with open(os.path.join(CAPTURES, name)) as handle:
        line = handle.read().strip()
    for key, value in changes.items():
        if key == "Reason":
            new, pattern = "Reason=%s [" % value, r"Reason=.*? \["
        else:
            new, pattern = "%s=%s" % (key, value), r"\b%s=\S+" % key
        line = re.sub(pattern, lambda _m, new=new: new, line, count=1)
    return parse_node_line(line)


@pytest.mark.parametrize(
    "name", ["show-node-down-after-reboot.txt", "show-node-down-drain-after-reboot.txt"]
)
def test_down_after_our_completed_reboot_is_due(name):
    node = capture(name)
    ok, why = due.repaired(node, "sh:")
    assert ok, why
    assert why.startswith("down after our reboot for reboot: Slurm's 'reboot complete' at 2026-")
    assert rebooted.down_after_our_reboot(node, "sh:")
    assert [d["node"] for d in due.pick([node], {}, "sh:")[0]] == ["node1"]


def test_a_reboot_still_pending_is_not_due_even_with_a_later_boot_time():
    issued = capture("show-node-reboot-issued.txt", BootTime="2030-01-01T00:00:00")
    ok, why = due.repaired(issued, "sh:")
    assert not ok and why.startswith("down for reboot; its reboot is still pending"), why
    requested = capture(
        "show-node-reboot-issued.txt",
        State="IDLE+DRAIN+REBOOT_REQUESTED",
        BootTime="2030-01-01T00:00:00",
    )
    ok, why = due.repaired(requested, "sh:")
    assert not ok and why.startswith("drained for reboot; its reboot is still pending"), why


def test_a_reboot_that_timed_out_or_a_silent_node_is_waited_for():
    timed_out = capture("show-node-reboot-timed-out.txt")
    ok, why = due.repaired(timed_out, "sh:")
    assert not ok and why.startswith("down for reboot, not after a completed reboot"), why
    silent = capture("show-node-down-after-reboot.txt", State="DOWN+NOT_RESPONDING")
    assert not due.repaired(silent, "sh:")[0]
    assert not rebooted.down_after_our_reboot(silent, "sh:")


@pytest.mark.parametrize(
    "reason",
    [
        "admin: PSU swap -> reboot : reboot issued : reboot complete",  # an admin's, same words
        "sh:gpu.xid g0: gpu:0 Xid 79 -> drain : reboot issued : reboot complete",  # no repair
        "sh:manual: bad riser -> reboot : reboot issued : reboot complete",  # an admin through us
    ],
)
def test_a_down_node_that_is_not_our_repair_is_never_due(reason):
    node = capture("show-node-down-after-reboot.txt", Reason=reason)
    assert node.reason == reason
    assert due.repaired(node, "sh:") == (False, "")
    assert not rebooted.down_after_our_reboot(node, "sh:")
    assert through_slurm.why_not(node, through_slurm.without_our_hold(settings()), "sh:") == "DOWN"


def test_only_our_rebooted_down_node_has_down_lifted_from_the_skip_states():
    held = through_slurm.without_our_hold(settings())["drain"]["skip_states"]
    lifted = through_slurm.without_our_hold(settings(), True)["drain"]["skip_states"]
    assert "DOWN" in held and "MAINTENANCE" not in held
    assert set(held) - set(lifted) == {"DOWN"} and "REBOOT_ISSUED" in lifted


def settings():
    from slurm_hooks.core.config import SECTIONS

    return {s: {k: v.default for k, v in schema.items()} for s, schema in SECTIONS.items()}
