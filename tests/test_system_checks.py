"""Family `system`: pure checks on hand-made snapshots, gatherers on fixture trees, and this machine."""
from __future__ import annotations

import pytest

from slurm_hooks.checks import system
from slurm_hooks.config import validate
from slurm_hooks.host import Host
from slurm_hooks.parsers import LoadAvg, Mount, SwapArea
from slurm_hooks.registry import Params
from slurm_hooks.result import Status
from slurm_hooks.runner import run_checks, select_checks


def params(registry, name, **overrides):
    values = registry.checks[name].default_params()
    values.update(overrides)
    return Params(values)


DGX_CPU = system.CpuTopology(frozenset(range(224)), frozenset(), 2, 112, 224, ("Intel Xeon Platinum 8480C",))


@pytest.mark.parametrize("overrides,status,fragment", [
    ({}, Status.OK, "2 sockets x 56 cores x 2 threads (224 CPUs)"),
    ({"sockets": 2, "cores_per_socket": 56, "threads_per_core": 2}, Status.OK, "224 CPUs"),
    ({"sockets": 2, "cores_per_socket": 48}, Status.FAIL, "cores_per_socket 56, expected 48"),
    ({"threads_per_core": 1}, Status.FAIL, "threads_per_core 2, expected 1"),
])
def test_cpu_topology(registry, overrides, status, fragment):
    result = system.cpu_topology(DGX_CPU, params(registry, "system.cpu", **overrides))
    assert result.status is status and fragment in result.summary


def test_cpu_offline(registry):
    cpu = system.CpuTopology(frozenset(range(8)), frozenset({8, 9}), 1, 4, 8, ())
    assert system.cpu_topology(cpu, params(registry, "system.cpu")).status is Status.FAIL
    assert system.cpu_topology(cpu, params(registry, "system.cpu", allow_offline=True)).status is Status.OK


def test_memory(registry):
    mem = system.MemoryState(2 * 1024 * 1024 * 1024, 1024 * 1024 * 1024, ((0, 1000, 500), (1, 1000, 10)))
    assert system.memory(mem, params(registry, "system.memory"))[0].status is Status.OK
    low = system.memory(mem, params(registry, "system.memory", min_total_gib=4096.0))
    assert low[0].status is Status.FAIL and "2048.0 GiB physical memory, expected >= 4096.0" in low[0].summary
    numa = system.memory(mem, params(registry, "system.memory", min_free_percent_per_numa=5.0))
    assert [(r.status, r.component) for r in numa] == [(Status.WARN, "numa:1")]


def test_swap(registry):
    none = system.swap((), params(registry, "system.swap", allow_swap=False))
    assert none.status is Status.OK and none.summary == "no swap"
    area = (SwapArea("/dev/dm-1", 1000, 900),)
    assert system.swap(area, params(registry, "system.swap")).status is Status.WARN
    assert system.swap((SwapArea("/s", 1000, 0),), params(registry, "system.swap", allow_swap=False)).status \
        is Status.WARN
    assert system.swap((SwapArea("/s", 1000, 10),), params(registry, "system.swap")).status is Status.OK


def test_filesystems(registry):
    root = Mount("/dev/sda1", "/", "ext4", ("rw",))
    scratch_ro = Mount("srv:/s", "/scratch", "nfs", ("ro",))
    p = params(registry, "system.filesystems", mounted=["/scratch", "/home"])
    states = (
        system.FsState("/scratch", scratch_ro, True, 50.0, 50.0),
        system.FsState("/home", root, False, 50.0, 50.0),
        system.FsState("/tmp", root, False, 2.0, 50.0),
        system.FsState("/var", root, False, 50.0, 1.0),
        system.FsState("/ok", root, False, 50.0, 50.0),
        system.FsState("/gone", root, False, None, None, "/gone: Stale file handle"),
    )
    got = [(r.status, r.component, r.summary) for r in system.filesystems(states, p)]
    assert got[0][:2] == (Status.FAIL, "fs:/scratch") and "read-only" in got[0][2]
    assert got[1] == (Status.FAIL, "fs:/home", "/home is not mounted")
    assert got[2][0] is Status.FAIL and "free space" in got[2][2]
    assert got[3][0] is Status.FAIL and "free inodes" in got[3][2]
    assert got[4][0] is Status.OK
    assert got[5][0] is Status.UNKNOWN and "Stale" in got[5][2]


def test_holding_mount_is_longest_prefix():
    mounts = [Mount("a", "/", "ext4", ("rw",)), Mount("b", "/scratch", "xfs", ("rw",)),
              Mount("c", "/scratch2", "xfs", ("rw",))]
    assert system._holding_mount("/scratch/user", mounts).device == "b"
    assert system._holding_mount("/scratch2", mounts).device == "c"
    assert system._holding_mount("/tmp", mounts).device == "a"


