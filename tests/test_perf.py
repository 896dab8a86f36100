"""summary.perf (FLEET-CONTRACT.md): what makes a slow node stand out against its peers.

Unit tests on perf.py / recordbuild.summarize with hand-made records, the /proc/stat and cpu.stat
parsers on real text, and end to end: the real prolog.d and epilog.d scripts on fake nodes (as
test_hangs.py runs them), one node skewed (a GPU in HW slowdown, an IB port stalling, a daemon on
the job's CPUs), one not; the skewed record's metric stands out, the healthy one's does not.
"""

from __future__ import annotations

import json
import time

import pytest

from slurm_hooks.hw import cpustat
from slurm_hooks.records import perf
from slurm_hooks.records.build import summarize
from tests.prolog_rig import Prolog

# /proc/stat of a real 8-CPU machine: prometheus/procfs testdata/fixtures.ttar (fixtures/proc/stat),
# commit 3c943fdba94a978d990553698da4add62bb11a30 (Apache-2.0); CPU lines and the counters after them.
PROC_STAT_REAL = """cpu  301854 612 111922 8979004 3552 2 3944 0 0 0
cpu0 44490 19 21045 1087069 220 1 3410 0 0 0
cpu1 47869 23 16474 1110787 591 0 46 0 0 0
cpu2 46504 36 15916 1112321 441 0 326 0 0 0
cpu3 47054 102 15683 1113230 533 0 60 0 0 0
cpu4 28413 25 10776 1140321 217 0 8 0 0 0
cpu5 29271 101 11586 1136270 672 0 30 0 0 0
cpu6 29152 36 10276 1139721 319 0 29 0 0 0
cpu7 29098 268 10164 1139282 555 0 31 0 0 0
intr 73777505 41 9 0 0 0 0 0 0 1 172 0 0 190 0 0 0 312 5772089 0 0 0 0 0 43 0
ctxt 38014093
btime 1418183276
processes 26442
procs_running 2
procs_blocked 1
softirq 5057579 250191 1481983 1647 211099 186066 0 1783454 622196 12499 508444
"""
# cgroup v2 cpu.stat as Linux 6.1 writes it for a cgroup with the cpu controller enabled
CPU_STAT_REAL = """usage_usec 1234567
user_usec 1000000
system_usec 234567
core_sched.force_idle_usec 0
nr_periods 0
nr_throttled 0
throttled_usec 0
nr_bursts 0
burst_usec 0
"""


def test_proc_stat_parser_on_a_real_file():
    per_cpu = cpustat.parse_proc_stat(PROC_STAT_REAL)
    assert sorted(per_cpu) == list(range(8))
    assert per_cpu[0] == (44490 + 19 + 21045 + 1 + 3410, 0)  # user nice system irq softirq; steal
    assert per_cpu[7] == (29098 + 268 + 10164 + 0 + 31, 0)
    old_kernel = cpustat.parse_proc_stat(
        "cpu0 1 2 3 4 5 6 7\ncpu1 1 2 3 4 5 6 7\n"
    )  # before steal (2.6.11)
    assert old_kernel[1] == (1 + 2 + 3 + 6 + 7, None)
    assert cpustat.parse_proc_stat("cpuX 1 2\ncpu2 a b c d e f g h\n") == {}


def test_a_hostile_job_id_never_becomes_a_cgroup_path(tmp_path, write_tree):
    from slurm_hooks.hw.host import Host

    root = write_tree(
        {
            "sys/fs/cgroup/system.slice/slurmstepd.scope/cpu.stat": "usage_usec 5\n",
            "sys/fs/cgroup/system.slice/slurmstepd.scope/job_1/cpu.stat": "usage_usec 9\n",
            "sys/fs/cgroup/system.slice/other.service/cpu.stat": "usage_usec 666\n",
            "proc/stat": "cpu0 1 0 1 5 0 0 0 0 0 0\n",
        }
    )
    notes = []
    assert cpustat.read_cpu_times(Host(root), "1/../../other.service", notes)["usage_usec"] == {
        "slurm": 5
    }
    assert cpustat.read_cpu_times(Host(root), "1", notes)["usage_usec"] == {"slurm": 5, "job": 9}


