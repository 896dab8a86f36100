"""Issue 12 §2 and its "also fix" against the real slurmctld: the installed prolog.d script and the
CLI, a fake GPU node (tests/test_e2e_slurm.py's rig), real jobs where a job matters.

Each test here failed before its fix: two prologs of one node drained twice (and the metric said 2);
a failing check in a MAINT reservation or on an admin's FAIL node exited 1 (slurmctld drained the node
with 'Prolog error', or we overwrote the admin's FAIL reason); an admin drain between our read and our
write was overwritten; a health run resumed an admin's drain made with our text or our verb, and
resumed when the check that drained the node came back UNKNOWN; a hostlist in --node was a traceback;
`resume` called a missing scontrol an unreachable slurmctld.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurm_hooks.slurm import drainer
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient, run_argv
from tests.helpers import default_settings
from tests.slurm_rig import DIRECT_JOB_ID, GPU_FAULT, NODES, ctld_reason, is_drained, start_rig
from tests.slurmcluster import drain_backend_under_test

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = start_rig(tmp_path_factory.mktemp("drain"))
    yield r
    r.stop()


@pytest.fixture
def hooks(rig):
    rig.reset()
    yield rig
    c = rig.cluster
    c.sigcont_ctld()
    c.start_ctld()  # no-op unless a test stopped it
    c.run("scontrol", "delete", "ReservationName=maint1", check=False)
    for name in NODES:
        state = c.node_state(name).split("+")
        if "FAIL" in state or "DRAIN" in state:
            c.scontrol(
                "update",
                "NodeName=%s" % name,
                "State=%s" % ("RESUME" if name == "node1" else "UNDRAIN"),
                check=False,
            )
    rig.reset()


def settings():
    return default_settings()


def decisions(hooks, context):
    return [kv for _, kv in hooks.decisions() if kv.get("context") == context]


def test_two_prologs_of_one_node_at_once_make_one_drain_counted_once(hooks):
    metrics = hooks.base / "metrics"
    hooks.write_config(metrics={"textfile_dir": str(metrics)})
    hooks.fake.inject_fault(*GPU_FAULT)
    env = dict(
        SLURM_JOB_USER="root",
        SLURM_JOB_UID="0",
        SLURMD_NODENAME="node1",
        SLURM_SCRIPT_CONTEXT="prolog_slurmd",
        SLURM_JOB_GPUS="0",
        CUDA_VISIBLE_DEVICES="0",
        SLURM_CONF=str(hooks.cluster.conf),
    )
    procs = [
        subprocess.Popen(
            [str(hooks.hook_script("prolog"))],
            env=dict(env, SLURM_JOB_ID=str(DIRECT_JOB_ID + i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(hooks.base),
        )
        for i in range(2)
    ]
    codes = [p.wait(60) for p in procs]
    assert codes == [1, 1], [p.stderr.read() for p in procs]
    deadline = time.monotonic() + 10
    while len(decisions(hooks, "prolog")) < 2:
        assert time.monotonic() < deadline, hooks.decisions()
        time.sleep(0.05)
    outcomes = sorted(kv["outcome"] for kv in decisions(hooks, "prolog"))
    assert outcomes == ["already-drained-by-us", "drained"], outcomes
    prom = (metrics / "slurm_hooks.prom").read_text()
    assert "slurm_hooks_drains_total 1.0" in prom, prom


def test_a_failing_check_in_a_maint_reservation_lets_the_job_run(hooks):
    c = hooks.cluster
    c.scontrol(
        "create",
        "reservation",
        "ReservationName=maint1",
        "Flags=MAINT",
        "Nodes=node1",
        "StartTime=now",
        "Duration=10",
        "Users=root",
    )
    c.wait_state("node1", lambda s: "MAINTENANCE" in s.split("+"), timeout=10)
    hooks.fake.inject_fault(*GPU_FAULT)
    job = c.sbatch("--reservation=maint1", gpus=1)
    assert (
        c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
    )  # before: requeued held, 'Prolog error'
    level, kv = hooks.wait_decision("prolog", job)
    assert (kv["decision"], kv["outcome"]) == ("drain", "skipped-state") and "MAINTENANCE" in kv[
        "detail"
    ], kv
    assert not is_drained(c.node_state("node1")) and c.node_reason("node1") is None


def test_an_admins_fail_is_left_alone_and_the_prolog_exits_0(hooks):
    c = hooks.cluster
    c.scontrol("update", "NodeName=node1", "State=FAIL", "Reason=admin: DIMM errors")
    hooks.fake.inject_fault(*GPU_FAULT)
    rc, _, err = hooks.run_prolog()
    assert rc == 0, err
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert kv["outcome"] == "skipped-state" and "FAIL" in kv["detail"], kv
    assert ctld_reason(c) == "admin: DIMM errors" and "FAIL" in c.node_state("node1").split("+")
    hooks.fake.clear_faults()
    assert hooks.run_health()[0] == 0 and "FAIL" in c.node_state("node1").split("+")


def test_an_admin_drain_between_our_read_and_our_drain_is_kept(hooks):
    """The admin's scontrol lands right after our first read (before: show -> list -> drain, 14 ms
    later, overwrote it, and the next health run resumed it)."""
    c = hooks.cluster
    seen = []

    def runner(argv, timeout, env):
        out = run_argv(argv, timeout, env)
        if argv[-1] == "node1" and "show" in argv and not seen:
            seen.append(argv)
            c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=admin: reseat GPU 3")
        return out

    client = SlurmClient(backend=ScontrolBackend(env=c.env, runner=runner))
    enacted = drainer.drain(
        client, "node1", "slurm-hooks: gpu.count: GPU 0 lost -> reboot", settings()
    )
    assert (
        enacted.outcome is drainer.Outcome.FOREIGN_DRAIN and ctld_reason(c) == "admin: reseat GPU 3"
    ), enacted


def test_resume_only_the_exact_drain_we_recorded(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    assert hooks.run_prolog()[0] == 1
    ours = ctld_reason(c)
    # an admin resumes it and drains again with the very same text, a second later: another drain
    # (re-draining a drained node with an identical reason changes nothing in Slurm: update_node skips it)
    time.sleep(1.1)
    c.scontrol("update", "NodeName=node1", "State=RESUME")
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=" + ours)
    assert ctld_reason(c) == ours
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    assert hooks.run_health()[0] == 0
    level, kv = hooks.wait_decision("health")
    assert kv["outcome"] == "not-ours" and is_drained(c.node_state("node1")), kv


def test_an_admins_drain_through_our_verb_after_ours_is_never_resumed(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    assert hooks.run_prolog()[0] == 1
    rc, out = hooks.run_cli("drain", "--node", "node1", "--reason", "BIOS update, ticket 4711")
    assert rc == 0, out
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert kv["outcome"] == "not-ours", kv
    assert ctld_reason(c) == "sh:manual: BIOS update, ticket 4711" and is_drained(
        c.node_state("node1")
    )


def test_a_hung_check_keeps_our_drain(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    assert hooks.run_prolog()[0] == 1
    hooks.fake.clear_faults()
    hooks.write_config(deadline={"health": 2.0})
    hooks.fake.inject_delay(
        "nvmlDeviceGetCount", "*", 8000
    )  # gpu.count cannot finish: UNKNOWN, timed out
    hooks.log_offset = hooks.log_file.stat().st_size
    rc, _, err = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"], kv["slurm_calls"]) == (1, "kept-unproven", "0"), (kv, err)
    assert is_drained(c.node_state("node1"))
    hooks.fake.set_states({"delay_ms.nvmlDeviceGetCount.*": None})
    hooks.log_offset = hooks.log_file.stat().st_size
    assert hooks.run_health()[0] == 0
    assert hooks.wait_decision("health")[1]["outcome"] == "resumed"
    c.wait_state("node1", "IDLE", timeout=15)


def test_lost_local_state_is_rebuilt_and_the_node_resumed(hooks):
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    assert hooks.run_prolog()[0] == 1
    (
        hooks.state_dir / "node-state.json"
    ).unlink()  # a diskless node after the reboot the reason asked for
    res = subprocess.run(
        [str(hooks.wrapper), "status", "--json"],
        env={"PATH": "/bin:/usr/bin", "SLURMD_NODENAME": "node1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = json.loads(res.stdout)["nodes"][0]  # schema slurm-hooks.status/1
    assert info["drain"] == "slurm-hooks, automatic (gpu.count)" and info[
        "local_record"
    ].startswith("lost"), info
    hooks.fake.clear_faults()
    hooks.log_offset = hooks.log_file.stat().st_size
    assert hooks.run_health()[0] == 0
    level, kv = hooks.wait_decision("health")
    assert (kv["outcome"], kv["slurm_calls"]) == ("resumed", "3"), kv
    c.wait_state("node1", "IDLE", timeout=15)


def test_hostlists_and_usage_errors_in_the_admin_verbs(hooks):
    c = hooks.cluster
    rc, out = hooks.run_cli("drain", "--node", "node[1-2]", "--reason", "PDU swap")
    # node1 drained; node2 (no slurmd here: DOWN) is in a skip state and refused: the worst code wins
    assert (
        rc == 1 and "drained node1: sh:manual: PDU swap" in out and "node node2 is DOWN" in out
    ), out
    assert ctld_reason(c) == "sh:manual: PDU swap" and not is_drained(c.node_state("node2"))
    rc, out = hooks.run_cli("status", "--node", "node1,node[2-3]", "--json")
    info = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert rc == 0 and [n["node"] for n in info["nodes"]] == ["node1", "node2", "node3"], info
    assert info["breaker"]["manual_drains"] == 1 and info["breaker"]["drained_by_us"] == 0
    rc, out = hooks.run_cli("resume", "--node", "node[1-3]")
    assert rc == 0 and "resumed node1" in out and out.count("is not drained") == 2, out
    for bad in ("node[2-", "node1 node2", "node1;reboot"):
        rc, out = hooks.run_cli("status", "--node", bad)
        assert rc == 3 and "Traceback" not in out and "--node" in out, (bad, out)


def test_resume_errors_say_what_happened(hooks):
    c = hooks.cluster
    c.scontrol("update", "NodeName=node1", "State=DRAIN", "Reason=slurm-hooks: manual: x")
    res = subprocess.run(
        [str(hooks.wrapper), "resume", "--node", "node1"],
        env={"PATH": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # no client on PATH: scontrol cannot run; a forced pyslurm cannot check its version (sinfo --version)
    missing = (
        "pyslurm backend requested but unusable"
        if drain_backend_under_test() == "pyslurm"
        else "cannot run scontrol"
    )
    assert res.returncode == 3 and "Slurm client unusable: " + missing in res.stderr, res
    assert "Traceback" not in res.stderr
    hooks.write_config(drain={"timeout": 1.0, "attempts": 1})
    c.stop_ctld()
    rc, out = hooks.run_cli("resume", "--node", "node1")
    assert rc == 3 and "slurmctld unreachable" in out, out
    rc, out = hooks.run_cli("drain", "--node", "node1", "--reason", "x")
    assert rc == 3 and "slurmctld unreachable" in out, out
