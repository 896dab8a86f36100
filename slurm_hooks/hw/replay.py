"""What `check --root DIR` may take from a captured tree: data to read, never code to run.

A capture is a tarball anyone can craft. Its `.slurm-hooks/config.toml` records the node's
configuration, but applying it would let the archive choose what runs on the analysing machine
(as root, when an admin replays a ticket's capture): `[nvml] library` is dlopen'ed,
`root_live_sources` reaches the live driver, `[paths]` decide where root writes. So only the
analysing machine's own configuration and command line choose libraries, live sources, site
checks and paths (DESIGN.md principle 19); the captured configuration is parsed as data and its
differences from the configuration in force are shown, never applied.

refuse_code_from_tree() turns away a configuration file or a site-checks directory that lies
inside the tree (the replay command older docs gave, `--config DIR/.slurm-hooks/config.toml`);
captured_config_differences() is the comparison.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..core.config_files import ConfigError, config_files, toml_loads
from .host import CAPTURE_DIR, Host, HostError

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

CAPTURED_CONFIG = CAPTURE_DIR + "/config.toml"
MAX_DIFFERENCES = 40  # lines shown; a crafted config must not flood the terminal
_SHOWN_VALUE = 200  # characters of one value (a path is shown whole)


def inside(path: str, root: str) -> bool:
    """Whether `path` (symlinks resolved) is `root` or lies under it."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def refuse_code_from_tree(root: str, config_path: Optional[str], site_dir: Optional[str]) -> None:
    """ConfigError when a configuration file or the site-checks directory lies inside the --root tree.

    `config_path` is --config (None: $SLURM_HOOKS_CONFIG or /etc/slurm-hooks/config.toml, plus the
    conf.d/ beside it); `site_dir` the checks.d directory in force (None: none).
    """
    if not root or os.path.realpath(root) == "/":
        return
    files, _required = config_files(config_path)
    for file in files:
        if inside(file, root):
            raise ConfigError(
                "%s lies inside the --root tree %s: a capture's configuration is data, never "
                "applied (it could choose a library or a live source). Run `slurm-hooks check "
                "--root %s` without --config: this machine's configuration applies, and the "
                "captured one's differences are shown" % (file, root, root)
            )
    if site_dir and inside(site_dir, root):
        raise ConfigError(
            "site checks directory %s lies inside the --root tree %s: code is never loaded from "
            "a captured tree" % (site_dir, root)
        )


def _flatten(table: Mapping[str, Any]) -> Dict[str, Any]:
    """{'general': {'mode': 'x'}, 'checks': {'gpu.ecc': {'enabled': True}}} ->
    {'general.mode': 'x', 'checks."gpu.ecc".enabled': True}."""
    flat: Dict[str, Any] = {}
    for section, values in table.items():
        if not isinstance(values, Mapping):
            flat[str(section)] = values
            continue
        for key, value in values.items():
            if section == "checks" and isinstance(value, Mapping):
                for param, item in value.items():
                    flat['checks."%s".%s' % (key, param)] = item
            else:
                flat["%s.%s" % (section, key)] = value
    return flat


def _effective(config) -> Dict[str, Any]:
    table: Dict[str, Any] = {section: dict(values) for section, values in config.settings.items()}
    table["checks"] = {
        name: dict(check.params, enabled=check.enabled) for name, check in config.checks.items()
    }
    return _flatten(table)


def _same(captured: Any, here: Any) -> bool:
    if isinstance(here, tuple):
        here = list(here)
    if isinstance(here, Mapping):
        here = dict(here)
    return (
        type(captured) is type(here)
        and captured == here
        or (
            isinstance(captured, (int, float))
            and isinstance(here, (int, float))
            and not isinstance(captured, bool)
            and not isinstance(here, bool)
            and captured == here
        )
    )


def _key(key: str) -> str:
    """A key as printed: a crafted one's escape sequences are shown escaped, never sent to the terminal."""
    shown = key if key.isprintable() else repr(key)
    return shown if len(shown) <= _SHOWN_VALUE else shown[: _SHOWN_VALUE - 3] + "..."


def _shown(value: Any) -> str:
    text = repr(value)  # repr: a crafted value's control characters are escaped, not printed
    return text if len(text) <= _SHOWN_VALUE else text[: _SHOWN_VALUE - 3] + "..."


def captured_config_differences(host: Host, config) -> Tuple[List[str], Optional[str]]:
    """(differences, problem) between the tree's .slurm-hooks/config.toml and `config` (in force).

    Each difference is 'KEY: captured VALUE, here VALUE'. `problem` says why the captured file
    could not be compared (absent is not a problem: a fake node has none). Nothing here applies
    a captured value.
    """
    try:
        text = host.read_text(CAPTURED_CONFIG, default=None)
    except HostError as exc:
        return [], str(exc)
    if text is None:
        return [], None
    try:
        captured = toml_loads(text)
    except Exception as exc:  # noqa: BLE001  (any parser error, RecursionError included: data)
        return [], "%s: not TOML (%s)" % (CAPTURED_CONFIG, str(exc)[:120])
    here = _effective(config)
    lines = [
        "%s: captured %s, here %s"
        % (_key(key), _shown(value), _shown(here[key]) if key in here else "(no such key)")
        for key, value in sorted(_flatten(captured).items())
        if not (key in here and _same(value, here[key]))
    ]
    return _capped(lines), None


def _capped(lines: List[str]) -> List[str]:
    if len(lines) <= MAX_DIFFERENCES:
        return lines
    return lines[:MAX_DIFFERENCES] + ["... and %d more" % (len(lines) - MAX_DIFFERENCES)]


def render_differences(lines: Iterable[str], problem: Optional[str]) -> str:
    """The note `check --root` prints on stderr; '' when there is nothing to say."""
    lines = list(lines)
    if problem:
        return "slurm-hooks: the capture's configuration was not compared: %s\n" % problem
    if not lines:
        return ""
    return (
        "slurm-hooks: the capture's %s differs from this machine's configuration (shown, never "
        "applied; verdicts use this machine's):\n%s\n"
        % (CAPTURED_CONFIG[1:], "\n".join("  " + line for line in lines))
    )
