"""CLI verbs for slurmd's hooks (prolog, epilog, health) and for admins (drain, resume, status)."""

from __future__ import annotations

import json
import os
import sys

from ..result import ExitCode


def add_parsers(sub) -> None:
    for context, text in (
        ("prolog", "run the prolog checks for the job in slurmd's environment"),
        ("epilog", "run the epilog checks after the job"),
        ("health", "passive checks for HealthCheckProgram; resumes nodes we drained once healthy"),
    ):
        hook = sub.add_parser(context, help=text)
        hook.add_argument("--root", metavar="DIR", help="read /sys, /proc, /dev under DIR")
        hook.add_argument(
            "--node", metavar="NAME", help="node name when SLURMD_NODENAME is not set"
        )
        hook.set_defaults(handler=cmd_hook, context=context)
    nodes_help = "node name or Slurm hostlist (gpu[01-04],login1); default: this node"
    drain = sub.add_parser(
        "drain",
        help="drain this node (or --node) with a slurm-hooks reason; never resumed automatically",
    )
    drain.add_argument(
        "--reason", required=True, help="why (becomes '<reason_prefix> manual: REASON')"
    )
    drain.add_argument("--node", metavar="NODES", help=nodes_help)
    drain.add_argument(
        "--force", action="store_true", help="replace a drain reason that is not ours"
    )
    drain.set_defaults(handler=cmd_drain)
    resume = sub.add_parser("resume", help="resume this node (or --node) if slurm-hooks drained it")
    resume.add_argument("--node", metavar="NODES", help=nodes_help)
    resume.add_argument("--force", action="store_true", help="also resume a drain that is not ours")
    resume.set_defaults(handler=cmd_resume)
    status = sub.add_parser(
        "status", help="Slurm state and reason of this node, whether we drained it, breaker"
    )
    status.add_argument("--node", metavar="NODES", help=nodes_help)
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)


def cmd_hook(args) -> int:
    from ..hooks import main_hook

    return main_hook(args.context, args.config, os.environ, args.node, args.root)


def _setup(args):
    """(config, client, node names). --node takes a hostlist ('gpu[01-04]', 'a,b'), expanded the way
    Slurm does (scontrol show hostnames); a bad one is a usage error (exit 3), said plainly."""
    from ..hooks import node_name
    from ..slurm.client import expand_hostlist
    from ..slurm.drainer import make_client
    from ..slurm.errors import SlurmError
    from ..slurm.jobenv import job_from_env
    from .check_verbs import load

    _registry, config = load(args)
    client = make_client(config.settings)
    if not args.node:
        return config, client, [node_name(job_from_env(os.environ, require_job=False), None)]
    try:
        return (
            config,
            client,
            expand_hostlist(args.node, bin_dir=config.get("drain", "slurm_bin_dir")),
        )
    except (ValueError, SlurmError) as exc:
        print("slurm-hooks %s: --node %s: %s" % (args.command, args.node, exc), file=sys.stderr)
        raise SystemExit(ExitCode.UNKNOWN) from None


def _exit_code(enacted) -> int:
    from ..slurm.drainer import Outcome

    if enacted.outcome in (Outcome.DRAINED, Outcome.RESUMED, Outcome.NOT_DRAINED):
        return ExitCode.OK
    if enacted.outcome in (Outcome.SLURM_UNAVAILABLE, Outcome.SLURM_ERROR):
        return ExitCode.UNKNOWN
    return ExitCode.REFUSED


def cmd_drain(args) -> int:
    """Through drainer.drain_manual: etiquette and skip states as for every drain; no breaker."""
    from ..slurm.drainer import drain_manual

    config, client, names = _setup(args)
    codes = []
    for name in names:
        enacted = drain_manual(client, name, args.reason, config.settings, force=args.force)
        codes.append(_exit_code(enacted))
        print(enacted.message, file=sys.stdout if codes[-1] == 0 else sys.stderr)
    return max(codes)


def cmd_resume(args) -> int:
    from ..slurm.drainer import resume

    config, client, names = _setup(args)
    codes = []
    for name in names:
        enacted = resume(client, name, config.settings, force=args.force, by_admin=True)
        codes.append(_exit_code(enacted))
        print(enacted.message, file=sys.stdout if codes[-1] == 0 else sys.stderr)
    return max(codes)


def cmd_status(args) -> int:
    from ..core.logs import setup
    from ..hooks import read_state
    from ..slurm import policy
    from ..slurm.drainer import node_status
    from ..slurm.errors import SlurmError

    config, client, names = _setup(args)
    this_node = _setup_local_name()
    local_state = read_state(config, setup(config.settings, stderr=True))
    prefix = config.get("drain", "reason_prefix")
    breaker = config.settings["breaker"]
    out = {
        "mode": config.get("general", "mode"),
        "local_state": local_state[0] if local_state[1] else None,
        "nodes": [
            node_status(client, name, config, name == this_node, local_state) for name in names
        ],
    }
    try:
        nodes = client.list_nodes()
        state = policy.breaker_state(
            ((n.name, n.is_drained, n.reason) for n in nodes),
            "",
            prefix,
            breaker["max_percent"],
            breaker["min_nodes"],
        )
        manual = sum(
            1
            for n in nodes
            if n.is_drained and policy.read_reason(n.reason, prefix).kind == "manual"
        )
        out["breaker"] = {
            "drained_by_us": state.drained_by_us,
            "manual_drains": manual,
            "nodes": state.total_nodes,
            "limit": state.limit,
            "tripped": state.tripped,
        }
    except SlurmError as exc:
        out["breaker"] = {"error": str(exc)}
    if len(names) == 1:  # the single-node layout admins and scripts already read
        out = dict(out, **out.pop("nodes")[0])
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            if key == "nodes":
                for entry in value:
                    print("%-14s %s" % ("node:", json.dumps(entry)))
                continue
            print(
                "%-14s %s"
                % (key + ":", value if not isinstance(value, dict) else json.dumps(value))
            )
    failed = (
        "error" in out
        or any("error" in n for n in out.get("nodes", []))
        or "error" in out["breaker"]
    )
    return ExitCode.UNKNOWN if failed else ExitCode.OK


def _setup_local_name() -> str:
    from ..hooks import node_name
    from ..slurm.jobenv import job_from_env

    return node_name(job_from_env(os.environ, require_job=False), None)
