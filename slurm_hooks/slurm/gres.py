"""gres.conf (and `slurmd -G` output) parser, Slurm hostlist expansion, and Slurm's core numbering.

gres.conf lines are ``Key=Value`` words in Slurm's config syntax (slurm_hooks.slurm.conffile), e.g.
``NodeName=gpu[01-16] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-55``. A line without
NodeName applies to every node. ``AutoDetect=nvml`` makes slurmd ask NVML itself. `slurmd -G`
prints the same words after ``Gres `` (``slurmd: Gres Name=gpu Type=h100 ... File=/dev/nvidia0
Cores=0-55 ...``, with a ``[2026-10-09T06:49:39.052]`` time stamp when it logs to a file or a
terminal), so a saved copy of its output parses the same way; its other log lines are skipped.

``Cores=`` are Slurm's *logical core indices* (socket by socket, core by core, as `lstopo -l` numbers
"Core L#"), not Linux CPU numbers; ``logical_cores`` maps them to CPUs with
/sys/devices/system/cpu/cpuN/topology (`lscpu -e`).
"""

from __future__ import annotations

import re

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from ..hw.host import ParseError, parse_cpulist
from . import conffile

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple


class GresLine(Struct):
    line_no: int
    text: str
    fields: Mapping[str, str]  # keys lower-cased
    node_names: Tuple[str, ...] = ()  # expanded NodeName; empty = every node
    files: Tuple[str, ...] = ()  # expanded File=
    cores: Optional[FrozenSet[int]] = None  # Cores= (or the old CPUs=) as logical core indices
    where: str = ""  # "file:line" (an included file names itself)

    @property
    def name(self) -> str:
        return self.fields.get("name", "")

    def applies_to(self, node: str) -> bool:
        return not self.node_names or node in self.node_names


class GresConf(Struct):
    lines: Tuple[GresLine, ...]
    autodetect: str = ""  # global AutoDetect=nvml|nvidia|rsmi|oneapi|off ('' = not set)
    node_autodetect: Dict[str, str] = field(default_factory=dict)  # per-NodeName AutoDetect lines

    def autodetect_for(self, node: str) -> str:
        return self.node_autodetect.get(node, self.autodetect)

    def gpu_lines(self, node: str) -> List[GresLine]:
        return [ln for ln in self.lines if ln.name.lower() == "gpu" and ln.applies_to(node)]


MAX_HOSTLIST_NAMES = (
    100000  # more nodes than the largest Slurm cluster; n[0-99999][0-99999] is refused
)


# names in all the hostlists of one file (its includes too): ten times the largest cluster, one
# second here; a 4 MiB file of 'NodeName=n[0-99999] ...' lines, each under the bound of one
# hostlist, was 8 billion names (20 such lines: 1.4 s and 150 MB)
MAX_FILE_NAMES = 1000000


class NameBudget:
    """How many hostlist names one file may still expand to (MAX_FILE_NAMES), shared by its lines."""

    def __init__(self, left: int = MAX_FILE_NAMES):
        self.left = left

    def spend(self, count: int, source: str, text: str) -> None:
        self.left -= count
        if self.left < 0:
            raise ParseError(source, text, "at most %d hostlist names in one file" % MAX_FILE_NAMES)


def expand_hostlist(
    text: str, source: str = "<hostlist>", budget: Optional[NameBudget] = None
) -> List[str]:
    """'gpu[01-03,07],login1' -> ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login1'] (zero padding kept).

    At most MAX_HOSTLIST_NAMES names (a ParseError beyond): nested ranges multiply, and a check
    must not spend its time and memory listing billions of names. `budget`: the names the file
    this hostlist is in may still expand to (spent here)."""
    names: List[str] = []
    for item in _split_top_level(text.strip()):
        names.extend(_expand_one(item, source, text))
        if len(names) > MAX_HOSTLIST_NAMES:
            raise ParseError(source, text, "at most %d names in one hostlist" % MAX_HOSTLIST_NAMES)
    if budget is not None:
        budget.spend(len(names), source, text)
    return names


def _split_top_level(text: str) -> List[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p]


