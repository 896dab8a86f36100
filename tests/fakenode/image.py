"""A built node's tree kept in memory and written out again for the next node of the same spec.

Building a DGX tree resolves the spec, lays out the PCI topology and formats ~4800 files; the suite
builds the same few specs over and over (the plain dgx-h100 most of all). An image is taken the second
time a spec is built in this process (a spec built once never pays for it) and the third and later
builds write its bytes back: the same directories, file contents, modes and symlink targets the
builder wrote, nothing shared between two nodes, so a test can still change its node freely.
The key is the resolved spec (and the library's source), not the builder's code: a test that patches
the builder itself (none does) would have to set `lookup` to return None, as test_fakenode_image does.

Images are also kept on disk between runs (diskimage.py, in a directory only this user can write),
under a name that adds the builder's own source: most of the fast tier's ~150 specs are built once
or twice per worker, and a later run writes them all from there instead of building them again.
"""

from __future__ import annotations

import collections
import hashlib
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from . import diskimage, fakenvml

# distinct specs whose image is kept (a DGX image is ~0.7 MB); the least recently built goes first
MAX_IMAGES = 32


class TreeImage:
    """The directories (parents first), regular files (path, bytes, mode) and symlinks (path,
    target) under a root, paths relative to it. Node trees hold nothing else (fsutil.Tree)."""

    def __init__(self) -> None:
        self.dirs: List[str] = []
        self.files: List[Tuple[str, bytes, int]] = []
        self.links: List[Tuple[str, str]] = []

    @classmethod
    def take(cls, root: str) -> "TreeImage":
        image = cls()
        image._scan(root, "")
        return image

    def _scan(self, directory: str, rel: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                path = rel + entry.name
                if entry.is_symlink():
                    self.links.append((path, os.readlink(entry.path)))
                elif entry.is_dir():
                    self.dirs.append(path)
                    self._scan(entry.path, path + "/")
                elif entry.is_file():
                    with open(entry.path, "rb") as handle:
                        data = handle.read()
                    self.files.append((path, data, stat.S_IMODE(entry.stat().st_mode)))
                else:  # a fifo or device: the builder never makes one, so the image cannot copy it
                    raise ValueError("%s is neither file, directory nor symlink" % entry.path)

    def write_to(self, root: str) -> None:
        """Write the tree under ``root`` (which must not hold any of it yet)."""
        os.makedirs(root, exist_ok=True)
        base = root + "/"
        for rel in self.dirs:
            os.mkdir(base + rel)
        for rel, data, mode in self.files:
            write_file(base + rel, data, mode)
        for rel, target in self.links:
            os.symlink(target, base + rel)


def write_file(path: str, data: bytes, mode: int) -> None:
    """Create one file of an image (it must not exist): its bytes and its mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)
    if mode & ~0o644:  # os.open's mode passes through the umask; a chmod makes it exact
        os.chmod(path, mode)


_seen: "collections.Counter[str]" = collections.Counter()
_images: "collections.OrderedDict[str, Tuple[TreeImage, Dict[str, str]]]" = (
    collections.OrderedDict()
)


def spec_key(spec: Dict[str, Any], with_library: bool) -> str:
    """Equal keys, equal trees: the resolved spec (plain dicts, lists, numbers and strings, whose
    repr is exact) and what the fake library is compiled from (its source and the compiler's
    settings; build_library's content hash would cost a `gcc --version` per node)."""
    library = ""
    if with_library:
        source = os.stat(str(fakenvml.SOURCE))
        library = "%d:%d:%s:%s" % (
            source.st_mtime_ns,
            source.st_size,
            os.environ.get("CC", ""),
            os.environ.get("FAKENVML_INCLUDE", ""),
        )
    return hashlib.sha256((repr(spec) + "\0" + library).encode()).hexdigest()


def lookup(key: str) -> Optional[Tuple[TreeImage, Dict[str, str]]]:
    """The image and PCI paths of an earlier build of this key (this process's, else one kept on
    disk by an earlier run), or None; counts the build."""
    _seen[key] += 1
    found = _images.get(key)
    if found is not None:
        _images.move_to_end(key)
        return found
    loaded = diskimage.load(key)
    if loaded is None:
        return None
    image = TreeImage()
    image.dirs, image.files, image.links = loaded[0], loaded[1], loaded[2]
    _remember(key, (image, loaded[3]))
    return image, loaded[3]


def wanted(key: str) -> bool:
    """Whether a tree just built for key should be kept: the second build of a spec, or the first
    when it can go to disk for the next run."""
    return key not in _images and (_seen[key] >= 2 or diskimage.enabled())


def keep(key: str, root: str, pci_paths: Dict[str, str]) -> TreeImage:
    image = TreeImage.take(root)
    _remember(key, (image, dict(pci_paths)))
    diskimage.save(key, image.dirs, image.files, image.links, dict(pci_paths))
    return image


def _remember(key: str, entry: Tuple[TreeImage, Dict[str, str]]) -> None:
    _images[key] = entry
    while len(_images) > MAX_IMAGES:
        _images.popitem(last=False)
