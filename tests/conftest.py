"""Shared fixtures. Config files written by tests live in root-owned temp dirs; outside root-run CI
the ownership check would refuse them, so tests that need that opt in explicitly."""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (
    REPO not in sys.path
):  # `tests.*` (helpers, doubles, fakenode, slurmcluster) imports from the checkout
    sys.path.insert(0, REPO)


def _private_pycache() -> str:
    """<tmp>/slurm-hooks-test-pyc-<uid> when only this user can write it: its bytecode would run."""
    from tests.helpers import private_directory

    return private_directory(
        os.path.join(tempfile.gettempdir(), "slurm-hooks-test-pyc-%d" % os.getuid())
    )


# With PYTHONDONTWRITEBYTECODE set, pytest rewrites the asserts of every test module on every run
# (~6 s of CPU for the suite's 30,000 lines, in each xdist worker). While the tests are collected,
# the rewritten modules (and what they import) are cached outside the checkout instead; the tests
# themselves then run with the interpreter's settings as they were (test_permissions plants bytecode
# where the interpreter's own settings say it goes).
_BYTECODE_SETTINGS = (sys.pycache_prefix, sys.dont_write_bytecode)
if sys.dont_write_bytecode and not sys.pycache_prefix and hasattr(os, "getuid"):
    _prefix = _private_pycache()
    if _prefix:
        sys.pycache_prefix, sys.dont_write_bytecode = _prefix, False


# pytest's tmp_path trees go under tempfile.gettempdir(), a disk file system here (/tmp on ext4):
# the fast tier creates and removes tens of thousands of files there (~5 s of system time a run).
# On tmpfs, when there is room for them (a container's /dev/shm is often 64 MiB), they cost less;
# a developer's own PYTEST_DEBUG_TEMPROOT (pytest's documented override) or --basetemp wins.
TMPFS_TEMPROOT = "/dev/shm"
TMPFS_MIN_FREE = 4 << 30


def _tmpfs_with_room(path: str) -> bool:
    try:
        info = os.statvfs(path)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK) and info.f_bavail * info.f_frsize >= TMPFS_MIN_FREE


if "PYTEST_DEBUG_TEMPROOT" not in os.environ and _tmpfs_with_room(TMPFS_TEMPROOT):
    os.environ["PYTEST_DEBUG_TEMPROOT"] = TMPFS_TEMPROOT

# root's parsed-configuration cache (core/config_cache.py) is off for the suite, which runs as root
# here: no test writes /run/slurm-hooks, nor sees a table another test's run left there; the
# cache's own tests name a directory of their own
os.environ["SLURM_HOOKS_CONFIG_CACHE"] = "off"
# and the drain decision's node lock (slurm/nodelock.py) is taken in each test's own state_dir, not
# in /run/slurm-hooks: the drain tests, in this process and in the hooks they start (which inherit
# this environment), left an empty /run/slurm-hooks on the host. Rigs that give a hook slurmd's
# environment instead of this one set both themselves (tests/slurm_rig.py, tests/prolog_rig.py).
os.environ["SLURM_HOOKS_LOCK_DIR"] = "off"


def pytest_configure(config):
    """The munged the Slurm tests start, shared by every cluster of the session (all xdist workers),
    is stopped when the session ends; one that ran before the session is left running
    (tests/slurmcluster.py MungedKeeper)."""
    from tests.slurmcluster import MungedKeeper

    config.pluginmanager.register(MungedKeeper(config), MungedKeeper.name)


def pytest_sessionfinish(session):
    """The fake nodes this process kept for reuse (tests/fakenode/pool.py) go with the session."""
    pool = sys.modules.get("tests.fakenode.pool")  # not imported: no fake node was made
    if pool is not None:
        pool.empty()


