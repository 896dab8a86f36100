"""Prolog snapshot -> epilog record on the fake node; atomicity under kill -9; full disk; retention."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import CheckRun, JobContext, RunReport
from slurm_hooks.records import store as records
from slurm_hooks.registry import load_builtin_checks
from slurm_hooks.result import Result, Status
from slurm_hooks.slurm import policy
from slurm_hooks.slurm.drainer import Enacted, Outcome
from slurm_hooks.slurm.jobenv import job_from_env
from tests.helpers import BOOT_ID

XID_79 = "NVRM: Xid (PCI:0000:%s): 79, pid=1234, name=python, GPU has fallen off the bus."
ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_USER": "alice",
    "SLURMD_NODENAME": "node1",
    "SLURM_JOB_GPUS": "0,1",
    "SLURM_JOB_COMMENT": "token=hunter2-SECRET",
    "AWS_SECRET_ACCESS_KEY": "AKIA-SECRET",
}


def make_config(tmp_path, root="/", **records_settings):
    data = {
        "general": {"root": str(root)},
        "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
        "records": dict(
            {"dir": str(tmp_path / "jobs"), "snapshot_timeout": 10.0}, **records_settings
        ),
    }
    return validate(load_builtin_checks(), data)


def epilog_report(job):
    bad = Result("gpu.memory", Status.FAIL, "row remap pending", component="gpu:1 0000:2a:00.0")
    ok = Result("system.cpu", Status.OK, "fine")
    return RunReport(
        "epilog",
        [CheckRun("system.cpu", [ok], 0.01), CheckRun("gpu.memory", [bad], 0.02)],
        0.05,
        20.0,
        False,
        job,
    )


def test_prolog_to_epilog_round_trip_gives_the_right_deltas(gpu_node, tmp_path, caplog):  # noqa: F811
    node = gpu_node
    bus0, bus1 = node.spec["gpu"][0]["pci"], node.spec["gpu"][1]["pci"]
    node.add_kmsg(XID_79 % bus1[5:12])  # before the job: must not be blamed on it
    config = make_config(tmp_path, node.root)
    job = job_from_env(ENV)
    snap_path = records.prolog_snapshot(config, job)
    assert snap_path == str(tmp_path / "state" / "snapshots" / "4242.json")
    assert stat.S_IMODE(os.stat(snap_path).st_mode) == 0o600
    # -- the job runs: counters move on its GPUs (0, 1) and on GPU 2, which is not its
    node.set_states(
        {
            "gpu.0.ecc.volatile.corrected.dram": 5,
            "gpu.0.ecc.volatile.uncorrected.sram": 1,
            "gpu.0.nvlink.links.3.errors.crc_flit": 7,
            "gpu.0.nvlink.links.3.errors.replay": 2,
            "gpu.1.pcie.replay_counter": 4,
            "gpu.1.remapped_rows.uncorrected": 1,
            "gpu.1.remapped_rows.pending": 1,
            "gpu.1.violation_ns.thermal": 3 * 10**9,
            "gpu.1.violation_ns.low_utilization": 9 * 10**9,
            "gpu.1.processes": "777:1073741824",
            "process.777.name": "python3",
            "gpu.1.memory.used": 1 << 30,  # the fake derives it from the spec only at build time
            "gpu.2.pcie.replay_counter": 1000,
        }
    )
    node.write("/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", "6")
    node.add_kmsg(XID_79 % bus0[5:12])
    node.add_kmsg("nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up")
    decision = policy.decide(epilog_report(job).results(), config.settings)
    enacted = Enacted(Outcome.DRAINED, "drained node1")
    path = records.epilog_record(config, job, "node1", epilog_report(job), decision, enacted)

    assert path == str(tmp_path / "jobs" / "node1" / "4242.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == records.RECORD_MODE
    assert not os.path.exists(snap_path)  # consumed
    text = open(path).read()
    rec = json.loads(text)
    assert rec["schema"] == "slurm-hooks.job-record/1" and rec["prolog_snapshot"] == "ok"
    assert rec["job"] == {"id": "4242", "user": "alice", "gpus": [0, 1], "restart_count": 0}
    assert rec["node"] == "node1"
    assert rec["duration_s"] >= 0 and rec["rebooted_during_job"] is False
    # the boot the job ended in, in the header line report --stragglers reads alone
    boot = open(os.path.join(node.root, "proc/sys/kernel/random/boot_id")).read().strip()
    assert rec["boot_id"] == boot and len(boot) == 36
    # what report --stragglers compares it with: the model and number of the job's GPUs
    assert rec["summary"]["hw_class"] == "%s x2" % rec["gpus"][0]["name"]
    assert rec["gpus"][0]["name"].startswith("NVIDIA ")
    assert json.loads(text.split("\n", 1)[0][:-1] + "}")["boot_id"] == boot
    g0, g1 = rec["gpus"]
    assert (g0["index"], g0["bus_id"], g1["bus_id"]) == (0, bus0, bus1)
    assert g0["uuid"].startswith("GPU-") and g0["serial"]
    assert {k: v for k, v in g0["delta"].items() if v} == {
        "ecc.volatile.corrected": 5,
        "ecc.volatile.uncorrected": 1,
        "nvlink.crc_flit": 7,
        "nvlink.replay": 2,
    }
    assert g0["nvlink_delta"] == {"3": {"crc_flit": 7, "replay": 2}}
    assert {k: v for k, v in g1["delta"].items() if v} == {
        "pcie.replay": 4,
        "remapped_rows.uncorrected": 1,
        "violation_ns.thermal": 3 * 10**9,
        "clock_event_ns.sw_therm_slowdown": 3
        * 10**9,  # nvml.h: the same counter as the thermal policy's
        "violation_ns.low_utilization": 9 * 10**9,
    }
    assert g1["flags"]["remapped_rows.pending"] is True
    assert g1["processes"] == [
        {"pid": 777, "kind": "compute", "used_memory_bytes": 1 << 30, "name": "python3"}
    ]
    assert g0["processes"] == []
    ib = {p["port"]: p["delta"] for p in rec["ib"]}
    assert ib["mlx5_0:1"]["symbol_error"] == 6 and ib["mlx5_1:1"]["symbol_error"] == 0
    assert rec["events_scope"] == "job" and rec["xid_count"] == 1 and rec["sxid_count"] == 1
    assert [(x["xid"], x["pci"], x["job_gpu"]) for x in rec["xids"]] == [(79, bus0, 0)]
    # dated from the kernel log's clock read beside the wall clock (report --xids lines them up)
    assert isinstance(rec["xids"][0]["time"], float)
    assert rec["summary"]["xid_times"] == [[79, rec["xids"][0]["time"], 1, "node"]]
    assert rec["sxids"][0]["sxid"] == 20034 and rec["sxids"][0]["severity"] == "Fatal"
    assert rec["checks"]["status"] == "FAIL" and rec["checks"]["passed"] == ["system.cpu"]
    assert [r["check"] for r in rec["checks"]["results"]] == ["gpu.memory"]
    assert rec["decision"]["verdict"] == "drain" and rec["decision"]["outcome"] == "drained"
    s = rec["summary"]
    assert (
        s["ecc_corrected"],
        s["ecc_uncorrected"],
        s["remapped_rows"],
        s["nvlink_errors"],
        s["pcie_replays"],
        s["ib_errors"],
        s["xids"],
        s["sxids"],
        s["leftover_processes"],
    ) == (5, 1, 1, 9, 4, 6, 1, 1, 1)
    assert s["throttle_s"] == 3.0  # thermal only: low utilisation is idling, not throttling
    assert s["leftover_memory_bytes"] == 1 << 30
    assert set(s["abnormal"]) >= {
        "xids",
        "sxids",
        "ecc_uncorrected",
        "nvlink_errors",
        "leftover_processes",
        "pending_repair",
        "checks_fail",
        "drained",
    }
    # No environment, no secrets: only the validated job id, user and GPUs come from the job.
    assert "SECRET" not in text and "hunter2" not in text and "SLURM_JOB_COMMENT" not in text


def _drained_attempt(config, env):
    """One run of a job on n1 whose epilog drained the node: prolog snapshot, then epilog record."""
    job = job_from_env(dict(env, SLURM_JOB_GPUS=""))
    records.prolog_snapshot(config, job)
    decision = policy.decide(epilog_report(job).results(), config.settings)
    enacted = Enacted(Outcome.DRAINED, "drained n1")
    return records.epilog_record(config, job, "n1", epilog_report(job), decision, enacted)


def test_a_requeued_job_keeps_the_record_of_every_attempt(tmp_path, capsys):
    """Slurm requeues a job under its id; the prolog and epilog of the rerun get
    SLURM_JOB_RESTART_COUNT=1 (prep_script_slurmd.c). The rerun used to replace the first run's
    record: the drain's evidence was gone and `report` counted one bad run instead of two."""
    from slurm_hooks.cli.main import main
    from slurm_hooks.records import fleet_report

    config = make_config(tmp_path)
    env = dict(ENV, SLURMD_NODENAME="n1")
    first = _drained_attempt(config, env)
    second = _drained_attempt(config, dict(env, SLURM_JOB_RESTART_COUNT="1"))
    assert first == str(tmp_path / "jobs" / "n1" / "4242.json")
    assert second == str(tmp_path / "jobs" / "n1" / "4242.r1.json")
    assert json.loads(open(first).read())["job"]["restart_count"] == 0
    assert json.loads(open(second).read())["job"]["restart_count"] == 1
    # scontrol requeue counts the restart before killing the run: with no prolog snapshot that
    # run's epilog says 1 too, and the third run must not replace the second's record either
    third = records.epilog_record(
        config, job_from_env(dict(env, SLURM_JOB_RESTART_COUNT="1", SLURM_JOB_GPUS="")), "n1"
    )
    assert third == str(tmp_path / "jobs" / "n1" / "4242.r1.2.json")
    fleet = fleet_report.aggregate([str(tmp_path / "jobs")])
    node = fleet.nodes["n1"]
    assert (fleet.records, node.jobs, node.abnormal_jobs, node.drained) == (3, 3, 2, 2)
    assert sorted(job for _, job in node.worst) == ["4242", "4242.r1"]
    assert [r["job"] for r in fleet_report.job_view([str(tmp_path / "jobs")], "4242")[0]] == [
        "4242",
        "4242.r1",
        "4242.r1",
    ]
    assert main(["record", "show", "4242", "--dir", str(tmp_path / "jobs"), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_missing_prolog_snapshot_is_marked_and_nothing_is_blamed_on_the_job(gpu_node, tmp_path):  # noqa: F811
    gpu_node.add_kmsg(XID_79 % gpu_node.spec["gpu"][0]["pci"][5:12])
    config = make_config(tmp_path, gpu_node.root)
    job = JobContext("77", "bob", "node1", (0,))
    rec = json.loads(open(records.epilog_record(config, job, "node1")).read())
    assert (
        rec["prolog_snapshot"] == "missing" and rec["start"] is None and rec["duration_s"] is None
    )
    assert rec["gpus"][0]["delta"] is None and rec["gpus"][0]["end"]["pcie.replay"] == 0
    assert (
        rec["events_scope"] == "boot" and rec["xid_count"] == 1
    )  # listed, marked as the whole boot's
    assert rec["summary"]["xids"] == 0 and rec["summary"]["deltas"] is False
    assert rec["checks"] is None and rec["decision"] is None


def test_corrupt_snapshot_is_marked(gpu_node, tmp_path):  # noqa: F811
    config = make_config(tmp_path, gpu_node.root)
    os.makedirs(str(tmp_path / "state" / "snapshots"))
    (tmp_path / "state" / "snapshots" / "78.json").write_text('{"gpus": [')
    rec = json.loads(
        open(records.epilog_record(config, JobContext("78", "bob", "n1", (0,)), "n1")).read()
    )
    assert rec["prolog_snapshot"].startswith("corrupt: ") and rec["gpus"][0]["delta"] is None


def test_reboot_during_the_job_makes_counters_incomparable(gpu_node, tmp_path):  # noqa: F811
    config = make_config(tmp_path, gpu_node.root)
    job = JobContext("79", "bob", "n1", (0,))
    records.prolog_snapshot(config, job)
    gpu_node.write("/proc/sys/kernel/random/boot_id", "another-boot")
    rec = json.loads(open(records.epilog_record(config, job, "n1")).read())
    assert rec["rebooted_during_job"] is True and rec["gpus"][0]["delta"] is None
    assert rec["events_scope"] == "boot" and "rebooted" in rec["summary"]["abnormal"]


def test_hung_nvml_in_the_epilog_still_gives_a_record(gpu_node, tmp_path):  # noqa: F811
    config = make_config(tmp_path, gpu_node.root, snapshot_timeout=1.0)
    job = JobContext("80", "bob", "n1", (0,))
    records.prolog_snapshot(config, job)
    gpu_node.inject_hang("nvmlDeviceGetCount")
    started = time.monotonic()
    rec = json.loads(open(records.epilog_record(config, job, "n1")).read())
    assert time.monotonic() - started < 5
    assert rec["epilog_snapshot"].startswith("failed: ") and "1s" in rec["epilog_snapshot"]
    assert rec["prolog_snapshot"] == "ok" and rec["gpus"][0]["delta"] is None


def test_disabled_or_jobless_writes_nothing(tmp_path):
    config = make_config(tmp_path, enabled=False)
    assert records.prolog_snapshot(config, JobContext("5")) is None
    assert records.epilog_record(config, JobContext("5"), "n1") is None
    assert records.epilog_record(make_config(tmp_path), JobContext(None), "n1") is None
    assert not (tmp_path / "jobs").exists() and not (tmp_path / "state").exists()


def test_hostile_names_never_become_paths(tmp_path):
    with pytest.raises(ValueError, match="node name"):
        records.record_path(str(tmp_path), "../etc", "1")
    with pytest.raises(ValueError, match="job id"):
        records.record_path(str(tmp_path), "n1", "1/../../x")


# -- retention -------------------------------------------------------------------------------------


def _fill(directory, count, size=1000, start=1_000_000):
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        path = os.path.join(directory, "%d.json" % (start + i))
        with open(path, "w") as handle:
            handle.write("x" * size)
        os.utime(path, (start + i, start + i))


def test_retention_by_count_keeps_the_newest(tmp_path):
    node_dir = str(tmp_path / "n1")
    _fill(node_dir, 12)
    other = str(tmp_path / "n2")
    _fill(other, 3)
    removed = records.enforce_retention(node_dir, max_records=5, max_bytes=1 << 30)
    assert len(removed) == 7
    assert sorted(os.listdir(node_dir)) == ["%d.json" % (1_000_000 + i) for i in range(7, 12)]
    assert len(os.listdir(other)) == 3  # another node's records are never touched


def test_retention_by_bytes(tmp_path):
    node_dir = str(tmp_path / "n1")
    _fill(node_dir, 10, size=1000)
    records.enforce_retention(node_dir, max_records=100, max_bytes=3500)
    assert sorted(os.listdir(node_dir)) == ["%d.json" % (1_000_000 + i) for i in range(7, 10)]


def test_retention_removes_stale_temp_files_only(tmp_path):
    node_dir = tmp_path / "n1"
    node_dir.mkdir()
    stale, fresh = node_dir / ".1.json.abc.tmp", node_dir / ".2.json.def.tmp"
    stale.write_text("x")
    fresh.write_text("y")
    os.utime(str(stale), (time.time() - 2 * records.STALE_TEMP_S,) * 2)
    records.enforce_retention(str(node_dir), 10, 1 << 20)
    assert not stale.exists() and fresh.exists()


def test_retention_runs_after_each_epilog_record(tmp_path):
    config = make_config(tmp_path, max_records=3)
    for job_id in range(1, 6):
        records.epilog_record(config, JobContext(str(job_id), "u", "n1", ()), "n1")
        time.sleep(0.01)  # distinct mtimes
    assert sorted(os.listdir(str(tmp_path / "jobs" / "n1"))) == ["3.json", "4.json", "5.json"]


def test_prune_stale_prolog_snapshots(tmp_path):
    directory = tmp_path / "snapshots"
    directory.mkdir()
    (directory / "1.json").write_text("{}")
    (directory / "2.json").write_text("{}")
    os.utime(str(directory / "1.json"), (1000, 1000))
    assert records.prune_snapshots(str(directory), 86400) == 1
    assert os.listdir(str(directory)) == ["2.json"]


# -- crash safety ----------------------------------------------------------------------------------

WRITER = r"""
import os, sys
from slurm_hooks.records.store import write_record
directory, n = sys.argv[1], int(sys.argv[2])
while True:  # one record per job, as the epilogs write them (a record of ours is never replaced)
    n += 1
    write_record(os.path.join(directory, "%d.json" % n), {"schema": "x", "n": n, "pad": "p" * 400000, "end": "END"})
"""


@pytest.mark.soak
def test_kill_9_during_writes_never_leaves_a_torn_record(tmp_path):
    directory = tmp_path / "jobs" / "n1"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo)
    for attempt in range(15):
        first = 1000 * (attempt + 1)
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(first)], env=env)
        time.sleep(0.15 + 0.037 * attempt)  # land at different points of write/fsync/rename
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    names = os.listdir(str(directory)) if directory.exists() else []
    seen = [n for n in names if n.endswith(".json") and not n.startswith(".")]
    assert seen, "the writer never completed a record: the test proves nothing"
    for name in seen:
        with open(str(directory / name)) as handle:
            record = json.loads(handle.read())  # a torn file would not parse
        assert record["end"] == "END" and len(record["pad"]) == 400000
    leftovers = [n for n in names if n not in seen]
    assert all(n.startswith(".") and n.endswith(".tmp") for n in leftovers), leftovers


