"""End to end against a real slurmctld + slurmd: real jobs, the REAL prolog.d/epilog.d scripts (as
`Prolog=<dir>/prolog.d/*` globs in slurm.conf) and a fake GPU node (tests/fakenode).

The scripts in prolog.d/ and epilog.d/ exec /usr/bin/slurm-hooks, and slurmd gives a hook a
minimal environment of its own (no PATH; the prolog gets SLURM_CONF, HealthCheckProgram not even
that). So the module copies them, replacing only that token with a generated wrapper that points
slurm-hooks at a temp config, the fake node's NVML (LD_LIBRARY_PATH, FAKE_NVML_STATE) and this
cluster's slurm.conf, then execs this virtualenv's slurm-hooks. Everything else is what an admin
installs. Our decisions are read back from the decision log (one key=value line each).

One cluster per module (node1 with a slurmd and 8 fake GPUs; node2/node3 defined but without a
slurmd, used as "other nodes" for the circuit breaker). `hooks` resets it between tests: jobs
cancelled, faults cleared, drains lifted, local state removed, default config written.
Timings are printed (run with -s to see them).
"""

from __future__ import annotations

import difflib
import json
import os
import statistics
import time
from typing import List

import pytest

from tests.slurm_rig import (
    DIRECT_JOB_ID,
    GPU_FAULT,
    HOOK_KINDS,
    INSTALLED_BINARY,
    NODES,
    PACKAGED_HEALTHCHECK,
    PROLOG_EPILOG_TIMEOUT,
    REASON_PREFIX,
    REPO,
    ctld_reason,
    is_drained,
    report,
    start_rig,
)
from tests.slurmcluster import SlurmCluster, drain_backend_under_test, unreachable_slurm_cost

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = start_rig(tmp_path_factory.mktemp("e2e"))
    yield r
    r.stop()


@pytest.fixture
def hooks(rig):
    rig.reset()
    yield rig
    rig.reset()


# ------------------------------------------------------------------------------------------------
# the installed scripts


def test_hook_copies_differ_from_the_real_scripts_by_the_binary_path_only(rig):
    for kind in HOOK_KINDS:
        real = (REPO / ("%s.d" % kind) / "50-slurm-hooks").read_text()
        copy = rig.hook_script(kind).read_text()
        assert real.count(INSTALLED_BINARY) == 1 and "\n%s %s\n" % (INSTALLED_BINARY, kind) in real
        changed = [(a, b) for a, b in zip(real.splitlines(), copy.splitlines()) if a != b]
        assert len(real.splitlines()) == len(copy.splitlines()) and len(changed) == 1, "".join(
            difflib.unified_diff(real.splitlines(True), copy.splitlines(True))
        )
        assert changed[0][1] == changed[0][0].replace(INSTALLED_BINARY, str(rig.wrapper))
        assert os.access(str(rig.hook_script(kind)), os.X_OK)
    if PACKAGED_HEALTHCHECK.exists():
        real = PACKAGED_HEALTHCHECK.read_text()
        assert real.count(INSTALLED_BINARY) == 1
        assert (rig.hooks_dir / "health").read_text() == real.replace(
            INSTALLED_BINARY, str(rig.wrapper)
        )
    conf = rig.cluster.conf.read_text()
    assert (
        "Prolog=%s/prolog.d/*\n" % rig.hooks_dir in conf
        and "Epilog=%s/epilog.d/*\n" % rig.hooks_dir in conf
    )
    assert "PrologFlags=Alloc,Contain\n" in conf


def test_slurmd_runs_health_check_at_startup_and_rebuilds_local_state_once(rig):
    """slurmd runs HealthCheckProgram once before it registers. A first start (or a diskless node)
    has no local state: that run asks Slurm once whether a drain of ours is on the node and writes
    the state; a healthy node's runs after that make no Slurm call. The node name comes from
    slurmd's SLURMD_NODENAME (the wrapper does not set it)."""
    rig.log_offset = 0
    level, kv = rig.wait_decision("health", timeout=5)
    assert (level, kv["node"], kv["decision"], kv["status"], kv["slurm_calls"], kv["outcome"]) == (
        "INFO",
        "node1",
        "pass",
        "OK",
        "1",
        "not-drained",
    ), kv
    assert "no drain of ours" in kv["detail"]
    assert "SLURMD_NODENAME" not in rig.wrapper.read_text()
    assert rig.local_state() == {}
    rig.log_offset = rig.log_file.stat().st_size
    assert rig.run_health()[0] == 0
    level, kv = rig.wait_decision("health")
    assert (kv["decision"], kv["slurm_calls"]) == ("pass", "0"), kv


