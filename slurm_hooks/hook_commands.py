"""CLI verbs for slurmd's hooks (prolog, epilog, health) and for admins (drain, resume, status)."""
from __future__ import annotations

import json
import os
import sys


def add_parsers(sub) -> None:
    for context, text in (("prolog", "run the prolog checks for the job in slurmd's environment"),
                          ("epilog", "run the epilog checks after the job"),
                          ("health", "passive checks for HealthCheckProgram; resumes nodes we drained once healthy")):
        hook = sub.add_parser(context, help=text)
        hook.add_argument("--root", metavar="DIR", help="read /sys, /proc, /dev under DIR")
        hook.add_argument("--node", metavar="NAME", help="node name when SLURMD_NODENAME is not set")
        hook.set_defaults(handler=cmd_hook, context=context)
    drain = sub.add_parser("drain", help="drain this node (or --node) with a slurm-hooks reason")
    drain.add_argument("--reason", required=True, help="why (prefixed with the configured reason prefix)")
    drain.add_argument("--node", metavar="NAME")
    drain.add_argument("--force", action="store_true", help="replace a drain reason that is not ours")
    drain.set_defaults(handler=cmd_drain)
    resume = sub.add_parser("resume", help="resume this node (or --node) if slurm-hooks drained it")
    resume.add_argument("--node", metavar="NAME")
    resume.add_argument("--force", action="store_true", help="also resume a drain that is not ours")
    resume.set_defaults(handler=cmd_resume)
    status = sub.add_parser("status", help="Slurm state and reason of this node, whether we drained it, breaker")
    status.add_argument("--node", metavar="NAME")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)


def cmd_hook(args) -> int:
    from .hooks import main_hook

    return main_hook(args.context, args.config, os.environ, args.node, args.root)


def _setup(args):
    from .commands import load
    from .drainer import make_client
    from .hooks import node_name
    from .jobenv import job_from_env

    _registry, config = load(args)
    return config, make_client(config.settings), node_name(job_from_env(os.environ, require_job=False), args.node)


def cmd_drain(args) -> int:
    from . import policy
    from .slurm import SlurmError

    config, client, name = _setup(args)
    prefix = config.get("drain", "reason_prefix")
    reason = policy.sanitize("%s manual: %s" % (prefix.strip(), args.reason))[: config.get("drain", "max_reason_length")]
    try:
        node = client.show_node(name)
        if node.is_drained and not policy.is_ours(node.reason, prefix) and not args.force:
            print("%s is already drained by someone else (%s); use --force to replace" % (name, node.reason))
            return 1
        client.drain(name, reason)
    except SlurmError as exc:
        print("slurm-hooks drain: %s" % exc, file=sys.stderr)
        return 3
    print("drained %s: %s" % (name, reason))
    return 0


def cmd_resume(args) -> int:
    from .drainer import Outcome, resume

    config, client, name = _setup(args)
    enacted = resume(client, name, config.settings, force=args.force, by_admin=True)
    print(enacted.message)
    return 0 if enacted.outcome in (Outcome.RESUMED, Outcome.NOT_DRAINED) else 1


def cmd_status(args) -> int:
    from . import policy
    from .hooks import load_state
    from .logs import setup
    from .slurm import SlurmError

    config, client, name = _setup(args)
    prefix = config.get("drain", "reason_prefix")
    breaker = config.settings["breaker"]
    info = {"node": name, "mode": config.get("general", "mode"),
            "local_state": load_state(config, setup(config.settings, stderr=True))}
    try:
        node = client.show_node(name)
        nodes = client.list_nodes()
        state = policy.breaker_state(((n.name, n.is_drained, n.reason) for n in nodes), name, prefix,
                                     breaker["max_percent"], breaker["min_nodes"])
        info.update(state=node.state_string, reason=node.reason, drained_by_us=node.is_drained and policy.is_ours(
            node.reason, prefix), breaker={"drained_by_us": state.drained_by_us, "nodes": state.total_nodes,
                                           "limit": state.limit, "tripped": state.tripped})
    except SlurmError as exc:
        info["error"] = str(exc)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print("%-14s %s" % (key + ":", value if not isinstance(value, dict) else json.dumps(value)))
    return 3 if "error" in info else 0
