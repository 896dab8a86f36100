"""A node as slurmctld reports it: its state (base state and flags), reason and reason time, and the
parser of ``scontrol --all --oneliner show node`` lines (client.ScontrolBackend; the pyslurm backend
builds NodeInfo from pyslurm's objects in client.node_from_pyslurm).

Seen on Slurm 22.05, 24.11, 25.11 and 26.05 (tests/captures/slurm/): ``State=IDLE+DRAIN``; the first
line of the Reason is followed by ``[user@YYYY-MM-DDTHH:MM:SS]`` (slurmctld's reason_time; our clients
run with TZ=UTC0, so it is UTC); a free-text field (Reason, Comment, Extra) can hold anything a user
or admin wrote, newlines and ``Key=`` text included.
"""

from __future__ import annotations

import calendar
import time
from typing import FrozenSet, List, Optional, Tuple

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from .errors import SlurmParseError

# ---------------------------------------------------------------------------------------------
# node state

BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
KNOWN_FLAGS = frozenset(
    {
        "DRAIN",
        "NOT_RESPONDING",
        "COMPLETING",
        "CLOUD",
        "FAIL",
        "MAINTENANCE",
        "RESERVED",
        "PLANNED",
        "POWER_DOWN",
        "POWER_UP",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "POWER_DRAIN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "INVALID_REG",
        "DYNAMIC_FUTURE",
        "DYNAMIC_NORM",
        "BLOCKED",
        "PERFCTRS",
        "RESUME",
        "UNDRAIN",
        "EXTERNAL",  # 26.05: a node without slurmd (NodeName=... State=EXTERNAL)
    }
)
# single-word states (sinfo %T/%t, old scontrol) -> (base, flags)
_STATE_ALIASES = {
    "ALLOC": ("ALLOCATED", ()),
    "MIX": ("MIXED", ()),
    "UNK": ("UNKNOWN", ()),
    "FUTR": ("FUTURE", ()),
    "DRAIN": ("IDLE", ("DRAIN",)),
    "DRAINED": ("IDLE", ("DRAIN",)),
    "DRAINING": ("ALLOCATED", ("DRAIN",)),
    "DRNG": ("ALLOCATED", ("DRAIN",)),
    "COMPLETING": ("ALLOCATED", ("COMPLETING",)),
    "COMP": ("ALLOCATED", ("COMPLETING",)),
    "FAIL": ("IDLE", ("FAIL",)),
    "FAILING": ("ALLOCATED", ("FAIL",)),
    "FAILG": ("ALLOCATED", ("FAIL",)),
    "MAINT": ("IDLE", ("MAINTENANCE",)),
    "MAINTENANCE": ("IDLE", ("MAINTENANCE",)),
    "RESV": ("IDLE", ("RESERVED",)),
    "RESERVED": ("IDLE", ("RESERVED",)),
    "PLND": ("IDLE", ("PLANNED",)),
    "PLANNED": ("IDLE", ("PLANNED",)),
    "INVAL": ("IDLE", ("INVALID_REG",)),
    "BLOCKED": ("IDLE", ("BLOCKED",)),
    "POWERED_DOWN": ("IDLE", ("POWERED_DOWN",)),
    "POWERING_DOWN": ("IDLE", ("POWERING_DOWN",)),
    "POWERING_UP": ("IDLE", ("POWERING_UP",)),
    "POW_DN": ("IDLE", ("POWERING_DOWN",)),
    "POW_UP": ("IDLE", ("POWERING_UP",)),
    "REBOOT": ("IDLE", ("REBOOT_REQUESTED",)),
}
_FLAG_ALIASES = {
    "MAINT": "MAINTENANCE",
    "NO_RESPOND": "NOT_RESPONDING",
    "DRAINED": "DRAIN",
    "DRAINING": "DRAIN",
    "RES": "RESERVED",
    "POWER": "POWERED_DOWN",
}
# sinfo's one-character suffixes (idle*, idle~, ...)
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
_STATE_CHARS = lazy_compile(r"[A-Za-z_+*~#%!$@^-]+\Z")
POWER_FLAGS = frozenset({"POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_UP"})


