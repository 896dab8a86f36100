"""The throw-away Slurm cluster fixture works, and what it shows about Slurm is recorded here."""

from __future__ import annotations

import os
import time

import pytest

from tests import slurmcluster
from tests.slurmcluster import (
    SlurmCluster,
    SlurmNotInstalled,
    node_registered,
    require_slurm,
    slurm_cluster_factory,  # noqa: F401 - fixture (until conftest imports it)
)

PROLOG_NAMES = ("10-first", "20-second", "30-third")


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("hooks")
    out = d / "out"
    out.mkdir()
    for name in PROLOG_NAMES:  # each appends its name and dumps the environment
        p = d / "prolog.d" / name
        p.parent.mkdir(exist_ok=True)
        p.write_text(
            "#!/bin/sh\necho %s >> %s/order.$SLURM_JOB_ID\nenv | sort > %s/%s.$SLURM_JOB_ID.env\n"
            % (name, out, out, name)
        )
        p.chmod(0o755)
    epilog = d / "epilog.sh"
    epilog.write_text("#!/bin/sh\nenv | sort > %s/epilog.$SLURM_JOB_ID.env\n" % out)
    epilog.chmod(0o755)
    c = slurm_cluster_factory(
        "fixture",
        nodes=("node1", "node2", "node3"),
        prolog=str(d / "prolog.d" / "*"),
        epilog=str(epilog),
    )
    c.hook_out = out
    return c


@pytest.mark.slurm
def test_cluster_starts_fast_with_idle_node(cluster):
    assert cluster.start_seconds is not None and cluster.start_seconds < 5.0, cluster.start_seconds
    print("cluster start: %.2fs" % cluster.start_seconds)
    assert cluster.node_state("node1") == "IDLE"
    assert cluster.sinfo_state("node1") == "idle"
    assert cluster.ctld_port not in (6817, 6818) or cluster.slurmd_port not in (6817, 6818)
    assert os.environ.get("SLURM_CONF") != str(cluster.conf)  # only cluster.env points at it
    assert cluster.env["SLURM_CONF"] == str(cluster.conf)


@pytest.mark.slurm
def test_extra_nodes_have_no_slurmd_and_can_be_drained(cluster):
    """node2/node3: defined, no slurmd. They show DOWN (no reason; +NOT_RESPONDING after the first
    ping) and accept DRAIN with a reason: State=DOWN+DRAIN, sinfo 'drained'. Used to simulate
    'other nodes already drained by us' for the circuit breaker."""
    st = cluster.node_state("node2")
    assert st.split("+")[0] == "DOWN", st
    cluster.scontrol(
        "update", "NodeName=node2", "State=DRAIN", "Reason=slurm-hooks: gpu.ecc: simulated"
    )
    st = cluster.node_state("node2")
    assert set(st.split("+")) >= {"DOWN", "DRAIN"}, st
    assert cluster.node_reason("node2").startswith("slurm-hooks: gpu.ecc: simulated [root@")
    assert cluster.sinfo_state("node2") == "drained"
    # an unknown node is refused, and DRAIN without a reason is refused by scontrol
    with pytest.raises(slurmcluster.SlurmClusterError, match="Invalid node name"):
        cluster.scontrol("update", "NodeName=node99", "State=DRAIN", "Reason=x")
    with pytest.raises(slurmcluster.SlurmClusterError):
        cluster.scontrol("update", "NodeName=node3", "State=DRAIN")


@pytest.mark.slurm
def test_batch_job_with_gpus_runs_prolog_glob_in_reverse_order(cluster):
    job = cluster.sbatch(gpus=2)
    assert cluster.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    out = cluster.hook_out
    order = (out / ("order.%d" % job)).read_text().split()
    assert order == sorted(
        PROLOG_NAMES, reverse=True
    )  # Prolog=/dir/prolog.d/* : reverse alphabetical
    env = dict(
        line.split("=", 1)
        for line in (out / ("10-first.%d.env" % job)).read_text().splitlines()
        if "=" in line
    )
    assert env["SLURM_JOB_GPUS"] == "0,1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd"
    assert env["SLURMD_NODENAME"] == "node1"
    assert env["SLURM_JOB_ID"] == str(job)
    deadline = time.monotonic() + 10
    while not (out / ("epilog.%d.env" % job)).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    epi = (out / ("epilog.%d.env" % job)).read_text()
    assert "SLURM_SCRIPT_CONTEXT=epilog_slurmd" in epi and "SLURM_JOB_EXIT_CODE=" in epi