def pytest_collection_finish(session):
    sys.pycache_prefix, sys.dont_write_bytecode = _BYTECODE_SETTINGS


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """No cyclic garbage collection while the tests are collected, and what collection built (the
    test modules, ~2,700 items, hypothesis) frozen afterwards (gc.freeze): it lives as long as the
    process, yet every full collection during the run traversed it again, and so did pytest's two
    at exit (~0.3 s of CPU in each xdist worker and in a plain run)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def pytest_collection_modifyitems(config, items):
    """A test that needs the real Slurm daemons is slow by nature (daemons start, controller round trips):
    `slurm` implies `slow`, so the fast tier (`pytest -m "not soak and not slow"`) never starts them.
    Plain `pytest` (the README's test command, what CI runs) still runs everything."""
    for item in items:
        if item.get_closest_marker("slurm") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def registry():
    from slurm_hooks.registry import load_builtin_checks

    return load_builtin_checks()


@pytest.fixture
def default_config(registry):
    from slurm_hooks.core.config import validate

    return validate(registry, {})


@pytest.fixture
def write_tree(tmp_path):
    """write_tree({"proc/loadavg": "0.1 ...", ...}) -> root dir with those files."""

    def write(files, root=None):
        base = root or tmp_path / "root"
        for rel, content in files.items():
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        return str(base)

    return write


from tests.slurmcluster import slurm_cluster, slurm_cluster_factory  # noqa: E402,F401  (pytest fixtures)


class _UnpackedCaptures(dict):
    """{capture name: its unpacked root}, each capture unpacked the first time it is asked for."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, name: str) -> str:
        from tests import captures

        root = self[name] = captures.unpack(name, self.base)
        return root


@pytest.fixture(scope="session")
def unpacked_captures(tmp_path_factory):
    """The real-machine captures of tests/captures, unpacked once per process: unpacked_captures[name]
    is the root of that capture's tree. Shared by every test that asks for it, so only for tests
    that read the tree; a test that changes one unpacks its own (tests.captures.unpack)."""
    return _UnpackedCaptures(str(tmp_path_factory.mktemp("captures")))


@pytest.fixture
def fake_node():
    """fake_node("dgx-h100", overrides=None) -> a built FakeNode (tree + fake libnvidia-ml), removed afterwards."""
    from tests.fakenode import FakeNode

    built = []

    def build(spec="dgx-h100", overrides=None):
        node = FakeNode.build_temp(spec, overrides)
        built.append(node)
        return node

    yield build
    for node in built:
        node.cleanup()


@pytest.fixture
def nvml_node(fake_node):
    """fake_node, plus the real pynvml pointed at its library (in-process) and fresh slurm_hooks.hw.nvml sessions."""
    from slurm_hooks.hw import nvml
    from tests.fakenode import fakenvml

    def build(spec="dgx-h100", overrides=None):
        node = fake_node(spec, overrides)
        fakenvml.unload_from_pynvml()
        nvml.reset_sessions()
        node.load_into_pynvml()
        return node

    yield build
    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()


@pytest.fixture
def gpu_node(fake_node):
    """A DGX-H100 fake node loaded into this process's pynvml; unloaded afterwards."""
    from slurm_hooks.hw import nvml
    from tests.helpers import BOOT_ID, release_fake_nvml

    node = fake_node("dgx-h100")
    node.write("/proc/sys/kernel/random/boot_id", BOOT_ID)
    node.load_into_pynvml()
    nvml.reset_sessions()
    yield node
    release_fake_nvml()


@pytest.fixture(autouse=True)
def _slurm_conf_stays_the_tests_own(monkeypatch):
    """SLURM_CONF as it was before each test. The pyslurm backend sets it in this process for
    `import pyslurm` (slurm/client.py: os.environ.setdefault, right for a hook that ends after its
    run); a test that reached it left it pointing at its tmp_path's slurm.conf, and a later test of
    the same worker then read a file that no longer existed (tests/test_cli_status.py exiting 3
    after test_slurm_client.py's pyslurm import test). The value is handed to monkeypatch as its
    first record, so its undo, which runs after every other teardown of the test, ends on it."""
    before = os.environ.get("SLURM_CONF")
    if before is None:
        monkeypatch.setenv("SLURM_CONF", "")
        monkeypatch.delenv("SLURM_CONF")
    else:
        monkeypatch.setenv("SLURM_CONF", before)


@pytest.fixture(autouse=True)
def _in_process_cli_never_ends_the_run(monkeypatch):
    """Many tests call cli.main.main() in this process. Its check_verbs.finish leaves with
    os._exit(code) while any check thread is alive, and a hung-check test run earlier leaves one
    stuck: the whole pytest run then ended there, with exit status 0 and no summary (seen with
    tests/test_xid_check.py before tests/test_record_readers.py). Here finish waits for the threads
    the command started and raises for one still stuck (tests/inprocess_cli.py's rule)."""
    import threading

    from slurm_hooks.cli import check_verbs
    from tests.inprocess_cli import _finish_without_exit

    monkeypatch.setattr(check_verbs, "finish", _finish_without_exit(set(threading.enumerate())))


@pytest.fixture(scope="session", autouse=True)
def _what_the_hooks_children_import():
    """Each in-process run_hook forks children that import hw.nvml (with ctypes) and, for the
    metrics step, prometheus_client: imported once here, every fork inherits them instead
    (tests/flow_rig.py, inherited_by_the_hooks_children; ~20 ms of CPU per hook run). A fresh
    interpreter's imports are test_startup_imports' business, never this process's."""
    from tests.flow_rig import inherited_by_the_hooks_children

    inherited_by_the_hooks_children()
