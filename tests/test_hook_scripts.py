"""prolog.d/epilog.d and the health-check wrapper: exit 10 fails the hook, any other failure fails open."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import REPO

SCRIPTS = ["prolog.d/50-slurm-hooks", "epilog.d/50-slurm-hooks"]


def copy_with_binary(tmp_path, script, exit_code):
    fake = tmp_path / "fake-slurm-hooks"
    fake.write_text('#!/bin/sh\necho "$@" > %s/argv\nexit %d\n' % (tmp_path, exit_code))
    fake.chmod(0o755)
    with open(os.path.join(REPO, script)) as handle:
        text = handle.read()
    assert text.count("/usr/bin/slurm-hooks ") == 1
    copy = tmp_path / "hook"
    copy.write_text(text.replace("/usr/bin/slurm-hooks ", "%s " % fake))
    copy.chmod(0o755)
    return copy


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "slurm_hooks_exit,hook_exit", [(0, 0), (10, 1), (1, 0), (3, 0), (139, 0), (127, 0)]
)
def test_only_exit_10_fails_the_hook(tmp_path, script, slurm_hooks_exit, hook_exit):
    hook = copy_with_binary(tmp_path, script, slurm_hooks_exit)
    done = subprocess.run(
        [str(hook)], env={}, capture_output=True, text=True, timeout=10
    )  # slurmd gives no PATH
    assert done.returncode == hook_exit, done.stderr
    assert (tmp_path / "argv").read_text().strip() == script.split(".d/")[0]


def test_healthcheck_wrapper_maps_node_broken(tmp_path):
    hook = copy_with_binary(tmp_path, "packaging/slurm-hooks-healthcheck", 10)
    assert subprocess.run([str(hook)], env={}, timeout=10).returncode == 1
    assert (tmp_path / "argv").read_text().strip() == "health"
