"""Result, registry, config and runner: the framework every check relies on."""

from __future__ import annotations

import os
import threading
import time

import pytest

from slurm_hooks.core.config import ConfigError, load_config, render_toml, validate
from slurm_hooks.core.runner import run_checks, select_checks
from slurm_hooks.hw.host import Host
from slurm_hooks.registry import Param, Registry, RegistryError
from slurm_hooks.result import Action, Blame, Result, Status, worst


def test_worst_status_order():
    assert worst([Status.OK, Status.WARN, Status.SKIP]) is Status.WARN
    assert worst([Status.WARN, Status.UNKNOWN]) is Status.UNKNOWN
    assert worst([Status.UNKNOWN, Status.FAIL, Status.OK]) is Status.FAIL
    assert worst([]) is Status.SKIP
    assert [
        s.exit_code for s in (Status.OK, Status.WARN, Status.FAIL, Status.UNKNOWN, Status.SKIP)
    ] == [0, 1, 2, 3, 0]


def test_result_blame_defaults_and_json():
    fail = Result(
        "x.y",
        Status.FAIL,
        "bad",
        component="gpu:3 0000:3b:00.0",
        action=Action.RESET_GPU,
        details={"set": {2, 1}, "t": (1, 2)},
    )
    assert fail.effective_blame is Blame.NODE
    assert Result("x.y", Status.UNKNOWN, "?").effective_blame is Blame.CHECK
    assert Result("x.y", Status.FAIL, "job", blame=Blame.JOB).effective_blame is Blame.JOB
    assert Result("x.y", Status.OK, "fine").effective_blame is None
    data = fail.to_dict()
    assert (
        data["action"] == "reset-gpu"
        and data["blame"] == "node"
        and data["details"] == {"set": [1, 2], "t": [1, 2]}
    )


def _registry_with(*specs):
    reg = Registry()
    for name, func, kwargs in specs:
        reg.check(name=name, **kwargs)(func)
    return reg


def test_registry_rejects_duplicates_with_both_locations():
    reg = Registry()

    @reg.check(name="fam.one")
    def first(params):
        """first"""

    with pytest.raises(RegistryError) as err:

        @reg.check(name="fam.one")
        def second(params):
            """second"""

    assert "duplicate check name 'fam.one'" in str(err.value) and "test_framework.py" in str(
        err.value
    )


@pytest.mark.parametrize(
    "name,kwargs,message",
    [
        ("nofamily", {}, "family.what"),
        ("Fam.Upper", {}, "lower case"),
        ("fam.ctx", {"contexts": {"bogus"}}, "contexts"),
        ("fam.timeout", {"timeout": 0}, "timeout"),
        ("fam.params", {"params": (Param("enabled", bool, True, "x"),)}, "not 'enabled'"),
    ],
)
def test_registry_rejects_bad_markers(name, kwargs, message):
    with pytest.raises(RegistryError, match=message):
        Registry().check(name=name, **kwargs)(lambda params: None)


def test_builtin_names_are_unique_and_documented(registry):
    assert registry.checks, "no checks registered"
    for spec in registry.checks.values():
        assert spec.description, "%s has no docstring" % spec.name
        assert spec.timeout > 0


@pytest.fixture
def small_registry():
    reg = Registry()

    @reg.check(
        name="demo.threshold",
        params=(Param("limit", int, 5, "max"), Param("names", list, [], "n", str)),
    )
    def threshold(params):
        """demo"""
        return Result("demo.threshold", Status.OK, "limit %d" % params.limit)

    return reg


