"""The /proc scan of system.processes and numa.housekeeping on a fake node with thousands of
processes. Kept apart from test_system_checks.py, which the RPM's %check runs without the fake node."""

from __future__ import annotations

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks
from slurm_hooks.hw.host import Host
from slurm_hooks.result import Status


def test_a_process_scan_costs_no_path_resolution_or_pattern_match_per_process(
    registry, fake_node, monkeypatch
):
    """100,000 processes timed system.processes and numa.housekeeping out (issue 24): under a root,
    every /proc/<pid>/comm and cgroup read resolved its path component by component (two lstat(2)
    per file, 56 % of the scan), and housekeeping matched each process's cgroup against every
    pattern although thousands of processes share a cgroup. Counted, not timed: the scan of 2,000
    processes now makes a constant number of symlink checks and one match per distinct cgroup."""
    import fnmatch
    import os.path

    node = fake_node("cpu-only", {"node": {"extra_processes": 2000}})
    config = validate(
        registry,
        {
            "checks": {
                "system.processes": {"required": ["sshd"], "forbidden": ["Xorg"]},
                "numa.housekeeping": {"housekeeping_cpus": "0-1"},
            }
        },
    )
    calls = {"islink": 0, "fnmatchcase": 0}

    def counted(name, real):
        def wrapper(*args):
            calls[name] += 1
            return real(*args)

        return wrapper

    monkeypatch.setattr(os.path, "islink", counted("islink", os.path.islink))
    monkeypatch.setattr(fnmatch, "fnmatchcase", counted("fnmatchcase", fnmatch.fnmatchcase))
    specs = [registry.checks["system.processes"], registry.checks["numa.housekeeping"]]
    report = run_checks(registry, config, Host(str(node.root)), "manual", specs, deadline=120.0)
    by_name = {r.check: r for r in report.results()}
    assert by_name["system.processes"].status is Status.OK  # sshd runs, Xorg does not
    assert by_name["numa.housekeeping"].status is Status.WARN  # the unpinned daemons
    assert calls["islink"] < 1000, calls  # was 2 per file read: > 8,000 here
    # the fake node's 2,000 user processes live in 300 session scopes: at most one match of the
    # watched pattern (and two exclusions) per distinct cgroup, not per process
    assert calls["fnmatchcase"] < 1000, calls
