"""Judging one test's run: the tool's report against the node's own GPUs (a GPU well below its
siblings), the hardware class's floors from [qualify] classes, and the port's link rate. Pure:
a ToolRun and numbers in, an Outcome out; tested on the replayed real outputs.

A tool that is not installed is SKIP with its name (never a pass); one that hung, crashed or printed
something that is not its output is FAIL with the tail of what it printed.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..core.structs import Struct, field
from ..result import Status
from . import ParseError, dcgm, nccl, nvbandwidth, perftest
from .levels import D2D, D2H, H2D, Test
from .tools import ToolRun

LARGE_BYTES = 256 << 20  # all-reduce sizes that measure bandwidth, not latency
SHORT = {H2D: "h2d", D2H: "d2h", D2D: "d2d"}
CLASS_FLOOR = {H2D: "min_h2d_gbs", D2H: "min_d2h_gbs", D2D: "min_d2d_gbs"}


class Outcome(Struct, frozen=False):
    name: str
    tool: str
    status: Status
    summary: str
    figures: Dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def judge(
    test: Test,
    run: ToolRun,
    expect: Mapping[str, Any],
    node_fraction: float,
    port_rate_gbits: Optional[float] = None,
) -> Outcome:
    out = Outcome(test.name, test.tool, Status.OK, "", seconds=round(run.seconds, 3))
    if run.refused:  # a tool someone else could have planted: neither run nor skipped
        out.status, out.summary = Status.UNKNOWN, run.refused
        return out
    if not run.found:
        out.status, out.summary = Status.SKIP, "%s is not installed" % test.tool
        return out
    if run.timed_out or (run.rc is not None and run.rc < 0):
        return _fail(out, "%s; it printed: %s" % (run.how_it_ended(), run.tail() or "nothing"))
    parse: Callable[[str], Any] = {
        "dcgmi": dcgm.parse,
        "nvbandwidth": nvbandwidth.parse,
        "all_reduce_perf": nccl.parse,
        "ib_write_bw": perftest.parse,
    }[test.tool]
    try:
        report = parse(run.output)
    except ParseError as exc:
        return _fail(
            out, "%s (%s); it printed: %s" % (exc, run.how_it_ended(), run.tail() or "nothing")
        )
    if test.tool == "dcgmi":
        _dcgm(out, report, run)
    elif test.tool == "nvbandwidth":
        _nvbandwidth(out, report, test, expect, node_fraction)
    elif test.tool == "all_reduce_perf":
        _nccl(out, report, expect)
    else:
        _ib(out, report, expect, port_rate_gbits)
    if out.status in (Status.OK, Status.WARN) and run.rc not in (0, None):
        return _fail(
            out,
            "%s with a result that shows no failure; it printed: %s"
            % (run.how_it_ended(), run.tail()),
        )
    return out


def _fail(out: Outcome, summary: str) -> Outcome:
    out.status, out.summary = Status.FAIL, summary
    return out


def _dcgm(out: Outcome, report: dcgm.DiagReport, run: ToolRun) -> None:
    failed = report.failed()
    if failed:
        first = failed[0]
        gpus = sorted(g for g, s in first.gpus.items() if s == "fail")
        where = " on GPU %s" % ",".join(str(g) for g in gpus) if gpus else ""
        message = (": " + first.messages[0][:200]) if first.messages else ""
        more = " (and %d more)" % (len(failed) - 1) if len(failed) > 1 else ""
        _fail(out, "DCGM %s failed%s%s%s" % (first.name, where, more, message))
        return
    if not report.ran():
        out.status, out.summary = Status.UNKNOWN, "DCGM ran no test (every test skipped or not run)"
        return
    warned = [t.name for t in report.tests if t.status == "warn"]
    ran = len(report.ran())
    if warned:
        out.status = Status.WARN
        out.summary = "DCGM %d tests passed, warnings: %s" % (ran, ", ".join(warned))
    else:
        out.summary = "DCGM%s: %d tests passed" % (
            " " + report.version if report.version else "",
            ran,
        )
    out.figures["dcgm.tests_passed"] = float(ran)


def _nvbandwidth(
    out: Outcome, report: nvbandwidth.NvbandwidthReport, test: Test, expect, node_fraction: float
) -> None:
    if report.errors:
        _fail(out, "nvbandwidth: %s" % report.errors[-1][:200])
        return
    problems: List[str] = []
    parts: List[str] = []
    unmeasured: List[str] = []
    for testcase in test.figures:
        matrix = report.matrices.get(testcase)
        if matrix is None:
            continue
        per_gpu = matrix.per_gpu()
        if not per_gpu:
            continue
        short = SHORT.get(testcase, testcase)
        # every GPU the driver lists has a host transfer: one CUDA did not show nvbandwidth (off
        # the bus, or hidden by an inherited CUDA_VISIBLE_DEVICES) was never tested
        if test.gpus and "GPU(row)" not in matrix.title and len(per_gpu) < test.gpus:
            unmeasured.append(
                "%s measured %d of the node's %d GPUs" % (short, len(per_gpu), test.gpus)
            )
        median = statistics.median(per_gpu.values())
        worst_gpu = min(per_gpu, key=lambda g: per_gpu[g])
        worst = per_gpu[worst_gpu]
        out.figures["nvbandwidth.%s.min" % short] = worst
        parts.append("%s min %.1f GB/s (GPU %d), median %.1f" % (short, worst, worst_gpu, median))
        floor = expect.get(CLASS_FLOOR.get(testcase, ""))
        for gpu in sorted(per_gpu):
            value = per_gpu[gpu]
            if floor is not None and value < floor:
                problems.append(
                    "GPU %d %s %.1f GB/s < %g (class floor)" % (gpu, short, value, floor)
                )
            elif len(per_gpu) > 1 and value < node_fraction * median:
                problems.append(
                    "GPU %d %s %.1f GB/s < %d%% of the node's median %.1f"
                    % (gpu, short, value, round(node_fraction * 100), median)
                )
    if problems:
        _fail(out, "nvbandwidth " + "; ".join(problems[:3]))
    elif unmeasured:  # not a fail: the job's environment can hide a GPU too
        out.status, out.summary = Status.UNKNOWN, "nvbandwidth " + "; ".join(unmeasured)
    elif not parts:
        _fail(out, "nvbandwidth printed none of %s" % ", ".join(test.figures))
    else:
        out.summary = "nvbandwidth " + "; ".join(parts)


def _nccl(out: Outcome, report: nccl.NcclReport, expect) -> None:
    busbw = report.large_busbw(LARGE_BYTES)
    if busbw is not None:
        out.figures["nccl.busbw"] = round(busbw, 2)
    if report.wrong():
        _fail(out, "all_reduce_perf #wrong %d (corrupted results)" % report.wrong())
        return
    if report.warnings:
        _fail(out, "all_reduce_perf NCCL WARN %s" % report.warnings[0][:200])
        return
    if busbw is None:
        _fail(out, "all_reduce_perf printed no bandwidth")
        return
    floor = expect.get("min_busbw_gbs")
    if floor is not None and busbw < floor:
        _fail(out, "all_reduce_perf busbw %.1f GB/s < %g (class floor)" % (busbw, floor))
        return
    out.summary = "all_reduce_perf busbw %.1f GB/s at >= %d MiB, #wrong 0" % (
        busbw,
        LARGE_BYTES >> 20,
    )


def _ib(out: Outcome, report: perftest.PerftestReport, expect, rate: Optional[float]) -> None:
    best = report.best_gbits()
    out.figures["%s.gbits" % out.name] = round(best or 0.0, 2)
    fraction = float(expect.get("min_ib_fraction", 0.8))
    if rate is None:
        out.status = Status.WARN
        out.summary = "ib_write_bw %.1f Gb/s; the port's rate is unknown, not judged" % (best or 0)
        return
    if best is None or best < fraction * rate:
        _fail(
            out,
            "ib_write_bw %s %.1f Gb/s = %d%% of the port's %g Gb/s (< %d%%)"
            % (
                out.name[3:],
                best or 0,
                round(100 * (best or 0) / rate),
                rate,
                round(fraction * 100),
            ),
        )
        return
    out.summary = "ib_write_bw %.1f Gb/s = %d%% of %g Gb/s" % (best, round(100 * best / rate), rate)
