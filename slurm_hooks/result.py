"""Status and Result: what every check returns.

A check never prints, exits or drains; it returns one Result or a list of them (one per
affected component). The runner combines them (worst wins) and policy decides what to do.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from .core.structs import Struct, field

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, Optional


class Status(enum.Enum):
    """Outcome of one check. `exit_code` is the Nagios code; `severity` orders them for 'worst wins'."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"  # could not evaluate (missing function, parse error, timeout, our bug)
    SKIP = "SKIP"  # not applicable here (no GPUs, disabled, not supported on this SKU)

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def exit_code(self) -> ExitCode:
        return _EXIT_CODE[self]


class ExitCode(enum.IntEnum):
    """Every exit code of the slurm-hooks command, in one place.

    0-3 are Nagios' codes: a run of checks exits with its worst Status (Status.exit_code), and usage
    and configuration errors are UNKNOWN. NODE_BROKEN is the hooks' own: this node must not run the
    job; prolog.d/epilog.d turn it into 1 (Slurm's signal to fail the prolog) and every other code
    into 0 (fail open). `drain`/`resume` by hand exit REFUSED (1) when etiquette or Slurm's state
    refused the request; `report` exits FOUND (1) when it names nodes to look at. The whole table
    is in docs/cli.md.
    """

    OK = 0
    WARN = 1
    REFUSED = 1  # an alias of WARN (same number): drain/resume not done
    FOUND = (
        1  # an alias of WARN: `report` found nodes to look at (abnormal jobs, straggler suspects)
    )
    FAIL = 2
    UNKNOWN = 3  # could not evaluate; also usage, configuration and Slurm-unreachable errors
    NODE_BROKEN = 10


_SEVERITY = {Status.SKIP: 0, Status.OK: 1, Status.WARN: 2, Status.UNKNOWN: 3, Status.FAIL: 4}
_EXIT_CODE = {
    Status.SKIP: ExitCode.OK,
    Status.OK: ExitCode.OK,
    Status.WARN: ExitCode.WARN,
    Status.FAIL: ExitCode.FAIL,
    Status.UNKNOWN: ExitCode.UNKNOWN,
}


class Action(enum.Enum):
    """What an operator (or policy) should do about a failing component."""

    NONE = "none"
    DRAIN = "drain"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"
    RMA = "rma"


class Blame(enum.Enum):
    """Who is broken when a check does not pass. Only NODE may lead to a drain."""

    NODE = "node"  # the hardware/OS of this node is bad: drain
    JOB = "job"  # the job (or its request) is bad: fail the job, keep the node
    CHECK = "check"  # we could not evaluate (our bug, missing NVML function): alert only


class Result(Struct):
    """One finding of one check about one component (or the whole node when component is None)."""

    check: str
    status: Status
    summary: str
    component: Optional[str] = None  # e.g. "gpu:3 0000:3b:00.0", "hca:mlx5_2", "numa:1"
    details: Mapping[str, Any] = field(default_factory=dict)
    action: Action = Action.NONE
    blame: Optional[Blame] = None  # None = derived from status (see effective_blame)

    @property
    def effective_blame(self) -> Optional[Blame]:
        """FAIL defaults to NODE, UNKNOWN to CHECK; OK/WARN/SKIP blame nobody."""
        if self.blame is not None:
            return self.blame
        if self.status is Status.FAIL:
            return Blame.NODE
        if self.status is Status.UNKNOWN:
            return Blame.CHECK
        return None

    def to_dict(self) -> Dict[str, Any]:
        blame = self.effective_blame
        return {
            "check": self.check,
            "status": self.status.value,
            "summary": self.summary,
            "component": self.component,
            "action": self.action.value,
            "blame": blame.value if blame else None,
            "details": _jsonable(self.details),
        }


def worst(statuses: Iterable[Status]) -> Status:
    """The most severe status; SKIP when there is none."""
    return max(statuses, key=lambda s: s.severity, default=Status.SKIP)


def _jsonable(value: Any) -> Any:
    """Details may hold tuples, sets, enums and dataclass-like objects; JSON needs plain types."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def result_from_dict(data: Mapping[str, Any]) -> Result:
    """Inverse of Result.to_dict (used to carry results out of the isolated check process)."""
    blame = data.get("blame")
    return Result(
        check=str(data["check"]),
        status=Status(data["status"]),
        summary=str(data["summary"]),
        component=data.get("component"),
        details=dict(data.get("details") or {}),
        action=Action(data.get("action", "none")),
        blame=Blame(blame) if blame else None,
    )
