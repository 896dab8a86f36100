"""Pure text parsers for procfs/sysfs formats: str -> value, table-tested, no I/O.

Each raises host.ParseError naming the source path when the text is not what the kernel writes.
"""

from __future__ import annotations

from ..core.lazyre import lazy_compile
from ..core.structs import TupleRecord
from .host import ParseError

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple


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


class LoadAvg(TupleRecord):  # not typing.NamedTuple: start-up cost (core/structs.py)
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


class Mount(TupleRecord):
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
        mounts.append(
            Mount(
                _unescape(fields[0]), _unescape(fields[1]), fields[2], tuple(fields[3].split(","))
            )
        )
    return mounts


def holding_mount(path: str, mounts: List[Mount]) -> Optional[Mount]:
    """The last-mounted entry whose mount point is `path` or its longest parent (what `df PATH` shows)."""
    best = None
    for mount in mounts:
        point = mount.mountpoint.rstrip("/") + "/"
        if (path.rstrip("/") + "/").startswith(point) and (
            best is None or len(mount.mountpoint) >= len(best.mountpoint)
        ):
            best = mount
    return best


def _unescape(field: str) -> str:
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


class SwapArea(TupleRecord):
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
            raise ParseError(
                source, line, "'<file> <type> <size kB> <used kB> <priority>'"
            ) from None
    return areas


# Arm "CPU implementer" -> (vendor, {"CPU part": core name}): the server and hybrid parts, from
# util-linux sys-utils/lscpu-arm.c (the table lscpu prints "Model name" from).
ARM_PARTS: Dict[int, Tuple[str, Dict[int, str]]] = {
    0x41: (
        "ARM",
        {
            0xD03: "Cortex-A53",
            0xD05: "Cortex-A55",
            0xD07: "Cortex-A57",
            0xD08: "Cortex-A72",
            0xD0B: "Cortex-A76",
            0xD0C: "Neoverse-N1",
            0xD40: "Neoverse-V1",
            0xD41: "Cortex-A78",
            0xD46: "Cortex-A510",
            0xD47: "Cortex-A710",
            0xD49: "Neoverse-N2",
            0xD4D: "Cortex-A715",
            0xD4E: "Cortex-X3",
            0xD4F: "Neoverse-V2",
            0xD80: "Cortex-A520",
            0xD81: "Cortex-A720",
            0xD82: "Cortex-X4",
            0xD84: "Neoverse-V3",
            0xD85: "Cortex-X925",
            0xD87: "Cortex-A725",
            0xD8E: "Neoverse-N3",
            0xC0F: "Cortex-A15",
            0xC09: "Cortex-A9",
            0xC07: "Cortex-A7",
        },
    ),
    0x42: ("Broadcom", {0x516: "ThunderX2"}),
    0x43: ("Cavium", {0x0A1: "ThunderX-88XX", 0x0AF: "ThunderX2-99xx", 0x0B8: "ThunderX3-T110"}),
    0x46: ("FUJITSU", {0x001: "A64FX", 0x003: "MONAKA"}),
    0x48: ("HiSilicon", {0xD01: "Kunpeng-920", 0xD02: "Kunpeng-920", 0xD06: "Kunpeng-950"}),
    0x4E: ("NVIDIA", {0x004: "Carmel", 0x010: "Olympus"}),
    0x50: ("APM", {0x000: "X-Gene"}),
    0x51: ("Qualcomm", {0xC00: "Falkor", 0x001: "Oryon"}),
    0x61: ("Apple", {}),
    0x6D: ("Microsoft", {0xD49: "Azure-Cobalt-100"}),
    0x70: ("Phytium", {0x662: "FTC662", 0x663: "FTC663"}),
    0xC0: ("Ampere", {0xAC3: "Ampere-1", 0xAC4: "Ampere-1a"}),
}
# Keys naming the CPU model, by architecture: x86 'model name', LoongArch 'Model Name' (matched
# case-insensitively), POWER and SPARC 'cpu', RISC-V 'uarch'; Arm is implementer + part below,
# s390 the 'machine =' of its 'processor N:' lines.
_MODEL_KEYS = ("model name", "cpu", "uarch")


def parse_cpuinfo_models(text: str) -> List[str]:
    """Distinct CPU models in /proc/cpuinfo, in order of appearance, on every architecture Linux runs HPC on.

    Arm has no model string: 'CPU implementer' and 'CPU part' name it through ARM_PARTS (unknown
    parts read 'ARM part 0xd99'); hybrid chips list one model per core type. Empty only when the
    file names none (some RISC-V boards give only 'isa').
    """
    models: List[str] = []
    implementer = None
    for line in _model_lines(text):
        key, sep, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if not sep:
            continue
        model = None
        if key in _MODEL_KEYS and value:
            model = value
        elif key == "cpu implementer":
            implementer = _hex(value)
        elif key == "cpu part" and implementer is not None:
            model = _arm_model(implementer, _hex(value))
        elif (
            key.startswith("processor ") and "machine =" in value
        ):  # s390: 'processor 0: version = ..., machine = 2964'
            model = "IBM/S390 machine " + value.rsplit("machine =", 1)[1].strip()
        model = (
            " ".join(model.split()) if model else None
        )  # x86 pads 'Genuine Intel(R) CPU      @ 2.66GHz'
        if model and model not in models:
            models.append(model)
    return models


# The only lines parse_cpuinfo_models acts on: key (what precedes the first ':', stripped, any
# case) one of _MODEL_KEYS, 'cpu implementer' or 'cpu part', or starting with 'processor ' (s390).
# Searched in "\n" + the lowered text: for ASCII text whose only line break is "\n" (str.strip's
# other ASCII whitespace inside a line is ' ', '\t' and '\x1f') it finds every such line, and a
# few more the loop then skips. The leading literal "\n" lets the engine jump from line to line.
_MODEL_LINE = lazy_compile(
    r"\n[ \t\x1f]*(?:model name|cpu(?: implementer| part)?|uarch|processor [^:\n]*)[ \t\x1f]*:[^\n]*"
)
# splitlines() also breaks at these (and at \x85, \u2028 and \u2029, which fail isascii())
_OTHER_LINE_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


def _model_lines(text: str) -> List[str]:
    """The lines of /proc/cpuinfo that parse_cpuinfo_models must look at, in order.

    An x86 node's file has ~27 lines per CPU (7,000 at 256 CPUs), of which one names the model:
    the others are skipped by the regular expression engine instead of being split, stripped and
    lowered one by one in Python (0.3 instead of 1.8 ms for 96 CPUs). Anything else (non-ASCII
    text, other line breaks) takes every line, as before."""
    if not text.isascii() or any(brk in text for brk in _OTHER_LINE_BREAKS):
        return text.splitlines()
    # lower() keeps the length of ASCII text: a match at i in "\n" + lowered is line i of `text`
    return [text[m.start() : m.end() - 1] for m in _MODEL_LINE.finditer("\n" + text.lower())]


def _hex(value: str):
    try:
        return int(value, 16)
    except ValueError:
        return None


def _arm_model(implementer: int, part) -> str:
    vendor, parts = ARM_PARTS.get(implementer, ("implementer 0x%02x" % implementer, {}))
    if part in parts:
        return parts[part]
    return "%s part %s" % (vendor, "?" if part is None else "0x%03x" % part)


def parse_cpuinfo_processors(text: str) -> List[int]:
    """The 'processor : N' numbers of /proc/cpuinfo (CPUs the kernel had online when it was read)."""
    found = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "processor" and value.strip().isdigit():
            found.append(int(value))
    return found


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
