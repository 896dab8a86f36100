"""Hangs and crashes under the real prolog process: an NVML call that never returns, an NVML call that
aborts the process, a sysfs read that blocks forever (a FIFO where the file should be).

The prolog runs as slurmd runs it: the real prolog.d/50-slurm-hooks script (only its
/usr/bin/slurm-hooks replaced by a wrapper that points at this checkout, the fake node's
libnvidia-ml.so.1 and a config file), with the job's environment; its exit code is what Slurm sees. Slurm is a fake `scontrol` first in
PATH that records its argv and answers like Slurm 22.05, so a drain is observable without a
controller (the real controller is exercised in test_e2e_slurm.py and test_slurm_faults.py).

Bound asserted: [deadline] prolog + 1 s isolation grace + [records] snapshot_timeout + interpreter
start-up (margin for a loaded 2-core machine). What a hang or crash *means* is policy: with
[drain] on_timeout = "alert" (default) the prolog logs it and exits 0 (the job runs, nothing is
drained); with "drain" the node is drained and the prolog exits 1 (slurm-hooks exits 10, which the
script turns into 1).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

DEADLINE = 2.0
SNAPSHOT_TIMEOUT = 1.0
ISOLATION_GRACE = 1.0  # hooks.ISOLATION_GRACE_S
START_UP_MARGIN = 3.0  # interpreter + imports + the parent's own work, on a busy 2-core VM
BOUND = DEADLINE + ISOLATION_GRACE + SNAPSHOT_TIMEOUT + START_UP_MARGIN

FAKE_SCONTROL = r'''#!{python}
"""Fake scontrol: records argv (one JSON list per line) and answers like Slurm 22.05 for node1..node9."""
import json, os, sys
base = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(base, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
reason_file = os.path.join(base, "node1.reason")
def line(name):
    reason = open(reason_file).read() if name == "node1" and os.path.exists(reason_file) else ""
    state = "IDLE+DRAIN" if reason else "IDLE"
    tail = " Reason=%s [root@2026-01-01T00:00:00]" % reason if reason else ""
    return "NodeName=%s Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=%s Partitions=debug%s" % (name, state, tail)
args = sys.argv[1:]
if args[:4] == ["--all", "--oneliner", "show", "node"]:
    names = args[4:] or ["node%d" % i for i in range(1, 10)]
    print("\n".join(line(n) for n in names))
elif args[:1] == ["update"] and "State=DRAIN" in args:
    reason = [a for a in args if a.startswith("Reason=")][0][len("Reason="):]
    open(reason_file, "w").write(reason)
else:
    sys.stderr.write("fake scontrol: unexpected %r\n" % (args,))
    sys.exit(1)
'''


INSTALLED_BINARY = "/usr/bin/slurm-hooks"  # the token in prolog.d/50-slurm-hooks that the test replaces


class Prolog:
    """A fake node, a config, a fake scontrol, and `run()` = the prolog as slurmd would start it."""

    def __init__(self, node, base: Path) -> None:
        self.node, self.base = node, base
        self.bin = base / "bin"
        self.bin.mkdir()
        scontrol = self.bin / "scontrol"
        scontrol.write_text(FAKE_SCONTROL.replace("{python}", sys.executable))
        scontrol.chmod(0o755)
        self.config = base / "config.toml"
        self.log = base / "log" / "slurm-hooks.log"
        self.write_config("alert")
        exports = {"SLURM_HOOKS_CONFIG": str(self.config), "SLURM_HOOKS_ALLOW_INSECURE_CONFIG": "1",
                   "SLURM_HOOKS_CHECKS_DIR": "", "PYTHONPATH": REPO,
                   "LD_LIBRARY_PATH": node.env["LD_LIBRARY_PATH"], "FAKE_NVML_STATE": node.env["FAKE_NVML_STATE"]}
        wrapper = self.bin / "slurm-hooks-wrapper"
        wrapper.write_text("#!/bin/sh\n" + "".join("export %s='%s'\n" % kv for kv in exports.items())
                           + 'exec %s -m slurm_hooks "$@"\n' % sys.executable)
        wrapper.chmod(0o755)
        script = (Path(REPO) / "prolog.d" / "50-slurm-hooks").read_text()
        assert INSTALLED_BINARY in script
        self.script = base / "prolog.d" / "50-slurm-hooks"
        self.script.parent.mkdir()
        self.script.write_text(script.replace(INSTALLED_BINARY, str(wrapper)))
        self.script.chmod(0o755)

    def write_config(self, on_timeout: str) -> None:
        self.config.write_text("\n".join([
            "[general]", 'root = "%s"' % self.node.root, 'root_live_sources = ["nvml"]',
            "[deadline]", "prolog = %s" % DEADLINE,
            "[drain]", 'on_timeout = "%s"' % on_timeout, 'backend = "scontrol"', "timeout = 2.0",
            "[paths]", 'state_dir = "%s"' % (self.base / "state"), 'log_file = "%s"' % self.log, "syslog = false",
            "[records]", 'dir = "%s"' % (self.base / "jobs"), "snapshot_timeout = %s" % SNAPSHOT_TIMEOUT, ""]))

    def run(self, label: str = ""):
        # what slurmd gives a prolog (22.05), plus PATH so that the fake scontrol is found first
        env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_JOB_GPUS": "0-7",
               "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
               "PATH": "%s:/usr/bin:/bin" % self.bin}
        started = time.monotonic()
        proc = subprocess.run([str(self.script)], env=env, capture_output=True, text=True, cwd=str(self.base),
                              timeout=60)
        seconds = time.monotonic() - started
        print("\n[reliability] prolog with %s: exit %d after %.2fs" % (label or "no fault", proc.returncode, seconds))
        return proc.returncode, seconds, proc.stderr

    def decision(self) -> dict:
        lines = [line for line in self.log.read_text().splitlines() if "context=prolog" in line and " decision=" in line]
        assert len(lines) == 1, lines
        return dict((k, v.strip('"')) for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', lines[0]))

    def scontrol_calls(self):
        calls = self.base / "bin" / "calls.jsonl"
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    def drain_reason(self):
        reason = self.bin / "node1.reason"
        return reason.read_text() if reason.exists() else None


@pytest.fixture
def prolog(fake_node, tmp_path):
    return Prolog(fake_node("dgx-h100"), tmp_path)


def make_fifo(node, path: str) -> None:
    """Replace a file of the tree by a FIFO: open() for reading blocks until a writer comes (never)."""
    real = node.path(path).resolve()
    real.unlink()
    os.mkfifo(str(real))


HANGS = {
    # fault -> (injector, names (or name prefixes) of the checks that time out; the log names one)
    "nvml-hang-all-gpus": (lambda n: n.inject_hang("nvmlDeviceGetCount"), ("gpu.",)),
    "nvml-hang-one-gpu": (lambda n: n.inject_hang("nvmlDeviceGetTemperature", 5),
                          ("gpu.clocks", "gpu.thermal", "gpu.power", "gpu.driver")),  # one shared GPU-state read
    "sysfs-fifo-numa-meminfo": (lambda n: make_fifo(n, "/sys/devices/system/node/node1/meminfo"), ("system.memory",)),
    "sysfs-fifo-pci-tree": (lambda n: make_fifo(n, "/sys/bus/pci/devices/0000:44:00.0/local_cpulist"),
                            ("topology.", "gpudirect.", "numa.")),  # every check built on the PCIe tree
}


@pytest.mark.parametrize("fault", sorted(HANGS))
def test_hang_is_bounded_and_alerts_by_default(prolog, fault):
    inject, checks = HANGS[fault]
    inject(prolog.node)
    rc, seconds, stderr = prolog.run(fault + " (on_timeout=alert)")
    assert rc == 0, stderr  # on_timeout = "alert": the job runs
    assert seconds < BOUND, seconds
    kv = prolog.decision()
    assert (kv["decision"], kv["status"], kv["blame"], kv["slurm_calls"]) == ("alert", "UNKNOWN", "check", "0"), kv
    assert kv["check"].startswith(checks), kv
    assert "did not finish within" in kv["reason"] or "not finished when the" in kv["reason"], kv
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
    assert (kv["decision"], kv["outcome"], kv["slurm_calls"]) == ("drain", "drained", "3"), kv
    reason = prolog.drain_reason()
    assert reason == kv["reason"] and reason.startswith("slurm-hooks: ") and \
        reason[len("slurm-hooks: "):].startswith(checks), reason
    assert "did not finish within" in reason or "not finished when the" in reason
    assert [c[:4] for c in prolog.scontrol_calls()] == [["--all", "--oneliner", "show", "node"]] * 2 + [
        ["update", "NodeName=node1", "State=DRAIN", "Reason=" + reason]]


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
        assert (kv["decision"], kv["slurm_calls"]) == ("alert", "0") and prolog.drain_reason() is None
    else:
        assert (kv["decision"], kv["outcome"]) == ("drain", "drained"), kv
        assert prolog.drain_reason().startswith("slurm-hooks: slurm-hooks.runner: the check process died of signal 6")


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