def test_cpu_stat_parser():
    assert cpustat.parse_usage_usec(CPU_STAT_REAL) == 1234567
    assert cpustat.parse_usage_usec("user_usec 5\n") is None


# -- perf_block on hand-made records ------------------------------------------------------------


def gpu(delta=None, **extra):
    return dict({"index": 0, "delta": delta, "unavailable": {}}, **extra)


def record(gpus=(), ib=(), cpu=None, duration=100.0):
    return {
        "duration_s": duration,
        "gpus": list(gpus),
        "ib": list(ib),
        "cpu": cpu,
        "events_scope": "job",
    }


def test_throttle_fractions_take_the_worst_gpu_and_split_the_reasons():
    ns = 10**9
    healthy = {
        "clock_event_ns.sw_power_cap": 1 * ns,
        "clock_event_ns.sw_therm_slowdown": 2 * ns,
        "clock_event_ns.hw_therm_slowdown": 0,
        "clock_event_ns.hw_power_brake_slowdown": 0,
        "clock_event_ns.sync_boost": 0,
        "violation_ns.power": 1 * ns,
        "violation_ns.thermal": 2 * ns,
        "energy_mj": 50_000_000,
        "pcie.replay": 1,
        "nvlink.replay": 2,
        "nvlink.crc_flit": 1,
    }
    slow = dict(
        healthy,
        **{
            "clock_event_ns.hw_power_brake_slowdown": 20 * ns,
            "clock_event_ns.hw_therm_slowdown": 3 * ns,
            "energy_mj": 30_000_000,
        },
    )
    result, missing = perf.perf_block(record([gpu(healthy), gpu(slow)]))
    assert result["throttle_frac.hw_slowdown"] == 0.23  # brake + HW thermal on the slow GPU
    assert result["throttle_frac.power_brake"] == 0.2
    assert result["throttle_frac.thermal"] == 0.05  # SW 2 s + HW 3 s
    assert result["throttle_frac.power"] == 0.01 and result["throttle_frac.sync_boost"] == 0.0
    assert result["gpu_power_w.mean"] == 400.0 and result["gpu_power_w.min"] == 300.0
    assert result["pcie_replays_per_h"] == 72.0 and result["nvlink_errors_per_h"] == 216.0
    assert not [k for k in missing if k.startswith(("throttle", "gpu_power"))]


def test_an_old_driver_falls_back_to_violation_counters_and_leaves_the_rest_absent():
    ns = 10**9
    old = {
        "violation_ns.power": 5 * ns,
        "violation_ns.thermal": 7 * ns,
        "violation_ns.sync_boost": 0,
    }
    result, missing = perf.perf_block(record([gpu(old)], duration=70.0))
    assert result["throttle_frac.power"] == 0.0714286 and result["throttle_frac.thermal"] == 0.1
    assert (
        "throttle_frac.hw_slowdown" not in result and "throttle_frac.power_brake" not in result
    )  # absent, not 0
    assert "throttle_frac.hw_slowdown" in missing and "gpu_power_w.mean" in missing
    assert all(isinstance(v, float) for v in result.values())


def test_infiniband_worst_stall_and_summed_traffic_in_bytes():
    ports = [
        {
            "port": "mlx5_0:1",
            "delta": {},
            "traffic": {"port_xmit_wait": 100, "port_xmit_data": 250, "port_rcv_data": 25},
        },
        {
            "port": "mlx5_1:1",
            "delta": {},
            "traffic": {"port_xmit_wait": 90000, "port_xmit_data": 250, "port_rcv_data": 25},
        },
    ]
    result, _ = perf.perf_block(record(ib=ports, duration=10.0))
    assert result["ib_xmit_wait_per_s"] == 9000.0
    assert (
        result["ib_xmit_bytes_per_s"] == 200.0 and result["ib_rcv_bytes_per_s"] == 20.0
    )  # x4: words


def test_ib_traffic_leaves_out_resets_and_saturated_counters():
    saturated = perf.IB_SATURATED
    assert perf.ib_traffic(
        {"port_xmit_wait": saturated, "port_xmit_data": 10, "port_rcv_data": 50},
        {"port_xmit_wait": saturated, "port_xmit_data": 30, "port_rcv_data": 5},
    ) == {"port_xmit_data": 20}


