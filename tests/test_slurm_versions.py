"""What the running Slurm really prints, and that the drain library reads it right -- on every version.

Runs against the real daemons of whatever Slurm is installed: 22.05 on the host, 24.11 (Debian 13)
and 26.05 (sid) in Debian roots (../shared/reference/slurm-in-chroot.sh). Each scenario's raw output is
written to <pytest tmp>/slurm-captures/<version>/ (the path is printed); tests/captures/slurm/<version>/
holds those files as taken, and tests/test_slurm_client.py parses them offline.

Scenarios: our drain; an admin reason with a newline and a forged 'NodeName=... State=...' line; an
admin's State=FAIL; a MAINT reservation; RESUME with a reason (what is kept afterwards); RESUME of a
node that is not drained (the error text changed in 26.05); an unknown node; hostlist expansion;
slurmctld's own drain of a node that still carries an old reason (Epilog error after a resume while
the job ran: the old reason, time and user stay); 26.05's EXTERNAL node state.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from slurm_hooks.slurm import drainer, policy
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient, expand_hostlist, parse_version
from slurm_hooks.slurm.errors import InvalidNodeState, NodeNotFound
from slurm_hooks.slurm.node_state import parse_node_line, parse_nodes
from tests.slurmcluster import SlurmCluster, find_binary, require_slurm

pytestmark = pytest.mark.slurm

OURS = "slurm-hooks: gpu.count: gpu:0 GPU 0 fell off the bus -> reboot"
FORGED = "maint window\nNodeName=node9 State=IDLE Partitions=debug"


def slurm_version():
    out = subprocess.run(
        [find_binary("slurmctld") or "slurmctld", "-V"], capture_output=True, text=True
    ).stdout
    return parse_version(out)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    require_slurm()
    base = tmp_path_factory.mktemp("versions")
    version = slurm_version()
    captures = tmp_path_factory.getbasetemp() / "slurm-captures" / ("%d.%02d.%d" % version)
    captures.mkdir(parents=True, exist_ok=True)
    flag = base / "FAIL_EPILOG"
    epilog = base / "epilog.sh"
    epilog.write_text("#!/bin/sh\n[ -e %s ] && exit 1\nexit 0\n" % flag)
    epilog.chmod(0o755)
    extra = ""
    if version >= (26, 5, 0):  # State=EXTERNAL is new in 26.05 (src/common/node_conf.c)
        extra = "NodeName=ext1 NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=EXTERNAL"
    cluster = SlurmCluster(
        base / "cluster",
        nodes=("node1", "node2", "node3"),
        epilog=str(epilog),
        extra_conf=extra,
        message_timeout=5,
    )
    cluster.start()
    cluster.flag, cluster.captures, cluster.version = flag, captures, version
    print("\n[slurm captures] Slurm %s -> %s" % (".".join(map(str, version)), captures))
    yield cluster
    cluster.stop()


def scontrol(rig, *args):
    """(rc, stdout, stderr) of scontrol with the drain library's client environment (UTC, ISO times)."""
    from slurm_hooks.slurm.client import client_env

    res = subprocess.run(
        [find_binary("scontrol") or "scontrol"] + list(args),
        env=client_env(rig.env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return res.returncode, res.stdout, res.stderr


def capture(rig, name, text):
    (rig.captures / name).write_text(text)
    return text


def show(rig, node, name=None):
    rc, out, err = scontrol(rig, "--all", "--oneliner", "show", "node", node)
    assert rc == 0, err
    if name:
        capture(rig, name, out)
    return out


def client(rig):
    return SlurmClient(backend=ScontrolBackend(env=rig.env, timeout=10.0))


def test_our_drain_reads_back_exactly(rig):
    show(rig, "node1", "show-node-idle.txt")
    rc, _, err = scontrol(rig, "update", "NodeName=node1", "State=DRAIN", "Reason=" + OURS)
    assert rc == 0, err
    line = show(rig, "node1", "show-node-drained-ours.txt")
    node = parse_node_line(line)
    assert node.is_drained and node.reason == OURS and node.reason_user == "root", node
    now = time.time()
    assert node.reason_epoch is not None and abs(node.reason_epoch - now) < 30, (
        node.reason_time,
        now,
    )  # UTC
    assert policy.read_reason(node.reason, "slurm-hooks:").checks == ("gpu.count",)
    rc, _, err = scontrol(rig, "update", "NodeName=node1", "State=RESUME")
    assert rc == 0, err
    rig.wait_state("node1", "IDLE", timeout=15)


def test_a_reason_with_a_newline_cannot_forge_a_node(rig):
    """scontrol -o prints the reason's further lines on the same line after eight spaces: before, the
    parser read 'NodeName=node9 State=IDLE' from there and renamed node2 (drained) to an idle node9."""
    rc, _, err = scontrol(rig, "update", "NodeName=node2", "State=DRAIN", "Reason=" + FORGED)
    assert rc == 0, err
    line = show(rig, "node2", "show-node-reason-newline.txt")
    node = parse_node_line(line)
    assert (node.name, node.is_drained, node.reason) == ("node2", True, FORGED), node
    rc, out, err = scontrol(rig, "--all", "--oneliner", "show", "node")
    capture(rig, "show-nodes-reason-newline.txt", out)
    nodes = {n.name: n for n in parse_nodes(out)}
    assert set(nodes) >= {"node1", "node2", "node3"} and "node9" not in nodes
    assert nodes["node2"].is_drained and nodes["node2"].reason == FORGED
    scontrol(rig, "update", "NodeName=node2", "State=UNDRAIN")


def test_an_admins_fail_state(rig):
    rc, _, err = scontrol(
        rig, "update", "NodeName=node3", "State=FAIL", "Reason=admin: DIMM errors"
    )
    assert rc == 0, err
    node = parse_node_line(show(rig, "node3", "show-node-fail.txt"))
    assert node.is_failed and node.reason == "admin: DIMM errors" and node.known_state, node
    enacted = drainer.drain(client(rig), "node3", OURS, _settings())
    assert enacted.outcome is drainer.Outcome.SKIPPED_STATE and "FAIL" in enacted.message
    assert parse_node_line(show(rig, "node3")).reason == "admin: DIMM errors"
    scontrol(
        rig, "update", "NodeName=node3", "State=DOWN", "Reason=back to down"
    )  # as the fixture had it
    scontrol(rig, "update", "NodeName=node3", "State=UNDRAIN")


def test_a_maint_reservation(rig):
    rc, out, err = scontrol(
        rig,
        "create",
        "reservation",
        "ReservationName=maint1",
        "Flags=MAINT",
        "Nodes=node1",
        "StartTime=now",
        "Duration=10",
        "Users=root",
    )
    assert rc == 0, err
    try:
        deadline = time.monotonic() + 10
        while True:
            node = parse_node_line(show(rig, "node1"))
            if "MAINTENANCE" in node.flags or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        capture(rig, "show-node-maint.txt", node.raw + "\n")
        assert "MAINTENANCE" in node.flags and node.known_state, node
        enacted = drainer.drain(client(rig), "node1", OURS, _settings())
        assert enacted.outcome is drainer.Outcome.SKIPPED_STATE and not enacted.node_drained
    finally:
        scontrol(rig, "delete", "ReservationName=maint1")


def test_resume_errors_and_what_resume_leaves(rig):
    rc, _, err = scontrol(rig, "update", "NodeName=node1", "State=RESUME")
    capture(rig, "resume-not-drained.stderr", err)
    assert rc != 0 and re.search(r"Invalid node state (specified|transition)", err), err
    with pytest.raises(InvalidNodeState):
        client(rig).resume("node1")
    rc, out, err = scontrol(rig, "update", "NodeName=nosuch", "State=RESUME")
    capture(rig, "update-unknown-node.stderr", err + out)
    rc2, out2, err2 = scontrol(rig, "show", "node", "nosuch")
    capture(rig, "show-unknown-node.txt", out2 + err2)
    with pytest.raises(NodeNotFound):
        client(rig).show_node("nosuch")
    with pytest.raises(NodeNotFound):
        client(rig).resume("nosuch")
    # RESUME of an IDLE drained node, with a reason in the same request
    scontrol(rig, "update", "NodeName=node1", "State=DRAIN", "Reason=" + OURS)
    client(rig).resume("node1", drainer.UNDONE_REASON)
    rig.wait_state("node1", "IDLE", timeout=15)
    node = parse_node_line(show(rig, "node1", "show-node-resumed-with-reason.txt"))
    # 22.05/26.05 clear it; 24.11/25.11 with accounting_storage/none keep it (the reason we sent, not ours)
    assert node.reason == (
        drainer.UNDONE_REASON if keeps_reason_after_resume(rig.version) else None
    ), node
    assert not policy.is_ours(node.reason, "slurm-hooks:")


def keeps_reason_after_resume(version):
    """24.11 and 25.11 with accounting_storage/none (this cluster's): clusteracct_storage_g_node_up
    returns before clearing the reason (src/interfaces/accounting_storage.c); 22.05 and 26.05 clear it."""
    return (24, 11, 0) <= version < (26, 5, 0)


def test_slurm_keeps_an_old_reason_when_it_drains_a_node_itself(rig):
    """A node drained while a job runs, then resumed (by an admin, plain scontrol) before the job ends.
    On 24.11 (accounting_storage/none) the drain reason stays on the node until its next job; the
    job's epilog then fails and slurmctld drains the node itself ('Epilog error'): _drain_node keeps
    the reason, with its old time and user. Our old text is on a drain that is not ours -- which is
    why ownership needs Slurm's reason time and our record, and why our own RESUME carries a reason
    of its own. 22.05 and 26.05 clear the reason at the RESUME and show 'Epilog error'."""
    job = rig.sbatch(wrap="sleep 4")
    rig.wait_job(job, ("RUNNING",), timeout=20)
    rc, _, err = scontrol(rig, "update", "NodeName=node1", "State=DRAIN", "Reason=" + OURS)
    assert rc == 0, err
    drained = parse_node_line(show(rig, "node1", "show-node-draining.txt"))
    assert drained.is_draining, drained
    rc, _, err = scontrol(rig, "update", "NodeName=node1", "State=RESUME")
    assert rc == 0, err
    kept = parse_node_line(show(rig, "node1", "show-node-resumed-while-running.txt"))
    assert not kept.is_drained, kept
    if keeps_reason_after_resume(rig.version):
        assert kept.reason == OURS and kept.reason_time == drained.reason_time, kept
    else:
        assert kept.reason is None, kept
    rig.flag.write_text("1")
    try:
        state = rig.wait_state("node1", lambda s: "DRAIN" in s.split("+"), timeout=30)
        again = parse_node_line(show(rig, "node1", "show-node-ctld-drain-after-resume.txt"))
    finally:
        rig.flag.unlink()
    assert "DRAIN" in state
    if keeps_reason_after_resume(rig.version):
        assert (again.reason, again.reason_time, again.reason_user) == (
            OURS,
            drained.reason_time,
            "root",
        ), again
    else:
        assert again.reason == "Epilog error", again
    log = (rig.log / "slurmctld.log").read_text()
    assert re.search(r"epilog", log, re.I)
    # what the drain library makes of it: with a record of our drain, the time still matches, so only
    # a health run that saw the node resumed in between (and dropped the record) or our own RESUME
    # (which replaces the text) tells them apart; without any record it is refused
    enacted = drainer.resume(client(rig), "node1", _settings())
    assert enacted.outcome is drainer.Outcome.NOT_OURS
    scontrol(rig, "update", "NodeName=node1", "State=RESUME")
    rig.wait_state("node1", "IDLE", timeout=15)


def test_hostlists_expand_as_slurm_does(rig):
    rc, out, err = scontrol(rig, "show", "hostnames", "gpu[01-03,07],login1")
    capture(rig, "show-hostnames.txt", out)
    assert expand_hostlist("gpu[01-03,07],login1", env=rig.env) == out.split()
    assert out.split() == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]


def test_external_nodes_of_2605(rig):
    if rig.version < (26, 5, 0):
        pytest.skip(
            "State=EXTERNAL exists from Slurm 26.05 (this is %s)" % ".".join(map(str, rig.version))
        )
    node = parse_node_line(show(rig, "ext1", "show-node-external.txt"))
    assert "EXTERNAL" in node.flags and node.known_state, node
    enacted = drainer.drain(client(rig), "ext1", OURS, _settings())
    assert enacted.outcome is drainer.Outcome.SKIPPED_STATE


def test_version_string(rig):
    out = subprocess.run(
        [find_binary("sinfo") or "sinfo", "--version"], env=rig.env, capture_output=True, text=True
    ).stdout
    capture(rig, "sinfo-version.txt", out)
    assert parse_version(out)[:2] == rig.version[:2]


def _settings():
    from tests.helpers import default_settings

    return default_settings()


def test_captures_written(rig):
    names = sorted(p.name for p in Path(rig.captures).iterdir())
    print("[slurm captures] %s: %s" % (rig.captures, " ".join(names)))
    assert "show-node-drained-ours.txt" in names
