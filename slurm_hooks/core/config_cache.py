"""The parsed TOML of the configuration files, kept for root's next hook: no `tomllib` per job.

`tomllib` and what it imports (`string`, `datetime`, its patterns) and the parse of the example
configuration cost ~5 ms of every prolog before its check process can start (issue 29, round 7).
The parse is a pure function of a file's bytes, so the cache is keyed on the bytes themselves, not
on a file's size or times: a file is taken from here only when what was read from it now is equal,
byte for byte, to what the cached table was parsed from. A configuration an admin changed, however
quickly, with whatever times, is parsed again; it cannot be served stale. What is cached is only
tomllib's answer: the ownership rule (config_files.check_secure) and the validation run as before.

Only root's processes use it (the hooks run as root): the file decides what the hooks do, so it lives
in a directory nobody else can change (core/dir_trust.py), is created 0600 by root and is read only
when owned by root and not a link. On any doubt (not root, an untrusted directory, an unreadable,
truncated or foreign file, a value marshal cannot store, such as a TOML date) the file is parsed as
before; a failure to write the cache is silent. $SLURM_HOOKS_CONFIG_CACHE names another directory,
or turns it off with "off" (the test suite does).
"""

from __future__ import annotations

import marshal  # built in: no import cost, unlike pickle; loads only what a trusted root file holds
import os
import stat
import sys

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional
CACHE_ENV = "SLURM_HOOKS_CONFIG_CACHE"
DEFAULT_DIR = "/run/slurm-hooks"  # tmpfs: starts empty after each boot
FILE_NAME = "config-parsed.marshal"
# what a cached table depends on besides the bytes: the interpreter (its tomllib) and marshal's format
_STAMP = "slurm-hooks config cache 1|%s|%d" % (sys.version, marshal.version)
_MAX_BYTES = 1 << 20  # a cache file larger than this is not ours to load


def directory() -> Optional[str]:
    """Where root's cache lives, or None: not root, turned off, or a Python before 3.11, where the
    'toml' package parses (its version can change under the same interpreter, and the stamp would
    need an import of it to know: what the cache is there to avoid)."""
    if os.geteuid() != 0 or sys.version_info < (3, 11):
        return None
    chosen = os.environ.get(CACHE_ENV, DEFAULT_DIR)
    if not chosen or chosen == "off" or not os.path.isabs(chosen):
        return None
    return chosen


def load() -> Dict[bytes, Any]:
    """{file bytes: parsed table} from root's cache; {} on any doubt. Never raises: a bug here must
    not turn into a configuration error (the hook would fail open and skip its checks)."""
    try:
        return _load()
    except Exception:  # noqa: BLE001  (parse as before)
        return {}


def _load() -> Dict[bytes, Any]:
    where = directory()
    if where is None:
        return {}
    try:
        from .dir_trust import untrusted_because

        if untrusted_because(where) is not None:
            return {}
        fd = os.open(os.path.join(where, FILE_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != 0
            or info.st_mode & 0o077
            or info.st_size > _MAX_BYTES
        ):
            return {}
        data = os.read(fd, _MAX_BYTES + 1)
    except OSError:
        return {}
    finally:
        os.close(fd)
    try:
        stamp, tables = marshal.loads(data)
    except Exception:  # noqa: BLE001  (truncated or foreign: parse as before)
        return {}
    if stamp != _STAMP or not isinstance(tables, dict):
        return {}
    return tables


def parsed(raw: bytes, cached: Dict[bytes, Any], parse: Callable[[], Any]) -> Any:
    """The table `raw` parses to: the cached one when it was parsed from these very bytes, else
    parse() (whose errors are raised as they are, and never cached)."""
    table = cached.get(raw)
    if isinstance(table, dict):
        return table
    return parse()


def store(tables: Dict[bytes, Any]) -> None:
    """Keep `tables` ({bytes: parsed table} of this load's files) for the next hook; silent on failure."""
    try:
        _store(tables)
    except Exception:  # noqa: BLE001  (no cache this time: the configuration is parsed already)
        pass


def _store(tables: Dict[bytes, Any]) -> None:
    where = directory()
    if where is None:
        return
    try:
        payload = marshal.dumps((_STAMP, tables))
    except ValueError:  # a TOML date or time: not something marshal stores, parse it every time
        return
    if len(payload) > _MAX_BYTES:
        return
    temporary = os.path.join(where, "%s.%d" % (FILE_NAME, os.getpid()))
    try:
        from .dir_trust import untrusted_because

        os.makedirs(where, mode=0o700, exist_ok=True)
        if untrusted_because(where) is not None:
            return
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, os.path.join(where, FILE_NAME))
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
