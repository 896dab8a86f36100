"""The RPMs, built for real for each target (EL9, EL8 with python39) by tools/build_rpm.sh (sdist ->
rpmbuild -ba), inspected (requires, file list, flags, bytecode, rpmlint), installed into a scratch
root laid out like an EL node whose 3.9 interpreter runs the INSTALLED prolog, epilog and health
check with nothing but the RPM's files and its declared dependencies (tests/elroot.py), rebuilt
from the source RPM, and upgraded over an edited config.

Needs rpmbuild, rpm2cpio, cpio and rpmlint (Debian: apt-get install rpm cpio rpmlint; .ci/rpm.sh
does it), a CPython 3.9 (pyenv's here; tests/elroot.py says where it looks), unshare and chroot,
and root (rpm --root writes root-owned files, chroot). Anything missing skips the module locally
and fails it in CI (CI=true), so CI can never go green without having built and run the packages.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests import elroot
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # builds the RPMs and EL roots

BUILD_SCRIPT = os.path.join(REPO, "tools", "build_rpm.sh")
RPMLINT_CONFIG = os.path.join(REPO, "packaging", "rpmlint.toml")
FAKE_DRIVER_VERSION = "550.54.15"  # tests/fakenode/defaults.py: proves the fake library answered
SITELIB = (
    "/usr/lib/python3.9/site-packages"  # both targets: EL9's python3 and EL8's python39 are 3.9
)
# What each target's RPM must look like: the interpreter its scripts name and its package prefix.
TARGETS = {
    "el9": {"python": "/usr/bin/python3", "prefix": "python3"},
    "el8": {"python": "/usr/bin/python3.9", "prefix": "python39"},
}
# The rpmlint messages issue 15 named; they must never appear, and no filter may hide them.
RPMLINT_MUST_NOT_SAY = (
    "no-changelogname-tag",
    "no-url-tag",
    "invalid-url URL",
    "missing-dependency-to-logrotate",
    "manpage-not-compressed",
    "description-line-too-long",
)
JOB_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_USER": "root",
    "SLURM_JOB_UID": "0",
    "SLURMD_NODENAME": "node1",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}  # what slurmd 22.05 gives a prolog (no PATH)


def _require_environment() -> str:
    """The CPython 3.9 to run the installed packages with; skips (fails in CI) what is missing."""
    missing = [
        tool
        for tool in ("rpmbuild", "rpm", "rpm2cpio", "cpio", "rpmlint", "unshare", "chroot")
        if shutil.which(tool) is None
    ]
    problem = ""
    python39 = elroot.find_python39()
    if missing:
        problem = (
            "missing %s (Debian: apt-get install rpm cpio rpmlint; see .ci/rpm.sh)"
            % ", ".join(missing)
        )
    elif os.geteuid() != 0:
        problem = "rpm --root installs and chroot need root"
    elif python39 is None:
        problem = "no CPython 3.9 (EL9's and EL8-python39's version) here: see tests/elroot.py"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail("RPM tests cannot run in CI: " + problem, pytrace=False)
        pytest.skip(problem)
    return python39


def _run(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 300)
    return subprocess.run(argv, **kwargs)


def _build_argv(source: str, out: Path, target: str, check: bool) -> List[str]:
    argv = [
        "bash",
        BUILD_SCRIPT,
        "--target",
        target,
        "--source",
        source,
        "--out",
        str(out),
        "--python",
        sys.executable,
    ]
    return argv + ([] if check else ["--nocheck"])


def _rpms(stdout: str) -> Tuple[Path, Path]:
    paths = [Path(line) for line in stdout.split()]
    binary = [p for p in paths if p.name.endswith(".noarch.rpm")]
    source_rpm = [p for p in paths if p.name.endswith(".src.rpm")]
    assert len(binary) == 1 and len(source_rpm) == 1, stdout
    return binary[0], source_rpm[0]


def _query(rpm_file: Path, fmt: str) -> List[str]:
    done = _run(["rpm", "-qp", "--qf", fmt, str(rpm_file)])
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.split("\n") if line]


def _requires(rpm_file: Path) -> List[str]:
    return [
        " ".join(r.split())
        for r in _query(rpm_file, "[%{REQUIRENAME} %{REQUIREFLAGS:depflags} %{REQUIREVERSION}\\n]")
    ]


def _install(root: Path, rpm_file: Path, upgrade: bool = False) -> None:
    done = _run(
        [
            "rpm",
            "-U" if upgrade else "-i",
            "--root",
            str(root),
            "--nodeps",
            "--noscripts",
            str(rpm_file),
        ]
    )
    assert done.returncode == 0, done.stderr


def _unpack(rpm_file: Path, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        "rpm2cpio '%s' | cpio -idm --quiet" % rpm_file,
        shell=True,
        cwd=str(directory),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def python39() -> str:
    return _require_environment()


@pytest.fixture(scope="module")
def built(python39, tmp_path_factory) -> Dict[str, dict]:
    """Both targets, built in parallel: el9 with %check (the unit tests against the buildroot), el8 without
    (the same tests under the same interpreter would prove nothing new)."""
    out = tmp_path_factory.mktemp("rpms")
    started = time.monotonic()
    running = {
        target: subprocess.Popen(
            _build_argv(REPO, out / target, target, check=target == "el9") + ["--verbose"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for target in TARGETS
    }
    result = {}
    for target, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, "build_rpm.sh --target %s failed:\n%s\n%s" % (
            target,
            stdout,
            stderr[-6000:],
        )
        binary, source_rpm = _rpms(stdout)
        result[target] = {"rpm": binary, "srpm": source_rpm, "log": stderr}
    print(
        "\nRPM builds el9 (with %%check) + el8, in parallel: %.1f s" % (time.monotonic() - started),
        file=sys.stderr,
    )
    return result


@pytest.fixture(scope="module")
def python_deps(built, python39, tmp_path_factory) -> Path:
    """The RPMs' declared Python dependencies, installed for 3.9 by pip (what python3-toml & co. are)."""
    wanted = set()
    for target in TARGETS:
        wanted.update(elroot.python_requirements(_requires(built[target]["rpm"])))
    directory = tmp_path_factory.mktemp("python39-deps")
    done = _run(
        [
            python39,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(directory),
        ]
        + sorted(wanted)
    )
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
def el_roots(built, python39, python_deps, tmp_path_factory) -> Dict[str, Path]:
    """target -> a scratch EL root with the target's RPM installed (see tests/elroot.py)."""
    roots = {}
    for target, spec in TARGETS.items():
        root = tmp_path_factory.mktemp("el-root-" + target)
        elroot.build(root, python39, [], python3_link=spec["python"] == "/usr/bin/python3")
        packages = set(elroot.python_requirements(_requires(built[target]["rpm"])))
        for entry in python_deps.iterdir():  # only what THIS target's RPM requires
            project = entry.name.split("-")[0].split(".")[0].lower()
            if project in packages or entry.name.lower().startswith(
                tuple(p + "-" for p in packages)
            ):
                destination = root / SITELIB.lstrip("/") / entry.name
                (shutil.copytree if entry.is_dir() else shutil.copy2)(str(entry), str(destination))
        _install(root, built[target]["rpm"])
        roots[target] = root
    return roots


