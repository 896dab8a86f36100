"""Talking to slurmctld: SlurmClient, its scontrol and pyslurm backends (node states and the
scontrol parser: node_state.py; what can be raised: errors.py).

Only a decision to drain/resume reaches this module: constructing a SlurmClient makes no Slurm call
and imports nothing heavy; the backend is chosen on first use (``client.calls`` counts the requests
sent to slurmctld, ``client.probe_calls`` the local version probe of that choice).

Data sources and their shell equivalents:
  show_node   ``scontrol --all --oneliner show node NAME``   | ``pyslurm.Node.load(NAME)``
  list_nodes  ``scontrol --all --oneliner show node``        | ``pyslurm.Nodes.load()``
  drain       ``scontrol update NodeName=N State=DRAIN Reason=R`` | ``Node(N).modify(Node(state="DRAIN", reason=R))``
  resume      ``scontrol update NodeName=N State=RESUME``    | ``Node(N).modify(Node(state="RESUME"))``
Seen on Slurm 22.05, 24.11 and 26.05 (tests/captures/slurm/): ``State=IDLE+DRAIN``; the first line
of the Reason is followed by ``[user@YYYY-MM-DDTHH:MM:SS]`` (slurmctld's reason_time; our clients run
with TZ=UTC0, so it is UTC); an unknown node gives "Node x not found" (show) / "Invalid node name
specified" (update); RESUME of a node that is not drained/down gives "Invalid node state specified"
(22.05, 24.11) or "Invalid node state transition" (26.05); after RESUME the node shows
``IDLE+NOT_RESPONDING`` (``idle*``) for ~1 s; any client blocks ~MessageTimeout when slurmctld is down.
Newer: 24.11 and 25.11 keep the Reason on a resumed node (without accounting storage); 25.11 and 26.05
refuse a RESUME of a node that is not drained with "Invalid node state transition".
"""

from __future__ import annotations

import abc
import os
import re
import subprocess
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..core.lazyre import lazy_compile
from .errors import (
    InvalidNodeState,
    NodeNotFound,
    SlurmClientMissing,
    SlurmCommandError,
    SlurmParseError,
    SlurmUnavailable,
)
from .node_state import NodeInfo, parse_nodes, parse_state

# ---------------------------------------------------------------------------------------------
# validation

_NODE_NAME = lazy_compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MAX_REASON = 512


def check_node_name(name: str) -> str:
    """One plain node name: no hostlist ('n[1-9]'), comma or whitespace, so we never hit many nodes."""
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise ValueError("invalid node name %r" % (name,))
    return name


