"""Hangs and crashes under the real prolog process: an NVML call that never returns, an NVML call that
aborts the process, a sysfs read that blocks forever (a FIFO where the file should be).

The prolog runs as slurmd runs it: the real prolog.d/50-slurm-hooks script (only its
/usr/bin/slurm-hooks replaced by a wrapper that points at this checkout, the fake node's
libnvidia-ml.so.1 and a config file), with the job's environment; its exit code is what Slurm sees. Slurm is a fake `scontrol` first in
PATH that records its argv and answers like Slurm 22.05, so a drain is observable without a
controller (the real controller is exercised in test_e2e_slurm.py and test_slurm_faults.py).

Bound asserted: a run ends as soon as every check has ended or been abandoned, so a hang costs the
hung check's own timeout (3 s for the GPU checks), not the deadline (set to 20 s here to tell the
two apart), plus [records] snapshot_timeout when NVML hangs for the counter snapshot too, plus
interpreter start-up (margin for a loaded 2-core machine). What a hang or crash *means* is policy:
with [drain] on_timeout = "alert" (default) the prolog logs it and exits 0 (the job runs, nothing
is drained); with "drain" the node is drained and the prolog exits 1 (slurm-hooks exits 10, which
the script turns into 1).

After the checks, a file system that never answers (tests/doubles/hungfs.py: a FUSE mount whose server
answers nothing) under the records, dcgm-exporter or state directory costs at most [deadline]
files per bounded phase; the epilog still exits 0 and logs what it abandoned, with the path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_hooks.core.isolation import REAP_WAIT_S
from tests.helpers import REPO, fake_node_config
from tests.prolog_rig import BOUND, CHECK_TIMEOUT, FILES, START_UP_MARGIN, Prolog, make_fifo

pytestmark = pytest.mark.slow  # every test waits out a hang's timeout by design


@pytest.fixture
def prolog(fake_node, tmp_path):
    return Prolog(fake_node("dgx-h100"), tmp_path)


HANGS = {
    # fault -> (injector, names (or name prefixes) of the checks that time out; the log names one)
    "nvml-hang-all-gpus": (lambda n: n.inject_hang("nvmlDeviceGetCount"), ("gpu.",)),
    "nvml-hang-one-gpu": (
        lambda n: n.inject_hang("nvmlDeviceGetTemperature", 5),
        ("gpu.clocks", "gpu.thermal", "gpu.power", "gpu.driver"),
    ),  # one shared GPU-state read
    "sysfs-fifo-numa-meminfo": (
        lambda n: make_fifo(n, "/sys/devices/system/node/node1/meminfo"),
        ("system.memory",),
    ),
    "sysfs-fifo-pci-tree": (
        lambda n: make_fifo(n, "/sys/bus/pci/devices/0000:44:00.0/local_cpulist"),
        ("topology.", "gpudirect.", "numa."),
    ),  # every check built on the PCIe tree
}


@pytest.mark.parametrize("fault", sorted(HANGS))
def test_hang_is_bounded_and_alerts_by_default(prolog, fault):
    inject, checks = HANGS[fault]
    inject(prolog.node)
    rc, seconds, stderr = prolog.run(fault + " (on_timeout=alert)")
    assert rc == 0, stderr  # on_timeout = "alert": the job runs
    assert seconds < BOUND, seconds
    kv = prolog.decision()
    assert (kv["decision"], kv["status"], kv["blame"], kv["slurm_calls"]) == (
        "alert",
        "UNKNOWN",
        "check",
        "0",
    ), kv
    assert kv["check"].startswith(checks), kv
    assert "did not finish within" in kv["reason"] or "did not answer within" in kv["reason"], kv
    assert prolog.scontrol_calls() == [] and prolog.drain_reason() is None
    assert "Traceback" not in stderr


@pytest.mark.parametrize("fault", ["nvml-hang-all-gpus", "sysfs-fifo-numa-meminfo"])
def test_hang_drains_when_policy_says_so(prolog, fault):
    inject, checks = HANGS[fault]
    prolog.write_config("drain")
    inject(prolog.node)
    rc, seconds, stderr = prolog.run(fault + " (on_timeout=drain)")
    assert rc == 1, stderr  # drained, then exit 1 so slurmd requeues the job elsewhere
    assert seconds < BOUND, seconds
    kv = prolog.decision()
    assert (kv["decision"], kv["outcome"], kv["slurm_calls"]) == ("drain", "drained", "4"), kv
    reason = prolog.drain_reason()
    assert (
        reason == kv["reason"]
        and reason.startswith("sh:")
        and reason[len("sh:") :].startswith(checks)
    ), reason
    assert "did not finish within" in reason or "not finished when the" in reason
    assert [c[:4] for c in prolog.scontrol_calls()] == [
        ["--all", "--oneliner", "show", "node"]
    ] * 2 + [
        ["update", "NodeName=node1", "State=DRAIN", "Reason=" + reason],
        ["--all", "--oneliner", "show", "node"],
    ]
    # (the last: the circuit breaker's re-count, 1.1 s after the drain)


@pytest.mark.parametrize("on_timeout, rc_expected", [("alert", 0), ("drain", 1)])
def test_nvml_call_that_aborts_the_process(prolog, on_timeout, rc_expected):
    """abort() inside libnvidia-ml kills the forked check process (SIGABRT); the prolog itself survives,
    says so, and policy decides."""
    prolog.write_config(on_timeout)
    prolog.node.inject_crash("nvmlDeviceGetEnforcedPowerLimit")
    rc, seconds, stderr = prolog.run("an aborting NVML call (on_timeout=%s)" % on_timeout)
    assert rc == rc_expected, stderr
    assert seconds < BOUND, seconds
    kv = prolog.decision()
    assert kv["check"] == "slurm-hooks.runner" and kv["status"] == "UNKNOWN", kv
    assert "the check process died of signal 6 (SIGABRT)" in kv["reason"], kv
    if on_timeout == "alert":
        assert (kv["decision"], kv["slurm_calls"]) == (
            "alert",
            "0",
        ) and prolog.drain_reason() is None
    else:
        assert (kv["decision"], kv["outcome"]) == ("drain", "drained"), kv
        assert prolog.drain_reason().startswith(
            "sh:slurm-hooks.runner: the check process died of signal 6"
        )


def test_slow_but_answering_nvml_is_not_a_fault(prolog):
    """An NVML call that takes 300 ms (a busy driver) is well inside the check timeout: everything passes."""
    prolog.node.inject_delay("nvmlDeviceGetCount", "*", 300)
    rc, seconds, stderr = prolog.run("a 300 ms NVML call")
    kv = prolog.decision()
    assert (rc, kv["decision"], kv["status"]) == (0, "pass", "OK"), (kv, stderr)
    assert seconds < BOUND


def test_a_healthy_prolog_leaves_its_log_and_stderr_complete(prolog):
    """The console script leaves hook verbs through os._exit (cli.run): the decision log file and
    stderr must have been flushed first."""
    rc, _seconds, stderr = prolog.run()
    kv = prolog.decision()
    assert (rc, kv["decision"], kv["status"], kv["job"]) == (0, "pass", "OK", "4242"), (kv, stderr)
    assert prolog.log.read_text().endswith("\n")
    assert "decision=pass" in stderr and stderr.endswith("\n"), stderr


def test_check_ends_with_the_hung_check_not_at_the_deadline(fake_node):
    """`slurm-hooks check` with one hung GPU call and a 30 s deadline: it took 30 s and said "deadline of 30s
    reached" though every check had finished or timed out at 3 s (issue 14). Now: the hung checks' own
    timeout plus start-up, and deadline_hit is false because the deadline cut nothing."""
    node = fake_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetTemperature", 5)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hooks",
            "check",
            "--json",
            "--deadline",
            "30",
            "--live",
            "nvml",
            "--root",
            str(node.root),
        ],
        env=dict(node.subprocess_env(), SLURM_HOOKS_CHECKS_DIR="", PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    seconds = time.monotonic() - started
    print(
        "\n[reliability] check with a hung NVML call on one GPU, 30 s deadline: exit %d after %.2fs"
        % (proc.returncode, seconds)
    )
    report = json.loads(proc.stdout)
    assert seconds < CHECK_TIMEOUT + START_UP_MARGIN, seconds
    assert report["deadline_hit"] is False, report["deadline_hit"]
    thermal = [r for c in report["checks"] for r in c["results"] if r["check"] == "gpu.thermal"]
    assert [r["status"] for r in thermal if r["component"].startswith("gpu:5 ")] == ["UNKNOWN"], (
        thermal
    )


def test_one_hung_gpu_costs_that_gpu_only(nvml_node, registry):
    """A hung NVML call on GPU 5 used to make gpu.ecc/remap/recovery UNKNOWN for every GPU (one shared gather
    step), so a pending row remap on GPU 3 only alerted. Now GPU 3's remap still fails (and drains), and
    only GPU 5 is UNKNOWN, marked timed out."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.isolation import run_isolated
    from slurm_hooks.core.report_format import report_from_dict, report_to_dict
    from slurm_hooks.core.runner import run_checks, select_checks
    from slurm_hooks.hw.host import Host
    from slurm_hooks.slurm import policy

    node = nvml_node("dgx-h100", {"gpu": {3: {"remapped_rows": {"pending": True}}}})
    node.inject_hang("nvmlDeviceGetEccMode", 5)
    config = validate(
        registry, fake_node_config()
    )  # NVML under a root other than / only when asked
    started = time.monotonic()
    specs = select_checks(registry, "prolog", ["gpu.ecc", "gpu.remap", "gpu.recovery"])
    # in a forked child, as the hooks run checks: the hung NVML thread dies with it, not in pytest
    data, why = run_isolated(
        lambda: report_to_dict(run_checks(registry, config, Host(str(node.root)), "prolog", specs)),
        2 * CHECK_TIMEOUT,
    )
    assert data is not None, why
    report = report_from_dict(data)
    assert time.monotonic() - started < CHECK_TIMEOUT
    by_check = {run.name: run.results for run in report.runs}
    remap = {r.component.split()[0]: r for r in by_check["gpu.remap"]}
    assert remap["gpu:3"].status.value == "FAIL" and remap["gpu:5"].status.value == "UNKNOWN"
    assert remap["gpu:5"].details["timed_out"] and "did not answer within" in remap["gpu:5"].summary
    for name in ("gpu.ecc", "gpu.recovery"):
        assert [r.component.split()[0] for r in by_check[name]] == ["gpu:5"], by_check[
            name
        ]  # the others pass
    assert policy.decide(report.results(), config.settings).verdict is policy.Verdict.DRAIN


