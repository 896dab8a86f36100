"""`slurm-hooks check NAME...` imports only what it runs (issue #26), and judges and validates as a full load does.

slurm_hooks/check_index.py says which module registers each check and gatherer; a stale index would
make a partial load miss a check, so it is compared with the registry itself here.
Each behaviour test runs a fresh interpreter: the registry is process-wide and fills as modules load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, text: str = "") -> str:
    path = tmp_path / "config.toml"
    path.write_text(
        '[general]\nmode = "observe"\n\n[paths]\nstate_dir = "%s"\nlog_file = "%s"\nsyslog = false\n\n%s'
        % (tmp_path / "state", tmp_path / "log", text)
    )
    return str(path)


def _slurm_hooks(config: str, code: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        SLURM_HOOKS_CONFIG=config,
        SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1",
        SLURM_HOOKS_CHECKS_DIR="",  # no site checks
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


RUN = (
    "import json, sys\n"
    "from slurm_hooks.cli import check_verbs\n"
    "from slurm_hooks.cli.main import main\n"
    "check_verbs.finish = lambda code: code  # no os._exit for a check thread still winding down\n"
    "code = main(%r)\n"
    "sys.stdout.flush()\n"
    "loaded = sorted(m for m in sys.modules if m.startswith('slurm_hooks.checks.') or m in ('ctypes', 'slurm_hooks.xid.catalog'))\n"
    "sys.stderr.write('\\nMODULES ' + json.dumps({'code': code, 'loaded': loaded}))\n"
)


def _run(config: str, argv) -> dict:
    done = _slurm_hooks(config, RUN % (list(argv),))
    assert "MODULES " in done.stderr, done.stderr[-2000:]
    err, _, tail = done.stderr.rpartition("\nMODULES ")
    result = json.loads(tail)
    result["stdout"], result["stderr"] = done.stdout, err
    return result


def test_the_index_matches_the_registry():
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "update_check_index.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_check_system_imports_only_the_system_checks(tmp_path):
    """`check system` ran every check module's import (NVML's ctypes bindings, the Xid catalog...)."""
    result = _run(_config(tmp_path), ["check", "system", "--json"])
    assert result["loaded"] == ["slurm_hooks.checks.system"], result
    names = sorted(c["name"] for c in json.loads(result["stdout"])["checks"])
    assert names == [
        "system.cpu",
        "system.filesystems",
        "system.kernel",
        "system.load",
        "system.memory",
        "system.processes",
        "system.swap",
    ]


def test_a_partial_load_judges_as_a_full_one(tmp_path):
    """numa's checks need gatherers of the gpu and pci modules: they load when asked for."""
    config = _config(tmp_path)
    partial = _run(config, ["check", "numa", "xid.events", "--json"])
    full = _run(config, ["check", "--all-contexts", "--json"])
    assert "slurm_hooks.checks.host.bmc" not in partial["loaded"]
    assert "slurm_hooks.checks.host.bmc" in full["loaded"]

    def statuses(result):
        checks = json.loads(result["stdout"])["checks"]
        return {c["name"]: (c["status"], [r["summary"] for r in c["results"]]) for c in checks}

    wanted = statuses(partial)
    assert set(wanted) >= {"numa.sysctl", "xid.events"}
    everything = statuses(full)
    for name, (status, summary) in wanted.items():
        assert everything[name] == (status, summary), name


def test_a_partial_load_still_validates_every_table_of_the_config(tmp_path):
    """A check the run does not select is still validated when the configuration names it."""
    bad_value = _run(
        _config(tmp_path, '[checks."gpu.count"]\nexpected = -3\n'), ["check", "system"]
    )
    assert bad_value["code"] == 3 and "gpu.count" in bad_value["stderr"], bad_value
    typo = _run(_config(tmp_path, '[checks."gpu.cuont"]\nexpected = 8\n'), ["check", "system"])
    assert typo["code"] == 3 and "no such check" in typo["stderr"], typo
    fine = _run(_config(tmp_path, '[checks."gpu.count"]\nexpected = 8\n'), ["check", "system"])
    assert fine["code"] in (0, 1), fine  # OK, or WARN where this machine is loaded
    assert "slurm_hooks.checks.gpu.inventory" in fine["loaded"]


HOOK = (
    "import json, sys\n"
    "from types import SimpleNamespace\n"
    "import importlib\n"
    "fail_open = importlib.import_module('slurm_hooks.hooks.fail_open')\n"
    "seen = {}\n"
    "def run_hook(context, registry, config, env, node=None):\n"
    "    seen['checks'] = [s.name for s in registry.for_context(context)]\n"
    "    seen['modules'] = sorted(m for m in sys.modules if m.startswith('slurm_hooks.checks.'))\n"
    "    return SimpleNamespace(exit_code=0)\n"
    "fail_open.run_hook = run_hook\n"
    "assert fail_open.main_hook(%r, None, {}) == 0\n"
    "from slurm_hooks.registry import load_builtin_checks\n"
    "seen['full'] = [s.name for s in load_builtin_checks().for_context(%r)]\n"
    "sys.stderr.write('\\nSEEN ' + json.dumps(seen))\n"
)


def _hook_load(tmp_path, context: str) -> dict:
    done = _slurm_hooks(_config(tmp_path), HOOK % (context, context))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stderr.rsplit("\nSEEN ", 1)[1])


def test_a_prolog_and_an_epilog_import_only_their_own_checks_and_miss_none(tmp_path):
    """The job hooks import the modules of their context's checks (check_index.CHECK_CONTEXTS): not the
    health-only BMC, MCE and NVMe checks (~2 ms of every job's start), and every check a full load
    would run in that context still runs. The health mode loads all: it re-runs remembered checks."""
    for context in ("prolog", "epilog"):
        seen = _hook_load(tmp_path, context)
        assert seen["checks"] == seen["full"] and len(seen["checks"]) > 10, (context, seen)
        assert "slurm_hooks.checks.host.bmc" not in seen["modules"], (context, seen["modules"])
    health = _hook_load(tmp_path, "health")
    assert "slurm_hooks.checks.host.bmc" in health["modules"]
    assert health["checks"] == health["full"]
