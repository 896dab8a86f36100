"""Family `numa` on fake nodes: job cpuset vs GPU NUMA nodes, gres.conf Cores, housekeeping CPUs/IRQs, sysctls."""

from __future__ import annotations

import pytest

from slurm_hooks.core.config import ConfigError
from slurm_hooks.core.runner import JobContext
from slurm_hooks.result import Action, Blame, Status
from tests.fault_table import DCGM_ON_JOB_CPUS, PINNED_DAEMONS  # one copy of the node's daemons
from tests.helpers import run_on_node as run

HOUSEKEEPING = "0-1,112-113"
SWAPPED_GRES = (
    "NodeName=dgx-h100-[01-16] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=56-111\n"
    "NodeName=dgx-h100-[01-16] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=0-55\n"
)
JOB_TASK = {
    "pid": 5000,
    "comm": "python3",
    "cpus": "2-31",
    "cgroup": "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
}


def job(gpus=(0, 1), job_id="4242"):
    return JobContext(job_id=job_id, user="alice", node_name="dgx-h100-01", gpus=gpus)


# -- job affinity ---------------------------------------------------------------------------------


def test_job_cpuset_on_the_wrong_numa_node(registry, nvml_node):
    node = nvml_node(overrides={"job": {"4242": {"cpus": "56-63"}}})
    results = run(registry, node, ["numa.job-affinity"], job=job(), context="prolog")
    assert [(r.status, r.component, r.effective_blame) for r in results] == [
        (Status.WARN, "gpu:0 0000:18:00.0", Blame.JOB),
        (Status.WARN, "gpu:1 0000:1a:00.0", Blame.JOB),
    ]
    assert results[0].summary == (
        "GPU0 (NUMA 0, CPUs 0-55,112-167) has none of the job's CPUs (56-63) on its NUMA "
        "node: its host threads and NCCL proxy run across the socket"
    )
    assert (
        results[0].details["cgroup"]
        == "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242/cpuset.cpus.effective"
    )
    assert "GPU0  0000:18:00.0  0     0-55,112-167  none" in results[0].details["gpus"]
    strict = run(
        registry,
        node,
        ["numa.job-affinity"],
        {"checks": {"numa.job-affinity": {"on_violation": "fail"}}},
        job=job(),
        context="prolog",
    )
    assert {(r.status, r.effective_blame, r.action) for r in strict} == {
        (Status.FAIL, Blame.JOB, Action.NONE)
    }


def test_job_cpuset_policies(registry, nvml_node):
    node = nvml_node(
        overrides={"job": {"4242": {"cpus": "0-7,56-63"}}, "cgroup": {"version": "v1"}}
    )
    (some,) = run(registry, node, ["numa.job-affinity"], job=job(), context="prolog")
    assert (
        some.status is Status.OK
        and some.summary == "job 4242: CPUs 0-7,56-63 local to its 2 GPUs (some)"
    )
    assert some.details["cgroup"] == "/sys/fs/cgroup/cpuset/slurm/uid_1000/job_4242/cpuset.cpus"
    (every,) = run(
        registry,
        node,
        ["numa.job-affinity"],
        {"checks": {"numa.job-affinity": {"policy": "all"}}},
        job=job(),
        context="prolog",
    )
    assert (
        every.status is Status.WARN
        and every.summary == "job CPUs 56-63 are not local to any of its GPUs"
    )
    (both_sockets,) = run(
        registry,
        node,
        ["numa.job-affinity"],
        {"checks": {"numa.job-affinity": {"policy": "all"}}},
        job=job(gpus=(0, 7)),
        context="prolog",
    )
    assert both_sockets.status is Status.OK


def test_job_cgroup_not_visible_to_the_prolog(registry, nvml_node):
    node = nvml_node()
    (result,) = run(registry, node, ["numa.job-affinity"], job=job(job_id="77"), context="prolog")
    assert result.status is Status.SKIP
    assert (
        "not visible to the prolog" in result.summary and "PrologFlags=RunInJob" in result.summary
    )
    assert "TaskPlugin=task/cgroup" in result.summary
    (manual,) = run(registry, node, ["numa.job-affinity"])
    assert manual.status is Status.SKIP and manual.summary.startswith("no job")


