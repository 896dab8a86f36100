"""A representative subset of the fault matrix (tests/test_fault_matrix.py) end to end: a real batch job
asking for all 8 GPUs, the real prolog.d script run by slurmd, a real slurmctld, the fake DGX node.
For each fault the node must end up DRAIN with our reason for that check, component and action (or,
for a fault that does not drain, the job completes and the node stays IDLE without a reason).

Faults are the matrix's own rows (same injection, same expectations), restricted to those that can be
injected into the running rig's node: NVML state and kernel log records.
"""

from __future__ import annotations

import time

import pytest

from slurm_hooks.slurm import policy
from tests.fault_table import FAULTS, Edits
from tests.slurm_rig import ctld_reason, is_drained, report, start_rig

pytestmark = pytest.mark.slurm

SUBSET = [
    "ecc-uncorrectable",
    "row-remap-failed",
    "nvlink-links-down",
    "leftover-process",
    "xid79-fell-off-bus",
    "sxid-fatal",
    "xid13-job-exception",
]
ROWS = {f.id: f for f in FAULTS}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = start_rig(tmp_path_factory.mktemp("matrix"))
    yield r
    r.stop()


@pytest.fixture
def hooks(rig):
    rig.reset()
    yield rig
    rig.reset()


def test_subset_is_representative():
    rows = [ROWS[name] for name in SUBSET]
    assert all(
        not r.overrides and not r.config and not r.files for r in rows
    )  # injectable into the live rig
    assert {r.family for r in rows} >= {"GPU", "NVLink", "XID"} and sum(r.drains for r in rows) >= 5
    assert any(not r.drains for r in rows)


@pytest.mark.parametrize("name", SUBSET)
def test_fault_on_a_real_controller(hooks, name):
    fault = ROWS[name]
    c = hooks.cluster
    edits = Edits(hooks.fake)
    try:
        if fault.nvml:
            edits.nvml(fault.nvml)
        if fault.kmsg:
            edits.kmsg(fault.kmsg)
        start = time.monotonic()
        job = c.sbatch(gpus=8)
        if fault.drains:
            c.wait_state("node1", is_drained, timeout=30)
            report("%s: sbatch -> node DRAIN" % name, time.monotonic() - start)
            level, kv = hooks.wait_decision("prolog", job)
            assert (kv["decision"], kv["outcome"], kv["check"]) == (
                "drain",
                "drained",
                fault.check,
            ), kv
            reason = ctld_reason(c)
            assert reason == kv["reason"], (reason, kv)
            # the head `sinfo -R` shows names the check (and the GPU); the component follows
            gpu = policy.gpu_index(fault.component)
            assert reason.startswith(
                "sh:%s%s" % (fault.check, "" if gpu is None else " g%d" % gpu)
            ), reason
            assert policy.read_reason(reason, "sh:").checks[0] == fault.check, reason
            assert (fault.component or "") in reason, reason
            if fault.action.value != "none":
                assert reason.endswith("-> " + fault.action.value), reason
            assert "Prolog error" not in reason and len(reason) <= 200
        else:
            assert c.wait_job(job, ("COMPLETED",), timeout=30) == "COMPLETED"
            level, kv = hooks.wait_decision("prolog", job)
            assert (kv["decision"], kv["check"], kv["slurm_calls"]) == (
                "alert",
                fault.check,
                "0",
            ), kv
            assert c.node_state("node1") == "IDLE" and c.node_reason("node1") is None
    finally:
        edits.restore()