def _write_previous(tmp_path, config):
    job = JobContext("1", "u", "n1", ())
    first = records.epilog_record(config, job, "n1")
    return first, open(first).read()


def test_disk_full_is_logged_and_previous_records_stay_intact(tmp_path, monkeypatch, caplog):
    config = make_config(tmp_path)
    first, content = _write_previous(tmp_path, config)
    real_write = os.write

    def full(fd, data):
        if os.fstat(fd).st_size + len(data) > 100:  # the disk fills during the record write
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
        assert records.epilog_record(config, JobContext("2", "u", "n1", ()), "n1") is None
    monkeypatch.undo()
    assert (
        "event=record-not-written" in caplog.text
        and "ENOSPC" in caplog.text
        and "job=2" in caplog.text
    )
    assert open(first).read() == content
    assert sorted(os.listdir(os.path.dirname(first))) == ["1.json"]  # no torn 2.json, no temp file


def test_disk_full_on_a_real_tiny_tmpfs(tmp_path, caplog):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.call(
            ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)],
            stderr=subprocess.DEVNULL,
        )
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        config = validate(
            load_builtin_checks(),
            {
                "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
                "records": {"dir": str(mount)},
            },
        )
        first, content = _write_previous(tmp_path, config)
        with open(str(mount / "filler"), "wb") as handle:  # leave less room than one record needs
            try:
                handle.write(b"f" * (1 << 20))
            except OSError:
                pass
        with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
            assert records.epilog_record(config, JobContext("2", "u", "n1", ()), "n1") is None
        assert "No space left on device" in caplog.text
        assert open(first).read() == content and sorted(os.listdir(str(mount / "n1"))) == ["1.json"]
    finally:
        subprocess.call(["umount", str(mount)])


