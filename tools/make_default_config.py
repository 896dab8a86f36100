#!/usr/bin/env python3
"""Write packaging/config.toml, the packaged /etc/slurm-hooks/config.toml, from the registry.

Every setting and check parameter appears commented out at its built-in default, with its help
text, so the file documents the defaults without pinning them: a node whose config.toml was never
edited follows new defaults on upgrade. The settings are taken from render_toml() of the default
configuration (the same text `slurm-hooks config check` prints), so the file cannot drift from the
code: tests/test_packaging.py fails when it is stale, and checks that uncommenting every setting
gives exactly the built-in defaults.

Section headers are commented out too: a header left active for a check that a later version
removes would make the kept (noreplace) file invalid after an upgrade.

    python tools/make_default_config.py            # rewrite packaging/config.toml
    python tools/make_default_config.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ["SLURM_HOOKS_CHECKS_DIR"] = ""  # never the build host's own site checks
from slurm_hooks.core.config import SECTIONS, render_toml, validate  # noqa: E402
from slurm_hooks.registry import CONTEXTS, Registry, load_builtin_checks  # noqa: E402

TARGET = os.path.join(REPO, "packaging", "config.toml")
WIDTH = 100

HEADER = """\
# /etc/slurm-hooks/config.toml: slurm-hooks configuration.
#
# Every setting is listed below, commented out at its built-in default (this file is generated
# from the code by tools/make_default_config.py). Prefer putting site settings in
# /etc/slurm-hooks/conf.d/*.toml (read after this file in name order, overriding key by key):
# then this file stays unedited and package upgrades replace it without leaving a .rpmnew.
# To change a setting here, uncomment its [section] line and the key.
#
# `slurm-hooks config check` validates the files and prints the effective configuration;
# `slurm-hooks config reference` and `man slurm-hooks` describe every key. The files and this
# directory must be owned by root and not group/world-writable, or slurm-hooks refuses them.
#
# A fresh install drains nothing: [general] mode is "observe" by default, and the hooks only log
# what they would drain (`slurm-hooks report --observed` lists it). When that list is what you
# expect, switch with `slurm-hooks mode enforce` (it writes conf.d/99-mode.toml; `slurm-hooks mode`
# shows the mode in effect and the file it comes from). See the admin guide's roll-out.
"""

CHECKS_BANNER = """\

# ---------------------------------------------------------------------------------------------
# Checks: one table per check, named as in `slurm-hooks list`. `enabled = false` turns a check
# off; the other keys are its parameters.
# ---------------------------------------------------------------------------------------------
"""

_SECTION = re.compile(r'^\[(?:checks\."(?P<check>[^"]+)"|(?P<section>[a-z_]+))\]$')


def _comment(text: str) -> List[str]:
    return ["# " + line for line in textwrap.wrap(text, WIDTH - 2, break_on_hyphens=False)]


def _help(registry: Registry, section: Optional[str], check: Optional[str], key: str) -> str:
    if section is not None:
        setting = SECTIONS[section][key]
        if setting.choices:
            return "%s (one of: %s)" % (setting.help, ", ".join(str(c) for c in setting.choices))
        return setting.help
    spec = registry.checks[check]
    if key == "enabled":
        return "run this check"
    return spec.param(key).help


def render_default_config(registry: Registry) -> str:
    """The commented default configuration for `registry` (see the module docstring)."""
    lines = HEADER.rstrip("\n").split("\n")
    section: Optional[str] = None
    check: Optional[str] = None
    for line in render_toml(validate(registry, {})).split("\n"):
        if not line or line.startswith("# effective configuration"):
            continue
        match = _SECTION.match(line)
        if match:
            section, check = match.group("section"), match.group("check")
            if check is not None and not any(out.startswith("#[checks.") for out in lines):
                lines.extend(CHECKS_BANNER.rstrip("\n").split("\n"))
            lines.append("")
            lines.append("#" + line)
            if check is not None:
                spec = registry.checks[check]
                contexts = ", ".join(c for c in CONTEXTS if c in spec.contexts)
                lines.extend(_comment("%s Contexts: %s." % (spec.description, contexts)))
            continue
        key = line.split(" = ", 1)[0]
        lines.extend(_comment(_help(registry, section, check, key)))
        lines.append("#" + line)
    return "\n".join(lines) + "\n"


def uncomment(text: str) -> str:
    """Activate every commented setting and header (lines starting with '#' but not '# ')."""
    out = []
    for line in text.split("\n"):
        is_setting = line.startswith("#") and line[1:2] not in ("", " ")
        out.append(line[1:] if is_setting else line)
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if %s is stale" % TARGET
    )
    parser.add_argument(
        "-o", "--output", default=TARGET, help="where to write (default %(default)s)"
    )
    args = parser.parse_args(argv)
    text = render_default_config(load_builtin_checks())
    current = None
    if os.path.exists(args.output):
        with open(args.output) as handle:
            current = handle.read()
    if args.check:
        if current != text:
            print(
                "%s is stale: run python tools/make_default_config.py" % args.output,
                file=sys.stderr,
            )
            return 1
        return 0
    if current != text:
        with open(args.output, "w") as handle:
            handle.write(text)
        print("%s: written" % args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