def test_config_unknown_check_key_and_type_errors_name_file_and_key(
    tmp_path, small_registry, monkeypatch
):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    main = tmp_path / "config.toml"
    cases = [
        ('[checks."demo.treshold"]\nlimit = 3\n', "no such check (did you mean 'demo.threshold'?)"),
        ('[checks."demo.threshold"]\nlimt = 3\n', "unknown parameter (did you mean 'limit'?)"),
        ('[checks."demo.threshold"]\nlimit = "3"\n', "limit: expected an integer, got str '3'"),
        ('[checks."demo.threshold"]\nlimit = true\n', "expected an integer, got bool"),
        ('[checks."demo.threshold"]\nnames = [1]\n', "names[0]: expected a string"),
        ('[general]\nmode = "loud"\n', "'loud' is not one of 'enforce', 'observe'"),
        ("[genral]\n", "unknown section [genral] (did you mean 'general'?)"),
        ('[checks."demo.threshold"\n', "invalid TOML"),
    ]
    for text, expected in cases:
        main.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(small_registry, str(main))
        assert str(main) in str(err.value) and expected in str(err.value), text


def test_config_dropins_override_in_order(tmp_path, small_registry, monkeypatch):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "config.toml").write_text('[checks."demo.threshold"]\nlimit = 1\nnames = ["a"]\n')
    (tmp_path / "conf.d" / "20-late.toml").write_text('[checks."demo.threshold"]\nlimit = 3\n')
    (tmp_path / "conf.d" / "10-early.toml").write_text(
        '[checks."demo.threshold"]\nlimit = 2\nenabled = false\n'
    )
    config = load_config(small_registry, str(tmp_path / "config.toml"))
    check = config.check("demo.threshold")
    assert check.params.limit == 3 and check.params.names == ["a"] and check.enabled is False
    assert [os.path.basename(s) for s in config.sources] == [
        "config.toml",
        "10-early.toml",
        "20-late.toml",
    ]
    assert "limit = 3" in render_toml(config)


def test_config_refuses_writable_or_foreign_files(tmp_path, small_registry, monkeypatch):
    monkeypatch.delenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", raising=False)
    os.chmod(tmp_path, 0o755)
    main = tmp_path / "config.toml"
    main.write_text("")
    os.chmod(main, 0o666)
    with pytest.raises(ConfigError, match="world-writable"):
        load_config(small_registry, str(main))
    os.chmod(main, 0o644)
    if os.geteuid() == 0:
        os.chown(main, 1234, 0)
        with pytest.raises(ConfigError, match="owned by uid 1234"):
            load_config(small_registry, str(main))
        os.chown(main, 0, 0)
        assert load_config(small_registry, str(main)).check("demo.threshold").params.limit == 5


REFUSED_AT_LOAD = [  # issue 14: each of these was reported "configuration is valid"
    ("[deadline]\nprolog = -1\n", "[deadline] prolog: -1.0 is out of range: must be > 0"),
    ("[deadline]\nprolog = 0\n", "[deadline] prolog: 0.0 is out of range"),
    ("[deadline]\nprolog = nan\n", "[deadline] prolog: nan is not a finite number"),
    ("[deadline]\nhealth = inf\n", "[deadline] health: inf is not a finite number"),
    ("[deadline]\nfiles = -inf\n", "[deadline] files: -inf is not a finite number"),
    (
        "[breaker]\nmax_percent = 500\n",
        "[breaker] max_percent: 500.0 is out of range: must be at least 0 and at most 100",
    ),
    ("[drain]\nattempts = 0\n", "[drain] attempts: 0 is out of range: must be at least 1"),
    ("[drain]\ntimeout = 0\n", "[drain] timeout: 0.0 is out of range"),
    ('[drain]\nreason_prefix = "slurm \\"hooks\\":"\n', "would reach Slurm as 'slurm hooks:'"),
    (
        '[drain]\nreason_prefix = "slurm-hooks:\\n"\n',
        "would reach Slurm as",
    ),  # not stripped away: refused
    ('[drain]\nreason_prefix = "sl\u00fcrm-hooks:"\n', "would reach Slurm as 'sl?rm-hooks:'"),
    ('[drain]\nreason_prefix = "  "\n', "[drain] reason_prefix: must not be empty"),
    ("[drain]\nmax_reason_length = 10\n", "max_reason_length = 10 leaves no room after the prefix"),
    (
        "[drain]\nmax_reason_length = 600\n",
        "[drain] max_reason_length: 600 is out of range: must be at least 1 and at most 512",
    ),
    ('[drain]\nskip_states = ["DOWN,DRAIN"]\n', "'DOWN,DRAIN' is not a Slurm node state word"),
    ("[records]\nmax_records = 0\n", "[records] max_records: 0 is out of range"),
    ("[records]\nsnapshot_timeout = inf\n", "not a finite number"),
    ('[records]\ndir = "jobs"\n', "[records] dir: 'jobs' must be an absolute path"),
    ('[records]\nib_counters = ["../../etc/shadow"]\n', "is not a counter file name"),
    ('[paths]\nstate_dir = "/var/lib/x\\u0000y"\n', "[paths] state_dir: contains a NUL character"),
    (
        '[checks."xid.events"]\noverrides = ["79=BROKEN:rma"]\n',
        "overrides entry '79=BROKEN:rma': xid override for "
        "Xid 79: key 'status' has invalid value 'BROKEN'",
    ),
    ('[checks."xid.sxid".overrides]\n20034 = {status = "FATAL"}\n', "invalid value 'FATAL'"),
    (
        '[checks."system.load"]\nmax_load_per_cpu = nan\n',
        "max_load_per_cpu: nan is not a finite number",
    ),
]


