"""Pure text parsers for procfs/sysfs formats: str -> value, table-tested, no I/O.

Each raises host.ParseError naming the source path when the text is not what the kernel writes.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

from .host import ParseError


def parse_meminfo(text: str, source: str = "/proc/meminfo") -> Dict[str, int]:
    """/proc/meminfo or /sys/devices/system/node/nodeN/meminfo -> {'MemTotal': kB, ...}.

    Node files prefix each line with 'Node N '; values without a unit (HugePages_Total) are counts.
    """
    values: Dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        words = line.replace(":", " : ", 1).split()
        if words[:1] == ["Node"] and len(words) > 2:
            words = words[2:]
        try:
            colon = words.index(":")
            key = " ".join(words[:colon])
            values[key] = int(words[colon + 1])
        except (ValueError, IndexError):
            raise ParseError(source, line, "'Key: <number> [kB]' lines") from None
    return values


class LoadAvg(NamedTuple):
    one: float
    five: float
    fifteen: float
    running: int
    total: int


def parse_loadavg(text: str, source: str = "/proc/loadavg") -> LoadAvg:
    """'0.34 0.25 0.11 1/84 4512' -> LoadAvg."""
    try:
        one, five, fifteen, tasks = text.split()[:4]
        running, total = tasks.split("/")
        return LoadAvg(float(one), float(five), float(fifteen), int(running), int(total))
    except ValueError:
        raise ParseError(source, text, "'<1m> <5m> <15m> <running>/<total> <lastpid>'") from None


class Mount(NamedTuple):
    device: str
    mountpoint: str
    fstype: str
    options: Tuple[str, ...]


def parse_mounts(text: str, source: str = "/proc/mounts") -> List[Mount]:
    """/proc/mounts lines; octal escapes (\\040 for space) in paths are decoded."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 4:
            raise ParseError(source, line, "'<device> <mountpoint> <fstype> <options> ...'")
        mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2], tuple(fields[3].split(","))))
    return mounts


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class SwapArea(NamedTuple):
    name: str
    size_kb: int
    used_kb: int


def parse_swaps(text: str, source: str = "/proc/swaps") -> List[SwapArea]:
    """/proc/swaps: a header line, then 'Filename Type Size Used Priority' rows (kB)."""
    areas = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if not fields:
            continue
        try:
            areas.append(SwapArea(fields[0], int(fields[2]), int(fields[3])))
        except (ValueError, IndexError):
            raise ParseError(source, line, "'<file> <type> <size kB> <used kB> <priority>'") from None
    return areas


def parse_cpuinfo_models(text: str) -> List[str]:
    """Distinct CPU model names in /proc/cpuinfo ('model name' on x86, 'Model'/'CPU part' elsewhere)."""
    models: List[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model") and value.strip() and value.strip() not in models:
            models.append(value.strip())
    return models


def parse_cpuinfo_topology(text: str) -> Dict[int, Tuple[int, int]]:
    """/proc/cpuinfo -> {processor: (physical id, core id)}; processors lacking either are left out."""
    places: Dict[int, Tuple[int, int]] = {}
    processor = package = None
    for line in text.splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        try:
            if key == "processor":
                processor, package = int(value), None
            elif key == "physical id":
                package = int(value)
            elif key == "core id" and processor is not None and package is not None:
                places[processor] = (package, int(value))
        except ValueError:
            continue  # a field we cannot read: that CPU falls back to sysfs
    return places
