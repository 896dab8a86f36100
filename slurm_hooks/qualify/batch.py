"""Several nodes through Slurm: `qualify --node HOSTLIST`. The hostlist is expanded by the
project's own bounded expansion; the nodes are qualified one after another (through_slurm.
qualify_node, each with its own etiquette); the run exits by its worst node."""

from __future__ import annotations

import signal
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..slurm.client import SlurmClient
from .through_slurm import Interrupted, _on_signal, qualify_node


def expand_nodes(text: str) -> List[str]:
    """`--node`'s hostlist ('gpu[01-04,07]', 'a,b') as node names, in order, once each: the
    project's own expansion (slurm/gres.py, at most MAX_HOSTLIST_NAMES names, no Slurm call), each
    name a plain node name. ValueError naming the text otherwise."""
    from ..hw.host import HostError
    from ..slurm.client import check_node_name
    from ..slurm.gres import expand_hostlist

    try:
        names = expand_hostlist(text or "", "--node")
    except HostError as exc:
        raise ValueError(str(exc)) from None
    if not names:
        raise ValueError("--node %r names no node" % (text,))
    return [check_node_name(name) for name in dict.fromkeys(names)]


def check_work_dir(path: str) -> None:
    """The job's script (run as us: root) and its output (read back as the verdict) live in the
    work dir, so a user who can write there, or rename a directory above it, could swap the script
    or forge a pass: ValueError naming the directory at fault unless core/dir_trust.py trusts it."""
    from ..core.dir_trust import untrusted_because

    why = untrusted_because(path)
    if why:
        raise ValueError("work dir %s: %s, or another --work-dir" % (path, why))


def qualify_nodes(
    client: SlurmClient,
    nodes: Sequence[str],
    level: str,
    settings: Mapping[str, Mapping[str, Any]],
    command: List[str],
    work_dir: str,
    env: Optional[Dict[str, str]] = None,
) -> List[Dict[str, Any]]:
    """Qualify the nodes one after another (each in its own reservation, so the others stay drained
    meanwhile and a slow node holds only itself); each node's etiquette is its own (qualify_node).
    An interruption ends the run: the node in progress is put back (its finally), the nodes not
    yet started are listed as such, untouched."""
    previous = (
        {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    outcomes: List[Dict[str, Any]] = []
    try:
        for node in nodes:
            outcomes.append(qualify_node(client, node, level, settings, command, work_dir, env))
            if outcomes[-1].get("reason", "").startswith("interrupted by"):
                break
    except Interrupted:  # between two nodes: nothing is held
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    why = outcomes[-1].get("reason", "") if outcomes else "interrupted"
    for node in nodes[len(outcomes) :]:
        outcomes.append(
            {
                "node": node,
                "level": level,
                "verdict": "not qualified",
                "reason": "not started (%s)" % why,
                "slurm_calls": 0,
            }
        )
    return outcomes


def exit_code(done: Mapping[str, Any]) -> int:
    """0 pass, 1 refused (etiquette: untouched), 2 fail, 3 not qualified; a hostlist exits by the
    worst (the highest)."""
    from ..result import ExitCode

    if str(done.get("reason", "")).startswith("refused"):
        return ExitCode.REFUSED
    return {"pass": ExitCode.OK, "fail": ExitCode.FAIL}.get(done["verdict"], ExitCode.UNKNOWN)
