"""Released node trees kept in this process and turned into the next requested node.

Creating and removing a DGX tree's ~6,000 inodes was most of what the fast tier's fake nodes cost
(~70 ms of CPU a node, two thirds of it in the kernel). FakeNode.cleanup() hands a tree built by
build_temp to this pool instead of removing it; a later build_temp takes it back and writes only
what differs between the image the tree was handed out as (image.py) and the image of the spec
asked for now, plus every path the test that used it changed. Nothing else is trusted:

- What a test changed comes from the kernel: every directory of the tree has an inotify watch from
  the moment the node is handed out, so each write, truncate, chmod/chown, utime, create, delete and
  rename of an entry, made by any process through a path or an open file, queues an event naming
  the entry. Those entries are removed and written again from the image. A change to a directory
  itself (removed, moved, its mode), a lost event (queue overflow), or an event the pool cannot
  place makes the tree unusable: it is removed and the node built as before.
- The events the pool's own writes cause must be exactly the ones expected (the paths it wrote);
  any other means someone else wrote meanwhile, and the node is built instead.
- The fake libnvidia-ml.so.1 is written again (a new inode) for every node: glibc's dlopen hands
  back an already loaded library when the file is the same inode, whatever its path, and pynvml
  keeps the previous test's library loaded in this process.
- The tree is renamed to a new mkdtemp name for every node, so roots are never reused while this
  process may remember one (nvml sessions, Host caches, a test comparing roots); a released root's
  path is gone at once, as if removed. Only the pool's own process takes from it (a forked child
  inherits the pool's memory, not its trees).

What the pool cannot see: a write through a hard link made outside the tree, or through a shared
writable mmap of a tree file (tmpfs does not report those). No test does either; one that must
calls node.cleanup(reuse=False). FAKENODE_POOL=off turns the pool off (every node built and removed).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import struct
import tempfile
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from .fsutil import remove_tree

ENV = "FAKENODE_POOL"
# idle trees kept per process: a DGX tree is ~25 MB of tmpfs; tests that hold several nodes at
# once are rare, and a spec's own tree (the usual next request) is almost always among the last few
MAX_POOLED = 3
# a tree is made into another spec's node when at most this share of its files differ, or when the
# pool is full: past it, turning a tree costs more than writing the node from its image
MAX_DIFFERING = 0.25
# _turn_into looks at the events it caused every so many writes, before they fill the queue
CHECK_EVERY = 1000

# <sys/inotify.h>
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000
# every change to an entry or a directory (a write, truncate or fallocate is an IN_MODIFY). Left
# out: reads (IN_ACCESS, IN_OPEN, IN_CLOSE_NOWRITE), as the checks under test read the whole tree,
# and IN_CLOSE_WRITE, which only doubles IN_MODIFY (the queue holds 16,384 events by default)
WATCHED = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
)
SELF_EVENTS = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class Tree:
    """One tree the pool follows: where it is, the image it equals apart from ``dirty`` (paths
    relative to the root that events named), and whether it can still be used at all."""

    def __init__(self, root: str, tree_image: Any, key: str) -> None:
        self.root = root
        self.image = tree_image
        self.key = key
        self.dirty: Set[str] = set()
        self.broken = False
        self.watches: Dict[int, str] = {}  # wd -> directory relative to the root ("" = root)


class _Inotify:
    """One inotify instance for the process (max_user_instances is small and shared)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd = fd

    def add(self, path: str) -> int:
        wd = self._add(self.fd, os.fsencode(path), WATCHED)
        if wd < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch", path)
        return wd

    def read(self) -> List[Tuple[int, int, str]]:
        """Every queued event as (wd, mask, name)."""
        events = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = os.fsdecode(data[offset : offset + length].rstrip(b"\0"))
                offset += length
                events.append((wd, mask, name))


