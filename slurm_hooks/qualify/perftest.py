"""perftest `ib_write_bw` output: the result table under "#bytes #iterations BW peak[MB/sec]
BW average[MB/sec] MsgRate[Mpps]" (Gb/sec with --report_gbits), the device, link type and, with
--use_cuda, the GPU it picked. Samples: tests/captures/diag/ib_write_bw-*.
"""

from __future__ import annotations

from typing import List, Optional

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from . import ParseError

_HEADER = lazy_compile(r"#bytes\s+#iterations\s+BW peak\[(MB|Gb)/sec\]\s+BW average\[(MB|Gb)/sec\]")
_ROW = lazy_compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")
_DEVICE = lazy_compile(r"Device\s+:\s+(\S+)")
_LINK = lazy_compile(r"Link type\s+:\s+(\S+)")
_CUDA = lazy_compile(r"device name = \[(.+)\]")
# perftest's MB is 10^6 bytes: 24056 MB/s on an HDR (200 Gb/s) port is 192 Gb/s, under the line rate
MB_TO_GBIT = 8.0 / 1000.0


class BwRow(Struct):
    size: int
    iterations: int
    average_gbits: float


class PerftestReport(Struct, frozen=False):
    device: Optional[str] = None
    link_type: Optional[str] = None
    cuda_device: Optional[str] = None
    rows: List[BwRow] = field(default_factory=list)

    def best_gbits(self) -> Optional[float]:
        return max((r.average_gbits for r in self.rows), default=None)


def parse(text: str) -> PerftestReport:
    report = PerftestReport()
    unit: Optional[str] = None
    for line in text.splitlines():
        match = _HEADER.search(line)
        if match:
            unit = match.group(2)
            continue
        match = _ROW.match(line)
        if match and unit is not None:
            average = float(match.group(4))
            gbits = average * MB_TO_GBIT if unit == "MB" else average
            report.rows.append(BwRow(int(match.group(1)), int(match.group(2)), gbits))
            continue
        for pattern, attr in ((_DEVICE, "device"), (_LINK, "link_type"), (_CUDA, "cuda_device")):
            match = pattern.search(line)
            if match and getattr(report, attr) is None:
                setattr(report, attr, match.group(1))
    if not report.rows:
        raise ParseError("no ib_write_bw result row in the output")
    return report
