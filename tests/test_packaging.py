"""Packaging, fast (no rpmbuild): the spec and its sources agree with the code, the packaged default
config is the registry's defaults, the man page is generated from the CLI, the pynvml fallback works.
tests/test_rpm.py builds and installs the real package."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import make_default_config  # noqa: E402
import make_manpage  # noqa: E402

SPEC = os.path.join(REPO, "packaging", "slurm-hooks.spec")


def read(*parts: str) -> str:
    with open(os.path.join(REPO, *parts)) as handle:
        return handle.read()


def toml_loads(text: str):
    from slurm_hooks.core.config_files import toml_loads

    return toml_loads(text)


# -- spec ------------------------------------------------------------------------------------------


def test_spec_takes_its_version_from_the_package_metadata():
    from slurm_hooks import __version__

    spec = read("packaging", "slurm-hooks.spec")
    assert re.search(r"^Version:\s+%\{rpm_version\}$", spec, re.M)
    assert "%{!?upstream_version:%{error:" in spec  # no silent default version
    assert (
        __version__ not in spec
    )  # the only place the version is written is slurm_hooks/__init__.py
    assert (
        'sed -n \'s/^Version: //p\' PKG-INFO)" = "%{upstream_version}"' in spec
    )  # %prep cross-check


def test_spec_sources_exist_and_are_in_the_sdist():
    spec = read("packaging", "slurm-hooks.spec")
    used = set(
        re.findall(r"\b((?:packaging|prolog\.d|epilog\.d|tools|docs)/[\w.\-/*]+|README\.md)", spec)
    )
    assert {
        "packaging/config.toml",
        "packaging/slurm-hooks.logrotate",
        "packaging/slurm-hooks-healthcheck",
        "packaging/slurm.conf.snippet",
        "prolog.d/50-slurm-hooks",
        "epilog.d/50-slurm-hooks",
        "tools/make_manpage.py",
        "docs/*.md",
        "README.md",
    } <= used
    for path in used:
        assert glob.glob(os.path.join(REPO, path)), path
    manifest = read("MANIFEST.in")
    for path in used:
        top = path.split("/", 1)[0]
        assert re.search(r"^graft %s$" % re.escape(top), manifest, re.M) or re.search(
            r"^include .*\b%s\b" % re.escape(path), manifest, re.M
        ), "MANIFEST.in misses %s" % path


def test_spec_console_script_comes_from_the_entry_point():
    """The spec writes /usr/bin/slurm-hooks from the sdist's entry_points.txt; pyproject declares it."""
    pyproject = read("pyproject.toml")
    assert re.search(
        r'^\[project\.scripts\]\nslurm-hooks = "slurm_hooks\.cli\.main:run"$', pyproject, re.M
    )
    spec = read("packaging", "slurm-hooks.spec")
    assert "entry=$(sed -n 's/^slurm-hooks *= *//p' *.egg-info/entry_points.txt)" in spec
    from slurm_hooks.cli.main import run

    assert callable(run)


def test_spec_check_tests_need_no_daemons_or_extra_packages():
    """%check runs these with plain pytest in a build root: no hypothesis, fake node or Slurm."""
    spec = read("packaging", "slurm-hooks.spec")
    tests = re.search(r"^%global check_tests (.+)$", spec, re.M).group(1).split()
    assert len(tests) >= 2
    for path in tests:
        text = read(path)
        for needs in ("hypothesis", "fake_node", "fakenode", "slurm_cluster", "REPO"):
            assert needs not in text, "%s uses %s: not runnable in %%check" % (path, needs)


def test_spec_marks_config_noreplace_and_code_plain():
    """Everything under /etc is %config(noreplace), the hook scripts too (as the .deb's conffiles:
    an edited one is kept on upgrade); code under /usr is plain."""
    spec = read("packaging", "slurm-hooks.spec")
    files = spec.split("\n%files\n", 1)[1]
    config_lines = [line for line in files.splitlines() if "%config" in line]
    assert config_lines == [
        "%config(noreplace) %{_sysconfdir}/slurm/prolog.d/50-slurm-hooks",
        "%config(noreplace) %{_sysconfdir}/slurm/epilog.d/50-slurm-hooks",
        "%config(noreplace) %{_sysconfdir}/slurm-hooks/config.toml",
        "%config(noreplace) %dir %{_sysconfdir}/slurm-hooks/conf.d",
        "%config(noreplace) %{_sysconfdir}/logrotate.d/slurm-hooks",
    ]
    etc_files = [
        line
        for line in files.splitlines()
        if "%{_sysconfdir}/" in line and not line.startswith(("%dir", "%config"))
    ]
    assert etc_files == [], "files in /etc that an upgrade would overwrite: %s" % etc_files
    assert "\n%{_bindir}/slurm-hooks\n" in files
    assert "%dir %attr(0700,root,root) %{_localstatedir}/lib/slurm-hooks" in files
    assert "%dir %attr(0750,root,root) %{_localstatedir}/log/slurm-hooks" in files


