"""node_exporter textfile metrics (parsed back with prometheus_client's own parser) and the dcgm-exporter
job mapping files."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import CheckRun, JobContext, RunReport
from slurm_hooks.records import dcgm as dcgm_mapping
from slurm_hooks.records import metrics
from slurm_hooks.records import store as records
from slurm_hooks.registry import load_builtin_checks
from slurm_hooks.result import Result, Status
from slurm_hooks.slurm.drainer import Enacted, Outcome
from slurm_hooks.slurm.policy import BreakerState


def make_config(tmp_path, textfile=True, dcgm=False):
    return validate(
        load_builtin_checks(),
        {
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "records": {"dir": str(tmp_path / "jobs")},
            "metrics": {
                "textfile_dir": str(tmp_path / "textfile") if textfile else "",
                "dcgm_job_mapping_dir": str(tmp_path / "dcgm") if dcgm else "",
            },
        },
    )


def run_report(context, *runs):
    return RunReport(
        context, [CheckRun(name, results, duration) for name, results, duration in runs], 0.25, 5.0
    )


def samples(path):
    """{(metric name, frozenset(labels)): value} from the .prom file, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    with open(path) as handle:
        text = handle.read()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


GPU3 = "gpu:3 0000:3b:00.0"
PROLOG = run_report(
    "prolog",
    (
        "gpu.memory",
        [
            Result("gpu.memory", Status.OK, "fine", component="gpu:0 0000:18:00.0"),
            Result("gpu.memory", Status.FAIL, "remap pending", component=GPU3),
            Result("gpu.memory", Status.WARN, "meh", component=GPU3),
        ],
        0.012,
    ),
    ("system.cpu", [Result("system.cpu", Status.OK, "fine")], 0.003),
    ("system.kernel", [Result("system.kernel", Status.SKIP, "disabled in config")], 0.0),
)


def test_textfile_holds_check_status_durations_and_run_time(tmp_path):
    config = make_config(tmp_path)
    path = metrics.write_textfile(config, "prolog", PROLOG, now=1_700_000_000.0)
    assert path == str(tmp_path / "textfile" / "slurm_hooks.prom")
    got = samples(path)
    status = {
        dict(k[1])["component"]: v
        for k, v in got.items()
        if k[0] == "slurm_hooks_check_status" and dict(k[1])["check"] == "gpu.memory"
    }
    assert status == {"gpu:0 0000:18:00.0": 0, GPU3: 2}  # the worst result per component wins
    assert (
        got[
            (
                "slurm_hooks_check_status",
                frozenset({"check": "system.cpu", "component": ""}.items()),
            )
        ]
        == 0
    )
    assert (
        got[
            (
                "slurm_hooks_check_status",
                frozenset({"check": "system.kernel", "component": ""}.items()),
            )
        ]
        == -1
    )
    assert (
        got[("slurm_hooks_check_duration_seconds", frozenset({"check": "gpu.memory"}.items()))]
        == 0.012
    )
    assert (
        got[("slurm_hooks_last_run_timestamp_seconds", frozenset({"mode": "prolog"}.items()))]
        == 1_700_000_000.0
    )
    assert got[("slurm_hooks_run_duration_seconds", frozenset({"mode": "prolog"}.items()))] == 0.25
    assert got[("slurm_hooks_drains_total", frozenset())] == 0
    assert not any(
        name.startswith("slurm_hooks_breaker") for name, _ in got
    )  # unknown until a drain
    assert os.listdir(str(tmp_path / "textfile")) == ["slurm_hooks.prom"]  # temp file renamed away


