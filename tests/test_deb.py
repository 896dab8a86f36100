"""The .deb, for real on this Debian machine: built by tools/build_deb.sh (dpkg-buildpackage), installed
with `apt-get install ./slurm-hooks_*.deb` (dependencies from the distribution), its INSTALLED
/etc/slurm/prolog.d and epilog.d scripts run by a real slurmd for a real job, upgraded over an edited
config, then removed and purged as Debian policy says.

This installs into the host itself (/usr/bin, /usr/lib/python3/dist-packages, /etc): the module holds
a lock so two runs never overlap, purges a leftover of a crashed run first, and purges again at the
end whatever happened, so no slurm_hooks is left in the system's dist-packages. The packages it
pulled in from the distribution (python3-prometheus-client) stay, as apt leaves
them. Needs root, apt-get, dpkg-buildpackage with debhelper and dh-python (.ci/deb.sh installs
them) and Slurm (.ci/install-slurm.sh); missing ones skip locally and fail in CI (CI=true).
"""

from __future__ import annotations

import fcntl
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

from tests.helpers import REPO
from tests.slurmcluster import SlurmCluster, require_slurm

BUILD_SCRIPT = os.path.join(REPO, "tools", "build_deb.sh")
LOCK = "/run/lock/slurm-hooks-deb-test.lock"
SITE = "/usr/lib/python3/dist-packages"
CONFIG = Path("/etc/slurm-hooks/config.toml")
DROP_IN = Path("/etc/slurm-hooks/conf.d/00-deb-test.toml")  # the admin's file: purge must leave it
PROLOG = Path("/etc/slurm/prolog.d/50-slurm-hooks")
STATE_DIR, LOG_DIR = Path("/var/lib/slurm-hooks"), Path("/var/log/slurm-hooks")
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=300"]
ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

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


def _status() -> str:
    done = _run(["dpkg-query", "-W", "-f", "${Status}", "slurm-hooks"])
    return done.stdout.strip() if done.returncode == 0 else "not-installed"


def _purge() -> None:
    if _status() != "not-installed":
        done = _run(APT + ["purge", "slurm-hooks"])
        assert done.returncode == 0, done.stdout + done.stderr


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
def host(debs):
    """Exclusive use of this host's slurm-hooks package for the module; purged before and after."""
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _purge()
            yield debs
        finally:
            _purge()
            if DROP_IN.exists():
                DROP_IN.unlink()
            for directory in (
                "/etc/slurm-hooks/conf.d",
                "/etc/slurm-hooks",
                "/etc/slurm/prolog.d",
                "/etc/slurm/epilog.d",
            ):
                if os.path.isdir(directory) and not os.listdir(directory):
                    os.rmdir(directory)
            assert not os.path.exists(SITE + "/slurm_hooks"), (
                "a purge left slurm_hooks in the system's dist-packages"
            )


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
    assert sorted(units) == ["slurm-hooks-stragglers.service", "slurm-hooks-stragglers.timer"], (
        units
    )
    assert all(entries[p] == "-rw-r--r--" for p in units.values())
    assert "deb-systemd-invoke" not in postinst and "systemctl" not in postinst
    assert (
        "if deb-systemd-helper --quiet was-enabled 'slurm-hooks-stragglers.timer'; then" in postinst
    )
    assert (
        "rm -rf /var/lib/slurm-hooks /var/log/slurm-hooks"
        in (tmp_path / "control" / "postrm").read_text()
    )


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


# -- installed on this host -----------------------------------------------------------------------