def test_shell_scripts_parse():
    for script in (
        "tools/build_rpm.sh",
        "tools/build_deb.sh",
        ".ci/rpm.sh",
        ".ci/deb.sh",
        "packaging/slurm-hooks-healthcheck",
        "packaging/debian/postrm",
        "packaging/debian/rules",
    ):
        if script.endswith("/rules"):
            done = subprocess.run(
                [
                    "make",
                    "-n",
                    "-f",
                    os.path.join(REPO, script),
                    "-C",
                    REPO,
                    "override_dh_fixperms",
                ],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, (script, done.stderr)
            assert os.access(os.path.join(REPO, script), os.X_OK), "%s is not executable" % script
            continue
        shell = "sh" if script.startswith("packaging") else "bash"
        done = subprocess.run(
            [shell, "-n", os.path.join(REPO, script)], capture_output=True, text=True
        )
        assert done.returncode == 0, (script, done.stderr)
        assert os.access(os.path.join(REPO, script), os.X_OK), "%s is not executable" % script


# -- packaged files ----------------------------------------------------------------------------------


def test_healthcheck_logrotate_and_snippet_agree_with_the_code():
    from slurm_hooks.core.config import SECTIONS

    assert "\n/usr/bin/slurm-hooks health\n" in read("packaging", "slurm-hooks-healthcheck")
    log_dir = os.path.dirname(SECTIONS["paths"]["log_file"].default)
    assert re.search(
        r"^%s/\*\.log \{$" % re.escape(log_dir), read("packaging", "slurm-hooks.logrotate"), re.M
    )
    snippet = slurm_conf_settings(read("packaging", "slurm.conf.snippet"))
    assert snippet == [
        "Prolog=/etc/slurm/prolog.d/*",
        "Epilog=/etc/slurm/epilog.d/*",
        "PrologFlags=Alloc,Contain",
        "PrologEpilogTimeout=60",
        "HealthCheckProgram=/usr/libexec/slurm-hooks/healthcheck",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY,CYCLE",
        "#SchedulerParameters=nohold_on_prolog_fail",
    ]
    timeout = int(snippet[3].split("=")[1])
    assert (
        timeout
        > SECTIONS["deadline"]["epilog"].default + 10
        > SECTIONS["deadline"]["prolog"].default
    )
    assert "%{_libexecdir}/slurm-hooks/healthcheck" in read("packaging", "slurm-hooks.spec")


def slurm_conf_settings(text: str):
    """The setting lines of a slurm.conf text, optional (commented-out) ones included, without prose."""
    return [line for line in text.splitlines() if re.match(r"#?[A-Za-z]+=", line)]


def test_slurm_conf_lines_are_identical_in_readme_admin_guide_and_snippet():
    """One set of lines for admins to copy, wherever they read it; the optional SchedulerParameters line
    is commented out everywhere and each place says to merge it into an existing line."""
    snippet_text = read("packaging", "slurm.conf.snippet")
    blocks = {}
    for name, text in (
        ("README.md", read("README.md")),
        ("docs/admin.md", read("docs", "admin.md")),
    ):
        found = re.findall(
            r"<!-- slurm-conf-snippet:start -->\n```\n(.*?)```\n<!-- slurm-conf-snippet:end -->",
            text,
            re.S,
        )
        assert len(found) == 1, name
        blocks[name] = found[0].splitlines()
        assert "existing" in text[text.index("nohold_on_prolog_fail") :][:2000], (
            "%s must say to merge the line" % name
        )
    assert blocks["README.md"] == blocks["docs/admin.md"] == slurm_conf_settings(snippet_text)
    assert "existing line" in snippet_text
    for line in blocks["README.md"]:
        assert line.startswith("#") == line.startswith("#SchedulerParameters=")


def test_docs_describe_the_hook_scripts_and_paths_as_shipped():
    guide = read("docs", "admin.md")
    for script in (
        "prolog.d/50-slurm-hooks",
        "epilog.d/50-slurm-hooks",
        "packaging/slurm-hooks-healthcheck",
    ):
        assert "exec " not in read(script)  # they run slurm-hooks and map its exit status ...
    assert (
        "exec /usr/bin/slurm-hooks" not in guide and "`exec " not in guide
    )  # ... so the guide must not say exec
    # the doc directory as the packages install it (EL's %_docdir_fmt, Debian's): no version in the name
    assert "/usr/share/doc/slurm-hooks/slurm.conf.snippet" in guide
    for text in (guide, read("README.md")):
        assert "/usr/share/doc/slurm-hooks-" not in text
    assert "%_docdir_fmt %%{NAME}" in read("packaging", "rpm-targets", "el9.macros")
    assert "%_docdir_fmt %%{NAME}" in read("packaging", "rpm-targets", "el8.macros")


def test_readme_install_command_installs_the_package_alone():
    text = read("README.md")
    install = re.search(r"<!-- install-command -->\n```sh\n(.+?)\n```", text).group(1)
    test = re.search(r"<!-- test-command -->\n```sh\n(.+?)\n```", text).group(1)
    assert (
        "pip install -q -e . " in install
        and "[test]" not in install
        and "slurm-hooks check" in install
    )
    assert "pip install -q -e '.[test]'" in test and "pytest" in test


def test_default_config_is_current():
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "make_default_config.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr + " (run python tools/make_default_config.py)"


def test_default_config_is_valid_and_equals_the_registry_defaults(registry):
    from slurm_hooks.core.config import SECTIONS, validate

    text = read("packaging", "config.toml")
    assert toml_loads(text) == {}  # shipped all commented: an unedited node follows new defaults
    defaults = validate(registry, {})
    data = toml_loads(make_default_config.uncomment(text))
    # complete: every setting and every check parameter is shown ...
    assert {section: set(values) for section, values in data.items() if section != "checks"} == {
        section: set(schema) for section, schema in SECTIONS.items()
    }
    assert {name: set(table) for name, table in data["checks"].items()} == {
        name: {"enabled"} | {p.name for p in spec.params} for name, spec in registry.checks.items()
    }
    # ... at exactly its default
    uncommented = validate(registry, data)
    assert uncommented.settings == defaults.settings
    assert {name: (c.enabled, dict(c.params)) for name, c in uncommented.checks.items()} == {
        name: (c.enabled, dict(c.params)) for name, c in defaults.checks.items()
    }


def test_default_config_help_is_wrapped_and_headers_are_commented():
    text = read("packaging", "config.toml")
    for number, line in enumerate(text.splitlines(), 1):
        assert not line.startswith("["), (
            "line %d: an active header breaks kept configs after upgrades" % number
        )
        if line.startswith("# "):
            assert len(line) <= make_default_config.WIDTH, "line %d too long" % number
    assert '#[checks."system.cpu"]\n' in text and "\n#sockets = 0\n" in text


# -- man page -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manpage():
    from slurm_hooks.registry import load_builtin_checks

    return make_manpage.render(load_builtin_checks(), "2024-01-02")


def test_manpage_covers_every_verb_option_and_check(manpage, registry):
    from slurm_hooks import __version__
    from slurm_hooks.cli.main import build_parser

    assert manpage.startswith(
        '.TH SLURM\\-HOOKS 1 "2024-01-02" "slurm\\-hooks %s"' % __version__.replace("-", "\\-")
    )
    parser = build_parser()
    commands = list(make_manpage.subcommands(parser, "slurm-hooks"))
    names = {command for command, _help, _sub in commands}
    assert {
        "slurm-hooks check",
        "slurm-hooks list",
        "slurm-hooks config check",
        "slurm-hooks resume",
        "slurm-hooks status",
        "slurm-hooks prolog",
        "slurm-hooks health",
        "slurm-hooks explain xid",
    } <= names
    for command, _help, sub in commands:
        assert "\n.SS %s\n" % make_manpage.roff(command[len("slurm-hooks ") :]) in manpage
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert make_manpage.roff(option) in manpage, (command, option)
    assert "\\fB\\-\\-root DIR\\fR" in manpage and "\\fB\\-\\-config FILE\\fR" in manpage
    for spec in registry.checks.values():
        assert "\n.SS %s\n" % make_manpage.roff(spec.name) in manpage
    for section in (
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH COMMANDS",
        ".SH EXIT STATUS",
        ".SH CONFIGURATION",
        ".SH FILES",
        ".SH ENVIRONMENT",
    ):
        assert "\n%s\n" % section in manpage
    assert "\n\\fI/etc/slurm\\-hooks/checks.d/*.py\\fR\n" in manpage


def test_manpage_escapes_roff():
    assert make_manpage.roff(".starts with a dot") == "\\&.starts with a dot"
    assert make_manpage.roff("a\\b --x") == "a\\eb \\-\\-x"


def test_manpage_renders_without_groff_warnings(manpage, tmp_path):
    if shutil.which("groff") is None:
        pytest.skip("groff not installed")
    page = tmp_path / "slurm-hooks.1"
    page.write_text(manpage)
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (0, "")
    text = subprocess.run(
        ["groff", "-man", "-Tutf8", str(page)], capture_output=True, text=True
    ).stdout
    assert "slurm-hooks check" in re.sub(r".\x08", "", text)


def test_manpage_tool_writes_a_file(tmp_path):
    out = tmp_path / "page.1"
    env = dict(os.environ, SOURCE_DATE_EPOCH="0")
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "make_manpage.py"), "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith('.TH SLURM\\-HOOKS 1 "1970-01-01"')