# ------------------------------------------------------------------------------------------------
# 1. healthy node


def test_healthy_node_runs_job_and_makes_no_slurm_call(hooks):
    c = hooks.cluster
    job = c.sbatch(gpus=2)
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    level, prolog = hooks.wait_decision("prolog", job)
    assert (
        level,
        prolog["decision"],
        prolog["status"],
        prolog["node"],
        prolog["user"],
        prolog["slurm_calls"],
    ) == ("INFO", "pass", "OK", "node1", "root", "0"), prolog
    level, epilog = hooks.wait_decision("epilog", job)
    assert (level, epilog["decision"], epilog["slurm_calls"]) == ("INFO", "pass", "0"), epilog
    assert "outcome" not in prolog and "outcome" not in epilog
    assert c.node_state("node1") == "IDLE" and c.node_reason("node1") is None
    assert hooks.local_state() == {}
    record = json.loads((hooks.state_dir / "jobs" / "node1" / ("%s.json" % job)).read_text())
    assert record["job"]["id"] == str(job) and record["prolog_snapshot"] != "missing", record.get(
        "prolog_snapshot"
    )
    report("prolog checks (healthy, 2 GPUs)", int(prolog["duration_ms"]) / 1000.0)


# ------------------------------------------------------------------------------------------------
# 2. GPU fault -> our drain, job requeued and held


def test_gpu_fault_drains_with_our_reason_and_requeues_the_job_held(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    start = time.monotonic()
    job = c.sbatch(gpus=1)
    c.wait_state("node1", is_drained, timeout=30)
    report("sbatch -> node DRAIN (our reason)", time.monotonic() - start)
    level, prolog = hooks.wait_decision("prolog", job)
    assert (level, prolog["decision"], prolog["blame"], prolog["outcome"], prolog["check"]) == (
        "ERROR",
        "drain",
        "node",
        "drained",
        "gpu.count",
    ), prolog
    assert prolog["slurm_calls"] == "4", prolog  # show node, breaker count, drain, breaker re-count
    reason = ctld_reason(c)
    assert reason == prolog["reason"], (reason, prolog)
    assert (
        reason.startswith("sh:gpu.count g0: gpu:0 0000:18:00.0 GPU 0: nvmlDeviceGetHandleByIndex: ")
        and "GPU is lost) -> reboot" in reason
        and len(reason) <= 200
    ), reason
    assert "Prolog error" not in reason
    # slurmctld requeues a batch job whose prolog failed, held (SchedulerParameters=nohold_on_prolog_fail
    # would leave it eligible for other nodes); the drain reason we set before exiting 1 is kept
    deadline = time.monotonic() + 20
    while not (c.job_state(job) == "PENDING" and c.job_field(job, "Restarts") == "1"):
        assert time.monotonic() < deadline, c.scontrol("show", "job", str(job))
        time.sleep(0.1)
    assert c.job_field(job, "Reason") == "launch_failed_requeued_held", c.scontrol(
        "show", "job", str(job)
    )
    assert c.job_field(job, "Priority") == "0"  # held
    level, epilog = hooks.wait_decision("epilog", job)  # the epilog runs after a failed prolog, too
    assert (epilog["decision"], epilog["outcome"]) == ("drain", "already-drained-by-us"), epilog
    assert ctld_reason(c) == reason and is_drained(c.node_state("node1"))
    state = hooks.local_state()
    assert state["drained"]["checks"] == ["gpu.count"] and state["drained"]["job"] == str(job)
    assert state["drained"]["reason"] == reason and "pending" not in state


def test_a_requeued_job_keeps_the_record_of_its_drained_first_run(hooks):
    """Real slurmd: the run whose prolog drained the node is requeued under the same job id; its
    rerun (SLURM_JOB_RESTART_COUNT=1 in the prolog and epilog environment) writes <job>.r1.json
    beside the first run's <job>.json instead of replacing it (tracker 23)."""
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    job = c.sbatch(gpus=1)
    c.wait_state("node1", is_drained, timeout=30)
    hooks.wait_decision("epilog", job)  # the first run's epilog, after its failed prolog
    first = hooks.state_dir / "jobs" / "node1" / ("%s.json" % job)
    deadline = time.monotonic() + 20
    while not first.exists():
        assert time.monotonic() < deadline, sorted(os.listdir(str(first.parent)))
        time.sleep(0.1)
    hooks.fake.clear_faults()
    assert hooks.run_health()[0] == 0  # repaired: our drain is resumed
    c.wait_state("node1", "IDLE", timeout=15)
    c.scontrol("release", str(job))
    c.scontrol("update", "jobid=%s" % job, "starttime=now")  # the rerun: eligible now
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED", c.scontrol(
        "show", "job", str(job)
    )
    rerun = first.parent / ("%s.r1.json" % job)
    deadline = time.monotonic() + 20
    while not rerun.exists():
        assert time.monotonic() < deadline, sorted(os.listdir(str(first.parent)))
        time.sleep(0.1)
    records = [json.loads(path.read_text()) for path in (first, rerun)]
    assert [r["job"]["restart_count"] for r in records] == [0, 1]
    assert "drained" in records[0]["summary"]["abnormal"] or records[0]["decision"], records[0]


