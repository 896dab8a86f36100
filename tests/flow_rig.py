"""What several test modules share to drive the hooks' drain/resume flow (hooks.run_hook) with Slurm
in memory (tests/doubles/memory_slurm.py) and one check driven by a file: the `rig` fixture of
tests/test_drain_flow.py, and the `weeks` fixture of the lemon and repair tests (the history's clock
and the boot id injected, so months pass in a second). A test module takes a fixture by name:
`rig = flow_rig.rig`.
"""

from __future__ import annotations

import json

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.hooks import run_hook
from slurm_hooks.registry import Registry
from slurm_hooks.result import Action, ExitCode, Result, Status
from slurm_hooks.slurm import lemon
from slurm_hooks.slurm.client import SlurmClient
from tests.doubles.memory_slurm import cluster
from tests.helpers import abort_on_purpose, enforcing

JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1"}
HEALTH_ENV = {"SLURMD_NODENAME": "node1"}


@pytest.fixture
def rig(tmp_path):
    """verdict file -> what the one check says: node (FAIL, node-broken), ok, unknown, hang, crash."""
    inherited_by_the_hooks_children()
    verdict = tmp_path / "verdict"
    verdict.write_text("ok")
    reg = Registry()

    @reg.check(name="demo.gpu", contexts=("prolog", "epilog", "health"), timeout=2)
    def demo(params):
        """demo"""
        what = verdict.read_text().strip()
        if what == "node":
            return Result(
                "demo.gpu",
                Status.FAIL,
                "GPU 0 fell off the bus",
                component="gpu:0",
                action=Action.REBOOT,
            )
        if what == "node-gpu1":  # the same check, worded for another job's GPU
            return Result(
                "demo.gpu",
                Status.FAIL,
                "GPU 1 fell off the bus",
                component="gpu:1",
                action=Action.REBOOT,
            )
        if what == "unknown":
            return Result("demo.gpu", Status.UNKNOWN, "nvmlDeviceGetCount: NVML_ERROR_UNKNOWN")
        if what == "crash":
            abort_on_purpose()
        if what == "hang":
            import time

            time.sleep(60)
        return Result("demo.gpu", Status.OK, "fine")

    class Rig:
        state_file = tmp_path / "state" / "node-state.json"

        def __init__(self):
            self.backend = cluster()
            self.verdict = verdict

        def config(self, **sections):
            data = {
                "paths": {
                    "state_dir": str(tmp_path / "state"),
                    "log_file": str(tmp_path / "hooks.log"),
                    "syslog": False,
                },
                "records": {"enabled": False},
                "deadline": {"prolog": 1.0, "health": 1.0, "epilog": 1.0},
                "metrics": {"textfile_dir": str(tmp_path / "metrics")},
            }
            for key, value in sections.items():
                data.setdefault(key, {}).update(value)
            return validate(reg, enforcing(data))

        def run(self, context, what, **config):
            self.verdict.write_text(what)
            before = self.backend.calls
            out = run_hook(
                context,
                reg,
                self.config(**config),
                JOB_ENV if context != "health" else HEALTH_ENV,
                client=SlurmClient(self.backend),
            )
            out.calls = self.backend.calls - before  # this run's requests
            return out

        def state(self):
            return json.loads(self.state_file.read_text()) if self.state_file.exists() else None

        def node(self):
            return self.backend.nodes["node1"]

        def metric(self, name):
            text = (tmp_path / "metrics" / "slurm_hooks.prom").read_text()
            return [line for line in text.splitlines() if line.startswith(name + " ")]

    return Rig()


def inherited_by_the_hooks_children() -> None:
    """Import here what each run_hook's forked children import (the checks' child hw.nvml and
    ctypes, the steps' child prometheus_client for the metrics file): a child that finds them in
    sys.modules, inherited from this process, does the same work without importing them again,
    ~20 ms of CPU in every hook run (a hook is a fresh process, so it imports them once anyway).
    The imports themselves are the prolog start-up tests' business (test_startup_imports)."""
    from slurm_hooks.hw import nvml  # noqa: F401

    try:  # optional (the metrics extra): the packages' build roots run tests without it
        import prometheus_client  # noqa: F401
        import prometheus_client.core  # noqa: F401
    except ImportError:
        pass


DAY = 86400.0
START = 1796256000.0  # 2026-12-02


@pytest.fixture
def weeks(monkeypatch, rig):
    """rig plus a settable clock and boot id: rig.at(day, boot) then run hooks."""
    now = {"t": START, "boot": "boot-a"}
    monkeypatch.setattr(lemon, "now", lambda: now["t"])
    monkeypatch.setattr(lemon, "boot_id", lambda root: now["boot"])

    def at(day, boot="boot-a"):
        now["t"], now["boot"] = START + day * DAY, boot
        rig.backend.clock = now["t"]

    rig.at = at
    return rig


def fail_and_repair(rig, day, boot="boot-a", what="node"):
    """The node fails a prolog on `day` (drained), then passes a health run (resumed unless held)."""
    rig.at(day, boot)
    assert rig.run("prolog", what).exit_code == ExitCode.NODE_BROKEN
    drained = rig.node().reason
    return drained, rig.run("health", "ok")