# -- the pynvml fallback (slurm_hooks/hw/pynvml_import.py) ---------------------------------------------------------


def _import_pynvml_in_child(vendor_dir: str, with_site: bool) -> subprocess.CompletedProcess:
    """A child interpreter; without site-packages (-S) this virtualenv's nvidia-ml-py is out of reach."""
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from slurm_hooks.hw import pynvml_import as vendor\n"
        "vendor.VENDOR_DIR = %r\n"
        "module = vendor.import_pynvml()\n"
        "print(module.__file__); print(sys.path[-1] == vendor.VENDOR_DIR)\n"
    ) % (REPO, vendor_dir)
    flags = [] if with_site else ["-S"]
    return subprocess.run(
        [sys.executable] + flags + ["-c", code],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(vendor_dir),
    )


def test_vendor_falls_back_to_the_bundled_pynvml(tmp_path):
    bundled = tmp_path / "_vendor"
    bundled.mkdir()
    (bundled / "pynvml.py").write_text("BUNDLED = True\n")
    done = _import_pynvml_in_child(str(bundled), with_site=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(bundled / "pynvml.py"), "True"]  # appended: shadows nothing


def test_vendor_prefers_the_installed_nvidia_ml_py(tmp_path):
    pytest.importorskip("pynvml")
    bundled = tmp_path / "_vendor"
    bundled.mkdir()
    (bundled / "pynvml.py").write_text("BUNDLED = True\n")
    done = _import_pynvml_in_child(str(bundled), with_site=True)
    assert done.returncode == 0, done.stderr
    path, appended = done.stdout.split()
    assert path != str(bundled / "pynvml.py") and path.endswith("pynvml.py") and appended == "False"