# -- gres.conf ------------------------------------------------------------------------------------


def test_gres_conf_matching_the_hardware(registry, nvml_node):
    (result,) = run(
        registry, nvml_node(overrides={"slurm": {"gres_conf": "auto"}}), ["numa.gres-affinity"]
    )
    assert (result.status, result.summary) == (
        Status.OK,
        "Cores= of 8 GPUs in /etc/slurm/gres.conf are local to them",
    )
    assert "GPU4  0000:9a:00.0  1     56-111,168-223  56-111,168-223" in result.details["gpus"]
    assert (
        result.details["nvml_cpu_affinity"]["GPU4"] == "agrees"
    )  # nvmlDeviceGetCpuAffinity vs local_cpulist


def test_gres_conf_with_swapped_cores(registry, nvml_node):
    results = run(
        registry,
        nvml_node(overrides={"slurm": {"gres_conf": SWAPPED_GRES}}),
        ["numa.gres-affinity"],
    )
    assert len(results) == 8 and {(r.status, r.action) for r in results} == {
        (Status.FAIL, Action.DRAIN)
    }
    assert results[0].component == "gpu:0 0000:18:00.0"
    assert results[0].summary == (
        "GPU0 (/dev/nvidia0, 0000:18:00.0): gres.conf Cores give CPUs 56-111,168-223, but "
        "the GPU's local CPUs (NUMA 0) are 0-55,112-167; fix Cores= in "
        "/etc/slurm/gres.conf:1 and restart slurmd"
    )
    assert results[0].details["line"].startswith("NodeName=dgx-h100-[01-16] Name=gpu")


@pytest.mark.parametrize(
    "text,status,fragment",
    [
        ("AutoDetect=nvml\n", Status.OK, "AutoDetect=nvml: slurmd takes Cores from the driver"),
        (
            "NodeName=other Name=gpu File=/dev/nvidia0 Cores=60\n",
            Status.SKIP,
            "no GPU lines with Cores= for node dgx-h100-01",
        ),
        ("Name=gpu File=/dev/nvidia0 Cores=0-3\n", Status.OK, "Cores= of 1 GPUs"),
        (
            "Name=gpu File=/dev/nvidia0 Cores=0-999\n",
            Status.FAIL,
            "Cores 112,113,114,115 beyond this node's 112 cores",
        ),
        ("Name=gpu File=/dev/nvidia0 Cores=0-x\n", Status.UNKNOWN, "/etc/slurm/gres.conf:1 Cores="),
    ],
)
def test_gres_conf_variants(registry, nvml_node, text, status, fragment):
    results = run(
        registry,
        nvml_node(overrides={"slurm": {"gres_conf": text}}),
        ["numa.gres-affinity"],
        job=JobContext(node_name="dgx-h100-01"),
    )
    assert results[0].status is status and fragment in results[0].summary


# -- housekeeping ---------------------------------------------------------------------------------


def test_system_daemon_pinned_onto_job_cpus(registry, nvml_node):
    node = nvml_node(
        overrides={
            "job": {"4242": {"cpus": "2-31"}},
            "process": PINNED_DAEMONS + [DCGM_ON_JOB_CPUS, JOB_TASK],
        }
    )
    config = {"checks": {"numa.housekeeping": {"housekeeping_cpus": HOUSEKEEPING}}}
    (result,) = run(registry, node, ["numa.housekeeping"], config, job=job(), context="prolog")
    assert (result.status, result.component) == (Status.WARN, "pid:3001")
    assert result.summary == (
        "nv-hostengine (pid 3001, /system.slice/nvidia-dcgm.service) may run on the job's CPUs "
        "8-15; pin it to 0-1,112-113"
    )
    config["checks"]["numa.housekeeping"]["on_violation"] = "fail"
    (strict,) = run(registry, node, ["numa.housekeeping"], config, job=job(), context="prolog")
    assert strict.status is Status.FAIL


