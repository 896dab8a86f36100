"""The package's import graph, read statically from the source (ast): no cycles, and the library never
imports the command line (slurm_hooks.cli).

Every import statement counts, wherever it is (module level or inside a function: a lazy import is
still a dependency), except those under `if TYPE_CHECKING:`, which never run. So does
`importlib.import_module("slurm_hooks.…")` with a literal name (registry.py loads the site checks
that way). The check modules that registry.BUILTIN_CHECK_MODULES names are discovered, not imported
by name, and are not edges: a check module imports the registry to register itself.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Optional, Set

import pytest

from tests.source_tree import ParsedFile, parsed

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "slurm_hooks"


def package_modules(root: str = REPO) -> Dict[str, str]:
    """Dotted module name -> file, for every .py file of the package (a package is its __init__)."""
    modules = {}
    for directory, subdirs, files in os.walk(os.path.join(root, PACKAGE)):
        subdirs[:] = sorted(d for d in subdirs if d.isidentifier() and d != "_vendor")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                modules[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = (
                    path
                )
    return modules


def _runtime_nodes(source: ParsedFile) -> Iterator[ast.AST]:
    """The statements that can import (import, from-import, calls), except those inside the body of
    an `if TYPE_CHECKING:` (typing only, never executed); its else branch runs and counts."""
    typing_only = {
        id(inner)
        for block in source.of_type(ast.If)
        if _is_type_checking(block.test)
        for statement in block.body
        for inner in ast.walk(statement)
    }
    for node in source.of_type(ast.Import, ast.ImportFrom, ast.Call):
        if id(node) not in typing_only:
            yield node


def _is_type_checking(test: ast.AST) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: str, modules: Dict[str, str]) -> Set[str]:
    """The package modules that `module` imports (the deepest existing module each statement names)."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    found: Set[str] = set()

    def add(name: Optional[str]) -> None:
        while name and name not in modules:  # `from x.y import function` depends on x.y
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    for node in _runtime_nodes(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = base + ("." + node.module if node.module else "")
            else:
                target = node.module or ""
            if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                submodule = target + "." + alias.name
                add(submodule if submodule in modules else target)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith(PACKAGE + ".")
        ):
            add(node.args[0].value)
    return found


def import_graph(root: str = REPO) -> Dict[str, Set[str]]:
    modules = package_modules(root)
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(start: str) -> None:  # iterative: no recursion limit on a deep graph
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert (
        len(graph) > 50 and "slurm_hooks.hooks" in graph
    )  # it read the package, not an empty tree
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(component) for component in found)


def test_the_library_never_imports_the_command_line():
    """cli/ parses arguments and renders; the hooks, checks and records must work without it."""
    graph = import_graph()
    offenders = {
        module: sorted(
            t for t in targets if t == "slurm_hooks.cli" or t.startswith("slurm_hooks.cli.")
        )
        for module, targets in graph.items()
        if not module.startswith("slurm_hooks.cli") and module != "slurm_hooks.__main__"
    }
    assert not {m: t for m, t in offenders.items() if t}


def _write(root, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    "files, expected",
    [
        # a lazy import inside a function is a dependency too
        (
            {"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"},
            [["slurm_hooks.a", "slurm_hooks.b"]],
        ),
        # importlib.import_module with a literal name (how registry.py reached plugins.py)
        (
            {
                "a.py": "import importlib\nimportlib.import_module('slurm_hooks.b')\n",
                "b.py": "from .a import x\n",
            },
            [["slurm_hooks.a", "slurm_hooks.b"]],
        ),
        # three modules, across subpackages, with `..` relative imports
        (
            {
                "x/__init__.py": "",
                "x/a.py": "from ..y.b import f\n",
                "y/__init__.py": "",
                "y/b.py": "from ..c import g\n",
                "c.py": "from slurm_hooks.x import a\n",
            },
            [["slurm_hooks.c", "slurm_hooks.x.a", "slurm_hooks.y.b"]],
        ),
        # typing-only imports never run
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n",
                "b.py": "from .a import x\n",
            },
            [],
        ),
        # a chain is not a cycle
        ({"a.py": "from .b import x\n", "b.py": "from .c import y\n", "c.py": "import os\n"}, []),
    ],
)
def test_the_cycle_finder_finds_what_it_must(tmp_path, files, expected):
    """The finder itself can fail: known cycles of each kind are found, acyclic graphs pass."""
    _write(tmp_path, "slurm_hooks/__init__.py", "")
    for name, text in files.items():
        _write(tmp_path, "slurm_hooks/" + name, text)
    assert cycles(import_graph(str(tmp_path))) == expected