@pytest.fixture
def hung_dir(tmp_path):
    """A directory on a file system that never answers (tests/doubles/hungfs.py)."""
    from tests.doubles.hungfs import HungFileSystem, require_fuse

    require_fuse(tmp_path)
    mount = tmp_path / "hung"
    mount.mkdir()
    with HungFileSystem(str(mount)):
        yield mount


def test_epilog_with_a_hung_records_file_system_exits_in_time(prolog, hung_dir):
    """The records directory is documented as possibly shared (NFS, Lustre): when it stops answering, every
    epilog used to hang until slurmd killed it, and slurmctld drained the healthy node with "Epilog error".
    Now the record and the dcgm-exporter mapping steps are abandoned after [deadline] files, logged with their
    paths, and the epilog exits 0 in time."""
    prolog.place(records_dir=hung_dir / "jobs", dcgm_dir=hung_dir / "dcgm")
    rc, seconds, stderr = prolog.run("a hung records file system", kind="epilog")
    assert rc == 0, stderr
    assert seconds < FILES + START_UP_MARGIN, seconds
    kv = prolog.decision("epilog")
    assert (kv["decision"], kv["status"]) == ("pass", "OK"), kv
    abandoned = {e["step"]: e for e in prolog.events("step-abandoned")}
    assert set(abandoned) == {"record", "dcgm-mapping"}, abandoned
    assert abandoned["record"]["path"] == str(hung_dir / "jobs" / "node1" / "4242.json")
    assert abandoned["dcgm-mapping"]["path"] == str(hung_dir / "dcgm")
    assert all(e["context"] == "epilog" and e["job"] == "4242" for e in abandoned.values())
    assert "Traceback" not in stderr


