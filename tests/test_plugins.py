"""Site checks dropped into checks.d (slurm_hooks/core/plugins.py), starting with docs/admin.md's example,
which must load and behave exactly as the guide says."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from slurm_hooks.core import plugins
from slurm_hooks.core.config import validate
from slurm_hooks.core.config_files import INSECURE_OVERRIDE_ENV
from slurm_hooks.core.runner import run_checks, select_checks
from slurm_hooks.hw.host import Host
from slurm_hooks.registry import REGISTRY, load_builtin_checks
from slurm_hooks.result import Action, Status
from tests.helpers import REPO


def admin_guide_example() -> str:
    with open(os.path.join(REPO, "docs", "admin.md")) as handle:
        text = handle.read()
    match = re.search(r"<!-- site-check-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/admin.md lost its site check example"
    return match.group(1)


@pytest.fixture
def checks_dir(tmp_path, monkeypatch):
    """An empty drop-in directory; whatever the test loads from it is unregistered afterwards."""
    directory = tmp_path / "checks.d"
    directory.mkdir(mode=0o755)
    if os.geteuid() != 0:  # files we create are not root's: only root can test the real rule
        monkeypatch.setenv(INSECURE_OVERRIDE_ENV, "1")
    registry = load_builtin_checks()
    before_checks, before_gatherers = dict(registry.checks), dict(registry.gatherers)
    before_modules = set(sys.modules)
    yield directory
    registry.checks.clear()
    registry.checks.update(before_checks)
    registry.gatherers.clear()
    registry.gatherers.update(before_gatherers)
    for name in set(sys.modules) - before_modules:
        if name.startswith(plugins.MODULE_PREFIX):
            del sys.modules[name]


def hca_tree(write_tree, versions):
    return write_tree(
        {
            "sys/class/infiniband/%s/fw_ver" % hca: version + "\n"
            for hca, version in versions.items()
        }
    )


def test_admin_guide_example_loads_and_judges(checks_dir, write_tree):
    (checks_dir / "site_hca_firmware.py").write_text(admin_guide_example())
    assert plugins.load_site_checks(str(checks_dir)) == ["slurm_hooks_site.site_hca_firmware"]
    spec = REGISTRY.checks["site.hca-firmware"]
    assert spec.contexts == frozenset({"prolog", "health", "manual"})
    root = hca_tree(write_tree, {"mlx5_0": "28.39.1002", "mlx5_1": "28.36.1010"})
    config = validate(REGISTRY, {"checks": {"site.hca-firmware": {"allowed": ["28.39.1002"]}}})
    report = run_checks(
        REGISTRY, config, Host(root), "manual", select_checks(REGISTRY, "manual", ["site"])
    )
    (result,) = report.results()
    assert (result.status, result.component, result.action) == (
        Status.FAIL,
        "hca:mlx5_1",
        Action.DRAIN,
    )
    assert result.summary == "firmware 28.36.1010 is not qualified"
    assert result.details == {"wrong": {"mlx5_1": "28.36.1010"}}

    config = validate(
        REGISTRY, {"checks": {"site.hca-firmware": {"allowed": ["28.39.1002", "28.36.1010"]}}}
    )
    report = run_checks(
        REGISTRY, config, Host(root), "manual", select_checks(REGISTRY, "manual", ["site"])
    )
    assert [(r.status, r.summary) for r in report.results()] == [
        (Status.OK, "2 HCAs on qualified firmware")
    ]
    # unconfigured: SKIP, and a bad parameter type is a config error naming the key
    report = run_checks(REGISTRY, validate(REGISTRY, {}), Host(root), "manual", [spec])
    assert [r.status for r in report.results()] == [Status.SKIP]
    with pytest.raises(Exception, match=r'site.hca-firmware"\] allowed'):
        validate(REGISTRY, {"checks": {"site.hca-firmware": {"allowed": "28.39.1002"}}})


def test_files_load_in_name_order_and_helpers_are_skipped(checks_dir):
    for name, check in (("b_second.py", "site.second"), ("a_first.py", "site.first")):
        (checks_dir / name).write_text(
            "from slurm_hooks.registry import check\nfrom slurm_hooks.result import Result, Status\n"
            "@check(name=%r)\ndef c(params):\n    return Result(%r, Status.OK, 'fine')\n"
            % (check, check)
        )
    (checks_dir / "_helper.py").write_text(
        "raise RuntimeError('helpers are imported by checks, not loaded')\n"
    )
    (checks_dir / ".hidden.py").write_text("raise RuntimeError('never loaded')\n")
    (checks_dir / "notes.txt").write_text("not python")
    assert plugins.load_site_checks(str(checks_dir)) == [
        "slurm_hooks_site.a_first",
        "slurm_hooks_site.b_second",
    ]
    assert {"site.first", "site.second"} <= set(REGISTRY.checks)
    assert plugins.load_site_checks(str(checks_dir)) == [
        "slurm_hooks_site.a_first",
        "slurm_hooks_site.b_second",
    ]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("broken.py", "def oops(:\n", r"broken\.py: cannot load site check: SyntaxError"),
        (
            "needs.py",
            "import site_module_that_does_not_exist\n",
            r"needs\.py: cannot load site check: ModuleNotFoundError",
        ),
        (
            "dup.py",
            "from slurm_hooks.registry import check\n@check(name='system.cpu')\ndef c(params):\n    pass\n",
            r"dup\.py: cannot load site check: RegistryError: duplicate check name 'system.cpu'",
        ),
        (
            "my-check.py",
            "",
            r"my-check\.py: site check file names must be Python identifiers.*my_check\.py",
        ),
    ],
)
def test_a_bad_file_is_a_config_error_naming_it(checks_dir, name, content, message):
    (checks_dir / name).write_text(content)
    with pytest.raises(plugins.PluginError, match=message) as raised:
        plugins.load_site_checks(str(checks_dir))
    assert str(checks_dir / name) in str(raised.value)
    assert not [m for m in sys.modules if m.startswith(plugins.MODULE_PREFIX + name[:-3])]


def test_writable_or_foreign_files_are_refused(checks_dir, monkeypatch):
    monkeypatch.delenv(INSECURE_OVERRIDE_ENV, raising=False)
    path = checks_dir / "loose.py"
    path.write_text("LOADED = True\n")
    os.chmod(str(path), 0o666)
    with pytest.raises(
        plugins.PluginError, match=r"loose\.py: (group- or world-writable|owned by uid)"
    ):
        plugins.load_site_checks(str(checks_dir))
    assert plugins.MODULE_PREFIX + "loose" not in sys.modules


def test_directory_selection(monkeypatch, tmp_path):
    monkeypatch.delenv(plugins.CHECKS_DIR_ENV, raising=False)
    assert plugins.site_checks_dir() == "/etc/slurm-hooks/checks.d"
    monkeypatch.setenv(plugins.CHECKS_DIR_ENV, "")
    assert plugins.site_checks_dir() is None and plugins.load_site_checks() == []
    monkeypatch.setenv(plugins.CHECKS_DIR_ENV, str(tmp_path / "absent"))
    assert plugins.load_site_checks() == []


def test_cli_lists_site_checks_and_refuses_a_broken_one(tmp_path):
    """Through the registry: load_builtin_checks() loads the drop-ins (the CLI, the hooks)."""
    directory = tmp_path / "checks.d"
    directory.mkdir()
    (directory / "site_hca_firmware.py").write_text(admin_guide_example())
    env = dict(
        os.environ,
        SLURM_HOOKS_CHECKS_DIR=str(directory),
        SLURM_HOOKS_CONFIG=str(tmp_path / "none.toml"),
    )
    if os.geteuid() != 0:
        env[INSECURE_OVERRIDE_ENV] = "1"
    (tmp_path / "none.toml").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"^site\.hca-firmware +prolog,health,manual +HCAs run qualified firmware", done.stdout, re.M
    )
    (directory / "zz_broken.py").write_text("def oops(:\n")
    done = subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "check", "system.kernel"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 3
    assert (
        "configuration error" in done.stderr
        and "zz_broken.py: cannot load site check" in done.stderr
    )
