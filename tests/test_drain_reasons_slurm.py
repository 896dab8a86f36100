"""Drains you can read (issue tracker 25), against the real slurmctld and its `sinfo -R`.

`sinfo -R` prints 20 characters of a reason by default (its format is "%20E %9u %19H %N"). Before,
every drain of ours read `slurm-hooks: gpu.rem` or `slurm-hooks: system.` there; now the prefix is
short and the worst check and its GPU come first. Seen here on Slurm 22.05:

    REASON               USER      TIMESTAMP           NODELIST
    sh:gpu.remap g3 +gpu root      2026-12-03T16:10:09 gpu01
    sh:system.processes: root      2026-12-03T16:10:10 gpu02
    slurm-hooks: gpu.cou root      2026-12-03T16:10:11 gpu03      <- the release before Ownership stays exact: a
drain of the release before (`slurm-hooks: gpu.count,gpu.ecc: ...`) is still ours after an upgrade
(counted by the breaker, adopted when the local state is lost, resumed by an admin's verb), and an
admin's reason that merely starts like ours (`sh: ...`) is not.
"""

from __future__ import annotations

import pytest

from slurm_hooks.result import Action, Result, Status
from slurm_hooks.slurm import drainer, policy
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from slurm_hooks.slurm.policy import Outcome
from tests.helpers import default_settings

pytestmark = pytest.mark.slurm

NODES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06")  # breaker limit 2
OLD_RELEASE = "slurm-hooks: gpu.count,gpu.ecc: gpu:1 0000:1b:00.0 GPU 1 lost -> reboot (+1 more)"


def settings():
    return default_settings(drain={"timeout": 20.0})  # enforce; slow answers under load finish


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory):
    c = slurm_cluster_factory(
        "reasons", nodes=NODES, with_slurmd=False, extra_node_state="IDLE", slurmd_timeout=0
    )
    yield c
    for name in NODES:
        if "DRAIN" in c.node_state(name).split("+"):
            c.scontrol("update", "NodeName=%s" % name, "State=UNDRAIN")


def client(cluster):
    return SlurmClient(backend=ScontrolBackend(env=cluster.env, timeout=20.0))


def sinfo_r(cluster):
    """{node: REASON column} of plain `sinfo -R` (its own default format, nothing chosen by us)."""
    out = cluster.run("sinfo", "-R")
    print("\n$ sinfo -R\n" + out)
    header, *rows = out.splitlines()
    assert header.split()[0] == "REASON", out
    width = header.index("USER")  # the REASON column: 20 characters and a space
    return {row.split()[-1]: row[:width].rstrip() for row in rows if row.strip()}, out


def test_sinfo_r_shows_the_check_and_the_gpu(cluster):
    remap = Result(
        "gpu.remap",
        Status.FAIL,
        "row-remap pending: 1 uncorrectable",
        component="gpu:3 0000:3b:00.0",
        action=Action.RESET_GPU,
    )
    reason = policy.format_reason(remap, "sh:", 200, more=1, checks=("gpu.remap", "gpu.ecc"))
    processes = Result("system.processes", Status.FAIL, "a root process hogs 4 CPUs")
    other = policy.format_reason(processes, "sh:", 200)
    assert drainer.drain(client(cluster), "gpu01", reason, settings()).outcome is Outcome.DRAINED
    assert drainer.drain(client(cluster), "gpu02", other, settings()).outcome is Outcome.DRAINED
    cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=" + OLD_RELEASE)
    shown, out = sinfo_r(cluster)
    assert shown["gpu01"] == "sh:gpu.remap g3 +gpu" == reason[:20], out
    assert shown["gpu02"] == "sh:system.processes:" == other[:20], out
    assert shown["gpu03"] == "slurm-hooks: gpu.cou", out  # what the release before showed
    # the full structure is all there behind the 20 characters
    full = {n.name: n.reason for n in client(cluster).list_nodes()}
    assert full["gpu01"] == reason and policy.read_reason(reason, "sh:") == policy.ReasonOwner(
        "auto", ("gpu.remap", "gpu.ecc"), True, 3
    )


def test_a_drain_of_the_release_before_is_still_ours_and_an_admins_look_alike_is_not(cluster):
    c = client(cluster)
    cluster.scontrol("update", "NodeName=gpu04", "State=DRAIN", "Reason=" + OLD_RELEASE)
    cluster.scontrol(
        "update", "NodeName=gpu05", "State=DRAIN", "Reason=sh: see ticket 42: GPU fans"
    )
    # lost local state: the old reason names its checks, so it is adopted as ours
    adopted = drainer.drain(c, "gpu04", "sh:gpu.count g1: x -> reboot", settings(), (), False)
    assert adopted.outcome is Outcome.ALREADY_OURS, adopted
    # the admin's look-alike is someone else's: never re-reasoned, never counted
    kept = drainer.drain(c, "gpu05", "sh:gpu.count g1: x -> reboot", settings(), (), False)
    assert kept.outcome is Outcome.FOREIGN_DRAIN, kept
    nodes = c.list_nodes()
    counted = policy.breaker_state(
        ((n.name, n.is_drained, n.reason) for n in nodes), "gpu06", "sh:", 10.0, 2
    )
    # gpu01, gpu02 (today's format, from the test before), gpu03, gpu04 (the old one); not gpu05
    drained = sorted(n.name for n in nodes if n.is_drained)
    expect = len([n for n in drained if n != "gpu05"])
    assert counted.drained_by_us == expect and "gpu05" in drained, (drained, counted)
    # an admin's `slurm-hooks resume` lifts the old drain of ours, and only with force the look-alike
    resumed = drainer.resume(c, "gpu04", settings(), by_admin=True)
    assert resumed.outcome is Outcome.RESUMED, resumed
    refused = drainer.resume(c, "gpu05", settings(), by_admin=True)
    assert refused.outcome is Outcome.NOT_OURS and "DRAIN" in cluster.node_state("gpu05")
