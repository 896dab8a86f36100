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
    assert decision.reason == "sh:gpu.memory g3: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu"


def test_worst_action_leads_the_reason():
    a = Result("gpu.pcie", Status.FAIL, "link x8", action=Action.DRAIN)
    b = Result("gpu.count", Status.FAIL, "GPU lost", action=Action.REBOOT)
    decision = policy.decide([a, b], SETTINGS)
    assert decision.reason == "sh:gpu.count +gpu.pcie: GPU lost -> reboot (+1 more)"


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


# Tracker 25, "Drains you can read": what `sinfo -R` shows (20 characters) says what broke, and
# ownership stays exact, for today's format and the one the release before wrote.
OWNERSHIP = [
    # today's format
    (
        "sh:gpu.remap g3 +gpu.ecc: gpu:3 x -> reset-gpu (+1 more)",
        "auto",
        ("gpu.remap", "gpu.ecc"),
        3,
    ),
    ("sh:system.processes: a root process hogs 4 CPUs", "auto", ("system.processes",), None),
    ("sh:gpu.count g0 +gpu.ecc,+4: x", "auto", ("gpu.count", "gpu.ecc"), 0),
    ("sh:fleet.straggler: throttle 0.2 vs 0 -> drain", "auto", ("fleet.straggler",), None),
    ("sh:manual: BIOS update, ticket 4711", "manual", (), None),
    # the release before (slurm-hooks 'slurm-hooks: <names>: ...'): still ours after an upgrade
    (
        "slurm-hooks: gpu.count,gpu.ecc: gpu:1 GPU 1 lost -> reboot",
        "auto",
        ("gpu.count", "gpu.ecc"),
        None,
    ),
    ("slurm-hooks: gpu.count,+3: x", "auto", ("gpu.count",), None),
    ("slurm-hooks: manual: fan 3", "manual", (), None),
    ("slurm-hooks: fleet.straggler: x -> drain", "auto", ("fleet.straggler",), None),
    # admins' reasons, some that start like ours: never ours
    ("sh: see ticket 42: GPU fans", "", (), None),
    ("sh:", "", (), None),
    ("sh:gpu.count", "", (), None),  # no ':' after the head
    ("sh:gpu.count g3 gpu.ecc: x", "", (), None),  # a third token we never write
    ("sh:gpu.count  g3: x", "", (), None),  # two spaces
    ("sh:GPU.count g3: x", "", (), None),
    ("sh:+5: x", "", (), None),
    ("sh:gpu.count gpu3: x", "", (), None),
    ("sh:manual : x", "", (), None),
    ("ssh:gpu.count g3: x", "", (), None),
    (" sh:gpu.count g3: x", "", (), None),
    ("slurm-hooks: garbage", "", (), None),
    ("slurm-hooksgpu.count: x", "", (), None),
    ("admin: gpu.memory: x", "", (), None),
    ("Prolog error", "", (), None),
    ("", "", (), None),
]


@pytest.mark.parametrize("reason,kind,checks,gpu", OWNERSHIP)
def test_reason_ownership_is_exact(reason, kind, checks, gpu):
    owner = policy.read_reason(reason, "sh:")
    assert (owner.kind, owner.checks, owner.gpu) == (kind, checks, gpu)
    assert policy.is_ours(reason, "sh:") is bool(kind)


@pytest.mark.parametrize(
    "check",
    ["gpu.remap", "gpu.leftovers", "system.filesystems", "numa.gres-affinity", "xid.events"],
)
@pytest.mark.parametrize(
    "component", ["gpu:7 0000:c6:00.0", "gpu:12 0000:1b:00.0", "hca:mlx5_0", ""]
)
@pytest.mark.parametrize("others", [0, 1, 40])
def test_every_reason_we_write_reads_back_and_leads_with_what_broke(check, component, others):
    names = [check] + ["gpu.c%d" % i for i in range(others)]
    result = Result(check, Status.FAIL, "y" * 300, component=component, action=Action.RESET_GPU)
    for length in (60, 200, 512):
        reason = policy.format_reason(result, "sh:", length, more=others, checks=names)
        owner = policy.read_reason(reason, "sh:")
        gpu = int(component[4:].split()[0]) if component.startswith("gpu:") else None
        assert owner.automatic and owner.checks[0] == check and owner.gpu == gpu, reason
        assert owner.complete is (set(owner.checks) == set(names)), reason
        assert set(owner.checks) <= set(names) and len(reason) <= length
        assert reason.startswith("sh:" + check + ("" if gpu is None else " g%d" % gpu)), reason
        assert reason.endswith("-> reset-gpu" + (" (+%d more)" % others if others else ""))


def test_a_prefix_ending_in_a_letter_is_followed_by_a_space():
    result = Result("gpu.ecc", Status.FAIL, "DBE", component="gpu:1 x", action=Action.RMA)
    reason = policy.format_reason(result, "HC", 200)
    assert reason == "HC gpu.ecc g1: gpu:1 x DBE -> rma"
    assert policy.read_reason(reason, "HC").checks == ("gpu.ecc",)
    assert policy.format_manual_reason("fan", "HC", 200) == "HC manual: fan"
    # the space is part of such a prefix: an admin's 'healthcheck.sh: failed' is not a drain of
    # prefix 'health' naming a check 'check.sh' (it would count in the breaker and be adopted)
    for admin in ("healthcheck.sh: failed", "healthgpu.ecc: x", "healthmanual: x"):
        assert not policy.is_ours(admin, "health"), admin
    assert policy.read_reason("health gpu.ecc: x", "health").checks == ("gpu.ecc",)


def test_slurms_own_prolog_and_epilog_reasons_are_refinable():
    # slurmctld 25.11.7: node_mgr.c "Prolog error", job_mgr.c "Epilog error", agent.c "Prolog/Epilog
    # failure" (an RPC answered ESLURMD_PROLOG_FAILED / ESLURMD_EPILOG_FAILED)
    for reason in ("Prolog error", "Epilog error", "Prolog/Epilog failure"):
        assert policy.is_refinable(reason) and not policy.is_ours(reason, "sh:")
    assert not policy.is_refinable("Prolog error: see ticket 7")