def test_housekeeping_from_slurm_conf_and_unpinned_daemons(registry, nvml_node):
    slurm_conf = "NodeName=dgx-h100-[01-04] CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 CpuSpecList=0-3\n"
    node = nvml_node(overrides={"slurm": {"slurm_conf": slurm_conf}})
    results = run(registry, node, ["numa.housekeeping"])
    assert [r.component for r in results] == ["pid:812", "pid:845", "pid:901", "pid:1210"]
    assert results[0].summary.startswith(
        "sshd (pid 812, /system.slice/ssh.service) may run on CPUs 2-111,114-223 "
        "outside the housekeeping set; pin it to 0-1,112-113"
    )
    pinned = nvml_node(overrides={"slurm": {"slurm_conf": slurm_conf}, "process": PINNED_DAEMONS})
    (ok,) = run(registry, pinned, ["numa.housekeeping"])
    assert (ok.status, ok.summary) == (
        Status.OK,
        "4 processes and 0 IRQs on housekeeping CPUs 0-1,112-113",
    )
    assert ok.details["from"] == "/etc/slurm/slurm.conf CpuSpecList=0-3"


def test_core_spec_count_is_not_guessed(registry, nvml_node):
    node = nvml_node(
        overrides={"slurm": {"slurm_conf": "NodeName=dgx-h100-01 CPUs=224 CoreSpecCount=2\n"}}
    )
    (result,) = run(registry, node, ["numa.housekeeping"])
    assert (
        result.status is Status.SKIP
        and "CoreSpecCount=2, whose cores Slurm picks itself" in result.summary
    )


def test_nic_irqs_on_job_cpus(registry, nvml_node):
    irqs = [
        {"irq": 120, "name": "mlx5_comp0@pci:0000:19:00.0"},  # default: the NIC's local CPUs
        {"irq": 121, "name": "mlx5_comp1@pci:0000:19:00.0", "cpus": "1"},
        {"irq": 140, "name": "nvme0q1", "cpus": "0-223"},
    ]
    node = nvml_node(
        overrides={"irq": irqs, "process": PINNED_DAEMONS, "job": {"4242": {"cpus": "2-31"}}}
    )
    config = {
        "checks": {"numa.housekeeping": {"housekeeping_cpus": HOUSEKEEPING, "irqs": ["mlx5_comp*"]}}
    }
    (result,) = run(registry, node, ["numa.housekeeping"], config, job=job(), context="prolog")
    assert (result.status, result.component) == (Status.WARN, "irq:120")
    assert result.summary.startswith(
        "IRQ 120 mlx5_comp0@pci:0000:19:00.0 may run on the job's CPUs 2-31"
    )


# -- sysctls --------------------------------------------------------------------------------------


def test_numa_sysctls_and_hugepages(registry, nvml_node):
    node = nvml_node(
        overrides={
            "node": {"numa_balancing": 1, "zone_reclaim_mode": 1},
            "numa": {0: {"hugepages": {"1048576kB": {"nr": 8, "free": 8}}}},
        }
    )
    config = {"checks": {"numa.sysctl": {"numa_balancing": 0, "hugepages": ["1048576kB=8"]}}}
    results = run(registry, node, ["numa.sysctl"], config)
    assert [(r.status, r.component) for r in results] == [
        (Status.WARN, "sysctl:kernel.numa_balancing"),
        (Status.WARN, "sysctl:vm.zone_reclaim_mode"),
        (Status.WARN, "numa:1"),
    ]
    assert (
        results[0].summary
        == "kernel.numa_balancing = 1, expected 0 (sysctl -w kernel.numa_balancing=0)"
    )
    assert results[2].summary == "NUMA node 1 has 0 hugepages of 1048576kB, expected 8 (0 free)"
    # a malformed pool is refused when the config is loaded (config check), not UNKNOWN at run time
    with pytest.raises(ConfigError, match="'1G' is not SIZE=COUNT"):
        run(registry, node, ["numa.sysctl"], {"checks": {"numa.sysctl": {"hugepages": ["1G"]}}})


def test_healthy_dgx_passes_the_whole_family(registry, nvml_node):
    node = nvml_node(
        overrides={"slurm": {"gres_conf": "auto"}, "job": {"4242": {"cpus": "0-15,112-127"}}}
    )
    results = run(registry, node, ["numa"], job=job(gpus=(0, 1, 2, 3)), context="prolog")
    assert {r.check: r.status for r in results} == {
        "numa.job-affinity": Status.OK,
        "numa.gres-affinity": Status.OK,
        "numa.housekeeping": Status.SKIP,
        "numa.sysctl": Status.OK,
    }


