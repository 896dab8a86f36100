"""One vocabulary: exit codes, drain outcomes and statuses are compared as the enums that define them.

A drain outcome or status spelled again as a string ("already-drained-by-us", "OK") in a comparison
goes stale silently when the enum's value is renamed: an exit code or a drain changes and no test
notices. These tests read the package's source (ast) and fail on such a spelling.
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, List, Tuple

from slurm_hooks.result import Action, Blame, ExitCode, Status
from slurm_hooks.slurm.policy import DELIVERED, NEW_DRAINS, UNDELIVERED, Outcome
from tests.source_tree import ParsedFile, package_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "slurm_hooks")
OUTCOME_VALUES = {outcome.value for outcome in Outcome}
STATUS_VALUES = {status.value for status in Status}
WORDS_OF_OTHERS = {
    "drained",
    "observe",
}  # also a state-file key and a [general] mode: not only outcomes


def _sources() -> Iterator[Tuple[str, ParsedFile]]:
    """(path relative to the repository, the parsed module) for every module of the package: parsed
    once per test process and shared with the other tests that read the source (tests/source_tree.py)."""
    return ((os.path.relpath(source.path, REPO), source) for source in package_files())


def _strings(node: ast.AST) -> List[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def _enum_value_of(node: ast.AST, attribute: str) -> bool:
    """`<anything>.<attribute>.value`, e.g. enacted.outcome.value."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "value"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == attribute
    )


def _comparisons() -> Iterator[Tuple[str, int, List[ast.AST]]]:
    for path, source in _sources():
        for node in source.of_type(ast.Compare):
            yield path, node.lineno, [node.left] + list(node.comparators)


def test_drain_outcomes_are_compared_as_the_enum():
    found = []
    for path, line, operands in _comparisons():
        spelled = [
            s
            for operand in operands
            for s in _strings(operand)
            if s in OUTCOME_VALUES - WORDS_OF_OTHERS
        ]
        if spelled or any(_enum_value_of(operand, "outcome") for operand in operands):
            found.append("%s:%d %s" % (path, line, spelled or ".outcome.value"))
    assert not found, "compare drainer outcomes as policy.Outcome members: " + ", ".join(found)


def test_statuses_are_compared_as_the_enum():
    found = [
        "%s:%d" % (path, line)
        for path, line, operands in _comparisons()
        if any(_enum_value_of(operand, "status") for operand in operands)
    ]
    assert not found, "compare Status members, not their strings: " + ", ".join(found)


def test_no_module_declares_exit_codes_of_its_own():
    """Exit codes come from result.ExitCode: no EXIT_* constant elsewhere (isolation's child code
    is internal to the forked check process and never leaves slurm-hooks), and no bare number in
    a return, sys.exit, os._exit or SystemExit of the command line and the hooks."""
    found = []
    for path, source in _sources():
        for node in source.of_type(ast.Assign, ast.Return, ast.Call):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                names += [
                    e.id
                    for t in node.targets
                    if isinstance(t, ast.Tuple)
                    for e in t.elts
                    if isinstance(e, ast.Name)
                ]
                found += [
                    "%s:%d %s" % (path, node.lineno, n)
                    for n in names
                    if n.startswith("EXIT_") and n != "EXIT_CHILD_ERROR"
                ]
            if not (
                path.startswith(os.path.join("slurm_hooks", "cli"))
                or path.startswith(os.path.join("slurm_hooks", "hooks"))
            ):
                continue
            value = None
            if isinstance(node, ast.Return):
                value = node.value
            elif (
                isinstance(node, ast.Call)
                and node.args
                and (
                    getattr(node.func, "attr", None) in ("exit", "_exit")
                    or getattr(node.func, "id", None) == "SystemExit"
                )
            ):
                value = node.args[0]
            if isinstance(value, ast.Constant) and type(value.value) is int:
                found.append("%s:%d exit code %d" % (path, node.lineno, value.value))
    assert not found, "use slurm_hooks.result.ExitCode: " + ", ".join(found)


def test_exit_codes_are_nagios_codes_and_the_hooks_own():
    assert [int(ExitCode.OK), int(ExitCode.WARN), int(ExitCode.FAIL), int(ExitCode.UNKNOWN)] == [
        0,
        1,
        2,
        3,
    ]
    assert (
        ExitCode.NODE_BROKEN == 10
    )  # prolog.d/epilog.d test for 10 (packaging and prolog.d scripts)
    assert ExitCode.REFUSED is ExitCode.WARN
    assert {status: status.exit_code for status in Status} == {
        Status.OK: ExitCode.OK,
        Status.SKIP: ExitCode.OK,
        Status.WARN: ExitCode.WARN,
        Status.FAIL: ExitCode.FAIL,
        Status.UNKNOWN: ExitCode.UNKNOWN,
    }
    with open(os.path.join(REPO, "prolog.d", "50-slurm-hooks")) as handle:
        assert '"$rc" -eq %d ] && exit 1' % ExitCode.NODE_BROKEN in handle.read()