def test_runs_of_other_modes_merge_and_a_rerun_check_replaces_its_components(tmp_path):
    config = make_config(tmp_path)
    metrics.write_textfile(config, "prolog", PROLOG, now=100.0)
    health = run_report(
        "health", ("gpu.memory", [Result("gpu.memory", Status.OK, "fine", component=GPU3)], 0.02)
    )
    got = samples(metrics.write_textfile(config, "health", health, now=200.0))
    status = {
        dict(k[1])["component"]: v
        for k, v in got.items()
        if k[0] == "slurm_hooks_check_status" and dict(k[1])["check"] == "gpu.memory"
    }
    assert status == {GPU3: 0}  # gpu:0's stale line is gone with the rerun
    assert (
        got[
            (
                "slurm_hooks_check_status",
                frozenset({"check": "system.cpu", "component": ""}.items()),
            )
        ]
        == 0
    )
    last = {
        dict(k[1])["mode"]: v
        for k, v in got.items()
        if k[0] == "slurm_hooks_last_run_timestamp_seconds"
    }
    assert last == {"prolog": 100.0, "health": 200.0}


def test_drains_count_and_breaker_state(tmp_path):
    config = make_config(tmp_path)
    report = run_report(
        "health", ("gpu.memory", [Result("gpu.memory", Status.FAIL, "x", component=GPU3)], 0.01)
    )
    drained = Enacted(Outcome.DRAINED, "drained", breaker=BreakerState(1, 100, 10))
    metrics.write_textfile(config, "health", report, enacted=drained)
    got = samples(metrics.write_textfile(config, "epilog", report, enacted=drained))
    assert got[("slurm_hooks_drains_total", frozenset())] == 2
    assert got[("slurm_hooks_breaker_tripped", frozenset())] == 0
    assert got[("slurm_hooks_breaker_drained_nodes", frozenset())] == 1
    assert got[("slurm_hooks_breaker_limit_nodes", frozenset())] == 10
    tripped = Enacted(Outcome.BREAKER, "circuit breaker", breaker=BreakerState(10, 100, 10))
    got = samples(metrics.write_textfile(config, "health", report, enacted=tripped))
    assert (
        got[("slurm_hooks_drains_total", frozenset())] == 2
        and got[("slurm_hooks_breaker_tripped", frozenset())] == 1
    )


def test_disabled_metrics_write_nothing(tmp_path):
    assert metrics.write_textfile(make_config(tmp_path, textfile=False), "prolog", PROLOG) is None
    assert not (tmp_path / "state").exists()


def test_unwritable_textfile_dir_is_logged_not_raised(tmp_path, caplog):
    config = make_config(tmp_path)
    (tmp_path / "textfile").write_text("a file where the directory should be")
    with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
        assert metrics.write_textfile(config, "prolog", PROLOG) is None
    assert "event=metrics-not-written" in caplog.text and "textfile" in caplog.text


def test_corrupt_state_is_reset(tmp_path, caplog):
    config = make_config(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / metrics.STATE_NAME).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="slurm_hooks.decisions"):
        path = metrics.write_textfile(config, "prolog", PROLOG, now=5.0)
    assert path is not None and "metrics-state-reset" in caplog.text
    state = json.loads((tmp_path / "state" / metrics.STATE_NAME).read_text())
    assert state["last_run"] == {"prolog": 5.0}


# -- dcgm-exporter job mapping ---------------------------------------------------------------------


def test_job_mapping_files_follow_jobs_sharing_gpus(tmp_path):
    directory = str(tmp_path / "dcgm")
    dcgm_mapping.add_job(directory, "101", [0, 1])
    dcgm_mapping.add_job(directory, "102", [1, 2])
    dcgm_mapping.add_job(directory, "102", [1])  # idempotent
    read = lambda name: (tmp_path / "dcgm" / name).read_text()  # noqa: E731
    assert (read("0"), read("1"), read("2")) == ("101\n", "101\n102\n", "102\n")
    assert (
        stat.S_IMODE(os.stat(str(tmp_path / "dcgm" / "1")).st_mode) == 0o644
    )  # dcgm-exporter is not root
    dcgm_mapping.remove_job(directory, "101")
    assert sorted(os.listdir(directory)) == ["1", "2"] and read("1") == "102\n"
    dcgm_mapping.remove_job(directory, "102")
    assert os.listdir(directory) == []