def _expand_one(item: str, source: str, whole: str) -> List[str]:
    match = re.match(r"^([^\[\]]*)\[([^\]]*)\](.*)$", item)
    if not match:
        if "[" in item or "]" in item:
            raise ParseError(source, whole, "a Slurm hostlist like 'gpu[01-16]'")
        return [item]
    prefix, ranges, rest = match.groups()
    tails = _expand_one(rest, source, whole) if rest else [""]
    out: List[str] = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if (
            not lo.isdigit()
            or (hi and not hi.isdigit())
            or (hi and int(hi) < int(lo))
            or (hi and int(hi) - int(lo) > 100000)
        ):
            raise ParseError(source, whole, "a Slurm hostlist like 'gpu[01-16]'")
        width = len(lo)
        if len(out) + (int(hi or lo) - int(lo) + 1) * len(tails) > MAX_HOSTLIST_NAMES:
            raise ParseError(source, whole, "at most %d names in one hostlist" % MAX_HOSTLIST_NAMES)
        for number in range(int(lo), int(hi or lo) + 1):
            for tail in tails:
                out.append("%s%0*d%s" % (prefix, width, number, tail))
    return out


# A line of slurmd's own log (`slurmd -G` prints to stderr): "[2026-10-09T06:49:39.052] " and/or
# "slurmd: " (or "slurmd-<name>: "), then a log level word for debug/verbose/error messages.
_SLURMD_LOG = lazy_compile(
    r"^\s*(?:\[\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-][\d:]+)?\]\s*(?:slurmd(?:-\S+)?:\s*)?"
    r"|slurmd(?:-\S+)?:\s*)"
    r"(?:(?:debug\d?|verbose|info|error|warning|fatal):\s*)?"
)
_GRES_RECORD = lazy_compile(r"^\s*Gres\s+(?=[A-Za-z]+=)")

# keys whose value is device files: File=, its alias Files=, and MultipleFiles= (one GRES, several files)
_FILE_KEYS = ("file", "files", "multiplefiles")


def _slurmd_output_as_conf(text: str) -> str:
    """`slurmd -G` output -> gres.conf text, line for line (numbers stay right).

    Its "Gres Name=gpu ... File=... Cores=..." records become gres.conf lines; every other line of
    slurmd's log (plugin messages, "GRES[gpu] Type:..." dumps, errors) becomes blank. A line without
    a log prefix is gres.conf text and stays as it is.
    """
    if "Gres " not in text and "slurmd" not in text and "[" not in text:
        return text
    out = []
    for line in text.split("\n"):
        match = _SLURMD_LOG.match(line)
        rest = line[match.end() :] if match and match.end() else line
        record = _GRES_RECORD.match(rest)
        if (
            record
        ):  # slurmd 22.05 ends a record with a bare "(null)" (its Links): keep Key=Value words
            out.append(" ".join(w for w in rest[record.end() :].split() if "=" in w))
        else:
            out.append("" if match and match.end() else line)
    return "\n".join(out)


def parse_gres_conf(
    text: str, source: str = "/etc/slurm/gres.conf", read: Optional[conffile.Reader] = None
) -> GresConf:
    """Parse gres.conf text (or saved `slurmd -G` output) as Slurm 25.11's gres.c does.

    Syntax (comments, continuations, quotes, include) from slurm_hooks.slurm.conffile; `read`
    follows includes (None: text only). Meaning: a line starting with AutoDetect= alone sets the
    global default; AutoDetect= on a NodeName= line applies to those nodes only and wins over the
    global one; on a line without NodeName= Slurm ignores it ("In-line AutoDetect requires NodeName
    to take effect"). File=, Files= and MultipleFiles= list device files. Errors name file and line.
    """
    lines: List[GresLine] = []
    autodetect, node_autodetect = "", {}
    budget = NameBudget()
    for conf_line in conffile.read_conf(source, read, _slurmd_output_as_conf(text)):
        where, pairs = conf_line.where, conf_line.pairs
        if conf_line.leftover or not pairs:
            raise ParseError(
                where,
                conf_line.text,
                "Key=Value words (e.g. Name=gpu File=/dev/nvidia0 Cores=0-55)",
            )
        fields = conf_line.fields()
        if pairs[0][0] == "autodetect":
            if len(pairs) > 1:  # Slurm: the words after a leading AutoDetect= are a parse error
                raise ParseError(where, conf_line.text, "AutoDetect= alone, or after NodeName=")
            autodetect = fields["autodetect"].lower()
            continue
        nodes = (
            tuple(expand_hostlist(fields["nodename"], where, budget))
            if "nodename" in fields
            else ()
        )
        if "autodetect" in fields and nodes:
            node_autodetect.update({n: fields["autodetect"].lower() for n in nodes})
        if "name" not in fields and "autodetect" in fields:
            continue  # a node's AutoDetect line, no GRES of its own
        files: Tuple[str, ...] = ()
        for key in _FILE_KEYS:
            if key in fields:
                files += tuple(expand_hostlist(fields[key], where, budget))
        cores_text = fields.get("cores", fields.get("cpus"))
        cores = parse_cpulist(cores_text, where + " Cores=") if cores_text is not None else None
        number = int(where.rsplit(":", 1)[1])
        lines.append(GresLine(number, conf_line.text, fields, nodes, files, cores, where))
    return GresConf(tuple(lines), autodetect, node_autodetect)