def test_prolog_with_a_hung_state_directory_exits_in_time(prolog, hung_dir):
    """The state directory (node-state.json, prolog snapshots) hung. A healthy prolog reads no state; its
    snapshot file is abandoned after [deadline] files. A prolog that drains reads and writes the state
    file, each bounded the same way: it still drains (the decision never waits on files) and exits 1."""
    prolog.place(state_dir=hung_dir / "state")
    rc, seconds, stderr = prolog.run("a hung state directory")
    assert rc == 0, stderr
    assert seconds < FILES + START_UP_MARGIN, seconds
    assert prolog.decision()["decision"] == "pass"
    assert [(e["step"], e["path"]) for e in prolog.events("step-abandoned")] == [
        ("snapshot", str(hung_dir / "state" / "snapshots" / "4242.json"))
    ]
    prolog.log.unlink()
    prolog.node.set_state("gpu.3.remapped_rows.pending", 1)
    rc, seconds, stderr = prolog.run("a hung state directory, draining")
    assert rc == 1, stderr
    assert seconds < 3 * FILES + START_UP_MARGIN, seconds
    kv = prolog.decision()
    assert (kv["decision"], kv["outcome"], kv["check"]) == ("drain", "drained", "gpu.remap"), kv
    state_file = str(hung_dir / "state" / "node-state.json")
    assert [e["path"] for e in prolog.events("state-unreadable")] == [state_file]
    assert sorted((e["step"], e["path"]) for e in prolog.events("step-abandoned")) == [
        ("snapshot", str(hung_dir / "state" / "snapshots" / "4242.json")),
        ("state", state_file),
    ]


