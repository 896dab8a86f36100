"""nccl-tests `all_reduce_perf` output: the per-size rows (out-of-place and in-place time, algbw,
busbw, and `#wrong` in nccl-tests >= 2.10; an `error` figure and no root column before), the
"# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth" lines, and NCCL WARN lines.
Samples: tests/captures/diag/nccl-*.
"""

from __future__ import annotations

from typing import List, Optional

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from . import ParseError

_MPI_PREFIX = lazy_compile(r"^\[\d+,\d+\]<std(out|err)>:")
_NUM = r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?"
_ROW = lazy_compile(
    r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(?:(-?\d+)\s+)?"
    r"(%s)\s+(%s)\s+(%s)\s+(\S+)\s+(%s)\s+(%s)\s+(%s)\s+(\S+)\s*$" % ((_NUM,) * 3 + (_NUM,) * 3)
)
_OOB = lazy_compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG = lazy_compile(r"^#\s*Avg bus bandwidth\s*:\s*(%s)" % _NUM)
_WARN = lazy_compile(r"NCCL WARN (.*)$")
_RANK = lazy_compile(r"^#\s+Rank\s+(\d+).*? on\s+(\S+) device\s+(\d+) \[[^\]]*\] (.+?)\s*$")


class NcclRow(Struct):
    size: int
    busbw: float  # the better of out-of-place and in-place, GB/s
    wrong: Optional[int]  # #wrong of both, summed; None where the build prints an error figure


class NcclReport(Struct, frozen=False):
    rows: List[NcclRow] = field(default_factory=list)
    out_of_bounds: Optional[int] = None
    avg_busbw: Optional[float] = None
    warnings: List[str] = field(default_factory=list)
    devices: List[str] = field(default_factory=list)  # the GPU model of each rank

    def wrong(self) -> int:
        counted = sum(r.wrong or 0 for r in self.rows)
        return max(counted, self.out_of_bounds or 0)

    def large_busbw(self, min_bytes: int) -> Optional[float]:
        """Mean bus bandwidth of the rows of at least min_bytes; the largest size's row where the
        run stopped below that (small sizes measure latency, not bandwidth)."""
        large = [r.busbw for r in self.rows if r.size >= min_bytes]
        if not large and self.rows:
            large = [max(self.rows, key=lambda r: r.size).busbw]
        return sum(large) / len(large) if large else None


def _wrong(text: str) -> Optional[int]:
    return int(text) if text.isdigit() else None


def parse(text: str) -> NcclReport:
    report = NcclReport()
    for raw in text.splitlines():
        line = _MPI_PREFIX.sub("", raw.rstrip())
        match = _WARN.search(line)
        if match:
            report.warnings.append(match.group(1).strip())
            continue
        match = _ROW.match(line)
        if match:
            g = match.groups()
            wrong = [_wrong(g[8]), _wrong(g[12])]
            counts = [w for w in wrong if w is not None]
            report.rows.append(
                NcclRow(int(g[0]), max(float(g[7]), float(g[11])), sum(counts) if counts else None)
            )
            continue
        match = _OOB.match(line)
        if match:
            report.out_of_bounds = int(match.group(1))
            continue
        match = _AVG.match(line)
        if match:
            report.avg_busbw = float(match.group(1))
            continue
        match = _RANK.match(line)
        if match:
            report.devices.append(match.group(4))
    if not report.rows and report.out_of_bounds is None:
        raise ParseError("no all_reduce_perf result rows in the output")
    return report