@pytest.mark.slurm
def test_restart_and_sigstop_controller_keep_drain(cluster):
    cluster.scontrol(
        "update", "NodeName=node1", "State=DRAIN", "Reason=slurm-hooks: kept over restart"
    )
    t0 = time.monotonic()
    cluster.restart_ctld()
    restart = time.monotonic() - t0
    assert restart < 5.0, restart
    st = cluster.node_state("node1")
    assert node_registered(st) and "DRAIN" in st.split("+"), st
    assert cluster.node_reason("node1").startswith("slurm-hooks: kept over restart [")
    cluster.sigstop_ctld()
    cluster.sigcont_ctld()
    cluster.scontrol("update", "NodeName=node1", "State=RESUME")
    cluster.wait_state("node1", "IDLE", timeout=10)


def test_require_slurm_skips_or_fails(monkeypatch):
    monkeypatch.setattr(slurmcluster, "find_binary", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(SlurmNotInstalled, match="CI=true"):
        require_slurm()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="real Slurm unavailable"):
        require_slurm()
    with pytest.raises(SlurmNotInstalled):
        SlurmCluster("/nonexistent", nodes=("node1",)).start()


def test_config_text(monkeypatch, tmp_path):
    monkeypatch.setattr(
        slurmcluster,
        "_HW_CACHE",
        {
            "CPUs": "4",
            "Boards": "1",
            "SocketsPerBoard": "1",
            "CoresPerSocket": "4",
            "ThreadsPerCore": "1",
        },
    )
    c = SlurmCluster(
        tmp_path,
        nodes=("node1", "node2"),
        prolog="/p/prolog.d/*",
        health_check="/bin/true",
        extra_conf="SchedulerParameters=nohold_on_prolog_fail",
    )
    text = c.slurm_conf_text()
    assert "Prolog=/p/prolog.d/*\n" in text and "Epilog=" not in text
    assert "SlurmctldPort=%d\n" % c.ctld_port in text and "SlurmdPort=%d\n" % c.slurmd_port in text
    assert "NodeName=node1 NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=4 " in text
    assert "NodeName=node2 NodeAddr=127.0.0.1 NodeHostname=localhost Port=%d " % c.dead_port in text
    assert "Gres=gpu:8" in text and "HealthCheckProgram=/bin/true" in text
    assert text.rstrip().endswith("SchedulerParameters=nohold_on_prolog_fail")
    assert len({c.ctld_port, c.slurmd_port, c.dead_port}) == 3


# ----------------------------------------------------------------------------------------------
# the munged a session started is stopped at its end, never one that ran before it


@pytest.mark.parametrize(
    "before, started, now, stopped",
    [
        (None, [], None, None),  # no munged, none started
        (None, [4242], 4242, 4242),  # none ran before; a worker started this one
        (None, [], 4242, None),  # started meanwhile, by no cluster of ours (another suite's)
        (4242, [], 4242, None),  # ran before the session: never stopped
        (4242, [4242], 4242, None),  # the same, whatever a worker says
        (17, [4242], 4242, 4242),  # the one before died; ours replaced it
        (None, [4242], 5151, None),  # ours died; another (not ours) runs now
        (None, [4242], None, None),  # ours is already gone
    ],
)
def test_munge_to_stop(before, started, now, stopped):
    assert slurmcluster.munge_to_stop(before, started, now) == stopped


def _start_private_munged(directory):
    """munged in the foreground (this process reaps it: no zombie left under an init that does not)
    on a socket and pid file of its own under `directory`, never the host's: (Popen, its pid)."""
    import subprocess

    key = os.path.join(directory, "munge.key")
    if not os.path.exists(key):
        with open(key, "wb") as handle:
            handle.write(os.urandom(1024))
        os.chmod(key, 0o400)
    argv = [slurmcluster.find_binary("munged") or "munged", "--foreground"]
    for option, name in (
        ("socket", "socket"),
        ("pid-file", "munged.pid"),
        ("key-file", "munge.key"),
        ("seed-file", "munged.seed"),
        ("log-file", "munged.log"),
    ):
        argv.append("--%s=%s" % (option, os.path.join(directory, name)))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    pid = None
    while pid is None and proc.poll() is None and time.monotonic() < deadline:
        pid = slurmcluster.munged_pid(os.path.join(directory, "munged.pid"))
        time.sleep(0.01)
    assert pid == proc.pid, open(os.path.join(directory, "munged.log")).read()
    return proc


