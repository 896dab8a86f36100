"""`qualify --due` after the repair ladder's own reboot, against the real slurmctld (22.05 on this
host). The rig's RebootProgram is a stand-in that only writes a file (the test host cannot reboot);
the test then plays the machine coming back: it stops node1's slurmd and starts it again with
`slurmd -b` ("report node rebooted when daemon restarted", slurmd(8): BootTime becomes now), so
slurmctld itself sees the reboot it issued complete and applies the ladder's nextstate=DOWN:

  State=DOWN  Reason=<ours> : reboot issued : reboot complete  (reason time = the completion)

(measured here; Slurm 25.11's node_mgr.c validate_node_specs appends the same 'reboot complete').
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from slurm_hooks.qualify import due, through_slurm
from slurm_hooks.result import Action
from slurm_hooks.slurm import drainer, repair
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from tests.helpers import default_settings
from tests.slurm_rig import qualification_fake_node, reboot_standin_cluster

pytestmark = pytest.mark.slurm
REASON = "sh:gpu.xid g0: gpu:0 Xid 79 fell off the bus -> reboot"
STANDINS = os.path.join(os.path.dirname(__file__), "qualify_standins")


@pytest.fixture(scope="module")
def ctld(slurm_cluster_factory, tmp_path_factory):
    return reboot_standin_cluster(
        slurm_cluster_factory, tmp_path_factory.mktemp("due-reboot"), "due"
    )


@pytest.fixture(scope="module")
def fake():
    yield from qualification_fake_node()


@pytest.fixture
def clean(ctld):
    yield
    ctld.scontrol("cancel_reboot", "node1", check=False)
    for line in ctld.run("scontrol", "-o", "show", "reservation", check=False).splitlines():
        if "ReservationName=" + through_slurm.RESERVATION_PREFIX in line:
            name = line.split("ReservationName=")[1].split()[0]
            ctld.run("scontrol", "delete", "ReservationName=" + name, check=False)
    ctld.scontrol("update", "NodeName=node1", "State=RESUME", check=False)
    wait_for(ctld, lambda state: "NOT_RESPONDING" not in state and "DOWN" not in state)


def settings(tmp_path, **repair_values):
    os.makedirs(str(tmp_path / "state"), exist_ok=True)
    return default_settings(paths={"state_dir": str(tmp_path / "state")}, repair=repair_values)


def wait_for(ctld, ok, timeout=60.0):
    deadline = time.monotonic() + timeout
    state = ctld.node_state("node1")
    while not ok(state) and time.monotonic() < deadline:
        time.sleep(0.5)
        state = ctld.node_state("node1")
    return state


def job_setup(ctld, fake, tmp_path, fault=""):
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nroot = "%s"\n[records]\ndir = "%s"\n[qualify]\nib_ports = ["mlx5_0:1"]\n'
        % (fake.root, tmp_path / "records")
    )
    config.chmod(0o600)
    env = dict(ctld.env)
    env["PATH"] = STANDINS + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["QUALIFY_STANDIN_FAULT"] = fault
    command = [sys.executable, "-m", "slurm_hooks", "--config", str(config), "qualify"]
    return command, env


def reboot_by_the_ladder(ctld, client, config):
    """Our drain, the ladder's real `scontrol reboot ASAP nextstate=DOWN`, the RebootProgram run;
    returns the node while the reboot is still issued (not yet done)."""
    if ctld.marker.exists():
        ctld.marker.unlink()
    enacted = drainer.drain(client, "node1", REASON, config)
    assert enacted.outcome.value == "drained", enacted
    steps = repair.run_ladder(
        client,
        "node1",
        REASON,
        Action.REBOOT,
        0,
        enacted.node,
        config["repair"],
        [],
        time.time(),
        False,
    )
    assert [(s["rung"], s["result"]) for s in steps] == [("reboot", "requested")], steps
    deadline = time.monotonic() + 20
    while not ctld.marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ctld.marker.exists(), "RebootProgram did not run"
    return client.show_node("node1")


def slurmd_start_time(ctld) -> str:
    shown = ctld.run("scontrol", "-o", "show", "node", "node1")
    return shown.split("SlurmdStartTime=")[1].split()[0]


def come_back(ctld, client):
    """The machine boots again: slurmd restarts reporting a new boot (-b)."""
    time.sleep(1.1)  # BootTime has a resolution of one second: after the reboot request
    ctld.slurmd.terminate()
    ctld.slurmd.wait(timeout=30)
    ctld.slurmd = ctld._spawn("slurmd", ["-D", "-b", "-N", "node1"])
    wait_for(ctld, lambda state: "REBOOT" not in state and "NOT_RESPONDING" not in state)
    back = client.show_node("node1")
    # The boot is done; slurmd goes on reporting that one boot time, which a slurmd left running
    # with -b does not: 26.05 took its next registration, a second after our resume, for another
    # reboot ("Node node1 unexpectedly rebooted", node_mgr.c; ReturnToService!=2) and set the
    # node DOWN under the qualification job. A plain restart reports the host's real boot time.
    started = slurmd_start_time(ctld)
    time.sleep(1.1)  # SlurmdStartTime has a resolution of one second
    ctld.slurmd.terminate()
    ctld.slurmd.wait(timeout=30)
    ctld.slurmd = ctld._spawn("slurmd", ["-D", "-N", "node1"])
    deadline = time.monotonic() + 30
    while slurmd_start_time(ctld) == started and time.monotonic() < deadline:
        time.sleep(0.3)
    assert slurmd_start_time(ctld) != started, "slurmd did not register again"
    # the rig runs ReturnToService=1 (slurm_rig.reboot_standin_cluster): the DOWN holds
    return back


def test_a_node_down_after_our_reboot_is_due_qualified_and_returned_on_a_pass(
    ctld, fake, tmp_path, clean
):
    config = settings(tmp_path, reboot=True, next_state="DOWN")
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    issued = reboot_by_the_ladder(ctld, client, config)
    # the reboot is still pending: not due, and said why
    assert issued.is_rebooting, issued
    ok, why = due.repaired(issued, "sh:")
    assert not ok and "reboot is still pending" in why, why
    back = come_back(ctld, client)
    print("\n[after our reboot] %s: %s [%s]" % (back.state_string, back.reason, back.reason_time))
    assert back.state_string == "DOWN" and back.reason.endswith(" : reboot complete"), back
    ok, why = due.repaired(back, "sh:")
    assert ok and why.startswith("down after our reboot for reboot"), why
    command, env = job_setup(ctld, fake, tmp_path)
    done = due.run_due(client, config, "quick", command, str(tmp_path), env)
    assert [(d["node"], d["kind"], d["verdict"]) for d in done["due"]] == [
        ("node1", "repaired", "pass")
    ], done
    outcome = done["due"][0]
    assert outcome["enacted"] == "resumed" and outcome["reservation_deleted"] is True, outcome
    assert outcome["slurm_calls"] <= 10, outcome  # a drained node's 7 + a read + our drain
    print("slurm calls, passing qualification after our reboot:", outcome["slurm_calls"])
    state = ctld.node_state("node1")
    assert "DOWN" not in state and "DRAIN" not in state, state  # back in service
    assert through_slurm.RESERVATION_PREFIX not in ctld.run(
        "scontrol", "show", "reservation", check=False
    )


def test_a_failing_node_down_after_our_reboot_stays_out_with_the_figure(
    ctld, fake, tmp_path, clean
):
    config = settings(tmp_path, reboot=True, next_state="DOWN")
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    reboot_by_the_ladder(ctld, client, config)
    come_back(ctld, client)
    command, env = job_setup(ctld, fake, tmp_path, fault="x8_link=3")
    done = due.run_due(client, config, "quick", command, str(tmp_path), env)
    assert [(d["node"], d["verdict"]) for d in done["due"]] == [("node1", "fail")], done
    node = client.show_node("node1")
    assert node.is_drained, node
    assert node.reason.startswith("sh:qualify: nvbandwidth: nvbandwidth GPU 3 h2d 13.2 GB/s"), node
    # drained with the figure: no longer a repair waiting for its qualification
    assert due.repaired(node, "sh:") == (False, "")


def test_an_admins_down_is_never_touched(ctld, fake, tmp_path, clean):
    config = settings(tmp_path)
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    why = "admin: PSU swap -> reboot : reboot complete"
    ctld.scontrol("update", "NodeName=node1", "State=DOWN", "Reason=" + why)
    command, env = job_setup(ctld, fake, tmp_path)
    done = due.run_due(client, config, "quick", command, str(tmp_path), env)
    assert done["due"] == [] and done["waiting"] == [], done
    node = client.show_node("node1")
    assert node.state_string == "DOWN" and node.reason == why, node
    # nor by an explicit `qualify --node`
    done = through_slurm.qualify_node(client, "node1", "quick", config, command, str(tmp_path), env)
    assert done["reason"].startswith("refused: node1 is DOWN"), done
    assert client.show_node("node1").reason == why


def test_an_unknown_outcome_after_our_reboot_leaves_the_node_out_of_service(
    ctld, fake, tmp_path, clean
):
    config = settings(tmp_path, reboot=True, next_state="DOWN")
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    reboot_by_the_ladder(ctld, client, config)
    come_back(ctld, client)
    _command, env = job_setup(ctld, fake, tmp_path)
    done = due.run_due(client, config, "quick", ["/bin/false"], str(tmp_path), env)
    assert [(d["node"], d["verdict"]) for d in done["due"]] == [("node1", "not qualified")], done
    node = client.show_node("node1")
    assert node.is_drained, node  # not a fail, but not back in service either
    assert node.reason.startswith("sh:qualify: the qualification job printed no result"), node
    assert through_slurm.RESERVATION_PREFIX not in ctld.run(
        "scontrol", "show", "reservation", check=False
    )


def test_an_admins_down_set_while_we_prepare_is_not_overwritten(
    ctld, fake, tmp_path, clean, monkeypatch
):
    """The admin sets their own DOWN while we hold the node, before our drain for the job (played
    right after our reservation is created): the node keeps the admin's reason and state."""
    config = settings(tmp_path, reboot=True, next_state="DOWN")
    client = SlurmClient(backend=ScontrolBackend(env=ctld.env, timeout=20.0))
    reboot_by_the_ladder(ctld, client, config)
    come_back(ctld, client)
    admins = "admin: pulling node1 for a PSU swap"
    real_slurm = through_slurm._slurm

    def slurm(argv, env, timeout_s=through_slurm.SLURM_CALL_S):
        ran = real_slurm(argv, env, timeout_s)
        if list(argv[:3]) == ["scontrol", "create", "reservation"]:
            ctld.scontrol("update", "NodeName=node1", "State=DOWN", "Reason=" + admins)
        return ran

    monkeypatch.setattr(through_slurm, "_slurm", slurm)
    command, env = job_setup(ctld, fake, tmp_path)
    done = through_slurm.qualify_node(client, "node1", "quick", config, command, str(tmp_path), env)
    assert done["verdict"] == "not qualified" and "changed since it was read" in done["reason"]
    assert done["reservation_deleted"] is True and "job_id" not in done, done
    node = client.show_node("node1")
    assert node.state_string == "DOWN" and node.reason == admins, node
