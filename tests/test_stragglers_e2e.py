"""End to end: several fake nodes run the real prolog.d and epilog.d scripts for the same job id, into
one shared records directory; one of them has a GPU in HW slowdown and an InfiniBand port stalling.
`slurm-hooks report --stragglers` over that directory names that node and those figures, and no other.

The nodes are tests/prolog_rig.py's harness (as in test_perf.py: a fake GPU node, the installed hook scripts
pointed at this checkout, a fake scontrol), each with its own SLURMD_NODENAME. The report runs in this
process (tests/inprocess_cli.py; the verb's subprocess test is test_report's).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.inprocess_cli import cli_in_process
from tests.prolog_rig import Prolog
from tests.straggler_records import write_key

JOB = "4242"
JOB_CPUS = [0, 1, 2, 3]
WAIT_S = 1.3  # the job's wall time is at least this (rates need >= 1 s)
NODE_NAMES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05")
SLOW = "gpu04"


class NamedNode(Prolog):
    """The harness, as slurmd on node `name` starts the hooks, writing into a shared records directory,
    with a roomy snapshot budget (this test is about the figures, not about a loaded machine's timing)."""

    def __init__(self, node, base, name, shared, key_file):
        self.name, self.key_file = name, key_file
        super().__init__(node, base)
        self.place(records_dir=shared)

    def write_config(self, on_timeout):
        super().write_config(on_timeout)
        text = self.config.read_text().replace("snapshot_timeout = 1.0", "snapshot_timeout = 20.0")
        # every node signs its records with the fleet's key (docs/records.md)
        self.config.write_text(
            text.replace("[records]\n", '[records]\nkey_file = "%s"\n' % self.key_file, 1)
        )

    def run(self, label="", kind="prolog"):
        env = {
            "SLURM_JOB_ID": JOB,
            "SLURM_JOB_USER": "alice",
            "SLURMD_NODENAME": self.name,
            "SLURM_JOB_GPUS": "0-7",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "SLURM_SCRIPT_CONTEXT": "%s_slurmd" % kind,
            "PATH": "%s:/usr/bin:/bin" % self.bin,
        }
        proc = subprocess.run(
            [str(self.scripts[kind])],
            env=env,
            capture_output=True,
            text=True,
            cwd=str(self.base),
            timeout=60,
        )
        return proc.returncode, 0.0, proc.stderr


@pytest.fixture
def fleet_nodes(fake_node, tmp_path):
    shared = tmp_path / "shared-jobs"
    overrides = {"job": {JOB: {"cpus": "0-3"}}}
    made = []
    key_file = write_key(tmp_path / "records.key", os.urandom(32))
    for name in NODE_NAMES:
        (tmp_path / name).mkdir()
        node = fake_node("dgx-h100", overrides)
        made.append(NamedNode(node, tmp_path / name, name, shared, key_file))
    return shared, made


def test_the_report_names_the_skewed_node_and_its_figures(fleet_nodes, tmp_path):
    shared, nodes = fleet_nodes
    for hooks in nodes:  # all prologs, as slurmd starts a job on its nodes
        rc, _, err = hooks.run(kind="prolog")
        assert rc == 0, err
    started = time.monotonic()
    for (
        hooks
    ) in nodes:  # the job runs the same work everywhere; on SLOW a GPU and a port hold it back
        node = hooks.node
        node.add_cgroup_usage(4 * 600_000, job_id=JOB)
        node.set_states({"gpu.%d.power.energy_mj" % i: 123456789 + 500_000 for i in range(8)})
        node.add_cpu_ticks({c: {"user": 60} for c in JOB_CPUS})
        if hooks.name == SLOW:
            node.set_states({"gpu.3.clock_event_ns.hw_power_brake_slowdown": 3 * 10**8})
            node.write("/sys/class/infiniband/mlx5_2/ports/1/counters/port_xmit_wait", "5000000")
    time.sleep(max(0.0, WAIT_S - (time.monotonic() - started)))
    for hooks in nodes:
        rc, _, err = hooks.run(kind="epilog")
        assert rc == 0, err
    assert sorted(os.listdir(shared)) == list(NODE_NAMES)

    config = (
        tmp_path / "report.toml"
    )  # one job: flagged once is enough here (k = m = 1); the job ran ~1.5 s
    config.write_text(
        '[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
        '[fleet]\nk = 1\nm = 1\nmin_job_seconds = 1.0\n[records]\nkey_file = "%s"\n'
        % (tmp_path / "admin-state", tmp_path / "records.key")
    )
    env = dict(os.environ, SLURM_HOOKS_CONFIG=str(config), SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    done = cli_in_process(["report", "--stragglers", "--json", str(shared)], env=env)
    assert done.returncode == 1, done.stderr  # ExitCode.FOUND: suspects
    data = json.loads(done.stdout)
    assert (data["records"], data["jobs_scored"], data["node_jobs"]) == (5, 1, 5), data
    assert data["verified"] and data["unverified"] == 0  # each epilog signed its record
    found = {(s["node"], s["metric"]) for s in data["suspects"]}
    assert {s["node"] for s in data["suspects"]} == {SLOW}, data["suspects"]
    assert {(SLOW, "throttle_frac.hw_slowdown"), (SLOW, "ib_xmit_wait_per_s")} <= found, found
    hw = next(s for s in data["suspects"] if s["metric"] == "throttle_frac.hw_slowdown")
    (evidence,) = hw["evidence"]
    assert (
        evidence["job"] == JOB
        and evidence["median"] == 0.0
        and evidence["peers"] == 4
        and evidence["value"] > 0.03
    )  # 0.3 s of a few seconds

    table = cli_in_process(["report", "--stragglers", str(shared)], env=env)
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert rows and all(row[0] == SLOW for row in rows), table.stdout
