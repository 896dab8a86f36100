"""Every reader of records survives every record: any JSON value in any field position.

A record file is written by root on its node, but it sits on a shared file system, may come from an
older or newer version, or from a writer's bug. Each reader (`report`, `report --job`, `record show`,
`report --stragglers` with its JSON and Prometheus output) must then count that one record
unreadable and name it, never stop with a traceback. Before: `report DIR` died on `"summary": 0`.
The grid below puts each hostile value at each position; hypothesis then tries arbitrary JSON.
"""

from __future__ import annotations

import argparse
import copy
import functools
import io
import json
import math
import os
import random
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fleet_synth
from slurm_hooks.cli import record_verbs
from slurm_hooks.records import fleet_report, report_metrics, straggler_scan, xid_lineup
from slurm_hooks.records.store import encode_record
from tests.straggler_records import HW, NOW, healthy
from tests.straggler_records import settings as fleet_settings

JOB = "4242"
PEERS = [
    "n01",
    "n02",
    "n03",
    "n04",
]  # valid records of the same job: the odd one is scored with them
ODD = "n09"

# where a value can sit: the header the reports read, and the body `record show` prints
POSITIONS = [
    (),
    ("job",),
    ("job", "id"),
    ("job", "user"),
    ("job", "gpus"),
    ("job", "restart_count"),
    ("node",),
    ("start",),
    ("end",),
    ("boot_id",),
    ("prolog_snapshot",),
    ("summary",),
    ("summary", "deltas"),
    ("summary", "xids"),
    ("summary", "ecc_uncorrected"),
    ("summary", "throttle_s"),
    ("summary", "energy_j"),
    ("summary", "leftover_processes"),
    ("summary", "leftover_memory_bytes"),
    ("summary", "drained"),
    ("summary", "abnormal"),
    ("summary", "abnormal", 0),
    ("summary", "perf"),
    ("summary", "perf", HW),
    ("summary", "perf", "gpu_power_w.mean"),
    ("summary", "hw_class"),
    ("summary", "xid_times"),
    ("summary", "xid_times", 0),
    ("summary", "xid_times", 0, 1),
    ("end_utc",),
    ("duration_s",),
    ("epilog_snapshot",),
    ("rebooted_during_job",),
    ("notes",),
    ("notes", 0),
    ("gpus",),
    ("gpus", 0),
    ("gpus", 0, "index"),
    ("gpus", 0, "delta"),
    ("gpus", 0, "delta", "pcie.replay"),
    ("gpus", 0, "nvlink_delta"),
    ("gpus", 0, "nvlink_delta", "3"),
    ("gpus", 0, "flags"),
    ("gpus", 0, "processes"),
    ("gpus", 0, "processes", 0),
    ("gpus", 0, "processes", 0, "used_memory_bytes"),
    ("gpus", 0, "counter_resets"),
    ("gpus", 0, "unavailable"),
    ("ib",),
    ("ib", 0),
    ("ib", 0, "delta"),
    ("ib", 0, "port"),
    ("events_scope",),
    ("xids",),
    ("xids", 0),
    ("xids", 0, "xid"),
    ("xids", 0, "text"),
    ("sxids",),
    ("sxids", 0),
    ("sxids", 0, "switch"),
    ("checks",),
    ("checks", "results"),
    ("checks", "results", 0),
    ("checks", "results", 0, "summary"),
    ("checks", "passed"),
    ("decision",),
    ("decision", "reason"),
]
HOSTILE = [
    None,
    True,
    0,
    -1,
    10**400,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x\n\x00",
    [],
    [[1], {"a": None}],
    {},
    {"a": {"b": [1.5]}},
]


