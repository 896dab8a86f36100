"""Helpers shared by the test modules, imported as `from tests.helpers import ...` (the one way: test
modules never import each other or conftest; test doubles live in tests/doubles/, the real Slurm in
tests/slurmcluster.py, the end-to-end rig in tests/slurm_rig.py, the fault table in tests/fault_table.py).
"""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_BDF = {
    0: "0000:18:00.0",
    1: "0000:1a:00.0",
    2: "0000:42:00.0",
    3: "0000:44:00.0",
    4: "0000:9a:00.0",
    5: "0000:9c:00.0",
    6: "0000:c4:00.0",
    7: "0000:c6:00.0",
}  # the DGX-H100 fake node's GPUs, NVML index -> bus id
BOOT_ID = "8c4f5a7e-1111-2222-3333-444455556666"  # the boot id the gpu_node fixture writes


def component(index: int) -> str:
    """How the GPU checks name GPU `index` of the DGX-H100 fake node in a Result's component."""
    return "gpu:%d %s" % (index, GPU_BDF[index])


def abort_on_purpose() -> None:
    """Kill this (forked check) process with SIGABRT, as an NVML call that aborts does, without the
    "Fatal Python error: Aborted" thread dump pytest's faulthandler would print into the CI log: every
    test that crashes a process on purpose goes through here (test_hooks checks that none calls
    os.abort() itself)."""
    import faulthandler

    faulthandler.disable()
    os.abort()


def default_settings(**sections):
    """Every setting at its default (core/config.py SECTIONS), except [general] mode = "enforce":
    a fresh install only observes (the shipped default, slurm-hooks mode), and a test that expects a
    drain says enforce. `sections` update single keys: default_settings(drain={"timeout": 20.0})."""
    from slurm_hooks.core.config import SECTIONS

    values = {
        section: {k: s.default for k, s in schema.items()} for section, schema in SECTIONS.items()
    }
    values["general"]["mode"] = "enforce"
    for section, overrides in sections.items():
        values[section].update(overrides)
    return values


def enforcing(data):
    """Config data (as validate() takes it) with [general] mode = "enforce" unless it sets a mode."""
    data = dict(data)
    data["general"] = dict(data.get("general", {}))
    data["general"].setdefault("mode", "enforce")
    return data


def fake_node_config(config=None):
    """`config` plus [general] root_live_sources = ["nvml"]: under a root other than / NVML is refused
    unless asked for, and a fake node's NVML is the fake library (`--live nvml` on the command line)."""
    data = dict(config or {})
    general = dict(data.get("general", {}))
    general.setdefault("root_live_sources", ["nvml"])
    data["general"] = general
    return data


def run_on_node(registry, node, names, config=None, job=None, context="manual"):
    """Results of the named checks (or families) on a fake node, in-process, as `slurm-hooks check --live nvml` runs
    them (the fake node's NVML is the fake library this process loaded)."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.runner import run_checks, select_checks
    from slurm_hooks.hw.host import Host

    report = run_checks(
        registry,
        validate(registry, fake_node_config(config)),
        Host(str(node.root)),
        context,
        select_checks(registry, context, names),
        job=job,
    )
    return report.results()


def private_directory(path: str) -> str:
    """path, made 0700 if missing, when it is a directory of this user's that nobody else can write
    (what is kept there is run or written into test trees as is: test bytecode, fake-node images);
    "" when what is there is not that (another user's, a symlink, group- or world-writable)."""
    import stat

    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return ""
    info = os.lstat(path)
    mine = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    return path if mine and not info.st_mode & 0o022 else ""


def release_fake_nvml() -> None:
    """End this process's NVML session on a fake library and unload it (pynvml's own state too),
    so the next test starts with no NVML at all (tests/conftest.py, tests/inprocess_cli.py)."""
    import pynvml

    from slurm_hooks.hw import nvml
    from tests.fakenode import fakenvml

    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()


def cli_with_default_config(args, env=None, child=False):
    """`slurm-hooks ARGS` with the built-in defaults (an empty config file), whatever
    /etc/slurm-hooks holds on this machine (tests/test_capture*.py): in this process
    (tests/inprocess_cli.py), or with child=True as `python -m slurm_hooks`."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as empty:
        full = dict(
            os.environ if env is None else env,
            SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1",
            SLURM_HOOKS_CONFIG=empty.name,
        )
        if not child:
            from tests.inprocess_cli import cli_in_process

            return cli_in_process(list(args), env=full)
        from tests.inprocess_cli import cli_in_child

        return cli_in_child(list(args), env=full, timeout=300)


def runs_by_name(report):
    """A `check --json` report's check runs, by check name."""
    return {run["name"]: run for run in report["checks"]}


# -- the text exposition format (version 0.0.4), checked line by line ---------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(
    r"^(%s)(\{%s(,%s)*\})? (-?[0-9.]+(?:e[+-]?[0-9]+)?|NaN|\+Inf|-Inf)$" % (_NAME, _PAIR, _PAIR)
)


def assert_exposition(text):
    """`text` is valid Prometheus text exposition (version 0.0.4), line by line: every line a HELP,
    a TYPE or a sample of the family just declared; no family twice; no series twice; a final
    newline (node_exporter's textfile collector refuses a file otherwise); and prometheus_client's
    parser (lenient) takes it."""
    from prometheus_client.parser import text_string_to_metric_families

    assert text.endswith("\n")
    families, current, series = set(), None, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split(" ")[2]
            assert re.fullmatch(_NAME, current) and current not in families, line
            families.add(current)
        elif line.startswith("# TYPE "):
            assert line.split(" ")[2:] in ([current, "gauge"], [current, "counter"]), line
        else:
            match = _SAMPLE.match(line)
            assert match and match.group(1) == current, line
            assert line.rsplit(" ", 1)[0] not in series, line
            series.add(line.rsplit(" ", 1)[0])
    list(text_string_to_metric_families(text))  # and the reference parser takes it


# The start of a script run in a fresh interpreter (`python -c SCRIPT BASE`): one passing prolog
# check, a config under BASE, a job's environment; the test appends what it runs and prints.
# Fresh, because the test reads which modules a hook loads, and pytest has loaded them all.
DEMO_PROLOG_SCRIPT = """
import json, os, sys
from slurm_hooks.core.config import validate
from slurm_hooks.hooks import run_hook
from slurm_hooks.registry import Registry
from slurm_hooks.result import Result, Status

reg = Registry()

@reg.check(name="demo.ok", contexts=("prolog",), timeout=2)
def demo(params):
    '''demo'''
    return Result("demo.ok", Status.OK, "fine")

base = sys.argv[1]
config = validate(reg, {"general": {"mode": "enforce"}, "paths": {"state_dir": base + "/state",
    "log_file": base + "/hooks.log", "syslog": False}, "records": {"dir": base + "/jobs"}})
env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1"}
"""
