"""Decision logging: one key=value line per decision to syslog/journald (/dev/log) and a local file.

slurmd discards a prolog's stdout; operators find our decisions with `journalctl -t slurm-hooks`
or in /var/log/slurm-hooks/slurm-hooks.log. Logging problems (no /dev/log, read-only /var/log) are
reported on stderr once and never stop a hook.

Values come partly from users (a user name, a kernel log line, a process name), so `kv` writes each
line so that it stays one line and says what it holds: whitespace runs become one space, control
characters, NUL, Unicode format characters (bidi overrides and isolates, zero-width characters)
and lone surrogates (undecodable bytes of the environment) become \\xNN / \\uNNNN escapes, a
backslash becomes \\\\, and a value is cut after MAX_VALUE characters. A NUL would otherwise make
syslog(3) raise and lose the decision line from journald; a bidi override would make the line read
differently from what it holds.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from .lazyre import compiled_on_use, lazy_compile

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    import logging
    import re
    from typing import Any, Mapping

# `logging` (with traceback, linecache, tokenize, string, weakref: ~5 ms on 2 cores) is imported by
# setup() and decision_logger(), not with this module: the prolog's process sets its logger up while
# its forked check process runs (hooks/bounded.py), off the path the job waits on.

LOGGER_NAME = "slurm_hooks.decisions"
SYSLOG_SOCKET = "/dev/log"  # where syslog(3) sends; without it (containers) syslog is skipped


def setup(
    settings: Mapping[str, Mapping[str, Any]], stderr: bool = True, create_dirs: bool = True
) -> logging.Logger:
    """The decision logger: syslog, the log file (its directory made unless create_dirs is false), stderr."""
    logging = import_logging()

    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(settings["general"]["log_level"].upper())
    logger.propagate = False
    paths = settings["paths"]
    if paths["syslog"] and os.path.exists(SYSLOG_SOCKET):
        handler = _syslog_handler_class()()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
    if paths["log_file"]:
        try:
            if create_dirs:
                os.makedirs(os.path.dirname(paths["log_file"]), mode=0o750, exist_ok=True)
            handler = logging.FileHandler(
                paths["log_file"], encoding="utf-8", errors="backslashreplace"
            )
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        except OSError as exc:
            print("slurm-hooks: cannot write %s: %s" % (paths["log_file"], exc), file=sys.stderr)
    if stderr:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("slurm-hooks: %(levelname)s %(message)s"))
        logger.addHandler(handler)
    return logger


def decision_logger() -> logging.Logger:
    """The decision logger as setup() left it (for code that was given none)."""
    logging = import_logging()

    return logging.getLogger(LOGGER_NAME)


def import_logging() -> ModuleType:
    """`logging`, imported without `traceback` (and the linecache, tokenize and textwrap it imports:
    ~3.4 ms of the 6 of `import logging`, paid by every hook while its check process runs, when
    both cores are already busy: round 7 of issue 29). logging imports traceback at its top but uses
    it only to print an exception or a stack (Formatter.formatException, Handler.handleError,
    stack_info); while it imports, `traceback` is a stand-in that imports the real module the first
    time one of its names is asked for, and then answers with the real one's. The stand-in leaves
    sys.modules right after, so every later `import traceback` gets the real module."""
    if "logging" in sys.modules or "traceback" in sys.modules:
        import logging

        return logging
    stand_in = _LoadedOnUse("traceback", "slurm-hooks stand-in: the real traceback loads on use")
    sys.modules["traceback"] = stand_in
    try:
        with compiled_on_use():  # logging's and string's module-level patterns: on first use
            import logging
    finally:
        if sys.modules.get("traceback") is stand_in:
            del sys.modules["traceback"]
    return logging


class _LoadedOnUse(ModuleType):
    """A module's stand-in: any attribute asked for imports the real module and answers with its own."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and import machinery probing: not a use
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


