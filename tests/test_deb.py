"""The .deb, for real on this Debian machine: built by tools/build_deb.sh (dpkg-buildpackage), installed
with `apt-get install ./slurm-hooks_*.deb` (dependencies from the distribution), its INSTALLED
/etc/slurm/prolog.d and epilog.d scripts run by a real slurmd for a real job, upgraded over an edited
config, then removed and purged as Debian policy says.

Everything installed goes into a root of its own, never into the host (tests/debroot.py): an overlay
of this machine's / whose writes land on a tmpfs, mounted under the test's temp directory with its
own /proc, /sys, /dev, /run and /tmp; apt-get, dpkg and the installed hooks run in it through
chroot, and slurmd (the host's) runs the installed prolog and epilog inside it through a chroot
wrapper. The host's /usr, /etc and package list stay as they were: the last test compares
`dpkg-query -W` before and after. Needs root, apt-get, dpkg-buildpackage with debhelper and
dh-python (.ci/deb.sh installs them), overlayfs and Slurm (.ci/install-slurm.sh); missing ones
skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.debroot import DebRoot, RootError, host_packages
from tests.helpers import REPO
from tests.slurmcluster import SlurmCluster, require_slurm

BUILD_SCRIPT = os.path.join(REPO, "tools", "build_deb.sh")
SITE = "/usr/lib/python3/dist-packages"
# paths inside the root
CONFIG = "/etc/slurm-hooks/config.toml"
DROP_IN = "/etc/slurm-hooks/conf.d/00-deb-test.toml"  # the admin's file: purge must leave it
PROLOG = "/etc/slurm/prolog.d/50-slurm-hooks"
EPILOG = "/etc/slurm/epilog.d/50-slurm-hooks"
STATE_DIR, LOG_DIR = "/var/lib/slurm-hooks", "/var/log/slurm-hooks"
RECORDS_DIR = LOG_DIR + "/jobs"  # the default [records] dir: where sites mount a shared file system
APT = ["apt-get", "-y", "-q"]
ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
# what an install into the host would have made: none of it may appear there
HOST_PATHS = ("/usr/bin/slurm-hooks", SITE + "/slurm_hooks", "/etc/slurm-hooks", PROLOG)

pytestmark = pytest.mark.slurm


def _run(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 600)
    kwargs.setdefault("env", ENV)
    return subprocess.run(argv, **kwargs)


def _require_environment() -> None:
    missing = [
        tool
        for tool in ("apt-get", "dpkg", "dpkg-buildpackage", "dh", "dh_python3")
        if shutil.which(tool) is None
    ]
    problem = ""
    if missing:
        problem = (
            "missing %s (apt-get install dpkg-dev debhelper dh-python; see .ci/deb.sh)"
            % ", ".join(missing)
        )
    elif os.geteuid() != 0:
        problem = "installing a .deb needs root"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(".deb tests cannot run in CI: " + problem, pytrace=False)
        pytest.skip(problem)
    require_slurm()


def _status(root: DebRoot) -> str:
    done = root.run(["dpkg-query", "-W", "-f", "${Status}", "slurm-hooks"])
    return done.stdout.strip() if done.returncode == 0 else "not-installed"


def _apt(root: DebRoot, *args: str) -> subprocess.CompletedProcess:
    done = root.run(APT + list(args))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return done


def _patched_tree(directory: Path, version: str, config_note: str) -> str:
    """This repository's files (as the sdist has them) with __version__ and the default config changed."""
    done = _run(["git", "-C", REPO, "ls-files", "-co", "--exclude-standard"])
    tree = directory / "tree"
    for name in done.stdout.splitlines():
        source = Path(REPO, name)
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(str(source), str(tree / name))
    init = tree / "slurm_hooks" / "__init__.py"
    init.write_text(
        re.sub(r'__version__ = "[^"]+"', '__version__ = "%s"' % version, init.read_text())
    )
    with open(str(tree / "packaging" / "config.toml"), "a") as handle:
        handle.write("# %s\n" % config_note)
    with open(str(tree / "prolog.d" / "50-slurm-hooks"), "a") as handle:
        handle.write("# %s\n" % config_note)
    return str(tree)


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Dict[str, object]:
    """v1 (this tree, with the unit tests run against the installed copy) and v2 (a later version whose
    default config and prolog changed), built in parallel."""
    _require_environment()
    from slurm_hooks import __version__

    base = tmp_path_factory.mktemp("debs")
    v2 = __version__ + ".post1"
    argv = ["bash", BUILD_SCRIPT, "--python", sys.executable]
    started = time.monotonic()
    running = {
        "v1": subprocess.Popen(
            argv + ["--out", str(base / "v1")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        "v2": subprocess.Popen(
            argv
            + [
                "--nocheck",
                "--out",
                str(base / "v2"),
                "--source",
                _patched_tree(base / "v2-src", v2, "changed in v2"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    }
    built: Dict[str, object] = {"versions": {"v1": __version__, "v2": v2}}
    for name, process in running.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, "build_deb.sh %s failed:\n%s" % (name, err[-6000:])
        built[name] = Path(out.split()[-1])
        assert built[name].exists(), out
    print(
        "\n.deb builds v1 (with tests) + v2, in parallel: %.1f s" % (time.monotonic() - started),
        file=sys.stderr,
    )
    return built


@pytest.fixture(scope="module")
def host_before():
    """The host's package list before anything of this module ran (compared by the last test)."""
    return host_packages(), {p: os.path.exists(p) for p in HOST_PATHS}


@pytest.fixture(scope="module")
def root(debs, host_before, tmp_path_factory):
    """A Debian root of its own (tests/debroot.py) with the two .debs in its /tmp; undone at the end."""
    deb_root = DebRoot(tmp_path_factory.mktemp("deb-root"))
    try:
        deb_root.open()
    except RootError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(".deb tests cannot run in CI: %s" % exc, pytrace=False)
        pytest.skip(str(exc))
    try:
        for name in ("v1", "v2"):
            shutil.copy2(str(debs[name]), str(deb_root / "/tmp"))
        deb_root.debs = {name: "/tmp/" + debs[name].name for name in ("v1", "v2")}
        deb_root.versions = debs["versions"]
        yield deb_root
    finally:
        deb_root.close()


def _field(deb: Path, name: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), name]).stdout.strip()


# -- the package, not installed -------------------------------------------------------------------


def test_dependencies_come_from_the_distribution_and_pyproject(debs):
    from slurm_hooks.core.config_files import toml_loads

    depends = [d.strip() for d in _field(debs["v1"], "Depends").split(",")]
    assert "python3 (>= 3.9)" in depends and "logrotate" in depends
    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        declared = toml_loads(handle.read())["project"]["dependencies"]
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")
        if name == "nvidia-ml-py":
            assert not [d for d in depends if "nvidia" in d or "pynvml" in d]  # bundled
        elif name == "toml":  # python_version < '3.11': the stdlib's tomllib after
            assert "python3-toml | python3 (>> 3.11)" in depends
        else:
            assert "python3-" + name in depends, (name, depends)
    assert _field(debs["v1"], "Architecture") == "all"


def test_contents_conffiles_and_modes(debs, tmp_path):
    listing = _run(["dpkg-deb", "-c", str(debs["v1"])]).stdout.splitlines()
    entries = {line.split()[-1].lstrip(".").rstrip("/") or "/": line.split()[0] for line in listing}
    assert (
        entries["/var/lib/slurm-hooks"] == "drwx------"
        and entries["/var/log/slurm-hooks"] == "drwxr-x---"
    )
    for script in (
        "/usr/bin/slurm-hooks",
        str(PROLOG),
        "/etc/slurm/epilog.d/50-slurm-hooks",
        "/usr/libexec/slurm-hooks/healthcheck",
    ):
        assert entries[script] == "-rwxr-xr-x"
    assert SITE + "/slurm_hooks/_vendor/pynvml.py" in entries
    assert not [
        p for p in entries if p.endswith(".pyc") or "__pycache__" in p
    ]  # py3compile makes them on the node
    assert not [p for p in entries if re.search(r"/python3\.\d+/", p)]  # no version-specific path
    assert (
        "/usr/share/doc/slurm-hooks/slurm.conf.snippet" in entries
        and "/usr/share/man/man1/slurm-hooks.1.gz" in entries
    )
    assert {p for p in entries if p.startswith("/usr/share/doc/slurm-hooks/admin.md")} == {
        "/usr/share/doc/slurm-hooks/admin.md.gz"
    }  # dh_compress: docs over 4 kB, as policy 12.3 asks
    _run(["dpkg-deb", "-e", str(debs["v1"]), str(tmp_path / "control")])
    conffiles = (tmp_path / "control" / "conffiles").read_text().split()
    # Debian: every file shipped in /etc is a conffile, hook scripts included (an unedited one is
    # replaced on upgrade like any unedited conffile)
    assert sorted(conffiles) == sorted(
        [
            "/etc/logrotate.d/slurm-hooks",
            str(CONFIG),
            str(PROLOG),
            "/etc/slurm/epilog.d/50-slurm-hooks",
        ]
    )
    postinst = (tmp_path / "control" / "postinst").read_text()
    assert "py3compile -p slurm-hooks" in postinst
    # the straggler report's timer (an admin host's job) is shipped, neither enabled nor started by install:
    # the only `enable` re-creates the symlinks of a timer the admin had enabled before an upgrade
    units = {p.rsplit("/", 1)[-1]: p for p in entries if "/systemd/system/slurm-hooks" in p}
    assert sorted(units) == [
        "slurm-hooks-qualify.service",
        "slurm-hooks-qualify.timer",
        "slurm-hooks-stragglers.service",
        "slurm-hooks-stragglers.timer",
    ], units
    assert all(entries[p] == "-rw-r--r--" for p in units.values())
    assert "deb-systemd-invoke" not in postinst and "systemctl" not in postinst
    assert (
        "if deb-systemd-helper --quiet was-enabled 'slurm-hooks-stragglers.timer'; then" in postinst
    )
    assert "if deb-systemd-helper --quiet was-enabled 'slurm-hooks-qualify.timer'; then" in postinst
    postrm = (tmp_path / "control" / "postrm").read_text()
    assert "rm -rf /var" not in postrm and "mountpoint -q" in postrm  # never across a mount


def test_source_package_is_complete(debs, tmp_path):
    """The .dsc unpacks with dpkg-source into a tree that has the debian/ directory and the bundled pynvml."""
    dsc = next(debs["v1"].parent.glob("*.dsc"))
    done = _run(["dpkg-source", "-x", str(dsc), str(tmp_path / "src")])
    assert done.returncode == 0, done.stderr
    for path in (
        "debian/rules",
        "debian/control",
        "debian/changelog",
        "debian/vendor/pynvml.py",
        "PKG-INFO",
        "slurm_hooks/__init__.py",
        "prolog.d/50-slurm-hooks",
    ):
        assert (tmp_path / "src" / path).is_file(), path
    orig = next(debs["v1"].parent.glob("*.orig.tar.gz"))
    with tarfile.open(str(orig)) as archive:
        assert any(name.endswith("/PKG-INFO") for name in archive.getnames())


# -- installed in a root of its own ---------------------------------------------------------------


def _cli(root: DebRoot, *args: str) -> subprocess.CompletedProcess:
    """The installed /usr/bin/slurm-hooks in the root, with the PATH a login shell has."""
    return root.run(["/usr/bin/slurm-hooks"] + list(args), env={"PATH": "/usr/bin:/bin"})


def test_apt_installs_it_and_a_real_slurmd_runs_the_installed_prolog_for_a_real_job(root, tmp_path):
    _apt(root, "install", root.debs["v1"])
    assert _status(root) == "install ok installed"
    # py3compile byte-compiled the code for THIS node's python3 in postinst
    tag = root.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.implementation.cache_tag)"]
    ).stdout.strip()
    assert list(
        (root / SITE).joinpath("slurm_hooks", "cli", "__pycache__").glob("main.%s.pyc" % tag)
    )
    version = root.run(["/usr/bin/slurm-hooks", "--version"], env={})
    assert version.stdout.strip() == "slurm-hooks " + root.versions["v1"], version.stderr
    check = _cli(root, "config", "check")
    assert check.returncode == 0 and CONFIG in check.stdout, check.stderr
    assert not (
        root / "/etc/systemd/system/timers.target.wants/slurm-hooks-stragglers.timer"
    ).exists()
    stragglers = _cli(root, "report", "--stragglers", "/tmp")
    assert stragglers.returncode == 0 and "no straggler suspects" in stragglers.stdout, (
        stragglers.stderr
    )
    # a fresh install drains nothing until the admin says so (issue 25)
    mode = _cli(root, "mode")
    assert mode.returncode == 0 and mode.stdout.startswith("mode: observe ("), mode.stdout

    # The admin's own drop-in (purge must leave it). The packaged config observes: the checks run on
    # this (shared, GPU-less) host and decide, nothing is drained, whatever the host's health.
    (root / DROP_IN).write_text('[general]\nlog_level = "info"\n')
    hooks = tmp_path / "hooks"
    cluster = SlurmCluster(
        tmp_path / "cluster",
        prolog=str(root.wrapper(PROLOG, hooks / "prolog")),
        epilog=str(root.wrapper(EPILOG, hooks / "epilog")),
    )
    cluster.start()
    try:
        job = cluster.sbatch(wrap="true")
        assert (
            cluster.wait_job(job, states=("COMPLETED", "FAILED", "CANCELLED"), timeout=60)
            == "COMPLETED"
        )
        log = root / (LOG_DIR + "/slurm-hooks.log")
        deadline = time.monotonic() + 30  # the epilog runs after the job is reported complete
        while time.monotonic() < deadline:
            lines = log.read_text().splitlines() if log.exists() else []
            mine = [line for line in lines if " job=%d " % job in line]
            if {"prolog", "epilog"} <= {
                m.group(1) for m in (re.search(r" context=(\w+) ", x) for x in mine) if m
            }:
                break
            time.sleep(0.2)
        else:
            pytest.fail(
                "slurmd did not run the installed hooks for job %d:\n%s\n%s"
                % (job, "\n".join(lines[-10:]), cluster.logs(20))
            )
        assert all("fail-open" not in line and "decision=" in line for line in mine), mine
    finally:
        cluster.stop()


def test_upgrade_keeps_the_edited_config(root):
    assert _status(root) == "install ok installed"
    config = root / CONFIG
    packaged = config.read_text()
    edited = packaged + '\n[drain]\nreason_prefix = "site-hooks:"\n'
    config.write_text(edited)
    state = root / (STATE_DIR + "/node-state.json")
    state.write_text("{}")
    # what unattended upgrades use: keep a changed conffile, install the default beside it
    _apt(
        root,
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
        "install",
        root.debs["v2"],
    )
    assert config.read_text() == edited
    assert Path(str(config) + ".dpkg-dist").read_text() == packaged + "# changed in v2\n"
    prolog = root / PROLOG
    assert prolog.read_text().endswith("exit 0\n# changed in v2\n")  # unedited conffile: replaced
    assert state.exists() and (root / DROP_IN).exists()
    version = root.run(["/usr/bin/slurm-hooks", "--version"], env={})
    assert version.stdout.strip() == "slurm-hooks " + root.versions["v2"]
    check = _cli(root, "config", "check")
    assert check.returncode == 0 and 'reason_prefix = "site-hooks:"' in check.stdout, check.stderr


def test_an_upgrade_from_a_release_that_enforced_by_default_keeps_enforce(root):
    """The release before the `mode` command enforced by default and this one observes: a node that
    never set a mode must go on draining after the upgrade (preinst writes the drop-in `mode`
    writes), while a fresh install, an upgrade from a release that has the command, and a node that
    set a mode itself get nothing."""
    assert _status(root) == "install ok installed"
    keep = root / "/etc/slurm-hooks/conf.d/99-mode.toml"
    assert not keep.exists()  # the v1 install and the v1 -> v2 upgrade wrote nothing
    mode_verb = (root / SITE).joinpath("slurm_hooks", "cli", "mode_verbs.py")
    site_mode = root / "/etc/slurm-hooks/conf.d/10-site-mode.toml"
    site_mode.write_text('[ general ]\n"mode" = "observe"\n')
    mode_verb.unlink()  # the installed code now looks like the release before
    done = root.run(["dpkg", "-i", root.debs["v2"]])
    assert done.returncode == 0, done.stderr
    assert not keep.exists() and "kept mode" not in done.stderr  # the site chose: left alone
    site_mode.unlink()
    mode_verb.unlink()
    done = root.run(["dpkg", "-i", root.debs["v2"]])
    assert done.returncode == 0, done.stderr
    assert "kept mode = enforce from the release before" in done.stderr
    assert 'mode = "enforce"' in keep.read_text() and keep.stat().st_mode & 0o777 == 0o644
    shown = _cli(root, "mode")
    assert shown.returncode == 0 and "mode: enforce" in shown.stdout, shown.stdout + shown.stderr
    assert "99-mode.toml" in shown.stdout
    keep.unlink()


def test_remove_keeps_configuration_and_purge_removes_what_the_package_made(root):
    rotated = root / (LOG_DIR + "/slurm-hooks.log.1")
    rotated.write_text("rotated by logrotate\n")
    local_record = root / (RECORDS_DIR + "/node1/41.json")  # this node's record, on the local disk
    local_record.parent.mkdir(parents=True, exist_ok=True)  # the real job above wrote its own
    local_record.write_text("{}")
    _apt(root, "remove", "slurm-hooks")
    assert _status(root) == "deinstall ok config-files"
    assert not (root / "/usr/bin/slurm-hooks").exists()
    assert not (root / (SITE + "/slurm_hooks")).exists()  # bytecode too
    for kept in (CONFIG, PROLOG, "/etc/logrotate.d/slurm-hooks"):  # conffiles stay
        assert (root / kept).exists(), kept
    assert (root / (STATE_DIR + "/node-state.json")).exists() and rotated.exists()

    _apt(root, "purge", "slurm-hooks")
    assert _status(root) == "not-installed"
    for gone in (
        CONFIG,
        CONFIG + ".dpkg-dist",
        PROLOG,
        "/etc/logrotate.d/slurm-hooks",
        STATE_DIR,
        LOG_DIR,
        "/usr/libexec/slurm-hooks",
        "/usr/share/doc/slurm-hooks",
    ):
        assert not (root / gone).exists(), "%s survived the purge" % gone
    assert (root / DROP_IN).exists()  # the administrator's own file: not the package's to delete


def test_purge_never_crosses_a_mount_point(root):
    """A shared records file system mounted at the default records directory (every node's records)
    and a bind mount of the same disk into the state directory (which `find -xdev` would not see):
    purge removes this node's local files and leaves both mounts and what is in them. Before: the
    postrm's `rm -rf` descended into the mounts and deleted the cluster's records."""
    _apt(root, "install", root.debs["v1"])
    shared = root / RECORDS_DIR
    shared.mkdir()
    root.mount(["-t", "tmpfs", "tmpfs", str(shared)])
    sentinel = shared / "gpu-b07" / "9001.json"  # another node's record on the shared file system
    sentinel.parent.mkdir()
    sentinel.write_text('{"job": 9001}\n')
    source = root / "/srv/site-state"
    source.mkdir(parents=True)
    (source / "keep.json").write_text("{}")
    bound = root / (STATE_DIR + "/site")
    bound.mkdir()
    root.mount(["--bind", str(source), str(bound)])
    local = [root / (STATE_DIR + "/node-state.json"), root / (LOG_DIR + "/slurm-hooks.log.2.gz")]
    for path in local:
        path.write_text("local\n")

    done = _apt(root, "purge", "slurm-hooks")
    assert _status(root) == "not-installed"
    assert sentinel.read_text() == '{"job": 9001}\n', "purge deleted the shared records"
    assert (bound / "keep.json").exists() and (source / "keep.json").exists()
    assert not [p for p in local if p.exists()], "purge left the package's own files"
    assert "is a mount point: left as it is" in done.stdout + done.stderr


def test_the_host_is_untouched(root, host_before):
    """Nothing of this module landed in the host: the same package list, no slurm-hooks file."""
    packages, existed = host_before
    assert host_packages() == packages
    assert {p: os.path.exists(p) for p in HOST_PATHS} == existed