def cpu_snap(busy, steal=None, job_cpus=None, usage=None):
    """A snapshot's `cpu` whose /proc/stat CPU lines have `busy` ticks as user time (and `steal`; without
    it, the 7-column lines of a kernel before 2.6.11)."""
    lines = "".join(
        "cpu%d %d 0 0 1000 0 0 0%s\n" % (cpu, ticks, " %d 0 0" % steal[cpu] if steal else "")
        for cpu, ticks in enumerate(busy)
    )
    return {
        "tick_hz": 100,
        "proc_stat": "cpu  0 0 0 0 0 0 0\n" + lines,
        "job_cpus": job_cpus,
        "usage_usec": usage or {},
    }


def test_foreign_cpu_time_on_the_jobs_cpus():
    """Job CPUs 0-1 of 4; over 100 s the job used 120 CPU-s (its cgroup), the CPUs were busy 150 s: 30 s
    were someone else's = 15 % of 2 CPUs x 100 s. CPUs outside the job's set do not count."""
    before = cpu_snap([0, 0, 0, 0], [0, 0, 0, 0], "0-1", {"job": 0, "slurm": 0})
    after = cpu_snap([7500, 7500, 9000, 0], [100, 300, 0, 0], None, {"slurm": 150_000_000})
    before["usage_usec"] = {"slurm": 30_000_000}
    window = perf.cpu_window(before, after)
    assert window["scope"] == "job" and window["ncpus"] == 2 and window["busy_s"] == 150.0
    assert window["job_s"] == 120.0 and "slurmstepd" in window["job_from"]
    result, missing = perf.perf_block(record(cpu=window))
    assert result["foreign_cpu_frac"] == 0.15 and result["cpu_steal_frac"] == 0.02


def test_job_cgroup_usage_wins_and_a_new_cgroup_counts_from_zero():
    before = cpu_snap([0] * 4, [0] * 4, None, {"slurm": 0})
    after = cpu_snap([100] * 4, [0] * 4, None, {"slurm": 9_000_000, "job": 3_000_000})
    window = perf.cpu_window(before, after)
    assert (
        window["scope"] == "node"
        and window["job_s"] == 3.0
        and window["job_from"].startswith("job cgroup")
    )


def test_absent_not_zero():
    # no comparable prolog snapshot: no deltas at all -> perf is {}
    assert perf.perf_block(record([gpu(None)], cpu=None))[0] == {}
    # too short to give rates
    assert perf.perf_block(record([gpu({"energy_mj": 5})], duration=0.4))[0] == {}
    # no cgroup usage: foreign absent, steal still there; a kernel without steal: steal absent
    window = perf.cpu_window(cpu_snap([0] * 4, [0] * 4), cpu_snap([10] * 4, [1] * 4))
    result, missing = perf.perf_block(record(cpu=window))
    assert (
        "foreign_cpu_frac" not in result
        and "foreign_cpu_frac" in missing
        and result["cpu_steal_frac"] > 0
    )
    window = perf.cpu_window(
        cpu_snap([0] * 4, usage={"slurm": 0}), cpu_snap([10] * 4, usage={"slurm": 1})
    )
    result, missing = perf.perf_block(record(cpu=window))
    assert "cpu_steal_frac" not in result and "foreign_cpu_frac" in result
    # counters that went backwards (another boot) give nothing
    assert perf.cpu_window(cpu_snap([10] * 4), cpu_snap([0] * 4))["busy_s"] is None


def test_summary_has_perf_and_it_is_empty_without_deltas():
    rec = record([gpu({"energy_mj": 70_000_000})], duration=100.0)
    assert summarize(rec, 1 << 30)["perf"]["gpu_power_w.mean"] == 700.0
    assert summarize(record([gpu(None)]), 1 << 30)["perf"] == {}


# -- end to end: real prolog and epilog scripts on fake nodes --------------------------------------


class Hooks(Prolog):
    """test_hangs' harness (the real prolog.d/epilog.d scripts, a fake scontrol) with a roomy snapshot
    budget: this test is about the figures, not about a loaded machine's timing."""

    def write_config(self, on_timeout: str) -> None:
        super().write_config(on_timeout)
        self.config.write_text(
            self.config.read_text().replace("snapshot_timeout = 1.0", "snapshot_timeout = 20.0")
        )

    def record(self) -> dict:
        return json.loads((self.records_dir / "node1" / "4242.json").read_text())


