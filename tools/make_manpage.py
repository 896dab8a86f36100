#!/usr/bin/env python3
"""Write the slurm-hooks(1) man page from the CLI's own argparse parsers and the check registry.

Run at package build time (packaging/slurm-hooks.spec), so the page always matches the code it is
shipped with: every verb, option and help string comes from cli.build_parser(), every setting from
config.SECTIONS, every check and parameter from the registry, paths from the modules' constants.

    python tools/make_manpage.py -o slurm-hooks.1 && man -l slurm-hooks.1

The date in the header is $SOURCE_DATE_EPOCH's (reproducible builds), else left empty.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Iterator, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ["SLURM_HOOKS_CHECKS_DIR"] = ""  # never the build host's own site checks
from slurm_hooks import __version__  # noqa: E402
from slurm_hooks.cli.main import build_parser  # noqa: E402
from slurm_hooks.core import config as config_module  # noqa: E402
from slurm_hooks.core import config_files, plugins  # noqa: E402
from slurm_hooks.registry import CONTEXTS, Registry, load_builtin_checks  # noqa: E402

DESCRIPTION = (
    "slurm-hooks checks NVIDIA GPU nodes for Slurm. slurmd runs it as the job prolog and epilog "
    "(through /etc/slurm/prolog.d/50-slurm-hooks and /etc/slurm/epilog.d/50-slurm-hooks) and as "
    "HealthCheckProgram; administrators run the checks by hand, explain errors, and drain or resume "
    "nodes. A node-broken failure drains the node with a reason that starts with the configured "
    "prefix; failures of slurm-hooks itself never drain anything (the hooks then exit 0 and log)."
)

EXIT_STATUS = (
    ("0", "OK (or every check skipped)"),
    (
        "1",
        "WARN: works, but degraded or suspicious; drain/resume refused; report found nodes to look at",
    ),
    ("2", "FAIL: broken"),
    ("3", "UNKNOWN: could not evaluate; also usage and configuration errors"),
    ("10", "the hooks only: the node carries DRAIN, the job must not run (prolog.d makes it 1)"),
)


def roff(text: str) -> str:
    """Escape text for a roff line: backslashes, hyphens (so options copy and paste), leading dots."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def paragraphs(text: str) -> List[str]:
    """Blank-line separated paragraphs, each re-joined into one line for roff to fill."""
    return [" ".join(block.split()) for block in text.strip().split("\n\n") if block.strip()]


def subcommands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[Tuple[str, str, argparse.ArgumentParser]]:
    """(full command, one-line help, parser) for every verb, depth first in definition order."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            yield "%s %s" % (prefix, name), helps.get(name, ""), sub
            yield from subcommands(sub, "%s %s" % (prefix, name))


def option_items(parser: argparse.ArgumentParser) -> Iterator[Tuple[str, str]]:
    """(invocation like '--root DIR', expanded help) for each argument except -h and sub-commands."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if (
            isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            or action.help == argparse.SUPPRESS
        ):
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        yield formatter._format_action_invocation(action), help_text


def usage(parser: argparse.ArgumentParser) -> str:
    text = " ".join(parser.format_usage().split())
    return text[len("usage: ") :] if text.startswith("usage: ") else text


def options_block(parser: argparse.ArgumentParser) -> List[str]:
    lines = []
    for invocation, help_text in option_items(parser):
        lines += [".TP", "\\fB%s\\fR" % roff(invocation), roff(help_text) if help_text else "\\&"]
    return lines


def commands_section(parser: argparse.ArgumentParser) -> List[str]:
    lines = [".SH COMMANDS"]
    for command, summary, sub in subcommands(parser, parser.prog):
        lines += [".SS %s" % roff(command[len(parser.prog) + 1 :]), ".B %s" % roff(usage(sub))]
        texts = paragraphs(sub.description) if sub.description else ([summary] if summary else [])
        for text in texts:
            lines += [".PP", roff(text)]
        lines += options_block(sub)
    return lines