def test_processes_and_kernel(registry):
    running = frozenset({"munged", "slurmd", "Xorg"})
    ok = system.processes(running, params(registry, "system.processes", required=["munged", "slurmd"]))
    assert ok.status is Status.OK
    bad = system.processes(running, params(registry, "system.processes", required=["nvidia-persistenced"],
                                           forbidden=["Xorg"]))
    assert bad.status is Status.FAIL and "not running: nvidia-persistenced" in bad.summary and "Xorg" in bad.summary
    assert system.processes(running, params(registry, "system.processes")).status is Status.SKIP
    k = "5.15.0-105-generic"
    assert system.kernel(k, params(registry, "system.kernel", allow=["5.15.0-*"])).status is Status.OK
    assert system.kernel(k, params(registry, "system.kernel", allow=["6.*"])).status is Status.FAIL
    assert system.kernel(k, params(registry, "system.kernel", deny=["5.15.0-105*"])).status is Status.FAIL


def test_load(registry):
    assert system.load((LoadAvg(1.0, 1, 1, 1, 10), 8), params(registry, "system.load")).status is Status.OK
    busy = system.load((LoadAvg(20.0, 1, 1, 1, 10), 8), params(registry, "system.load"))
    assert busy.status is Status.WARN and "2.50 per CPU" in busy.summary


FIXTURE_TREE = {
    "sys/devices/system/cpu/online": "0-3\n",
    "sys/devices/system/cpu/offline": "\n",
    "proc/cpuinfo": "processor\t: 0\nmodel name\t: Test CPU\n\nprocessor\t: 1\nmodel name\t: Test CPU\n",
    "proc/meminfo": "MemTotal: 16777216 kB\nMemFree: 8388608 kB\nMemAvailable: 9000000 kB\n",
    "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: 8388608 kB\nNode 0 MemFree: 4194304 kB\n",
    "sys/devices/system/node/node1/meminfo": "Node 1 MemTotal: 8388608 kB\nNode 1 MemFree: 4194304 kB\n",
    "proc/swaps": "Filename Type Size Used Priority\n",
    "proc/mounts": "/dev/sda1 / ext4 rw 0 0\n",
    "proc/sys/kernel/osrelease": "5.15.0-105-generic\n",
    "proc/loadavg": "0.50 0.40 0.30 1/200 999\n",
    "proc/1/comm": "systemd\n",
    "proc/77/comm": "munged\n",
}
for _cpu in range(4):
    FIXTURE_TREE["sys/devices/system/cpu/cpu%d/topology/physical_package_id" % _cpu] = "%d\n" % (_cpu // 2)
    FIXTURE_TREE["sys/devices/system/cpu/cpu%d/topology/core_id" % _cpu] = "%d\n" % (_cpu % 2)


def test_gatherers_on_fixture_tree(registry, write_tree):
    root = write_tree(FIXTURE_TREE)
    config = validate(registry, {"checks": {"system.processes": {"required": ["munged"]},
                                            "system.cpu": {"sockets": 2, "cores_per_socket": 2}}})
    report = run_checks(registry, config, Host(root), "manual", select_checks(registry, "manual", ["system"]))
    by_name = {run.name: run for run in report.runs}
    assert by_name["system.cpu"].status is Status.OK, by_name["system.cpu"].results
    assert "2 sockets x 2 cores x 1 threads" in by_name["system.cpu"].results[0].summary
    assert by_name["system.memory"].results[0].summary.startswith("16.0 GiB total")
    assert by_name["system.processes"].status is Status.OK
    assert by_name["system.kernel"].results[0].details["release"] == "5.15.0-105-generic"
    assert by_name["system.load"].status is Status.OK


def test_malformed_sysfs_gives_unknown_not_crash(registry, write_tree):
    tree = dict(FIXTURE_TREE, **{"sys/devices/system/cpu/online": "zero-three\n", "proc/loadavg": "\x00\xff"})
    report = run_checks(registry, validate(registry, {}), Host(write_tree(tree)), "manual",
                        select_checks(registry, "manual", ["system.cpu", "system.load"]))
    for run in report.runs:
        assert run.status is Status.UNKNOWN
        assert "/sys/devices/system/cpu/online" in run.results[0].summary or "/proc/loadavg" in run.results[0].summary


def test_system_checks_on_this_machine(registry):
    """Runs against the real /proc and /sys: every check must evaluate (no UNKNOWN on a sane Linux box)."""
    report = run_checks(registry, validate(registry, {}), Host("/"), "manual", select_checks(registry, "manual",
                                                                                             ["system"]))
    statuses = {run.name: run.status for run in report.runs}
    assert Status.UNKNOWN not in statuses.values(), [r.results for r in report.runs if r.status is Status.UNKNOWN]
    assert statuses["system.cpu"] is Status.OK
    cpu = next(run for run in report.runs if run.name == "system.cpu").results[0]
    import os
    assert cpu.details["online"] == len(os.sched_getaffinity(0)) or cpu.details["online"] >= 1