@pytest.fixture(scope="module")
def files(built) -> Dict[str, str]:
    """Packaged path -> file flags as rpm prints them (c config, n noreplace, d doc, ...), el9."""
    rows = _query(built["el9"]["rpm"], "[%{FILENAMES} %{FILEFLAGS:fflags}\\n]")
    return {row.split(" ")[0]: row.split(" ", 1)[1] if " " in row else "" for row in rows}


@pytest.fixture(scope="module")
def example_node():
    from tests.fakenode import FakeNode

    node = FakeNode.build_temp("dgx-h100")
    yield node
    node.cleanup()


def outside_cli(root: Path, python39: str, args: List[str], extra_env=None, deps: Path = None):
    """ROOT/usr/bin/slurm-hooks run from outside ROOT by the 3.9 interpreter with -S (no site-packages of
    its own), ROOT's site-packages and DEPS on the path: for the fake node, which lives outside ROOT."""
    path = str(root) + SITELIB + (":" + str(deps) if deps else "")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": path,
        "LANG": "C.UTF-8",
        "SLURM_HOOKS_CHECKS_DIR": str(root / "etc/slurm-hooks/checks.d"),
    }
    env.update(extra_env or {})
    return _run([python39, "-S", str(root / "usr/bin/slurm-hooks")] + args, env=env, cwd=str(root))


def _pyc_digests(root: Path) -> Dict[str, bytes]:
    import hashlib

    base = root / SITELIB.lstrip("/") / "slurm_hooks"
    return {
        str(p.relative_to(base)): hashlib.sha256(p.read_bytes()).digest()
        for p in base.rglob("*.pyc")
    }


# -- the packages ---------------------------------------------------------------------------------


def test_build_ran_the_unit_tests_in_check_against_the_buildroot(built):
    log = built["el9"]["log"]
    assert "Executing(%check)" in log
    passed = re.search(r"^(\d+) passed", log, re.M)
    assert passed and int(passed.group(1)) >= 20, log[-3000:]
    # %check imported the buildroot copy, not the unpacked sources
    assert re.search(
        r"^rpm check: testing /.*/BUILDROOT/.*/site-packages/slurm_hooks/__init__\.py$", log, re.M
    )
    assert re.search(r"^Wrote: .*\.el9\.noarch\.rpm$", log, re.M)


