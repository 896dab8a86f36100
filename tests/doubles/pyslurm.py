"""A test double of pyslurm's object API (25.11), backed by a REAL slurmctld through scontrol.

Why real-backed and not an in-memory table: the contract suite is about what slurmctld does (DRAIN
flag, reason read back exactly, RESUME's transient NOT_RESPONDING, unknown nodes, controller down).
An in-memory table would only echo our own assumptions back.  Routing the double's RPCs through
scontrol against the test cluster keeps Slurm's real behaviour; the double only reproduces pyslurm's
*shape*.  That shape was checked against the real pyslurm 25.11.2 on Slurm 25.11.7 (PyPI's sdist,
pyslurm/core/node.pyx, error.pyx, xcollections.pyx; the contract tests in tests/test_slurm_client.py
run against both, in CI's slurm25 root):

  pyslurm.__version__                       "25.11.x" (major.minor must match Slurm); no version()
  pyslurm.slurm_api_version()               (major, minor, micro) of the Slurm it was built against
  pyslurm.Node(name=None, **writable)       writable: state, reason, comment, extra, weight, ...; a
                                            read-only attribute -> AttributeError("attribute 'x' of
                                            'pyslurm.core.node.Node' objects is not writable"), an
                                            unknown one -> KeyError('x'); state not in DRAIN/RESUME/
                                            DOWN/UNDRAIN/... -> ValueError("Invalid Node state: x");
                                            all before any RPC
  pyslurm.Node.load(name) -> Node           RPCError(-1, "Node 'x' does not exist") if unknown
  Node(name).modify(Node(state=..., reason=...))   anything but a Node -> TypeError
  pyslurm.Nodes.load() -> Nodes             a mapping by node name (iterating yields names,
                                            .values() the Node objects, `"node1" in nodes`)
  Node.state        slurm_node_state_string_complete(): "IDLE+DRAIN", "DOWN+DRAIN+NOT_RESPONDING"
  Node.reason       the bare reason (scontrol's " [user@time]" suffix is NOT part of it), or None
  Node.reason_time  unix time (int) or None;  Node.partitions  list of names
  RPCError(errno, msg), a PyslurmError: "Node 'x' does not exist" (-1), "Invalid node name
                    specified" (2018), "Invalid node state specified" (2028), "Invalid node state
                    transition" (2180, Slurm >= 25.11 on RESUME of a node that is not drained),
                    "Unable to contact slurm controller (connect failure)" (1800, after
                    MessageTimeout), "Socket timed out on send/recv operation" (5004, a hung slurmctld)

Known differences from the real thing: each RPC is a scontrol process (~10 ms instead of ~1 ms);
scontrol strips a leading/trailing '"' from reasons (the real RPC would not) -- SlurmClient rejects
such reasons anyway; a DRAIN/DOWN without a reason (or with an empty one) is refused by scontrol
itself, while the real RPC accepts it (25.11: the node drains, the reason stays as it was), so the
double raises NotImplementedError there instead of pretending; Node.reason_user is None when there
is no reason (the real one names uid 0, "root").  ``rpcs`` counts the RPCs the double performed, so
tests can prove the backend went through it.  The parsing here is deliberately independent of
slurm_hooks.slurm.client.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

SETTABLE = (
    "state",
    "reason",
    "comment",
    "extra",
    "weight",
    "address",
    "hostname",
    "available_features",
    "active_features",
    "configured_gres",
    "cpu_binding",
)
# some of the real Node's read-only properties (setting one is an AttributeError, any other name a KeyError)
READ_ONLY = (
    "reason_user",
    "reason_time",
    "partitions",
    "slurm_version",
    "operating_system",
    "boot_time",
    "slurmd_start_time",
    "last_busy_time",
    "real_memory",
    "free_memory",
    "total_cpus",
    "cluster",
    "next_state",
    "allocated_gres",
    "allocated_cpus",
    "effective_cpus",
    "idle_cpus",
    "cpu_load",
)
STATES = (
    "CANCEL_REBOOT",
    "DOWN",
    "DRAIN",
    "FAIL",
    "FUTURE",
    "NORESP",
    "NO_RESP",
    "POWER_DOWN",
    "POWER_DOWN_ASAP",
    "POWER_DOWN_FORCE",
    "POWER_UP",
    "RESUME",
    "UNDRAIN",
)
# slurm_errno.h (25.11): SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR, SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT, ...
_ERRNO = {
    "Unable to contact slurm controller": 1800,
    "Socket timed out": 5004,
    "Zero Bytes were transmitted": 5005,
    "Invalid node name specified": 2018,
    "Invalid node state specified": 2028,
    "Invalid node state transition": 2180,
    "Access/permission denied": 2002,
}


class PyslurmError(Exception):
    """pyslurm.core.error.PyslurmError: the base of pyslurm's own errors."""