def test_the_drain_lock_in_a_hung_state_directory_is_given_up_in_time(hung_dir):
    """/run unusable, so the node's drain lock falls back to state_dir, and state_dir on a file system
    that stopped answering: the lock's makedirs/open there never returned, and a draining hook hung
    past every bound (stop 34's first CI run met it through a test setting). Now the look for the
    lock file is given up at the lock's bound, and the hook goes on unlocked, saying why. (In a
    child: before the fix it hung there, and the mount is released only when this test leaves.)"""
    code = (
        "import sys, time\n"
        "from slurm_hooks.slurm import nodelock\n"
        "started = time.monotonic()\n"
        "with nodelock.NodeLock(sys.argv[1], 'node1', 0.5) as lock:\n"
        "    print(lock.acquired, lock.fd, round(time.monotonic() - started, 2))\n"
        "    print(lock.error)\n"
    )
    env = dict(os.environ, SLURM_HOOKS_LOCK_DIR="off")  # state_dir alone, as with /run unusable
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(hung_dir / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = child.communicate(timeout=0.5 + START_UP_MARGIN)
    except subprocess.TimeoutExpired:
        child.kill()  # not waited for: it sleeps in the kernel until the mount goes (this test's end)
        pytest.fail("the drain lock hung on the hung state directory past its 0.5 s bound")
    done = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    assert done.returncode == 0, done.stderr
    state, error = done.stdout.splitlines()
    acquired, fd, seconds = state.split()
    assert (acquired, fd) == ("False", "-1") and float(seconds) < 0.5 + REAP_WAIT_S + 0.5, state
    assert "did not answer within 0.5s" in error and str(hung_dir) in error, error


def enforce(prolog) -> None:
    """mode = "enforce" said explicitly: these tests expect a drain whatever the shipped default mode."""
    text = prolog.config.read_text()
    if 'mode = "enforce"' not in text:  # the rig may say it already: a second key is invalid TOML
        prolog.config.write_text(text.replace("[general]\n", '[general]\nmode = "enforce"\n', 1))


def test_prolog_with_a_wedged_gpu_judges_the_gpus_that_answer(prolog):
    """GPU 3 hangs in nvmlDeviceGetPciInfo (identification) and GPU 1, also the job's, has a pending row
    remap. Before: gpu.inventory hung, every GPU check timed out at 3 s, the prolog only alerted and exited
    0, and the job ran on a broken GPU. Now GPU 3 costs [nvml] identify_timeout (1 s) once, GPU 1's remap
    FAILs, the node is drained and the job requeued; GPU 3 itself is UNKNOWN (a first hang)."""
    enforce(prolog)
    prolog.node.set_state("gpu.1.remapped_rows.pending", 1)
    prolog.node.inject_hang("nvmlDeviceGetPciInfo", 3)
    rc, seconds, stderr = prolog.run("GPU 3 wedged in identification, GPU 1 remap pending")
    kv = prolog.decision()
    assert rc == 1, (kv, stderr)
    assert (kv["decision"], kv["outcome"], kv["check"], kv["component"]) == (
        "drain",
        "drained",
        "gpu.remap",
        "gpu:1 0000:1a:00.0",
    ), kv
    print("[wedged] checks: %s ms" % kv["duration_ms"])
    assert int(kv["duration_ms"]) < 1000 * CHECK_TIMEOUT, kv  # before: every GPU check waited 3 s
    assert seconds < BOUND, seconds
    assert prolog.drain_reason().startswith("sh:gpu.remap g1: gpu:1 ")


def test_a_gpu_wedged_in_two_prologs_in_a_row_drains_the_node(prolog):
    """The rule for the hung GPU itself: the first prolog alerts (UNKNOWN) and the job runs; the next
    one, GPU 3 still hanging while its siblings answer, FAILs it (reboot) and drains the node."""
    enforce(prolog)
    prolog.node.inject_hang("nvmlDeviceGetHandleByIndex", 3)
    rc, seconds, stderr = prolog.run("GPU 3 wedged (first prolog)")
    kv = prolog.decision()
    assert (rc, kv["decision"], kv["status"], kv["check"]) == (0, "alert", "UNKNOWN", "gpu.count")
    assert seconds < BOUND, seconds
    assert prolog.drain_reason() is None
    prolog.log.unlink()
    rc, seconds, stderr = prolog.run("GPU 3 wedged (second prolog)")
    kv = prolog.decision()
    assert (rc, kv["decision"], kv["outcome"], kv["check"]) == (1, "drain", "drained", "gpu.count")
    reason = prolog.drain_reason()
    assert reason.startswith("sh:gpu.count g3: gpu:3 ") and reason.endswith("-> reboot")
    assert "2 consecutive runs" in reason, reason
