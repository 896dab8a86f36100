"""A test double of pyslurm's object API (>= 22.5), backed by a REAL slurmctld through scontrol.

Why real-backed and not an in-memory table: the contract suite is about what slurmctld does (DRAIN
flag, reason read back exactly, RESUME's transient NOT_RESPONDING, unknown nodes, controller down).
An in-memory table would only echo our own assumptions back.  Routing the double's RPCs through
scontrol against the test cluster keeps Slurm's real behaviour; the double only reproduces pyslurm's
*shape*, taken from PySlurm's pyslurm/core/node.pyx and error.pyx:

  pyslurm.version() / __version__           "22.5.x" for Slurm 22.05 (major.minor must match Slurm)
  pyslurm.Node(name=None, **writable)       writable: state, reason, comment, extra, weight, ...
  pyslurm.Node.load(name) -> Node           RPCError("Node 'x' does not exist") if unknown
  Node(name).modify(Node(state=..., reason=...))   state in DRAIN/RESUME/DOWN/UNDRAIN/...; else
                                            ValueError("Invalid Node state: ...") before any RPC
  pyslurm.Nodes.load() -> list of Node
  Node.state        slurm_node_state_string_complete(): "IDLE+DRAIN", "DOWN+DRAIN+NOT_RESPONDING"
  Node.reason       the bare reason (scontrol's " [user@time]" suffix is NOT part of it)
  Node.reason_user  user name;  Node.reason_time  unix time (int) or None;  Node.partitions list
  RPCError(errno, msg): "Unable to contact slurm controller (connect failure)" (errno 1001),
                    "Socket timed out on send/recv operation" (5004), "Invalid node name specified"

Known differences from the real thing: each RPC is a scontrol process (~10 ms instead of ~1 ms);
scontrol strips a leading/trailing '"' from reasons (the real RPC would not) -- SlurmClient rejects
such reasons anyway.  ``rpcs`` counts the RPCs the double performed, so tests can prove the backend
went through it.  The parsing here is deliberately independent of slurm_hooks.slurm.
"""
from __future__ import annotations

import re
import subprocess
import time
from typing import Any, Dict, List, Optional

SETTABLE = ("state", "reason", "comment", "extra", "weight", "address", "hostname",
            "available_features", "active_features", "configured_gres", "cpu_binding")
STATES = ("CANCEL_REBOOT", "DOWN", "DRAIN", "FAIL", "FUTURE", "NORESP", "NO_RESP", "POWER_DOWN",
          "POWER_DOWN_ASAP", "POWER_DOWN_FORCE", "POWER_UP", "RESUME", "UNDRAIN")
_ERRNO = {"Unable to contact slurm controller": 1001, "Socket timed out": 5004,
          "Zero Bytes were transmitted": 5005, "Invalid node name specified": 2018}


class RPCError(Exception):
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
        reason, line = m.group(1), line[:m.start()]
    out = {k: v.strip() for k, v in re.findall(r"(?:^|\s)([A-Za-z_]+)=(\S*)", line)}
    if reason is not None:
        out["Reason"] = reason
    return out


class PyslurmDouble:
    """Module-like object: ``pyslurm = PyslurmDouble(env)``, then ``pyslurm.Node.load("node1")``."""

    def __init__(self, env: Dict[str, str], version: Optional[str] = None, timeout: float = 60.0) -> None:
        self.env = dict(env)
        self.env["SLURM_TIME_FORMAT"] = "standard"
        self.timeout = timeout
        self.rpcs = 0
        self.RPCError = RPCError
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
                if key not in SETTABLE:  # cython descriptors without a setter
                    raise AttributeError("attribute '%s' of 'pyslurm.core.node.Node' objects is not writable" % key)
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
                    raise TypeError("Argument 'changes' has incorrect type")
                argv = ["update", "NodeName=%s" % self.name]
                ch = changes._changes
                if ch.get("state"):
                    argv.append("State=%s" % str(ch["state"]).upper())
                if ch.get("reason") is not None:
                    argv.append("Reason=%s" % ch["reason"])
                for key, tag in (("comment", "Comment"), ("extra", "Extra"), ("weight", "Weight")):
                    if ch.get(key) is not None:
                        argv.append("%s=%s" % (tag, ch[key]))
                double._scontrol(argv)

            def as_dict(self) -> Dict[str, Any]:
                return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

        class Nodes(list):
            @staticmethod
            def load(preload_passwd_info: bool = False) -> "Nodes":
                out = double._scontrol(["show", "node", "-o"])
                return Nodes(double._node_from_fields(Node, _fields(line)) for line in out.splitlines()
                             if line.startswith("NodeName="))

            def as_dict(self) -> Dict[str, Any]:
                return {n.name: n for n in self}

        self.Node, self.Nodes = Node, Nodes

    def version(self) -> str:
        return self.__version__

    # -- plumbing --------------------------------------------------------------------------

    def _running_version(self) -> str:
        out = subprocess.run(["sinfo", "--version"], env=self.env, capture_output=True, text=True,
                             timeout=30).stdout
        m = re.search(r"(\d+)\.(\d+)", out)
        if not m:
            raise RuntimeError("cannot get the Slurm version: %r" % out)
        return "%d.%d.0" % (int(m.group(1)), int(m.group(2)))  # pyslurm style: 22.5.0 for 22.05

    def _scontrol(self, args: List[str], not_found: Optional[str] = None) -> str:
        self.rpcs += 1
        res = subprocess.run(["scontrol"] + args, env=self.env, capture_output=True, text=True,
                             timeout=self.timeout)
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


__all__ = ["PyslurmDouble", "RPCError"]
