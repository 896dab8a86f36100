"""`slurm-hooks report` and `record show` over generated records, against hand-computed expectations."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import JobContext
from slurm_hooks.records import fleet_report as report
from slurm_hooks.records import store as records
from slurm_hooks.records.build import build_record
from slurm_hooks.registry import load_builtin_checks
from tests.inprocess_cli import cli_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = 1_700_000_000.0
COUNTERS = (
    "ecc.volatile.corrected",
    "ecc.volatile.uncorrected",
    "remapped_rows.corrected",
    "remapped_rows.uncorrected",
    "pcie.replay",
    "nvlink.crc_flit",
    "violation_ns.thermal",
    "violation_ns.power",
    "energy_mj",
)
SETTINGS = validate(load_builtin_checks(), {}).settings


def snap(t, seq, gpus, boot="boot-1", xid_lines=None):
    """A snapshot as snapshot.take makes it; gpus = {index: {counter: value}} (others 0)."""
    out = {
        "schema": "slurm-hooks.snapshot/1",
        "time": t,
        "boot_id": boot,
        "kmsg_seq": seq,
        "notes": [],
        "duration_s": 0.01,
        "ib": {"mlx5_0:1": {"symbol_error": gpus.pop("ib", 0)}},
        "gpus": [
            {
                "index": i,
                "uuid": "GPU-%d" % i,
                "serial": "S%d" % i,
                "bus_id": "0000:%02x:00.0" % (0x18 + i),
                "name": "H100",
                "counters": dict(dict.fromkeys(COUNTERS, 0), **c),
                "flags": {},
                "unavailable": {},
                "processes": c.pop("_procs", []),
                "memory_used_bytes": 0,
            }
            for i, c in sorted(gpus.items())
        ],
    }
    if xid_lines is not None:
        out["xid_lines"] = xid_lines
    return out


def xid_line(seq, gpu=0, code=79):
    return (
        "3,%d,%d,-;NVRM: Xid (PCI:0000:%02x:00): %d, pid=1, name=x, GPU has fallen off the bus."
        % (seq, seq * 1000, 0x18 + gpu, code)
    )


def write(directory, node, job, start, end, before_gpus, after_gpus, xids=(), missing=False, ib=0):
    before = None if missing else snap(start, 100, copy.deepcopy(before_gpus))
    after_gpus = dict(copy.deepcopy(after_gpus), ib=ib)
    after = snap(
        end, 200, after_gpus, xid_lines=[xid_line(150 + i, g, c) for i, (g, c) in enumerate(xids)]
    )
    rec = build_record(
        JobContext(job, "alice", node, tuple(sorted(before_gpus or after_gpus))),
        node,
        before,
        "missing" if missing else "ok",
        after,
        "",
        None,
        None,
        None,
        SETTINGS,
        now=end,
    )
    path = records.record_path(directory, node, job)
    records.write_record(path, rec)
    os.utime(path, (end, end))
    return rec


@pytest.fixture
def fleet_dir(tmp_path):
    d = str(tmp_path / "jobs")
    t0 = NOW - 3600
    zero = {0: {}, 1: {}}
    # node-a: job 1 had 2 uncorrectable ECC errors and one Xid on GPU 0; job 2 clean; job 3 left a process
    write(
        d,
        "node-a",
        "1",
        t0,
        t0 + 600,
        zero,
        {0: {"ecc.volatile.uncorrected": 2}, 1: {}},
        xids=[(0, 79)],
    )
    write(d, "node-a", "2", t0 + 700, t0 + 800, zero, zero)
    write(
        d,
        "node-a",
        "3",
        t0 + 900,
        t0 + 1000,
        zero,
        {0: {"_procs": [{"pid": 9, "name": "py"}]}, 1: {}},
    )
    # node-b: job 4: 10 correctable ECC + 3 NVLink CRC + 4 IB symbol errors; job 5: thermal throttling 200 s of 1000 s
    write(
        d,
        "node-b",
        "4",
        t0,
        t0 + 500,
        zero,
        {0: {"ecc.volatile.corrected": 10}, 1: {"nvlink.crc_flit": 3}},
        ib=4,
    )
    write(
        d,
        "node-b",
        "5",
        t0,
        t0 + 1000,
        {0: {}},
        {0: {"violation_ns.thermal": 200 * 10**9, "energy_mj": 5_000_000}},
    )
    # node-c: job 6 clean; job 7 had no prolog snapshot: its boot-wide Xid is listed but not counted
    write(d, "node-c", "6", t0, t0 + 100, zero, zero)
    write(d, "node-c", "7", t0, t0 + 200, {}, {0: {}}, xids=[(0, 48)], missing=True)
    # node-d: an old job (30 days ago) with 5 Xids
    old = NOW - 30 * 86400
    write(d, "node-d", "8", old, old + 100, zero, zero, xids=[(0, 79)] * 5)
    # noise: a corrupt record, a foreign JSON file, and a writer's temp file
    with open(os.path.join(d, "node-c", "9.json"), "w") as handle:
        handle.write('{"schema": "slurm-hooks.job-record/1", "summ')
    with open(os.path.join(d, "node-c", "10.json"), "w") as handle:
        json.dump({"schema": "something-else/2"}, handle)
    with open(os.path.join(d, "node-a", ".11.json.x.tmp"), "w") as handle:
        handle.write("{")
    return d


def test_ranking_and_totals_match_hand_computed_values(fleet_dir):
    fleet = report.aggregate([fleet_dir])
    assert fleet.records == 8 and fleet.unreadable_count == 2
    assert [n.node for n in fleet.ranked()] == ["node-d", "node-a", "node-b", "node-c"]
    a, b, c, d = (fleet.nodes[n] for n in ("node-a", "node-b", "node-c", "node-d"))
    assert (
        a.jobs,
        a.abnormal_jobs,
        a.sums["xids"],
        a.sums["ecc_uncorrected"],
        a.sums["leftover_processes"],
    ) == (3, 2, 1, 2, 1)
    assert a.reasons == {"ecc_uncorrected": 1, "xids": 1, "leftover_processes": 1}
    assert a.to_dict()["worst_jobs"] == ["1", "3"]
    assert (
        b.sums["ecc_corrected"],
        b.sums["nvlink_errors"],
        b.sums["ib_errors"],
        b.sums["throttle_s"],
    ) == (10, 3, 4, 200.0)
    assert b.sums["energy_j"] == 5000.0 and b.reasons == {
        "ecc_corrected": 1,
        "nvlink_errors": 1,
        "ib_errors": 1,
        "throttle": 1,
    }
    assert (c.jobs, c.abnormal_jobs, c.no_deltas, c.sums["xids"]) == (2, 0, 1, 0)
    assert d.sums["xids"] == 5


def test_since_skips_old_records_without_opening_them(fleet_dir, monkeypatch):
    opened = []
    real = report.read_header
    monkeypatch.setattr(report, "read_header", lambda p: opened.append(p) or real(p))
    fleet = report.aggregate([fleet_dir], since=report.parse_since("7d", now=NOW))
    assert "node-d" not in fleet.nodes and fleet.skipped_old == 1
    assert not any("node-d" in p for p in opened)
    assert [n.node for n in fleet.ranked()] == ["node-a", "node-b", "node-c"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7d", NOW - 7 * 86400),
        ("24h", NOW - 86400),
        ("90m", NOW - 5400),
        ("30s", NOW - 30),
        ("1700000000", NOW),
    ],
)
def test_parse_since(text, expected):
    assert report.parse_since(text, now=NOW) == expected


def test_parse_since_dates_and_errors():
    assert report.parse_since("2024-05-01") == time.mktime((2024, 5, 1, 0, 0, 0, 0, 0, -1))
    assert report.parse_since("2024-05-01T12:30") == time.mktime((2024, 5, 1, 12, 30, 0, 0, 0, -1))
    with pytest.raises(report.ReportError, match="--since 'last tuesday'"):
        report.parse_since("last tuesday")


def test_job_view_lists_the_abnormal_nodes_of_one_job(tmp_path):
    d = str(tmp_path / "jobs")
    zero = {0: {}}
    write(d, "gpu01", "500", NOW - 100, NOW, zero, {0: {"nvlink.crc_flit": 2}})
    write(d, "gpu02", "500", NOW - 100, NOW, zero, zero)
    write(d, "gpu03", "500", NOW - 100, NOW, {}, zero, missing=True)
    write(d, "gpu01", "501", NOW - 100, NOW, zero, {0: {"ecc.volatile.uncorrected": 9}})
    rows, problems = report.job_view([d], "500")
    assert [(r["node"], r["abnormal"]) for r in rows] == [
        ("gpu01", ["nvlink_errors"]),
        ("gpu02", []),
        ("gpu03", []),
    ]
    text = report.render_job("500", rows, problems)
    assert (
        "3 node(s), 1 with something abnormal" in text
        and "gpu01" in text
        and "nvlink_errors=2" in text
    )
    assert "no prolog snapshot (no deltas) on: gpu03" in text


def cli(*argv, child=False):
    """`slurm-hooks ARGV`: in this process (tests/inprocess_cli.py) unless child, the console
    entry point, which the first `report` and `record show` below still go through."""
    if not child:
        return cli_in_process(list(argv), env=dict(os.environ, PYTHONPATH=REPO))
    return subprocess.run(
        [sys.executable, "-m", "slurm_hooks"] + list(argv),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
        cwd=REPO,
        timeout=60,
    )


def test_cli_report_and_record_show(fleet_dir):
    out = cli("report", fleet_dir, "--json", child=True)
    assert out.returncode == 1, out.stderr  # ExitCode.FOUND: nodes with abnormal jobs
    data = json.loads(out.stdout)
    assert data["records"] == 8 and [n["node"] for n in data["ranking"]] == [
        "node-d",
        "node-a",
        "node-b",
    ]
    text = cli("report", fleet_dir, "--top", "2").stdout
    assert text.splitlines()[0].startswith("8 records from 4 nodes") and "node-a" in text
    assert "... 1 more nodes" in text
    shown = cli("record", "show", "1", "--dir", fleet_dir, child=True)
    assert shown.returncode == 0, shown.stderr
    assert "job 1 on node-a (user alice, GPUs 0,1)" in shown.stdout
    assert (
        "changed: ecc.volatile.uncorrected=2" in shown.stdout
        and "Xid 79 on 0000:18:00.0 (gpu 0)" in shown.stdout
    )
    assert (
        json.loads(cli("record", "show", "7", "--dir", fleet_dir, "--json").stdout)[
            "prolog_snapshot"
        ]
        == "missing"
    )
    missing = cli("record", "show", "12345", "--dir", fleet_dir, "--node", "node-a")
    assert missing.returncode == 3 and "no record of job 12345 on node node-a" in missing.stderr
    bad = cli("report", fleet_dir, "--since", "yesterday-ish")
    assert bad.returncode == 3 and "--since 'yesterday-ish'" in bad.stderr


@pytest.fixture
def fast_dir():
    """tmpfs when there is one: creating 10,000 files on a busy disk costs more than the report itself."""
    import shutil
    import tempfile

    from tests.fakenode.node import fast_tmpdir

    d = tempfile.mkdtemp(prefix="report-", dir=fast_tmpdir())
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_report_is_fast_at_10000_records(fast_dir):
    """10,000 realistic 8-GPU records from 200 nodes; measured, and bounded generously for slow CI."""
    d = os.path.join(fast_dir, "jobs")
    eight = {i: {} for i in range(8)}
    template = write(
        d,
        "tmpl",
        "1",
        NOW - 1000,
        NOW,
        eight,
        {i: ({"ecc.volatile.corrected": 1} if i == 3 else {}) for i in range(8)},
    )
    os.unlink(records.record_path(d, "tmpl", "1"))
    size = 0
    for i in range(10_000):
        node = "gpu%03d" % (i % 200)
        template["node"], template["job"]["id"] = node, str(100000 + i)
        template["summary"]["ecc_corrected"] = 1 if i % 10 == 0 else 0
        template["summary"]["abnormal"] = ["ecc_corrected"] if i % 10 == 0 else []
        path = os.path.join(d, node, "%d.json" % (100000 + i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = records.encode_record(template)
        size += len(data)
        with open(path, "wb") as handle:
            handle.write(data)
    started = time.monotonic()
    fleet = report.aggregate([d])
    elapsed = time.monotonic() - started
    print("report over 10,000 records (%.1f MB): %.2fs" % (size / 1e6, elapsed))
    assert fleet.records == 10_000 and len(fleet.nodes) == 200
    assert sum(n.sums["ecc_corrected"] for n in fleet.nodes.values()) == 1000
    assert elapsed < 20
