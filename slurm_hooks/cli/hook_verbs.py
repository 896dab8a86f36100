"""CLI verbs for slurmd's hooks (prolog, epilog, health) and for admins (drain, resume, status)."""

from __future__ import annotations

import json
import os
import sys

from ..core.lazyre import lazy_compile
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
    drain.add_argument("--json", action="store_true", help="print JSON (schema %s)" % DRAIN_SCHEMA)
    drain.set_defaults(handler=cmd_drain)
    resume = sub.add_parser("resume", help="resume this node (or --node) if slurm-hooks drained it")
    resume.add_argument("--node", metavar="NODES", help=nodes_help)
    resume.add_argument("--force", action="store_true", help="also resume a drain that is not ours")
    resume.add_argument(
        "--json", action="store_true", help="print JSON (schema %s)" % RESUME_SCHEMA
    )
    resume.set_defaults(handler=cmd_resume)
    status = sub.add_parser(
        "status", help="Slurm state and reason of this node, whether we drained it, breaker"
    )
    status.add_argument("--node", metavar="NODES", help=nodes_help)
    status.add_argument(
        "--json", action="store_true", help="print JSON (schema %s)" % STATUS_SCHEMA
    )
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
    _refuse_missing_slurm_conf(args.command)
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


def _refuse_missing_slurm_conf(command: str) -> None:
    """A SLURM_CONF that names no readable file is a usage error (exit 3) said at once: scontrol
    would retry reading it for 60 s, then fail with "Unable to process configuration file"."""
    conf = os.environ.get("SLURM_CONF")
    if not conf or (os.path.isfile(conf) and os.access(conf, os.R_OK)):
        return
    why = (
        "no such file"
        if not os.path.exists(conf)
        else "not a file"
        if not os.path.isfile(conf)
        else "permission denied (run as root)"
    )
    print("slurm-hooks %s: SLURM_CONF=%s: %s" % (command, conf, why), file=sys.stderr)
    raise SystemExit(ExitCode.UNKNOWN)


def _exit_code(enacted) -> int:
    from ..slurm.drainer import Outcome

    if enacted.outcome in (Outcome.DRAINED, Outcome.RESUMED, Outcome.NOT_DRAINED):
        return ExitCode.OK
    if enacted.outcome in (Outcome.SLURM_UNAVAILABLE, Outcome.SLURM_ERROR):
        return ExitCode.UNKNOWN
    return ExitCode.REFUSED


DRAIN_SCHEMA = "slurm-hooks.drain/1"
RESUME_SCHEMA = "slurm-hooks.resume/1"


def cmd_drain(args) -> int:
    """Through drainer.drain_manual: etiquette and skip states as for every drain; no breaker."""
    from ..slurm.drainer import drain_manual

    config, client, names = _setup(args)
    return _enact(
        args,
        DRAIN_SCHEMA,
        names,
        lambda name: drain_manual(client, name, args.reason, config.settings, force=args.force),
    )


def cmd_resume(args) -> int:
    from ..slurm.drainer import resume

    config, client, names = _setup(args)
    return _enact(
        args,
        RESUME_SCHEMA,
        names,
        lambda name: resume(client, name, config.settings, force=args.force, by_admin=True),
    )


def _enact(args, schema: str, names, act) -> int:
    """Drain or resume each node; the worst exit code wins. --json: one document with every node's
    outcome (slurm.policy.Outcome values), message and exit code."""
    codes, nodes = [], []
    for name in names:
        enacted = act(name)
        codes.append(_exit_code(enacted))
        nodes.append(
            {
                "node": name,
                "outcome": enacted.outcome.value,
                "message": slurm_cause(enacted.message),
                "exit_code": int(codes[-1]),
            }
        )
        if not args.json:
            print(nodes[-1]["message"], file=sys.stdout if codes[-1] == 0 else sys.stderr)
    code = max(codes)
    if args.json:
        print(json.dumps({"schema": schema, "exit_code": int(code), "nodes": nodes}, indent=2))
    return code


