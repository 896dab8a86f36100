"""A fake node plus the files and environment a hook sees on it, for whole-process benchmarks.

Layout under one temp directory: node/ (the fake sysfs/procfs tree and libnvidia-ml.so.1), etc/
(config.toml: observe mode, every path inside the temp dir, syslog off), var/ (state, log, records).
The hooks get the environment slurmd gives a prolog: SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_UID,
SLURMD_NODENAME, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, SLURM_SCRIPT_CONTEXT, and no PATH; plus the
fake library's LD_LIBRARY_PATH/FAKE_NVML_STATE and SLURM_HOOKS_CONFIG pointing at etc/config.toml.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Union

from tests.fakenode import FakeNode, load_spec
from tests.fakenode.node import build_node, fast_tmpdir

NODE_NAME = "node1"
_SLURM_CALLS = re.compile(r"\bslurm_calls=(\d+)")


class BenchNode:
    """Build with BenchNode.create(spec, overrides); call cleanup() when done."""

    def __init__(self, base: str, node: FakeNode, extra_config: str = ""):
        self.base = base
        self.node = node
        self.etc = os.path.join(base, "etc")
        self.var = os.path.join(base, "var")
        self.config_path = os.path.join(self.etc, "config.toml")
        self.log_file = os.path.join(self.var, "log", "slurm-hooks.log")
        self.state_dir = os.path.join(self.var, "state")
        self.records_dir = os.path.join(self.var, "jobs")
        os.makedirs(self.etc, mode=0o755, exist_ok=True)
        self.write_config(extra_config)

    @classmethod
    def create(
        cls,
        spec: Union[str, Dict[str, Any]] = "dgx-h100",
        overrides: Optional[Dict[str, Any]] = None,
        extra_config: str = "",
    ) -> "BenchNode":
        base = tempfile.mkdtemp(prefix="slurm-hooks-bench-", dir=fast_tmpdir())
        os.chmod(
            base, 0o755
        )  # root-owned, not group/world-writable: the config's ownership check passes
        try:
            node = build_node(load_spec(spec, overrides), os.path.join(base, "node"))
            return cls(base, node, extra_config)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    def write_config(self, extra: str = "", mode: str = "observe") -> None:
        text = (
            '[general]\nmode = %s\nroot = %s\nroot_live_sources = ["nvml"]\n\n'  # the fake library is its NVML
            "[paths]\nstate_dir = %s\nlog_file = %s\nsyslog = false\n\n"
            "[records]\ndir = %s\n"
            % (
                _q(mode),
                _q(str(self.node.root)),
                _q(self.state_dir),
                _q(self.log_file),
                _q(self.records_dir),
            )
        )
        with open(self.config_path, "w") as handle:
            handle.write(text + extra)
        os.chmod(self.config_path, 0o644)

    @property
    def gpu_count(self) -> int:
        return len(self.node.spec["gpu"])

    def base_env(self) -> Dict[str, str]:
        env = {
            "SLURM_HOOKS_CONFIG": self.config_path,
            "LD_LIBRARY_PATH": self.node.env["LD_LIBRARY_PATH"],
            "FAKE_NVML_STATE": self.node.env["FAKE_NVML_STATE"],
            "LANG": "C.UTF-8",
            # root's parsed-configuration cache (core/config_cache.py) is measured as a node has it,
            # warm after the first hook, but kept in this bench's directory, not the host's /run
            "SLURM_HOOKS_CONFIG_CACHE": os.path.join(self.var, "run"),
        }
        if os.geteuid() != 0:  # a non-root run cannot own the config as root
            env["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"] = "1"
        return env

    def hook_env(
        self, context: str, job_id: int, extra: Optional[Dict[str, str]] = None
    ) -> Dict[str, str]:
        """What slurmd sets for a prolog/epilog of job `job_id` holding every GPU of the node."""
        gpus = ",".join(str(i) for i in range(self.gpu_count))
        env = dict(
            self.base_env(),
            SLURM_JOB_ID=str(job_id),
            SLURM_JOB_USER="alice",
            SLURM_JOB_UID="1000",
            SLURMD_NODENAME=NODE_NAME,
            SLURM_JOB_GPUS=gpus,
            CUDA_VISIBLE_DEVICES=gpus,
            SLURM_SCRIPT_CONTEXT="%s_slurmd" % context,
        )
        env.update(extra or {})
        return env

    def health_env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = dict(self.base_env(), SLURMD_NODENAME=NODE_NAME)
        env.update(extra or {})
        return env

    def decision_lines(self) -> List[str]:
        try:
            with open(self.log_file) as handle:
                return [
                    line.rstrip("\n")
                    for line in handle
                    if "context=" in line and "decision=" in line
                ]
        except OSError:
            return []

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def slurm_calls(line: str) -> Optional[int]:
    """N from the decision log line's slurm_calls=N (requests the hook sent to slurmctld)."""
    match = _SLURM_CALLS.search(line)
    return int(match.group(1)) if match else None


def log_fields(line: str) -> Dict[str, str]:
    """key=value pairs of a decision log line (values quoted with "..." when they hold spaces)."""
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line)}


def _q(text: str) -> str:
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')
