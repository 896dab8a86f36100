"""Lemon nodes against the real slurmctld (tracker 27): the hooks' flow of tests/test_lemon.py with
its injected clock and boot id, but every drain, resume and read through scontrol. A lemon's reason
(';', '(' and the RMA ask) goes through scontrol and back unchanged, the health run keeps it,
and `slurm-hooks report --lemons` lists it from Slurm's node list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slurm_hooks.slurm import lemon
from slurm_hooks.slurm.client import ScontrolBackend
from slurm_hooks.slurm.drainer import Outcome
from tests import flow_rig

pytestmark = pytest.mark.slurm

rig = flow_rig.rig  # the fixture: one check driven by a file
DAY = 86400.0
START = 1796256000.0


@pytest.fixture(scope="module")
def ctld(slurm_cluster_factory):
    return slurm_cluster_factory(
        "lemon",
        nodes=("node1", "node2"),
        with_slurmd=False,
        extra_node_state="IDLE",
        slurmd_timeout=0,
    )


def test_a_lemon_is_drained_for_rma_kept_and_listed_through_slurm(ctld, rig, monkeypatch, tmp_path):
    clock = {"t": START}
    monkeypatch.setattr(lemon, "now", lambda: clock["t"])
    monkeypatch.setattr(lemon, "boot_id", lambda root: "boot-a")
    rig.backend = ScontrolBackend(env=ctld.env, timeout=20.0)
    config = {"lemon": {"same_fault_after_reboot": False}}
    reasons = []
    for day in (0, 12, 24):  # three failures in simulated weeks, each repaired
        clock["t"] = START + day * DAY
        rig.run("prolog", "node", **config)
        reasons.append(rig.backend.show_node("node1").reason)
        health = rig.run("health", "ok", **config)
        if day < 24:
            assert health.enacted.outcome is Outcome.RESUMED, health.enacted
    node = rig.backend.show_node("node1")
    assert node.is_drained and node.reason == reasons[-1] and lemon.is_lemon(node.reason, "sh:")
    assert "lemon: 3rd drain in 30 d;" in node.reason and node.reason.endswith("-> rma")
    assert health.enacted.outcome is Outcome.UNPROVEN and "lemon" in health.enacted.message
    assert not any(lemon.is_lemon(r, "sh:") for r in reasons[:2])
    conf = tmp_path / "cli.toml"
    conf.write_text('[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n' % (tmp_path / "s"))
    env = dict(os.environ, **ctld.env, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hooks",
            "--config",
            str(conf),
            "report",
            "--lemons",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    listed = json.loads(done.stdout)["nodes"]
    assert [row["node"] for row in listed] == ["node1"] and listed[0]["reason"] == node.reason
    print("\n[lemon] reasons over 24 simulated days: %s" % reasons)
