"""The README documents every check and parameter (generated from the registry) and its commands are real."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import update_readme  # noqa: E402


def readme() -> str:
    with open(os.path.join(REPO, "README.md")) as handle:
        return handle.read()


def test_config_reference_matches_registry(registry):
    text = readme()
    assert update_readme.updated(text) == text, (
        "README config reference is stale: run python tools/update_readme.py"
    )
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
    out = subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    for verb in ("check", "list", "config"):
        assert verb in out


def test_reliability_figures_agree_between_readme_and_docs():
    """docs/reliability.md's summary and the README's reliability table carry the same figures for every
    claim they share (the soak test's run time is measured per machine and may differ)."""

    def rows(text):
        table = {}
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and len(cells) == 3 and cells[2].startswith("`tests/"):
                table[cells[0]] = cells[1]
        return table

    with open(os.path.join(REPO, "docs", "reliability.md")) as handle:
        docs = rows(handle.read())
    ours = rows(readme())
    shared = set(docs) & set(ours)
    assert {
        "A hung NVML call or blocked sysfs read costs the hung check's own timeout, not the deadline",
        "A file system that never answers cannot hold a hook",
        "One hung GPU costs that GPU only",
    } <= shared
    for claim in sorted(shared - {"No false positives"}):
        assert docs[claim] == ours[claim], claim