# ------------------------------------------------------------------------------------------------
# 3. health resumes our drains, and only ours


def test_health_resumes_our_drain_once_the_checks_pass_again(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    rc, seconds, err = hooks.run_prolog()
    assert rc == 1, err
    report("direct prolog run that drains (rc 1)", seconds)
    reason = ctld_reason(c)
    assert is_drained(c.node_state("node1")) and reason.startswith("sh:gpu.count g0: "), reason
    # still broken: the health run re-runs the check, keeps the drain and changes nothing
    rc, _, err = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["decision"], kv["outcome"], kv["slurm_calls"]) == (
        1,
        "drain",
        "already-drained-by-us",
        "1",
    ), kv
    assert ctld_reason(c) == reason
    # repaired: the next health run resumes the node
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    start = time.monotonic()
    rc, seconds, err = hooks.run_health()
    c.wait_state("node1", "IDLE", timeout=15)
    report("health run (resume) -> node IDLE", time.monotonic() - start)
    level, kv = hooks.wait_decision("health")
    assert (rc, level, kv["decision"], kv["outcome"], kv["slurm_calls"]) == (
        0,
        "INFO",
        "pass",
        "resumed",
        "2",
    ), kv
    # 22.05/26.05 clear the reason at RESUME; 24.11 and 25.11 (accounting_storage/none) keep the one our
    # RESUME set, which is not one of our drain reasons (slurmcluster.RESUME_KEEPS_REASON)
    assert (ctld_reason(c) or None) in c.reasons_after_resume(
        "resumed by slurm-hooks: gpu.count passed"
    ), c.node_reason("node1")
    assert hooks.local_state() == {}
    job = c.sbatch(gpus=1)  # and it takes jobs again
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"