def test_outcome_groups_are_disjoint_where_they_must_be():
    assert NEW_DRAINS < DELIVERED
    assert not DELIVERED & UNDELIVERED
    assert (
        Outcome.ALREADY_OURS in DELIVERED - NEW_DRAINS
    )  # a drain seen again is ours, not a new one


def test_xid_overrides_accept_exactly_the_result_vocabulary():
    from slurm_hooks.xid import catalog

    assert set(catalog.STATUSES) == STATUS_VALUES - {Status.SKIP.value}
    assert set(catalog.ACTIONS) == {action.value for action in Action}
    assert set(catalog.BLAMES) == {blame.value for blame in Blame}


def test_contexts_are_spelled_once():
    """registry.CONTEXTS and the groups derived from it are not spelled again (a check may still name
    its own subset, e.g. prolog and manual): a context added or renamed there reaches --context,
    `list`, the reference, the hooks and every check that runs "wherever checks run by default"."""
    from slurm_hooks.registry import CONTEXTS, DEFAULT_CONTEXTS, HOOK_CONTEXTS, JOB_CONTEXTS

    groups = [set(CONTEXTS), set(HOOK_CONTEXTS), set(JOB_CONTEXTS), set(DEFAULT_CONTEXTS)]
    found = []
    for path, source in _sources():
        for node in source.of_type(ast.Tuple, ast.List, ast.Set):
            if set(_strings(node)) in groups:
                if not (
                    path == os.path.join("slurm_hooks", "registry.py")
                    and node.lineno == _line_of_contexts()
                ):
                    found.append("%s:%d" % (path, node.lineno))
    assert not found, (
        "use registry.CONTEXTS / HOOK_CONTEXTS / JOB_CONTEXTS / DEFAULT_CONTEXTS: "
        + ", ".join(found)
    )
    assert HOOK_CONTEXTS == ("prolog", "epilog", "health") and JOB_CONTEXTS == ("prolog", "epilog")
    assert DEFAULT_CONTEXTS == {"prolog", "health", "manual"}


def _line_of_contexts() -> int:
    with open(os.path.join(PACKAGE, "registry.py"), encoding="utf-8") as handle:
        return next(
            number for number, line in enumerate(handle, 1) if line.startswith("CONTEXTS = (")
        )


def _setting_lookups() -> Iterator[Tuple[str, int, str, str]]:
    """(path, line, section, key) of every literal lookup of a setting: config.get("drain", "timeout"),
    settings["drain"]["timeout"], drain["timeout"] after drain = settings["drain"] is not followed."""
    for path, source in _sources():
        for node in source.of_type(ast.Call, ast.Subscript, ast.Attribute):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and len(node.args) == 2
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("config", "cfg")
            ):
                yield path, node.lineno, node.args[0].value, node.args[1].value
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.value, (ast.Name, ast.Attribute))
                and getattr(node.value.value, "id", getattr(node.value.value, "attr", None))
                == "settings"
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.value.slice, ast.Constant)
            ):
                yield path, node.lineno, node.value.slice.value, node.slice.value
            elif (  # the typed form (core/sections.py): config.settings.drain.timeout
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and getattr(node.value.value, "id", getattr(node.value.value, "attr", None))
                == "settings"
                and not hasattr(dict, node.value.attr)  # settings.items().__len__ and the like
            ):
                yield path, node.lineno, node.value.attr, node.attr


def test_every_setting_the_code_reads_is_declared():
    """A typo'd section or key in config.get("section", "key"), settings["section"]["key"] or
    config.settings.section.key fails here, not in a hook at run time (a KeyError or AttributeError
    there fails the hook open on every node)."""
    from slurm_hooks.core.config import SECTIONS

    lookups = list(_setting_lookups())
    assert len(lookups) > 50  # found the lookups (55 config.get and 37 settings[...] when written)
    unknown = [
        "%s:%d [%s] %s" % (path, line, section, key)
        for path, line, section, key in lookups
        if key not in SECTIONS.get(section, {})
    ]
    assert not unknown, "not declared in core/config.py SECTIONS: " + ", ".join(unknown)