def test_dcgm_mapping_uses_nvml_indices_from_the_prolog_snapshot(gpu_node, tmp_path):  # noqa: F811
    gpu_node.set_states({"gpu.0.minor_number": 1, "gpu.1.minor_number": 0})
    config = validate(
        load_builtin_checks(),
        {
            "general": {"root": str(gpu_node.root)},
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "records": {"dir": str(tmp_path / "jobs")},
            "metrics": {"dcgm_job_mapping_dir": str(tmp_path / "dcgm")},
        },
    )
    job = JobContext("90", "u", "n1", (0,))  # Slurm's GPU 0 = /dev/nvidia0 = NVML index 1 here
    records.on_hook("prolog", config, job, "n1")
    assert (
        os.listdir(str(tmp_path / "dcgm")) == ["1"]
        and (tmp_path / "dcgm" / "1").read_text() == "90\n"
    )
    records.on_hook("epilog", config, job, "n1")
    assert os.listdir(str(tmp_path / "dcgm")) == []


@pytest.mark.parametrize("xid_checks", [True, False], ids=["xid-checks-on", "xid-checks-off"])
@pytest.mark.parametrize("context", ["prolog", "epilog"])
def test_a_hook_reads_the_kernel_log_once_and_its_snapshot_agrees(
    gpu_node,
    tmp_path,
    monkeypatch,  # noqa: F811
    context,
    xid_checks,
):
    """A live /dev/kmsg costs a system call per record: the check child reads it once, and the counter
    snapshot takes its position (and, in the epilog, its Xid lines) from that read."""
    from slurm_hooks import hooks
    from slurm_hooks.core import isolation
    from slurm_hooks.hw.host import Host

    node = gpu_node
    xid_line = XID_79 % node.spec["gpu"][0]["pci"][5:12]
    xid_record = node.add_kmsg(xid_line)
    node.add_kmsg("mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged")
    newest = node.add_kmsg("eth0: link up")
    reads = tmp_path / "kmsg-reads"  # a file: the sysfs helper process (core/prefetch.py) reads it
    read_kmsg = Host.read_kmsg

    def counted(self, *args, **kw):
        with open(str(reads), "a") as handle:
            handle.write("read by %d\n" % os.getpid())
        return read_kmsg(self, *args, **kw)

    monkeypatch.setattr(Host, "read_kmsg", counted)
    monkeypatch.setattr(
        isolation, "run_isolated", lambda work, timeout, **_: (json.loads(json.dumps(work())), "")
    )
    data = {
        "general": {"root": str(node.root)},
        "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
        "records": {"dir": str(tmp_path / "jobs"), "snapshot_timeout": 10.0},
    }
    if not xid_checks:
        data["checks"] = {"xid.events": {"enabled": False}, "xid.sxid": {"enabled": False}}
    registry = load_builtin_checks()
    report, gathered = hooks.run_isolated_checks(
        registry, validate(registry, data), context, job_from_env(ENV)
    )
    snap, why = gathered[:2]
    assert why == "" and snap is not None
    if context == "prolog":  # stored by the check child too, under [deadline] files
        assert gathered[2]["state"] == "done" and os.path.exists(gathered[2]["path"])
        # the parent is sent only the GPU indices of a snapshot the child stored; the file has it all
        assert snap == {"gpus": [{"index": g["index"]} for g in snap["gpus"]]}
        with open(gathered[2]["path"]) as handle:
            snap = json.load(handle)
        assert [g["index"] for g in snap["gpus"]] == [g["index"] for g in gathered[0]["gpus"]]
    assert snap["kmsg_seq"] == int(newest.split(",")[1]) and snap["boot_id"] == BOOT_ID
    if context == "epilog":
        assert snap["xid_lines"] == [xid_record]
    assert len(reads.read_text().splitlines()) == 1
    assert {run.name for run in report.runs if run.name.startswith("xid.")} == {
        "xid.events",
        "xid.sxid",
    }


