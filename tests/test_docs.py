"""The README documents every check and parameter (generated from the registry) and its commands are real."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import update_readme  # noqa: E402


def readme() -> str:
    with open(os.path.join(REPO, "README.md")) as handle:
        return handle.read()


def test_config_reference_matches_registry(registry):
    text = readme()
    assert update_readme.updated(text) == text, "README config reference is stale: run python tools/update_readme.py"
    for spec in registry.checks.values():
        assert '[checks."%s"]' % spec.name in text
        for param in spec.params:
            assert "| `%s` |" % param.name in text


def test_readme_names_exactly_two_setup_commands_and_ci_runs_the_test_one():
    text = readme()
    commands = re.findall(r"<!-- (install|test)-command -->\n```sh\n(.+?)\n```", text)
    assert [kind for kind, _ in commands] == ["install", "test"]
    with open(os.path.join(REPO, ".ci", "run")) as handle:
        ci = handle.read()
    assert "test-command" in ci  # .ci/run extracts and runs the README's test command


def test_cli_help_lists_every_verb():
    out = subprocess.run([sys.executable, "-m", "slurm_hooks", "--help"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    for verb in ("check", "list", "config"):
        assert verb in out