class Pool:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.inotify = _Inotify()
        self.by_wd: Dict[int, Tree] = {}
        self.idle: List[Tree] = []  # released trees, oldest first
        self.active: Dict[str, Tree] = {}  # root -> tree handed out

    # ------------------------------------------------------------ following trees

    def _watch(self, tree: Tree, rel: str) -> None:
        wd = self.inotify.add(tree.root + "/" + rel if rel else tree.root)
        tree.watches[wd] = rel
        self.by_wd[wd] = tree

    def follow(self, root: str, tree_image: Any, key: str) -> None:
        """Watch a node just written (by the builder or from an image) before it is handed out."""
        with self.lock:
            self._follow(Tree(root, tree_image, key))

    def _follow(self, tree: Tree) -> None:
        try:
            self._watch(tree, "")
            for rel in tree.image.dirs:
                self._watch(tree, rel)
        except OSError:  # out of watches: this node is removed as before, never pooled
            self._forget(tree)
            return
        self.active[tree.root] = tree

    def forget(self, root: str) -> None:
        """Stop following the tree at root (its owner removes it)."""
        with self.lock:
            tree = self.active.pop(root, None)
            if tree is not None:
                self._forget(tree)

    def _forget(self, tree: Tree) -> None:
        for wd in tree.watches:
            self.by_wd.pop(wd, None)
        tree.watches.clear()

    def _dispatch(self) -> List[Tuple[Tree, int, str, str]]:
        """Read the queue; returns (tree, mask, directory, name) of each event on a followed tree."""
        placed = []
        for wd, mask, name in self.inotify.read():
            if mask & IN_Q_OVERFLOW:  # events were lost: nothing followed can be trusted
                for tree in list(self.by_wd.values()):
                    tree.broken = True
                continue
            tree = self.by_wd.get(wd)
            if tree is None:  # a watch of a tree already removed
                continue
            rel = tree.watches.get(wd, "")
            if mask & IN_IGNORED:
                self.by_wd.pop(wd, None)
                tree.watches.pop(wd, None)
            placed.append((tree, mask, rel, name))
        return placed

    def _note_changes(self) -> None:
        """What tests changed since the last look, on every followed tree."""
        for tree, mask, rel, name in self._dispatch():
            _record(tree, mask, rel, name)

    # ------------------------------------------------------------ release and take

    def release(self, root: str) -> bool:
        """Keep the tree at root for a later node; False when it is not the pool's to keep."""
        with self.lock:
            return self._release(root)

    def _release(self, root: str) -> bool:
        tree = self.active.pop(root, None)
        if tree is None:
            return False
        self._note_changes()
        if tree.broken:
            self._discard(tree)
            return True
        parked = tempfile.mkdtemp(prefix="fakenode-pooled-", dir=os.path.dirname(root))
        try:
            os.rename(root, parked)
        except OSError:  # the test moved or removed its root itself
            os.rmdir(parked)
            self._forget(tree)
            return False
        tree.root = parked
        self.idle.append(tree)
        while len(self.idle) > MAX_POOLED:
            self._discard(self.idle.pop(0))
        return True

    def take(self, key: str, tree_image: Any, directory: Optional[str]) -> Optional[str]:
        """A root holding exactly tree_image (a new temp dir name), made from an idle tree; None
        when there is none that can be used."""
        with self.lock:
            return self._take(key, tree_image, directory)

    def _take(self, key: str, tree_image: Any, directory: Optional[str]) -> Optional[str]:
        self._note_changes()
        for tree in [t for t in self.idle if t.broken]:
            self.idle.remove(tree)
            self._discard(tree)
        if not self.idle:
            return None
        same = [t for t in self.idle if t.key == key]
        if same:
            tree = same[-1]
        else:
            differing, best = min(
                (_differing(t.image, tree_image), i) for i, t in enumerate(self.idle)
            )
            if differing > len(tree_image.files) * MAX_DIFFERING and len(self.idle) < MAX_POOLED:
                # written from its image costs less, and the idle trees stay for their specs; with
                # the pool full, one of them would be removed at the next release anyway, and
                # turning a tree costs at most what removing one and writing another does
                return None
            tree = self.idle[best]
        self.idle.remove(tree)
        root = tempfile.mkdtemp(prefix="fakenode-", dir=directory)
        try:
            os.rename(tree.root, root)
        except OSError:
            os.rmdir(root)
            self._discard(tree)
            return None
        tree.root = os.path.realpath(root)
        try:
            self._check_own_events(tree, self._turn_into(tree, tree_image))
        except OSError:
            tree.broken = True
        if tree.broken:
            self._discard(tree)
            return None
        tree.image, tree.key, tree.dirty = tree_image, key, set()
        self.active[tree.root] = tree
        return tree.root

    def _check_own_events(self, tree: Tree, expected: Set[str]) -> None:
        """tree is broken unless every event on it so far is one of the pool's own writes
        (expected: the paths written or removed so far)."""
        for other, mask, rel, name in self._dispatch():
            if other is not tree:  # a node the running test holds as well
                _record(other, mask, rel, name)
            elif not _ours(mask, rel, name, expected):
                tree.broken = True

    def _turn_into(self, tree: Tree, target: Any) -> Set[str]:
        """Write the difference between tree.image (less tree.dirty) and target under tree.root;
        returns the paths written or removed (the events they cause are expected)."""
        old, new = _index(tree.image), _index(target)
        base = tree.root + "/"
        touched = set(tree.dirty)
        for rel in sorted(tree.dirty, key=len, reverse=True):
            _remove_entry(base + rel)
        # what differs, and the library always: its inode must be new (see the module docstring)
        if old is new:  # the same spec again: only the library differs
            stale_files = [rel for rel in new.library if rel not in tree.dirty]
            stale_links: List[str] = []
        else:
            stale_files = [
                rel
                for rel, content in old.files.items()
                if rel not in tree.dirty and (new.files.get(rel) != content or rel in new.library)
            ]
            stale_links = [
                rel
                for rel, target_path in old.links.items()
                if rel not in tree.dirty and new.links.get(rel) != target_path
            ]
        touched.update(stale_files, stale_links)
        for done, rel in enumerate(stale_files + stale_links, 1):
            os.unlink(base + rel)
            if done % CHECK_EVERY == 0:
                self._check_own_events(tree, touched)
        gone_dirs = [rel for rel in old.dirs if rel not in new.dir_set]
        for rel in reversed(gone_dirs):  # children before parents
            os.rmdir(base + rel)
        touched.update(gone_dirs)
        for rel in target.dirs:
            if rel not in old.dir_set:
                os.mkdir(base + rel)
                touched.add(rel)
                self._watch(tree, rel)
        absent = tree.dirty.union(stale_files, stale_links)
        from .image import write_file

        for rel, data, mode in target.files:
            if rel in absent or rel not in old.files:
                touched.add(rel)
                write_file(base + rel, data, mode)
                if len(touched) % CHECK_EVERY == 0:
                    self._check_own_events(tree, touched)
        for rel, target_path in target.links:
            if rel in absent or rel not in old.links:
                touched.add(rel)
                os.symlink(target_path, base + rel)
        return touched

    def _discard(self, tree: Tree) -> None:
        self._forget(tree)
        remove_tree(tree.root)

    def empty(self) -> None:
        """Remove every idle tree (the session's end, the process's exit)."""
        with self.lock:
            self._note_changes()
            while self.idle:
                self._discard(self.idle.pop())

    def close(self) -> None:
        """Empty the pool and close its inotify instance (a test's own pool)."""
        with self.lock:
            self.empty()
            for tree in list(self.active.values()):
                self._forget(tree)
            self.active.clear()
            os.close(self.inotify.fd)