def configuration_section(registry: Registry) -> List[str]:
    lines = [
        ".SH CONFIGURATION",
        roff(
            "%s, then conf.d/*.toml beside it in name order, later files overriding earlier ones key by key. "
            "The settings and their defaults:" % config_files.DEFAULT_CONFIG
        ),
    ]
    for section, schema in config_module.SECTIONS.items():
        lines.append(".SS [%s]" % section)
        for key, setting in schema.items():
            default = config_module._toml_value(setting.default)
            lines += [".TP", "\\fB%s\\fR = %s" % (roff(key), roff(default)), roff(setting.help)]
    lines += [
        ".SH CHECKS",
        roff(
            'Each check has a table [checks."NAME"] with enabled = true|false and the '
            "parameters below (`slurm-hooks config reference` prints them as Markdown)."
        ),
    ]
    for spec in registry.sorted_checks():
        contexts = ", ".join(c for c in CONTEXTS if c in spec.contexts)
        lines += [
            ".SS %s" % roff(spec.name),
            roff("%s Contexts: %s; timeout %gs." % (spec.description, contexts, spec.timeout)),
        ]
        for param in spec.params:
            default = config_module._toml_value(param.default)
            lines += [
                ".TP",
                "\\fB%s\\fR = %s" % (roff(param.name), roff(default)),
                roff(param.help),
            ]
    return lines


def files_and_environment() -> List[str]:
    paths = config_module.SECTIONS["paths"]
    files = [
        (config_files.DEFAULT_CONFIG, "main configuration file"),
        (
            os.path.join(os.path.dirname(config_files.DEFAULT_CONFIG), "conf.d/*.toml"),
            "drop-in configuration",
        ),
        (
            os.path.join(plugins.SITE_CHECKS_DIR, "*.py"),
            "site-specific checks, loaded after the built-in ones",
        ),
        (paths["state_dir"].default, "local state: drains we made, drains not yet delivered"),
        (paths["log_file"].default, "decision log (also syslog: journalctl -t slurm-hooks)"),
        (
            "/etc/slurm/prolog.d/50-slurm-hooks, /etc/slurm/epilog.d/50-slurm-hooks",
            "the hooks slurmd runs",
        ),
    ]
    environment = [
        (
            config_files.CONFIG_ENV,
            "configuration file to read instead of %s" % config_files.DEFAULT_CONFIG,
        ),
        (
            config_files.INSECURE_OVERRIDE_ENV,
            "=1 accepts configuration and site check files not owned by root "
            "(tests and development only)",
        ),
        (
            plugins.CHECKS_DIR_ENV,
            "site check directory instead of %s; empty loads none" % plugins.SITE_CHECKS_DIR,
        ),
    ]
    lines = [".SH FILES"]
    for path, text in files:
        lines += [".TP", "\\fI%s\\fR" % roff(path), roff(text)]
    lines.append(".SH ENVIRONMENT")
    for name, text in environment:
        lines += [".TP", "\\fB%s\\fR" % roff(name), roff(text)]
    return lines


def render(registry: Registry, date: str = "") -> str:
    parser = build_parser()
    lines = [
        '.TH SLURM\\-HOOKS 1 "%s" "slurm\\-hooks %s" "slurm-hooks manual"'
        % (date, roff(__version__)),
        ".SH NAME",
        "slurm\\-hooks \\- %s" % roff(parser.description or ""),
        ".SH SYNOPSIS",
        ".B %s" % roff(usage(parser)),
        ".SH DESCRIPTION",
        roff(DESCRIPTION),
        ".SH OPTIONS",
    ]
    lines += options_block(parser)
    lines += commands_section(parser)
    lines.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        lines += [".TP", "\\fB%s\\fR" % code, roff(meaning)]
    lines += configuration_section(registry)
    lines += files_and_environment()
    lines += [
        ".SH SEE ALSO",
        "\\fBslurm.conf\\fR(5), \\fBscontrol\\fR(1), \\fBnvidia\\-smi\\fR(1), "
        "/usr/share/doc/slurm\\-hooks/admin.md",
    ]
    return "\n".join(lines) + "\n"


def build_date() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return time.strftime("%Y-%m-%d", time.gmtime(int(epoch))) if epoch.isdigit() else ""


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-o", "--output", default="-", help="file to write (default: standard output)"
    )
    args = parser.parse_args(argv)
    page = render(load_builtin_checks(), build_date())
    if args.output == "-":
        sys.stdout.write(page)
    else:
        with open(args.output, "w") as handle:
            handle.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