def check_reason(reason: str) -> str:
    """Reasons must read back exactly: scontrol strips a leading/trailing '"'; no control chars."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a drain reason is required")
    if len(reason) > MAX_REASON:
        raise ValueError("reason longer than %d characters" % MAX_REASON)
    if any(ord(c) < 32 or ord(c) == 127 for c in reason):
        raise ValueError("reason contains control characters: %r" % reason)
    if reason[0] in '" ' or reason[-1] in '" ':
        raise ValueError("reason must not start/end with a quote or space: %r" % reason)
    return reason


# ---------------------------------------------------------------------------------------------
# error classification shared by both backends

_NOT_FOUND = lazy_compile(
    r"Invalid node name specified|\bNode '?\S+?'? (?:not found|does not exist)"
)
_INVALID_STATE = lazy_compile(r"Invalid node state (?:specified|transition)")
_TRANSIENT = lazy_compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Connection timed out|"
    r"Zero Bytes were transmitted|Communication connection failure|Communication send failure|"
    r"Communication receive failure|Transport endpoint|standby mode|Resource temporarily unavailable|"
    r"slurmctld is busy|Slurm temporarily unable",
    re.I,
)
_NO_AUTH = lazy_compile(r"[Mm]unge|authentication", re.I)
# slurm_errno.h: SLURM_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE}_ERROR, SLURMCTLD_COMMUNICATIONS_* (1800-1805:
# what pyslurm 25.11 raises when slurmctld is down, 1800), SOCKET_IMPL_TIMEOUT (a hung slurmctld), ZERO_BYTES
_TRANSIENT_ERRNO = {1001, 1002, 1003, 1800, 1801, 1802, 1803, 1804, 1805, 5004, 5005}


_AUTH_ERRNO = {
    1007
}  # SLURM_PROTOCOL_AUTHENTICATION_ERROR: what pyslurm 25.11 raises when munged is down


def classify(message: str, errno: Optional[int] = None) -> str:
    """'not_found' | 'invalid_state' | 'transient' (retry) | 'unavailable' (give up now) | 'permanent'."""
    if _NOT_FOUND.search(message or ""):
        return "not_found"
    if _INVALID_STATE.search(message or ""):
        return "invalid_state"
    if errno in _TRANSIENT_ERRNO or _TRANSIENT.search(message or ""):
        return "transient"
    if errno in _AUTH_ERRNO or _NO_AUTH.search(message or ""):
        return "unavailable"
    return "permanent"


class _Retry:
    """Bounded attempts with exponential backoff inside one overall deadline.

    uninterruptible: an attempt cannot be cut short (an in-process RPC blocks for up to that many
    seconds, slurm.conf's MessageTimeout), so a retry starts only if it can end near the deadline
    (within 10 % of that time): one request stays within max(deadline, uninterruptible) + 10 %. A
    request's first attempt starts whenever any of the caller's budget (`until`) is left -- a
    slurmctld that was slow for the first request must still get the next ones -- so a hook can
    overrun its budget by at most one such attempt.
    """

    def __init__(
        self,
        timeout: float,
        attempts: int,
        backoff: float,
        deadline: Optional[float],
        uninterruptible: float = 0.0,
    ) -> None:
        if timeout <= 0 or attempts < 1 or backoff < 0:
            raise ValueError("timeout > 0, attempts >= 1 and backoff >= 0 required")
        self.timeout, self.attempts, self.backoff = float(timeout), int(attempts), float(backoff)
        self.deadline = (
            float(deadline)
            if deadline
            else self.timeout * self.attempts + self.backoff * (2 ** (self.attempts - 1) - 1)
        )
        self.uninterruptible = float(uninterruptible)

    def run(self, what: str, once: Callable[[float], Any], until: Optional[float] = None) -> Any:
        """once(timeout) returns a value or raises _Transient; anything else propagates.

        until: a time.monotonic() instant no attempt may run past (the caller's overall budget)."""
        start, last = time.monotonic(), "no attempt made"
        deadline = self.deadline if until is None else min(self.deadline, until - start)
        # a retry that cannot be cut short starts only with (nearly) its full time left; if even the
        # request's own deadline is shorter (a forced pyslurm, MessageTimeout > budget), with most of that
        needed = 0.9 * min(self.uninterruptible, self.deadline)
        for attempt in range(1, self.attempts + 1):
            remaining = deadline - (time.monotonic() - start)
            if remaining <= 0.01 or (attempt > 1 and remaining < needed):
                if attempt == 1:
                    last = "no time left in this run's Slurm budget"
                break
            try:
                return once(min(self.timeout, remaining))
            except _Transient as exc:
                last = str(exc)
            pause = min(self.backoff * 2 ** (attempt - 1), deadline - (time.monotonic() - start))
            if attempt < self.attempts and pause > 0:
                time.sleep(pause)
        raise SlurmUnavailable(
            "%s: slurmctld unavailable after %.1fs: %s"
            % (what, time.monotonic() - start, last.strip())
        )


class _Transient(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# backends


class Backend(abc.ABC):
    """What SlurmClient needs. Every method is one bounded request to slurmctld (plus retries)."""

    name = "abstract"

    def __init__(self) -> None:
        self.calls = 0  # requests actually sent (each retry counts)
        self.probe_calls = 0  # requests made while choosing this backend (version probe)
        self.until: Optional[float] = (
            None  # time.monotonic() past which no request may run (SlurmClient)
        )

    @abc.abstractmethod
    def show_node(self, name: str) -> NodeInfo: ...

    @abc.abstractmethod
    def list_nodes(self) -> List[NodeInfo]: ...

    @abc.abstractmethod
    def drain(self, name: str, reason: str) -> None: ...

    @abc.abstractmethod
    def resume(self, name: str, reason: Optional[str] = None) -> None:
        """RESUME; with `reason`, the same request first replaces the reason (see SlurmClient.resume)."""

    def reboot(self, name: str, reason: str, next_state: str) -> None:
        """`scontrol reboot ASAP nextstate=NEXT reason=REASON NODE` (slurm/repair.py): only the
        scontrol backend asks for it; the others refuse, so the repair is recorded as not made."""
        raise SlurmCommandError(["reboot", name], None, "reboot needs the scontrol backend")


Runner = Callable[[List[str], float, Optional[dict]], Tuple[int, str, str]]


def run_argv(argv: List[str], timeout: float, env: Optional[dict]) -> Tuple[int, str, str]:
    """subprocess.run without a shell; raises subprocess.TimeoutExpired (child killed) or OSError."""
    res = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return res.returncode, res.stdout, res.stderr


def client_env(env: Optional[dict] = None) -> dict:
    """Environment for Slurm clients: ours, with ISO timestamps (SLURM_TIME_FORMAT=standard) in UTC.

    UTC because reason times are compared across nodes (the breaker ranks drains by them): local time
    strings repeat an hour when daylight saving ends and differ between nodes in other time zones.
    'UTC0' is a POSIX TZ string, valid without tzdata."""
    out = dict(os.environ if env is None else env)
    out["SLURM_TIME_FORMAT"] = "standard"
    out["TZ"] = "UTC0"
    return out


_BIN_DIR_HINT = " (Slurm installed elsewhere, e.g. under /opt? set [drain] slurm_bin_dir)"


class ScontrolBackend(Backend):
    """scontrol as a subprocess: argv lists only, per-call timeout, bounded retries.

    Worst case when slurmctld is down: deadline (default timeout*attempts + backoff = 10.5 s).
    """

    name = "scontrol"

    def __init__(
        self,
        timeout: float = 5.0,
        attempts: int = 2,
        backoff: float = 0.5,
        deadline: Optional[float] = None,
        scontrol: str = "scontrol",
        env: Optional[dict] = None,
        runner: Optional[Runner] = None,
    ) -> None:
        super().__init__()
        self.retry = _Retry(timeout, attempts, backoff, deadline)
        self.scontrol, self.env, self.runner = scontrol, client_env(env), runner or run_argv

    def _run(self, args: List[str], node: Optional[str] = None) -> str:
        argv = [self.scontrol] + args

        def once(timeout: float) -> str:
            self.calls += 1
            try:
                rc, out, err = self.runner(argv, timeout, self.env)
            except subprocess.TimeoutExpired:
                raise _Transient("%s timed out after %.1fs" % (argv[0], timeout)) from None
            except OSError as exc:
                raise SlurmClientMissing(
                    "cannot run %s: %s%s"
                    % (argv[0], exc, _BIN_DIR_HINT if "/" not in argv[0] else "")
                ) from exc
            if rc == 0:
                return out
            err = (err or "").strip() or (out or "").strip()  # "Node x not found" goes to stdout
            kind = classify(err)
            if kind == "not_found" and node is not None:
                raise NodeNotFound(node, err)
            if kind == "invalid_state":
                raise InvalidNodeState(argv, rc, err)
            if kind == "transient":
                raise _Transient(err)
            if kind == "unavailable":
                raise SlurmUnavailable("%s: %s" % (argv[0], err.strip()))
            raise SlurmCommandError(argv, rc, err)

        return self.retry.run(" ".join(argv[:4]), once, self.until)

    def show_node(self, name: str) -> NodeInfo:
        for node in parse_nodes(
            self._run(["--all", "--oneliner", "show", "node", name], node=name)
        ):
            if node.name == name:
                return node
        raise NodeNotFound(name, "not in scontrol output")

    def list_nodes(self) -> List[NodeInfo]:
        return parse_nodes(self._run(["--all", "--oneliner", "show", "node"]))

    def drain(self, name: str, reason: str) -> None:
        self._run(["update", "NodeName=" + name, "State=DRAIN", "Reason=" + reason], node=name)

    def resume(self, name: str, reason: Optional[str] = None) -> None:
        self._run(
            ["update", "NodeName=" + name, "State=RESUME"]
            + (["Reason=" + reason] if reason else []),
            node=name,
        )

    def reboot(self, name: str, reason: str, next_state: str) -> None:
        # 22.05 refuses nextstate=DRAIN with exit 1 and no message: SlurmCommandError (docs/slurm.md)
        self._run(
            ["reboot", "ASAP", "nextstate=" + next_state, "reason=" + reason, name], node=name
        )


def _iso_utc(ts: Any) -> Optional[str]:
    """pyslurm's reason_time (seconds since the epoch) as the scontrol backend reports it (UTC)."""
    if isinstance(ts, (int, float)) and ts > 0:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
    if isinstance(ts, str) and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\Z", ts):
        return ts
    return None


def node_from_pyslurm(n: Any) -> NodeInfo:
    """pyslurm.Node -> NodeInfo (.state is slurm_node_state_string_complete, e.g. 'IDLE+DRAIN')."""
    name = getattr(n, "name", None)
    if not name:
        raise SlurmParseError("pyslurm node without a name")
    state_text = getattr(n, "state", None) or ""
    base, flags = parse_state(state_text)
    reason = getattr(n, "reason", None) or None
    parts = getattr(n, "partitions", None) or ()
    return NodeInfo(
        name=name,
        state=base,
        flags=flags,
        reason=reason,
        reason_user=(getattr(n, "reason_user", None) or None) if reason else None,
        reason_time=_iso_utc(getattr(n, "reason_time", None)) if reason else None,
        partitions=tuple(str(p) for p in parts),
        raw="pyslurm NodeName=%s State=%s Reason=%s" % (name, state_text, reason),
    )


class PyslurmBackend(Backend):
    """pyslurm's object API (25.11; the same calls since 22.5). RPCs run in-process and hold the GIL:
    Slurm's own MessageTimeout bounds each attempt (the blocked C call cannot be interrupted, not even
    by a thread), so a retry is only started if it can end near the deadline (see _Retry).

    Seen with pyslurm 25.11.2 on Slurm 25.11.7: slurmctld stopped -> RPCError 1800 "Unable to contact
    slurm controller (connect failure)" and SIGSTOPped -> 5004 "Socket timed out on send/recv
    operation", each after MessageTimeout; munged stopped -> 1007 "Protocol authentication error"
    at once (the message does not say which authentication: auth_type is added to it).
    """

    name = "pyslurm"

    def __init__(
        self,
        module: Any = None,
        attempts: int = 2,
        backoff: float = 0.5,
        deadline: Optional[float] = None,
        message_timeout: float = 10.0,
        auth_type: str = "auth/munge",
    ) -> None:
        super().__init__()
        self._mod = module
        self.message_timeout, self.auth_type = float(message_timeout), auth_type
        self.retry = _Retry(
            message_timeout, attempts, backoff, deadline, uninterruptible=message_timeout
        )

    @property
    def pyslurm(self) -> Any:
        if self._mod is None:
            conf = slurm_conf_path()
            if (
                conf is None
            ):  # importing without a config retries 60 s, then exits (or exits at once)
                raise SlurmUnavailable("no usable slurm.conf; refusing to import pyslurm")
            # import pyslurm runs slurm_init(), which reads $SLURM_CONF or falls back on its own (a
            # configless DNS lookup that ends the process when it fails): make it read the file found
            os.environ.setdefault("SLURM_CONF", conf)
            try:
                import pyslurm  # noqa: PLC0415 - lazy on purpose
            except ImportError as exc:  # e.g. built against another libslurm
                raise SlurmUnavailable("cannot import pyslurm: %s" % exc) from exc
            self._mod = pyslurm
        return self._mod

    def _call(self, what: str, fn: Callable[[Any], Any], node: Optional[str] = None) -> Any:
        mod = self.pyslurm
        rpc_error = getattr(mod, "RPCError", ())

        def once(_timeout: float) -> Any:
            self.calls += 1
            try:
                return fn(mod)
            except rpc_error as exc:  # type: ignore[misc]
                msg = str(getattr(exc, "msg", None) or exc)
                kind = classify(msg, getattr(exc, "errno", None))
                if kind == "not_found" and node is not None:
                    raise NodeNotFound(node, msg) from exc
                if kind == "invalid_state":
                    raise InvalidNodeState(
                        ["pyslurm", what], getattr(exc, "errno", None), msg
                    ) from exc
                if kind == "transient":
                    raise _Transient(msg) from exc
                if kind == "unavailable":
                    raise SlurmUnavailable(
                        "%s: %s (AuthType=%s)" % (what, msg, self.auth_type)
                    ) from exc
                raise SlurmCommandError(
                    ["pyslurm", what], getattr(exc, "errno", None), msg
                ) from exc

        return self.retry.run("pyslurm " + what, once, self.until)

    def show_node(self, name: str) -> NodeInfo:
        n = self._call("Node.load", lambda m: m.Node.load(name), node=name)
        if getattr(n, "name", None) != name:
            raise NodeNotFound(name, "pyslurm returned %r" % getattr(n, "name", None))
        return node_from_pyslurm(n)

    def list_nodes(self) -> List[NodeInfo]:
        nodes = self._call(
            "Nodes.load", lambda m: m.Nodes.load() if hasattr(m.Nodes, "load") else m.Nodes()
        )
        values = nodes.values() if hasattr(nodes, "values") else nodes
        return [node_from_pyslurm(n) for n in values]

    def drain(self, name: str, reason: str) -> None:
        self._call(
            "Node.modify",
            lambda m: m.Node(name).modify(m.Node(state="DRAIN", reason=reason)),
            node=name,
        )

    def resume(self, name: str, reason: Optional[str] = None) -> None:
        changes = dict(state="RESUME", reason=reason) if reason else dict(state="RESUME")
        self._call("Node.modify", lambda m: m.Node(name).modify(m.Node(**changes)), node=name)


# ---------------------------------------------------------------------------------------------
# choosing a backend

CONF_CANDIDATES = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")


def slurm_conf_path(env: Optional[dict] = None) -> Optional[str]:
    """The slurm.conf a Slurm library would read: $SLURM_CONF (must be a readable file), else the
    compiled-in default (Debian: /etc/slurm/slurm.conf) or slurmd's configless cache."""
    env = os.environ if env is None else env
    if env.get("SLURM_CONF"):
        path = env["SLURM_CONF"]
        return path if os.path.isfile(path) and os.access(path, os.R_OK) else None
    for path in CONF_CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.R_OK):
            return path
    return None


def slurm_conf_settings(
    path: Optional[str], keys: Sequence[str] = ("MessageTimeout", "AuthType")
) -> dict:
    """Some top-level settings of a slurm.conf ({} when unreadable); keys are case-insensitive in
    slurm.conf, the last one wins, Include files are not followed."""
    wanted = {k.lower(): k for k in keys}
    found: dict = {}
    if not path:
        return found
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.split("#", 1)[0].strip().partition("=")
                if sep and key.strip().lower() in wanted:
                    found[wanted[key.strip().lower()]] = value.strip()
    except OSError:
        return {}
    return found


def message_timeout(settings: dict, default: float = 10.0) -> float:
    """slurm.conf's MessageTimeout in seconds (Slurm's default: 10)."""
    try:
        value = float(settings.get("MessageTimeout", default))
    except ValueError:
        return default
    return value if value > 0 else default


def parse_version(text: str) -> Optional[Tuple[int, int, int]]:
    """'slurm 22.05.8' / 'slurm-wlm 24.11.5' / '22.5.3' -> (22, 5, 8)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def slurm_command(name: str, bin_dir: str = "") -> str:
    """The Slurm command to run: NAME in [drain] slurm_bin_dir when set (Slurm under /opt), else NAME
    looked up on the PATH (slurmd gives hooks none, and then Python's default /bin:/usr/bin)."""
    return os.path.join(bin_dir, name) if bin_dir else name


def slurm_version(
    env: Optional[dict] = None,
    timeout: float = 5.0,
    runner: Optional[Runner] = None,
    bin_dir: str = "",
) -> Optional[Tuple[int, int, int]]:
    """Version of the installed Slurm clients (``sinfo --version``; it needs a slurm.conf on 22.05)."""
    argv = [slurm_command("sinfo", bin_dir), "--version"]
    try:
        rc, out, _err = (runner or run_argv)(argv, timeout, client_env(env))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(out) if rc == 0 else None


def pyslurm_version(module: Any = None) -> Optional[str]:
    """Installed pyslurm version without importing it (importing needs a working slurm.conf)."""
    if module is not None:
        ver = getattr(module, "version", None)
        return str(ver() if callable(ver) else getattr(module, "__version__", "")) or None
    import importlib.util

    if importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        from importlib.metadata import version

        return version("pyslurm")
    except Exception:  # noqa: BLE001 - metadata missing: treat as unknown
        return None


def pyslurm_unusable(
    env: Optional[dict] = None,
    module: Any = None,
    runner: Optional[Runner] = None,
    counter: Optional[Backend] = None,
    bin_dir: str = "",
) -> Optional[str]:
    """None if pyslurm can be used here, else why not (cheapest checks first)."""
    pv = pyslurm_version(module)
    if pv is None:
        return "pyslurm is not installed"
    conf = slurm_conf_path(env)
    if conf is None:
        return "no readable slurm.conf ($SLURM_CONF or %s)" % CONF_CANDIDATES[0]
    if module is None and env is not None and env.get("SLURM_CONF") != os.environ.get("SLURM_CONF"):
        return "pyslurm reads SLURM_CONF from the process environment, not from the env given"
    if counter is not None:
        counter.probe_calls += 1
    sv = slurm_version(env, runner=runner, bin_dir=bin_dir)
    if sv is None:
        return "cannot determine the Slurm version (sinfo --version failed)"
    pvt = parse_version(pv)
    if pvt is None or pvt[:2] != sv[:2]:
        return "pyslurm %s does not match Slurm %d.%02d.%d" % (pv, sv[0], sv[1], sv[2])
    return None


def choose_backend(
    preferred: str = "auto",
    *,
    env: Optional[dict] = None,
    pyslurm_module: Any = None,
    timeout: float = 5.0,
    attempts: int = 2,
    backoff: float = 0.5,
    runner: Optional[Runner] = None,
    bin_dir: str = "",
) -> Tuple[Backend, str]:
    """(backend, why). preferred: 'auto' (pyslurm when usable, else scontrol), 'pyslurm' (raise
    SlurmError if unusable), 'scontrol'. May run ``sinfo --version`` (counted in probe_calls).

    Both backends get the same time budget (scontrol's deadline: timeout x attempts + backoff). A
    pyslurm request cannot be cut short before slurm.conf's MessageTimeout, so 'auto' takes pyslurm
    only when MessageTimeout fits that budget (with Slurm's default of 10 s it fits the default
    10.5 s); a forced pyslurm may take up to MessageTimeout however small the budget."""
    if preferred not in ("auto", "pyslurm", "scontrol"):
        raise ValueError("preferred must be auto, pyslurm or scontrol, not %r" % preferred)
    scontrol = ScontrolBackend(
        timeout=timeout,
        attempts=attempts,
        backoff=backoff,
        env=env,
        runner=runner,
        scontrol=slurm_command("scontrol", bin_dir),
    )
    if preferred == "scontrol":
        return scontrol, "scontrol: requested"
    why_not = pyslurm_unusable(env, pyslurm_module, runner, counter=scontrol, bin_dir=bin_dir)
    if why_not is None:
        conf = slurm_conf_settings(slurm_conf_path(env))
        per_request, budget = message_timeout(conf), scontrol.retry.deadline
        if preferred == "auto" and per_request > budget:
            return scontrol, (
                "scontrol: a pyslurm request can block for MessageTimeout=%gs, longer than the "
                "[drain] budget of %gs (timeout x attempts + backoff)" % (per_request, budget)
            )
        backend = PyslurmBackend(
            pyslurm_module,
            attempts=attempts,
            backoff=backoff,
            deadline=budget,
            message_timeout=per_request,
            auth_type=conf.get("AuthType", "auth/munge"),
        )
        backend.probe_calls = scontrol.probe_calls
        return backend, "pyslurm %s matches the running Slurm" % pyslurm_version(pyslurm_module)
    if (
        preferred == "pyslurm"
    ):  # nothing reached slurmctld: the client cannot run here, as with no scontrol
        raise SlurmClientMissing("pyslurm backend requested but unusable: " + why_not)
    return scontrol, "scontrol: " + why_not


# ---------------------------------------------------------------------------------------------
# the client


class SlurmClient:
    """Drain/resume/inspect nodes. Nothing talks to Slurm until a method is called.

    set_budget(seconds) bounds every request made from then on to one overall deadline (retries
    included): a drain is several requests, and the hook must end within its own time limit.
    """

    def __init__(
        self,
        backend: Optional[Backend] = None,
        preferred: str = "auto",
        env: Optional[dict] = None,
        timeout: float = 5.0,
        attempts: int = 2,
        backoff: float = 0.5,
        bin_dir: str = "",
    ) -> None:
        self._backend = backend
        self.backend_reason = "given" if backend is not None else ""
        self._choice = dict(
            preferred=preferred,
            env=env,
            timeout=timeout,
            attempts=attempts,
            backoff=backoff,
            bin_dir=bin_dir,
        )
        self.ops: List[Tuple[str, ...]] = []  # every operation requested, in order
        self.until: Optional[float] = None
        # Test hook: called with each operation (as in `ops`) after slurmctld answered it, before the
        # caller sees the answer. tests/test_drain_race.py lands an admin's drain there, at the exact
        # point of a race that otherwise needs luck to hit. None in production.
        self.after_request: Optional[Callable[[Tuple[str, ...]], None]] = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend, self.backend_reason = choose_backend(**self._choice)  # type: ignore[arg-type]
        self._backend.until = self.until
        return self._backend

    def set_budget(self, seconds: Optional[float]) -> None:
        """No request may run past `seconds` from now (None: only each request's own bound)."""
        self.until = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> Optional[float]:
        return None if self.until is None else self.until - time.monotonic()

    @property
    def backend_name(self) -> Optional[str]:
        """'scontrol' or 'pyslurm' once the backend is chosen (first call), else None."""
        return None if self._backend is None else self._backend.name

    @property
    def calls(self) -> int:
        """Requests sent to slurmctld so far (retries included): the same count for both backends."""
        b = self._backend
        return 0 if b is None else b.calls

    @property
    def probe_calls(self) -> int:
        """Local version probes (``sinfo --version``) run while choosing the backend: only when a
        pyslurm is installed, and never on the happy path (the backend is chosen on first use)."""
        b = self._backend
        return 0 if b is None else b.probe_calls

    def _answered(self) -> None:
        if self.after_request is not None:
            self.after_request(self.ops[-1])

    def show_node(self, name: str) -> NodeInfo:
        self.ops.append(("show_node", check_node_name(name)))
        node = self.backend.show_node(name)
        self._answered()
        return node

    def list_nodes(self) -> List[NodeInfo]:
        self.ops.append(("list_nodes",))
        nodes = self.backend.list_nodes()
        self._answered()
        return nodes

    def drain(self, name: str, reason: str) -> None:
        """Set DRAIN with reason. Slurm replaces an existing reason: read the node first (policy)."""
        self.ops.append(("drain", check_node_name(name), check_reason(reason)))
        self.backend.drain(name, reason)
        self._answered()

    def resume(self, name: str, reason: Optional[str] = None) -> None:
        """RESUME a drained/down node (InvalidNodeState if it is neither).

        With `reason`, the same request replaces the reason first (src/slurmctld/node_mgr.c
        update_node sets it before the state change). Where Slurm keeps a reason after RESUME
        (24.11/25.11 with accounting_storage/none: clusteracct_storage_g_node_up returns before
        clearing it; it stays until the node's next job), that text is what stays, not the drain
        reason we are lifting.
        """
        self.ops.append(
            ("resume", check_node_name(name)) + ((check_reason(reason),) if reason else ())
        )
        self.backend.resume(name, reason)
        self._answered()

    def reboot(self, name: str, reason: str, next_state: str) -> None:
        """Reboot the node through Slurm when its jobs have ended (slurm/repair.py)."""
        self.ops.append(("reboot", check_node_name(name), check_reason(reason), next_state))
        self.backend.reboot(name, reason, next_state)
        self._answered()


# ---------------------------------------------------------------------------------------------
# hostlists (admin verbs)

_HOSTLIST_CHARS = lazy_compile(r"[A-Za-z0-9][A-Za-z0-9._,\[\]-]*\Z")


def expand_hostlist(
    text: str,
    env: Optional[dict] = None,
    runner: Optional[Runner] = None,
    timeout: float = 10.0,
    bin_dir: str = "",
) -> List[str]:
    """'gpu[01-04],login1' -> ['gpu01', ..., 'login1'], as Slurm expands it (``scontrol show hostnames``,
    local: no request to slurmctld). A plain name is returned as is without running anything.

    ValueError for text that is not a hostlist (the message says why); SlurmClientMissing when
    scontrol cannot run; SlurmCommandError when scontrol rejects the expression.
    """
    text = (text or "").strip()
    if not text or not _HOSTLIST_CHARS.match(text):
        raise ValueError("not a node name or hostlist: %r" % text)
    if _NODE_NAME.match(text):
        return [text]
    argv = [slurm_command("scontrol", bin_dir), "show", "hostnames", text]
    try:
        rc, out, err = (runner or run_argv)(argv, timeout, client_env(env))
    except OSError as exc:
        raise SlurmClientMissing(
            "cannot run %s to expand %r: %s%s"
            % (argv[0], text, exc, _BIN_DIR_HINT if not bin_dir else "")
        ) from exc
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(
            "scontrol show hostnames %s timed out after %.0fs" % (text, timeout)
        ) from None
    if rc != 0:
        raise SlurmCommandError(argv, rc, (err or out or "").strip())
    names = [line.strip() for line in out.splitlines() if line.strip()]
    if not names:
        raise ValueError("hostlist %r names no node" % text)
    for name in names:
        check_node_name(name)
    return list(dict.fromkeys(names))
