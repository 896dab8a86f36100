"""The real prolog.d script run as slurmd runs it, on a fake GPU node, with a fake scontrol that records
every call: the rig of test_hangs.py and test_perf.py. Prolog(node, tmp_path).run() -> (rc, seconds, stderr).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO

DEADLINE = 20.0  # far above CHECK_TIMEOUT: a run that sits out its deadline fails the bound below
CHECK_TIMEOUT = 3.0  # the timeout of every GPU check and the longest of the checks hung below
SNAPSHOT_TIMEOUT = 1.0
FILES = 2.0  # [deadline] files
START_UP_MARGIN = 3.0  # interpreter + imports + the parent's own work, on a busy 2-core VM
BOUND = CHECK_TIMEOUT + SNAPSHOT_TIMEOUT + START_UP_MARGIN

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


INSTALLED_BINARY = (
    "/usr/bin/slurm-hooks"  # the token in prolog.d/50-slurm-hooks that the test replaces
)


class Prolog:
    """A fake node, a config, a fake scontrol, and `run()` = the prolog as slurmd would start it
    (`run(kind="epilog")`: the epilog)."""

    def __init__(self, node, base: Path) -> None:
        self.node, self.base = node, base
        self.records_dir, self.state_dir, self.dcgm_dir = base / "jobs", base / "state", ""
        self.bin = base / "bin"
        self.bin.mkdir()
        scontrol = self.bin / "scontrol"
        scontrol.write_text(FAKE_SCONTROL.replace("{python}", sys.executable))
        scontrol.chmod(0o755)
        self.config = base / "config.toml"
        self.log = base / "log" / "slurm-hooks.log"
        self.write_config("alert")
        exports = {
            "SLURM_HOOKS_CONFIG": str(self.config),
            "SLURM_HOOKS_ALLOW_INSECURE_CONFIG": "1",
            "SLURM_HOOKS_CONFIG_CACHE": "off",  # slurmd's environment: not the suite's (conftest)
            # the node lock in the rig's own stand-in for /run (local, like the tmpfs a node has),
            # not the host's /run, and not state_dir, which test_hangs hangs on purpose
            "SLURM_HOOKS_LOCK_DIR": str(base / "run"),
            "SLURM_HOOKS_CHECKS_DIR": "",
            "PYTHONPATH": REPO,
            "LD_LIBRARY_PATH": node.env["LD_LIBRARY_PATH"],
            "FAKE_NVML_STATE": node.env["FAKE_NVML_STATE"],
        }
        wrapper = self.bin / "slurm-hooks-wrapper"
        wrapper.write_text(
            "#!/bin/sh\n"
            + "".join("export %s='%s'\n" % kv for kv in exports.items())
            + 'exec %s -m slurm_hooks "$@"\n' % sys.executable
        )
        wrapper.chmod(0o755)
        self.scripts = {}
        for kind in ("prolog", "epilog"):
            script = (Path(REPO) / ("%s.d" % kind) / "50-slurm-hooks").read_text()
            assert INSTALLED_BINARY in script
            self.scripts[kind] = base / ("%s.d" % kind) / "50-slurm-hooks"
            self.scripts[kind].parent.mkdir()
            self.scripts[kind].write_text(script.replace(INSTALLED_BINARY, str(wrapper)))
            self.scripts[kind].chmod(0o755)
        self.script = self.scripts["prolog"]

    def write_config(self, on_timeout: str) -> None:
        self.on_timeout = on_timeout
        self.config.write_text(
            "\n".join(
                [
                    "[general]",
                    'mode = "enforce"',  # the tests expect drains; the shipped default observes
                    'root = "%s"' % self.node.root,
                    'root_live_sources = ["nvml"]',
                    "[deadline]",
                    "prolog = %s" % DEADLINE,
                    "epilog = %s" % DEADLINE,
                    "files = %s" % FILES,
                    "[drain]",
                    'on_timeout = "%s"' % on_timeout,
                    'backend = "scontrol"',
                    "timeout = 2.0",
                    "[paths]",
                    'state_dir = "%s"' % self.state_dir,
                    'log_file = "%s"' % self.log,
                    "syslog = false",
                    "[metrics]",
                    'dcgm_job_mapping_dir = "%s"' % self.dcgm_dir,
                    "[records]",
                    'dir = "%s"' % self.records_dir,
                    "snapshot_timeout = %s" % SNAPSHOT_TIMEOUT,
                    "",
                ]
            )
        )

    def place(self, records_dir=None, state_dir=None, dcgm_dir=None) -> None:
        """Move the records, state or dcgm-exporter directory (e.g. onto a hung file system)."""
        self.records_dir = records_dir or self.records_dir
        self.state_dir = state_dir or self.state_dir
        self.dcgm_dir = dcgm_dir or self.dcgm_dir
        self.write_config(self.on_timeout)

    def run(self, label: str = "", kind: str = "prolog"):
        # what slurmd gives a prolog (22.05), plus PATH so that the fake scontrol is found first
        env = {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_USER": "alice",
            "SLURMD_NODENAME": "node1",
            "SLURM_JOB_GPUS": "0-7",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "SLURM_SCRIPT_CONTEXT": "%s_slurmd" % kind,
            "PATH": "%s:/usr/bin:/bin" % self.bin,
        }
        started = time.monotonic()
        proc = subprocess.run(
            [str(self.scripts[kind])],
            env=env,
            capture_output=True,
            text=True,
            cwd=str(self.base),
            timeout=60,
        )
        seconds = time.monotonic() - started
        print(
            "\n[reliability] %s with %s: exit %d after %.2fs"
            % (kind, label or "no fault", proc.returncode, seconds)
        )
        return proc.returncode, seconds, proc.stderr

    def decision(self, kind: str = "prolog") -> dict:
        lines = [
            line
            for line in self.log.read_text().splitlines()
            if "context=%s" % kind in line and " decision=" in line
        ]
        assert len(lines) == 1, lines
        return dict((k, v.strip('"')) for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', lines[0]))

    def events(self, event: str) -> list:
        return [
            dict((k, v.strip('"')) for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line))
            for line in self.log.read_text().splitlines()
            if "event=%s " % event in line + " "
        ]

    def scontrol_calls(self):
        calls = self.base / "bin" / "calls.jsonl"
        return (
            [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
        )

    def drain_reason(self):
        reason = self.bin / "node1.reason"
        return reason.read_text() if reason.exists() else None


def make_fifo(node, path: str) -> None:
    """Replace a file of the tree by a FIFO: open() for reading blocks until a writer comes (never)."""
    real = node.path(path).resolve()
    real.unlink()
    os.mkfifo(str(real))
