"""The third and later fake nodes of one spec are written from a kept image (tests/fakenode/image.py),
and a later run's first ones from the image kept on disk (tests/fakenode/diskimage.py): each must be
the node the builder makes, file for file, and a node of its own."""

from __future__ import annotations

import marshal
import os
import zlib

import pytest

from tests.fakenode import FakeNode, diskimage, image, node, pool
from tests.fakenode.fsutil import read_tree as tree

SPECS = [  # a DGX with what the builder makes of overrides (an offline CPU loses its topology)
    ("cpu-only", None),
    ("dgx-h100", {"gpu": {3: {"remapped_rows": {"pending": True}}}, "cpu": {"offline": "5,7"}}),
]


def build_without_images(monkeypatch, spec, overrides):
    """A node from the builder itself: no image is looked up or kept."""
    with monkeypatch.context() as patch:
        patch.setattr(image, "lookup", lambda key: None)
        patch.setattr(image, "wanted", lambda key: False)
        return FakeNode.build_temp(spec, overrides)


@pytest.fixture
def builder_runs(monkeypatch):
    """One entry for each node the builder itself writes from here on (not from an image)."""
    runs = []
    write_sysfs = node.write_sysfs

    def counted(*args, **kwargs):
        runs.append(args)
        return write_sysfs(*args, **kwargs)

    monkeypatch.setattr(node, "write_sysfs", counted)
    return runs


@pytest.fixture
def fresh_images(monkeypatch):
    """An empty image store and no disk images, so this test sees the first, second and third
    build of a spec; and no pool (pool.py), so a node from an image is written from it, not made
    from a tree another test released."""
    monkeypatch.setenv(pool.ENV, "off")
    monkeypatch.setattr(image, "_seen", type(image._seen)())
    monkeypatch.setattr(image, "_images", type(image._images)())
    monkeypatch.setattr(diskimage, "_directory", "")


@pytest.fixture
def disk_images(monkeypatch, tmp_path):
    """An empty image store in memory and an empty image directory; returns a function that
    starts a new run (memory forgotten, the directory kept). No pool, as with fresh_images."""
    monkeypatch.setenv(pool.ENV, "off")
    monkeypatch.setattr(diskimage, "_directory", str(tmp_path / "images"))
    os.mkdir(str(tmp_path / "images"), 0o700)

    def new_run():
        monkeypatch.setattr(image, "_seen", type(image._seen)())
        monkeypatch.setattr(image, "_images", type(image._images)())

    new_run()
    return new_run


@pytest.mark.parametrize("spec,overrides", SPECS, ids=["cpu-only", "dgx-h100-overridden"])
def test_a_node_from_the_image_is_the_node_the_builder_makes(
    fresh_images, builder_runs, spec, overrides
):
    nodes = []
    try:
        for built_so_far in (1, 2, 2):  # built, built and kept, written from the image
            nodes.append(FakeNode.build_temp(spec, overrides))
            assert len(builder_runs) == built_so_far
        assert len(image._images) == 1, "the second build keeps an image"
        reference = nodes[0]  # the builder's node: no image of the spec existed, none was kept
        want = tree(reference.root)
        for built in nodes[1:]:
            assert tree(built.root) == want
            assert built.pci_paths == reference.pci_paths
            assert built.spec == reference.spec
            assert built.env.keys() == reference.env.keys()
            assert (built.lib_path is None) == (reference.lib_path is None)
            assert os.path.relpath(str(built.state_path), str(built.root)) == os.path.relpath(
                str(reference.state_path), str(reference.root)
            )
    finally:
        for built in nodes:
            built.cleanup()


def test_nodes_from_one_image_share_nothing(fresh_images):
    nodes = [FakeNode.build_temp("cpu-only") for _ in range(4)]
    try:
        third, fourth = nodes[2], nodes[3]
        loadavg = fourth.path("/proc/loadavg").read_text()
        third.write("/proc/loadavg", "99.0 99.0 99.0 1/1 1")
        third.set_state("driver_loaded", 0)
        third.path("/sys/devices/system/cpu/online").unlink()
        assert fourth.path("/proc/loadavg").read_text() == loadavg
        assert fourth.state()["driver_loaded"] == "1"
        assert fourth.path("/sys/devices/system/cpu/online").is_file()
        fifth = FakeNode.build_temp("cpu-only")
        nodes.append(fifth)
        assert fifth.path("/proc/loadavg").read_text() == loadavg
        assert fifth.path("/sys/devices/system/cpu/online").is_file()
    finally:
        for built in nodes:
            built.cleanup()


