"""The repository's Python source, parsed (ast) once per test process and shared by the tests that read it.

test_vocabulary, test_suite_rules and test_import_cycles each read every module of the package or
of tests/ and walk its tree several times. Each parsing the files and calling ast.walk again cost
~6 s of CPU in one process (3 modules, 17 tests; ~1,360 parses in a fast-tier run with 4 workers).
Here a file is parsed once, and its nodes are listed once in ast.walk's order, by type too.

A file is read again when its size or modification time changes (a test that writes a module, or
an edit between runs of a long-lived process). The trees are shared: a test must not change them.
"""

from __future__ import annotations

import ast
import gc
import os
from typing import Dict, Iterator, List, Tuple, Type, TypeVar

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "slurm_hooks")
TESTS = os.path.join(REPO, "tests")

NodeType = TypeVar("NodeType", bound=ast.AST)


class ParsedFile:
    """One file's tree, every node of it in source order (depth first), and those nodes grouped by
    their exact type."""

    __slots__ = ("path", "tree", "nodes", "_by_type")

    def __init__(self, path: str, tree: ast.AST):
        self.path = path
        self.tree = tree
        self.nodes: Tuple[ast.AST, ...] = tuple(_preorder(tree))
        by_type: Dict[type, List[ast.AST]] = {}
        for node in self.nodes:
            by_type.setdefault(type(node), []).append(node)
        self._by_type = by_type

    def of_type(self, *types: Type[NodeType]) -> List[NodeType]:
        """The nodes of these exact types (ast node classes are not subclassed), in source order."""
        if len(types) == 1:
            return list(self._by_type.get(types[0], ()))  # type: ignore[arg-type]
        wanted = set(types)
        return [node for node in self.nodes if type(node) in wanted]  # type: ignore[misc]


def _preorder(tree: ast.AST) -> List[ast.AST]:
    """Every node under `tree`, itself first, depth first in field order: the nodes ast.walk gives
    (a test compares the two), in source order, at half its cost (no generator per node)."""
    found: List[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        children: List[ast.AST] = []
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                children.append(value)
            elif isinstance(value, list):
                children.extend(item for item in value if isinstance(item, ast.AST))
        stack.extend(reversed(children))
    return found


_parsed: Dict[str, Tuple[Tuple[int, int], ParsedFile]] = {}


def parsed(path: str) -> ParsedFile:
    """`path` parsed, from this process's cache unless its size or mtime changed since."""
    status = os.stat(path)
    stamp = (status.st_size, status.st_mtime_ns)
    cached = _parsed.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    # A tree holds no reference cycles, yet its thousands of nodes made the cyclic collector run
    # (and traverse the whole heap) again and again while it was built: parsing tests/ cost 0.62 s
    # with the collector on, 0.23 s without. The cached trees live as long as the process, so they
    # are frozen (gc.freeze) too: later full collections, and pytest's at exit, skip them.
    enabled = gc.isenabled()
    gc.disable()
    try:
        entry = ParsedFile(path, ast.parse(source, path))
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    _parsed[path] = (stamp, entry)
    return entry


def python_files(top: str) -> Iterator[str]:
    """Every .py file under `top`, directories and files in sorted order, without __pycache__ or
    hidden directories."""
    for directory, subdirs, files in os.walk(top):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def package_files() -> List[ParsedFile]:
    """Every module of slurm_hooks/, parsed."""
    return [parsed(path) for path in python_files(PACKAGE)]
