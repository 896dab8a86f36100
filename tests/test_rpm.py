"""The RPM, built for real: tools/build_rpm.sh (sdist -> rpmbuild -ba with %check), its file list and
flags, an install into a scratch root whose INSTALLED slurm-hooks runs against the example fake GPU
node, and upgrades that must keep an edited config (with a .rpmnew when the packaged one changed).

Needs rpmbuild, rpm2cpio and cpio (Debian: apt-get install rpm cpio; .ci/rpm.sh does it) and root
(rpm --root writes root-owned files). Missing tools skip the module locally and fail it in CI
(CI=true), so CI can never go green without having built the package.

The installed code runs under the interpreter the package was built for (the spec's %__python3,
/usr/bin/python3 on Debian), with PYTHONPATH at the scratch root's site-packages: that interpreter
has no nvidia-ml-py here, so GPU checks work only through the pynvml the RPM bundles.
"""
from __future__ import annotations

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
from conftest import REPO

BUILD_SCRIPT = os.path.join(REPO, "tools", "build_rpm.sh")
FAKE_DRIVER_VERSION = "550.54.15"  # tests/fakenode/defaults.py: proves the fake library answered


def _require_environment() -> None:
    missing = [tool for tool in ("rpmbuild", "rpm", "rpm2cpio", "cpio") if shutil.which(tool) is None]
    problem = ""
    if missing:
        problem = "missing %s (Debian: apt-get install rpm cpio; see .ci/rpm.sh)" % ", ".join(missing)
    elif os.geteuid() != 0:
        problem = "rpm --root installs need root"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail("RPM tests cannot run in CI: " + problem, pytrace=False)
        pytest.skip(problem)


def _run(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 300)
    return subprocess.run(argv, **kwargs)


def _build(source: str, out: Path, check: bool) -> Tuple[Path, Path, str, float]:
    """Run build_rpm.sh; return (binary rpm, source rpm, rpmbuild output, seconds)."""
    argv = ["bash", BUILD_SCRIPT, "--source", source, "--out", str(out), "--python", sys.executable, "--verbose"]
    started = time.monotonic()
    done = _run(argv + ([] if check else ["--nocheck"]))
    seconds = time.monotonic() - started
    assert done.returncode == 0, "build_rpm.sh failed:\n%s\n%s" % (done.stdout, done.stderr[-6000:])
    paths = [Path(line) for line in done.stdout.split()]
    binary = [p for p in paths if p.name.endswith(".noarch.rpm")]
    source_rpm = [p for p in paths if p.name.endswith(".src.rpm")]
    assert len(binary) == 1 and len(source_rpm) == 1, done.stdout
    return binary[0], source_rpm[0], done.stderr, seconds


def _query(rpm_file: Path, fmt: str) -> List[str]:
    done = _run(["rpm", "-qp", "--qf", fmt, str(rpm_file)])
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.split("\n") if line]


def _install(root: Path, rpm_file: Path, upgrade: bool = False) -> None:
    done = _run(["rpm", "-U" if upgrade else "-i", "--root", str(root), "--nodeps", "--noscripts", str(rpm_file)])
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _require_environment()
    out = tmp_path_factory.mktemp("rpms")
    binary, source_rpm, log, seconds = _build(REPO, out, check=True)
    print("\nRPM build with %%check: %.1f s" % seconds, file=sys.stderr)
    return {"rpm": binary, "srpm": source_rpm, "log": log, "seconds": seconds, "out": out}


@pytest.fixture(scope="module")
def files(built) -> Dict[str, str]:
    """Packaged path -> file flags as rpm prints them (c config, n noreplace, d doc, ...)."""
    rows = _query(built["rpm"], "[%{FILENAMES} %{FILEFLAGS:fflags}\\n]")
    return {row.split(" ")[0]: row.split(" ", 1)[1] if " " in row else "" for row in rows}


