"""Rules of the test suite itself, read from its source (ast).

- A test module never imports another test module or conftest: what several modules share lives in a
  module of its own (tests/helpers.py, tests/doubles/, tests/slurm_rig.py, tests/prolog_rig.py,
  tests/fault_table.py, tests/slurmcluster.py, tests/fakenode/), and fixtures live in conftest.py.
- One way to import those: `from tests.<module> import ...` (never `import slurmcluster`, which would load a
  second copy of a module next to `tests.slurmcluster`, with its own module-level state).
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, List, Tuple

from tests.source_tree import parsed, python_files

TESTS = os.path.dirname(os.path.abspath(__file__))


def _python_files() -> Iterator[str]:
    return python_files(TESTS)


def _local_names() -> set:
    """What sits directly in tests/ and could be imported by its bare name: modules and packages."""
    names = {name[:-3] for name in os.listdir(TESTS) if name.endswith(".py")}
    names |= {
        name
        for name in os.listdir(TESTS)
        if os.path.isdir(os.path.join(TESTS, name)) and name.isidentifier()
    }
    return names


def _imports(path: str) -> List[Tuple[int, str]]:
    found = []
    for node in parsed(path).of_type(ast.Import, ast.ImportFrom):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.lineno, node.module)] + [
                (node.lineno, "%s.%s" % (node.module, a.name)) for a in node.names
            ]
    return found


def test_test_modules_do_not_import_each_other_or_conftest():
    found = []
    for path in _python_files():
        for line, name in _imports(path):
            leaf = name.split(".")[-1] if name.startswith("tests.") else name.split(".")[0]
            if leaf.startswith("test_") or leaf == "conftest":
                found.append("%s:%d imports %s" % (os.path.relpath(path, TESTS), line, name))
    assert not found, (
        "move what is shared to tests/helpers.py, tests/doubles/ or conftest: " + "; ".join(found)
    )


def test_helpers_are_imported_as_tests_modules():
    local = _local_names() - {"conftest"}
    assert {"helpers", "slurmcluster", "doubles", "fakenode"} <= local  # read the right directory
    found = [
        "%s:%d %s" % (os.path.relpath(path, TESTS), line, name)
        for path in _python_files()
        for line, name in _imports(path)
        if name.split(".")[0] in local
    ]
    assert not found, "import these as `from tests.<module> import ...`: " + "; ".join(found)
