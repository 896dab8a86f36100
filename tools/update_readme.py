#!/usr/bin/env python3
"""Regenerate README.md's configuration reference from the registry (tests/test_docs.py checks it)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from slurm_hooks.core.config import render_reference  # noqa: E402
from slurm_hooks.registry import load_builtin_checks  # noqa: E402

START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def updated(text: str) -> str:
    head, rest = text.split(START, 1)
    _old, tail = rest.split(END, 1)
    return head + START + render_reference(load_builtin_checks()) + END + tail


if __name__ == "__main__":
    os.environ["SLURM_HOOKS_CHECKS_DIR"] = (
        ""  # this machine's own site checks never reach the README
    )
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(path) as handle:
        text = handle.read()
    new = updated(text)
    if new != text:
        with open(path, "w") as handle:
            handle.write(new)
        print("README.md: configuration reference updated")
