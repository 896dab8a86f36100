"""Shared fixtures. Config files written by tests live in root-owned temp dirs; outside root-run CI
the ownership check would refuse them, so tests that need that opt in explicitly."""
from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def abort_on_purpose() -> None:
    """Kill this (forked check) process with SIGABRT, as an NVML call that aborts does, without the
    "Fatal Python error: Aborted" thread dump pytest's faulthandler would print into the CI log: every
    test that crashes a process on purpose goes through here (test_hooks checks that none calls
    os.abort() itself)."""
    import faulthandler

    faulthandler.disable()
    os.abort()


@pytest.fixture
def registry():
    from slurm_hooks.registry import load_builtin_checks

    return load_builtin_checks()


@pytest.fixture
def default_config(registry):
    from slurm_hooks.core.config import validate

    return validate(registry, {})


@pytest.fixture
def write_tree(tmp_path):
    """write_tree({"proc/loadavg": "0.1 ...", ...}) -> root dir with those files."""

    def write(files, root=None):
        base = root or tmp_path / "root"
        for rel, content in files.items():
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        return str(base)

    return write


from slurmcluster import slurm_cluster, slurm_cluster_factory  # noqa: E402,F401  (pytest fixtures)


@pytest.fixture
def fake_node():
    """fake_node("dgx-h100", overrides=None) -> a built FakeNode (tree + fake libnvidia-ml), removed afterwards."""
    from tests.fakenode import FakeNode

    built = []

    def build(spec="dgx-h100", overrides=None):
        node = FakeNode.build_temp(spec, overrides)
        built.append(node)
        return node

    yield build
    for node in built:
        node.cleanup()


@pytest.fixture
def nvml_node(fake_node):
    """fake_node, plus the real pynvml pointed at its library (in-process) and fresh slurm_hooks.hw.nvml sessions."""
    from slurm_hooks.hw import nvml
    from tests.fakenode import fakenvml

    def build(spec="dgx-h100", overrides=None):
        node = fake_node(spec, overrides)
        fakenvml.unload_from_pynvml()
        nvml.reset_sessions()
        node.load_into_pynvml()
        return node

    yield build
    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()


def fake_node_config(config=None):
    """`config` plus [general] root_live_sources = ["nvml"]: under a root other than / NVML is refused
    unless asked for, and a fake node's NVML is the fake library (`--live nvml` on the command line)."""
    data = dict(config or {})
    general = dict(data.get("general", {}))
    general.setdefault("root_live_sources", ["nvml"])
    data["general"] = general
    return data


def run_on_node(registry, node, names, config=None, job=None, context="manual"):
    """Results of the named checks (or families) on a fake node, in-process, as `slurm-hooks check --live nvml` runs
    them (the fake node's NVML is the fake library this process loaded)."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.runner import run_checks, select_checks
    from slurm_hooks.hw.host import Host

    report = run_checks(registry, validate(registry, fake_node_config(config)), Host(str(node.root)), context,
                        select_checks(registry, context, names), job=job)
    return report.results()