JOB_CPUS = [0, 1, 2, 3]
WAIT_S = 1.3  # the job's wall time is at least this (rates need >= 1 s)


def run_job(hooks: Hooks, skew: bool) -> dict:
    """prolog; the job runs (and on a skewed node: GPU 3 in HW slowdown / power brake, IB port mlx5_2
    stalling, a daemon on the job's CPUs); epilog -> the record's summary and body."""
    node = hooks.node
    rc, _, err = hooks.run(kind="prolog")
    assert rc == 0, err
    started = time.monotonic()
    per_cpu = {c: {"user": 60} for c in JOB_CPUS}  # the job: 0.6 s of CPU on each of its 4 CPUs
    node.add_cgroup_usage(4 * 600_000, job_id="4242")
    node.set_states({"gpu.%d.power.energy_mj" % i: 123456789 + 500_000 for i in range(8)})
    if skew:
        node.set_states({"gpu.3.clock_event_ns.hw_power_brake_slowdown": 2 * 10**8})  # 0.2 s
        node.write("/sys/class/infiniband/mlx5_2/ports/1/counters/port_xmit_wait", "5000000")
        for cpu in JOB_CPUS:
            per_cpu[cpu]["system"] = 40  # a daemon: 0.4 s on each job CPU
    node.add_cpu_ticks(per_cpu)
    time.sleep(max(0.0, WAIT_S - (time.monotonic() - started)))
    rc, _, err = hooks.run(kind="epilog")
    assert rc == 0, err
    return hooks.record()


@pytest.fixture
def nodes(fake_node, tmp_path):
    overrides = {
        "job": {"4242": {"cpus": "0-3"}}
    }  # the job's cgroup (PrologFlags=RunInJob-like: there at both)
    made = []
    for name in ("healthy", "slow"):
        (tmp_path / name).mkdir()
        made.append(Hooks(fake_node("dgx-h100", overrides), tmp_path / name))
    return made


@pytest.mark.slow
def test_a_skewed_node_stands_out_end_to_end(nodes):
    healthy, slow = run_job(nodes[0], skew=False), run_job(nodes[1], skew=True)
    for hooks, rec in zip(nodes, (healthy, slow)):
        assert rec["prolog_snapshot"] == "ok" and rec["duration_s"] >= 1.0
        header = (hooks.records_dir / "node1" / "4242.json").read_text().splitlines()[0]
        assert (
            json.loads(header[:-1] + "}")["summary"]["perf"] == rec["summary"]["perf"]
        )  # report reads line 1
    hp, sp = healthy["summary"]["perf"], slow["summary"]["perf"]
    wall = slow["duration_s"]
    assert sp["throttle_frac.hw_slowdown"] == pytest.approx(0.2 / wall, rel=1e-3)
    assert sp["throttle_frac.power_brake"] == pytest.approx(0.2 / wall, rel=1e-3)
    assert hp["throttle_frac.hw_slowdown"] == 0.0 and hp["throttle_frac.power_brake"] == 0.0
    assert (
        sp["ib_xmit_wait_per_s"] == pytest.approx(5000000 / wall, rel=1e-3)
        and hp["ib_xmit_wait_per_s"] == 0.0
    )
    # 0.4 s of someone else's time on each of the job's 4 CPUs
    assert slow["cpu"]["scope"] == "job" and slow["cpu"]["cpus"] == "0-3"
    assert sp["foreign_cpu_frac"] == pytest.approx(0.4 / wall, rel=1e-2)
    assert hp["foreign_cpu_frac"] == 0.0
    for p in (hp, sp):
        assert p["gpu_power_w.min"] > 0 and p["cpu_steal_frac"] == 0.0
        assert p["pcie_replays_per_h"] == 0.0 and p["ib_xmit_bytes_per_s"] == 0.0
    assert set(sp) == set(hp) and not slow["perf_unavailable"]
    assert hp["gpu_idle_frac"] == 0.0 and sp["gpu_idle_frac"] == 0.0