def device_minor(path: str) -> Optional[int]:
    """'/dev/nvidia3' -> 3; other device files (nvidia-caps, MIG) -> None."""
    match = re.match(r"^/dev/nvidia(\d+)$", path)
    return int(match.group(1)) if match else None


def logical_cores(topology: Iterable[Tuple[int, int, int]]) -> List[FrozenSet[int]]:
    """[(cpu, package id, core id)] -> CPUs of each core in Slurm's logical order (index = core L#)."""
    by_core: Dict[Tuple[int, int], set] = {}
    for cpu, package, core in topology:
        by_core.setdefault((package, core), set()).add(cpu)
    return [frozenset(by_core[key]) for key in sorted(by_core)]


def cores_to_cpus(
    cores: Iterable[int], core_cpus: List[FrozenSet[int]]
) -> Tuple[FrozenSet[int], List[int]]:
    """Logical core indices -> (their CPUs, indices beyond this machine's cores)."""
    cpus: set = set()
    missing = []
    for index in sorted(cores):
        if 0 <= index < len(core_cpus):
            cpus.update(core_cpus[index])
        else:
            missing.append(index)
    return frozenset(cpus), missing


def parse_slurm_node_line(
    text: str,
    node: str,
    source: str = "/etc/slurm/slurm.conf",
    read: Optional[conffile.Reader] = None,
) -> Dict[str, str]:
    """The NodeName= line of slurm.conf that names `node` -> {key lower-case: value} (empty if none).

    Only what a NodeName line says directly; NodeName=DEFAULT lines are merged underneath. Read with
    Slurm's syntax (slurm_hooks.slurm.conffile): a NodeName line continued with a trailing backslash
    keeps its CpuSpecList=, Gres= and MemSpecLimit=, and `read` follows include files.
    """
    merged: Dict[str, str] = {}
    found = False
    budget = NameBudget()
    for conf_line in conffile.read_conf(source, read, text):
        if conf_line.first_key() != "nodename":
            continue
        if conf_line.leftover:  # slurmctld and slurmd refuse such a line
            raise ParseError(conf_line.where, conf_line.text, "Key=Value words")
        fields = conf_line.fields()
        names = fields["nodename"]
        if names.upper() == "DEFAULT":
            merged.update(fields)
            continue
        if node in expand_hostlist(names, conf_line.where, budget):
            merged.update(fields)
            found = True
    return merged if found else {}


def spec_cpus(abstract_ids: Iterable[int], core_cpus: List[FrozenSet[int]]) -> FrozenSet[int]:
    """slurm.conf CpuSpecList (Slurm abstract CPU ids: core by core, a core's threads consecutive) -> Linux CPUs.

    Slurm reserves whole cores, so every thread of a listed id's core is included.
    """
    threads = max((len(c) for c in core_cpus), default=1)
    cores = {a // threads for a in abstract_ids if a // threads < len(core_cpus)}
    return frozenset().union(*(core_cpus[c] for c in cores)) if cores else frozenset()
