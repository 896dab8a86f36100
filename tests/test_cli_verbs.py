"""An admin verb builds only its own module's parsers (cli/main.VERB_OWNERS, issue #26): the table must
name every verb's module, and a command line must parse the same with the one module as with all."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

import pytest

from slurm_hooks.cli import main as cli


def _verbs_added_by(module_name: str):
    parser = argparse.ArgumentParser(prog="slurm-hooks")
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(module_name).add_parsers(sub)
    return set(sub.choices)


def test_every_verb_is_owned_by_the_module_that_adds_it():
    owners = {}
    for module in cli.VERB_MODULES:
        for verb in _verbs_added_by(module):
            owners[verb] = module
    assert cli.VERB_OWNERS == owners


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "system", "--json"],
        ["--config", "/etc/x.toml", "check", "gpu", "--all-contexts"],
        ["--config=/etc/x.toml", "list"],
        ["config", "check"],
        ["explain", "xid", "79"],
        ["report", "--stragglers", "--json"],
        ["mode"],
        ["drain", "--reason", "fan"],
    ],
)
def test_one_module_parses_as_all_of_them(argv):
    verb = cli.verb_of(argv)
    assert verb in cli.VERB_OWNERS
    try:
        full = vars(cli.build_parser().parse_args(argv))
    except SystemExit:  # a command line this version words differently: both must refuse it
        with pytest.raises(SystemExit):
            cli.build_parser(verb).parse_args(argv)
        return
    alone = vars(cli.build_parser(verb).parse_args(argv))
    assert alone == full


def test_verb_of_skips_the_global_options():
    assert cli.verb_of(["--config", "x.toml", "check"]) == "check"
    assert cli.verb_of(["--config=x.toml", "report"]) == "report"
    assert cli.verb_of(["--version"]) is None
    assert cli.verb_of(["-h"]) is None
    assert cli.verb_of([]) is None


def test_help_and_unknown_verbs_still_list_every_verb():
    for argv in (["--help"], ["no-such-verb"]):
        done = subprocess.run(
            [sys.executable, "-m", "slurm_hooks"] + argv, capture_output=True, text=True, timeout=60
        )
        text = done.stdout + done.stderr
        for verb in ("check", "report", "qualify", "explain", "mode", "drain"):
            assert verb in text, (argv, verb, text[-500:])


def test_check_verb_does_not_import_the_other_verb_modules(tmp_path):
    code = (
        "import sys; from slurm_hooks.cli import main as cli\n"
        "cli.build_parser(cli.verb_of(['check', 'system']))\n"
        "print(sorted(m for m in cli.VERB_MODULES if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "['slurm_hooks.cli.check_verbs']"


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", "system"],
        ["check", "system", "gpu.count", "--json"],
        ["check", "--json", "system"],
        ["--config", "/etc/x.toml", "check", "-v", "system"],
        ["--config=/etc/x.toml", "check", "--all-contexts", "--verbose"],
    ],
)
def test_the_check_fast_path_gives_what_argparse_gives(argv):
    fast = cli.parse_check_args(argv)
    assert fast is not None
    from slurm_hooks.cli.check_verbs import cmd_check

    fast.handler = cmd_check
    assert vars(fast) == vars(cli.build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--context", "health"],
        ["check", "--root", "/tmp/x"],
        ["check", "--deadline", "5"],
        ["check", "--live", "nvml"],
        ["check", "--js"],  # argparse's abbreviation
        ["check", "-h"],
        ["check", "--", "system"],
        ["--config", "check"],
        ["--configx", "a", "check"],
        ["list"],
        ["prolog"],
    ],
)
def test_anything_else_goes_through_argparse(argv):
    assert cli.parse_check_args(argv) is None


def test_check_system_needs_no_argparse(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nmode = "observe"\n[paths]\nstate_dir = "%s"\nlog_file = "%s"\nsyslog = false\n'
        % (tmp_path, tmp_path / "log")
    )
    code = (
        "import sys; from slurm_hooks.cli import main as cli, check_verbs\n"
        "check_verbs.finish = lambda code: code\n"
        "code = cli.main(['check', 'system.kernel', '--json'])\n"
        "sys.stderr.write('\\nRESULT %d %s' % (code, 'argparse' in sys.modules))"
    )
    env = dict(
        os.environ,
        SLURM_HOOKS_CONFIG=str(config),
        SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1",
        SLURM_HOOKS_CHECKS_DIR="",
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stderr.rpartition("\nRESULT ")[2] == "0 False", done.stderr[-1500:]
    assert '"system.kernel"' in done.stdout


def test_check_in_its_cron_form_leaves_with_its_exit_code_and_its_whole_report(tmp_path):
    """`check` skips interpreter teardown like the hooks (os._exit after flushing): the Nagios code
    and every line of the report must still come out, through a pipe too."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nmode = "observe"\n[paths]\nstate_dir = "%s"\nlog_file = "%s"\nsyslog = false\n'
        '[checks."system.kernel"]\ndeny = ["*"]\n' % (tmp_path, tmp_path / "log")
    )
    env = dict(
        os.environ,
        SLURM_HOOKS_CONFIG=str(config),
        SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1",
        SLURM_HOOKS_CHECKS_DIR="",
    )
    for argv, last in (
        (["check", "system.kernel", "system.swap"], "overall: FAIL"),
        (["check", "system.kernel", "--json"], "}"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "slurm_hooks"] + argv,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 2, done.stderr[-1000:]
        assert done.stdout.rstrip().splitlines()[-1].startswith(last), done.stdout[-500:]