@pytest.mark.parametrize("text, expected", REFUSED_AT_LOAD)
def test_config_check_refuses_bad_values_naming_file_and_key(tmp_path, text, expected):
    """Through the real `slurm-hooks config check` (in this process, tests/inprocess_cli.py; the
    first table also as a child, the console entry point): exit 3, one line naming the file,
    section, key and value."""
    import subprocess
    import sys

    from tests.inprocess_cli import cli_in_process

    main = tmp_path / "config.toml"
    main.write_text(text)
    env = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1", SLURM_HOOKS_CHECKS_DIR="")
    argv = ["--config", str(main), "config", "check"]
    if text == REFUSED_AT_LOAD[0][0]:
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_hooks"] + argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    else:
        proc = cli_in_process(argv, env=env)
    assert proc.returncode == 3, (text, proc.stdout, proc.stderr)
    assert "configuration is valid" not in proc.stderr and "Traceback" not in proc.stderr
    assert str(main) in proc.stderr and expected in proc.stderr, (expected, proc.stderr)


def test_every_number_refuses_nan_and_infinity(registry):
    """Every float setting and float check parameter, whatever its range: nan and inf never load."""
    from slurm_hooks.core.config import SECTIONS

    floats = [
        (section, key)
        for section, schema in SECTIONS.items()
        for key, s in schema.items()
        if s.type is float
    ]
    floats += [
        ("checks", spec.name, p.name)
        for spec in registry.sorted_checks()
        for p in spec.params
        if p.type is float
    ]
    assert len(floats) > 15
    for where in floats:
        for bad in (float("nan"), float("inf"), float("-inf")):
            data: dict = {}
            table = data
            for part in where[:-1]:
                table = table.setdefault(part, {})
            table[where[-1]] = bad
            with pytest.raises(ConfigError, match="is not a finite number"):
                validate(registry, data)


def test_prefix_and_length_that_keep_our_drains_recognisable_load(registry):
    config = validate(
        registry, {"drain": {"reason_prefix": "[hc] slurm-hooks:", "max_reason_length": 60}}
    )
    assert config.get("drain", "max_reason_length") == 60
    validate(registry, {"drain": {"max_reason_length": 512}})


def test_deadline_inf_on_the_command_line_is_a_usage_error():
    """In this process (tests/inprocess_cli.py): argparse refuses the value before anything runs."""
    from tests.inprocess_cli import cli_in_process

    for value in ("inf", "nan", "-1", "0", "1e9"):
        proc = cli_in_process(
            ["check", "system.load", "--deadline", value],
            env=dict(os.environ, SLURM_HOOKS_CHECKS_DIR=""),
            cwd=os.getcwd(),
        )
        assert (
            proc.returncode == 3 and "--deadline" in proc.stderr and "Traceback" not in proc.stderr
        ), proc.stderr


