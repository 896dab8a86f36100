#!/usr/bin/env python3
"""Regenerate slurm_hooks/check_index.py: which built-in module registers each check and gatherer.

    .venv/bin/python tools/update_check_index.py          # rewrite it
    .venv/bin/python tools/update_check_index.py --check  # exit 1 if it is stale (tests/test_check_index.py)

The index lets `slurm-hooks check NAME...` import only the modules it needs (issue #26); it is
derived from the registry itself, so a check added, moved or renamed only needs this run.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Dict, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, "slurm_hooks", "check_index.py")

HEADER = '''"""Which built-in module registers each check and each gatherer: generated, do not edit.

Regenerate with `tools/update_check_index.py` (tests/test_check_index.py fails when it is stale).
`slurm-hooks check NAME...` imports only the modules holding the checks it runs, the checks the
configuration names, and the gatherers they ask for (registry.load_checks_for): `check system`
need not import NVML's bindings, the Xid catalog or the Slurm parsers (issue #26). CHECK_CONTEXTS
(comma-separated) lets the prolog and the epilog import only the modules of their own checks.
"""

'''


def build() -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    sys.path.insert(0, REPO)
    registry = importlib.import_module("slurm_hooks.registry")
    checks: Dict[str, str] = {}
    gatherers: Dict[str, str] = {}
    contexts: Dict[str, str] = {}
    for module in registry.BUILTIN_CHECK_MODULES:
        importlib.import_module(module)
    for name, spec in registry.REGISTRY.checks.items():
        checks[name] = spec.func.__module__
        contexts[name] = ",".join(c for c in registry.CONTEXTS if c in spec.contexts)
    for name, spec in registry.REGISTRY.gatherers.items():
        gatherers[name] = spec.func.__module__
    return checks, gatherers, contexts


def render(checks: Dict[str, str], gatherers: Dict[str, str], contexts: Dict[str, str]) -> str:
    def table(name: str, values: Dict[str, str]) -> str:
        rows = "".join('    "%s": "%s",\n' % (key, values[key]) for key in sorted(values))
        return "%s = {\n%s}\n" % (name, rows)

    return (
        HEADER
        + table("CHECK_MODULES", checks)
        + "\n"
        + table("GATHERER_MODULES", gatherers)
        + "\n"
        + table("CHECK_CONTEXTS", contexts)
    )


def main() -> int:
    text = render(*build())
    if "--check" in sys.argv[1:]:
        with open(TARGET) as handle:
            if handle.read() != text:
                print("%s is stale: run tools/update_check_index.py" % TARGET, file=sys.stderr)
                return 1
        return 0
    with open(TARGET, "w") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