def test_an_image_is_never_used_for_another_spec(fresh_images, monkeypatch):
    """Overrides that differ from a kept spec in one value get a node built for them."""
    overrides = {"cpu": {"offline": "3"}}
    nodes = [FakeNode.build_temp("cpu-only") for _ in range(3)]
    try:
        nodes.append(build_without_images(monkeypatch, "cpu-only", overrides))
        for _ in range(3):
            nodes.append(FakeNode.build_temp("cpu-only", overrides))
        plain, want = tree(nodes[2].root), tree(nodes[3].root)
        assert plain != want
        for built in nodes[4:]:
            assert tree(built.root) == want
            assert built.path("/sys/devices/system/cpu/offline").read_text() == "3\n"
    finally:
        for built in nodes:
            built.cleanup()


def test_a_changed_library_source_is_another_key(monkeypatch, tmp_path):
    spec = node.load_spec("cpu-only")
    before = image.spec_key(spec, True)
    assert image.spec_key(spec, False) != before
    monkeypatch.setenv("CC", "clang")
    assert image.spec_key(spec, True) != before


def test_a_later_runs_first_node_comes_from_disk_and_is_the_builders(disk_images, monkeypatch):
    """The DGX spec with overrides: its image holds the fake library too, checked against the
    library compiled now (a new gcc or nvml.h compiles another: the image is stale)."""
    spec, overrides = SPECS[1]
    nodes = []
    try:
        reference = build_without_images(monkeypatch, spec, overrides)
        nodes.append(reference)
        nodes.append(FakeNode.build_temp(spec, overrides))  # built, and its image kept on disk
        assert len(os.listdir(diskimage.directory())) == 1
        disk_images()
        with monkeypatch.context() as patch:  # the builder must not run for this one
            patch.setattr(node, "write_sysfs", None)
            nodes.append(FakeNode.build_temp(spec, overrides))
        want = tree(reference.root)
        for built in nodes[1:]:
            assert tree(built.root) == want
            assert built.pci_paths == reference.pci_paths
        key = image.spec_key(reference.spec, True)
        assert diskimage.load(key) is not None
        monkeypatch.setattr(diskimage, "_library_now", lambda: b"another library")
        assert diskimage.load(key) is None
    finally:
        for built in nodes:
            built.cleanup()


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: blob[: len(blob) // 2],
        lambda blob: b"not an image",
        lambda blob: zlib.compress(marshal.dumps((1, ["../escape"], [], [], {}))),
        lambda blob: zlib.compress(marshal.dumps((2,) + marshal.loads(zlib.decompress(blob))[1:])),
    ],
    ids=["truncated", "garbage", "path-leaving-the-root", "another-format"],
)
def test_a_damaged_disk_image_is_ignored_and_the_node_built(disk_images, damage):
    """Not read back whole, not this format, or a path outside the node: no image (lookup's None
    is what makes build_node run the builder, as test_an_image_is_never_used_for_another_spec
    checks for a spec never built)."""
    FakeNode.build_temp("cpu-only").cleanup()  # its image kept on disk
    key = image.spec_key(node.load_spec("cpu-only"), False)
    path = os.path.join(diskimage.directory(), diskimage.file_name(key))
    with open(path, "rb") as handle:
        blob = handle.read()
    disk_images()
    assert diskimage.load(key) is not None
    with open(path, "wb") as handle:
        handle.write(damage(blob))
    assert diskimage.load(key) is None
    assert image.lookup(key) is None


def test_an_edited_builder_names_another_image(monkeypatch):
    before = diskimage.file_name("some key")
    monkeypatch.setattr(diskimage, "_builder_digest", "0" * 64)
    assert diskimage.file_name("some key") != before