def test_missing_explicit_config_is_an_error(tmp_path, small_registry, monkeypatch):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    with pytest.raises(ConfigError, match="cannot"):
        load_config(small_registry, str(tmp_path / "nope.toml"))


def _runner_registry(block_event: threading.Event):
    reg = Registry()

    @reg.check(name="demo.fast", timeout=1)
    def fast(params):
        """fast"""
        return Result("demo.fast", Status.OK, "fine")

    @reg.check(name="demo.hang", timeout=0.3)
    def hang(params):
        """blocks forever, like a hung NVML call"""
        block_event.wait()  # never set during the test
        return Result("demo.hang", Status.OK, "unreachable")

    @reg.check(name="demo.raises", timeout=1)
    def raises(params):
        """our own bug"""
        raise ZeroDivisionError("oops")

    @reg.check(name="demo.later", timeout=1)
    def later(params):
        """runs after the hang"""
        return [
            Result("demo.later", Status.WARN, "a", component="c1"),
            Result("demo.later", Status.OK, "b"),
        ]

    return reg


def test_blocked_check_cannot_exceed_deadline():
    never = threading.Event()
    reg = _runner_registry(never)
    config = validate(reg, {})
    started = time.monotonic()
    report = run_checks(
        reg, config, Host("/"), "prolog", select_checks(reg, "prolog"), deadline=1.0
    )
    elapsed = time.monotonic() - started
    by_name = {run.name: run for run in report.runs}
    assert elapsed < 1.0 + 0.2
    assert by_name["demo.hang"].timed_out and by_name["demo.hang"].status is Status.UNKNOWN
    assert by_name["demo.hang"].results[0].details["timed_out"] is True
    assert by_name["demo.fast"].status is Status.OK
    assert by_name["demo.later"].status is Status.WARN  # ran after the hang
    raised = by_name["demo.raises"].results[0]
    assert raised.status is Status.UNKNOWN and raised.effective_blame is Blame.CHECK
    assert "ZeroDivisionError" in raised.summary and "traceback" in raised.details
    never.set()


def test_run_ends_when_the_last_check_is_abandoned_not_at_the_deadline():
    """A check hung for good costs its own timeout: the run must not sit out the global deadline, and
    deadline_hit stays false because the deadline cut nothing (issue 14: `check` took 30 s for a 3 s hang)."""
    never = threading.Event()
    reg = _runner_registry(never)
    config = validate(reg, {})
    started = time.monotonic()
    report = run_checks(
        reg, config, Host("/"), "prolog", select_checks(reg, "prolog"), deadline=20.0
    )
    elapsed = time.monotonic() - started
    assert elapsed < 0.3 + 1.0, (
        elapsed
    )  # demo.hang's own 0.3 s timeout plus scheduling slack, not 20 s
    assert not report.deadline_hit
    by_name = {run.name: run for run in report.runs}
    assert (
        by_name["demo.hang"].timed_out
        and "within its 0.3s timeout" in by_name["demo.hang"].results[0].summary
    )
    never.set()


def test_global_deadline_caps_every_check():
    never = threading.Event()
    reg = Registry()
    for i in range(4):
        reg.check(name="demo.h%d" % i, timeout=2.0)(lambda params: never.wait())
    reg.check(name="demo.quick", timeout=2.0)(
        lambda params: Result("demo.quick", Status.OK, "done")
    )
    config = validate(reg, {})
    started = time.monotonic()
    report = run_checks(
        reg, config, Host("/"), "prolog", select_checks(reg, "prolog"), deadline=0.5
    )
    assert time.monotonic() - started < 0.5 + 0.2
    assert report.deadline_hit
    hung = [run for run in report.runs if run.name != "demo.quick"]
    assert all(
        run.status is Status.UNKNOWN and "deadline" in run.results[0].summary for run in hung
    )
    assert next(run for run in report.runs if run.name == "demo.quick").status is Status.OK
    never.set()