def test_vendor_without_either_raises_import_error_naming_pynvml(tmp_path):
    done = _import_pynvml_in_child(str(tmp_path / "absent"), with_site=False)
    assert done.returncode == 1 and "No module named 'pynvml'" in done.stderr


def test_pynvml_import_skips_ctypes_util_yet_the_real_one_still_works():
    pytest.importorskip("pynvml")
    code = (
        "import sys; from slurm_hooks.hw import pynvml_import as vendor\n"
        "pynvml = vendor.import_pynvml()\n"
        "print(sorted(m for m in ('ctypes.util', 'subprocess', 'shutil', 'tempfile') if m in sys.modules))\n"
        "import ctypes.util\n"
        "print(type(ctypes.util.find_library).__name__, ctypes.util.__file__ is not None)\n"
        "print(pynvml.find_library('c') == ctypes.util.find_library('c') != None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "function True", "True"]


def test_the_packages_take_the_projects_addresses_from_pyproject():
    """Before: debian/control and copyright carried their own placeholder Maintainer and Homepage. Now
    pyproject.toml is the one place (with an Issues URL: where to report a bug), build_deb.sh and
    build_rpm.sh fill the packages from it, and the README says where bugs go."""
    urls = toml_loads(read("pyproject.toml"))["project"]["urls"]
    assert set(urls) >= {"Homepage", "Issues"}
    for name in ("control", "copyright"):
        text = read("packaging", "debian", name)
        fields = [
            line
            for line in text.splitlines()
            if line.startswith(
                ("Maintainer:", "Uploaders:", "Homepage:", "Source:", "Upstream-Contact:")
            )
        ]
        assert not [line for line in fields if re.search(r"https?://|@[\w.-]+\.\w+>", line)], (
            "packaging/debian/%s writes an address of its own" % name
        )
    assert "Maintainer: @MAINTAINER@" in read("packaging", "debian", "control")
    assert "Homepage: @HOMEPAGE@" in read("packaging", "debian", "control")
    assert "@MAINTAINER@" in read("tools", "build_deb.sh") and "@HOMEPAGE@" in read(
        "tools", "build_deb.sh"
    )
    assert "Reporting bugs" in read("README.md") and "issue tracker" in read("README.md")
