"""The drain-path sequence of bench/slurm_bench.py against tests/test_drainer.py's in-memory Slurm.

    SLURM_HOOKS_CONFIG=... python bench/memory_slurm.py STEPS_JSON FAULT_JSON FIRST_JOB

Runs hooks.run_hook in this process (its checks still run in a forked child) with a SlurmClient on
the in-memory backend, which counts every request; prints one JSON list of step results.
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]


def main(steps, fault, first_job: int) -> None:
    from test_drainer import cluster

    from slurm_hooks.core.config import load_registry_and_config
    from slurm_hooks.hooks import run_hook
    from slurm_hooks.slurm.client import SlurmClient
    from tests.fakenode import nvmlstate

    registry, config = load_registry_and_config(None)
    state_path = os.environ["FAKE_NVML_STATE"]
    backend = cluster()
    rows = []
    for i, (label, context, faulty) in enumerate(steps):
        key = "fault.%s.%s" % (fault[0], fault[1])
        nvmlstate.update_state(state_path, {key: fault[2] if faulty else None})
        env = {"SLURMD_NODENAME": "node1"}
        if context != "health":
            env.update(
                SLURM_JOB_ID=str(first_job + i),
                SLURM_JOB_USER="alice",
                SLURM_JOB_GPUS="0,1,2,3,4,5,6,7",
            )
        before = backend.calls
        started = time.perf_counter()
        outcome = run_hook(context, registry, config, env, client=SlurmClient(backend))
        node = backend.nodes["node1"]
        rows.append(
            {
                "step": label,
                "context": context,
                "exit": outcome.exit_code,
                "wall_ms": (time.perf_counter() - started) * 1e3,
                "slurm_calls": backend.calls - before,
                "outcome": outcome.enacted.outcome.value
                if outcome.enacted
                else outcome.decision.verdict.value,
                "node_state": "+".join([node.state] + sorted(node.flags)),
            }
        )
    sys.stdout.write(json.dumps(rows) + "\n")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]))
    sys.stdout.flush()
    os._exit(0)
