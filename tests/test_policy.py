"""Policy: results -> verdict, drain reasons, etiquette and the circuit breaker (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_hooks.core.config import SECTIONS
from slurm_hooks.result import Action, Blame, Result, Status
from slurm_hooks.slurm import policy

SETTINGS = {
    section: {k: s.default for k, s in schema.items()} for section, schema in SECTIONS.items()
}


def with_drain(**overrides):
    settings = {k: dict(v) for k, v in SETTINGS.items()}
    settings["drain"].update(overrides)
    return settings


def test_only_node_broken_failures_drain():
    ok = Result("a.b", Status.OK, "fine")
    warn = Result("a.w", Status.WARN, "meh")
    job = Result("gpu.leftovers", Status.FAIL, "job asked for 9 GPUs", blame=Blame.JOB)
    unknown = Result("gpu.ecc", Status.UNKNOWN, "function missing")
    assert policy.decide([ok], SETTINGS).verdict is policy.Verdict.PASS
    assert policy.decide([ok, warn], SETTINGS).verdict is policy.Verdict.ALERT
    decision = policy.decide([ok, job, unknown], SETTINGS)
    assert decision.verdict is policy.Verdict.ALERT and decision.blame is Blame.JOB
    assert policy.decide([unknown], SETTINGS).blame is Blame.CHECK
    node = Result(
        "gpu.memory",
        Status.FAIL,
        "row-remap pending",
        component="gpu:3 0000:3b:00.0",
        action=Action.RESET_GPU,
    )
    decision = policy.decide([ok, job, node], SETTINGS)
    assert decision.verdict is policy.Verdict.DRAIN and decision.checks == ("gpu.memory",)
    assert (
        decision.reason
        == "slurm-hooks: gpu.memory: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu"
    )


def test_worst_action_leads_the_reason():
    a = Result("gpu.pcie", Status.FAIL, "link x8", action=Action.DRAIN)
    b = Result("gpu.count", Status.FAIL, "GPU lost", action=Action.REBOOT)
    decision = policy.decide([a, b], SETTINGS)
    assert decision.reason == "slurm-hooks: gpu.count,gpu.pcie: GPU lost -> reboot (+1 more)"


def test_timeouts_alert_unless_configured_to_drain():
    hung = Result(
        "gpu.ecc", Status.UNKNOWN, "did not finish", details={"timed_out": True}, blame=Blame.CHECK
    )
    assert policy.decide([hung], SETTINGS).verdict is policy.Verdict.ALERT
    assert policy.decide([hung], with_drain(on_timeout="drain")).verdict is policy.Verdict.DRAIN


def test_reason_is_sanitized_and_bounded():
    evil = Result("x.y", Status.FAIL, 'bad "thing"\nwith\tnewlines; $(rm -rf /) `id` ' + "z" * 500)
    reason = policy.decide([evil], SETTINGS).reason
    assert (
        len(reason) <= 200
        and "\n" not in reason
        and '"' not in reason
        and "`" not in reason
        and "$" not in reason
    )
    assert reason.endswith("...")


@given(st.text(max_size=400))
def test_sanitize_never_leaks_control_characters(text):
    out = policy.sanitize(text)
    assert all(ch.isprintable() and ch not in "\"'`$\\\n\r\t" for ch in out)


def test_ours_refinable_and_checks_named_in_reason():
    prefix = "slurm-hooks:"
    assert policy.is_ours("slurm-hooks: gpu.ecc: x", prefix)
    assert not policy.is_ours("bad DIMM -- ticket 123", prefix) and not policy.is_ours(None, prefix)
    assert policy.is_refinable("Prolog error") and not policy.is_refinable(
        "Prolog error, see ticket"
    )
    assert policy.read_reason("slurm-hooks: gpu.memory: gpu:3 x -> reset-gpu", prefix).checks == (
        "gpu.memory",
    )
    assert not policy.read_reason("slurm-hooks: garbage", prefix).checks
    assert not policy.read_reason("admin: gpu.memory: x", prefix).checks


@pytest.mark.parametrize(
    "state,flags,expected",
    [
        ("IDLE", set(), None),
        ("IDLE", {"DRAIN"}, None),
        ("DOWN", {"NOT_RESPONDING"}, "DOWN"),
        ("IDLE", {"REBOOT_REQUESTED"}, "REBOOT_REQUESTED"),
        ("IDLE", {"POWERED_DOWN", "CLOUD"}, "CLOUD"),
        ("MIXED", {"MAINTENANCE"}, "MAINTENANCE"),
    ],
)
def test_blocking_state(state, flags, expected):
    assert policy.blocking_state(flags, state, SETTINGS["drain"]["skip_states"]) == expected


def test_breaker_counts_other_nodes_drained_by_us():
    prefix = "slurm-hooks:"
    nodes = [("n%d" % i, False, None) for i in range(100)]
    state = policy.breaker_state(nodes, "n0", prefix, 10.0, 2)
    assert (state.drained_by_us, state.limit, state.tripped) == (0, 10, False)
    nodes[1:10] = [("n%d" % i, True, "slurm-hooks: gpu.ecc: x") for i in range(1, 10)]
    nodes[10] = ("n10", True, "admin: bad PSU")  # not ours: does not count
    assert not policy.breaker_state(nodes, "n0", prefix, 10.0, 2).tripped
    nodes[11] = ("n11", True, "slurm-hooks: gpu.count: lost")
    state = policy.breaker_state(nodes, "n0", prefix, 10.0, 2)
    assert state.tripped and "10 of 100 nodes" in state.describe()
    small = [("a", False, None), ("b", True, "slurm-hooks: x.y: z"), ("c", False, None)]
    assert not policy.breaker_state(small, "a", prefix, 10.0, 2).tripped  # min_nodes floor
    small[2] = ("c", True, "slurm-hooks: x.y: z")
    assert policy.breaker_state(small, "a", prefix, 10.0, 2).tripped
    assert not policy.breaker_state(small, "b", prefix, 10.0, 2).tripped  # self is not counted
