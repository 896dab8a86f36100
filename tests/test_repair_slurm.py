"""The reboot rung against the real slurmctld (tracker 27): node1 with a real slurmd, RebootProgram a
stand-in that only writes a file (the test cluster cannot really reboot). What 22.05 does is in
docs/slurm.md, "Repair through Slurm"; each assertion here is one of those observations.
"""

from __future__ import annotations

import time

import pytest

from slurm_hooks.result import Action
from slurm_hooks.slurm import drainer, repair
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient, slurm_version
from tests.helpers import default_settings
from tests.slurm_rig import reboot_standin_cluster

pytestmark = pytest.mark.slurm
REASON = "sh:gpu.xid g0: gpu:0 Xid 79 fell off the bus -> reboot"


def settings(**repair_values):
    return default_settings(repair=repair_values)


@pytest.fixture(scope="module")
def ctld(slurm_cluster_factory, tmp_path_factory):
    return reboot_standin_cluster(
        slurm_cluster_factory, tmp_path_factory.mktemp("reboot"), "repair"
    )


def ladder(ctld, next_state):
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    enacted = drainer.drain(client, "node1", REASON, settings())
    assert enacted.outcome.value == "drained", enacted
    limits = settings(reboot=True, next_state=next_state)["repair"]
    steps = repair.run_ladder(
        client, "node1", REASON, Action.REBOOT, 0, enacted.node, limits, [], time.time(), False
    )
    return client, steps


def test_the_reboot_rung_asks_slurm_and_slurm_runs_the_reboot_program(ctld):
    client, steps = ladder(ctld, "DOWN")
    assert [(s["rung"], s["result"]) for s in steps] == [("reboot", "requested")], steps
    deadline = time.monotonic() + 20
    while not ctld.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    node = client.show_node("node1")
    print("\n[reboot rung] %s: %s [%s]" % (node.state_string, node.reason, node.reason_time))
    assert ctld.marker.exists(), "RebootProgram did not run"
    assert node.is_drained and {"REBOOT_ISSUED"} & set(node.flags), node
    assert node.reason == REASON + " : reboot issued", node.reason  # ours, with Slurm's suffix
    ctld.scontrol("cancel_reboot", "node1", check=False)


def test_22_05_refuses_nextstate_drain_and_the_step_says_so(ctld):
    version = slurm_version(env=ctld.env)
    if not version or version[:2] != (22, 5):
        pytest.skip("measured on 22.05 only: %s" % (version,))
    ctld.scontrol("update", "NodeName=node1", "State=RESUME", check=False)
    client, steps = ladder(ctld, "DRAIN")
    assert steps[0]["rung"] == "reboot" and steps[0]["result"].startswith("failed:"), steps
    assert "REBOOT_ISSUED" not in client.show_node("node1").flags