def odd_record():
    """A full record with every body part `record show` prints (fleet_synth's header and body)."""
    record = fleet_synth.header_record(
        JOB, "alice", ODD, NOW - 7200, NOW - 3600, healthy(random.Random(9)), body_gpus=1
    )
    record["summary"]["abnormal"] = ["xids", "drained"]
    record["summary"]["xids"] = 1
    record["summary"]["xid_times"] = [[79, NOW - 3700, 1, "node"]]  # report --xids lines it up
    record["job"]["restart_count"] = 0
    record["gpus"][0]["nvlink_delta"] = {"3": {"crc_flit": 7}}
    record["gpus"][0]["processes"] = [{"pid": 7, "name": "py", "used_memory_bytes": 1 << 30}]
    record["gpus"][0]["counter_resets"] = ["pcie.replay"]
    record["gpus"][0]["unavailable"] = {"retired_pages": "NOT_SUPPORTED"}
    record["ib"] = [{"port": "mlx5_0:1", "delta": {"symbol_error": 2}}]
    record["xids"] = [
        {
            "xid": 79,
            "pci": "0000:18:00.0",
            "job_gpu": 0,
            "text": "off the bus",
            "status": "FAIL",
            "action": "reboot",
        }
    ]
    record["sxids"] = [{"sxid": 20034, "switch": 2, "link": 14, "text": "LTSSM", "status": "FAIL"}]
    record["checks"] = {
        "status": "FAIL",
        "results": [
            {"status": "FAIL", "check": "gpu.memory", "component": "gpu:0", "summary": "remap"}
        ],
        "passed": ["system.cpu"],
    }
    record["decision"] = {"verdict": "drain", "outcome": "drained", "reason": "slurm-hooks: x"}
    record["notes"] = ["kernel log unreadable"]
    return record


def put(record, position, value):
    """record with `value` at `position` (a missing list item or key is created)."""
    if not position:
        return value
    record = copy.deepcopy(record)
    where = record
    for step in position[:-1]:
        where = where[step]
    if isinstance(where, list) and not where:
        where.append(None)
    where[position[-1]] = value
    return record


def write_fleet(directory, odd, layout):
    """The four peers, valid, and the odd record in n09's directory, laid out like the epilog
    writes it ("header": its first line read alone) or as one line of JSON ("whole")."""
    for node, data in _peer_files():
        _put(os.path.join(directory, node), data)
    return _write(os.path.join(directory, ODD), odd, layout)


@functools.lru_cache(maxsize=1)
def _peer_files():
    """(node, bytes) of the four valid peers: the same in every fleet, so encoded once (the grid
    writes ~1,800 fleets)."""
    files = []
    for i, node in enumerate(PEERS):
        perf = healthy(random.Random(i))
        record = fleet_synth.header_record(JOB, "alice", node, NOW - 7200, NOW - 3600, perf)
        if node == PEERS[0]:  # a victim of the odd node's Xid: the job is lined up
            record["summary"].update(xids=1, xid_times=[[45, NOW - 3698, 1, "job"]])
        files.append((node, _encode(record, "header")))
    return tuple(files)


def _write(node_dir, record, layout):
    return _put(node_dir, _encode(record, layout))


def _encode(record, layout):
    if layout == "header" and isinstance(record, dict) and "summary" in record and len(record) > 1:
        return encode_record(record) if _finite(record) else _encode_loose(record)
    return (json.dumps(record) + "\n").encode()  # NaN/Infinity as Python writes them


def _put(node_dir, data):
    os.makedirs(node_dir, exist_ok=True)
    path = os.path.join(node_dir, JOB + ".json")
    with open(path, "wb") as handle:
        handle.write(data)
    os.utime(path, (NOW - 3600, NOW - 3600))
    return path


def _finite(value):
    try:
        json.dumps(value, allow_nan=False)
        return True
    except ValueError:
        return False


def _encode_loose(record):
    """encode_record's layout with NaN/Infinity left in (a writer without allow_nan=False)."""
    from slurm_hooks.records.store import HEADER_KEYS

    header = {k: record[k] for k in HEADER_KEYS if k in record}
    body = {k: v for k, v in record.items() if k not in header}
    if not body:
        return (json.dumps(record) + "\n").encode()
    return (json.dumps(header)[:-1] + ",\n" + json.dumps(body)[1:] + "\n").encode()


