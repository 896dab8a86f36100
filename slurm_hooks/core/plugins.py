"""Site-specific checks: Python files dropped into /etc/slurm-hooks/checks.d/.

Each `*.py` file there is imported once, in name order, right after the built-in check modules
(registry.load_builtin_checks). Its `@gatherer`/`@check` markers (from slurm_hooks.registry)
register exactly like the built-in ones, so a site check gets a config table
(`[checks."site.hugepages"]`), appears in `slurm-hooks list`, and is judged by the same policy.

The files run as root in every prolog, so they are held to the same rule as the configuration:
file and directory owned by root and not group/world-writable (SLURM_HOOKS_ALLOW_INSECURE_CONFIG=1
lifts this for tests and development). The source is what runs: it is read from the file we
checked (opened with O_NOFOLLOW, its owner and mode checked on the open descriptor) and compiled
in memory. No bytecode is read from or written to checks.d/__pycache__, whose ownership nobody
checks: a .pyc planted there by another user would otherwise run as root in every prolog.
A file that cannot be loaded (syntax error, failing import,
a check name that is already taken) is a configuration error naming the file: hooks log it and
fail open (exit 0, nothing drained), `slurm-hooks check` exits 3 (UNKNOWN). Fix or remove the file.

SLURM_HOOKS_CHECKS_DIR names another directory; set to the empty string it loads no site checks
(the build tools use that, so a build host's own site checks never leak into generated files).
"""

from __future__ import annotations

import os
import stat
import sys
import types

from .config_files import INSECURE_OVERRIDE_ENV, ConfigError, check_secure, names_ending

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import List, Optional

MAX_SOURCE = 4 << 20  # bytes of one site check file

SITE_CHECKS_DIR = "/etc/slurm-hooks/checks.d"
CHECKS_DIR_ENV = "SLURM_HOOKS_CHECKS_DIR"
MODULE_PREFIX = "slurm_hooks_site."


class PluginError(ConfigError):
    """A site check file that must not or could not be loaded; the message names the file."""


def site_checks_dir() -> Optional[str]:
    """The drop-in directory in force, or None when site checks are switched off."""
    directory = os.environ.get(CHECKS_DIR_ENV, SITE_CHECKS_DIR)
    return directory or None


def site_check_files(directory: str) -> List[str]:
    """`*.py` in `directory`, sorted by name; hidden files and `_private.py` helpers are left out."""
    names = sorted(os.path.basename(path) for path in names_ending(directory, ".py"))
    return [os.path.join(directory, name) for name in names if not name.startswith((".", "_"))]


def load_site_checks(directory: Optional[str] = None) -> List[str]:
    """Import every site check file (registering its checks); return the module names loaded.

    A missing directory is normal (no site checks). Modules already loaded are not run twice.
    """
    directory = directory if directory is not None else site_checks_dir()
    if not directory or not os.path.isdir(directory):
        return []
    loaded = []
    for path in site_check_files(directory):
        loaded.append(_load_file(path))
    return loaded


def _load_file(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    if not stem.isidentifier():
        raise PluginError(
            "%s: site check file names must be Python identifiers (letters, digits, _), "
            "e.g. %s.py" % (path, "".join(c if c.isalnum() else "_" for c in stem))
        )
    try:
        check_secure(path)
    except ConfigError as exc:
        raise PluginError("site check %s" % exc) from None
    name = MODULE_PREFIX + stem
    if name in sys.modules:
        return name
    source = _read_source(path)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    try:
        code = compile(source, path, "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102  (the whole point: a root-owned site check, from its source)
    except Exception as exc:  # anything a site file raises: our caller must fail open, not crash
        del sys.modules[name]
        raise PluginError(
            "%s: cannot load site check: %s: %s" % (path, type(exc).__name__, exc)
        ) from None
    return name


def _read_source(path: str) -> bytes:
    """The file's bytes, read from the descriptor whose owner and mode are checked (no symlink, no
    swap between the check and the read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise PluginError("%s: cannot open site check: %s" % (path, exc.strerror or exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PluginError("%s: not a regular file" % path)
        if os.environ.get(INSECURE_OVERRIDE_ENV) != "1" and (
            info.st_uid != 0 or info.st_mode & 0o022
        ):
            raise PluginError(
                "site check %s: owned by uid %d, mode %04o: must be root's and not group/world-writable"
                % (path, info.st_uid, stat.S_IMODE(info.st_mode))
            )
        chunks = []
        size = 0
        while size <= MAX_SOURCE:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise PluginError("%s: larger than %d bytes" % (path, MAX_SOURCE))
    finally:
        os.close(fd)
