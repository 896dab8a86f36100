"""Family `system`: pure checks on hand-made snapshots, gatherers on fixture trees, and this machine."""

from __future__ import annotations

import pytest

from slurm_hooks.checks import system
from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks, select_checks
from slurm_hooks.hw.host import Host
from slurm_hooks.hw.procfs import LoadAvg, Mount, SwapArea, holding_mount
from slurm_hooks.registry import Params
from slurm_hooks.result import Action, Status


def params(registry, name, **overrides):
    values = registry.checks[name].default_params()
    values.update(overrides)
    return Params(values)


def layout(sockets, offline=(), present=None):
    """A CpuLayout from [[core CPU lists], ...] per socket (socket n named 'socket n')."""
    from slurm_hooks.hw import cputopo

    socks = tuple(
        cputopo.Socket(
            "socket %d" % i,
            frozenset(c for core in cores for c in core),
            tuple(frozenset(core) for core in cores),
        )
        for i, cores in enumerate(sockets)
    )
    online = frozenset(c for s in socks for c in s.cpus)
    offline = frozenset(offline)
    return cputopo.CpuLayout(online, offline, present or online | offline, socks, "test")


def dgx(sockets=2, cores=56, threads=2):
    n = sockets * cores
    return [
        [[s * cores + c + t * n for t in range(threads)] for c in range(cores)]
        for s in range(sockets)
    ]


@pytest.mark.parametrize(
    "overrides,status,fragment",
    [
        ({}, Status.OK, "2 sockets x 56 cores x 2 threads (224 CPUs)"),
        ({"sockets": 2, "cores_per_socket": 56, "threads_per_core": 2}, Status.OK, "224 CPUs"),
        (
            {"sockets": 2, "cores_per_socket": 48},
            Status.FAIL,
            "socket 0 (CPUs 0-55,112-167): 56 cores, expected 48; socket 1 (CPUs 56-111,168-223): 56 cores, expected 48",
        ),
        (
            {"threads_per_core": 1},
            Status.FAIL,
            "socket 0 (CPUs 0-55,112-167): 2 threads per core, expected 1",
        ),
        ({"sockets": 4}, Status.FAIL, "sockets 2, expected 4"),
    ],
)
def test_cpu_topology(registry, overrides, status, fragment):
    dgx_cpu = system.CpuTopology(layout(dgx()), ("Intel Xeon Platinum 8480C",))
    result = system.cpu_topology(dgx_cpu, params(registry, "system.cpu", **overrides))
    assert result.status is status and fragment in result.summary, result.summary
    assert result.action is (Action.DRAIN if status is Status.FAIL else Action.NONE)


def test_cpu_uneven_sockets_are_judged_one_by_one(registry):
    """Two sockets of 2 and 6 cores average 4: an expectation of 4 per socket must fail and name both."""
    cpu = system.CpuTopology(layout([[[0], [1]], [[2], [3], [4], [5], [6], [7]]]), ())
    result = system.cpu_topology(cpu, params(registry, "system.cpu", cores_per_socket=4))
    assert result.status is Status.FAIL
    assert result.summary == (
        "CPU topology: socket 0 (CPUs 0-1): 2 cores, expected 4; "
        "socket 1 (CPUs 2-7): 6 cores, expected 4"
    )
    ok = system.cpu_topology(cpu, params(registry, "system.cpu"))
    assert ok.summary == "2 sockets x 2-6 cores x 1 threads (8 CPUs)"
    assert ok.details["cores_per_socket"] is None and [
        s["cores"] for s in ok.details["per_socket"]
    ] == [2, 6]


def test_cpu_hybrid_threads_per_core_is_the_most_a_core_has(registry):
    cpu = system.CpuTopology(layout([[[0, 1], [2, 3], [4], [5]]]), ())
    assert (
        system.cpu_topology(cpu, params(registry, "system.cpu", threads_per_core=2)).status
        is Status.OK
    )
    result = system.cpu_topology(cpu, params(registry, "system.cpu"))
    assert (
        result.summary == "1 sockets x 4 cores x 1-2 threads (6 CPUs)"
        and result.details["threads_per_core"] is None
    )


def test_cpu_offline(registry):
    cpu = system.CpuTopology(layout([[[0], [1], [2], [3]]], offline={8, 9}), ())
    failed = system.cpu_topology(cpu, params(registry, "system.cpu"))
    assert (
        failed.status is Status.FAIL
        and failed.summary == "2 CPUs offline (present, not online): 8-9"
    )
    assert failed.action is Action.DRAIN
    assert (
        system.cpu_topology(cpu, params(registry, "system.cpu", allow_offline=True)).status
        is Status.OK
    )