def read_everything(directory, path):
    """Every reader on the fleet; AssertionError naming the reader that raised or lost the record."""
    name = os.path.basename(path)
    problems = []

    def run(what, reader):
        try:
            return reader()
        except Exception as exc:  # noqa: BLE001 - the point: any exception is the failure
            problems.append("%s raised %r" % (what, exc))
            return None

    fleet = run("report", lambda: fleet_report.aggregate([directory]))
    if fleet is not None:
        run("report table", lambda: fleet_report.render_fleet(fleet, everything=True))
        run(
            "report --json",
            lambda: json.dumps(fleet_report.fleet_to_dict(fleet, everything=True), allow_nan=False),
        )
        run("report --xids", lambda: xid_lineup.render(fleet.lineups, 2.0))
        run(
            "report --xids --json",
            lambda: json.dumps([j.to_dict() for j in fleet.lineups], allow_nan=False),
        )
        run("report --xids --prom", lambda: report_metrics.lineup_text(fleet, 2.0, NOW))
        if fleet.records + fleet.unreadable_count != len(PEERS) + 1:
            problems.append("report lost the record")
        if fleet.unreadable_count and not any(name in text for text in fleet.unreadable):
            problems.append("report did not name it: %r" % fleet.unreadable)
    rows = run("report --job", lambda: fleet_report.job_view([directory], JOB))
    if rows is not None:
        run("report --job table", lambda: fleet_report.render_job(JOB, *rows))
        run("report --job --json", lambda: json.dumps(rows[0] + rows[1]))
        if len(rows[0]) + len(rows[1]) != len(PEERS) + 1:
            problems.append("report --job lost the record")
    scan = run("stragglers", lambda: straggler_scan.scan([directory], fleet_settings(), now=NOW))
    if scan is not None:
        run("stragglers table", lambda: straggler_scan.render(scan))
        run("stragglers --json", lambda: json.dumps(straggler_scan.to_dict(scan), allow_nan=False))
        run("stragglers --prom", lambda: straggler_scan.prom_text(scan, NOW))
        run("stragglers --prom rows", lambda: report_metrics.straggler_rows_text(scan))
        if scan.records + scan.unreadable_count != len(PEERS) + 1:
            problems.append("report --stragglers lost the record")
    for as_json in (
        False,
        True,
    ):  # `record show JOB --dir DIR [--json]`, without building the parser
        args = argparse.Namespace(job_id=JOB, node=None, dir=[directory], json=as_json, config=None)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = run("record show", lambda a=args: record_verbs.cmd_record_show(a))
        if code not in (None, 0) and name not in err.getvalue():
            problems.append("record show failed without naming the record: %r" % err.getvalue())
    assert not problems, problems


# The full grid is ~1,900 fleets (~12 s of CPU): it runs with the slow tests (CI runs everything);
# the fast tier runs a fixed sample of it that still puts a hostile value at every position and
# each hostile value at ~15 positions in each layout (see sampled_grid).
SAMPLE_PER_POSITION = 3


def sampled_grid():
    """(position, value) pairs: each position with SAMPLE_PER_POSITION of the values, the choice
    rotating with the position (values 5 apart, so each one lands on ~15 positions of every kind)."""
    return [
        (position, HOSTILE[(p + j * 5) % len(HOSTILE)])
        for p, position in enumerate(POSITIONS)
        for j in range(SAMPLE_PER_POSITION)
    ]


def full_grid():
    return [(position, value) for position in POSITIONS for value in HOSTILE]


def assert_grid_survives(tmp_path, layout, grid):
    base = odd_record()
    failures = []
    for n, (position, value) in enumerate(grid):
        directory = str(tmp_path / str(n))
        path = write_fleet(directory, put(base, position, value), layout)
        try:
            read_everything(directory, path)
        except AssertionError as exc:
            failures.append("%s = %r: %s" % (".".join(map(str, position)) or "record", value, exc))
    assert not failures, "\n".join(failures[:40]) + "\n(%d in all)" % len(failures)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["header", "whole"])