def test_the_session_stops_the_munged_it_started_and_leaves_the_one_it_found(monkeypatch):
    """A real munged (private socket and pid file). Found running when the session began: left
    running at its end. Started during the session by a worker's cluster: stopped at its end, by the
    controller, from the worker's report."""
    import shutil
    import tempfile
    import types

    if slurmcluster.find_binary("munged") is None or os.geteuid() != 0:
        pytest.skip("needs munged and root")
    monkeypatch.setattr(slurmcluster, "STARTED_MUNGED", [])
    directory = tempfile.mkdtemp(prefix="slurm-hooks-munged-")
    os.chmod(directory, 0o755)  # munged wants its socket's directory searchable by all
    pid_file = os.path.join(directory, "munged.pid")
    controller = types.SimpleNamespace()
    started = []
    try:
        started.append(_start_private_munged(directory))
        keeper = slurmcluster.MungedKeeper(controller, pid_file=pid_file)
        assert not keeper.worker and keeper.before == started[0].pid
        keeper.pytest_sessionfinish(types.SimpleNamespace(config=controller))
        assert slurmcluster.munged_pid(pid_file) == started[0].pid  # ran before: still running
        assert slurmcluster.stop_munged(started[0].pid)
        assert slurmcluster.munged_pid(pid_file) is None

        keeper = slurmcluster.MungedKeeper(controller, pid_file=pid_file)
        assert keeper.before is None
        started.append(_start_private_munged(directory))
        report = {slurmcluster.MUNGED_STARTED_KEY: [started[1].pid]}
        keeper.pytest_testnodedown(types.SimpleNamespace(workeroutput=report), None)
        keeper.pytest_sessionfinish(types.SimpleNamespace(config=controller))
        assert slurmcluster.munged_pid(pid_file) is None
        assert started[1].wait(5) == 0  # it ended on SIGTERM, cleanly
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_worker_reports_the_munged_it_started_and_stops_none(monkeypatch, request):
    """An xdist worker only reports (workeroutput); the controller decides once all are done. The
    suite's conftest registers the plugin, in workers and controller alike."""
    import types

    registered = request.config.pluginmanager.get_plugin(slurmcluster.MungedKeeper.name)
    assert isinstance(registered, slurmcluster.MungedKeeper)
    assert registered.worker == hasattr(request.config, "workerinput")

    def never(pid, timeout=5.0):
        raise AssertionError("a worker stopped munged %d" % pid)

    monkeypatch.setattr(slurmcluster, "stop_munged", never)
    monkeypatch.setattr(slurmcluster, "STARTED_MUNGED", [4242])
    config = types.SimpleNamespace(workerinput={}, workeroutput={})
    keeper = slurmcluster.MungedKeeper(config)
    assert keeper.worker and keeper.before is None
    keeper.pytest_sessionfinish(types.SimpleNamespace(config=config))
    assert config.workeroutput == {slurmcluster.MUNGED_STARTED_KEY: [4242]}


def test_workers_starting_clusters_at_once_start_one_munged(monkeypatch, tmp_path):
    """Four workers' first clusters at the same moment, no munged running: one starts it, the other
    three wait and find it (each used to start its own with --force: three munged were left behind
    by one run, two of them on unlinked sockets). Only the one that started it records it."""
    import threading

    running = threading.Event()
    starts = []

    def start(timeout):
        starts.append(threading.get_ident())
        time.sleep(0.2)  # runuser, munged's start-up
        running.set()

    monkeypatch.setattr(slurmcluster, "MUNGE_RUN", str(tmp_path / "munge"))
    monkeypatch.setattr(slurmcluster, "munge_ok", running.is_set)
    monkeypatch.setattr(slurmcluster, "_start_munged", start)
    monkeypatch.setattr(slurmcluster, "munged_pid", lambda pid_file=None: 4242)
    monkeypatch.setattr(slurmcluster, "STARTED_MUNGED", [])
    together = threading.Barrier(4)
    answers = []

    def worker():
        together.wait()
        answers.append(slurmcluster.ensure_munge(timeout=5.0))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(starts) == 1 and sorted(answers) == [False, False, False, True]
    assert slurmcluster.STARTED_MUNGED == [4242]