@pytest.mark.slow
def test_throttle_time_survives_a_driver_without_violation_counters(nodes):
    """nvmlDeviceGetViolationStatus is deprecated in NVML 13; a driver that answers NOT_SUPPORTED
    for it (the fake's injected fault, as NVML returns it) still has the clock-event fields. Before,
    summary.throttle_s summed only violation counters and read 0 s for GPU 3's 0.2 s power brake."""
    hooks = nodes[1]
    hooks.node.set_states({"fault.nvmlDeviceGetViolationStatus": 3})  # NVML_ERROR_NOT_SUPPORTED
    rec = run_job(hooks, skew=True)
    gpu3 = next(g for g in rec["gpus"] if g["index"] == 3)
    assert gpu3["unavailable"]["violation_ns.power"] == "NOT_SUPPORTED"
    assert "violation_ns.power" not in gpu3["delta"]
    assert rec["summary"]["throttle_s"] == pytest.approx(0.2, abs=1e-3)


def test_throttle_time_takes_the_larger_of_its_two_sources():
    """Red team: a driver answering only violation_ns.power made the clock-event fields ignored,
    and 40 s of HW thermal slowdown read as 0 s."""
    from slurm_hooks.records.build import _held_down_ns

    s = 10**9
    assert (
        _held_down_ns({"violation_ns.power": 0, "clock_event_ns.hw_therm_slowdown": 40 * s})
        == 40 * s
    )
    assert _held_down_ns({"violation_ns.power": 5 * s, "violation_ns.thermal": 3 * s}) == 8 * s
    assert _held_down_ns({"clock_event_ns.sw_power_cap": 2 * s}) == 2 * s
    assert _held_down_ns({"violation_ns.low_utilization": 9 * s}) == 0  # idle is not a limit
    assert _held_down_ns({}) == 0


@pytest.mark.slow
def test_a_gpu_the_job_left_idle_is_measured(nodes):
    """GPU 5's clocks were lowered for lack of work for 0.9 s of the job (the fake's
    nvmlDeviceGetViolationStatus NVML_PERF_POLICY_LOW_UTILIZATION): the record's gpu_idle_frac is
    that GPU's share of the wall time, which keeps report --stragglers off its power."""
    hooks = nodes[0]
    rc, _, err = hooks.run(kind="prolog")
    assert rc == 0, err
    hooks.node.set_states({"gpu.5.violation_ns.low_utilization": 9 * 10**8})
    time.sleep(WAIT_S)
    rc, _, err = hooks.run(kind="epilog")
    assert rc == 0, err
    rec = hooks.record()
    assert rec["summary"]["perf"]["gpu_idle_frac"] == pytest.approx(0.9 / rec["duration_s"], 1e-3)


def test_no_prolog_snapshot_gives_an_empty_perf_end_to_end(nodes):
    hooks = nodes[0]
    rc, _, err = hooks.run(kind="epilog")
    assert rc == 0, err
    rec = hooks.record()
    assert rec["prolog_snapshot"] == "missing" and rec["summary"]["perf"] == {}
    assert "*" in rec["perf_unavailable"]


@pytest.mark.slow
def test_a_hung_infiniband_counter_read_stays_bounded(nodes):
    """A FIFO where port_xmit_wait should be: open() blocks forever, as on a wedged HCA driver. The
    snapshot runs in the forked check process under [records] snapshot_timeout: the prolog ends,
    exits 0, and the epilog still writes a record (marked as having no comparable prolog snapshot)."""
    from tests.prolog_rig import make_fifo

    hooks = nodes[0]
    hooks.config.write_text(
        hooks.config.read_text().replace("snapshot_timeout = 20.0", "snapshot_timeout = 1.0")
    )
    make_fifo(hooks.node, "/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait")
    rc, seconds, err = hooks.run(kind="prolog")
    assert rc == 0, err
    assert (
        seconds < 1.0 + 2.0 + 10.0
    )  # snapshot budget + [deadline] files + interpreter start on a loaded VM
    rc, seconds, err = hooks.run(kind="epilog")
    assert rc == 0 and seconds < 1.0 + 2.0 + 10.0, err
    rec = hooks.record()
    assert rec["prolog_snapshot"] == "missing" and rec["epilog_snapshot"].startswith("failed")
    assert (
        rec["checks"]["status"] == "OK" and rec["summary"]["perf"] == {}
    )  # the checks were not held up
