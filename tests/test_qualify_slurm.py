"""`slurm-hooks qualify --node` against the real slurmctld (tests/slurmcluster.py): the node held in
a maintenance reservation of ours, the qualification a Slurm job in it (the stand-in tools on the
fake node), the outcome enacted through the drain library, the reservation deleted on every path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from slurm_hooks.qualify import reservation_names, through_slurm
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from tests.helpers import default_settings
from tests.slurm_rig import qualification_fake_node
from tests.slurmcluster import SlurmCluster, require_slurm

pytestmark = pytest.mark.slurm
PREFIX = "slurm-hooks:"
STANDINS = os.path.join(os.path.dirname(__file__), "qualify_standins")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_slurm()
    # node2 and node3 have no slurmd (DOWN): the hostlist test's nodes that must be refused
    c = SlurmCluster(tmp_path_factory.mktemp("qualify-slurm"), nodes=("node1", "node2", "node3"))
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def fake():
    yield from qualification_fake_node()


def settings():
    return default_settings()


def wait_responding(cluster, timeout=60.0):
    """node1's slurmd answers slurmctld: after a slurmctld restart, or a ping round of the
    slurmd-less node2/node3, it can show NOT_RESPONDING for a while, and a qualification refuses a
    node that does not respond (the job would wait for it)."""
    import time

    deadline = time.time() + timeout
    while "NOT_RESPONDING" in cluster.node_state("node1") and time.time() < deadline:
        time.sleep(1)


def setup(cluster, fake, tmp_path, fault="", tool_mode=None):
    wait_responding(cluster)
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nroot = "%s"\n[records]\ndir = "%s"\n[qualify]\nib_ports = ["mlx5_0:1"]\n'
        % (fake.root, tmp_path / "records")
    )
    config.chmod(0o600)
    env = dict(cluster.env)
    env["PATH"] = STANDINS + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["QUALIFY_STANDIN_FAULT"] = fault
    if tool_mode:
        env["QUALIFY_STANDIN_" + tool_mode[0].upper()] = tool_mode[1]
    client = SlurmClient(backend=ScontrolBackend(env=cluster.env))
    command = [sys.executable, "-m", "slurm_hooks", "--config", str(config), "qualify"]
    return client, command, env


def drain_ours(cluster, why="slurm-hooks: gpu.memory: gpu:3 row-remap pending -> reset-gpu"):
    cluster.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=" + why)


def reservations(cluster):
    return cluster.run("scontrol", "show", "reservation", check=False)


def reason(cluster):
    line = cluster.show_node_line("node1")
    return line


@pytest.fixture
def clean(cluster):
    yield
    for line in reservations(cluster).splitlines():
        if "ReservationName=" + through_slurm.RESERVATION_PREFIX in line:
            name = line.split("ReservationName=")[1].split()[0]
            cluster.run("scontrol", "delete", "ReservationName=" + name, check=False)
    cluster.scontrol("update", "NodeName=node[1-3]", "State=RESUME", check=False)


def test_a_passing_node_returns_and_the_reservation_goes(cluster, fake, tmp_path, clean):
    client, command, env = setup(cluster, fake, tmp_path)
    drain_ours(cluster)
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["verdict"] == "pass", done
    assert done["enacted"] == "resumed" and done["reservation_deleted"] is True
    assert "DRAIN" not in cluster.node_state("node1")
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    assert done["job_id"] and done["slurm_calls"] <= 9
    print("slurm calls, passing qualification:", done["slurm_calls"])


def test_a_failing_node_is_drained_again_with_the_test_and_its_figure(
    cluster, fake, tmp_path, clean
):
    client, command, env = setup(cluster, fake, tmp_path, fault="x8_link=3")
    drain_ours(cluster)
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["verdict"] == "fail", done
    assert "DRAIN" in cluster.node_state("node1")
    line = reason(cluster)
    assert "sh:qualify: nvbandwidth: nvbandwidth GPU 3 h2d 13.2 GB/s" in line
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    print("slurm calls, failing qualification:", done["slurm_calls"])


def test_an_admins_drain_and_an_in_service_node_are_refused_untouched(
    cluster, fake, tmp_path, clean
):
    client, command, env = setup(cluster, fake, tmp_path)
    cluster.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=admin: new cable")
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["reason"].startswith("refused: node1 is drained by someone else")
    assert "Reason=admin: new cable" in reason(cluster)
    cluster.scontrol("update", "NodeName=node1", "State=RESUME")
    wait_responding(cluster)
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["reason"].startswith("refused: node1 is in service"), done
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)


def test_interrupted_mid_job_the_node_is_drained_back_and_the_reservation_deleted(
    cluster, fake, tmp_path, clean
):
    client, command, env = setup(cluster, fake, tmp_path, tool_mode=("dcgmi", "hang"))
    drain_ours(cluster)
    timer = threading.Timer(6.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        done = through_slurm.qualify_node(
            client, "node1", "quick", settings(), command, str(tmp_path), env
        )
    finally:
        timer.cancel()
    assert done["reason"] == "interrupted by SIGTERM", done
    assert done["enacted"].startswith("drained: sh:qualify: interrupted by SIGTERM")
    assert "DRAIN" in cluster.node_state("node1")
    assert done["reservation_deleted"] is True
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    cluster.run("scancel", "--name=slurm-hooks-qualify", check=False)


def test_the_admin_command_qualifies_a_node_with_one_command(cluster, fake, tmp_path, clean):
    import subprocess

    _client, command, env = setup(cluster, fake, tmp_path, fault="ib_half")
    drain_ours(cluster)
    done = subprocess.run(
        command + ["--node", "node1", "--level", "standard", "--work-dir", str(tmp_path / "work")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "qualify standard on node1: FAIL: ib:mlx5_0:1: ib_write_bw mlx5_0:1 96.2 Gb/s"
        in done.stdout
    )
    assert "reservation_deleted: True" in done.stdout
    assert "Reason=sh:qualify: ib:mlx5_0:1: ib_write_bw mlx5_0:1 96.2 Gb/s" in reason(cluster)


def test_a_reservation_left_by_a_crashed_admin_host_is_swept(cluster, fake, tmp_path, clean):
    client, command, env = setup(cluster, fake, tmp_path)
    stale = through_slurm.reservation_name("node1", now=1.0e9)
    cluster.scontrol(
        "create",
        "reservation",
        "ReservationName=" + stale,
        "Nodes=node1",
        "StartTime=now",
        "Duration=30",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    )
    drain_ours(cluster)
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["stale_reservations_deleted"] == [stale] and done["verdict"] == "pass", done
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)


def test_a_hostlist_is_qualified_node_by_node_and_exits_by_the_worst(
    cluster, fake, tmp_path, clean
):
    import json
    import subprocess

    _client, command, env = setup(cluster, fake, tmp_path)
    drain_ours(cluster)
    ours = "slurm-hooks: gpu.memory: gpu:3 row-remap pending -> reset-gpu"
    cluster.scontrol("update", "NodeName=node2", "State=DRAIN", "Reason=" + ours)  # and DOWN
    cluster.scontrol("update", "NodeName=node3", "State=DRAIN", "Reason=admin: new cable")
    done = subprocess.run(
        command
        + ["--node", "node[1-3]", "--level", "quick", "--json", "--work-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the worst: two refusals
    doc = json.loads(done.stdout)
    assert doc["schema"] == "slurm-hooks.qualify-nodes/1" and doc["exit_code"] == 1
    assert doc["swept"]["deleted"] == [] and "error" not in doc["swept"]  # the run began with it
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert [n["node"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    assert nodes["node1"]["verdict"] == "pass" and nodes["node1"]["enacted"] == "resumed", nodes
    assert nodes["node1"]["exit_code"] == 0
    # no slurmd answers for node2 and node3: DOWN, or not responding yet after an earlier test's
    # resume (idle*: before this was refused, the job waited for the node, holding it)
    for name in ("node2", "node3"):
        assert nodes[name]["reason"].startswith(
            ("refused: %s is DOWN" % name, "refused: %s is not responding" % name)
        ), nodes[name]
    assert "DRAIN" not in cluster.node_state("node1")
    assert "Reason=admin: new cable" in cluster.show_node_line("node3")
    assert ours in cluster.show_node_line("node2")
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    print("slurm calls, hostlist of 3:", sum(n["slurm_calls"] for n in doc["nodes"]))


def create_reservation(cluster, name, node="node1"):
    cluster.scontrol(
        "create",
        "reservation",
        "ReservationName=" + name,
        "Nodes=" + node,
        "StartTime=now",
        "Duration=30",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    )


def test_the_sweep_deletes_only_our_stale_reservations(cluster, fake, tmp_path, clean):
    """Ours and over: deleted (the node its dead run left in service is drained again first).
    Ours and maybe running, an admin's, one with our prefix but not our shape: kept untouched."""
    import json
    import subprocess
    import time

    _client, command, env = setup(cluster, fake, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = through_slurm.owner_host()
    now = time.time()
    stamp = through_slurm.reservation_name("node1", now=now - 60)
    owner_gone = "%s+quick+%d+%s" % (stamp, dead.pid, host)
    too_old = through_slurm.reservation_name("node2", now=now - 6 * 3600)
    running = "%s+quick+%d+%s" % (
        through_slurm.reservation_name("node2", now=now - 60),
        os.getpid(),
        "another-host",
    )
    admins = "maint-node3"
    lookalike = through_slurm.RESERVATION_PREFIX + "node3-by-hand"
    for name, node in (
        (owner_gone, "node1"),
        (too_old, "node2"),
        (running, "node2"),
        (admins, "node3"),
        (lookalike, "node3"),
    ):
        create_reservation(cluster, name, node)
    # node2 (its run is past its bound): drained; node1: its run died after lifting our drain
    # (in service, held by the reservation only)
    cluster.scontrol("update", "NodeName=node2", "State=DRAIN", "Reason=admin: waiting for RMA")
    assert "DRAIN" not in cluster.node_state("node1")
    done = subprocess.run(
        command + ["--sweep", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        doc = json.loads(done.stdout)
        deleted = {d["name"]: d for d in doc["deleted"]}
        assert set(deleted) == {owner_gone, too_old}, doc
        assert "owner (pid %d on %s) is gone" % (dead.pid, host) in deleted[owner_gone]["why"]
        assert "past its longest level's bound" in deleted[too_old]["why"]
        assert deleted[owner_gone]["node_action"].startswith("drained: sh:qualify: ")
        assert deleted[too_old]["node_action"].startswith("left as it is (")  # DOWN or drained
        assert "Reason=admin: waiting for RMA" in cluster.show_node_line("node2")
        assert {k["name"] for k in doc["kept"]} == {running, lookalike}
        listed = reservations(cluster)
        assert owner_gone not in listed and too_old not in listed
        assert running in listed and admins in listed and lookalike in listed
        # never released on an unknown outcome: drained again, by us, naming the run
        assert "DRAIN" in cluster.node_state("node1")
        assert "ended without a verdict" in cluster.show_node_line("node1")
        print("slurm calls, sweep of 5 reservations:", doc["slurm_calls"])
    finally:
        for name in (running, admins, lookalike):
            cluster.run("scontrol", "delete", "ReservationName=" + name, check=False)


def test_an_admins_maintenance_reservation_is_refused_and_ours_is_not_an_obstacle(
    cluster, fake, tmp_path, clean
):
    """The node's MAINT flag cannot tell an admin's maintenance from our own reservation: an
    active reservation of someone else holding the node refuses it, untouched; ours (stale, on
    the same node) is swept and the MAINT flag it left does not stop the qualification."""
    import time

    client, command, env = setup(cluster, fake, tmp_path)
    drain_ours(cluster)
    create_reservation(cluster, "maint-by-admin", "node[1-2]")
    try:
        done = through_slurm.qualify_node(
            client, "node1", "quick", settings(), command, str(tmp_path), env
        )
        assert (
            done["reason"] == "refused: node1 is in the reservation maint-by-admin of someone else"
        )
        assert "maint-by-admin" in reservations(cluster) and "DRAIN" in cluster.node_state("node1")
    finally:
        cluster.run("scontrol", "delete", "ReservationName=maint-by-admin", check=False)
    # Our run of a minute ago whose owner is gone. Not this test's own pid: where the checkout's
    # path says "slurm-hooks" (the CI roots' /root/slurm-hooks) the sweep rightly takes this
    # pytest for a live run of ours.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = "%s+quick+%d+%s" % (
        through_slurm.reservation_name("node1", now=time.time() - 60),
        gone.pid,
        reservation_names.owner_host(),
    )
    create_reservation(cluster, stale)
    deadline = time.time() + 90  # slurmctld sets MAINT on the node at its next reservation pass
    while "MAINT" not in cluster.node_state("node1") and time.time() < deadline:
        time.sleep(1)
    assert "MAINT" in cluster.node_state("node1")
    done = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["verdict"] == "pass" and done["stale_reservations_deleted"] == [stale], repr(done)
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)


def write_queue(state_dir, node="node1"):
    import json
    import time

    os.makedirs(str(state_dir), exist_ok=True)
    straggler = (
        "sh:fleet.straggler: throttle_frac.hw_slowdown 0.2 vs 0 of its job peers (higher is "
        "worse), 12 of its last 10 jobs, worst z 41 (job 111) -> drain"
    )
    entry = {"time": time.time(), "metric": "throttle_frac.hw_slowdown", "straggler": straggler}
    (state_dir / "qualify-queue.json").write_text(
        json.dumps({"queued": {node: entry}, "passed": {}})
    )


def due_run(cluster, fake, tmp_path, fault=""):
    import json
    import subprocess

    _client, command, env = setup(cluster, fake, tmp_path, fault=fault)
    config = tmp_path / "config.toml"
    config.write_text(
        config.read_text().replace("[general]\n", '[general]\nmode = "enforce"\n')
        + '[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
        '[drain]\nbackend = "scontrol"\n' % (tmp_path / "state")
    )
    done = subprocess.run(
        command + ["--due", "--level", "quick", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done, json.loads(done.stdout or "null")


def test_a_queued_straggler_that_fails_its_qualification_is_drained_with_both_figures(
    cluster, fake, tmp_path, clean
):
    write_queue(tmp_path / "state")
    done, doc = due_run(cluster, fake, tmp_path, fault="x8_link=3")
    assert done.returncode == 2, done.stdout + done.stderr  # a finding: the node is drained
    (node,) = doc["due"]
    assert (node["node"], node["kind"], node["verdict"]) == ("node1", "straggler", "fail")
    assert node["enacted"].startswith("drained: "), node
    line = cluster.show_node_line("node1")
    assert "DRAIN" in cluster.node_state("node1")
    assert "Reason=sh:fleet.straggler: qualify nvbandwidth: nvbandwidth GPU 3 h2d 13.2" in line
    assert "straggler throttle_frac.hw_slowdown 0.2 vs 0" in line
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    queued = (tmp_path / "state" / "qualify-queue.json").read_text()
    assert '"queued": {}' in queued
    print("slurm calls, --due of a failing straggler:", node["slurm_calls"])


def test_a_queued_straggler_that_passes_stays_in_service_and_is_remembered(
    cluster, fake, tmp_path, clean
):
    import json

    write_queue(tmp_path / "state")
    drain_ours(cluster, "slurm-hooks: gpu.count: gpu:0 GPU 0 fell off the bus -> reboot")
    cluster.scontrol("update", "NodeName=node1", "State=RESUME")  # in service (idle) again
    done, doc = due_run(cluster, fake, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (node,) = doc["due"]
    assert node["verdict"] == "pass" and node["enacted"].startswith("left in service"), node
    assert "DRAIN" not in cluster.node_state("node1")
    saved = json.loads((tmp_path / "state" / "qualify-queue.json").read_text())
    assert saved["queued"] == {} and "node1" in saved["passed"]
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    print("slurm calls, --due of a passing straggler:", node["slurm_calls"])
    # drained by us for a reboot that has not happened: not due, said so
    drain_ours(cluster, "slurm-hooks: gpu.count: gpu:0 GPU 0 fell off the bus -> reboot")
    done, doc = due_run(cluster, fake, tmp_path)
    assert done.returncode == 0 and doc["due"] == [], done.stdout + done.stderr
    assert {
        "node": "node1",
        "kind": "repaired",
        "why": "drained for reboot, not rebooted since",
    } in (doc["waiting"])


@pytest.mark.parametrize("fault", ["", "x8_link=3"])
def test_a_slurmctld_restart_mid_run_leaves_no_reservation_and_the_node_as_it_should_be(
    cluster, fake, tmp_path, clean, fault
):
    """slurmctld restarts while the qualification job runs (the stand-ins take 4 s each): the
    reservation (state slurmctld keeps across the restart) is deleted, and the node is in service
    only on a verdict of pass read from the job's own output; any other outcome, an unknown one
    included (sbatch --wait losing its job), leaves it drained by us."""
    client, command, env = setup(cluster, fake, tmp_path, fault=fault)
    env["QUALIFY_STANDIN_DELAY_S"] = "4"
    drain_ours(cluster)
    restart = threading.Timer(5.0, cluster.restart_ctld)
    restart.start()
    try:
        done = through_slurm.qualify_node(
            client, "node1", "quick", settings(), command, str(tmp_path), env
        )
    finally:
        restart.join()
    assert done["reservation_deleted"] is True, done
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    if fault:
        assert done["verdict"] != "pass", done
    if done["verdict"] == "pass":
        assert done["enacted"] == "resumed" and "DRAIN" not in cluster.node_state("node1")
    else:
        assert done["enacted"].startswith("drained: sh:qualify: "), done
        assert "DRAIN" in cluster.node_state("node1")
        assert "Reason=sh:qualify: " in cluster.show_node_line("node1")
    print("after a slurmctld restart (%s):" % (fault or "healthy"), done["verdict"], done["reason"])


def test_slurmctld_down_across_the_end_of_the_job_never_releases_the_node(
    cluster, fake, tmp_path, clean
):
    """slurmctld stops while the job runs and comes back 25 s later, after the job's end: whatever
    sbatch --wait makes of it, the reservation is gone once slurmctld answers again (by this run, or
    by the sweep of the next one), and the node is in service only on a pass."""
    from slurm_hooks.qualify import sweep

    client, command, env = setup(cluster, fake, tmp_path, fault="x8_link=3")
    env["QUALIFY_STANDIN_DELAY_S"] = "3"
    drain_ours(cluster)
    stop = threading.Timer(5.0, cluster.stop_ctld)
    start = threading.Timer(30.0, cluster.start_ctld)
    stop.start()
    start.start()
    try:
        done = through_slurm.qualify_node(
            client, "node1", "quick", settings(), command, str(tmp_path), env
        )
    finally:
        stop.join()
        start.join()
    print("slurmctld down across the job's end:", done)
    if not done.get("reservation_deleted"):
        swept = sweep.sweep(client, settings(), dict(cluster.env), alive=lambda pid: False)
        assert [d["node"] for d in swept["deleted"]] == ["node1"], swept
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
    assert done["verdict"] != "pass"
    assert "DRAIN" in cluster.node_state("node1"), cluster.show_node_line("node1")


def test_a_job_cancelled_before_it_ran_never_releases_the_node_on_an_old_pass(
    cluster, fake, tmp_path, clean
):
    """A passing run leaves its output (qualify-node1.out, a pass) in the work dir. The node is
    drained again, and the next qualification's job is cancelled while it waits (the partition is
    down, an admin's scancel): `sbatch --wait` exits 0 for a job that never ran (Slurm's sbatch.c
    _job_wait: WIFEXITED of the exit code 0 of a never-started job), so the old pass must not be
    read as this job's verdict."""
    import time

    client, command, env = setup(cluster, fake, tmp_path)
    drain_ours(cluster)
    first = through_slurm.qualify_node(
        client, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert first["verdict"] == "pass", first
    assert (tmp_path / "qualify-node1.out").exists()
    drain_ours(cluster)
    cluster.scontrol("update", "PartitionName=debug", "State=DOWN")
    box = []
    runner = threading.Thread(
        target=lambda: box.append(
            through_slurm.qualify_node(
                client, "node1", "quick", settings(), command, str(tmp_path), env
            )
        )
    )
    runner.start()
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            pending = cluster.run(
                "squeue", "-h", "-t", "PENDING", "-n", "slurm-hooks-qualify", "-o", "%i"
            ).split()
            if pending:
                cluster.run("scancel", *pending)
                break
            time.sleep(0.3)
        runner.join(60)
    finally:
        cluster.scontrol("update", "PartitionName=debug", "State=UP")
    assert pending, "the job never showed as pending"
    done = box[0]
    print("a job cancelled before it ran:", done)
    assert done["verdict"] != "pass", done
    assert "DRAIN" in cluster.node_state("node1"), cluster.show_node_line("node1")
    assert done["reservation_deleted"] is True


def test_a_module_planted_in_the_jobs_directory_never_runs_as_the_qualification(
    cluster, fake, tmp_path, clean
):
    """The admin runs the installed `slurm-hooks qualify --node` from a directory a user can write
    (/tmp; and where the submit directory is missing on the node, Slurm runs the job in /tmp). A
    user left a `slurm_hooks` package there that prints a pass and exits 0: `python -m` puts the
    working directory first on sys.path, so the job ran it, as root, and the node came back. The
    node fails its real qualification here (x8_link=3), so it must stay drained."""
    import subprocess

    _client, command, env = setup(cluster, fake, tmp_path, fault="x8_link=3")
    drain_ours(cluster)
    shared = tmp_path / "shared"
    (shared / "slurm_hooks").mkdir(parents=True)
    forged = '{"verdict": "pass", "reason": "planted", "node": "node1"}'
    (shared / "slurm_hooks" / "__init__.py").write_text("")
    (shared / "slurm_hooks" / "__main__.py").write_text("print(%r)\n" % forged)
    installed = os.path.join(os.path.dirname(sys.executable), "slurm-hooks")
    done = subprocess.run(
        [installed] + command[3:] + ["--node", "node1", "--work-dir", str(tmp_path / "work")],
        env=env,
        cwd=str(shared),
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout, done.stderr)
    assert "planted" not in done.stdout
    assert done.returncode == 2, done.stdout + done.stderr
    assert "DRAIN" in cluster.node_state("node1"), cluster.show_node_line("node1")


def test_a_live_run_of_another_host_on_the_same_node_is_not_swept_from_under_it(
    cluster, fake, tmp_path, clean
):
    """Two admins qualify node1 at once, from two hosts: the other run's reservation (its owner on
    another host, started a minute ago: it may still be running) is not deleted by ours (that would
    cancel its job through _delete_reservation's scancel); ours is refused, the node untouched."""
    import time

    client, command, env = setup(cluster, fake, tmp_path)
    drain_ours(cluster)
    other = "%s+quick+%d+%s" % (
        through_slurm.reservation_name("node1", now=time.time() - 60),
        os.getpid(),
        "another-host",
    )
    create_reservation(cluster, other)
    try:
        done = through_slurm.qualify_node(
            client, "node1", "quick", settings(), command, str(tmp_path), env
        )
        assert other in reservations(cluster), done
        assert done["reason"] == "refused: node1 is being qualified by %s" % other, done
        assert "DRAIN" in cluster.node_state("node1")
    finally:
        cluster.run("scontrol", "delete", "ReservationName=" + other, check=False)


def test_a_failed_node_that_cannot_be_drained_back_stays_held_by_the_reservation(
    cluster, fake, tmp_path, clean
):
    """The node fails its qualification, and slurmctld does not take the drain back (a timeout on
    that one call; it answers again right after): deleting the reservation then would put a node
    that just failed back in service. The reservation stays and holds it; the sweep, once this run
    is gone, drains it and only then deletes it."""
    from slurm_hooks.qualify import sweep
    from slurm_hooks.slurm.errors import SlurmUnavailable

    client, command, env = setup(cluster, fake, tmp_path, fault="x8_link=3")
    drain_ours(cluster)

    class DrainTimesOut(ScontrolBackend):
        def drain(self, name, reason):
            raise SlurmUnavailable("scontrol update timed out after 5.0 s")

    flaky = SlurmClient(backend=DrainTimesOut(env=cluster.env))
    done = through_slurm.qualify_node(
        flaky, "node1", "quick", settings(), command, str(tmp_path), env
    )
    assert done["verdict"] == "fail", done
    assert done["enacted"].startswith("drain back FAILED"), done
    assert done["reservation_deleted"] is False, done
    assert done["reservation"] in reservations(cluster)  # the node takes no job meanwhile
    swept = sweep.sweep(client, settings(), dict(cluster.env), alive=lambda pid: False)
    assert [d["node"] for d in swept["deleted"]] == ["node1"], swept
    assert "DRAIN" in cluster.node_state("node1"), cluster.show_node_line("node1")
    assert through_slurm.RESERVATION_PREFIX not in reservations(cluster)