@pytest.fixture(scope="module")
def sitelib(files) -> str:
    init = [path for path in files if path.endswith("/site-packages/slurm_hooks/__init__.py")]
    assert len(init) == 1, init
    return init[0][: -len("/slurm_hooks/__init__.py")]


@pytest.fixture(scope="module")
def target_python() -> str:
    """The interpreter the package targets: the spec's %__python3 (Debian's rpm defines none)."""
    done = _run(["rpm", "--eval", "%{?__python3}"])
    return done.stdout.strip() or "/usr/bin/python3"


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scratch-root")
    _install(root, built["rpm"])
    return root


@pytest.fixture(scope="module")
def example_node():
    from tests.fakenode import FakeNode

    node = FakeNode.build_temp("dgx-h100")
    yield node
    node.cleanup()


def installed_cli(root: Path, sitelib: str, target_python: str, args: List[str], extra_env=None):
    """Run ROOT/usr/bin/slurm-hooks (the installed script) with the target interpreter and the
    scratch root's site-packages; no site-packages of this virtualenv, no insecure-config override."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root) + sitelib, "LANG": "C.UTF-8",
           "SLURM_HOOKS_CHECKS_DIR": str(root / "etc/slurm-hooks/checks.d")}
    env.update(extra_env or {})
    return _run([target_python, "-s", str(root / "usr/bin/slurm-hooks")] + args, env=env, cwd=str(root))


# -- the package ---------------------------------------------------------------------------------

def test_build_ran_the_unit_tests_in_check_against_the_buildroot(built):
    log = built["log"]
    assert "Executing(%check)" in log
    passed = re.search(r"^(\d+) passed", log, re.M)
    assert passed and int(passed.group(1)) >= 20, log[-3000:]
    # %check imported the buildroot copy, not the unpacked sources
    assert re.search(r"^rpm check: testing /.*/BUILDROOT/.*/site-packages/slurm_hooks/__init__\.py$", log, re.M)
    assert re.search(r"^Wrote: .*\.noarch\.rpm$", log, re.M)


def test_file_list(files, sitelib):
    from slurm_hooks import __version__

    other = {path for path in files if not path.startswith(sitelib)}
    docs = {path for path in other if path.startswith("/usr/share/doc/")}
    docdir = min(docs, key=len)  # /usr/share/doc/slurm-hooks (EL, Fedora) or .../slurm-hooks-VERSION (Debian's rpm)
    assert re.fullmatch(r"/usr/share/doc/slurm-hooks(-[\w.~+]+)?", docdir)
    guides = [name for name in os.listdir(os.path.join(REPO, "docs")) if name.endswith(".md")]
    assert "admin.md" in guides
    assert docs == {docdir} | {docdir + "/" + name for name in ["README.md", "slurm.conf.snippet"] + guides}
    man = {path for path in other if path.startswith("/usr/share/man/")}
    assert len(man) == 1 and re.fullmatch(r"/usr/share/man/man1/slurm-hooks\.1(\.gz|\.xz|\.bz2|\.zst)?", man.pop())
    expected = {
        "/usr/bin/slurm-hooks",
        "/etc/slurm/prolog.d", "/etc/slurm/prolog.d/50-slurm-hooks",
        "/etc/slurm/epilog.d", "/etc/slurm/epilog.d/50-slurm-hooks",
        "/usr/libexec/slurm-hooks", "/usr/libexec/slurm-hooks/healthcheck",
        "/etc/slurm-hooks", "/etc/slurm-hooks/config.toml", "/etc/slurm-hooks/conf.d", "/etc/slurm-hooks/checks.d",
        "/etc/logrotate.d/slurm-hooks",
        "/var/lib/slurm-hooks", "/var/log/slurm-hooks",
    }
    assert {p for p in other if not p.startswith(("/usr/share/doc/", "/usr/share/man/"))} == expected
    python = {path[len(sitelib) + 1:] for path in files if path.startswith(sitelib + "/")}
    distinfo = "slurm_hooks-%s.dist-info" % __version__
    assert {p for p in python if p.startswith(distinfo)} == {distinfo} | {
        distinfo + "/" + name for name in ("METADATA", "entry_points.txt", "top_level.txt", "INSTALLER")}
    sources = {str(p.relative_to(REPO)) for p in Path(REPO, "slurm_hooks").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}
    assert sources and sources <= python, sorted(sources - python)
    assert "slurm_hooks/_vendor/pynvml.py" in python
    compiled = {p for p in python if p.endswith(".pyc")}
    assert any("slurm_hooks/__pycache__/cli." in p for p in compiled)  # byte-compiled at build time


def test_config_and_noreplace_flags_exactly_where_intended(files):
    flagged = {path: flags for path, flags in files.items() if "c" in flags or "n" in flags}
    # rpm keeps only 'noreplace' for a directory (a directory is never replaced or removed with files in it)
    assert flagged == {"/etc/slurm-hooks/config.toml": "cn", "/etc/logrotate.d/slurm-hooks": "cn",
                       "/etc/slurm-hooks/conf.d": "n"}
    for code in ("/etc/slurm/prolog.d/50-slurm-hooks", "/etc/slurm/epilog.d/50-slurm-hooks", "/usr/bin/slurm-hooks",
                 "/usr/libexec/slurm-hooks/healthcheck"):
        assert files[code] == "", "%s is code: it must be replaced on upgrade, not kept" % code
    documentation = [path for path in files if re.match(r"/usr/share/(doc/[^/]+|man/man1)/.", path)]
    assert len(documentation) >= 4 and all("d" in files[path] for path in documentation)


def test_modes_and_owners(built):
    rows = _query(built["rpm"], "[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME}:%{FILEGROUPNAME}\\n]")
    modes = {row.split()[0]: (row.split()[1], row.split()[2]) for row in rows}
    assert {owner for _mode, owner in modes.values()} == {"root:root"}
    assert modes["/var/lib/slurm-hooks"][0] == "40700"
    assert modes["/var/log/slurm-hooks"][0] == "40750"
    assert modes["/etc/slurm-hooks"][0] == "40755"  # config dirs: root's and not group/world-writable
    assert modes["/etc/slurm-hooks/config.toml"][0] == "100644"
    for script in ("/usr/bin/slurm-hooks", "/etc/slurm/prolog.d/50-slurm-hooks", "/etc/slurm/epilog.d/50-slurm-hooks",
                   "/usr/libexec/slurm-hooks/healthcheck"):
        assert modes[script][0] == "100755"


def test_dependencies(built, target_python):
    requires = set(_query(built["rpm"], "[%{REQUIRENAME} %{REQUIREFLAGS:depflags} %{REQUIREVERSION}\\n]"))
    requires = {" ".join(r.split()) for r in requires}
    assert "python3 >= 3.9" in requires
    assert "python3-psutil" in requires
    old_python = _run([target_python, "-c", "import sys; print(sys.version_info < (3, 11))"]).stdout.strip()
    assert ("python3-toml" in requires) == (old_python == "True")
    assert not [r for r in requires if "nvidia" in r or "pynvml" in r], requires  # bundled, not required
    provides = _query(built["rpm"], "[%{PROVIDENAME} %{PROVIDEVERSION}\\n]")
    import importlib.metadata

    assert "bundled(python3dist(nvidia-ml-py)) %s" % importlib.metadata.version("nvidia-ml-py") in provides


def test_source_rpm_is_self_contained(built, tmp_path):
    """The SRPM's spec carries the version, so `rpmbuild --rebuild`/mock need no defines."""
    done = subprocess.run("rpm2cpio %s | cpio -idm --quiet" % built["srpm"], shell=True, cwd=str(tmp_path),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == "slurm-hooks.spec" and "pynvml.py" in names
    from slurm_hooks import __version__

    assert "%%global upstream_version %s\n" % __version__ in (tmp_path / "slurm-hooks.spec").read_text()


# -- the installed tree ---------------------------------------------------------------------------

def test_installed_version_list_and_config(installed, sitelib, target_python, registry):
    from slurm_hooks import __version__

    done = installed_cli(installed, sitelib, target_python, ["--version"])
    assert (done.returncode, done.stdout.strip()) == (0, "slurm-hooks " + __version__), done.stderr
    done = installed_cli(installed, sitelib, target_python, ["list"])
    assert done.returncode == 0, done.stderr
    assert {line.split()[0] for line in done.stdout.splitlines() if line.strip()} == set(registry.checks)
    config = str(installed / "etc/slurm-hooks/config.toml")
    done = installed_cli(installed, sitelib, target_python, ["--config", config, "config", "check"])
    assert done.returncode == 0, done.stderr  # packaged file and directory pass the root-only ownership check
    assert 'mode = "enforce"' in done.stdout and config in done.stdout


def test_installed_pynvml_is_the_bundled_copy_unless_the_node_has_one(installed, sitelib, target_python):
    code = "from slurm_hooks.vendor import import_pynvml; print(import_pynvml().__file__)"
    env = {"PYTHONPATH": str(installed) + sitelib}
    # cwd: not the repository, whose slurm_hooks/ (no _vendor) `-c` would import first
    done = _run([target_python, "-s", "-c", code], env=env, cwd=str(installed))
    assert done.returncode == 0, done.stderr
    node_has_one = _run([target_python, "-s", "-c", "import pynvml"], env={}, cwd=str(installed)).returncode == 0
    bundled = str(installed) + sitelib + "/slurm_hooks/_vendor/pynvml.py"
    assert (done.stdout.strip() == bundled) != node_has_one


def test_installed_check_against_the_example_node(installed, sitelib, target_python, example_node):
    """The installed tree, its packaged config and the bundled pynvml drive the fake GPU node."""
    config = str(installed / "etc/slurm-hooks/config.toml")
    done = installed_cli(installed, sitelib, target_python,
                         ["--config", config, "check", "--json", "--root", str(example_node.root), "gpu.count",
                          "system"], extra_env=dict(example_node.env))
    report = json.loads(done.stdout)
    by_name = {check["name"]: check for check in report["checks"]}
    gpu = by_name["gpu.count"]["results"][0]
    assert gpu["status"] == "OK", ("%s\n-- the installed code could not drive NVML; without an nvidia-ml-py of the "
                                   "node's own it needs the bundled pynvml, which slurm_hooks/nvml.py must import "
                                   "through slurm_hooks.vendor.import_pynvml()" % gpu)
    assert FAKE_DRIVER_VERSION in gpu["summary"]  # the fake libnvidia-ml answered through pynvml
    assert by_name["system.cpu"]["status"] == "OK"
    assert report["root"] == str(example_node.root) and done.returncode == 0


def test_installed_hook_scripts_exec_the_installed_cli(installed):
    for path, verb in (("etc/slurm/prolog.d/50-slurm-hooks", "prolog"), ("etc/slurm/epilog.d/50-slurm-hooks", "epilog"),
                       ("usr/libexec/slurm-hooks/healthcheck", "health")):
        text = (installed / path).read_text()
        assert text.startswith("#!/bin/sh\n") and ("\n/usr/bin/slurm-hooks %s\n" % verb) in text
    shebang = (installed / "usr/bin/slurm-hooks").read_text().split("\n", 1)[0]
    assert re.fullmatch(r"#!/usr/bin/python3(\.\d+)? -[sP]+", shebang), shebang


# -- upgrades -------------------------------------------------------------------------------------

def _patched_source(built, directory: Path, version: str, config_note: str = "", prolog_note: str = "") -> str:
    """The sdist inside the SRPM, unpacked, with __version__ (and optionally files) changed."""
    directory.mkdir()
    done = subprocess.run("rpm2cpio %s | cpio -idm --quiet" % built["srpm"], shell=True, cwd=str(directory),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    tarball = next(directory.glob("*.tar.gz"))
    with tarfile.open(str(tarball)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.12 (and backports): refuse odd members
            archive.extractall(str(directory), filter="data")
        else:
            archive.extractall(str(directory))
    tree = next(p for p in directory.iterdir() if p.is_dir())
    init = tree / "slurm_hooks" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', '__version__ = "%s"' % version, init.read_text()))
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
    sources = {"v2": _patched_source(built, base / "v2-src", versions["v2"], prolog_note="changed in v2"),
               "v3": _patched_source(built, base / "v3-src", versions["v3"], config_note="changed in v3")}
    started = time.monotonic()
    running = {name: subprocess.Popen(["bash", BUILD_SCRIPT, "--source", sources[name], "--out", str(base / name),
                                       "--python", sys.executable, "--nocheck"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in sources}
    rpms = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
        rpms[name] = next(Path(line) for line in out.split() if line.endswith(".noarch.rpm"))
    print("\nRPM builds v2+v3 (parallel, --nocheck): %.1f s" % (time.monotonic() - started), file=sys.stderr)
    return {"rpms": rpms, "versions": versions}


def test_upgrade_keeps_edited_config_and_replaces_code(built, upgrades, sitelib, target_python, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    _install(root, built["rpm"])
    config = root / "etc/slurm-hooks/config.toml"
    packaged_v1 = config.read_text()
    edited = packaged_v1 + '\n[general]\nmode = "observe"\n'
    config.write_text(edited)
    site = root / "etc/slurm-hooks/conf.d/50-site.toml"
    site.write_text('[drain]\nreason_prefix = "site-hooks:"\n')
    prolog = root / "etc/slurm/prolog.d/50-slurm-hooks"
    prolog.write_text(prolog.read_text() + "# a local edit, lost on upgrade: hooks are code\n")
    state = root / "var/lib/slurm-hooks/node-state.json"
    state.write_text("{}")

    # v2: the packaged config did not change -> the edited one stays, silently; code is replaced
    _install(root, upgrades["rpms"]["v2"], upgrade=True)
    assert config.read_text() == edited
    assert not (root / "etc/slurm-hooks/config.toml.rpmnew").exists()
    assert prolog.read_text().endswith("exit 0\n# changed in v2\n")
    assert "\n/usr/bin/slurm-hooks prolog\n" in prolog.read_text()
    assert not list(root.glob("etc/slurm/prolog.d/*.rpm*"))
    assert site.exists() and state.exists()
    done = installed_cli(root, sitelib, target_python, ["--version"])
    assert done.stdout.strip() == "slurm-hooks " + upgrades["versions"]["v2"]

    # v3: the packaged config changed -> the edited one stays, the new default lands as .rpmnew
    _install(root, upgrades["rpms"]["v3"], upgrade=True)
    assert config.read_text() == edited
    rpmnew = root / "etc/slurm-hooks/config.toml.rpmnew"
    assert rpmnew.read_text() == packaged_v1 + "# changed in v3\n"
    done = installed_cli(root, sitelib, target_python, ["--config", str(config), "config", "check"])
    assert done.returncode == 0, done.stderr
    assert 'mode = "observe"' in done.stdout and 'reason_prefix = "site-hooks:"' in done.stdout
    assert _run(["rpm", "--root", str(root), "-q", "slurm-hooks"]).stdout.strip().startswith(
        "slurm-hooks-%s-" % upgrades["versions"]["v3"])

    # erase: the edited config is saved as .rpmsave, the admin's drop-in stays
    done = _run(["rpm", "-e", "--root", str(root), "--nodeps", "--noscripts", "slurm-hooks"])
    assert done.returncode == 0, done.stderr
    assert (root / "etc/slurm-hooks/config.toml.rpmsave").read_text() == edited
    assert site.exists() and not (root / "usr/bin/slurm-hooks").exists()