class LazyLogger:
    """The decision logger, set up (setup(settings)) at the first call or the first attribute used.

    The prolog's process calls it while its forked check process runs (hooks/bounded.py), so the
    `logging` import and the log file's opening overlap the checks; the check process, forked
    before that, sets up its own the same way the first time it has something to log.
    """

    def __init__(self, settings: Mapping[str, Mapping[str, Any]]):
        self.settings = settings
        self.logger: Any = None

    def __call__(self) -> logging.Logger:
        if self.logger is None:
            self.logger = setup(self.settings)
        return self.logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self(), name)


_SYSLOG_HANDLER: list = []


def __getattr__(name: str) -> Any:  # PEP 562: logs.SyslogHandler, defined on first use
    if name == "SyslogHandler":
        return _syslog_handler_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _syslog_handler_class() -> type:
    """SyslogHandler, made once: it subclasses logging.Handler, and logging loads only when needed."""
    if not _SYSLOG_HANDLER:
        _SYSLOG_HANDLER.append(_define_syslog_handler())
    return _SYSLOG_HANDLER[0]


def _define_syslog_handler() -> type:
    logging = import_logging()

    class SyslogHandler(logging.Handler):
        """Records to syslog/journald through the C library's syslog(3) (`journalctl -t slurm-hooks`).

        Not logging.handlers.SysLogHandler: that one pulls in the socket machinery, which the prolog
        would import before every job, and syslog(3) already knows /dev/log and reconnects on its own.
        """

        _PRIORITIES = {
            "CRITICAL": 2,
            "ERROR": 3,
            "WARNING": 4,
            "INFO": 6,
            "DEBUG": 7,
        }  # LOG_CRIT .. LOG_DEBUG

        def __init__(self) -> None:
            super().__init__()
            import syslog

            self._syslog = syslog
            syslog.openlog("slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)

        def emit(self, record: logging.LogRecord) -> None:
            try:
                # syslog(3) takes a C string: a NUL would raise (and the line be lost), a lone surrogate
                # would not encode; kv() escapes both already, this covers any other message
                text = self.format(record).replace("\x00", "\\x00")
                text = text.encode("utf-8", "backslashreplace").decode("utf-8")
                self._syslog.syslog(self._PRIORITIES.get(record.levelname, 6), text)
            except Exception:  # logging must never break a hook
                self.handleError(record)

    return SyslogHandler


MAX_VALUE = 1024  # characters of one value in a decision line
# C0/C1 controls, the backslash itself, Unicode format characters that change how text reads (soft
# hyphen, Arabic letter mark, bidi marks/embeddings/overrides/isolates, zero-width and invisible
# operators, BOM, interlinear annotations, tag characters) and lone surrogates
_UNSAFE = lazy_compile(
    "[\\\\\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)


def _escape(match: "re.Match[str]") -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return (
        "\\x%02x" % code
        if code < 0x100
        else ("\\u%04x" % code if code < 0x10000 else "\\U%08x" % code)
    )


def escape_unsafe(text: str) -> str:
    """`text` with the characters of _UNSAFE escaped. Printable ASCII without a backslash (a healthy
    run's every decision line) has none of them: it is returned as it is, without compiling the
    pattern, whose Unicode ranges cost ~0.7 ms of the prolog's tail (round 8)."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text
    return _UNSAFE.sub(_escape, text)


def kv(**fields: Any) -> str:
    """key=value pairs, one line: values with spaces are quoted, whitespace flattened, control and
    format characters escaped, long values cut (module docstring)."""
    parts = []
    for key, value in fields.items():
        if value is None or value == "":
            continue
        text = escape_unsafe(" ".join(str(value).split()))
        if len(text) > MAX_VALUE:
            text = "%s...(+%d)" % (text[:MAX_VALUE], len(text) - MAX_VALUE)
        if " " in text or "=" in text or '"' in text:
            text = '"%s"' % text.replace('"', "'")
        parts.append("%s=%s" % (key, text))
    return " ".join(parts)
