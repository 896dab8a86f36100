"""`qualify --node HOSTLIST` without Slurm: the hostlist is expanded by the project's own bounded
expansion (slurm/gres.py), a bad one is a usage error naming it (exit 3) before any Slurm call, and
a hostlist exits by its worst node. The Slurm side: test_qualify_slurm."""

from __future__ import annotations

import pytest

from slurm_hooks.qualify import through_slurm
from slurm_hooks.result import ExitCode
from tests.helpers import cli_with_default_config


def test_a_hostlist_expands_in_order_once_each():
    assert through_slurm.expand_nodes("gpu[01-04,07]") == [
        "gpu01",
        "gpu02",
        "gpu03",
        "gpu04",
        "gpu07",
    ]
    assert through_slurm.expand_nodes("b,a,b") == ["b", "a"]


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
        through_slurm.expand_nodes(text)
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
    codes = [through_slurm.exit_code(o) for o in outcomes]
    assert codes == [ExitCode.OK, ExitCode.REFUSED, ExitCode.FAIL]
    assert max(codes) == ExitCode.FAIL
    assert through_slurm.exit_code({"verdict": "not qualified", "reason": "job died"}) == 3