def _record(tree: Tree, mask: int, rel: str, name: str) -> None:
    """One event on a followed tree: the entry it names is dirty; a directory's own change breaks it."""
    if mask & SELF_EVENTS or not name:
        if not (mask & IN_MOVE_SELF and not rel):  # the root moving is the pool's own rename
            tree.broken = True
        return
    path = rel + "/" + name if rel else name
    if mask & IN_ISDIR and path in _index(tree.image).dir_set:
        tree.broken = True  # a directory of the image changed (moved, removed, chmod)
        return
    tree.dirty.add(path)


def _ours(mask: int, rel: str, name: str, expected: Set[str]) -> bool:
    """Whether an event after _turn_into is one its own writes cause."""
    if mask & IN_Q_OVERFLOW:
        return False
    if not name:  # a directory's own event: the root renamed, or a directory _turn_into removed
        if mask & IN_MOVE_SELF and not rel:
            return True
        return bool(mask & (IN_DELETE_SELF | IN_IGNORED)) and rel in expected
    return (rel + "/" + name if rel else name) in expected


def _remove_entry(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _differing(old_image: Any, new_image: Any) -> int:
    """How many files turning old_image into new_image writes or removes (which idle tree to take)."""
    old, new = _index(old_image), _index(new_image)
    changed = sum(1 for rel, content in old.files.items() if new.files.get(rel) != content)
    return changed + sum(1 for rel in new.files if rel not in old.files)


class _Index:
    def __init__(self, tree_image: Any) -> None:
        from .fakenvml import SONAME

        self.files = {rel: (data, mode) for rel, data, mode in tree_image.files}
        self.links = dict(tree_image.links)
        self.dirs = tree_image.dirs
        self.dir_set = set(tree_image.dirs)
        self.library = {rel for rel in self.files if rel.rsplit("/", 1)[-1] == SONAME}


def _index(tree_image: Any) -> _Index:
    """Lookups over an image, made once per image object (images are never changed once taken)."""
    found = getattr(tree_image, "_pool_index", None)
    if found is None:
        found = _Index(tree_image)
        tree_image._pool_index = found
    return found


_pool: Optional[Pool] = None
_unavailable = False


def pool() -> Optional[Pool]:
    """This process's pool, or None: turned off, no inotify here, or a forked child of the owner."""
    global _pool, _unavailable
    if _unavailable or os.environ.get(ENV, "") == "off":
        return None
    if _pool is not None:
        return _pool if _pool.pid == os.getpid() else None
    try:
        _pool = Pool()
    except (OSError, AttributeError):  # no inotify (not Linux, or the instances are used up)
        _unavailable = True
        return None
    atexit.register(empty)
    return _pool


def empty() -> None:
    """Remove this process's idle trees (only the owner's: a forked child must not)."""
    if _pool is not None and _pool.pid == os.getpid():
        _pool.empty()
