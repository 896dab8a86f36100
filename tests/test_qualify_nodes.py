"""`qualify --node HOSTLIST` without Slurm: the hostlist is expanded by the project's own bounded
expansion (slurm/gres.py), a bad one is a usage error naming it (exit 3) before any Slurm call, and
a hostlist exits by its worst node. The Slurm side: test_qualify_slurm."""

from __future__ import annotations

import os

import pytest

from slurm_hooks.qualify import batch, through_slurm
from slurm_hooks.result import ExitCode
from tests.helpers import cli_with_default_config


def test_a_hostlist_expands_in_order_once_each():
    assert batch.expand_nodes("gpu[01-04,07]") == [
        "gpu01",
        "gpu02",
        "gpu03",
        "gpu04",
        "gpu07",
    ]
    assert batch.expand_nodes("b,a,b") == ["b", "a"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("n[0-99999][0-99999]", "at most 100000 names"),
        ("gpu[1-", "a Slurm hostlist like"),
        ("../etc", "invalid node name '../etc'"),
        ("", "names no node"),
    ],
)
def test_a_bad_hostlist_is_a_usage_error_naming_it(text, message):
    with pytest.raises(ValueError) as info:
        batch.expand_nodes(text)
    assert message in str(info.value)
    done = cli_with_default_config(["qualify", "--node", text])
    assert done.returncode == ExitCode.UNKNOWN
    assert "qualify --node" in done.stderr and message in done.stderr


def test_the_worst_node_sets_the_exit_code():
    outcomes = [
        {"verdict": "pass", "reason": "3 tests passed"},
        {"verdict": "not qualified", "reason": "refused: n2 is DOWN"},
        {"verdict": "fail", "reason": "nvbandwidth: GPU 3 h2d 13.2 GB/s"},
    ]
    codes = [batch.exit_code(o) for o in outcomes]
    assert codes == [ExitCode.OK, ExitCode.REFUSED, ExitCode.FAIL]
    assert max(codes) == ExitCode.FAIL
    assert batch.exit_code({"verdict": "not qualified", "reason": "job died"}) == 3


# -- the stale-reservation sweep's judgement (qualify/sweep.py; on the real slurmctld:
# test_qualify_slurm::test_the_sweep_deletes_only_our_stale_reservations) -------------------------

NOW = 1_780_000_000.0


def test_a_reservation_name_records_its_run_and_reads_back():
    from slurm_hooks.qualify import sweep

    name = through_slurm.reservation_name("gpu-01.a", now=NOW - 60, level="quick")
    run = sweep.parse_name(name)
    assert run["node"] == "gpu-01.a" and run["started"] == NOW - 60
    assert (run["level"], run["pid"], run["host"]) == (
        "quick",
        os.getpid(),
        through_slurm.owner_host(),
    )
    old_style = sweep.parse_name(through_slurm.reservation_name("n1", now=NOW))
    assert old_style["level"] is None and old_style["pid"] is None
    for not_ours in (
        "slurm-hooks-qualify-",
        "slurm-hooks-qualify-n1",
        "slurm-hooks-qualify-n1-20261203T101010Z+quick+12",
        "slurm-hooks-qualify-n1-20261203T101010Z+fast+12+h",
        "maint-n1-20261203T101010Z",
    ):
        assert sweep.parse_name(not_ours) is None, not_ours


@pytest.mark.parametrize(
    "age_min, level, pid_alive, host, stale",
    [
        (20, "quick", True, "here", None),  # running
        (41, "quick", True, "here", "past its quick bound of 40 min"),
        (41, "standard", True, "here", None),
        (20, "quick", False, "here", "its owner (pid 4242 on here) is gone"),
        (20, "quick", False, "elsewhere", None),  # we cannot see another host's processes
        (300, None, True, "here", None),  # no level recorded: the longest level's bound
        (311, None, True, "here", "past its longest level's bound of 310 min"),
    ],
)
def test_a_run_is_over_past_its_bound_or_when_its_owner_is_gone(
    age_min, level, pid_alive, host, stale
):
    from slurm_hooks.qualify import sweep

    run = {"started": NOW - age_min * 60, "level": level, "pid": 4242, "host": host}
    why = sweep.why_stale(run, NOW, "here", alive=lambda pid: pid_alive)
    assert (why is None) if stale is None else (stale in why), why


def test_a_reused_pid_of_another_program_is_not_our_owner():
    import subprocess
    import sys

    from slurm_hooks.qualify import sweep

    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "slurm-hooks"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert sweep.owner_alive(ours.pid) and not sweep.owner_alive(other.pid)
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert not sweep.owner_alive(ours.pid)  # reaped: gone


@pytest.mark.parametrize("verb", [["--node", "node1"], ["--due"]])
@pytest.mark.parametrize(
    "mode, owner", [(0o777, None), (0o1777, None), (0o770, None), (0o700, 65534)]
)
def test_a_work_dir_others_can_write_is_refused_before_any_slurm_call(tmp_path, verb, mode, owner):
    """The job's script (run as us, root) and its output (read as the verdict) live in the work
    dir: a user who can write there could swap the script or forge a pass. Such a dir (or one of
    another owner) is refused, naming it, before anything is held."""
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(mode)
    if owner is not None:
        os.chown(str(work), owner, -1)
    done = cli_with_default_config(["qualify"] + verb + ["--work-dir", str(work)])
    assert done.returncode == ExitCode.UNKNOWN, done.stdout + done.stderr
    assert "work dir %s" % work in done.stderr, done.stderr
    assert "qualify" in done.stderr and "slurm_calls" not in done.stdout