def test_memory(registry):
    mem = system.MemoryState(
        2 * 1024 * 1024 * 1024,
        1024 * 1024 * 1024,
        (
            system.NumaMemory(0, 1000, 500, True),
            system.NumaMemory(1, 1000, 10, True),
            system.NumaMemory(250, 1000, 0, False),
        ),
    )
    assert system.memory(mem, params(registry, "system.memory"))[0].status is Status.OK
    low = system.memory(mem, params(registry, "system.memory", min_total_gib=4096.0))
    assert (
        low[0].status is Status.FAIL
        and "2048.0 GiB physical memory, expected >= 4096.0" in low[0].summary
    )
    numa = system.memory(mem, params(registry, "system.memory", min_free_percent_per_numa=5.0))
    assert [(r.status, r.component) for r in numa] == [(Status.WARN, "numa:1")]


def test_swap(registry):
    none = system.swap((), params(registry, "system.swap", allow_swap=False))
    assert none.status is Status.OK and none.summary == "no swap"
    area = (SwapArea("/dev/dm-1", 1000, 900),)
    assert system.swap(area, params(registry, "system.swap")).status is Status.WARN
    assert (
        system.swap(
            (SwapArea("/s", 1000, 0),), params(registry, "system.swap", allow_swap=False)
        ).status
        is Status.WARN
    )
    assert (
        system.swap((SwapArea("/s", 1000, 10),), params(registry, "system.swap")).status
        is Status.OK
    )


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
    mounts = [
        Mount("a", "/", "ext4", ("rw",)),
        Mount("b", "/scratch", "xfs", ("rw",)),
        Mount("c", "/scratch2", "xfs", ("rw",)),
    ]
    assert holding_mount("/scratch/user", mounts).device == "b"
    assert holding_mount("/scratch2", mounts).device == "c"
    assert holding_mount("/tmp", mounts).device == "a"


def test_processes_and_kernel(registry):
    running = frozenset({"munged", "slurmd", "Xorg"})
    ok = system.processes(
        running, params(registry, "system.processes", required=["munged", "slurmd"])
    )
    assert ok.status is Status.OK
    bad = system.processes(
        running,
        params(registry, "system.processes", required=["nvidia-persistenced"], forbidden=["Xorg"]),
    )
    assert (
        bad.status is Status.FAIL
        and "not running: nvidia-persistenced" in bad.summary
        and "Xorg" in bad.summary
    )
    assert system.processes(running, params(registry, "system.processes")).status is Status.SKIP
    k = "5.15.0-105-generic"
    assert (
        system.kernel(k, params(registry, "system.kernel", allow=["5.15.0-*"])).status is Status.OK
    )
    assert system.kernel(k, params(registry, "system.kernel", allow=["6.*"])).status is Status.FAIL
    assert (
        system.kernel(k, params(registry, "system.kernel", deny=["5.15.0-105*"])).status
        is Status.FAIL
    )


def test_load(registry):
    assert (
        system.load((LoadAvg(1.0, 1, 1, 1, 10), 8), params(registry, "system.load")).status
        is Status.OK
    )
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
    FIXTURE_TREE["sys/devices/system/cpu/cpu%d/topology/physical_package_id" % _cpu] = "%d\n" % (
        _cpu // 2
    )
    FIXTURE_TREE["sys/devices/system/cpu/cpu%d/topology/core_id" % _cpu] = "%d\n" % (_cpu % 2)


def test_gatherers_on_fixture_tree(registry, write_tree):
    root = write_tree(FIXTURE_TREE)
    config = validate(
        registry,
        {
            "checks": {
                "system.processes": {"required": ["munged"]},
                "system.cpu": {"sockets": 2, "cores_per_socket": 2},
            }
        },
    )
    report = run_checks(
        registry, config, Host(root), "manual", select_checks(registry, "manual", ["system"])
    )
    by_name = {run.name: run for run in report.runs}
    assert by_name["system.cpu"].status is Status.OK, by_name["system.cpu"].results
    assert "2 sockets x 2 cores x 1 threads" in by_name["system.cpu"].results[0].summary
    assert by_name["system.memory"].results[0].summary.startswith("16.0 GiB total")
    assert by_name["system.processes"].status is Status.OK
    assert by_name["system.kernel"].results[0].details["release"] == "5.15.0-105-generic"
    assert by_name["system.load"].status is Status.OK


def test_malformed_sysfs_gives_unknown_not_crash(registry, write_tree):
    tree = dict(
        FIXTURE_TREE,
        **{"sys/devices/system/cpu/online": "zero-three\n", "proc/loadavg": "\x00\xff"},
    )
    report = run_checks(
        registry,
        validate(registry, {}),
        Host(write_tree(tree)),
        "manual",
        select_checks(registry, "manual", ["system.cpu", "system.load"]),
    )
    for run in report.runs:
        assert run.status is Status.UNKNOWN
        assert (
            "/sys/devices/system/cpu/online" in run.results[0].summary
            or "/proc/loadavg" in run.results[0].summary
        )


