"""A released fake node's tree is made into the next one (tests/fakenode/pool.py): whatever the test
before did to it, the next node must be, file for file, the node the builder makes, and a tree
changed in a way the pool does not repair must never be handed out again."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.fakenode import FakeNode, image, load_spec, pool
from tests.fakenode.fsutil import read_tree as tree
from tests.fakenode.node import build_node

OVERRIDDEN = {"gpu": {3: {"remapped_rows": {"pending": True}}}, "nvml": {"driver_version": "535.1"}}


_builders = {}


def builders_tree(spec, overrides=None):
    """The tree the builder itself writes for spec (no image looked up or kept), once per module."""
    key = (spec, repr(overrides))
    if key not in _builders:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(image, "lookup", lambda key: None)
            patch.setattr(image, "wanted", lambda key: False)
            directory = os.path.join(
                os.environ.get("PYTEST_DEBUG_TEMPROOT", "/tmp"), "pool-reference-%d" % os.getpid()
            )
            shutil.rmtree(directory, ignore_errors=True)
            try:
                _builders[key] = tree(build_node(load_spec(spec, overrides), directory).root)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    return _builders[key]


def _images_at_hand(tmp_path):
    """Images of the specs used here (without disk images, a spec's image is taken at its second
    build): the pool only takes a tree for a spec with an image."""
    for spec, overrides in (("dgx-h100", None), ("dgx-h100", OVERRIDDEN), ("cpu-only", None)):
        resolved = load_spec(spec, overrides)
        for attempt in range(2):  # kept at the first build with disk images, else the second
            if image.lookup(image.spec_key(resolved, resolved["nvml"]["library"])) is not None:
                break
            where = tmp_path / ("%s-%d-%d" % (spec, attempt, overrides is None))
            build_node(resolved, where)
            shutil.rmtree(str(where))


def _pool_of_its_own(monkeypatch, tmp_path, the_pool):
    monkeypatch.delenv(pool.ENV, raising=False)
    monkeypatch.setattr(pool, "_unavailable", False)
    monkeypatch.setattr(pool, "_pool", the_pool)
    _images_at_hand(tmp_path)


@pytest.fixture
def own_pool(monkeypatch, tmp_path):
    """A pool of this test's own, empty (none of another test's trees), for the tests that count
    its idle trees or break it on purpose."""
    fresh = pool.Pool()
    _pool_of_its_own(monkeypatch, tmp_path, fresh)
    yield fresh
    fresh.close()


@pytest.fixture(scope="module")
def _module_pool():
    module_pool = pool.Pool()
    yield module_pool
    module_pool.close()


@pytest.fixture
def shared_pool(_module_pool, monkeypatch, tmp_path):
    """The pool of this module's tests that count nothing in it: a test's first node is made from
    the tree the test before released (writing a whole DGX tree and removing it was most of what
    each test cost), the rest is as with own_pool. At most one idle tree is left from before,
    so a test's own released tree is the one its next node of that spec takes; a node a failed
    test left handed out is removed."""
    _pool_of_its_own(monkeypatch, tmp_path, _module_pool)
    with _module_pool.lock:
        _module_pool._note_changes()
        while len(_module_pool.idle) > 1:
            _module_pool._discard(_module_pool.idle.pop(0))
    yield _module_pool
    with _module_pool.lock:
        for root, left in list(_module_pool.active.items()):
            del _module_pool.active[root]
            _module_pool._discard(left)


def followed(the_pool, node):
    """The pool's record of a node handed out (None: the node is not the pool's)."""
    return the_pool.active.get(str(node.root))


def write_in_place(node):
    with open(str(node.path("/sys/bus/pci/devices/0000:18:00.0/numa_node")), "r+") as handle:
        handle.write("1")  # same size: "0\n" -> "1\n"


def remove_a_symlink(node):
    os.unlink(str(node.path("/sys/bus/pci/devices/0000:18:00.0")))


def replace_a_symlink(node):
    link = str(node.path("/sys/bus/pci/devices/0000:18:00.0"))
    os.unlink(link)
    os.symlink("../../../devices/system", link)


def add_a_directory_tree(node):
    base = node.path("/sys/class/extra/deeper")
    base.mkdir(parents=True)
    (base / "value").write_text("1\n")


def file_becomes_a_directory(node):
    path = node.path("/proc/loadavg")
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def rename_a_file(node):
    os.rename(str(node.path("/proc/loadavg")), str(node.path("/proc/loadavg.old")))


def chown_a_file(node):
    # root may give it away; anyone else can still set their own ids (an IN_ATTRIB all the same)
    owner = 65534 if os.geteuid() == 0 else os.getuid()
    os.chown(str(node.path("/proc/cpuinfo")), owner, owner)


# every way a test changes its node that the pool repairs
REPAIRED = {
    "node.write": lambda node: node.write("/proc/sys/kernel/random/boot_id", "changed"),
    "write in place": write_in_place,
    "append": lambda node: node.add_kmsg("NVRM: Xid (PCI:0000:18:00): 79, fallen off the bus"),
    "truncate": lambda node: os.truncate(str(node.path("/proc/meminfo")), 0),
    "chmod a file": lambda node: os.chmod(str(node.path("/proc/cpuinfo")), 0o600),
    "chown a file": chown_a_file,
    "utime": lambda node: os.utime(str(node.path("/proc/cpuinfo")), (1, 1)),
    "add a file": lambda node: node.path("/proc/extra").write_text("x"),
    "add a directory tree": add_a_directory_tree,
    "remove a file": lambda node: node.path("/proc/loadavg").unlink(),
    "remove a symlink": remove_a_symlink,
    "replace a symlink": replace_a_symlink,
    "file becomes a directory": file_becomes_a_directory,
    "rename a file": rename_a_file,
    "state file": lambda node: node.inject_fault("nvmlDeviceGetEccMode", 3, 15),
    "library overwritten": lambda node: node.lib_path.write_bytes(b"not a library"),
}


def _every_change_and_next_spec():
    """Every change followed by each next spec (the same one, an overridden one). The fast tier
    takes each change once, the next spec alternating; the other half is marked slow (~0.2 s of
    CPU each: two DGX trees written and one read back whole)."""
    specs = [("dgx-h100", None), ("dgx-h100", OVERRIDDEN)]
    for number, change in enumerate(sorted(REPAIRED)):
        for which, (spec, overrides) in enumerate(specs):
            marks = () if which == number % len(specs) else (pytest.mark.slow,)
            label = "%s-%s" % (change, "overridden" if overrides else spec)
            yield pytest.param(change, spec, overrides, marks=marks, id=label)


@pytest.mark.parametrize("change,spec,overrides", list(_every_change_and_next_spec()))
def test_a_reused_tree_is_the_builders_node_whatever_the_test_before_changed(
    shared_pool, change, spec, overrides
):
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(shared_pool, first)
    assert kept is not None
    REPAIRED[change](first)
    first.cleanup()
    assert not first.root.exists()
    second = FakeNode.build_temp(spec, overrides)
    try:
        assert followed(shared_pool, second) is kept  # the same tree, made into this node
        assert second.root != first.root
        assert tree(second.root) == builders_tree(spec, overrides)
    finally:
        second.cleanup()


def next_dgx_node_is_the_builders(the_pool, kept, reused):
    """The next DGX node is the builder's, made from the kept tree (reused) or not."""
    second = FakeNode.build_temp("dgx-h100")
    try:
        assert (followed(the_pool, second) is kept) is reused
        if not reused:
            assert not os.path.exists(kept.root)  # removed, not left in the pool
        assert tree(second.root) == builders_tree("dgx-h100")
    finally:
        second.cleanup()


