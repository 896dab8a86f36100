"""The sample outputs in docs/cli.md, made by running the verbs: `check` on the fake dgx-h100 node with
planted faults, `status` against the in-memory slurmctld (tests/doubles/memory_slurm.py), `report` and
`report --stragglers` on the test suite's records (tests/straggler_records.py, bench/fleet_synth.py's
record layout). tools/update_cli_samples.py writes them into docs/cli.md; tests/test_cli_docs.py
regenerates them and compares their structure (numbers and column widths aside)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "cli.md")

CHECK_FAULTS = {
    "gpu": {
        2: {"nvlink": {"links": {5: {"state": False}}}},
        1: {"pcie": {"width": 8}},
        3: {"pcie": {"width": 8}},
    }
}


def _config(directory: str) -> str:
    path = os.path.join(directory, "config.toml")
    with open(path, "w") as handle:
        handle.write(
            '[general]\nmode = "enforce"\n[paths]\nstate_dir = "%s"\nlog_file = ""\n'
            "syslog = false\n" % os.path.join(directory, "state")
        )
    return path


def _main(argv: List[str]) -> str:
    from slurm_hooks.cli.main import main

    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        mock.patch.dict(os.environ, {"SLURM_HOOKS_ALLOW_INSECURE_CONFIG": "1", "NO_COLOR": "1"}),
    ):
        main(argv)
    return out.getvalue()


def sample_check() -> str:
    from tests.fakenode import FakeNode

    node = FakeNode.build_temp("dgx-h100", CHECK_FAULTS)
    try:
        argv = ["check", "--root", str(node.root), "--live", "nvml", "gpu"]
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_hooks"] + argv,
            capture_output=True,
            text=True,
            cwd=REPO,
            env=node.subprocess_env(),
            timeout=120,
        )
        return "$ slurm-hooks check gpu\n" + proc.stdout
    finally:
        node.cleanup()


def sample_status() -> str:
    from slurm_hooks.slurm.client import SlurmClient
    from slurm_hooks.slurm.node_state import NodeInfo
    from tests.doubles.memory_slurm import cluster

    backend = cluster()
    drained = frozenset({"DRAIN"})
    backend.nodes["node1"] = NodeInfo(
        "node1",
        "IDLE",
        drained,
        "slurm-hooks: gpu.nvlink: gpu:2 0000:42:00.0 17 of 18 NVLinks active -> drain",
        "root",
        "2026-12-02T08:14:05",
    )
    backend.nodes["node2"] = NodeInfo(
        "node2", "IDLE", drained, "slurm-hooks: manual: PSU swap", "alice", "2026-12-02T09:30:00"
    )
    backend.nodes["node4"] = NodeInfo(
        "node4",
        "DOWN",
        frozenset({"NOT_RESPONDING"}),
        "Not responding",
        "slurm",
        "2026-12-01T22:03:11",
    )
    with (
        tempfile.TemporaryDirectory() as directory,
        mock.patch("slurm_hooks.slurm.drainer.make_client", lambda settings: SlurmClient(backend)),
        mock.patch("slurm_hooks.slurm.client.expand_hostlist", lambda text, **kw: text.split(",")),
        mock.patch.dict(os.environ, {"SLURMD_NODENAME": "node3"}),
    ):
        text = _main(
            ["--config", _config(directory), "status", "--node", "node1,node2,node3,node4"]
        )
    return "$ slurm-hooks status --node node[1-4]\n" + text


def _records(directory: str) -> str:
    from bench import fleet_synth
    from slurm_hooks.records.store import encode_record
    from tests.straggler_records import NOW, write_jobs

    jobs = os.path.join(directory, "jobs")
    write_jobs(jobs, jobs=12)  # n03 runs in HW slowdown in every job
    for node, job, summary in (
        ("n02", "900", {"abnormal": ["ecc_uncorrected", "xids"], "ecc_uncorrected": 2, "xids": 1}),
        ("n05", "901", {"abnormal": ["leftover_processes"], "leftover_processes": 1}),
    ):
        record = fleet_synth.header_record(job, "alice", node, NOW - 7200, NOW - 3600, {})
        record["summary"].update(summary)
        with open(os.path.join(jobs, node, job + ".json"), "wb") as handle:
            handle.write(encode_record(record))
    return jobs


def sample_report() -> str:
    with tempfile.TemporaryDirectory() as directory:
        jobs = _records(directory)
        text = _main(["--config", _config(directory), "report", jobs])
    return "$ slurm-hooks report /shared/slurm-hooks/jobs\n" + text


def sample_stragglers() -> str:
    with tempfile.TemporaryDirectory() as directory:
        jobs = _records(directory)
        text = _main(["--config", _config(directory), "report", "--stragglers", jobs])
    return "$ slurm-hooks report --stragglers /shared/slurm-hooks/jobs\n" + text


SAMPLES: Dict[str, Callable[[], str]] = {
    "check": sample_check,
    "status": sample_status,
    "report": sample_report,
    "stragglers": sample_stragglers,
}


def block_markers(name: str):
    return "<!-- sample:%s:start -->\n```text\n" % name, "```\n<!-- sample:%s:end -->" % name


def read_block(text: str, name: str) -> str:
    start, end = block_markers(name)
    return text.split(start, 1)[1].split(end, 1)[0]


def replace_block(text: str, name: str, body: str) -> str:
    start, end = block_markers(name)
    head, rest = text.split(start, 1)
    return head + start + body + end + rest.split(end, 1)[1]


def structure(text: str) -> List[str]:
    """A sample without what changes from run to run: numbers (times, counts) and column padding."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"\d+(?:\.\d+)?", "N", line)
        lines.append(" ".join(line.split()))
    return lines