def test_disabled_check_is_skipped_and_params_reach_check(small_registry):
    config = validate(small_registry, {"checks": {"demo.threshold": {"limit": 9}}})
    report = run_checks(
        small_registry, config, Host("/"), "manual", select_checks(small_registry, "manual")
    )
    assert report.runs[0].results[0].summary == "limit 9"
    config = validate(small_registry, {"checks": {"demo.threshold": {"enabled": False}}})
    report = run_checks(
        small_registry, config, Host("/"), "manual", select_checks(small_registry, "manual")
    )
    assert report.runs[0].status is Status.SKIP and "disabled" in report.runs[0].results[0].summary


def test_select_checks_by_family_and_unknown(registry):
    names = [s.name for s in select_checks(registry, "manual", ["system"])]
    assert "system.cpu" in names and all(n.startswith("system.") for n in names)
    with pytest.raises(KeyError):
        select_checks(registry, "manual", ["nope"])


def test_gatherer_runs_once_and_errors_are_shared():
    reg = Registry()
    calls = []

    @reg.gatherer("demo.data")
    def data(ctx):
        calls.append(1)
        raise OSError("boom")

    for i in range(3):
        reg.check(name="demo.c%d" % i, needs=("demo.data",))(
            lambda snap, params: Result("x", Status.OK, "no")
        )
    report = run_checks(reg, validate(reg, {}), Host("/"), "manual", select_checks(reg, "manual"))
    assert len(calls) == 1
    assert all(
        run.status is Status.UNKNOWN and "boom" in run.results[0].summary for run in report.runs
    )


@pytest.mark.slow
def test_checks_behind_a_hung_gatherer_still_run():
    """A hung NVML init stalls every check that needs it; the queue behind them must still drain."""
    never = threading.Event()
    reg = Registry()

    @reg.gatherer("demo.nvml")
    def hung_nvml(ctx):
        never.wait()

    for i in range(12):
        reg.check(name="demo.gpu%02d" % i, timeout=1.5, needs=("demo.nvml",))(
            lambda snap, params: None
        )
    for i in range(5):
        reg.check(name="demo.sys%d" % i, timeout=1.5)(lambda params: Result("x", Status.OK, "fine"))
    started = time.monotonic()
    report = run_checks(
        reg, validate(reg, {}), Host("/"), "prolog", select_checks(reg, "prolog"), deadline=2.0
    )
    assert time.monotonic() - started < 2.0 + 0.2
    by_name = {run.name: run for run in report.runs}
    assert all(by_name["demo.sys%d" % i].status is Status.OK for i in range(5))
    assert all(by_name["demo.gpu%02d" % i].timed_out for i in range(12))
    never.set()


def test_healthy_run_uses_a_small_pool():
    reg = Registry()
    names = []

    for i in range(30):

        def check(params, i=i):
            names.append(threading.current_thread().name)
            return Result("x", Status.OK, "fine")

        reg.check(name="demo.c%02d" % i)(check)
    report = run_checks(reg, validate(reg, {}), Host("/"), "manual", select_checks(reg, "manual"))
    assert report.status is Status.OK and len(report.runs) == 30
    assert (
        len(set(names)) <= 3
    )  # no thread per check: they cost more in GIL hand-offs than the checks


def test_the_default_drain_reason_settings_pass_the_check_every_hook_now_skips():
    """Round 8: validate() does not re-check the default [drain] reason_prefix and max_reason_length
    (their patterns cost ~0.6 ms of every hook); they must pass the full check, and any other
    value, the prefix or the length alone, is still checked (REFUSED_AT_LOAD above)."""
    from slurm_hooks.core import config as config_module

    drain = config_module.SECTIONS["drain"]
    defaults = {
        "reason_prefix": drain["reason_prefix"].default,
        "max_reason_length": drain["max_reason_length"].default,
    }
    config_module.check_drain_reasons(defaults, lambda *_key: "<defaults>")  # does not raise
    with pytest.raises(config_module.ConfigError, match="leaves no room after the prefix"):
        config_module.validate(Registry(), {"drain": {"max_reason_length": 10}})
    with pytest.raises(config_module.ConfigError, match="would reach Slurm as"):
        config_module.validate(Registry(), {"drain": {"reason_prefix": 'sh"x:'}})
