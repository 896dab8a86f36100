"""Slurm calls per hook run: the happy path (must be 0) and the drain/resume path (bounded).

The count is what the hook itself logs (slurm_calls=N on its decision line: requests sent to
slurmctld, retries and the backend probe included). Drain path: against a real slurmctld started by
tests/slurmcluster.py when Slurm is installed and we are root (the hooks run as slurmd would run
them, with SLURM_CONF), else against the in-memory backend of tests/test_drainer.py
(bench/memory_slurm.py). Sequence: healthy prolog; GPU 0 lost from NVML -> prolog drains; the same
prolog again (already drained by us); fault cleared -> health resumes; health again (nothing to do).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

from .measure import run_once
from .nodeenv import NODE_NAME, BenchNode, log_fields

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
GPU_FAULT = (
    "nvmlDeviceGetHandleByIndex",
    0,
    15,
)  # GPU 0 -> NVML_ERROR_GPU_IS_LOST: node-broken, drain
STEPS = (
    ("healthy prolog", "prolog", False),
    ("GPU lost: prolog drains", "prolog", True),
    ("prolog again (already drained by us)", "prolog", True),
    ("fixed: health resumes", "health", False),
    ("health again (nothing to do)", "health", False),
)


def drain_path(hook: Sequence[str], use_real_slurm: bool, first_job: int) -> Dict[str, Any]:
    if use_real_slurm:
        why_not = _real_slurm_unavailable()
        if why_not is None:
            return _real(hook, first_job)
        result = _memory(first_job)
        result["note"] = "real Slurm unavailable (%s): in-memory backend" % why_not
        return result
    return _memory(first_job)


def _real_slurm_unavailable() -> Optional[str]:
    try:
        from tests.slurmcluster import missing_requirements
    except ImportError as exc:
        return "tests/slurmcluster.py not importable: %s" % exc
    problems = missing_requirements()
    return "; ".join(problems) if problems else None


def _real(hook: Sequence[str], first_job: int) -> Dict[str, Any]:
    from tests.slurmcluster import SlurmCluster

    base = tempfile.mkdtemp(prefix="slurm-hooks-bench-slurm-")
    cluster = SlurmCluster(base, nodes=(NODE_NAME, "node2", "node3"))
    node = BenchNode.create()
    node.write_config(mode="enforce")
    rows: List[Dict[str, Any]] = []
    try:
        cluster.start()
        for i, (label, context, faulty) in enumerate(STEPS):
            if faulty:
                node.node.inject_fault(*GPU_FAULT)
            else:
                node.node.clear_faults()
            extra = {"SLURM_CONF": str(cluster.conf)}
            env = (
                node.hook_env(context, first_job + i, extra)
                if context != "health"
                else node.health_env(extra)
            )
            before = len(node.decision_lines())
            sample = run_once(list(hook) + [context], env, timeout=120)
            lines = node.decision_lines()[before:]
            fields = log_fields(lines[-1]) if lines else {}
            rows.append(
                {
                    "step": label,
                    "context": context,
                    "exit": sample.returncode,
                    "wall_ms": sample.seconds * 1e3,
                    "slurm_calls": _int(fields.get("slurm_calls")),
                    "outcome": fields.get("outcome") or fields.get("decision"),
                    "node_state": cluster.node_state(NODE_NAME),
                }
            )
        return {"backend": "real slurmctld + scontrol (tests/slurmcluster.py)", "steps": rows}
    finally:
        cluster.stop()
        node.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def _memory(first_job: int) -> Dict[str, Any]:
    node = BenchNode.create()
    node.write_config(extra='\n[nvml]\nlibrary = "%s"\n' % node.node.lib_path, mode="enforce")
    try:
        argv = [
            sys.executable,
            os.path.join(BENCH_DIR, "memory_slurm.py"),
            json.dumps(STEPS),
            json.dumps(list(GPU_FAULT)),
            str(first_job),
        ]
        proc = subprocess.run(
            argv,
            env=dict(node.base_env(), FAKE_NVML_STATE=str(node.node.state_path)),
            cwd=os.path.dirname(BENCH_DIR),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0 or not proc.stdout.strip():
            return {"backend": "in-memory", "error": proc.stderr.strip()[-800:], "steps": []}
        return {
            "backend": "in-memory (tests/test_drainer.py MemoryBackend)",
            "steps": json.loads(proc.stdout.strip().splitlines()[-1]),
        }
    finally:
        node.cleanup()


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
