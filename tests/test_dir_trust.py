"""core/dir_trust.py: which directories no one else can change (the state dir, a qualification's
work dir). Real directories under tmp_path, real modes and owners (the suite runs as root)."""

from __future__ import annotations

import json
import os

import pytest

from slurm_hooks.core.dir_trust import untrusted_because
from tests.inprocess_cli import cli_in_process


def make(tmp_path, mode, owner=None):
    made = tmp_path / "state"
    made.mkdir()
    made.chmod(mode)
    if owner is not None:
        os.chown(str(made), owner, -1)
    return made


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o1755])
def test_ours_and_not_writable_by_others_is_trusted(tmp_path, mode):
    assert untrusted_because(str(make(tmp_path, mode))) is None


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
def test_writable_by_group_or_others_is_not_even_when_sticky(tmp_path, mode):
    """Sticky helps only above: in the directory itself, others could still add names."""
    made = make(tmp_path, mode)
    why = untrusted_because(str(made))
    assert why == "%s is writable by others (mode %04o): chmod go-w" % (made, mode), why


def test_another_owner_is_not(tmp_path):
    made = make(tmp_path, 0o700, owner=65534)
    assert untrusted_because(
        str(made)
    ) == "%s is owned by uid 65534, not by root or us (uid %d)" % (
        made,
        os.geteuid(),
    )


def test_a_directory_above_that_others_can_rename_in_is_not(tmp_path):
    shared = make(tmp_path, 0o777)
    inner = shared / "slurm-hooks"
    inner.mkdir(mode=0o700)
    assert untrusted_because(str(inner)).startswith("%s is writable by others" % shared)


def test_a_sticky_directory_above_is_fine_like_tmp(tmp_path):
    shared = make(tmp_path, 0o1777)
    inner = shared / "slurm-hooks"
    inner.mkdir(mode=0o700)
    assert untrusted_because(str(inner)) is None


def test_a_missing_directory_is_judged_by_the_one_it_would_be_made_in(tmp_path):
    """The hooks make it 0700; what matters before is where."""
    assert untrusted_because(str(tmp_path / "not" / "yet")) is None
    shared = make(tmp_path, 0o777)
    assert untrusted_because(str(shared / "not" / "yet")).startswith(str(shared))


def test_a_symbolic_link_is_judged_where_it_leads(tmp_path):
    made = make(tmp_path, 0o777)
    link = tmp_path / "link"
    link.symlink_to(made)
    assert untrusted_because(str(link)).startswith("%s is writable by others" % made)


def test_a_file_is_not_a_directory(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    assert untrusted_because(str(plain)) == "%s is not a directory" % plain


def test_config_check_names_a_state_dir_others_can_write(tmp_path):
    """The hooks only log it when they act; `config check` is where an admin looks first."""
    made = make(tmp_path, 0o777)
    conf = tmp_path / "config.toml"
    conf.write_text('[paths]\nstate_dir = "%s"\n' % made)
    env = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    command = ["--config", str(conf), "config", "check"]
    text = cli_in_process(command, env=env)
    assert text.returncode == 0
    assert (
        "warning: [paths] state_dir = %r: %s is writable by others (mode 0777)" % (str(made), made)
        in text.stderr
    ), text.stderr
    doc = json.loads(cli_in_process(command + ["--json"], env=env).stdout)
    assert any("state_dir" in warning for warning in doc["warnings"]), doc["warnings"]
    made.chmod(0o700)
    again = cli_in_process(command, env=env)
    assert "state_dir" not in again.stderr, again.stderr


def test_a_link_another_user_owns_in_a_sticky_directory_is_not(tmp_path):
    """In /tmp-like directories a link's owner may delete it and put another in its place: a state
    dir reached through it leads wherever that user says next time, whatever it leads to now."""
    target = make(tmp_path, 0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "slurm-hooks"
    link.symlink_to(target)
    os.lchown(str(link), 65534, -1)
    assert untrusted_because(str(link)) == (
        "%s is a symbolic link owned by uid 65534, not by root or us (uid %d)"
        % (link, os.geteuid())
    )
    os.lchown(str(link), 0, -1)  # root's link there: only root may replace it
    assert untrusted_because(str(link)) is None


def test_a_link_in_a_directory_someone_else_owns_is_not(tmp_path):
    """The owner of the directory holding a link (root's link, via a second root link even) may
    re-point it: that directory is judged as one the path passes through."""
    target = make(tmp_path, 0o700)
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "hooks").symlink_to(target)
    os.chown(str(home), 65534, -1)
    entry = tmp_path / "entry"
    entry.symlink_to(home / "hooks")
    assert untrusted_because(
        str(entry)
    ) == "%s is owned by uid 65534, not by root or us (uid %d)" % (
        home,
        os.geteuid(),
    )
    os.chown(str(home), 0, -1)
    assert untrusted_because(str(entry)) is None


def test_relative_links_and_dot_dot_are_followed_as_the_kernel_does(tmp_path):
    target = make(tmp_path, 0o777)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "up").symlink_to("..")
    assert untrusted_because(str(tmp_path / "a" / "up" / "state")).startswith(
        "%s is writable by others" % target
    )
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    assert "too many levels of symbolic links" in untrusted_because(str(loop))