def _require_tools(*tools: str) -> None:
    """Skip (with the reason) when a tool is missing; in CI (CI=true) fail instead."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        problem = "missing %s (Debian: apt-get install rpm; see .ci/rpm.sh)" % ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail("RPM tests cannot run in CI: " + problem, pytrace=False)
        pytest.skip(problem)


def test_a_build_without_a_target_on_a_non_rpm_host_is_refused(tmp_path):
    """On Debian the host's python3 (3.11 here) says nothing about the nodes': no silent host build."""
    _require_tools("rpm", "rpmbuild")
    if _run(["rpm", "-q", "--quiet", "--whatprovides", "python3"]).returncode == 0:
        pytest.skip("an RPM-based host builds for itself")
    done = _run(["bash", BUILD_SCRIPT, "--out", str(tmp_path), "--nocheck"])
    assert done.returncode == 2 and "pass --target el8 or el9" in done.stderr
    done = _run(["bash", BUILD_SCRIPT, "--target", "el7", "--out", str(tmp_path), "--nocheck"])
    assert done.returncode == 2 and "unknown --target el7 (known: el8 el9 )" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_nothing_of_the_build_hosts_python_in_the_package(built, target, python39, tmp_path):
    """python(abi) of the target only, files under the target's paths only, bytecode 3.9's only."""
    rpm_file = built[target]["rpm"]
    requires = _requires(rpm_file)
    assert [r for r in requires if r.startswith("python(abi)")] == ["python(abi) = 3.9"], requires
    host = "%d.%d" % sys.version_info[:2]
    if host != "3.9":
        assert not [r for r in requires if host in r], requires
    names = _query(rpm_file, "[%{FILENAMES}\\n]")
    versions = {match for name in names for match in re.findall(r"python(\d\.\d+)", name)}
    assert versions == {"3.9"}, versions
    assert not [n for n in names if "/site-packages/" in n and not n.startswith(SITELIB + "/")]
    compiled = [n for n in names if n.endswith(".pyc")]
    assert len(compiled) >= 30 and all(n.endswith(".cpython-39.pyc") for n in compiled), compiled[
        :5
    ]
    # ... and the bytes inside are 3.9's: the magic number of the 3.9 interpreter
    magic = _run(
        [python39, "-Ic", "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"]
    ).stdout.strip()
    _unpack(rpm_file, tmp_path)
    for name in compiled:
        assert (tmp_path / name.lstrip("/")).read_bytes()[:4].hex() == magic, name
    shebang = (tmp_path / "usr/bin/slurm-hooks").read_text().split("\n", 1)[0]
    assert shebang == "#!%s -s" % TARGETS[target]["python"]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_file_list(built, target):
    from slurm_hooks import __version__

    names = set(_query(built[target]["rpm"], "[%{FILENAMES}\\n]"))
    other = {path for path in names if not path.startswith(SITELIB)}
    docdir = "/usr/share/doc/slurm-hooks"  # EL's %_docdir_fmt: no version in the name (docs/admin.md says so)
    guides = [name for name in os.listdir(os.path.join(REPO, "docs")) if name.endswith(".md")]
    assert "admin.md" in guides
    docs = {path for path in other if path.startswith("/usr/share/doc/")}
    assert docs == {docdir} | {
        docdir + "/" + name for name in ["README.md", "slurm.conf.snippet"] + guides
    }
    assert {p for p in other if p.startswith("/usr/share/licenses/")} == {
        "/usr/share/licenses/slurm-hooks",
        "/usr/share/licenses/slurm-hooks/LICENSE",
    }
    assert {p for p in other if p.startswith("/usr/share/man/")} == {
        "/usr/share/man/man1/slurm-hooks.1.gz"
    }
    expected = {
        "/usr/bin/slurm-hooks",
        "/etc/slurm/prolog.d",
        "/etc/slurm/prolog.d/50-slurm-hooks",
        "/etc/slurm/epilog.d",
        "/etc/slurm/epilog.d/50-slurm-hooks",
        "/usr/libexec/slurm-hooks",
        "/usr/libexec/slurm-hooks/healthcheck",
        "/etc/slurm-hooks",
        "/etc/slurm-hooks/config.toml",
        "/etc/slurm-hooks/conf.d",
        "/etc/slurm-hooks/checks.d",
        "/etc/logrotate.d/slurm-hooks",
        "/var/lib/slurm-hooks",
        "/var/log/slurm-hooks",
        "/usr/lib/systemd/system/slurm-hooks-qualify.service",
        "/usr/lib/systemd/system/slurm-hooks-qualify.timer",
        "/usr/lib/systemd/system/slurm-hooks-stragglers.service",
        "/usr/lib/systemd/system/slurm-hooks-stragglers.timer",
    }
    assert {
        p
        for p in other
        if not p.startswith(("/usr/share/doc/", "/usr/share/man/", "/usr/share/licenses/"))
    } == expected
    python = {path[len(SITELIB) + 1 :] for path in names if path.startswith(SITELIB + "/")}
    distinfo = "slurm_hooks-%s.dist-info" % __version__
    assert {p for p in python if p.startswith(distinfo)} == {distinfo} | {
        distinfo + "/" + name
        for name in ("METADATA", "entry_points.txt", "top_level.txt", "INSTALLER")
    }
    sources = {
        str(p.relative_to(REPO))
        for p in Path(REPO, "slurm_hooks").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }
    assert sources and sources <= python, sorted(sources - python)
    assert "slurm_hooks/_vendor/pynvml.py" in python
    assert any(
        "slurm_hooks/cli/__pycache__/main." in p for p in python
    )  # byte-compiled at build time


def test_config_and_noreplace_flags_exactly_where_intended(files):
    flagged = {path: flags for path, flags in files.items() if "c" in flags or "n" in flags}
    # rpm keeps only 'noreplace' for a directory (a directory is never replaced or removed with files in it)
    # the hook scripts are in /etc and sites edit them: kept when edited, as the .deb's conffiles
    # (before: replaced, so a site's PATH edit for Slurm under /opt was silently undone)
    assert flagged == {
        "/etc/slurm-hooks/config.toml": "cn",
        "/etc/logrotate.d/slurm-hooks": "cn",
        "/etc/slurm-hooks/conf.d": "n",
        "/etc/slurm/prolog.d/50-slurm-hooks": "cn",
        "/etc/slurm/epilog.d/50-slurm-hooks": "cn",
    }
    for code in (
        "/usr/bin/slurm-hooks",
        "/usr/libexec/slurm-hooks/healthcheck",
    ):
        assert files[code] == "", "%s is code: it must be replaced on upgrade, not kept" % code
    documentation = [path for path in files if re.match(r"/usr/share/(doc/[^/]+|man/man1)/.", path)]
    assert len(documentation) >= 4 and all("d" in files[path] for path in documentation)
    assert files["/usr/share/licenses/slurm-hooks/LICENSE"] == "l"


def test_the_straggler_timer_is_shipped_disabled(built, files):
    """`report --stragglers` runs on an admin host from a systemd timer that no scriptlet enables or starts;
    on erase the timer is stopped (what %systemd_preun does)."""
    units = sorted(p for p in files if p.startswith("/usr/lib/systemd/system/"))
    assert units == [
        "/usr/lib/systemd/system/slurm-hooks-qualify.service",
        "/usr/lib/systemd/system/slurm-hooks-qualify.timer",
        "/usr/lib/systemd/system/slurm-hooks-stragglers.service",
        "/usr/lib/systemd/system/slurm-hooks-stragglers.timer",
    ]
    scripts = _run(["rpm", "-qp", "--scripts", str(built["el9"]["rpm"])]).stdout
    assert (
        "enable --now" not in scripts.replace("disable --now", "")
        and "systemctl start" not in scripts
    )
    assert (
        "disable --now slurm-hooks-stragglers.timer" in scripts
        and "disable --now slurm-hooks-qualify.timer" in scripts
        and "preuninstall scriptlet" in scripts
    )


def test_modes_and_owners(built):
    rows = _query(
        built["el9"]["rpm"], "[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME}:%{FILEGROUPNAME}\\n]"
    )
    modes = {row.split()[0]: (row.split()[1], row.split()[2]) for row in rows}
    assert {owner for _mode, owner in modes.values()} == {"root:root"}
    assert modes["/var/lib/slurm-hooks"][0] == "40700"
    assert modes["/var/log/slurm-hooks"][0] == "40750"
    assert (
        modes["/etc/slurm-hooks"][0] == "40755"
    )  # config dirs: root's and not group/world-writable
    assert modes["/etc/slurm-hooks/config.toml"][0] == "100644"
    for script in (
        "/usr/bin/slurm-hooks",
        "/etc/slurm/prolog.d/50-slurm-hooks",
        "/etc/slurm/epilog.d/50-slurm-hooks",
        "/usr/libexec/slurm-hooks/healthcheck",
    ):
        assert modes[script][0] == "100755"


def _declared_python_dependencies() -> List[str]:
    """pyproject's runtime dependencies that the RPM takes from the distribution (nvidia-ml-py is bundled;
    prometheus_client is optional there: a weak dependency)."""
    from slurm_hooks.core.config_files import toml_loads

    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        dependencies = toml_loads(handle.read())["project"]["dependencies"]
    names = [
        re.match(r"[A-Za-z0-9_.\-]+", d).group(0).lower().replace("_", "-") for d in dependencies
    ]
    return [n for n in names if n not in ("nvidia-ml-py", "prometheus-client")]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_dependencies(built, target):
    prefix, python = TARGETS[target]["prefix"], TARGETS[target]["python"]
    requires = {
        r for r in _requires(built[target]["rpm"]) if not r.startswith(("rpmlib(", "config("))
    }
    # Python 3.9 has no tomllib: the toml package is required on both targets
    expected = {"/bin/sh", python, "logrotate", "python(abi) = 3.9", "%s >= 3.9" % prefix} | {
        "%s-%s" % (prefix, name) for name in _declared_python_dependencies()
    }
    assert requires == expected
    recommends = _query(built[target]["rpm"], "[%{RECOMMENDNAME}\\n]")
    assert recommends == ["%s-prometheus_client" % prefix]
    provides = _query(built[target]["rpm"], "[%{PROVIDENAME} %{PROVIDEVERSION}\\n]")
    assert (
        "bundled(python3dist(nvidia-ml-py)) %s" % importlib.metadata.version("nvidia-ml-py")
        in provides
    )


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_rpmlint_is_clean(built, target):
    with open(RPMLINT_CONFIG) as handle:
        config = handle.read()
    filters = re.findall(r"^\s*'([^']+)',", config, re.M)
    assert filters and not [
        f for f in filters if any(re.search(f, " " + id_) for id_ in RPMLINT_MUST_NOT_SAY)
    ]
    for rpm_file in (built[target]["rpm"], built[target]["srpm"]):
        done = _run(["rpmlint", "-c", RPMLINT_CONFIG, str(rpm_file)])
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"\b0 errors, 0 warnings\b", done.stdout), done.stdout
        for message in RPMLINT_MUST_NOT_SAY:
            assert message not in done.stdout
    # and each of those would have been caught: the spec has what they look for
    spec = _query(built[target]["rpm"], "%{URL}\\n%{CHANGELOGNAME}\\n")
    assert spec[0].startswith("https://") and " <" in spec[1]


def test_source_rpm_is_self_contained_and_rebuilds(built, python39, tmp_path):
    """The SRPM's spec carries version, URL and changelog: `rpmbuild --rebuild` needs only the target's
    macros (on an EL node its own; here the el9 file) and gives the same package."""
    from slurm_hooks import __version__

    _unpack(built["el9"]["srpm"], tmp_path / "srpm")
    names = sorted(p.name for p in (tmp_path / "srpm").iterdir())
    assert names == sorted(["slurm-hooks.spec", "pynvml.py", "slurm_hooks-%s.tar.gz" % __version__])
    spec = (tmp_path / "srpm" / "slurm-hooks.spec").read_text()
    assert "%%global upstream_version %s\n" % __version__ in spec
    assert re.search(
        r"^%%changelog\n\* \w{3} \w{3} \d\d \d{4} .+ <.+> - %s-1\n" % re.escape(__version__),
        spec,
        re.M,
    )
    top = tmp_path / "top"
    done = _run(
        [
            "rpmbuild",
            "--rebuild",
            "--nodeps",
            "--without",
            "check",
            "--load",
            os.path.join(REPO, "packaging", "rpm-targets", "el9.macros"),
            "--define",
            "_topdir %s" % top,
            "--define",
            "build_python %s" % sys.executable,
            "--define",
            "bytecompile_python %s" % python39,
            str(built["el9"]["srpm"]),
        ]
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rebuilt = list(top.glob("RPMS/noarch/*.rpm"))
    assert [p.name for p in rebuilt] == [built["el9"]["rpm"].name]
    assert _query(rebuilt[0], "[%{FILENAMES}\\n]") == _query(
        built["el9"]["rpm"], "[%{FILENAMES}\\n]"
    )
    assert _requires(rebuilt[0]) == _requires(built["el9"]["rpm"])


# -- the installed package, run by Python 3.9 in an EL-shaped root ---------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_installed_hooks_run_with_only_the_package_and_its_dependencies(el_roots, target):
    """slurmd's view: the installed prolog.d/epilog.d scripts and the HealthCheckProgram, no PATH, in a root
    that holds Python 3.9, /bin/sh, the declared dependencies and the RPM. Each must decide (a decision
    line with slurm_calls=0), not fail open, and Python must find the shipped bytecode valid."""
    root = el_roots[target]
    (root / "etc/slurm-hooks/conf.d/00-observe.toml").write_text('[general]\nmode = "observe"\n')
    before = _pyc_digests(root)
    log = root / "var/log/slurm-hooks/slurm-hooks.log"
    for script, context, env in (
        ("/etc/slurm/prolog.d/50-slurm-hooks", "prolog", JOB_ENV),
        (
            "/etc/slurm/epilog.d/50-slurm-hooks",
            "epilog",
            dict(JOB_ENV, SLURM_SCRIPT_CONTEXT="epilog_slurmd"),
        ),
        ("/usr/libexec/slurm-hooks/healthcheck", "health", {"SLURMD_NODENAME": "node1"}),
    ):
        done = elroot.run_chrooted(root, [script], env)
        assert done.returncode == 0, done.stderr
        assert "broke" not in done.stderr and "Traceback" not in done.stderr, done.stderr
        lines = [line for line in log.read_text().splitlines() if " context=%s " % context in line]
        assert lines, "no %s decision in %s:\n%s" % (context, log, done.stderr)
        assert (
            "decision=" in lines[-1]
            and "fail-open" not in lines[-1]
            and "slurm_calls=0" in lines[-1]
        ), lines[-1]
        if context != "health":
            assert " job=4242 " in lines[-1]
    # the shipped .pyc files were valid for 3.9: nothing recompiled, nothing added
    assert _pyc_digests(root) == before and len(before) >= 30


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_installed_version_list_and_config(el_roots, target, registry):
    from slurm_hooks import __version__

    root = el_roots[target]

    def run(*args):
        return elroot.run_chrooted(root, ["/usr/bin/slurm-hooks"] + list(args), {"LANG": "C.UTF-8"})

    done = run("--version")
    assert (done.returncode, done.stdout.strip()) == (0, "slurm-hooks " + __version__), done.stderr
    done = run("list")
    assert done.returncode == 0, done.stderr
    assert {line.split()[0] for line in done.stdout.splitlines() if line.strip()} == set(
        registry.checks
    )
    done = run("config", "check")
    assert done.returncode == 0, (
        done.stderr
    )  # packaged file and directory pass the root-only ownership check
    assert "/etc/slurm-hooks/config.toml" in done.stdout


def test_installed_pynvml_is_the_bundled_copy(el_roots):
    """The EL root has no nvidia-ml-py: the RPM's bundled pynvml is what the installed code imports."""
    done = elroot.run_chrooted(
        el_roots["el9"],
        [
            "/usr/bin/python3",
            "-s",
            "-c",
            "from slurm_hooks.hw.pynvml_import import import_pynvml; "
            "print(import_pynvml().__file__)",
        ],
        {},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SITELIB + "/slurm_hooks/_vendor/pynvml.py"


def test_installed_check_against_the_example_node(el_roots, python39, example_node):
    """The installed tree, its packaged config and the bundled pynvml drive the fake GPU node, under 3.9."""
    root = el_roots["el9"]
    config = str(root / "etc/slurm-hooks/config.toml")
    done = outside_cli(
        root,
        python39,
        [
            "--config",
            config,
            "check",
            "--json",
            "--root",
            str(example_node.root),
            "--live",
            "nvml",
            "gpu.count",
            "system",
        ],
        extra_env=dict(example_node.env),
    )
    report = json.loads(done.stdout)
    by_name = {check["name"]: check for check in report["checks"]}
    gpu = by_name["gpu.count"]["results"][0]
    assert gpu["status"] == "OK", (
        "%s\n-- the installed code could not drive NVML; without an nvidia-ml-py of the "
        "node's own it needs the bundled pynvml, which slurm_hooks/hw/nvml.py must import "
        "through slurm_hooks.hw.pynvml_import.import_pynvml()" % gpu
    )
    assert FAKE_DRIVER_VERSION in gpu["summary"]  # the fake libnvidia-ml answered through pynvml
    assert by_name["system.cpu"]["status"] == "OK"
    assert report["root"] == str(example_node.root) and done.returncode == 0


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_installed_hook_scripts_run_the_installed_cli(el_roots, target):
    root = el_roots[target]
    for path, verb in (
        ("etc/slurm/prolog.d/50-slurm-hooks", "prolog"),
        ("etc/slurm/epilog.d/50-slurm-hooks", "epilog"),
        ("usr/libexec/slurm-hooks/healthcheck", "health"),
    ):
        text = (root / path).read_text()
        assert text.startswith("#!/bin/sh\n") and ("\n/usr/bin/slurm-hooks %s\n" % verb) in text


# -- upgrades -------------------------------------------------------------------------------------


def _patched_source(
    built, directory: Path, version: str, config_note: str = "", prolog_note: str = ""
) -> str:
    """The sdist inside the SRPM, unpacked, with __version__ (and optionally files) changed."""
    _unpack(built["el9"]["srpm"], directory)
    tarball = next(directory.glob("*.tar.gz"))
    with tarfile.open(str(tarball)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.12 (and backports): refuse odd members
            archive.extractall(str(directory), filter="data")
        else:
            archive.extractall(str(directory))
    tree = next(p for p in directory.iterdir() if p.is_dir())
    init = tree / "slurm_hooks" / "__init__.py"
    init.write_text(
        re.sub(r'__version__ = "[^"]+"', '__version__ = "%s"' % version, init.read_text())
    )
    if config_note:
        with open(str(tree / "packaging" / "config.toml"), "a") as handle:
            handle.write("# %s\n" % config_note)
    if prolog_note:
        with open(str(tree / "prolog.d" / "50-slurm-hooks"), "a") as handle:
            handle.write("# %s\n" % prolog_note)
    return str(tree)


@pytest.fixture(scope="module")
def upgrades(built, tmp_path_factory):
    """v2: same default config, changed prolog script; v3: changed default config. Built in parallel."""
    from slurm_hooks import __version__

    base = tmp_path_factory.mktemp("upgrades")
    versions = {"v2": __version__ + ".post1", "v3": __version__ + ".post2"}
    sources = {
        "v2": _patched_source(built, base / "v2-src", versions["v2"], prolog_note="changed in v2"),
        "v3": _patched_source(built, base / "v3-src", versions["v3"], config_note="changed in v3"),
    }
    started = time.monotonic()
    running = {
        name: subprocess.Popen(
            _build_argv(sources[name], base / name, "el9", check=False),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in sources
    }
    rpms = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
        rpms[name] = next(Path(line) for line in out.split() if line.endswith(".noarch.rpm"))
    print(
        "\nRPM builds v2+v3 (parallel, --nocheck): %.1f s" % (time.monotonic() - started),
        file=sys.stderr,
    )
    return {"rpms": rpms, "versions": versions}


def test_upgrade_keeps_edited_config_and_replaces_code(
    built, upgrades, python39, python_deps, tmp_path
):
    root = tmp_path / "root"
    root.mkdir()
    _install(root, built["el9"]["rpm"])
    config = root / "etc/slurm-hooks/config.toml"
    packaged_v1 = config.read_text()
    edited = packaged_v1 + '\n[general]\nmode = "observe"\n'
    config.write_text(edited)
    site = root / "etc/slurm-hooks/conf.d/50-site.toml"
    site.write_text('[drain]\nreason_prefix = "site-hooks:"\n')
    prolog = root / "etc/slurm/prolog.d/50-slurm-hooks"
    packaged_prolog = prolog.read_text()
    edited_prolog = packaged_prolog + "# a local edit: kept on upgrade (%config(noreplace))\n"
    prolog.write_text(edited_prolog)
    epilog = root / "etc/slurm/epilog.d/50-slurm-hooks"
    packaged_epilog = epilog.read_text()
    state = root / "var/lib/slurm-hooks/node-state.json"
    state.write_text("{}")

    # v2: the packaged config did not change -> the edited one stays, silently; code is replaced
    _install(root, upgrades["rpms"]["v2"], upgrade=True)
    assert config.read_text() == edited
    assert not (root / "etc/slurm-hooks/config.toml.rpmnew").exists()
    assert prolog.read_text() == edited_prolog  # the site's edit survives the upgrade ...
    rpmnew_prolog = root / "etc/slurm/prolog.d/50-slurm-hooks.rpmnew"
    assert (
        rpmnew_prolog.read_text() == packaged_prolog + "# changed in v2\n"
    )  # ... the new one beside
    assert epilog.read_text() == packaged_epilog  # unedited and unchanged: nothing beside it
    assert not list(root.glob("etc/slurm/epilog.d/*.rpm*"))
    assert site.exists() and state.exists()
    done = outside_cli(root, python39, ["--version"], deps=python_deps)
    assert done.stdout.strip() == "slurm-hooks " + upgrades["versions"]["v2"]

    # v3: the packaged config changed -> the edited one stays, the new default lands as .rpmnew
    _install(root, upgrades["rpms"]["v3"], upgrade=True)
    assert config.read_text() == edited
    rpmnew = root / "etc/slurm-hooks/config.toml.rpmnew"
    assert rpmnew.read_text() == packaged_v1 + "# changed in v3\n"
    done = outside_cli(
        root, python39, ["--config", str(config), "config", "check"], deps=python_deps
    )
    assert done.returncode == 0, done.stderr
    assert 'mode = "observe"' in done.stdout and 'reason_prefix = "site-hooks:"' in done.stdout
    assert (
        _run(["rpm", "--root", str(root), "-q", "slurm-hooks"])
        .stdout.strip()
        .startswith("slurm-hooks-%s-" % upgrades["versions"]["v3"])
    )

    # erase: the edited config is saved as .rpmsave, the admin's drop-in stays
    done = _run(["rpm", "-e", "--root", str(root), "--nodeps", "--noscripts", "slurm-hooks"])
    assert done.returncode == 0, done.stderr
    assert (root / "etc/slurm-hooks/config.toml.rpmsave").read_text() == edited
    assert site.exists() and not (root / "usr/bin/slurm-hooks").exists()


def _run_pre_scriptlet(rpm_file: Path, etc: Path, code: Path, instances: int):
    """The built RPM's %pre, as rpm runs it (sh, $1 = the number of instances after the install),
    with only its two paths pointed into a temp tree: the tests install with --noscripts, and the
    real paths are the host's."""
    script = _run(["rpm", "-qp", "--qf", "%{PREIN}", str(rpm_file)]).stdout
    assert script.count("\netc=/etc/slurm-hooks\n") == 1, script
    assert script.count("\nold_code=%s/slurm_hooks\n" % SITELIB) == 1, script
    script = script.replace("\netc=/etc/slurm-hooks\n", "\netc=%s\n" % etc)
    script = script.replace("\nold_code=%s/slurm_hooks\n" % SITELIB, "\nold_code=%s\n" % code)
    return _run(["sh", "-c", script, "pre", str(instances)])


def test_an_upgrade_from_a_release_that_enforced_by_default_keeps_enforce(built, tmp_path):
    """%pre: the release before the `mode` command enforced by default and this one observes, so a
    node that never set a mode keeps enforce (conf.d/99-mode.toml); a fresh install, an upgrade
    from a release with the command and a node whose config sets a mode get nothing."""
    rpm_file = built["el9"]["rpm"]
    etc, code = tmp_path / "etc", tmp_path / "site-packages" / "slurm_hooks"
    (etc / "conf.d").mkdir(parents=True)
    (code / "cli").mkdir(parents=True)
    (etc / "config.toml").write_text('#[general]\n#mode = "enforce"\n[iommu]\nmode = "strict"\n')
    keep = etc / "conf.d" / "99-mode.toml"
    (code / "cli" / "mode_verbs.py").write_text("")
    assert _run_pre_scriptlet(rpm_file, etc, code, 2).returncode == 0
    assert not keep.exists()  # the release before had the command: it observed or chose already
    (code / "cli" / "mode_verbs.py").unlink()
    assert _run_pre_scriptlet(rpm_file, etc, code, 1).returncode == 0
    assert not keep.exists()  # a fresh install ($1 = 1) observes
    (etc / "conf.d" / "10-site.toml").write_text("general.mode = 'observe'\n")
    assert _run_pre_scriptlet(rpm_file, etc, code, 2).returncode == 0
    assert not keep.exists()  # the site set a mode (a dotted key at the top level counts)
    (etc / "conf.d" / "10-site.toml").unlink()
    done = _run_pre_scriptlet(rpm_file, etc, code, 2)
    assert done.returncode == 0 and "kept mode = enforce" in done.stderr, done.stderr
    assert 'mode = "enforce"' in keep.read_text() and keep.stat().st_mode & 0o777 == 0o644
    from slurm_hooks.core.config_files import toml_loads

    assert toml_loads(keep.read_text()) == {"general": {"mode": "enforce"}}


def test_the_spec_targets_python39_on_el8_by_itself(python39):
    """`rpmbuild --rebuild` on EL8, whose python3 is 3.6: the spec picks the python39 module itself. EL8's
    macros compute %python3_version from %__python3 there; here the 3.9 values stand in for that."""
    spec = os.path.join(REPO, "packaging", "slurm-hooks.spec")
    defines = {
        "upstream_version": "1",
        "pynvml_version": "1",
        "project_url": "https://example.org/",
        "python3_version": "3.9",
        "python3_version_nodots": "39",
        "python3_sitelib": SITELIB,
    }

    def requires(rhel: str) -> set:
        argv = ["rpm", "-q", "--specfile", spec, "--requires", "--define", "rhel " + rhel]
        for name, value in defines.items():
            argv += ["--define", "%s %s" % (name, value)]
        done = _run(argv)
        assert done.returncode == 0, done.stderr
        return {" ".join(r.split()) for r in done.stdout.splitlines()}

    assert {"python39 >= 3.9", "python39-toml", "logrotate"} <= requires("8")
    assert {"python3 >= 3.9", "python3-toml", "logrotate"} <= requires("9")