def test_admin_drain_is_never_resumed_nor_re_reasoned(hooks):
    c = hooks.cluster
    admin = "admin: BIOS update"
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=" + admin)
    # healthy and nothing of ours recorded: no Slurm call at all
    rc, _, _ = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["decision"], kv["slurm_calls"]) == (0, "pass", "0"), kv
    # broken while an admin holds the node: the admin's reason stays
    hooks.fake.inject_fault(*GPU_FAULT)
    for run in (hooks.run_health, hooks.run_prolog):
        hooks.log_offset = hooks.log_file.stat().st_size
        rc, _, _ = run()
        level, kv = hooks.wait_decision("health" if run == hooks.run_health else "prolog")
        assert (rc, kv["decision"], kv["outcome"]) == (1, "drain", "foreign-drain-kept"), kv
        assert ctld_reason(c) == admin and is_drained(c.node_state("node1"))
    hooks.fake.clear_faults()
    rc, _, _ = hooks.run_health()
    assert (
        ctld_reason(c) == admin and is_drained(c.node_state("node1")) and hooks.local_state() == {}
    )
    # an admin who takes over one of OUR drains (new reason) owns it from then on
    c.scontrol("update", "NodeName=node1", "State=RESUME")
    c.wait_state("node1", "IDLE", timeout=15)
    hooks.fake.inject_fault(*GPU_FAULT)
    assert hooks.run_prolog()[0] == 1 and ctld_reason(c).startswith(REASON_PREFIX)
    takeover = "admin: GPU 0 replacement ticket 4711"
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=" + takeover)
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    rc, _, _ = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"]) == (0, "not-ours"), kv
    assert ctld_reason(c) == takeover and is_drained(c.node_state("node1"))
    assert "drained" not in hooks.local_state()  # forgotten: later health runs leave the node alone


# ------------------------------------------------------------------------------------------------
# 4. circuit breaker


def test_breaker_stops_the_drain_and_lets_the_job_run(hooks):
    c = hooks.cluster
    for other in NODES[1:]:
        c.scontrol(
            "update",
            "NodeName=%s" % other,
            "State=DRAIN",
            "Reason=slurm-hooks: gpu.ecc: earlier drain",
        )
    hooks.fake.inject_fault(*GPU_FAULT)
    job = c.sbatch(gpus=1)
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"  # the prolog exited 0
    for context in HOOK_KINDS:
        level, kv = hooks.wait_decision(context, job)
        assert (level, kv["decision"], kv["outcome"], kv["slurm_calls"]) == (
            "CRITICAL",
            "drain",
            "breaker-tripped",
            "2",
        ), kv  # show node + one count, no drain
        assert "2 of 3 nodes already drained by slurm-hooks (limit 2)" in kv["detail"], kv
    assert c.node_state("node1") == "IDLE" and c.node_reason("node1") is None
    assert all(ctld_reason(c, n) == "slurm-hooks: gpu.ecc: earlier drain" for n in NODES[1:])
    assert hooks.local_state() == {}
    assert hooks.run_prolog()[0] == 0


# ------------------------------------------------------------------------------------------------
# 5. slurmctld down while the prolog wants to drain


@pytest.mark.parametrize("how", ["stopped", "hung"])
def test_controller_down_bounded_prolog_keeps_pending_drain(hooks, how):
    """stopped: slurmctld exited (connection refused; scontrol itself would retry ~MessageTimeout).
    hung: SIGSTOPped (connects, never answers). Defaults ([drain] timeout 5 s x 2 attempts + 0.5 s
    backoff = 10.5 s) for 'stopped'; 'hung' shows the same bound with timeout 2 s.
    The prolog exits 0: the node could not be drained, and a non-zero exit would make slurmctld drain
    it with 'Prolog error' once it answers again -- behind the circuit breaker's back, on every node
    that saw the outage. The job runs; the pending record is delivered by the next health run."""
    c = hooks.cluster
    slurm_budget, calls = unreachable_slurm_cost(5.0, 2, message_timeout=c.message_timeout)
    if how == "hung":
        hooks.write_config(drain={"timeout": 2.0, "attempts": 2})
        slurm_budget, calls = unreachable_slurm_cost(2.0, 2, message_timeout=c.message_timeout)
    hooks.fake.inject_fault(*GPU_FAULT)
    c.stop_ctld() if how == "stopped" else c.sigstop_ctld()
    rc, seconds, err = hooks.run_prolog()
    report("prolog with slurmctld %s (Slurm budget %.1fs)" % (how, slurm_budget), seconds)
    assert rc == 0, err
    assert slurm_budget - 0.5 < seconds < slurm_budget + 5.0, seconds  # checks (<1 s) + interpreter
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert (level, kv["decision"], kv["outcome"], kv["slurm_calls"]) == (
        "ERROR",
        "drain",
        "slurm-unavailable",
        str(calls),
    ), kv
    assert (
        kv["detail"].startswith("slurmctld unreachable: ") and "unavailable after" in kv["detail"]
    ), kv
    assert "outcome=slurm-unavailable" in err  # also on stderr, which slurmd logs
    pending = hooks.local_state()["pending"]
    assert pending["reason"] == kv["reason"] and pending["checks"] == ["gpu.count"]
    assert pending["job"] == str(DIRECT_JOB_ID) and pending["context"] == "prolog"
    # the controller is back and the GPU still broken: the next health run delivers the drain
    c.start_ctld() if how == "stopped" else c.sigcont_ctld()
    hooks.log_offset = hooks.log_file.stat().st_size
    rc, _, _ = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"], kv["check"]) == (1, "drained", "gpu.count"), kv
    # the reason is the health run's own finding (all GPUs; the prolog also named the job's GPU)
    assert ctld_reason(c) == kv["reason"] and is_drained(c.node_state("node1"))
    state = hooks.local_state()
    assert "pending" not in state and state["drained"]["reason"] == kv["reason"]


