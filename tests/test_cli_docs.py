"""docs/cli.md stays true: its sample outputs are what the verbs print (regenerated here, compared without
numbers and column padding), and its exit-code table names every ExitCode member."""

from __future__ import annotations

import pytest

from slurm_hooks.result import ExitCode
from tests import cli_samples


@pytest.fixture(scope="module")
def doc():
    with open(cli_samples.DOC, encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize("name", sorted(cli_samples.SAMPLES))
def test_sample_output_has_the_structure_the_verb_prints(doc, name):
    shown = cli_samples.read_block(doc, name)
    fresh = cli_samples.SAMPLES[name]()
    assert shown.strip(), (
        "docs/cli.md: empty %s sample: run python tools/update_cli_samples.py" % name
    )
    assert cli_samples.structure(shown) == cli_samples.structure(fresh), (
        "docs/cli.md's %s sample is stale: run python tools/update_cli_samples.py" % name
    )


def test_the_exit_code_table_names_every_code(doc):
    table = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    for member in ExitCode.__members__.values():
        assert str(int(member)) in rows, "docs/cli.md has no row for exit code %d" % member
    for name in ExitCode.__members__:
        assert "`%s`" % name in table, "docs/cli.md's exit-code table does not name %s" % name


def test_the_readme_points_to_the_table():
    from tests.helpers import REPO

    with open("%s/README.md" % REPO, encoding="utf-8") as handle:
        assert "docs/cli.md" in handle.read()