def test_on_hook_writes_snapshot_and_mapping_in_prolog_and_undoes_the_mapping_in_epilog(tmp_path):
    config = validate(
        load_builtin_checks(),
        {
            "general": {"root": str(tmp_path / "empty-root")},
            "nvml": {"library": str(tmp_path / "no-libnvidia-ml.so")},
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "records": {"dir": str(tmp_path / "jobs")},
            "metrics": {"dcgm_job_mapping_dir": str(tmp_path / "dcgm")},
        },
    )
    job = JobContext("55", "carol", "n7", (2, 3))
    snap = records.on_hook("prolog", config, job, "n7")
    assert snap == str(tmp_path / "state" / "snapshots" / "55.json")
    assert sorted(os.listdir(str(tmp_path / "dcgm"))) == ["2", "3"]
    record = records.on_hook("epilog", config, job, "n7")
    assert (
        record == str(tmp_path / "jobs" / "n7" / "55.json")
        and os.listdir(str(tmp_path / "dcgm")) == []
    )
    data = json.loads(open(record).read())
    assert data["prolog_snapshot"] == "ok" and any("NVML unusable" in n for n in data["notes"])
    assert records.on_hook("health", config, JobContext(), "n7") is None


@pytest.mark.parametrize(
    "name, ok",
    [
        ("0", True),
        ("12", True),
        ("2.1", True),
        (".0.x.tmp", False),
        ("lock", False),
        ("1.2.3", False),
    ],
)
def test_only_gpu_files_are_touched(name, ok):
    assert (
        bool(dcgm_mapping._GPU_FILE.match(name)) is ok
    )  # "3", a MIG "3.1"; never our lock or temp files


# -- leftovers: jobs whose epilog never ran, temp files of killed writers, locks held by a hung hook ---


def _mapping_config(tmp_path, root):
    return validate(
        load_builtin_checks(),
        {
            "general": {"root": str(root)},
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "metrics": {"dcgm_job_mapping_dir": str(tmp_path / "dcgm")},
        },
    )


def _age(path, seconds=3 * 3600):
    past = os.stat(str(path)).st_mtime - seconds
    os.utime(str(path), (past, past))


@pytest.mark.parametrize("cgroups", ["v2", "v1", "none"])
def test_a_job_whose_epilog_never_ran_leaves_the_gpu_file_on_its_next_job(tmp_path, cgroups):
    """The docstring promised that a file left behind by a crashed epilog heals on the GPU's next job; it
    stayed forever. Now the next prolog on that GPU keeps only jobs still running here (their Slurm cgroup
    exists; without a visible Slurm cgroup tree, Slurm's one-job-per-GPU default), and a job whose file
    changed moments ago is kept (its cgroup comes after its prolog)."""
    root = tmp_path / "root"
    if cgroups == "v2":
        scope = root / "sys/fs/cgroup/system.slice/slurmstepd.scope"
        (scope / "job_301").mkdir(
            parents=True
        )  # 301 runs on GPU 1 (a shared GPU); 300 crashed without epilog
    elif cgroups == "v1":
        (root / "sys/fs/cgroup/cpuset/slurm/uid_1000/job_301").mkdir(parents=True)
    else:
        (root / "sys/fs/cgroup").mkdir(parents=True)
    config = _mapping_config(tmp_path, root)
    dcgm_mapping.on_prolog(config, JobContext("300", "u", "n1", (0, 1)))
    dcgm_mapping.on_prolog(config, JobContext("301", "u", "n1", (1,)))
    for name in ("0", "1"):
        _age(tmp_path / "dcgm" / name)
    dcgm_mapping.on_prolog(config, JobContext("302", "u", "n1", (0, 1)))  # 300's epilog never ran
    read = lambda name: (tmp_path / "dcgm" / name).read_text().split()  # noqa: E731
    assert read("0") == ["302"]
    assert read("1") == (["301", "302"] if cgroups != "none" else ["302"])
    dcgm_mapping.on_prolog(
        config, JobContext("303", "u", "n1", (0,))
    )  # 302 just started: kept, cgroup or not
    assert read("0") == ["302", "303"]