def test_controller_hangs_during_a_jobs_prolog_the_job_runs_and_the_epilog_drains(hooks):
    """A real job: slurmctld freezes while our prolog runs, so the drain cannot be delivered. The
    prolog exits 0 (no 'Prolog error' drain behind the breaker's back): the job runs. The epilog,
    with slurmctld answering again and the GPU still broken, drains the node with our reason."""
    c = hooks.cluster
    hooks.write_config(drain={"timeout": 2.0, "attempts": 2})
    hooks.fake.inject_fault(*GPU_FAULT)
    hooks.fake.inject_delay(
        "nvmlDeviceGetCount", "*", 1500
    )  # keep the prolog busy long enough to freeze
    job = c.sbatch(gpus=1)
    deadline = time.monotonic() + 20
    while c.job_state(job) not in ("CONFIGURING", "RUNNING"):
        assert time.monotonic() < deadline, c.scontrol("show", "job", str(job))
        time.sleep(0.02)
    c.sigstop_ctld()
    try:
        level, prolog = hooks.wait_decision("prolog", job, timeout=20)
    finally:
        c.sigcont_ctld()
    hooks.fake.set_states({"delay_ms.nvmlDeviceGetCount.*": None})
    calls = unreachable_slurm_cost(2.0, 2, message_timeout=c.message_timeout)[1]
    assert (level, prolog["outcome"], prolog["slurm_calls"]) == (
        "ERROR",
        "slurm-unavailable",
        str(calls),
    ), prolog
    assert hooks.local_state()["pending"]["job"] == str(job)
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    level, epilog = hooks.wait_decision("epilog", job, timeout=30)
    assert (epilog["decision"], epilog["outcome"]) == ("drain", "drained"), epilog
    assert ctld_reason(c) == epilog["reason"] and ctld_reason(c).startswith("sh:gpu.count g0: ")
    state = hooks.local_state()
    assert "pending" not in state and state["drained"]["context"] == "epilog"


def test_slurms_own_prolog_error_is_refined(hooks):
    """A bare 'Prolog error' (another prolog script failed) on a node whose GPU is broken: the next
    run of ours replaces it with the precise reason, through the breaker like any drain."""
    c = hooks.cluster
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=Prolog error")
    hooks.fake.inject_fault(*GPU_FAULT)
    rc, _, err = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"], kv["slurm_calls"]) == (1, "refined", "4"), (kv, err)
    assert (
        ctld_reason(c) == kv["reason"] and hooks.local_state()["drained"]["reason"] == kv["reason"]
    )


