"""nvbandwidth's printed matrices: one per testcase ("Running <testcase>.", a title such as
"memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)", a header of column indices, rows of GB/s or
N/A, "SUM <testcase> <GB/s>"), and the errors it prints when a copy fails (an ASSERT, a pattern
mismatch). Samples: tests/captures/diag/nvbandwidth-* (v0.2 to v0.8).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Tuple

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from . import ParseError

_RUNNING = lazy_compile(r"^Running (\w+)\.$")
_TITLE = lazy_compile(r"^(memcpy|memory latency) .*\((GB/s|ns)\)$")
_HEADER = lazy_compile(r"^\s*\d+(\s+\d+)*\s*$")
_ROW = lazy_compile(r"^\s*(\d+)((\s+(N/A|[0-9]+(\.[0-9]+)?))+)\s*$")
_SUM = lazy_compile(r"^SUM (\w+) ([0-9]+(\.[0-9]+)?)$")
_DEVICE = lazy_compile(r"^Device (\d+): (.+?)(\s+\([0-9a-fA-F:.]+\))?$")
_VERSION = lazy_compile(r"^nvbandwidth Version: (\S+)")
_ERROR = lazy_compile(
    r"ASSERT|Invalid value|CUDA error|CUDA_ERROR|[Ee]rror:|terminate called|Segmentation"
)


class Matrix(Struct, frozen=False):
    testcase: str
    title: str
    columns: List[int] = field(default_factory=list)
    cells: Dict[Tuple[int, int], float] = field(default_factory=dict)  # (row, column) -> GB/s
    total: Optional[float] = None

    def per_gpu(self) -> Dict[int, float]:
        """GPU index -> its figure. CPU(row)<->GPU(column): the GPU's column, its best CPU row (a
        bad link is bad from every CPU; a far NUMA node is not the GPU's fault). GPU(row)<->GPU
        (column): the median of every pair the GPU is in, as source or target (a slow GPU is slow
        in all its pairs, its healthy peers only in their pair with it)."""
        values: Dict[int, List[float]] = {}
        gpu_rows = "GPU(row)" in self.title
        for (row, column), value in self.cells.items():
            for gpu in (row, column) if gpu_rows else (column,):
                values.setdefault(gpu, []).append(value)
        if gpu_rows:
            return {gpu: statistics.median(found) for gpu, found in values.items()}
        return {gpu: max(found) for gpu, found in values.items()}


class NvbandwidthReport(Struct, frozen=False):
    version: Optional[str] = None
    devices: Dict[int, str] = field(default_factory=dict)
    matrices: Dict[str, Matrix] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)


def parse(text: str) -> NvbandwidthReport:
    report = NvbandwidthReport()
    running: Optional[str] = None
    matrix: Optional[Matrix] = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        match = _VERSION.match(line)
        if match:
            report.version = match.group(1)
            continue
        match = _DEVICE.match(line)
        if match:
            report.devices[int(match.group(1))] = match.group(2).strip()
            continue
        match = _RUNNING.match(line)
        if match:
            _keep(report, matrix)  # a matrix whose SUM line the output lacks
            running, matrix = match.group(1), None
            continue
        if _TITLE.match(line.strip()):
            _keep(report, matrix)
            matrix = Matrix(running or "", line.strip())
            continue
        match = _SUM.match(line.strip())
        if match:
            name = match.group(1)
            if matrix is not None:
                matrix.testcase = matrix.testcase or name
                matrix.total = float(match.group(2))
                report.matrices[name] = matrix
            matrix, running = None, None
            continue
        if matrix is not None and not matrix.columns and _HEADER.match(line):
            matrix.columns = [int(c) for c in line.split()]
            continue
        match = _ROW.match(line)
        if matrix is not None and matrix.columns and match:
            values = match.group(2).split()
            if len(values) != len(matrix.columns):
                raise ParseError(
                    "nvbandwidth %s: row %s has %d values for %d columns"
                    % (matrix.testcase or "?", match.group(1), len(values), len(matrix.columns))
                )
            for column, value in zip(matrix.columns, values):
                if value != "N/A":
                    matrix.cells[(int(match.group(1)), column)] = float(value)
            continue
        if _ERROR.search(line):
            report.errors.append(line.strip())
    _keep(report, matrix)  # cut before its SUM line
    if not report.matrices and not report.errors:
        raise ParseError("no nvbandwidth result matrix in the output")
    return report


def _keep(report: NvbandwidthReport, matrix: Optional[Matrix]) -> None:
    if matrix is not None and matrix.cells and matrix.testcase:
        report.matrices.setdefault(matrix.testcase, matrix)