def test_temp_files_of_killed_writers_are_removed_from_the_dcgm_and_textfile_directories(tmp_path):
    config = make_config(tmp_path, dcgm=True)
    (tmp_path / "dcgm").mkdir()
    (tmp_path / "textfile").mkdir()
    stale = [
        tmp_path / "dcgm" / ".0.4242.0.tmp",
        tmp_path / "textfile" / ".slurm_hooks.prom.4242.3.tmp",
        tmp_path / "textfile" / "slurm_hooks.prom.4242.139872",
    ]  # the last: prometheus_client's own naming
    fresh = [
        tmp_path / "dcgm" / ".1.4243.0.tmp",
        tmp_path / "textfile" / ".slurm_hooks.prom.4243.0.tmp",
    ]
    foreign = [tmp_path / "textfile" / "node.prom", tmp_path / "textfile" / ".other.prom.1.2.tmp"]
    for path in stale + fresh + foreign:
        path.write_text("x")
    for path in stale + foreign:
        _age(path)
    dcgm_mapping.add_job(str(tmp_path / "dcgm"), "7", [0])
    metrics.write_textfile(config, "prolog", PROLOG)
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in fresh + foreign)


def test_a_lock_held_by_a_hung_hook_costs_bounded_time(tmp_path, monkeypatch, caplog):
    """Metrics and the dcgm mapping are updated under flock; a hook stuck on a hung file system while
    holding the lock used to hang every later hook on flock() too."""
    import fcntl
    import time

    monkeypatch.setattr(metrics, "LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(dcgm_mapping, "LOCK_TIMEOUT_S", 0.3)
    config = make_config(tmp_path, dcgm=True)
    (tmp_path / "state").mkdir()
    (tmp_path / "dcgm").mkdir()
    held = [
        os.open(str(tmp_path / "state" / (metrics.STATE_NAME + ".lock")), os.O_RDWR | os.O_CREAT),
        os.open(str(tmp_path / "dcgm"), os.O_RDONLY),
    ]
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="slurm_hooks.decisions"):
            assert metrics.write_textfile(config, "prolog", PROLOG) is None
            dcgm_mapping.on_prolog(config, JobContext("5", "u", "n1", (0,)))
        assert time.monotonic() - started < 2.0
    finally:
        for fd in held:
            os.close(fd)
    assert (
        "event=metrics-not-written" in caplog.text
        and "event=dcgm-mapping-not-written" in caplog.text
    )
    assert caplog.text.count("lock held by another process") == 2


def test_a_fifo_or_a_foreign_file_in_the_mapping_directory_never_holds_the_prolog(tmp_path):
    """A mapping directory others can write: a FIFO named after GPU 0 held add_job in open() (the
    prolog's mapping step until its deadline, the directory lock with it); a file another user
    wrote listing jobs is not kept. Both are replaced by our own file naming this job."""
    import threading

    directory = tmp_path / "dcgm"
    directory.mkdir()
    os.mkfifo(str(directory / "0"))
    (directory / "1").write_text("999\n")
    os.chown(str(directory / "1"), 4242, 4242)
    done = []
    worker = threading.Thread(
        target=lambda: done.append(dcgm_mapping.add_job(str(directory), "101", [0, 1])),
        daemon=True,
    )
    worker.start()
    worker.join(5)
    if worker.is_alive():  # let the blocked open() go so the thread ends
        os.close(os.open(str(directory / "0"), os.O_WRONLY | os.O_NONBLOCK))
    assert done, "add_job blocked on a FIFO"
    assert (directory / "0").read_text() == "101\n" and (directory / "1").read_text() == "101\n"
    assert os.stat(str(directory / "1")).st_uid == os.geteuid()
