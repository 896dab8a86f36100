"""Files that decide whether nodes get drained, or that run as root in every prolog, must be root's:
config.toml, conf.d/*.toml and site checks (checks.d/*.py), each with its directory. Anything owned by
another user, or group/world-writable, is refused with an error naming the file and the fix.

Ownership cases need root (to chown to another uid); mode cases run everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from slurm_hooks.core import plugins
from slurm_hooks.core.config import ConfigError, load_config
from slurm_hooks.core.config_files import INSECURE_OVERRIDE_ENV
from slurm_hooks.registry import load_builtin_checks
from tests.helpers import REPO

OTHER_UID = 4321
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")

SITE_CHECK = '''
from slurm_hooks.registry import check
from slurm_hooks.result import Result, Status


@check(name="site.permtest", contexts=("manual",), timeout=1.0)
def permtest(params):
    """A site check that must never be loaded from an insecure place."""
    return Result("site.permtest", Status.OK, "loaded")
'''


@pytest.fixture
def etc(tmp_path, monkeypatch):
    """A root-owned /etc/slurm-hooks look-alike: config.toml and conf.d/ (mode 0755/0644), override off."""
    monkeypatch.delenv(INSECURE_OVERRIDE_ENV, raising=False)
    base = tmp_path / "slurm-hooks"
    (base / "conf.d").mkdir(parents=True)
    os.chmod(base, 0o755)
    os.chmod(base / "conf.d", 0o755)
    (base / "config.toml").write_text('[general]\nmode = "observe"\n')
    (base / "conf.d" / "10-site.toml").write_text('[drain]\nreason_prefix = "slurm-hooks:"\n')
    for path in (base / "config.toml", base / "conf.d" / "10-site.toml"):
        os.chmod(path, 0o644)
    return base


def load(base):
    return load_config(load_builtin_checks(), str(base / "config.toml"))


def test_secure_tree_loads(etc):
    config = load(etc)
    assert config.get("general", "mode") == "observe" and len(config.sources) == 2


@pytest.mark.parametrize(
    "target, mode",
    [
        ("config.toml", 0o664),
        ("config.toml", 0o646),
        ("conf.d/10-site.toml", 0o666),
        (".", 0o775),
        (".", 0o777),
        ("conf.d", 0o757),
        (".", 0o1777),
    ],
)
def test_writable_by_others_is_refused(etc, target, mode):
    path = os.path.normpath(str(etc / target))
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as err:
        load(etc)
    message = str(err.value)
    assert message.startswith(
        path + ": group- or world-writable (mode %04o); refusing it: chmod go-w" % mode
    ), message


@as_root
@pytest.mark.parametrize("target", ["config.toml", "conf.d/10-site.toml", ".", "conf.d"])
def test_not_owned_by_root_is_refused(etc, target):
    path = os.path.normpath(str(etc / target))
    os.chown(path, OTHER_UID, 0)
    with pytest.raises(ConfigError) as err:
        load(etc)
    assert str(err.value).startswith(
        path + ": owned by uid %d, not root; refusing it" % OTHER_UID
    ), str(err.value)


@as_root
def test_symlink_to_a_users_file_is_refused(etc, tmp_path):
    """A root-owned link in a root-owned directory does not launder a user's file: stat follows the link."""
    user_file = tmp_path / "user.toml"
    user_file.write_text('[general]\nmode = "observe"\n')
    os.chown(user_file, OTHER_UID, 0)
    (etc / "config.toml").unlink()
    (etc / "config.toml").symlink_to(user_file)
    with pytest.raises(ConfigError, match="owned by uid %d, not root" % OTHER_UID):
        load(etc)


def test_override_is_explicit(etc, monkeypatch):
    os.chmod(etc / "config.toml", 0o666)
    monkeypatch.setenv(INSECURE_OVERRIDE_ENV, "yes")  # only the exact value 1 switches the rule off
    with pytest.raises(ConfigError):
        load(etc)
    monkeypatch.setenv(INSECURE_OVERRIDE_ENV, "1")
    assert load(etc).get("general", "mode") == "observe"


# -- site checks (slurm_hooks/core/plugins.py) ---------------------------------------------------------