def chmod_a_directory(node):
    os.chmod(str(node.path("/proc/sys")), 0o700)


def remove_a_directory(node):
    shutil.rmtree(str(node.path("/sys/class/infiniband")))


def move_a_directory(node):
    os.rename(str(node.path("/sys/class/net")), str(node.path("/sys/class/net2")))


# changes the pool does not repair: the tree is removed, never handed out again
DISCARDED = {
    "chmod a directory": chmod_a_directory,
    "remove a directory": remove_a_directory,
    "move a directory": move_a_directory,
}


@pytest.mark.parametrize("change", sorted(DISCARDED))
def test_a_tree_whose_directories_changed_is_never_handed_out(shared_pool, change):
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(shared_pool, first)
    DISCARDED[change](first)
    first.cleanup()
    next_dgx_node_is_the_builders(shared_pool, kept, reused=False)


def test_a_write_after_release_is_repaired(shared_pool):
    """A process that outlives its test and writes through a file it opened before the release."""
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(shared_pool, first)
    with open(str(first.path("/proc/uptime")), "r+b") as late:
        first.cleanup()
        late.write(b"999999.99 1.00\n")
    next_dgx_node_is_the_builders(shared_pool, kept, reused=True)


def test_a_queue_overflow_discards_every_tree(own_pool):
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(own_pool, first)
    first.cleanup()
    own_pool.inotify.read = lambda: [(-1, pool.IN_Q_OVERFLOW, "")]  # as the kernel says it
    second = FakeNode.build_temp("dgx-h100")
    del own_pool.inotify.read
    try:
        assert followed(own_pool, second) is not kept
        assert not os.path.exists(kept.root)
    finally:
        second.cleanup()