def test_system_checks_on_this_machine(registry):
    """Runs against the real /proc and /sys: every check must evaluate (no UNKNOWN on a sane Linux box)."""
    report = run_checks(
        registry,
        validate(registry, {}),
        Host("/"),
        "manual",
        select_checks(registry, "manual", ["system"]),
    )
    statuses = {run.name: run.status for run in report.runs}
    assert Status.UNKNOWN not in statuses.values(), [
        r.results for r in report.runs if r.status is Status.UNKNOWN
    ]
    assert statuses["system.cpu"] is Status.OK
    cpu = next(run for run in report.runs if run.name == "system.cpu").results[0]
    import os

    assert cpu.details["online"] == len(os.sched_getaffinity(0)) or cpu.details["online"] >= 1


# -- real machines (tests/captures): each of these failed before the fix it guards ---------------


@pytest.fixture(scope="module")
def captured(unpacked_captures):
    """name -> the capture's root, unpacked once per process (conftest): these tests only read it."""
    return unpacked_captures.__getitem__


def cpu_result(registry, root, **expect):
    config = validate(registry, {"checks": {"system.cpu": expect}})
    report = run_checks(registry, config, Host(root), "manual", [registry.checks["system.cpu"]])
    return report.results()[0]


@pytest.mark.parametrize(
    "name,possible,present",
    [
        ("vmware_fpe", "0-31", "0-15"),
        ("x86_64-64cpu", "0-79", "0-63"),
        ("20s390-2g6s4c", "0-63", "0-19"),
        ("32em64t-2n8c+dax+nvme+mic+dimms", "0-127", "0-15"),
        ("32intel64-2p8co2t+8ve", "0-111", "0-31"),
        (
            "ppc64-POWER7",
            "0-15",
            "0-15",
        ),  # its cpu/offline says 16-1023: kernel_max, not even possible
    ],
)
def test_possible_but_absent_cpus_are_not_offline(registry, captured, name, possible, present):
    root = captured(name)
    assert Host(root).read_text("/sys/devices/system/cpu/possible") == possible
    assert (
        Host(root).read_text("/sys/devices/system/cpu/offline") != ""
    )  # what the old check counted
    result = cpu_result(registry, root)
    assert result.status is Status.OK, result.summary
    assert result.details["offline"] == [] and result.details["present"] == present


@pytest.mark.parametrize(
    "name,offline",
    [
        ("s390-lpar", "0,6-7"),
        ("offline-cpu0-node0", "0-3,21-23"),
        ("linux-amd64-offlineCPUs", "2-3"),
    ],
)
def test_cpus_really_offline_fail_and_are_named(registry, captured, name, offline):
    result = cpu_result(registry, captured(name))
    assert result.status is Status.FAIL and result.action is Action.DRAIN
    assert result.summary.endswith("(present, not online): " + offline), result.summary


@pytest.mark.parametrize(
    "name,sockets,cores,threads",
    [
        ("48amd64-4pa2n6c-sparse", 4, 12, 1),  # core id restarts per die: was 4 x 6 x 2
        ("rv64-milkvpioneer", 1, 64, 1),  # core id restarts per cluster: was 1 x 4 x 16
        ("ppc64-POWER7", 4, 1, 4),  # package id -1: was 1 x 4 x 4
        ("sparc64", 6, 1, 1),  # was 1 x 1 x 6
        ("96em64t-4no4pa3ca2co", 16, 6, 1),  # hex masks only, no cpu/online: was UNKNOWN
        ("256ppc-8n8s4t", 64, 1, 4),  # no cpu/online, package id -1: was UNKNOWN
    ],
)
def test_cores_and_sockets_come_from_the_kernels_sibling_lists(
    registry, captured, name, sockets, cores, threads
):
    result = cpu_result(
        registry, captured(name), sockets=sockets, cores_per_socket=cores, threads_per_core=threads
    )
    assert result.status is Status.OK, result.summary
    assert (
        result.details["sockets"],
        result.details["cores_per_socket"],
        result.details["threads_per_core"],
    ) == (sockets, cores, threads)


def test_slurm_core_numbering_on_a_multi_die_cpu(registry, captured):
    """numa.cores (gres Cores=, CpuSpecList): 48 single-thread cores on the 4 x 2-die Magny-Cours, not 24 pairs."""
    from slurm_hooks.core.runner import GatherContext, JobContext

    gathered = GatherContext(
        registry, Host(captured("48amd64-4pa2n6c-sparse")), validate(registry, {}), JobContext()
    )
    cores = gathered.get("numa.cores")
    assert len(cores) == 48 and cores[:3] == [frozenset({0}), frozenset({1}), frozenset({2})]