def test_housekeeping_reads_the_status_of_watched_processes_only(registry, fake_node):
    """25,000 processes timed the check out: each process's small cgroup file decides, and only the
    watched ones (system.slice here) have their status read."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.runner import run_checks
    from slurm_hooks.hw.host import Host, ReadLog

    node = fake_node("cpu-only", {"node": {"extra_processes": 2000}})
    log = ReadLog()
    config = validate(registry, {"checks": {"numa.housekeeping": {"housekeeping_cpus": "0-1"}}})
    (result, *_rest) = run_checks(
        registry,
        config,
        Host(str(node.root), log=log),
        "manual",
        [registry.checks["numa.housekeeping"]],
    ).results()
    statuses = sorted(p for p in log.files if p.endswith("/status"))
    assert statuses == [
        "/proc/1210/status",
        "/proc/812/status",
        "/proc/845/status",
        "/proc/901/status",
    ]
    assert sum(p.endswith("/cgroup") for p in log.files) >= 2000
    assert (
        result.check == "numa.housekeeping" and result.status is Status.WARN
    )  # the unpinned daemons


def test_process_scan_is_skipped_when_nothing_is_watched(registry, fake_node):
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.runner import run_checks
    from slurm_hooks.hw.host import Host, ReadLog

    node = fake_node("cpu-only", {"node": {"extra_processes": 50}})
    log = ReadLog()
    run_checks(
        registry,
        validate(registry, {}),
        Host(str(node.root), log=log),
        "manual",
        [registry.checks["system.processes"]],
    )
    assert not [p for p in log.files if p.startswith("/proc/1")]


def test_housekeeping_reads_a_nodename_line_continued_with_backslashes(registry, nvml_node):
    """slurm.conf as the amax-a100 site writes it (tests/captures/slurmconf/sites/): the CpuSpecList
    on a continuation line. Before, it was lost and the check skipped ("no CpuSpecList")."""
    slurm_conf = (
        "NodeName=dgx-h100-[01-04] CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 \\\n"
        "CpuSpecList=0-3 MemSpecLimit=32768 \\\n"
        "Gres=gpu:h100:8 \\\n"
        "State=UNKNOWN\n"
    )
    pinned = nvml_node(overrides={"slurm": {"slurm_conf": slurm_conf}, "process": PINNED_DAEMONS})
    (ok,) = run(registry, pinned, ["numa.housekeeping"])
    assert ok.status is Status.OK
    assert ok.details["from"] == "/etc/slurm/slurm.conf CpuSpecList=0-3"


def test_gres_affinity_sees_inline_autodetect_on_the_nodes_line(registry, nvml_node):
    """'NodeName=... AutoDetect=nvml Name=gpu ...' (no Cores): slurmd takes Cores from NVML. Before,
    AutoDetect was read as unset and the check skipped as if gres.conf said nothing."""
    text = "NodeName=dgx-h100-[01-04] AutoDetect=nvml Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    (result,) = run(
        registry, nvml_node(overrides={"slurm": {"gres_conf": text}}), ["numa.gres-affinity"]
    )
    assert result.status is Status.OK
    assert result.summary.startswith("AutoDetect=nvml")


def test_housekeeping_finds_its_node_in_a_slurm_conf_over_1_mib(registry, nvml_node):
    """A 20,000-node slurm.conf written one line per node is ~1.8 MB; the old read stopped at 1 MiB
    without a word and the check skipped ("no CpuSpecList") for every node past that point."""
    filler = "".join(
        "NodeName=cpu%05d CPUs=128 Sockets=2 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=500000\n"
        % i
        for i in range(20000)
    )
    slurm_conf = filler + "NodeName=dgx-h100-01 CPUs=224 CpuSpecList=0-3\n"
    assert len(slurm_conf) > 1 << 20
    pinned = nvml_node(overrides={"slurm": {"slurm_conf": slurm_conf}, "process": PINNED_DAEMONS})
    (ok,) = run(registry, pinned, ["numa.housekeeping"])
    assert ok.status is Status.OK
    assert ok.details["from"] == "/etc/slurm/slurm.conf CpuSpecList=0-3"