def test_an_unexpected_event_while_the_pool_writes_discards_the_tree(shared_pool, monkeypatch):
    """Someone else writing while the pool turns a tree into the next node: not handed out."""
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(shared_pool, first)
    first.cleanup()
    turn_into = pool.Pool._turn_into

    def and_someone_writes(self, tree_, target):
        written = turn_into(self, tree_, target)
        with open(tree_.root + "/proc/cpuinfo", "a") as handle:
            handle.write("late\n")
        return written

    monkeypatch.setattr(pool.Pool, "_turn_into", and_someone_writes)
    second = FakeNode.build_temp("dgx-h100")
    try:
        assert followed(shared_pool, second) is not kept
        assert tree(second.root) == builders_tree("dgx-h100")
    finally:
        second.cleanup()


def test_specs_in_turn_each_get_the_builders_node(shared_pool):
    for spec, overrides in [
        ("dgx-h100", None),
        ("cpu-only", None),
        ("dgx-h100", OVERRIDDEN),
        ("dgx-h100", None),
    ]:
        node = FakeNode.build_temp(spec, overrides)
        try:
            assert tree(node.root) == builders_tree(spec, overrides)
        finally:
            node.cleanup()


def test_a_tree_made_into_a_very_different_spec_is_its_builders_node(shared_pool, monkeypatch):
    """Past MAX_DIFFERING a node is written from its image instead; here every tree is taken, and
    the pool looks at its own events every 50 writes (a DGX into a CPU-only node and back is
    thousands of writes and removals, each an event or three, and the kernel queues 16,384)."""
    monkeypatch.setattr(pool, "MAX_DIFFERING", 100.0)
    monkeypatch.setattr(pool, "CHECK_EVERY", 50)
    first = FakeNode.build_temp("dgx-h100")
    kept = followed(shared_pool, first)
    first.write("/proc/loadavg", "9.99 9.99 9.99 1/1 1")
    first.cleanup()
    for spec in ("cpu-only", "dgx-h100"):
        node = FakeNode.build_temp(spec)
        try:
            assert followed(shared_pool, node) is kept
            assert tree(node.root) == builders_tree(spec)
        finally:
            node.cleanup()


def test_nodes_held_together_are_distinct_and_each_the_builders(shared_pool):
    for node in [FakeNode.build_temp("dgx-h100") for _ in range(3)]:
        node.write("/proc/loadavg", "9.99 9.99 9.99 1/1 1")
        node.cleanup()
    held = [FakeNode.build_temp("dgx-h100") for _ in range(4)]
    try:
        assert len({str(node.root) for node in held}) == 4
        held[0].write("/proc/loadavg", "changed")  # a change to one is in that one only
        for node in held[1:]:
            assert tree(node.root) == builders_tree("dgx-h100")
    finally:
        for node in held:
            node.cleanup()
    assert len(shared_pool.idle) == pool.MAX_POOLED  # the fourth tree removed, not kept


def test_every_node_gets_a_root_and_a_library_never_seen_before(shared_pool):
    """glibc would hand back the previous test's library (and its state) for the same inode, and a
    root path may key a cache: both are new for every node."""
    roots, libraries = set(), set()
    for _ in range(4):
        node = FakeNode.build_temp("dgx-h100")
        assert str(node.root) not in roots
        roots.add(str(node.root))
        libraries.add(os.stat(str(node.lib_path)).st_ino)
        node.cleanup()
        assert not os.path.exists(str(node.root))
    assert len(libraries) == 4


def test_pynvml_in_this_process_reads_the_node_it_was_given(shared_pool):
    from tests.helpers import release_fake_nvml

    for spec, overrides, version in [
        ("dgx-h100", None, "550.54.15"),
        ("dgx-h100", OVERRIDDEN, "535.1"),
        ("dgx-h100", None, "550.54.15"),
    ]:
        node = FakeNode.build_temp(spec, overrides)
        try:
            pynvml = node.load_into_pynvml()
            pynvml.nvmlInit()
            got = pynvml.nvmlSystemGetDriverVersion()
            assert (got.decode() if isinstance(got, bytes) else got) == version
        finally:
            release_fake_nvml()
            node.cleanup()


def test_cleanup_without_reuse_and_twice(own_pool):
    node = FakeNode.build_temp("dgx-h100")
    node.cleanup(reuse=False)
    assert not node.root.exists() and not own_pool.idle and not own_pool.active
    node = FakeNode.build_temp("dgx-h100")
    node.cleanup()
    node.cleanup()  # a test's own cleanup, then the fixture's
    assert len(own_pool.idle) == 1


def test_the_pool_turned_off(own_pool, monkeypatch):
    monkeypatch.setenv(pool.ENV, "off")
    node = FakeNode.build_temp("dgx-h100")
    assert followed(own_pool, node) is None
    node.cleanup()
    assert not node.root.exists() and not own_pool.idle


def test_a_forked_child_never_takes_from_its_parents_pool(own_pool):
    FakeNode.build_temp("dgx-h100").cleanup()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, b"none" if pool.pool() is None else b"pool")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 16) == b"none"
    os.close(read_end)
    assert len(own_pool.idle) == 1 and os.path.isdir(own_pool.idle[0].root)