def test_nohold_on_prolog_fail_leaves_the_requeued_job_eligible(tmp_path):
    """SchedulerParameters=nohold_on_prolog_fail: the job whose prolog failed is requeued but not
    held, so it can start elsewhere at once (here: nowhere else to go, so it waits, eligible).
    Its own cluster: `scontrol reconfigure` re-executes the daemons on Slurm >= 23.11."""
    r = start_rig(
        tmp_path,
        nodes=("node1",),
        extra_conf="SchedulerParameters=bf_interval=1,nohold_on_prolog_fail",
    )
    try:
        c = r.cluster
        assert "nohold_on_prolog_fail" in c.scontrol("show", "config")
        r.fake.inject_fault(*GPU_FAULT)
        job = c.sbatch(gpus=1)
        c.wait_state("node1", is_drained, timeout=30)
        r.wait_decision("epilog", job)
        deadline = time.monotonic() + 20
        while not (c.job_state(job) == "PENDING" and c.job_field(job, "Restarts") == "1"):
            assert time.monotonic() < deadline, c.scontrol("show", "job", str(job))
            time.sleep(0.1)
        assert (
            c.job_field(job, "Priority") != "0"
            and c.job_field(job, "Reason") != "launch_failed_requeued_held"
        ), c.scontrol("show", "job", str(job))
        assert ctld_reason(c).startswith("sh:gpu.count g0: ")
    finally:
        r.stop()


# ------------------------------------------------------------------------------------------------
# 6. observe mode, and the job opt-out


def test_observe_mode_drains_nothing(hooks):
    c = hooks.cluster
    hooks.write_config(general={"mode": "observe"})
    hooks.fake.inject_fault(*GPU_FAULT)
    job = c.sbatch(gpus=1)
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    for context in HOOK_KINDS:
        level, kv = hooks.wait_decision(context, job)
        assert (kv["decision"], kv["outcome"], kv["slurm_calls"]) == ("drain", "observe", "0"), kv
        assert kv["detail"].startswith("observe mode: would drain node1: sh:gpu.count g0: "), kv
    rc, _, _ = hooks.run_health()
    assert rc == 0 and hooks.wait_decision("health")[1]["outcome"] == "observe"
    assert c.node_state("node1") == "IDLE" and c.node_reason("node1") is None
    assert hooks.local_state() == {}


def test_job_opt_out_skips_the_prolog_checks_only(hooks):
    """`sbatch --comment=slurm_hooks=skip` (22.05 has no --extra; slurmd passes SLURM_JOB_COMMENT to
    the prolog) with [drain] allow_job_opt_out = true: the job runs on a broken node; the epilog
    still checks the node after it."""
    c = hooks.cluster
    hooks.write_config(drain={"allow_job_opt_out": True})
    hooks.fake.inject_fault(*GPU_FAULT)
    job = c.sbatch("--comment=slurm_hooks=skip", gpus=1)
    assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    level, kv = hooks.wait_decision("prolog", job)
    assert (level, kv.get("event")) == ("WARNING", "job-opted-out"), kv
    level, kv = hooks.wait_decision("epilog", job)
    assert (kv["decision"], kv["outcome"]) == ("drain", "drained"), kv
    c.wait_state("node1", is_drained, timeout=10)
    assert ctld_reason(c) == kv["reason"]


# ------------------------------------------------------------------------------------------------
# admin verbs


def test_admin_drain_status_resume_against_the_real_controller(hooks):
    """`slurm-hooks drain/status/resume` act in observe mode too (observe only quiets the hooks)."""
    c = hooks.cluster
    hooks.write_config(general={"mode": "observe"})
    rc, out = hooks.run_cli("drain", "--node", "node1", "--reason", "fan 3 at 0 rpm")
    assert rc == 0, out
    assert ctld_reason(c) == "sh:manual: fan 3 at 0 rpm" and is_drained(c.node_state("node1"))
    rc, out = hooks.run_cli("status", "--node", "node1", "--json")
    doc = json.loads(out[: out.rindex("}") + 1])
    info = dict(doc, **doc["nodes"][0])  # schema slurm-hooks.status/1: nodes is a list, even of one
    assert (
        rc == 0 and info["drained_by_us"] is True and info["reason"] == "sh:manual: fan 3 at 0 rpm"
    )
    assert "DRAIN" in info["state"].split("+") and info["mode"] == "observe", info
    assert info["breaker"] == {
        "drained_by_us": 0,
        "manual_drains": 1,
        "nodes": 3,
        "limit": 2,
        "tripped": False,
    }, info
    assert (
        info["drain"] == "slurm-hooks, by an admin (slurm-hooks drain): never resumed automatically"
    ), info
    rc, out = hooks.run_cli("resume", "--node", "node1")
    assert rc == 0 and out.startswith("resumed node1"), out
    c.wait_state("node1", "IDLE", timeout=15)
    # someone else's drain: refused without --force, both ways
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=admin: rack 7 power work")
    assert hooks.run_cli("drain", "--node", "node1", "--reason", "x")[0] == 1
    assert hooks.run_cli("resume", "--node", "node1")[0] == 1
    assert ctld_reason(c) == "admin: rack 7 power work"
    assert hooks.run_cli("resume", "--node", "node1", "--force")[0] == 0
    c.wait_state("node1", "IDLE", timeout=15)