# -- a records directory users can write to (shared file systems often allow it) -----------------

OTHER_UID = 4321
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root")


def test_the_counter_snapshot_is_taken_while_the_checks_run(tmp_path, monkeypatch):
    """The snapshot's NVML calls leave the GIL, so it runs alongside the checks, not after them: a
    check that waits for the snapshot to begin sees it begin (before: it began once every check had
    ended, and this check gave up). The check process's time bounds are unchanged."""
    import threading

    from slurm_hooks import hooks
    from slurm_hooks.core import isolation
    from slurm_hooks.registry import Registry

    registry = Registry()
    began = threading.Event()
    take = records.take_snapshot

    def take_snapshot(*args, **kwargs):
        began.set()
        return take(*args, **kwargs)

    monkeypatch.setattr(records, "take_snapshot", take_snapshot)

    @registry.check(name="demo.waits", contexts=("prolog",), timeout=2.0)
    def waits(params):
        """demo"""
        if began.wait(1.5):
            return Result("demo.waits", Status.OK, "the snapshot runs alongside")
        return Result("demo.waits", Status.WARN, "no snapshot while the checks ran")

    monkeypatch.setattr(
        isolation, "run_isolated", lambda work, timeout, **_: (json.loads(json.dumps(work())), "")
    )
    data = {
        "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
        "records": {"dir": str(tmp_path / "jobs"), "snapshot_timeout": 2.0},
    }
    report, gathered = hooks.run_isolated_checks(
        registry, validate(registry, data), "prolog", job_from_env(ENV)
    )
    assert [r.summary for r in report.results()] == ["the snapshot runs alongside"]
    assert gathered is not None and len(gathered) >= 2  # (snapshot or None, why[, stored])


