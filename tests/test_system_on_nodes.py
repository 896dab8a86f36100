"""Family `system` on fake nodes (tests/fakenode): free space under --root, CPUs offline or merely possible,
process scans at scale. Kept apart from test_system_checks.py, which the RPM's %check runs without a fake node."""

from __future__ import annotations

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks
from slurm_hooks.hw.host import Host
from slurm_hooks.result import Action, Status


def cpu_result(registry, root, **expect):
    config = validate(registry, {"checks": {"system.cpu": expect}})
    report = run_checks(registry, config, Host(root), "manual", [registry.checks["system.cpu"]])
    return report.results()[0]


def fs_results(registry, node, settings=None, **params):
    config = validate(
        registry, {"general": settings or {}, "checks": {"system.filesystems": params}}
    )
    return run_checks(
        registry, config, Host(str(node.root)), "manual", [registry.checks["system.filesystems"]]
    ).results()


def test_free_space_under_root_comes_from_the_tree_not_the_analysing_disk(
    registry, fake_node, tmp_path
):
    """The fake node's / is 2% free (as statvfs(2) recorded it); the disk holding the tree has room."""
    node = fake_node(
        "cpu-only", {"mounts": ["/dev/nvme0n1p2 / ext4 rw,relatime", "tmpfs /tmp tmpfs rw"]}
    )
    node_full = fake_node(
        "cpu-only",
        {
            "mounts": [
                {
                    "device": "/dev/nvme0n1p2",
                    "mountpoint": "/",
                    "fstype": "ext4",
                    "options": "rw",
                    "free_percent": 2.0,
                }
            ]
        },
    )
    full = fs_results(registry, node_full, writable=["/"])
    assert [(r.status, r.action, r.summary) for r in full] == [
        (Status.FAIL, Action.DRAIN, "/: 2.0% free space, below 5.0%")
    ]
    assert [r.status for r in fs_results(registry, node, writable=["/", "/tmp"])] == [
        Status.OK,
        Status.OK,
    ]
    (skipped,) = fs_results(
        registry, node, writable=["/var/lib"]
    )  # the tree records no usage for it
    assert skipped.status is Status.SKIP and "free space of /var/lib not judged" in skipped.summary
    live = fs_results(registry, node_full, {"root_live_sources": ["statvfs"]}, writable=["/"])
    assert (
        live[0].status is Status.OK
    )  # asked for: the analysing machine's disk (where the tree lives)


def test_fake_node_cpus_present_possible_and_offline(registry, fake_node):
    spare = fake_node("cpu-only", {"cpu": {"possible": 192}})  # 2 x 32 x 2 = 128 present
    assert Host(str(spare.root)).read_text("/sys/devices/system/cpu/offline") == "128-191"
    assert cpu_result(registry, str(spare.root), sockets=2, cores_per_socket=32).status is Status.OK
    gone = fake_node("cpu-only", {"cpu": {"offline": "3,11"}})
    result = cpu_result(registry, str(gone.root))
    assert (
        result.status is Status.FAIL
        and result.summary == "2 CPUs offline (present, not online): 3,11"
    )
    assert result.details["per_socket"][0] == {
        "socket": "socket 0",
        "cpus": "0-2,4-10,12-31,64-95",
        "cores": 32,
        "threads_per_core": "1-2",
    }


def test_required_daemons_stop_the_process_scan_once_found(registry, fake_node):
    """25,000 processes: with only `required` names the scan goes by pid and stops when all are found;
    `forbidden` needs every process."""
    from slurm_hooks.hw.host import ReadLog

    node = fake_node("cpu-only", {"node": {"extra_processes": 300}})

    def comm_reads(**params):
        log = ReadLog()
        config = validate(registry, {"checks": {"system.processes": params}})
        (result,) = run_checks(
            registry,
            config,
            Host(str(node.root), log=log),
            "manual",
            [registry.checks["system.processes"]],
        ).results()
        return result, sum(p.endswith("/comm") for p in log.files)

    result, reads = comm_reads(required=["munged", "slurmd"])
    assert result.status is Status.OK and reads == 5  # pids 1, 2, 812, 845, 901: slurmd is the 5th
    result, reads = comm_reads(required=["munged"], forbidden=["Xorg"])
    assert result.status is Status.OK and reads == 306
    result, _ = comm_reads(required=["nv-fabricmanager"])
    assert result.status is Status.FAIL and result.summary == "not running: nv-fabricmanager"