def test_uneven_sockets_on_a_real_s390_name_the_socket(registry, captured):
    """s390 LPAR with packages of 2 and 6 cores: the old average (8 // 2 = 4) passed cores_per_socket = 4."""
    result = cpu_result(registry, captured("s390-lpar-drawer"), cores_per_socket=4)
    assert result.status is Status.FAIL
    assert result.summary == (
        "CPU topology: socket 2 (CPUs 0-1): 2 cores, expected 4; "
        "socket 3 (CPUs 2-7): 6 cores, expected 4"
    )


def test_hybrid_intel_threads_per_core(registry, captured):
    root = captured("20em64t-hybrid-1p6c2t+2ca4co1t")
    ok = cpu_result(registry, root, sockets=1, cores_per_socket=14, threads_per_core=2)
    assert ok.status is Status.OK, ok.summary
    assert ok.summary == "1 sockets x 14 cores x 1-2 threads (20 CPUs)"


@pytest.mark.parametrize(
    "name,models",
    [
        ("128arm-2pa2n8cluster4co", ["Kunpeng-920"]),
        ("nvidia-dgx-gb10", ["Cortex-X925", "Cortex-A725"]),
        ("ppc64-POWER7", ["POWER7 (architected), altivec supported"]),
        ("sparc64", ["TI UltraSparc II (BlackBird)"]),
        ("rv64-visionfive2", ["sifive,u74-mc"]),
        ("loongarch-loongson_3a5000_hv", ["Loongson-3A5000-HV"]),
        ("s390-lpar", ["IBM/S390 machine 2817"]),
        ("96em64t-4no4pa3ca2co", ["Genuine Intel(R) CPU @ 2.66GHz"]),
    ],
)
def test_cpu_model_on_every_architecture(registry, captured, name, models):
    assert sorted(cpu_result(registry, captured(name)).details["models"]) == sorted(models)


def test_sysfs_lists_ending_in_newline_nul(captured):
    """Kunpeng 920 on a 5.x kernel: the topology *_list files end with "\\n\\0"."""
    root = captured("128arm-2pa2n8cluster4co")
    raw = Host(root).read_bytes("/sys/devices/system/cpu/cpu0/topology/package_cpus_list")
    assert raw == b"0-63\n\0"
    from slurm_hooks.hw.host import parse_cpulist

    assert parse_cpulist(raw.decode()) == frozenset(range(64))


# -- --root reads nothing live (issue #13 section 2) ------------------------------------------------


def test_a_tree_without_recorded_usage_skips_free_space_and_still_judges_mounts(
    registry, write_tree
):
    root = write_tree({"proc/mounts": "/dev/sda1 / ext4 ro,relatime 0 0\n", "tmp/.keep": ""})
    config = validate(
        registry,
        {"checks": {"system.filesystems": {"mounted": ["/scratch"], "writable": ["/tmp"]}}},
    )
    results = run_checks(
        registry, config, Host(root), "manual", [registry.checks["system.filesystems"]]
    ).results()
    assert [(r.component, r.status) for r in results] == [
        ("fs:/scratch", Status.FAIL),
        ("fs:/tmp", Status.FAIL),
    ]
    assert "read-only" in results[1].summary
    config = validate(registry, {"checks": {"system.filesystems": {"writable": ["/tmp"]}}})
    root = write_tree({"proc/mounts": "/dev/sda1 / ext4 rw 0 0\n", "tmp/.keep": ""}, root=None)
    (result,) = run_checks(
        registry, config, Host(root), "manual", [registry.checks["system.filesystems"]]
    ).results()
    assert (
        result.status is Status.SKIP and "statvfs" in result.summary
    )  # was: the analysing host's /tmp


def test_a_pid_that_is_a_symlink_in_a_tree_is_read_inside_the_tree(tmp_path):
    """The fast /proc scan opens <root>/proc/<pid>/comm directly: a crafted /proc/<pid> that links
    to an absolute path must not make it read the analysing machine's /proc."""
    import os

    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "proc/7/comm").write_text("munged\n")
    os.symlink("/proc/self", str(tmp_path / "proc/8"))  # the analysing machine's own process
    os.symlink("7", str(tmp_path / "proc/9"))  # inside the tree: followed there
    (tmp_path / "proc/012").mkdir()  # a real directory whose pid opens as "12", a link out
    os.symlink("/proc/self", str(tmp_path / "proc/12"))
    host = Host(str(tmp_path))
    assert host.pids() == [7, 8, 9, 12, 12]
    assert host.read_pid_file(12, "comm") is None
    assert host.read_pid_file(7, "comm") == "munged"
    assert host.read_pid_file(8, "comm") is None  # <root>/proc/self does not exist
    assert host.read_pid_file(9, "comm") == "munged"
    assert host.read_pid_file(10, "comm") is None  # not in the scan: the contained slow path