def cmd_status(args) -> int:
    from ..core.logs import setup
    from ..hooks import read_state
    from ..slurm import policy
    from ..slurm.drainer import node_status
    from ..slurm.errors import SlurmError

    config, client, names = _setup(args)
    this_node = _setup_local_name()
    denied = _state_denied(config)
    local_state = ({}, False) if denied else read_state(config, setup(config.settings, stderr=True))
    prefix = config.get("drain", "reason_prefix")
    breaker = config.settings["breaker"]
    out = {
        "mode": config.get("general", "mode"),
        "local_state": (
            local_state[0] if local_state[1] or not denied and _state_absent(config) else None
        ),
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
            breaker["max_nodes"],
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
        out["breaker"] = {"error": slurm_cause(str(exc))}
    for entry in out["nodes"]:
        if "error" in entry:
            entry["error"] = slurm_cause(entry["error"])
        if denied and "local_record" in entry:
            entry["local_record"] = "unknown: " + denied
    if denied:
        out["local_state_error"] = denied
    if args.json:
        print(json.dumps(dict({"schema": STATUS_SCHEMA}, **out), indent=2))
    else:
        sys.stdout.write(render_status(out))
    failed = any("error" in n for n in out["nodes"]) or "error" in out["breaker"]
    return ExitCode.UNKNOWN if failed else ExitCode.OK


STATUS_SCHEMA = (
    "slurm-hooks.status/1"  # {"schema", "mode", "local_state", "nodes": [...], "breaker"}
)


def render_status(out: dict) -> str:
    """A table of the nodes (state, whose drain), each reason and local record under its node, then
    the mode, the breaker and this node's local state."""
    rows = [("NODE", "STATE", "DRAIN")]
    under = {}
    for entry in ({k: _printable(v) for k, v in e.items()} for e in out["nodes"]):
        if "error" in entry:
            rows.append((entry["node"], "?", "error: " + entry["error"]))
            continue
        rows.append((entry["node"], entry.get("state", "?"), entry.get("drain", "?")))
        notes = []
        if entry.get("reason"):
            when = ", ".join(
                str(v) for v in (entry.get("reason_time_utc"), entry.get("reason_user")) if v
            )
            notes.append("reason: %s%s" % (entry["reason"], " (%s)" % when if when else ""))
        if entry.get("local_record"):
            notes.append("local record: %s" % entry["local_record"])
        for step in entry.get("repair") or []:  # the remediation ladder (slurm/repair.py)
            notes.append("repair: %s: %s" % (step.get("rung"), step.get("result")))
        under[len(rows) - 1] = notes
    width = [max(len(str(r[i])) for r in rows) for i in range(2)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "%s  %s  %s" % (str(row[0]).ljust(width[0]), str(row[1]).ljust(width[1]), row[2])
        )
        lines.extend(" " * (width[0] + 2) + note for note in under.get(i, []))
    lines.append("")
    lines.append("mode:        %s" % out["mode"])
    lines.append("breaker:     %s" % _breaker_text(out["breaker"]))
    lines.append(
        "local state: %s"
        % (
            "unknown: " + out["local_state_error"]
            if out.get("local_state_error")
            else _local_state_text(out["local_state"])
        )
    )
    return "\n".join(lines) + "\n"


def _printable(value):
    """A reason is anyone's text (`scontrol update ... Reason=`): no line breaks or terminal escapes
    in the table."""
    if not isinstance(value, str):
        return value
    return "".join(c if c >= " " and c != "\x7f" else "?" for c in value)


def _breaker_text(breaker: dict) -> str:
    if "error" in breaker:
        return "unknown (%s)" % breaker["error"]
    return (
        "%d of %d nodes drained by slurm-hooks checks (limit %d, %s); %d drained with `slurm-hooks drain`"
        % (
            breaker["drained_by_us"],
            breaker["nodes"],
            breaker["limit"],
            "TRIPPED: no more drains" if breaker["tripped"] else "not tripped",
            breaker["manual_drains"],
        )
    )


def _local_state_text(state) -> str:
    """This node's node-state.json in words: what we drained or will drain, for which checks."""
    if state is None:
        return "unknown (the state file is missing or unreadable: see the log)"
    parts = []
    for key in sorted(state):
        value = state[key]
        if isinstance(value, dict) and ("checks" in value or "reason" in value):
            parts.append(
                "%s for %s%s"
                % (
                    key,
                    ",".join(value.get("checks") or []) or "?",
                    " (%s)" % value["reason"] if value.get("reason") else "",
                )
            )
        elif value:
            parts.append("%s: %s" % (key, json.dumps(value, sort_keys=True)))
    return "; ".join(parts) or "nothing drained or pending"


def _state_absent(config) -> bool:
    """No state file: nothing drained or pending was ever recorded here (or it was lost)."""
    from ..hooks import state_path

    return not os.path.lexists(state_path(config))


def _state_denied(config) -> str:
    """Why this user cannot read the node's state file ('' when it can, or when it is absent): the
    state directory is root's (0700), and "unknown/lost" alone would hide that."""
    from ..hooks import state_path

    path = state_path(config)
    try:
        os.stat(path)
    except PermissionError:
        return "permission denied reading %s (run this as root)" % path
    except OSError:
        return ""
    return (
        "" if os.access(path, os.R_OK) else "permission denied reading %s (run this as root)" % path
    )


# what scontrol prints when it finds no configuration: no slurm.conf and no configless DNS SRV record
# (Slurm 22.05 on a host without /etc/slurm/slurm.conf: "fetch_config: DNS SRV lookup failed",
# "_establish_config_source: failed to fetch config", "fatal: Could not establish a configuration
# source"), or a SLURM_CONF that names no file ("Unable to process configuration file")
_NO_SLURM_CONFIG = lazy_compile(
    r"Could not establish a configuration source|Unable to process configuration file"
)


def slurm_cause(text: str) -> str:
    """A Slurm error in the words of its cause where scontrol's own lines bury it."""
    if not _NO_SLURM_CONFIG.search(text or ""):
        return text
    from ..slurm.client import CONF_CANDIDATES

    return (
        "no Slurm configuration on this host: scontrol found no slurm.conf (%s) and no configless "
        "slurmctld (DNS SRV record); run this where Slurm's client is set up, or set SLURM_CONF"
        % (os.environ.get("SLURM_CONF") or ", ".join(CONF_CANDIDATES))
    )


def _setup_local_name() -> str:
    from ..hooks import node_name
    from ..slurm.jobenv import job_from_env

    return node_name(job_from_env(os.environ, require_job=False), None)
