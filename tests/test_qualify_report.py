"""`slurm-hooks report` shows each node's latest qualification (level, verdict, the failing test and
its figure, when, the record's path), in text and JSON, and exits FOUND when one did not pass.

The records are written by qualify/record.write in the shape flow.run_level gives them (the figures
and summaries are those the flow prints for the replayed real outputs, test_qualify_flow)."""

from __future__ import annotations

import json
import os

from slurm_hooks.cli.main import main
from slurm_hooks.qualify import record
from slurm_hooks.result import ExitCode

H100 = "NVIDIA H100 80GB HBM3 x8"
T0 = 1_780_000_000.0


def run_record(node, verdict, started, level="standard", failed=None):
    tests = [
        {
            "name": "nvbandwidth",
            "tool": "nvbandwidth",
            "status": "OK",
            "summary": "h2d min 23.9 GB/s",
            "figures": {"nvbandwidth.h2d.min": 23.9},
            "seconds": 1.0,
        }
    ]
    if failed:
        tests.append(
            {
                "name": failed[0],
                "tool": failed[0].split(":")[0],
                "status": "FAIL",
                "summary": failed[1],
                "figures": {},
                "seconds": 2.0,
            }
        )
    return {
        "schema": record.SCHEMA,
        "node": node,
        "level": level,
        "class": H100,
        "gpus": 8,
        "started": started,
        "seconds": 3.0,
        "our_seconds": 0.1,
        "verdict": verdict,
        "reason": "%s: %s" % failed if failed else "2 tests passed",
        "tests": tests,
    }


IB_HALF = ("ib:mlx5_0:1", "ib_write_bw 96.2 Gb/s = 48% of the port's 200 Gb/s (< 80%)")


def qualified_dir(tmp_path):
    d = str(tmp_path / "records")
    # n1 failed, then passed: the latest (the pass) is shown
    record.write(d, "n1", run_record("n1", "fail", T0, failed=IB_HALF), now=T0)
    record.write(d, "n1", run_record("n1", "pass", T0 + 600), now=T0 + 600)
    # n2 passed, then failed on the IB port
    record.write(d, "n2", run_record("n2", "pass", T0), now=T0)
    failing = record.write(
        d, "n2", run_record("n2", "fail", T0 + 60, "quick", IB_HALF), now=T0 + 60
    )
    return d, failing


def test_report_shows_each_nodes_latest_qualification(tmp_path, capsys):
    d, failing = qualified_dir(tmp_path)
    assert main(["report", d, "--json"]) == ExitCode.FOUND  # n2's latest did not pass
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "slurm-hooks.report/1" and doc["records"] == 0
    rows = {row["node"]: row for row in doc["qualifications"]}
    assert rows["n1"]["verdict"] == "pass" and rows["n1"]["failed_test"] is None
    assert rows["n1"]["when_utc"] == "2026-05-28T20:36:40Z"  # T0 + 600
    assert rows["n2"] == {
        "node": "n2",
        "level": "quick",
        "class": H100,
        "verdict": "fail",
        "failed_test": "ib:mlx5_0:1",
        "figure": IB_HALF[1],
        "reason": "%s: %s" % IB_HALF,
        "started": T0 + 60,
        "when_utc": "2026-05-28T20:27:40Z",
        "record": failing,
    }
    assert main(["report", d]) == ExitCode.FOUND
    text = capsys.readouterr().out
    assert "latest qualification of 2 node(s)" in text
    (n2,) = [line for line in text.splitlines() if line.strip().startswith("n2 ")]
    assert "quick" in n2 and "FAIL" in n2 and IB_HALF[0] in n2 and "96.2 Gb/s" in n2
    assert "record: %s" % failing in text


def test_report_is_ok_when_every_latest_qualification_passed(tmp_path, capsys):
    d = str(tmp_path / "records")
    record.write(d, "n1", run_record("n1", "fail", T0, failed=IB_HALF), now=T0)
    record.write(d, "n1", run_record("n1", "pass", T0 + 600), now=T0 + 600)
    assert main(["report", d]) == ExitCode.OK
    assert "n1" in capsys.readouterr().out
    empty = str(tmp_path / "none")
    os.mkdir(empty)
    assert main(["report", empty, "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["qualifications"] == []


def test_a_record_of_another_shape_is_shown_without_a_traceback(tmp_path, capsys):
    d = str(tmp_path / "records")
    odd = run_record("n3", "fail", "yesterday", failed=("dcgm", "line one\nline two"))
    odd["level"], odd["tests"][0] = ["quick"], "not a test"
    record.write(d, "n3", odd, now=T0)
    assert main(["report", d]) == ExitCode.FOUND
    text = capsys.readouterr().out
    (line,) = [line for line in text.splitlines() if line.strip().startswith("n3 ")]
    assert "dcgm: line one line two" in line and " ? " in line  # no newline, no time
