"""tests/source_tree.py: the shared parse of the repository's source gives the nodes ast.walk gives,
and a file changed on disk is read again (the rules tests would otherwise judge an old tree)."""

from __future__ import annotations

import ast
import os

from tests.source_tree import PACKAGE, TESTS, parsed, python_files


def test_the_nodes_are_those_ast_walk_finds_in_source_order():
    # compared as lists of ids: ast.Load and ast.Store are shared objects, met many times by both
    # the package's first 40 files and tests/' first 20, parsed alone (not the whole package first)
    paths = list(python_files(PACKAGE))[:40] + list(python_files(TESTS))[:20]
    for source in map(parsed, paths):
        walked = list(ast.walk(source.tree))
        assert sorted(map(id, source.nodes)) == sorted(map(id, walked)), source.path
        lines = [n.lineno for n in source.of_type(ast.FunctionDef, ast.ClassDef)]
        assert lines == sorted(lines), source.path  # top to bottom, as a reader meets them


def test_of_type_is_the_nodes_of_exactly_those_types():
    source = parsed(os.path.join(PACKAGE, "registry.py"))
    assert source.of_type(ast.Call) == [n for n in source.nodes if type(n) is ast.Call]
    both = source.of_type(ast.Import, ast.ImportFrom)
    assert both == [n for n in source.nodes if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert both and any(isinstance(n, ast.Import) for n in both)


def test_a_file_changed_on_disk_is_parsed_again(tmp_path):
    path = tmp_path / "module.py"
    path.write_text("import os\n")
    first = parsed(str(path))
    assert parsed(str(path)) is first  # unchanged: the shared parse
    path.write_text("import os, sys\nimport json\n")
    os.utime(path, ns=(1, 1))  # a changed size, and a time that differs even on a coarse clock
    again = parsed(str(path))
    assert again is not first
    assert [alias.name for n in again.of_type(ast.Import) for alias in n.names] == [
        "os",
        "sys",
        "json",
    ]