class RPCError(PyslurmError):
    """Same constructor and attributes as pyslurm.core.error.RPCError."""

    def __init__(self, errno: int = -1, msg: Optional[str] = None) -> None:
        self.errno = errno
        self.msg = msg or "Unspecified error"
        super().__init__(self.msg)


def _rpc_error(stderr: str) -> RPCError:
    # scontrol prints "slurm_load_node error: <slurm_strerror text>"; pyslurm raises the text only
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "Unspecified error"
    text = re.sub(r"^\S+ error: ", "", text.strip())
    errno = next((n for k, n in _ERRNO.items() if k in text), -1)
    return RPCError(errno=errno, msg=text)


def _fields(line: str) -> Dict[str, str]:
    reason = None
    m = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if m:
        reason, line = m.group(1), line[: m.start()]
    out = {k: v.strip() for k, v in re.findall(r"(?:^|\s)([A-Za-z_]+)=(\S*)", line)}
    if reason is not None:
        out["Reason"] = reason
    return out


class PyslurmDouble:
    """Module-like object: ``pyslurm = PyslurmDouble(env)``, then ``pyslurm.Node.load("node1")``."""

    def __init__(
        self, env: Dict[str, str], version: Optional[str] = None, timeout: float = 60.0
    ) -> None:
        self.env = dict(env)
        self.env["SLURM_TIME_FORMAT"] = "standard"
        self.timeout = timeout
        self.rpcs = 0
        self.RPCError, self.PyslurmError = RPCError, PyslurmError
        self._api_version: Optional[Tuple[int, int, int]] = None
        self.__version__ = version or self._running_version()
        double = self

        class Node:
            def __init__(self, name: Optional[str] = None, **kwargs: Any) -> None:
                object.__setattr__(self, "_changes", {})
                object.__setattr__(self, "name", name)
                for key in ("state", "reason", "reason_user", "reason_time"):
                    object.__setattr__(self, key, None)
                object.__setattr__(self, "partitions", [])
                for k, v in kwargs.items():
                    setattr(self, k, v)

            def __setattr__(self, key: str, value: Any) -> None:
                if key == "name":
                    object.__setattr__(self, key, value)
                    return
                if key in READ_ONLY:  # cython descriptors without a setter
                    raise AttributeError(
                        "attribute '%s' of 'pyslurm.core.node.Node' objects is not writable" % key
                    )
                if (
                    key not in SETTABLE
                ):  # the real Node looks the descriptor up in its class __dict__
                    raise KeyError(key)
                if key == "state" and value is not None and str(value).upper() not in STATES:
                    raise ValueError("Invalid Node state: %s" % value)
                self._changes[key] = value
                object.__setattr__(self, key, value)

            def __eq__(self, other: object) -> bool:
                return isinstance(other, Node) and self.name == other.name

            __hash__ = object.__hash__

            @staticmethod
            def load(name: str) -> "Node":
                out = double._scontrol(["show", "node", "-o", name], not_found=name)
                for line in out.splitlines():
                    f = _fields(line)
                    if f.get("NodeName") == name:
                        return double._node_from_fields(Node, f)
                raise RPCError(msg="Node '%s' does not exist" % name)

            def reload(self) -> "Node":
                fresh = Node.load(self.name)
                self.__dict__.update(fresh.__dict__)
                return self

            def modify(self, changes: "Node") -> None:
                if not isinstance(changes, Node):
                    raise TypeError(
                        "Argument 'changes' has incorrect type (expected pyslurm.core.node.Node, "
                        "got %s)" % type(changes).__name__
                    )
                argv = ["update", "NodeName=%s" % self.name]
                ch = changes._changes
                if str(ch.get("state") or "").upper() in ("DRAIN", "DOWN", "FAIL") and not ch.get(
                    "reason"
                ):
                    raise NotImplementedError(
                        "the pyslurm double cannot %s without a reason: scontrol refuses it, while the real "
                        "RPC accepts it and keeps the node's old reason" % ch["state"]
                    )
                if ch.get("state"):
                    argv.append("State=%s" % str(ch["state"]).upper())
                if ch.get("reason") is not None:
                    argv.append("Reason=%s" % ch["reason"])
                for key, tag in (("comment", "Comment"), ("extra", "Extra"), ("weight", "Weight")):
                    if ch.get(key) is not None:
                        argv.append("%s=%s" % (tag, ch[key]))
                double._scontrol(argv)

            def to_dict(self) -> Dict[str, Any]:
                return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

            as_dict = to_dict

        class Nodes(dict):
            """pyslurm.Nodes is a MultiClusterMap: keyed by node name (one cluster here)."""

            @staticmethod
            def load(preload_passwd_info: bool = False) -> "Nodes":
                out = double._scontrol(["show", "node", "-o"])
                nodes = (
                    double._node_from_fields(Node, _fields(line))
                    for line in out.splitlines()
                    if line.startswith("NodeName=")
                )
                return Nodes((n.name, n) for n in nodes)

            def to_dict(self) -> Dict[str, Any]:
                return {name: n.to_dict() for name, n in self.items()}

            as_dict = to_dict

        self.Node, self.Nodes = Node, Nodes

    def slurm_api_version(self) -> Tuple[int, int, int]:
        if self._api_version is None:
            self._running_version()
        return self._api_version  # type: ignore[return-value]

    # -- plumbing --------------------------------------------------------------------------

    def _running_version(self) -> str:
        out = subprocess.run(
            ["sinfo", "--version"], env=self.env, capture_output=True, text=True, timeout=30
        ).stdout
        m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        if not m:
            raise RuntimeError("cannot get the Slurm version: %r" % out)
        self._api_version = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return (
            "%d.%d.0" % self._api_version[:2]
        )  # pyslurm style: 25.11.0 for 25.11, 22.5.0 for 22.05

    def _scontrol(self, args: List[str], not_found: Optional[str] = None) -> str:
        self.rpcs += 1
        res = subprocess.run(
            ["scontrol"] + args, env=self.env, capture_output=True, text=True, timeout=self.timeout
        )
        if res.returncode != 0:
            text = res.stderr.strip() or res.stdout.strip()  # "Node x not found" is on stdout
            if not_found and re.search(r"Node \S+ not found", text):
                raise RPCError(msg="Node '%s' does not exist" % not_found)
            raise _rpc_error(text)
        return res.stdout

    @staticmethod
    def _node_from_fields(node_cls: Any, f: Dict[str, str]) -> Any:
        n = node_cls(f.get("NodeName"))
        object.__setattr__(n, "_changes", {})
        object.__setattr__(n, "state", f.get("State"))
        reason = f.get("Reason")
        user = when = None
        if reason:
            m = re.match(r"(.*?)\s*\[([^\]@]+)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]\s*$", reason)
            if m:
                reason, user = m.group(1), m.group(2)
                when = int(time.mktime(time.strptime(m.group(3), "%Y-%m-%dT%H:%M:%S")))
        object.__setattr__(n, "reason", reason or None)
        object.__setattr__(n, "reason_user", user)
        object.__setattr__(n, "reason_time", when)
        parts = f.get("Partitions", "")
        object.__setattr__(n, "partitions", [p for p in parts.split(",") if p and p != "(null)"])
        return n


__all__ = ["PyslurmDouble", "PyslurmError", "RPCError"]
