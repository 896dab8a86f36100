"""Slurm's topology.conf: which leaf switch (topology/tree) or block (topology/block) each node is under.

Read the way slurmctld reads it (Slurm 25.11 src/plugins/topology/tree/switch_record.c and
src/plugins/topology/block/block_record.c, through src/common/parse_config.c): one entry per line,
``SwitchName=<name> [Nodes=<hostlist>] [Switches=<hostlist>] [LinkSpeed=<n>]`` or
``BlockName=<name> Nodes=<hostlist>`` with an optional ``BlockSizes=...`` line; keys are
case-insensitive, comments, continuations and ``include`` are handled by conffile.read_conf.
A *leaf* is a switch with ``Nodes=`` (a switch with only ``Switches=`` is above the leaves), or a
block. Real files are not tidy (tests/captures/topology): a node listed under two leaves keeps its
first one and is named in `duplicates`; a switch with neither Nodes nor Switches is kept as empty.

report --stragglers uses this to tell a degraded leaf switch from its nodes (records/topology_groups.py).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..hw.host import HostError, ParseError
from . import conffile
from .gres import expand_hostlist

KNOWN_KEYS = {
    "switchname": ("nodes", "switches", "linkspeed"),
    "blockname": ("nodes",),
    "blocksizes": (),
}


class Topology:
    """leaf_of: node -> its leaf switch or block; members: leaf -> its nodes (file order);
    parents: switch -> the switches it lists (Switches=); duplicates: (node, leaf it kept, leaf
    it was listed under again)."""

    __slots__ = ("path", "leaf_of", "members", "parents", "duplicates", "kind")

    def __init__(self, path: str) -> None:
        self.path = path
        self.leaf_of: Dict[str, str] = {}
        self.members: Dict[str, List[str]] = {}
        self.parents: Dict[str, List[str]] = {}
        self.duplicates: List[Tuple[str, str, str]] = []
        self.kind = "tree"

    def __repr__(self) -> str:
        return "Topology(%r, %d leaves, %d nodes)" % (
            self.path,
            len(self.members),
            len(self.leaf_of),
        )


def parse(
    path: str, text: Optional[str] = None, read: Optional[conffile.Reader] = None
) -> Topology:
    """The topology of `path` (or of `text`, given as that file's content). ParseError naming the
    file and line for a line that is not a switch or block, a switch without a name, or a hostlist
    that does not expand."""
    topology = Topology(path)
    for line in conffile.read_conf(path, read, text):
        if line.leftover:
            raise ParseError(
                line.where, line.text, "Key=Value words (left over: %r)" % line.leftover
            )
        key = line.first_key()
        if not key:
            continue
        if key not in KNOWN_KEYS:
            raise ParseError(
                line.where, line.text, "a SwitchName= or BlockName= line, not %s=" % key
            )
        fields = line.fields()
        for other in fields:
            if other != key and other not in KNOWN_KEYS[key]:
                raise ParseError(
                    line.where,
                    line.text,
                    "only %s in a %s line, not %s="
                    % (", ".join(k + "=" for k in KNOWN_KEYS[key]) or "nothing", key, other),
                )
        if key == "blocksizes":
            continue
        name = fields[key].strip()
        if not name:
            raise ParseError(line.where, line.text, "a name after %s=" % key)
        if key == "blockname":
            topology.kind = "block"
        if "switches" in fields:
            topology.parents[name] = expand_hostlist(fields["switches"], line.where)
        if "nodes" in fields:
            nodes = expand_hostlist(fields["nodes"], line.where)
            members = topology.members.setdefault(name, [])
            for node in nodes:
                kept = topology.leaf_of.setdefault(node, name)
                if kept != name:
                    topology.duplicates.append((node, kept, name))
                else:
                    members.append(node)
        elif "switches" not in fields:
            topology.members.setdefault(name, [])
    return topology


def load(path: str) -> Topology:
    """parse() on a file of this host (include files relative to its directory, as slurmctld does).
    ParseError/HostError naming the file when it is missing or unreadable."""

    def read(name: str, max_bytes: int) -> Optional[bytes]:
        try:
            with open(name, "rb") as handle:
                return handle.read(max_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(name, "unreadable: %s" % (exc.strerror or exc)) from None

    text = conffile.read_top(path, read)
    if text is None:
        raise HostError(
            path, 'no such file ([fleet] topology_conf: Slurm\'s topology.conf, or "" for none)'
        )
    return parse(path, text, read)