def _world_writable_records(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.chmod(str(jobs), 0o1777)  # like /tmp: anyone may create entries
    return jobs


def test_a_planted_node_directory_symlink_is_never_followed(tmp_path, caplog):
    """A user plants DIR/<node> -> /etc (here: a directory of the test): the root epilog used to write its
    record there, and retention deleted files in it. Now the record is refused and logged, nothing is
    written or removed through the link."""
    jobs = _world_writable_records(tmp_path)
    victim = tmp_path / "etc"
    victim.mkdir()
    for i in range(5):
        (victim / ("%d.json" % (100 + i))).write_text("precious")
        os.utime(str(victim / ("%d.json" % (100 + i))), (1000 + i, 1000 + i))
    os.symlink(str(victim), str(jobs / "n1"))
    config = make_config(tmp_path, max_records=2)
    with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
        assert records.epilog_record(config, JobContext("9", "mallory", "n1", ()), "n1") is None
    assert (
        "event=record-not-written" in caplog.text
        and "a symlink" in caplog.text
        and str(jobs / "n1") in caplog.text
    )
    assert sorted(os.listdir(str(victim))) == [
        "%d.json" % (100 + i) for i in range(5)
    ]  # none added, none removed


def test_a_planted_record_symlink_is_replaced_not_followed(tmp_path):
    jobs = _world_writable_records(tmp_path)
    config = make_config(tmp_path)
    records.epilog_record(
        config, JobContext("1", "u", "n1", ()), "n1"
    )  # our node directory exists now
    target = tmp_path / "shadow"
    target.write_text("root:secret\n")
    os.symlink(str(target), str(jobs / "n1" / "9.json"))
    path = records.epilog_record(config, JobContext("9", "u", "n1", ()), "n1")
    assert path == str(jobs / "n1" / "9.json") and not os.path.islink(path)
    assert (
        json.loads(open(path).read())["job"]["id"] == "9" and target.read_text() == "root:secret\n"
    )


@as_root
def test_a_node_directory_made_by_someone_else_is_refused(tmp_path, caplog):
    jobs = _world_writable_records(tmp_path)
    (jobs / "n1").mkdir()
    os.chown(str(jobs / "n1"), OTHER_UID, OTHER_UID)
    with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
        assert (
            records.epilog_record(make_config(tmp_path), JobContext("9", "u", "n1", ()), "n1")
            is None
        )
    assert "owned by uid %d, not by slurm-hooks" % OTHER_UID in caplog.text
    assert os.listdir(str(jobs / "n1")) == []  # not even a temp file is left


@as_root
def test_retention_removes_only_our_own_records(tmp_path):
    """Retention used to delete the oldest *.json whatever they were: a user's file, a symlink (its target
    survived, but a hard link or a planted name did not)."""
    node_dir = tmp_path / "jobs" / "n1"
    _fill(str(node_dir), 6)
    theirs = node_dir / "1.json"  # the oldest name of all, but a user's file
    theirs.write_text("mine")
    os.utime(str(theirs), (1, 1))
    os.chown(str(theirs), OTHER_UID, OTHER_UID)
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    os.symlink(str(outside), str(node_dir / "2.json"))
    os.link(
        str(node_dir / ("%d.json" % 1_000_000)), str(tmp_path / "hardlink")
    )  # a record with a second name
    (node_dir / "notes.txt").write_text("an admin's note")
    os.utime(str(node_dir / "notes.txt"), (1, 1))
    removed = records.enforce_retention(str(node_dir), max_records=1, max_bytes=1 << 30)
    left = sorted(os.listdir(str(node_dir)))
    assert (
        "1.json" in left
        and "2.json" in left
        and "notes.txt" in left
        and "%d.json" % 1_000_000 in left
    )
    assert sorted(os.path.basename(p) for p in removed) == [
        "%d.json" % (1_000_000 + i) for i in range(1, 5)
    ]
    assert outside.read_text() == "keep" and theirs.read_text() == "mine"


def test_stale_prolog_snapshots_are_pruned_only_when_ours(tmp_path):
    directory = tmp_path / "snapshots"
    directory.mkdir()
    outside = tmp_path / "keep.json"
    outside.write_text("{}")
    os.symlink(str(outside), str(directory / "7.json"))
    (directory / "8.json").write_text("{}")
    for path in (directory / "8.json", outside):
        os.utime(str(path), (1000, 1000))
    os.utime(str(directory / "7.json"), (1000, 1000), follow_symlinks=False)
    assert records.prune_snapshots(str(directory), 86400) == 1
    assert os.listdir(str(directory)) == ["7.json"] and outside.exists()


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURM_JOB_RESTART_COUNT": "2"}, 2),
        ({"SLURM_RESTART_COUNT": "3"}, 3),  # the batch/task environment's name
        ({"SLURM_JOB_RESTART_COUNT": "1", "SLURM_RESTART_COUNT": "7"}, 1),
        ({}, None),
        ({"SLURM_JOB_RESTART_COUNT": "-1"}, None),  # malformed: never stops the hook
        ({"SLURM_JOB_RESTART_COUNT": "1;rm"}, None),
        ({"SLURM_JOB_RESTART_COUNT": "123456"}, None),
    ],
)
def test_the_restart_count_comes_from_slurmds_prolog_epilog_environment(env, expected):
    assert job_from_env(dict(ENV, **env)).restart_count == expected


