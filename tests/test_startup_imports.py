"""What a hook's start-up loads (issue #26): the prolog's floor is the interpreter, and each module or
pattern a hook pulls in whether or not it needs it costs every job on every node.

Each test runs a fresh interpreter (sys.modules and re's cache must start empty) over this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import DEMO_PROLOG_SCRIPT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, env_extra=None) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    env.update(env_extra or {})
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loading_the_checks_and_the_config_loads_nothing_of_slurms_nor_subprocess(tmp_path):
    """The happy path talks to no Slurm and runs no tool: config validation's drain-budget warning
    must not import the Slurm client (with breaker, node_state and calendar: ~5 ms), nor the
    checks that may run a tool (nvme, ipmitool) subprocess (~3 ms) before they run one."""
    config = tmp_path / "config.toml"
    config.write_text('[general]\nmode = "observe"\n')
    os.chmod(str(config), 0o644)
    loaded = _run(
        "import json, sys\n"
        "from slurm_hooks.core.config import load_registry_and_config\n"
        "registry, config = load_registry_and_config(%r)\n"
        "import slurm_hooks.hooks\n"
        "heavy = ('subprocess', 'calendar', 'slurm_hooks.slurm.drainer', 'slurm_hooks.slurm.client',"
        " 'slurm_hooks.slurm.breaker')\n"
        "print(json.dumps({'checks': len(registry.checks), 'warnings': list(config.warnings),"
        " 'loaded': [m for m in heavy if m in sys.modules]}))" % str(config)
    )
    assert loaded["checks"] > 30  # every built-in check module was imported
    assert loaded["loaded"] == []


def test_the_drain_budget_warning_still_comes_without_the_slurm_client(tmp_path):
    """The budget moved out of drainer.py; the warning it feeds must still be given."""
    config = tmp_path / "config.toml"
    config.write_text("[drain]\ntimeout = 30.0\nattempts = 3\n")
    os.chmod(str(config), 0o644)
    loaded = _run(
        "import json, sys\n"
        "from slurm_hooks.core.config import load_registry_and_config\n"
        "registry, config = load_registry_and_config(%r)\n"
        "print(json.dumps({'warnings': list(config.warnings),"
        " 'client': 'slurm_hooks.slurm.client' in sys.modules}))" % str(config)
    )
    assert any("PrologEpilogTimeout" in w for w in loaded["warnings"]), loaded["warnings"]
    assert loaded["client"] is False


def test_importing_the_xid_modules_compiles_no_pattern_until_one_is_used():
    """xid/kmsg.py and xid/catalog.py hold ~23 patterns for every log format; a prolog reading
    /dev/kmsg needs two of them. Compiling all at import cost ~5 ms of each start-up."""
    counts = _run(
        "import json, re\n"
        "cached = lambda: len(re._cache) + len(getattr(re, '_cache2', ()))\n"
        "import slurm_hooks.core.structs, slurm_hooks.result\n"
        "before = cached()\n"
        "from slurm_hooks.xid import catalog, kmsg\n"
        "after_import = cached()\n"
        "record = kmsg.parse_kmsg_record('4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
        "name=python, GPU has fallen off the bus.')\n"
        "print(json.dumps({'import': after_import - before, 'used': cached() - after_import,"
        " 'message': record.message if record else None}))"
    )
    assert counts["import"] == 0
    assert counts["used"] >= 1  # the /dev/kmsg pattern, compiled when the line came
    assert counts["message"].startswith("NVRM: Xid (PCI:0000:3b:00): 79")


def test_every_lazy_pattern_compiles():
    """A pattern compiled on first use would fail only when its first line came (a check's
    UNKNOWN at 3 a.m.), not at import: compile every module-level one of the package here."""
    import importlib
    import pkgutil

    import slurm_hooks
    from slurm_hooks.core.lazyre import LazyPattern

    found = 0
    for info in pkgutil.walk_packages(slurm_hooks.__path__, "slurm_hooks."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, LazyPattern):
                value.compiled()
                assert value.match is not None, (info.name, name)
                found += 1
    assert found > 80  # every module-level pattern of the package is a LazyPattern


def test_the_prolog_sets_its_logger_up_while_its_check_process_runs(tmp_path):
    """`logging` (with traceback, linecache, tokenize: ~5 ms on 2 cores) is not imported before the
    check process is forked: the hook's process imports it and opens its log file meanwhile, and
    the decision line still reaches the log file."""
    code = (
        DEMO_PROLOG_SCRIPT
        + """
at_fork = []
real_fork = os.fork
def fork():
    loaded = "logging" in sys.modules
    pid = real_fork()
    if pid:
        at_fork.append(loaded)
    return pid
