"""Configuration files: where they are, who may have written them, how they are parsed.

The main file is /etc/slurm-hooks/config.toml (or --config / $SLURM_HOOKS_CONFIG), then conf.d/*.toml
beside it. Every file (and its directory) must be owned by root and not group/world-writable: these
files decide whether nodes get drained. Site checks (core/plugins.py) pass the same ownership rule.
Kept apart from config.py (validation) so that plugins.py can refuse a file without importing the
configuration schema (config -> registry -> plugins would import config again).
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple
DEFAULT_CONFIG = "/etc/slurm-hooks/config.toml"
INSECURE_OVERRIDE_ENV = "SLURM_HOOKS_ALLOW_INSECURE_CONFIG"
CONFIG_ENV = "SLURM_HOOKS_CONFIG"


class ConfigError(Exception):
    """A configuration problem; the message names the file and key."""


def config_files(path: Optional[str] = None) -> Tuple[List[str], bool]:
    """The files to read, in order, and whether the main file is required to exist."""
    explicit = path or os.environ.get(CONFIG_ENV)
    main = explicit or DEFAULT_CONFIG
    dropin_dir = os.path.join(os.path.dirname(main), "conf.d")
    files = [main] if os.path.exists(main) or explicit else []
    files += sorted(names_ending(dropin_dir, ".toml"))
    return files, bool(explicit)


def names_ending(directory: str, suffix: str) -> List[str]:
    """The paths `glob.glob(directory + "/*" + suffix)` gives (for a suffix with no pattern
    character): every entry whose name ends with `suffix`, hidden ones (a leading '.') left out,
    none when the directory cannot be listed; unsorted. Without glob's import and the patterns it
    compiles (~0.5 ms of every hook before its check process's fork, round 8); `directory` is taken
    as it is written, where glob read '[', '*' and '?' in it as a pattern."""
    try:
        names = os.listdir(directory)
    except OSError:  # (a NUL in the path raises ValueError, as it did through glob)
        return []
    return [
        os.path.join(directory, name)
        for name in names
        if name.endswith(suffix) and not name.startswith(".")
    ]


def parse_toml(file: str) -> Dict[str, Any]:
    """The TOML table in `file`; ConfigError naming the file when it cannot be read, is not UTF-8 or not TOML."""
    return parse_bytes(file, read_bytes(file))


def read_bytes(file: str) -> bytes:
    """What `file` holds; ConfigError naming it when it cannot be read."""
    try:
        with open(file, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError("%s: cannot read: %s" % (file, exc.strerror or exc)) from None


def parse_bytes(file: str, raw: bytes) -> Dict[str, Any]:
    """The TOML table in `raw`, read from `file`; ConfigError naming it when not UTF-8 or not TOML."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("%s: not UTF-8 text (byte %d)" % (file, exc.start)) from None
    try:
        return toml_loads(text)
    except Exception as exc:  # tomllib.TOMLDecodeError / toml.TomlDecodeError and friends
        raise ConfigError("%s: invalid TOML: %s" % (file, exc)) from None


def toml_loads(text: str) -> Dict[str, Any]:
    """tomllib on Python >= 3.11, else the 'toml' package (the same tables for every file we read)."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin (guarded by the version check above)

        return tomllib.loads(text)
    import toml  # Python < 3.11: the 'toml' package (a declared dependency there)

    return toml.loads(text)


def check_secure(file: str) -> None:
    """Refuse files (and their directory) that someone other than root could have written."""
    if os.environ.get(INSECURE_OVERRIDE_ENV) == "1":
        return
    for target in (file, os.path.dirname(os.path.abspath(file))):
        try:
            info = os.stat(target)
        except OSError as exc:
            raise ConfigError("%s: cannot stat: %s" % (target, exc.strerror or exc)) from None
        if info.st_uid != 0:
            raise ConfigError(
                "%s: owned by uid %d, not root; refusing it (set %s=1 only for tests)"
                % (target, info.st_uid, INSECURE_OVERRIDE_ENV)
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                "%s: group- or world-writable (mode %04o); refusing it: chmod go-w"
                % (target, stat.S_IMODE(info.st_mode))
            )
