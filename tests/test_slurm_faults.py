"""Slurm itself failing while the prolog wants to drain: slurmctld down, slurmctld slow (SIGSTOPped for
a few seconds, then continued), munge down. Real munged + slurmctld + slurmd, the real prolog.d
script (tests/test_e2e_slurm.py's rig), a fake DGX node with GPU 0 fallen off the bus.

For each: the prolog ends in bounded time, does not crash (no traceback), exits 0 -- the node could not
be drained, and a non-zero exit would make slurmctld drain it with "Prolog error" once it answers,
behind the circuit breaker's back (the job runs; the log says so) -- and keeps a local record
(<state_dir>/node-state.json "pending") that the next health run delivers once Slurm is back. When
slurmctld is merely slow, the drain lands and the prolog exits 1 (slurm-hooks' 10).

munge: this module runs its OWN munged on a private socket (slurm.conf AuthInfo=socket=...), so
stopping it never disturbs the machine's munged or other Slurm tests; it is restarted afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_hooks.slurm import drainer
from tests.slurm_rig import DIRECT_JOB_ID, GPU_FAULT, ctld_reason, is_drained, report, start_rig
from tests.slurmcluster import find_binary, require_slurm, unreachable_slurm_cost

CHECKS_S = 3.0  # interpreter + checks of the fake 8-GPU node, on a loaded 2-core VM


class PrivateMunge:
    """munged as the munge user on a socket of its own; stop() and start() by pid, nothing else touched."""

    def __init__(self) -> None:
        import grp
        import pwd

        self.dir = Path(
            tempfile.mkdtemp(prefix="slurm-hooks-munge-")
        )  # /tmp: the munge user must reach it
        self.socket = self.dir / "munge.socket"
        uid, gid = pwd.getpwnam("munge").pw_uid, grp.getgrnam("munge").gr_gid
        os.chmod(self.dir, 0o755)
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for path in (self.dir, key):
            os.chown(path, uid, gid)
        self.pid = None

    def start(self) -> None:
        argv = [
            "runuser",
            "-u",
            "munge",
            "--",
            find_binary("munged") or "munged",
            "--socket=%s" % self.socket,
            "--key-file=%s" % (self.dir / "munge.key"),
            "--pid-file=%s" % (self.dir / "munged.pid"),
            "--log-file=%s" % (self.dir / "munged.log"),
            "--seed-file=%s" % (self.dir / "munged.seed"),
            "--force",
        ]
        subprocess.run(argv, check=True, capture_output=True, timeout=15)  # daemonizes
        deadline = time.monotonic() + 10
        while not self.ok():
            assert time.monotonic() < deadline, (self.dir / "munged.log").read_text()
            time.sleep(0.05)
        self.pid = int((self.dir / "munged.pid").read_text())

    def ok(self) -> bool:
        cred = subprocess.run(
            ["munge", "-n", "-S", str(self.socket)], capture_output=True, timeout=5
        )
        return (
            cred.returncode == 0
            and subprocess.run(
                ["unmunge", "-S", str(self.socket)],
                input=cred.stdout,
                capture_output=True,
                timeout=5,
            ).returncode
            == 0
        )

    def stop(self) -> None:
        if self.pid is None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.pid = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def munge():
    require_slurm()
    m = PrivateMunge()
    m.start()
    yield m
    m.cleanup()


@pytest.fixture(scope="module")
def rig(tmp_path_factory, munge):
    r = start_rig(
        tmp_path_factory.mktemp("slurmfaults"), extra_conf="AuthInfo=socket=%s" % munge.socket
    )
    yield r
    r.stop()


@pytest.fixture
def hooks(rig, munge):
    rig.reset()
    yield rig
    if munge.pid is None:
        munge.start()
    rig.reset()


def assert_pending_then_delivered(hooks, restore) -> None:
    """The local record names the failed drain; once Slurm is back, the health run delivers it."""
    pending = hooks.local_state()["pending"]
    assert pending["checks"] == ["gpu.count"] and pending["job"] == str(DIRECT_JOB_ID), pending
    restore()
    hooks.log_offset = hooks.log_file.stat().st_size
    rc, _, err = hooks.run_health()
    level, kv = hooks.wait_decision("health")
    assert (rc, kv["outcome"]) == (1, "drained"), (kv, err)
    assert (
        is_drained(hooks.cluster.node_state("node1")) and ctld_reason(hooks.cluster) == kv["reason"]
    )
    assert "pending" not in hooks.local_state()


@pytest.mark.slurm
def test_slurmctld_down(hooks):
    """Connection refused: each call fails at once, retried `attempts` times within [drain] timeout."""
    c = hooks.cluster
    hooks.write_config(drain={"timeout": 2.0, "attempts": 2})
    hooks.fake.inject_fault(*GPU_FAULT)
    c.stop_ctld()
    rc, seconds, err = hooks.run_prolog()
    report("prolog, slurmctld down, [drain] timeout 2 s x 2", seconds)
    assert rc == 0 and "Traceback" not in err, err
    assert (
        seconds < unreachable_slurm_cost(2.0, 2, message_timeout=c.message_timeout)[0] + CHECKS_S
    ), seconds
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert (level, kv["decision"], kv["outcome"]) == ("ERROR", "drain", "slurm-unavailable"), kv
    assert_pending_then_delivered(hooks, c.start_ctld)


@pytest.mark.slurm
def test_slurmctld_slow(hooks):
    """slurmctld frozen (SIGSTOP) for 3 s while the prolog drains, then continued: the call waits inside
    its [drain] timeout (5 s, the default) and succeeds; the node ends up drained with our reason."""
    c = hooks.cluster
    hooks.fake.inject_fault(*GPU_FAULT)
    c.sigstop_ctld()
    thaw = threading.Timer(3.0, c.sigcont_ctld)
    thaw.start()
    try:
        rc, seconds, err = hooks.run_prolog()
    finally:
        thaw.join()
    report("prolog, slurmctld frozen for 3 s", seconds)
    assert rc == 1 and "Traceback" not in err, err
    assert 3.0 <= seconds < 3.0 + 5.0 + drainer.SETTLE_S + CHECKS_S, seconds
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert (kv["decision"], kv["outcome"]) == ("drain", "drained"), kv
    assert is_drained(c.node_state("node1")) and ctld_reason(c) == kv["reason"]
    state = hooks.local_state()
    assert state["drained"]["checks"] == ["gpu.count"] and "pending" not in state


@pytest.mark.slurm
def test_munge_down(hooks, munge):
    """No credential can be made: scontrol fails at once with a munge error, which is not retried."""
    hooks.fake.inject_fault(*GPU_FAULT)
    munge.stop()
    rc, seconds, err = hooks.run_prolog()
    report("prolog, munged stopped", seconds)
    assert rc == 0 and "Traceback" not in err, err
    assert seconds < 5.0 + CHECKS_S, seconds  # no waiting on a controller that cannot be asked
    level, kv = hooks.wait_decision("prolog", DIRECT_JOB_ID)
    assert (level, kv["decision"], kv["outcome"]) == ("ERROR", "drain", "slurm-unavailable"), kv
    assert "munge" in kv["detail"].lower(), kv
    assert_pending_then_delivered(hooks, munge.start)


# ------------------------------------------------------------------------------------------------
# found while writing the above (in-process, no Slurm needed)


def test_health_forgets_an_undelivered_drain_without_asking_slurm(tmp_path):
    from slurm_hooks.core.config import validate
    from slurm_hooks.hooks import run_hook
    from slurm_hooks.registry import Registry
    from slurm_hooks.result import Action, Result, Status
    from slurm_hooks.slurm.client import SlurmClient
    from tests.doubles.memory_slurm import cluster

    verdict = tmp_path / "verdict"
    verdict.write_text("broken")
    reg = Registry()

    @reg.check(name="demo.gpu", contexts=("prolog", "health"), timeout=2)
    def demo(params):
        """FAIL while the verdict file says 'broken'."""
        if verdict.read_text() == "broken":
            return Result(
                "demo.gpu", Status.FAIL, "GPU lost", component="gpu:0", action=Action.REBOOT
            )
        return Result("demo.gpu", Status.OK, "fine")

    config = validate(
        reg,
        {
            "general": {"mode": "enforce"},  # a drain is expected; the shipped default observes
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "records": {"enabled": False},
        },
    )
    backend = cluster()
    backend.down = True
    prolog = run_hook(
        "prolog",
        reg,
        config,
        {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node1"},
        client=SlurmClient(backend),
    )
    assert (
        prolog.enacted.outcome.value == "slurm-unavailable"
    )  # the drain could not be delivered: pending
    verdict.write_text("repaired")
    calls = backend.calls
    health = run_hook(
        "health", reg, config, {"SLURMD_NODENAME": "node1"}, client=SlurmClient(backend)
    )
    assert health.exit_code == 0 and backend.calls == calls