def parse_state(text: str) -> Tuple[str, FrozenSet[str]]:
    """'IDLE+DRAIN' -> ('IDLE', {'DRAIN'}); also 'drained', 'idle*', 'MIXED+DRAIN', 'down~'.

    Unknown words are kept (upper-cased) so callers can refuse to act on states they do not know
    (see NodeInfo.known_state); only empty or non-state text raises SlurmParseError.
    """
    s = (text or "").strip()
    if not s or not _STATE_CHARS.match(s):
        raise SlurmParseError("not a node state: %r" % s[:80])
    flags = set()
    while s and s[-1] in _SUFFIX_FLAGS:
        flags.add(_SUFFIX_FLAGS[s[-1]])
        s = s[:-1]
    parts = s.upper().split("+")
    if not s or any(not p for p in parts):
        raise SlurmParseError("not a node state: %r" % text[:80])
    first = parts[0]
    if first in BASE_STATES:
        base = first
    elif first in _STATE_ALIASES:
        base, extra = _STATE_ALIASES[first]
        flags.update(extra)
    else:
        base = first
    flags.update(_FLAG_ALIASES.get(p, p) for p in parts[1:])
    return base, frozenset(flags)


class NodeInfo(Struct):
    """One node as slurmctld reports it. state is the base state, flags the '+'-joined rest."""

    name: str
    state: str
    flags: FrozenSet[str] = frozenset()
    reason: Optional[str] = None
    reason_user: Optional[str] = None
    reason_time: Optional[str] = None  # slurmctld's reason_time in UTC, 'YYYY-MM-DDTHH:MM:SS'
    partitions: Tuple[str, ...] = ()
    raw: str = field(default="", compare=False, repr=False)

    @property
    def state_string(self) -> str:
        return "+".join([self.state] + sorted(self.flags))

    @property
    def reason_epoch(self) -> Optional[int]:
        """reason_time as seconds since the epoch (slurmctld's clock when the reason was set)."""
        if not self.reason_time:
            return None
        try:
            return calendar.timegm(time.strptime(self.reason_time, "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return None

    @property
    def is_failed(self) -> bool:
        """FAIL flag (``scontrol update State=FAIL``): someone is failing the node; never ours."""
        return "FAIL" in self.flags

    @property
    def is_drained(self) -> bool:
        """DRAIN flag set (sinfo: 'drained' when idle, 'draining' while jobs still run)."""
        return "DRAIN" in self.flags

    @property
    def is_draining(self) -> bool:
        return self.is_drained and (
            self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags
        )

    @property
    def is_down(self) -> bool:
        return self.state == "DOWN"

    @property
    def is_not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags

    @property
    def is_power_saving(self) -> bool:
        return bool(self.flags & POWER_FLAGS)

    @property
    def is_rebooting(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})

    @property
    def known_state(self) -> bool:
        """False when Slurm reported a base state or flag this module does not know."""
        return self.state in BASE_STATES and self.flags <= KNOWN_FLAGS


_KEY = lazy_compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*)=")
_STATE_KEY = lazy_compile(r"(?:^|\s)State=")
_REASON_KEY = lazy_compile(r"(?:^|\s)Reason=")
_REASON_STAMP = lazy_compile(r"\s*\[([^\]\s@]+)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]")
# what scontrol prints after the Reason (src/api/node_info.c, 22.05 to 26.05), each after one space;
# any field name is accepted after the stamp, so a field a later release adds there ends the reason too
_TRAILING = lazy_compile(r"\s(?:Comment|Extra|InstanceId|InstanceType|ReservationName)=")
_ANY_KEY = lazy_compile(r"\s[A-Z][A-Za-z0-9_]*=")
# scontrol -o prints each further line of a multi-line reason after " " + 7 spaces
_CONTINUATION = " " * 8