os.fork = fork
outcome = run_hook("prolog", reg, config, env)
print(json.dumps({"code": outcome.exit_code, "at_fork": at_fork}))
"""
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["code"] == 0
    assert out["at_fork"][:1] == [False], out  # the check process's fork: logging not yet loaded
    log = (tmp_path / "hooks.log").read_text()
    assert "context=prolog job=42" in log and "decision=pass" in log, log


def test_a_hook_runs_without_the_cyclic_garbage_collector_and_an_admin_verb_with_it():
    """A hook's process lives a fraction of a second: the collector's heap walks (~40 per prolog) are
    time the job waits for, and its few cycles go with the process. Admin verbs keep it."""
    code = (
        "import gc, json, sys\n"
        "from slurm_hooks.cli import main\n"
        "seen = []\n"
        "main.main = lambda argv: seen.append(gc.isenabled()) or 0\n"
        "main._exit_now = lambda code: (print(json.dumps(seen)), sys.stdout.flush())\n"
        "for argv in (['prolog'], ['--config', 'x.toml', 'epilog'], ['check', 'system'],"
        " ['status']):\n"
        "    gc.enable()\n"
        "    sys.argv = ['slurm-hooks'] + argv\n"
        "    try:\n"
        "        main.run()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(json.dumps(seen))\n"
    )
    assert _run(code) == [False, False, False, True]


def test_no_process_of_a_prolog_imports_typing(tmp_path):
    """Round 8: `typing` cost ~2.5 ms of CPU before the check process's fork, and only our own modules
    imported it (`from __future__ import annotations` leaves every annotation unevaluated). A module
    on the prolog's path imports its annotation names under `if TYPE_CHECKING:`, with
    `TYPE_CHECKING = False` (mypy and pyright read that name as true). The real prolog on the 8-GPU
    bench node, under `python -X importtime`: the hook, its check process and the sysfs helper
    (whose stderr the hook relays) all report their imports."""
    from bench.nodeenv import BenchNode

    node = BenchNode.create("dgx-h100")
    try:
        env = dict(
            node.hook_env("prolog", 4343),
            PATH=os.environ.get("PATH", "/usr/bin:/bin"),
            PYTHONPATH=REPO,
        )
        # the first run parses the configuration (tomllib imports typing) and caches it, as a
        # node's first hook does; the second is every later job's prolog
        for _run_number in range(2):
            done = subprocess.run(
                [sys.executable, "-s", "-X", "importtime", "-m", "slurm_hooks", "prolog"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr[-2000:]
        assert "status=OK" in node.decision_lines()[-1]
    finally:
        node.cleanup()
    imported = [
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ]
    assert "slurm_hooks.records.counters" in imported  # the check process's imports are here too
    assert "pynvml" in imported or "slurm_hooks.hw.pynvml_import" in imported
    assert "tomllib" not in imported  # the cached configuration was used
    # importtime names a module once it is imported: its importer is named after it
    where = imported.index("typing") if "typing" in imported else 0
    assert "typing" not in imported, imported[where : where + 4]
    # nor the Xid catalog's module: checks/xid.py imports it for an Xid, an SXid or an override
    assert "slurm_hooks.xid.catalog" not in imported
    # nor glob: the drop-in directories are listed by config_files.names_ending
    assert "glob" not in imported
    # nor signal (~0.6 ms): isolation.SIGKILL is the number, the module names a signal on demand
    assert "signal" not in imported


def test_a_decision_line_of_printable_ascii_compiles_no_escaping_pattern():
    """Round 8: the pattern that escapes control and format characters in a decision line (~0.7 ms
    to compile, on the prolog's tail) is compiled only for a value that may hold one of them."""
    state = _run(
        "import json\n"
        "from slurm_hooks.core import logs\n"
        "line = logs.kv(context='prolog', job=42, node='node1', status='OK', detail='a b=c')\n"
        "plain = 'sub' in vars(logs._UNSAFE)\n"
        "escaped = logs.kv(detail='tab\\there\\x1b[31m')\n"
        "print(json.dumps([line, plain, escaped, 'sub' in vars(logs._UNSAFE)]))\n"
    )
    assert state == [
        'context=prolog job=42 node=node1 status=OK detail="a b=c"',
        False,
        'detail="tab here\\x1b[31m"',
        True,
    ]


def test_the_console_script_imports_nothing_of_the_package_before_run_turns_the_collector_off():
    """Round 8: run() turns the cyclic collector off before the package's first import, so that
    importing what decides the command line (the registry, the result types) triggers no
    collection either (4 of them, ~0.8 ms of each prolog); an admin verb turns it back on (the test
    above). The console script imports cli.main and calls run(): that import loads no other module
    of ours."""
    loaded = _run(
        "import json, sys\n"
        "from slurm_hooks.cli.main import run\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('slurm_hooks'))))\n"
    )
    assert loaded == ["slurm_hooks", "slurm_hooks.cli", "slurm_hooks.cli.main"]


def test_logging_and_string_are_imported_with_their_patterns_compiled_on_first_use():
    """Round 8: logs.import_logging (and import_pynvml, which imports string) imports them while
    re.compile hands the importing thread LazyPatterns: the '{' style's two patterns and
    string.Template's are compiled only if used, and then work as before."""
    state = _run(
        "import json, re, threading\n"
        "from slurm_hooks.core import lazyre, logs\n"
        "logging = logs.import_logging()\n"
        "import string\n"
        "lazy = {name: 'sub' not in vars(value) for name, value in ("
        "('fmt_spec', logging.StrFormatStyle.fmt_spec),"
        " ('field_spec', logging.StrFormatStyle.field_spec),"
        " ('template', string.Template.pattern))}\n"
        "kinds = [type(value).__name__ for value in (logging.StrFormatStyle.fmt_spec,"
        " string.Template.pattern)]\n"
        "restored = re.compile is lazyre._compile\n"
        "braces = logging.Formatter('{levelname} {message}', style='{')\n"
        "record = logging.LogRecord('x', logging.INFO, 'x.py', 1, 'hello', None, None)\n"
        "try:\n"
        "    logging.Formatter('{levelname!x}', style='{')\n"
        "    refused = False\n"
        "except ValueError:\n"
        "    refused = True\n"
        "class Percent(string.Template):\n"
        "    delimiter = '%'\n"
        "other = []\n"
        "with lazyre.compiled_on_use():\n"
        "    mine = type(re.compile('a+')).__name__\n"
        "    worker = threading.Thread(target=lambda: other.append(type(re.compile('b+')).__name__))\n"
        "    worker.start(); worker.join()\n"
        "print(json.dumps({'lazy': lazy, 'kinds': kinds, 'restored': restored,"
        " 'braces': braces.format(record), 'refused': refused,"
        " 'template': string.Template('$a-${b}').substitute(a=1, b=2),"
        " 'percent': Percent('%a!').substitute(a=3), 'mine': mine, 'other': other}))\n"
    )
    assert state == {
        "lazy": {"fmt_spec": True, "field_spec": True, "template": True},
        "kinds": ["LazyPattern", "LazyPattern"],
        "restored": True,
        "braces": "INFO hello",
        "refused": True,
        "template": "1-2",
        "percent": "3!",
        "mine": "LazyPattern",
        "other": ["Pattern"],
    }


def test_scanning_a_kernel_log_without_xids_compiles_no_xid_pattern():
    """Round 8: kmsg.scan_all binds its two /dev/kmsg patterns at the first line past its needle, so
    a healthy node's log (every prolog's case: no line says Xid) compiles neither (~0.9 ms of the
    check process); the first Xid line still parses."""
    state = _run(
        "import json\n"
        "from slurm_hooks.xid import kmsg\n"
        "lines = ['6,%d,%d,-;usb 1-1: new device number %d' % (i, i * 1000, i) for i in range(50)]\n"
        "quiet = kmsg.scan_all(lines)\n"
        "compiled = [n for n in ('_KMSG_RE', '_KMSG_XID_RE') if 'match' in vars(getattr(kmsg, n))]\n"
        "xid = '4,51,52000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.'\n"
        "events, _ = kmsg.scan_all(lines + [xid])\n"
        "print(json.dumps([len(quiet[0]) + len(quiet[1]), compiled,"
        " [(e.xid, e.pci, e.seq) for e in events]]))\n"
    )
    assert state == [0, [], [[79, "0000:3b:00.0", 51]]]


def test_names_ending_lists_what_glob_listed(tmp_path):
    """Round 8: conf.d/*.toml and checks.d/*.py are listed without glob (its import and patterns:
    ~0.5 ms of every hook): the same paths as glob.glob for every kind of entry."""
    import glob

    from slurm_hooks.core.config_files import names_ending

    for name in ("a.toml", "b.toml", ".hidden.toml", ".toml", "c.txt", "x.toml.bak", "A.TOML"):
        (tmp_path / name).write_text("")
    (tmp_path / "weird [name]*.toml").write_text("")
    (tmp_path / "line\nbreak.toml").write_text("")
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "broken.toml").symlink_to(tmp_path / "nowhere")
    (tmp_path / "site.py").write_text("")
    for suffix in (".toml", ".py"):
        expected = sorted(glob.glob(os.path.join(str(tmp_path), "*" + suffix)))
        assert sorted(names_ending(str(tmp_path), suffix)) == expected, suffix
    for missing in (str(tmp_path / "absent"), str(tmp_path / "a.toml")):
        assert names_ending(missing, ".toml") == [] == glob.glob(os.path.join(missing, "*.toml"))
    for listing in (glob.glob, lambda path: names_ending(os.path.dirname(path), ".toml")):
        with pytest.raises(ValueError):  # a NUL in the path: refused alike
            listing(os.path.join(str(tmp_path) + "\x00", "*.toml"))


def test_the_kill_signal_is_the_signal_modules():
    """Round 8: the hooks kill a hung child with isolation.SIGKILL, without importing signal."""
    import signal

    from slurm_hooks.core import isolation

    assert isolation.SIGKILL == signal.SIGKILL
    assert isolation._signal_name(int(signal.SIGTERM)) == "SIGTERM"