# ------------------------------------------------------------------------------------------------
# the [drain] backend


def test_hooks_talk_to_slurm_through_the_configured_backend(hooks):
    """The decision line names the backend that reached slurmctld: the one CI configures for this pass
    ($SLURM_HOOKS_TEST_DRAIN_BACKEND, .ci/slurm-root.sh); with `auto`, scontrol unless pyslurm is installed."""
    from slurm_hooks.slurm.client import pyslurm_version

    expected = {drain_backend_under_test() or "auto"} - {"auto"} or (
        {"scontrol"} if pyslurm_version() is None else {"scontrol", "pyslurm"}
    )
    hooks.fake.inject_fault(*GPU_FAULT)
    rc, _, err = hooks.run_prolog()
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert (rc, kv["outcome"], kv["slurm_calls"]) == (1, "drained", "4"), (
        kv,
        err,
    )  # as above: +re-count
    assert kv["slurm_backend"] in expected, kv
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    rc, _, _ = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"], kv["slurm_backend"] in expected) == (0, "resumed", True), kv


# ------------------------------------------------------------------------------------------------
# what our prolog costs a job


def srun_seconds(cluster: SlurmCluster, runs: int = 3) -> List[float]:
    """Wall time of `srun --gres=gpu:1 true`, each started on an IDLE node (after the previous
    job's epilog), so it measures allocation + prolog + launch. srun polls for the prolog's end
    with growing sleeps (0.1 s, 0.2 s, ...), so a 0.6 s prolog costs about 1 s of job start."""
    times = []
    for _ in range(runs):
        cluster.wait_state(cluster.node, "IDLE", timeout=15)
        start = time.monotonic()
        cluster.run("srun", "-N", "1", "-w", cluster.node, "--gres=gpu:1", "true", timeout=60)
        times.append(time.monotonic() - start)
    return times


def test_job_start_cost_of_our_prolog(hooks, slurm_cluster_factory):
    direct = [hooks.run_prolog(DIRECT_JOB_ID + i) for i in range(3)]
    assert [rc for rc, _, _ in direct] == [0, 0, 0]
    with_hooks = srun_seconds(hooks.cluster)
    plain = slurm_cluster_factory("plain", nodes=("node1",))
    try:
        without = srun_seconds(plain)
    finally:
        plain.stop()
    prolog_ms = [
        int(kv["duration_ms"]) for _, kv in hooks.decisions() if kv.get("context") == "prolog"
    ]
    assert len(prolog_ms) == len(with_hooks) + len(direct)
    report(
        "our prolog run directly (interpreter + checks), median of 3",
        statistics.median(t for _, t, _ in direct),
    )
    report("  of which the checks (duration_ms), median", statistics.median(prolog_ms) / 1000.0)
    report(
        "srun true on an idle node, median of %d, with our prolog" % len(with_hooks),
        statistics.median(with_hooks),
    )
    report(
        "srun true on an idle node, median of %d, no prolog/epilog" % len(without),
        statistics.median(without),
    )
    # the bound we promise: the prolog's deadline ([deadline] prolog 5 s) + 1 s isolation grace + ~2 s
    # interpreter start on a loaded machine; it must stay far below PrologEpilogTimeout
    assert statistics.median(with_hooks) - statistics.median(without) < 8.0 < PROLOG_EPILOG_TIMEOUT