def _split_reason(line: str) -> Tuple[str, Optional[str], Optional[str], Optional[str]]:
    """Cut 'Reason=text [user@time]...' out of a line: (head, reason, user, time).

    Slurm's fields come first and the Reason (admin-written free text) near the end, so everything a
    reason could forge ('... NodeName=x State=IDLE') is after the first ' Reason=' that follows
    ' State='; only the head is parsed for fields. scontrol prints the stamp after the reason's FIRST
    line and each further line after eight spaces (src/api/node_info.c); they come back joined by
    newlines. The stamp is the first one followed by the end, a further line or a trailing field.
    """
    state = _STATE_KEY.search(line)
    m = _REASON_KEY.search(line, state.end() if state else 0)
    if not m:
        return line, None, None, None
    head, rest = line[: m.start()], line[m.end() :]
    for stamp in _REASON_STAMP.finditer(rest):
        after = rest[stamp.end() :]
        if not after.strip() or after.startswith(_CONTINUATION) or _ANY_KEY.match(after):
            return head, rest[: stamp.start()] + _more_lines(after), stamp.group(1), stamp.group(2)
    tail = _TRAILING.search(rest)  # a reason without a stamp (reason_time 0, e.g. from slurm.conf)
    return head, (rest[: tail.start()] if tail else rest).rstrip(), None, None


def _more_lines(after: str) -> str:
    """The reason's further lines from what follows the stamp, up to a trailing field."""
    if not after.startswith(_CONTINUATION):
        return ""
    tail = _TRAILING.search(after)
    body = after[: tail.start()] if tail else after
    return "".join("\n" + part.strip() for part in body.split(_CONTINUATION) if part.strip())


def parse_fields(line: str) -> dict:
    """Key=Value pairs of one scontrol one-liner; a value runs until the next ' Key='."""
    keys = list(_KEY.finditer(line))
    out = {}
    for i, k in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(k.group(1), line[k.end() : end].strip())  # the first occurrence is Slurm's
    return out


def parse_node_line(line: str) -> NodeInfo:
    """Parse one line of ``scontrol show node -o``; raises SlurmParseError, never anything else."""
    if not isinstance(line, str):
        raise SlurmParseError("expected str, got %s" % type(line).__name__)
    text = line.strip()
    if not text.startswith("NodeName="):
        raise SlurmParseError("not a node record (no leading NodeName=): %r" % text[:120])
    head, reason, user, when = _split_reason(text)
    fields = parse_fields(head)
    name = fields.get("NodeName", "")
    if not name or " " in name:
        raise SlurmParseError("bad NodeName in %r" % text[:120])
    if "State" not in fields:
        raise SlurmParseError("no State= for node %s: %r" % (name[:64], text[:120]))
    base, flags = parse_state(fields["State"])
    parts = fields.get("Partitions", "")
    partitions = tuple(p for p in parts.split(",") if p and p != "(null)")
    return NodeInfo(
        name=name,
        state=base,
        flags=flags,
        reason=reason or None,
        reason_user=user,
        reason_time=when,
        partitions=partitions,
        raw=text,
    )


def parse_nodes(text: str) -> List[NodeInfo]:
    """All records of ``scontrol show node`` (one-line or multi-line format).

    A node name seen twice means a free-text field (an admin's Comment/Extra with a newline) forged a
    record: the listing cannot be trusted, so it is an error rather than a guess.
    """
    records: List[str] = []
    for line in (text or "").splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("NodeName="):
            records.append(s)
        elif records:
            records[-1] += " " + s
        elif s.startswith("No nodes in the system"):
            return []
        else:
            raise SlurmParseError("unexpected scontrol output: %r" % s[:120])
    nodes = [parse_node_line(r) for r in records]
    seen: set = set()
    for node in nodes:
        if node.name in seen:
            raise SlurmParseError(
                "node %s listed twice: a free-text field forged a record" % node.name[:64]
            )
        seen.add(node.name)
    return nodes