@pytest.fixture
def checks_d(tmp_path, monkeypatch):
    monkeypatch.delenv(INSECURE_OVERRIDE_ENV, raising=False)
    directory = tmp_path / "checks.d"
    directory.mkdir()
    os.chmod(directory, 0o755)
    (directory / "site_permtest.py").write_text(SITE_CHECK)
    os.chmod(directory / "site_permtest.py", 0o644)
    yield directory
    sys.modules.pop(plugins.MODULE_PREFIX + "site_permtest", None)
    from slurm_hooks.registry import REGISTRY

    REGISTRY.checks.pop("site.permtest", None)


@pytest.mark.parametrize(
    "target, mode",
    [("site_permtest.py", 0o664), ("site_permtest.py", 0o666), (".", 0o777), (".", 0o775)],
)
def test_writable_site_check_is_refused_and_not_run(checks_d, target, mode):
    path = os.path.normpath(str(checks_d / target))
    os.chmod(path, mode)
    with pytest.raises(plugins.PluginError) as err:
        plugins.load_site_checks(str(checks_d))
    assert str(
        err.value
    ) == "site check %s: group- or world-writable (mode %04o); refusing it: chmod go-w" % (
        path,
        mode,
    )
    assert (
        plugins.MODULE_PREFIX + "site_permtest" not in sys.modules
    )  # never imported, so never executed


@as_root
@pytest.mark.parametrize("target", ["site_permtest.py", "."])
def test_site_check_not_owned_by_root_is_refused(checks_d, target):
    path = os.path.normpath(str(checks_d / target))
    os.chown(path, OTHER_UID, 0)
    with pytest.raises(
        plugins.PluginError, match="site check %s: owned by uid %d, not root" % (path, OTHER_UID)
    ):
        plugins.load_site_checks(str(checks_d))


def test_secure_site_check_loads(checks_d):
    assert plugins.load_site_checks(str(checks_d)) == [plugins.MODULE_PREFIX + "site_permtest"]


def test_bytecode_planted_in_checks_d_pycache_never_runs(checks_d, tmp_path):
    """checks.d/__pycache__ is nobody's business: only the .py and checks.d were checked, and Python's
    loader preferred a matching .pyc from there, so a user who can write __pycache__ ran code as root in
    every prolog. The site check must run from its (checked) source, never from bytecode."""
    import importlib.util
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    marker = tmp_path / "pwned"
    source = checks_d / "site_permtest.py"
    evil = compile(
        "open(%r, 'w').write('ran as root')\n" % str(marker) + SITE_CHECK, str(source), "exec"
    )
    info = os.stat(str(source))
    pycache = checks_d / "__pycache__"
    pycache.mkdir()
    os.chmod(str(pycache), 0o777)  # what a careless install (or a shared /etc) leaves behind
    planted = importlib.util.cache_from_source(str(source))
    with open(
        planted, "wb"
    ) as handle:  # a valid .pyc for the source's mtime and size: the loader trusts it
        handle.write(bytes(_code_to_timestamp_pyc(evil, info.st_mtime, info.st_size)))
    if os.geteuid() == 0:
        os.chown(planted, OTHER_UID, OTHER_UID)
    assert plugins.load_site_checks(str(checks_d)) == [plugins.MODULE_PREFIX + "site_permtest"]
    assert not marker.exists(), "the planted bytecode ran"
    assert os.listdir(str(pycache)) == [
        os.path.basename(planted)
    ]  # and nothing of ours was written there


def _cli(args, env):
    return subprocess.run(
        [sys.executable, "-m", "slurm_hooks"] + args,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def test_hooks_fail_open_and_check_exits_3_on_an_insecure_config(etc, tmp_path):
    """What slurmd and an admin see: the prolog logs the refusal and exits 0 (never drains because of
    our own configuration problem); `slurm-hooks check` exits 3 (UNKNOWN) with the same message."""
    os.chmod(etc / "conf.d" / "10-site.toml", 0o666)
    env = {
        "PATH": os.defpath,
        "SLURM_HOOKS_CONFIG": str(etc / "config.toml"),
        "SLURM_HOOKS_CHECKS_DIR": "",
        "PYTHONPATH": REPO,
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "node1",
    }
    expected = "%s: group- or world-writable (mode 0666)" % (etc / "conf.d" / "10-site.toml")
    done = _cli(["prolog"], env)
    assert done.returncode == 0 and expected in done.stderr and "failing open" in done.stderr, (
        done.stderr
    )
    done = _cli(["check", "system.kernel"], env)
    assert done.returncode == 3 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