def test_every_reader_survives_a_hostile_value_in_every_position(tmp_path, layout):
    assert_grid_survives(tmp_path, layout, full_grid())


@pytest.mark.parametrize("layout", ["header", "whole"])
def test_every_reader_survives_a_sample_of_the_hostile_grid(tmp_path, layout):
    assert_grid_survives(tmp_path, layout, sampled_grid())


def test_the_sample_puts_every_hostile_value_at_many_positions():
    """The fast tier's sample is not a corner of the grid: every position, every value, no repeats."""
    sample = sampled_grid()
    assert {position for position, _ in sample} == set(POSITIONS)
    for value in HOSTILE:
        places = [p for p, v in sample if repr(v) == repr(value)]
        assert len(places) >= len(POSITIONS) * SAMPLE_PER_POSITION // len(HOSTILE) - 1, value
    assert len({(p, repr(v)) for p, v in sample}) == len(sample)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(position=st.sampled_from(POSITIONS), value=JSON, layout=st.sampled_from(["header", "whole"]))
def test_every_reader_survives_arbitrary_json_in_any_position(
    tmp_path_factory, position, value, layout
):
    directory = str(tmp_path_factory.mktemp("fleet"))
    path = write_fleet(directory, put(odd_record(), position, value), layout)
    read_everything(directory, path)


def test_the_grid_reaches_every_position():
    """A position the record does not have would test nothing: each one holds a value in the base."""
    base = odd_record()
    for position in POSITIONS[1:]:
        where = base
        for step in position:
            where = where[step]
        assert where is not None or position == ("summary", "abnormal", 0), position
    assert math.isnan(HOSTILE[6])


def test_report_names_a_record_whose_summary_is_not_an_object(tmp_path):
    """The issue's case, through the command line: `report DIR` died with AttributeError.
    Through cli_in_process, not main(): main's check_verbs.finish ends the process (os._exit 0)
    when a check thread an earlier test left stuck is alive (run after tests/test_xid_check.py),
    which silently ended the whole pytest run here with exit status 0."""
    from tests.inprocess_cli import cli_in_process

    path = write_fleet(str(tmp_path), put(odd_record(), ("summary",), 0), "header")
    proc = cli_in_process(["report", str(tmp_path), "--all"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("4 records from 4 nodes (0 older ones skipped, 1 unreadable)")
    assert "unreadable: %s: its summary is 0, not an object" % path in out


def test_a_fifo_in_a_records_directory_is_refused_not_waited_on(tmp_path):
    """A records directory users can write (a shared one often is): a FIFO named like a record held
    `report` (and report --stragglers, and the epilog's Xid line-up lookup) in open() for ever.
    Each reader refuses it at once with a ValueError naming the file."""
    import threading

    node_dir = tmp_path / "records" / "node1"
    node_dir.mkdir(parents=True)
    fifo = str(node_dir / "4242.json")
    os.mkfifo(fifo)
    readers = {
        "fleet_report.read_head": fleet_report.read_head,
        "fleet_report.load_record": fleet_report.load_record,
        "straggler_scan.read_head": straggler_scan.read_head,
    }
    outcomes = {}
    blocked = []

    def attempt(name, reader):
        try:
            reader(fifo)
            outcomes[name] = "read"
        except ValueError as exc:
            outcomes[name] = str(exc)

    for name, reader in readers.items():
        thread = threading.Thread(target=attempt, args=(name, reader), daemon=True)
        thread.start()
        thread.join(5)
        if thread.is_alive():  # release the blocked open() so the thread can end
            blocked.append(name)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert blocked == [], blocked
    assert sorted(outcomes) == sorted(readers), outcomes
    assert all(fifo in why and "regular file" in why for why in outcomes.values()), outcomes