def test_the_epilog_signs_its_record_when_the_key_exists_and_never_fails_without(tmp_path, caplog):
    """The record is signed for DIR/<node>/<name> with [records] key_file (signing.py); a missing
    key gives an unsigned record, a key that cannot be trusted a logged warning and an unsigned
    record: never a failed epilog."""
    from slurm_hooks.records import signing

    key_file = tmp_path / "records.key"
    key_file.write_bytes(os.urandom(32))
    os.chmod(str(key_file), 0o600)
    config = make_config(tmp_path, key_file=str(key_file))
    signed = records.epilog_record(config, JobContext("1", "u", "n1", ()), "n1")
    data = open(signed, "rb").read()
    assert signing.verify_file(data, key_file.read_bytes(), "n1", "1.json") == signing.VERIFIED
    assert json.loads(data)["job"]["id"] == "1"  # still one JSON document
    assert signing.verify_file(data, key_file.read_bytes(), "n2", "1.json") == signing.BAD_MAC

    os.chmod(str(key_file), 0o666)  # anyone could replace it: not trusted
    with caplog.at_level(logging.WARNING, logger="slurm_hooks.decisions"):
        unsigned = records.epilog_record(config, JobContext("2", "u", "n1", ()), "n1")
    assert "event=records-key-unusable" in caplog.text and "writable by others" in caplog.text
    assert signing.verify_file(open(unsigned, "rb").read(), b"k" * 32, "n1", "2.json") == (
        signing.UNSIGNED
    )
    key_file.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slurm_hooks.decisions"):
        assert records.epilog_record(config, JobContext("3", "u", "n1", ()), "n1")
    # a key_file set on purpose and missing: a typo or a key not distributed yet, said
    assert "event=records-key-missing" in caplog.text and str(key_file) in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slurm_hooks.decisions"):
        assert records.epilog_record(make_config(tmp_path), JobContext("4", "u", "n1", ()), "n1")
    assert "records-key" not in caplog.text  # no key at the default path: report only, quietly


def test_record_show_says_whether_the_record_verifies(tmp_path, capsys, monkeypatch):
    from slurm_hooks.cli.main import main

    key_file = tmp_path / "records.key"
    key_file.write_bytes(os.urandom(32))
    os.chmod(str(key_file), 0o600)
    config = make_config(tmp_path, key_file=str(key_file))
    path = records.epilog_record(config, JobContext("1", "u", "n1", ()), "n1")
    conf = tmp_path / "config.toml"
    conf.write_text('[records]\nkey_file = "%s"\n' % key_file)
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(conf))
    assert main(["record", "show", "1", "--dir", str(tmp_path / "jobs")]) == 0
    assert "  record verified (records key" in capsys.readouterr().out
    with open(path, "ab") as handle:
        handle.write(b" ")  # the body changed below the signed header line
    assert main(["record", "show", "1", "--dir", str(tmp_path / "jobs")]) == 0
    assert "  record NOT verified: body changed" in capsys.readouterr().out
