"""Node images (image.py) kept on disk between test runs, one compressed file per spec.

Within one process image.py writes a spec's third and later nodes from memory; but the fast tier
builds ~150 distinct specs, most of them once or twice in each xdist worker, and building a DGX tree
costs about three times writing it from an image. A file here lets the next run (and the other
workers) write even the first node of a spec from the image.

What keeps an image honest across runs: its file name hashes the image key (the resolved spec,
image.spec_key) with the source of the builder itself (every file of tests/fakenode), so an edited
builder never meets an image of the old one; a fake library in the image must be byte for byte the
one fakenvml.build_library() gives now (a new gcc or nvml.h recompiles it); and a file that does not
read back as an image (truncated, another format, a path leaving the root) is ignored, and the node
is built. The directory is <tmp>/fakenode-images-<uid>, only this user's (like fakenvml's cache),
or $FAKENODE_IMAGE_CACHE; FAKENODE_IMAGE_CACHE=off keeps images in memory only.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tests.helpers import private_directory

from . import fakenvml

FORMAT = 1
# a DGX image is ~100 KB compressed; the fast tier makes ~150 of them
MAX_DISK_IMAGES = 600
ENV = "FAKENODE_IMAGE_CACHE"

# None: not decided yet; "": no disk images in this process; else the directory (tests set it)
_directory: Optional[str] = None
_builder_digest: Optional[str] = None
_libraries: Dict[str, bytes] = {}

Loaded = Tuple[List[str], List[Tuple[str, bytes, int]], List[Tuple[str, str]], Dict[str, str]]


def directory() -> str:
    global _directory
    if _directory is None:
        chosen = os.environ.get(ENV, "")
        if chosen == "off" or not hasattr(os, "getuid"):
            _directory = ""
        else:
            default = "fakenode-images-%d" % os.getuid()
            _directory = private_directory(chosen or os.path.join(tempfile.gettempdir(), default))
    return _directory


def enabled() -> bool:
    return bool(directory())


def builder_digest() -> str:
    """sha256 of every file of the builder (tests/fakenode: code, specs, the library's source)."""
    global _builder_digest
    if _builder_digest is None:
        digest = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for path in sorted(here.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(here)).encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
        _builder_digest = digest.hexdigest()
    return _builder_digest


def file_name(key: str) -> str:
    return hashlib.sha256((key + "\0" + builder_digest()).encode()).hexdigest()[:32] + ".img"


def _library_now() -> Optional[bytes]:
    """The fake library this process would install (compiled once per content hash), or None
    when it cannot be built (then the node is built, and says why)."""
    settings = "%s:%s" % (os.environ.get("CC", ""), os.environ.get("FAKENVML_INCLUDE", ""))
    if settings not in _libraries:
        try:
            _libraries[settings] = fakenvml.build_library().read_bytes()
        except (fakenvml.FakeNvmlBuildError, OSError):
            return None
    return _libraries[settings]


def _inside(rel: Any) -> bool:
    return (
        isinstance(rel, str)
        and bool(rel)
        and not rel.startswith("/")
        and "\0" not in rel
        and ".." not in rel.split("/")
    )


def _checked(data: Any) -> Optional[Loaded]:
    """The image in data when it is one (the shapes save() writes, every path under the root)."""
    if not (isinstance(data, tuple) and len(data) == 5 and data[0] == FORMAT):
        return None
    _, dirs, files, links, paths = data
    if not all(isinstance(part, list) for part in (dirs, files, links)):
        return None
    if not isinstance(paths, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in paths.items()
    ):
        return None
    if not all(_inside(rel) for rel in dirs):
        return None
    for entry in files:
        if not (isinstance(entry, tuple) and len(entry) == 3 and _inside(entry[0])):
            return None
        if not (isinstance(entry[1], bytes) and isinstance(entry[2], int)):
            return None
    for entry in links:
        if not (isinstance(entry, tuple) and len(entry) == 2 and _inside(entry[0])):
            return None
        if not isinstance(entry[1], str):
            return None
    return dirs, files, links, paths


def _library_is_current(files: List[Tuple[str, bytes, int]]) -> bool:
    for rel, data, _mode in files:
        if rel.endswith("/" + fakenvml.SONAME):
            return data == _library_now()
    return True  # a spec without the library


def load(key: str) -> Optional[Loaded]:
    """The image kept for key by an earlier run, or None (none, unreadable or stale)."""
    where = directory()
    if not where:
        return None
    try:
        fd = os.open(os.path.join(where, file_name(key)), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            found = _checked(marshal.loads(zlib.decompress(handle.read())))
    except (OSError, ValueError, EOFError, TypeError, zlib.error):
        return None
    if found is None or not _library_is_current(found[1]):
        return None
    return found


def save(key: str, dirs: List[str], files: list, links: list, paths: Dict[str, str]) -> None:
    """Keep an image for the next run (written whole, then renamed: workers may race on a key)."""
    where = directory()
    if not where:
        return
    name = file_name(key)
    blob = zlib.compress(marshal.dumps((FORMAT, dirs, files, links, paths)), 1)
    temporary = os.path.join(where, ".%s.%d.tmp" % (name, os.getpid()))
    try:
        with open(temporary, "wb") as handle:
            handle.write(blob)
        os.replace(temporary, os.path.join(where, name))
        _prune(where)
    except OSError:  # a full disk costs this run's speed, never its result
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _prune(where: str) -> None:
    """Past MAX_DISK_IMAGES, the older half goes (specs no test builds any more)."""
    with os.scandir(where) as entries:
        kept = [(entry.stat().st_mtime, entry.path) for entry in entries if entry.is_file()]
    if len(kept) <= MAX_DISK_IMAGES:
        return
    kept.sort()
    for _mtime, path in kept[: len(kept) - MAX_DISK_IMAGES // 2]:
        try:
            os.unlink(path)
        except OSError:
            pass