def test_apt_installs_it_and_a_real_slurmd_runs_the_installed_prolog_for_a_real_job(host, tmp_path):
    done = _run(APT + ["install", str(host["v1"])])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert _status() == "install ok installed"
    # py3compile byte-compiled the code for THIS node's python3 in postinst
    tag = _run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.implementation.cache_tag)"]
    ).stdout.strip()
    assert list(Path(SITE, "slurm_hooks", "cli", "__pycache__").glob("main.%s.pyc" % tag))
    version = _run(["/usr/bin/slurm-hooks", "--version"], env={})
    assert version.stdout.strip() == "slurm-hooks " + host["versions"]["v1"], version.stderr
    check = _run(["/usr/bin/slurm-hooks", "config", "check"], env={"PATH": "/usr/bin:/bin"})
    assert check.returncode == 0 and str(CONFIG) in check.stdout, check.stderr
    assert not Path(
        "/etc/systemd/system/timers.target.wants/slurm-hooks-stragglers.timer"
    ).exists()  # disabled
    stragglers = _run(
        ["/usr/bin/slurm-hooks", "report", "--stragglers", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin"},
    )
    assert stragglers.returncode == 0 and "no straggler suspects" in stragglers.stdout, (
        stragglers.stderr
    )

    # Observe mode, as docs/admin.md rolls out: the checks run on this (shared, GPU-less) host and
    # decide, nothing is drained, so the job's outcome does not depend on the host's health.
    DROP_IN.write_text('[general]\nmode = "observe"\n')
    cluster = SlurmCluster(
        tmp_path / "cluster", prolog="/etc/slurm/prolog.d/*", epilog="/etc/slurm/epilog.d/*"
    )
    cluster.start()
    try:
        job = cluster.sbatch(wrap="true")
        assert (
            cluster.wait_job(job, states=("COMPLETED", "FAILED", "CANCELLED"), timeout=60)
            == "COMPLETED"
        )
        log = LOG_DIR / "slurm-hooks.log"
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


def test_upgrade_keeps_the_edited_config(host):
    assert _status() == "install ok installed"
    packaged = CONFIG.read_text()
    edited = packaged + '\n[drain]\nreason_prefix = "site-hooks:"\n'
    CONFIG.write_text(edited)
    state = STATE_DIR / "node-state.json"
    state.write_text("{}")
    # what unattended upgrades use: keep a changed conffile, install the default beside it
    done = _run(
        APT
        + [
            "-o",
            "Dpkg::Options::=--force-confdef",
            "-o",
            "Dpkg::Options::=--force-confold",
            "install",
            str(host["v2"]),
        ]
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert CONFIG.read_text() == edited
    assert Path(str(CONFIG) + ".dpkg-dist").read_text() == packaged + "# changed in v2\n"
    assert PROLOG.read_text().endswith("exit 0\n# changed in v2\n")  # unedited conffile: replaced
    assert state.exists() and DROP_IN.exists()
    version = _run(["/usr/bin/slurm-hooks", "--version"], env={})
    assert version.stdout.strip() == "slurm-hooks " + host["versions"]["v2"]
    check = _run(["/usr/bin/slurm-hooks", "config", "check"], env={"PATH": "/usr/bin:/bin"})
    assert check.returncode == 0 and 'reason_prefix = "site-hooks:"' in check.stdout, check.stderr


def test_remove_keeps_configuration_and_purge_removes_what_the_package_made(host):
    # A rotated log of our own: other test runs on a shared host append to (and may clean up) the live
    # slurm-hooks.log, so what remove keeps and purge deletes is shown with a file only this test touches.
    rotated = LOG_DIR / "slurm-hooks.log.1"
    rotated.write_text("rotated by logrotate\n")
    done = _run(APT + ["remove", "slurm-hooks"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert _status() == "deinstall ok config-files"
    assert not os.path.exists("/usr/bin/slurm-hooks") and not os.path.exists(
        SITE + "/slurm_hooks"
    )  # bytecode too
    assert (
        CONFIG.exists() and PROLOG.exists() and Path("/etc/logrotate.d/slurm-hooks").exists()
    )  # conffiles stay
    assert (STATE_DIR / "node-state.json").exists() and rotated.exists()

    done = _run(APT + ["purge", "slurm-hooks"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert _status() == "not-installed"
    for gone in (
        CONFIG,
        Path(str(CONFIG) + ".dpkg-dist"),
        PROLOG,
        Path("/etc/logrotate.d/slurm-hooks"),
        STATE_DIR,
        LOG_DIR,
        Path("/usr/libexec/slurm-hooks"),
        Path("/usr/share/doc/slurm-hooks"),
    ):
        assert not gone.exists(), "%s survived the purge" % gone
    assert DROP_IN.exists()  # the administrator's own file: not the package's to delete
