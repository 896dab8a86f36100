"""Site-specific checks: Python files dropped into /etc/slurm-hooks/checks.d/.

Each `*.py` file there is imported once, in name order, right after the built-in check modules
(registry.load_builtin_checks). Its `@gatherer`/`@check` markers (from slurm_hooks.registry)
register exactly like the built-in ones, so a site check gets a config table
(`[checks."site.hugepages"]`), appears in `slurm-hooks list`, and is judged by the same policy.

The files run as root in every prolog, so they are held to the same rule as the configuration:
file and directory owned by root and not group/world-writable (SLURM_HOOKS_ALLOW_INSECURE_CONFIG=1
lifts this for tests and development). A file that cannot be loaded (syntax error, failing import,
a check name that is already taken) is a configuration error naming the file: hooks log it and
fail open (exit 0, nothing drained), `slurm-hooks check` exits 3 (UNKNOWN). Fix or remove the file.

SLURM_HOOKS_CHECKS_DIR names another directory; set to the empty string it loads no site checks
(the build tools use that, so a build host's own site checks never leak into generated files).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import List, Optional

from .config import ConfigError, _check_secure

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
    names = sorted(os.path.basename(path) for path in glob.glob(os.path.join(directory, "*.py")))
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
        raise PluginError("%s: site check file names must be Python identifiers (letters, digits, _), "
                          "e.g. %s.py" % (path, "".join(c if c.isalnum() else "_" for c in stem)))
    try:
        _check_secure(path)
    except ConfigError as exc:
        raise PluginError("site check %s" % exc) from None
    name = MODULE_PREFIX + stem
    if name in sys.modules:
        return name
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError("%s: cannot be imported as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # anything a site file raises: our caller must fail open, not crash
        del sys.modules[name]
        raise PluginError("%s: cannot load site check: %s: %s" % (path, type(exc).__name__, exc)) from None
    return name
