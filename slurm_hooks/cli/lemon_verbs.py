"""`slurm-hooks report --lemons`: the nodes Slurm shows drained by us as lemons, held for RMA.

From one `scontrol show node` listing (the reasons are the record: a lemon's drain reason says so
and asks for RMA, slurm/lemon.py), so it works from any host with a Slurm client, whatever became
of a node's local state.
"""

from __future__ import annotations

import json
import sys

from ..result import ExitCode


def cmd_lemons(args) -> int:
    from ..slurm.drainer import make_client
    from ..slurm.errors import SlurmError
    from ..slurm.lemon import is_lemon
    from .check_verbs import load

    _registry, config = load(args)
    prefix = config.get("drain", "reason_prefix")
    try:
        nodes = make_client(config.settings).list_nodes()
    except SlurmError as exc:
        print("slurm-hooks report --lemons: cannot list the nodes: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    lemons = [
        {"node": n.name, "state": n.state_string, "since_utc": n.reason_time, "reason": n.reason}
        for n in nodes
        if n.is_drained and is_lemon(n.reason, prefix)
    ]
    if args.json:
        json.dump({"schema": "slurm-hooks.lemons/1", "nodes": lemons}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not lemons:
        sys.stdout.write("no node is held as a lemon (%d nodes listed)\n" % len(nodes))
    else:
        sys.stdout.write(
            "lemons held for RMA (never resumed automatically; `slurm-hooks resume`):\n"
        )
        for row in lemons:
            sys.stdout.write(
                "  %-20s %-20s %s\n" % (row["node"], row["since_utc"] or "?", row["reason"])
            )
    return ExitCode.FOUND if lemons else ExitCode.OK
