"""NVIDIA Xid / NVSwitch SXid codes: the packaged catalog, classification, and `explain`.

Parsing kernel log lines into XidEvent/SxidEvent is slurm_hooks.xid.kmsg's job; this module says
what an event means.

The packaged table ``slurm_hooks/data/xid_catalog.json`` is a transcription of NVIDIA's Xid
catalog ("Analyzing Xid Errors with the Xid Catalog", XID Errors documentation,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). For each Xid it records
NVIDIA's resolution buckets (immediate and investigatory action), and our own annotations: the
GPU component involved and whether the fault is typically caused by the user application.
:func:`classify` turns an event into a (status, action, blame) decision; see its docstring for
the decision table.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

from ..core.lazyre import lazy_compile
from ..core.structs import Struct
from ..result import Action, Blame, Status
from .kmsg import SxidEvent, XidEvent

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

__all__ = [
    "STATUSES",
    "ACTIONS",
    "BLAMES",
    "IMMEDIATE_BUCKETS",
    "XidEntry",
    "Classification",
    "XidCatalog",
    "classify",
    "classify_all",
    "classify_sxid",
    "validate_overrides",
    "explain",
    "load_catalog",
]


# What a classification (and an admin's override) may say: the values of result.Status / Action / Blame,
# the same words the checks' Results carry (SKIP is never what an Xid means).
STATUSES = tuple(status.value for status in Status if status is not Status.SKIP)
ACTIONS = tuple(action.value for action in Action)
BLAMES = tuple(blame.value for blame in Blame)

#: Immediate-action buckets the catalog may use (plus our UNKNOWN marker).
IMMEDIATE_BUCKETS = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_APP",
        "RESTART_VM",
        "IGNORE",
        "CONTACT_SUPPORT",
        "CHECK_MECHANICALS",
        "UPDATE_SWFW",
        "CHECK_UVM",
        "XID_154",
        "WORKFLOW_XID_45",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "UNKNOWN",
    }
)


_DATA_FILE = "xid_catalog.json"


class XidEntry(Struct):
    """One row of the packaged Xid catalog."""

    xid: int
    mnemonic: str
    description: str
    immediate: (
        str  # NVIDIA "Resolution Bucket (Immediate Action)", or UNKNOWN when the catalog gives none
    )
    investigatory: str  # NVIDIA "Resolution Bucket (Investigatory Action)"
    applies_to: Tuple[str, ...]
    unused: bool  # catalog description "Unused": deprecated / V100-or-earlier only
    job_caused: (
        bool  # typically caused by the user application (our annotation, see job_caused_basis)
    )
    component: str
    xid154_linkage: Optional[str] = None
    job_caused_basis: Optional[str] = None
    notes: Optional[str] = None
    # slurm-hooks' own (status, action, blame, basis) where NVIDIA gives no bucket (Xid 162-172)
    decision: Optional[Tuple[str, str, str, str]] = None


class Classification(Struct):
    """Our decision about one event. Strings match slurm_hooks.result Status/Action/Blame values."""

    status: str  # OK | WARN | FAIL | UNKNOWN
    action: str  # none | drain | reset-gpu | reboot | rma
    blame: str  # node | job | check
    reason: str
    xid: Optional[int] = None
    bucket: Optional[str] = None  # catalog immediate bucket the decision came from
    overridden: bool = False


# --------------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------------


def _read_packaged_text() -> str:
    """The catalog shipped as slurm_hooks/data/xid_catalog.json: a plain file of the package in
    every install we make (RPM, pip, checkout); importlib.resources (and the pathlib it imports,
    a few ms of every prolog) only for a zipped install."""
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", _DATA_FILE
    )
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        from importlib import resources

        return (resources.files("slurm_hooks") / "data" / _DATA_FILE).read_text(encoding="utf-8")


class XidCatalog:
    """The packaged Xid catalog (or one loaded from ``path``/``data``)."""

    def __init__(
        self,
        data: Optional[Mapping[str, Any]] = None,
        path: Optional[Union[str, "os.PathLike[str]"]] = None,
    ):
        if data is None:
            if path is None:
                text = _read_packaged_text()
            else:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            data = json.loads(text)
        self.raw: Mapping[str, Any] = data
        self.schema_version: int = int(data["schema_version"])
        self.version: str = str(data["catalog_version"])
        self.source: Mapping[str, Any] = data["source"]
        self.buckets: Mapping[str, str] = data["buckets"]
        self.investigatory_buckets: Mapping[str, str] = data["investigatory_buckets"]
        self.sxid: Mapping[str, Any] = data.get("sxid", {})
        entries: Dict[int, XidEntry] = {}
        for row in data["xids"]:
            e = XidEntry(
                xid=int(row["xid"]),
                mnemonic=row["mnemonic"],
                description=row["description"],
                immediate=row["immediate"],
                investigatory=row["investigatory"],
                applies_to=tuple(row.get("applies_to") or ()),
                unused=bool(row.get("unused", False)),
                job_caused=bool(row.get("job_caused", False)),
                component=row.get("component") or "gpu",
                xid154_linkage=row.get("xid154_linkage"),
                job_caused_basis=row.get("job_caused_basis"),
                notes=row.get("notes"),
                decision=_own_decision(row),
            )
            if e.xid in entries:
                raise ValueError("xid catalog: duplicate entry for Xid %d" % e.xid)
            if e.immediate not in IMMEDIATE_BUCKETS:
                raise ValueError("xid catalog: Xid %d has unknown bucket %r" % (e.xid, e.immediate))
            entries[e.xid] = e
        self._entries = entries

    def lookup(self, xid: int) -> Optional[XidEntry]:
        try:
            return self._entries.get(int(xid))
        except (TypeError, ValueError):
            return None

    def __iter__(self):
        return iter(sorted(self._entries.values(), key=lambda e: e.xid))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, xid: object) -> bool:
        return isinstance(xid, int) and xid in self._entries

    @property
    def source_line(self) -> str:
        s = self.source
        return "%s, %s <%s> (retrieved %s; newest driver referenced %s)" % (
            s.get("publisher", "NVIDIA"),
            s.get("title", "?"),
            s.get("url", "?"),
            s.get("retrieved", "?"),
            s.get("newest_driver_referenced", "?"),
        )


def _own_decision(row: Mapping[str, Any]) -> Optional[Tuple[str, str, str, str]]:
    """A row's "decision" (ours, where the catalog gives no bucket), checked like an override."""
    own = row.get("decision")
    if own is None:
        return None
    try:
        decision = (own["status"], own["action"], own["blame"], own["basis"])
    except (KeyError, TypeError):
        raise ValueError("xid catalog: Xid %s has a malformed decision" % row.get("xid")) from None
    if (
        decision[0] not in STATUSES
        or decision[1] not in ACTIONS
        or decision[2] not in BLAMES
        or not decision[3]
    ):
        raise ValueError("xid catalog: Xid %s has an invalid decision %r" % (row.get("xid"), own))
    return decision


_CATALOG: Optional[XidCatalog] = None


def load_catalog() -> XidCatalog:
    """The packaged catalog, loaded once."""
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = XidCatalog()
    return _CATALOG


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------

_OVERRIDE_KEYS = ("status", "action", "blame", "reason")
_XID_KEY_RE = lazy_compile(r"\A[1-9][0-9]{0,4}\Z")  # 1..99999 as the driver prints it


def validate_overrides(overrides: Optional[Mapping[Any, Any]]) -> Dict[int, Dict[str, str]]:
    """Check operator overrides and return them keyed by int Xid.

    Shape: ``{"79": {"status": "FAIL", "action": "reboot"}, "13": {"status": "OK"}}``; keys are Xid
    numbers (str or int), values may set ``status``, ``action``, ``blame`` and ``reason``. Anything
    else raises ValueError naming the Xid and the key. A status of OK/WARN/UNKNOWN cannot be
    combined with an action other than "none".
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValueError(
            "xid overrides must be a mapping of Xid -> settings, got %s" % type(overrides).__name__
        )
    out: Dict[int, Dict[str, str]] = {}
    for key, spec in overrides.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ValueError("xid override key %r is not an Xid number" % (key,))
        # ASCII digits, no sign, space or leading zero: str.isdigit() and int() also take '７９' and
        # Arabic-Indic digits, int() ' 79' and '079' - keys that look unlike 79 but override it.
        skey = str(key)
        if not _XID_KEY_RE.match(skey):
            raise ValueError(
                "xid override key %r is not an Xid number (write it in ASCII digits without "
                "spaces or leading zeros, e.g. 79)" % (key,)
            )
        xid = int(skey)
        if not isinstance(spec, Mapping):
            raise ValueError(
                'xid override for Xid %d must be a mapping (a table like {status = "FAIL", action = "rma"}), '
                "got %s %r" % (xid, type(spec).__name__, spec)
            )
        if not spec:
            raise ValueError("xid override for Xid %d is empty" % xid)
        clean: Dict[str, str] = {}
        for k, v in spec.items():
            if k not in _OVERRIDE_KEYS:
                raise ValueError(
                    "xid override for Xid %d: unknown key %r (allowed: %s)"
                    % (xid, k, ", ".join(_OVERRIDE_KEYS))
                )
            if not isinstance(v, str):
                raise ValueError("xid override for Xid %d: key %r must be a string" % (xid, k))
            allowed = {"status": STATUSES, "action": ACTIONS, "blame": BLAMES}.get(k)
            if k == "status":
                v = v.upper()
            elif k in ("action", "blame"):
                v = v.lower()
            if allowed is not None and v not in allowed:
                raise ValueError(
                    "xid override for Xid %d: key %r has invalid value %r (allowed: %s)"
                    % (xid, k, v, ", ".join(allowed))
                )
            clean[k] = v
        if (
            clean.get("status") not in (None, Status.FAIL.value)
            and clean.get("action", Action.NONE.value) != Action.NONE.value
        ):
            raise ValueError(
                "xid override for Xid %d: key 'action' %r contradicts status %r"
                % (xid, clean["action"], clean["status"])
            )
        out[xid] = clean
    return out


def _c(
    status: str, action: str, blame: str, reason: str, xid: Optional[int], bucket: Optional[str]
) -> Classification:
    return Classification(
        status=status, action=action, blame=blame, reason=reason, xid=xid, bucket=bucket
    )


# Xid 74 register bits the catalog says can be ignored / are threshold notices (register index -> bits).
_NVLINK_BENIGN_BITS = {0: {0, 23, 30}, 4: {20, 23, 26, 29}}
_HEX_TUPLE_RE = lazy_compile(r"\(\s*(0x[0-9a-fA-F]{1,16}(?:\s*,?\s*0x[0-9a-fA-F]{1,16}){1,8})\s*\)")
_NVL5_SEV_RE = lazy_compile(r"\b(Nonfatal|Non-fatal|Fatal)\b", re.I)
_XID154_RE = lazy_compile(r"\bto 0x[0-9a-fA-F]{1,8} \(([^()]{1,40})\)")
_XID154_ACTIONS = {
    "none": ("OK", "none", "node"),
    "drain p2p": ("FAIL", "drain", "node"),
    "drain and reset": ("FAIL", "reset-gpu", "node"),
    "gpu reset required": ("FAIL", "reset-gpu", "node"),
    "node reboot required": ("FAIL", "reboot", "node"),
}


def _nvlink_registers(text: str) -> Optional[List[int]]:
    m = _HEX_TUPLE_RE.search(text)
    if not m:
        return None
    return [int(v, 16) for v in re.findall(r"0x[0-9a-fA-F]+", m.group(1))]


def _related_set(related: Optional[Iterable[int]], xid: int) -> Optional[set]:
    if related is None:
        return None
    return {int(r) for r in related if isinstance(r, int) and not isinstance(r, bool)} - {xid}


# Buckets whose decision does not depend on the message: status, action, blame, reason template.
_SIMPLE_BUCKETS = {
    "RESET_GPU": ("FAIL", "reset-gpu", "node", "catalog RESET_GPU: %s"),
    "RESTART_BM": ("FAIL", "reboot", "node", "catalog RESTART_BM: %s"),
    # A Slurm node that is itself a VM is the VM that owns the GPU.
    "RESTART_VM": (
        "FAIL",
        "reboot",
        "node",
        "catalog RESTART_VM (restart the VM owning the GPU): %s",
    ),
    # Unexpected on current GPUs; nothing says the part is bad, so keep jobs off and let a human look.
    "CONTACT_SUPPORT": (
        "FAIL",
        "drain",
        "node",
        "catalog CONTACT_SUPPORT (unexpected Xid, escalate): %s",
    ),
    "CHECK_MECHANICALS": (
        "FAIL",
        "drain",
        "node",
        "catalog CHECK_MECHANICALS (check seating/power connections): %s",
    ),
    "UPDATE_SWFW": (
        "FAIL",
        "drain",
        "node",
        "catalog UPDATE_SWFW (driver/firmware update needed): %s",
    ),
    # nvidia-uvm is in use on any node that runs CUDA jobs, so the catalog's UVM branch applies.
    "CHECK_UVM": (
        "FAIL",
        "reset-gpu",
        "node",
        "catalog CHECK_UVM (UVM in use on CUDA nodes -> reset GPU): %s",
    ),
}


def _default_classification(
    event: XidEvent, entry: Optional[XidEntry], related: Optional[set]
) -> Classification:
    x = event.xid
    if entry is None:
        return _c(
            "UNKNOWN",
            "none",
            "check",
            "Xid %d is not in the packaged catalog; recorded only" % x,
            x,
            None,
        )
    b = entry.immediate
    if b in _SIMPLE_BUCKETS:
        status, action, blame, template = _SIMPLE_BUCKETS[b]
        return _c(status, action, blame, template % entry.description, x, b)
    if b == "RESTART_APP":
        if entry.job_caused:
            return _c(
                "WARN",
                "none",
                "job",
                "catalog RESTART_APP: %s (typically caused by the application)" % entry.description,
                x,
                b,
            )
        # The GPU or driver faulted and the application using it was stopped: the job was a victim, not
        # the cause (Xid 94, a contained uncorrectable memory error, kills the job that touched the bad row).
        # The node stays in service; a pending row remap or recovery action is reported by gpu.memory / Xid 154.
        return _c(
            "WARN",
            "none",
            "node",
            "catalog RESTART_APP: %s (a hardware/driver fault stopped the "
            "application; not caused by the job)" % entry.description,
            x,
            b,
        )
    if b == "IGNORE":
        extra = ""
        if entry.investigatory not in ("IGNORE", "N/A", "UNKNOWN"):
            extra = "; if recurring: %s" % entry.investigatory
        return _c(
            "OK",
            "none",
            "job" if entry.job_caused else "node",
            "catalog IGNORE: %s%s" % (entry.description, extra),
            x,
            b,
        )
    workflow = _WORKFLOWS.get(b)
    if workflow is not None:
        return workflow(event, related)
    if entry.decision is not None:  # no bucket from NVIDIA: our own decision, with its basis
        status, action, blame, basis = entry.decision
        return _c(
            status,
            action,
            blame,
            "slurm-hooks decision (NVIDIA's catalog gives no bucket for Xid %d, %s): %s"
            % (x, entry.description, basis),
            x,
            b,
        )
    # UNKNOWN: the catalog lists the Xid but gives no bucket.
    return _c(
        "UNKNOWN",
        "none",
        "check",
        "catalog gives no resolution bucket for Xid %d (%s); recorded only"
        % (x, entry.description),
        x,
        b,
    )


def _xid45(event: XidEvent, related: Optional[set]) -> Classification:
    x, b = event.xid, "WORKFLOW_XID_45"
    if related:
        return _c(
            "OK",
            "none",
            "job",
            "Xid 45 with Xid %s: teardown after the other error, follow that one"
            % ",".join(str(r) for r in sorted(related)),
            x,
            b,
        )
    return _c(
        "WARN",
        "none",
        "job",
        "Xid 45 alone: application torn down (kill/Ctrl-C/reset); "
        "catalog: restart Fabric Manager on NVSwitch systems if it recurs",
        x,
        b,
    )


def _xid48(event: XidEvent, related: Optional[set]) -> Classification:
    x, b = event.xid, "WORKFLOW_XID_48"
    if related and related & {63, 64}:
        return _c(
            "FAIL",
            "reset-gpu",
            "node",
            "Xid 48 (uncorrectable ECC) with Xid 63/64: drain and reset the GPU",
            x,
            b,
        )
    return _c(
        "FAIL",
        "reset-gpu",
        "node",
        "Xid 48 (uncorrectable ECC): reset the GPU; run field diag if it recurs",
        x,
        b,
    )


def _nvlink(event: XidEvent, related: Optional[set]) -> Classification:
    x, b = event.xid, "WORKFLOW_NVLINK_ERR"
    regs = _nvlink_registers(event.text)
    if regs and any(regs):
        benign = all(
            (v & ~sum(1 << bit for bit in _NVLINK_BENIGN_BITS.get(i, ()))) == 0
            for i, v in enumerate(regs)
        )
        if benign:
            return _c(
                "WARN",
                "none",
                "node",
                "Xid 74 with only ignorable/threshold register bits set; no reset needed",
                x,
                b,
            )
    return _c(
        "FAIL",
        "reset-gpu",
        "node",
        "Xid 74 NVLink error: GPU reset (or reboot) needed to clear; check the "
        "link and its peer if it recurs",
        x,
        b,
    )


def _nvlink5(event: XidEvent, related: Optional[set]) -> Classification:
    x, b = event.xid, "WORKFLOW_NVLINK5_ERR"
    sm = _NVL5_SEV_RE.search(event.text)
    if sm is None:
        return _c(
            "UNKNOWN",
            "none",
            "check",
            "Xid %d NVLink5 error without Fatal/Nonfatal marker; decode "
            "intrInfo/errorStatus with the catalog's 144-150 sheet" % x,
            x,
            b,
        )
    if sm.group(1).lower() == "fatal":
        return _c(
            "FAIL",
            "reset-gpu",
            "node",
            "Xid %d NVLink5 error marked Fatal: reset the GPU" % x,
            x,
            b,
        )
    return _c(
        "WARN",
        "none",
        "node",
        "Xid %d NVLink5 error marked Nonfatal: no reset; follow Xid 154 if one is logged" % x,
        x,
        b,
    )


def _xid154(event: XidEvent, related: Optional[set]) -> Classification:
    x, b = event.xid, "XID_154"
    am = _XID154_RE.search(event.text)
    if am:
        key = " ".join(am.group(1).lower().split())
        if key in _XID154_ACTIONS:
            st, ac, bl = _XID154_ACTIONS[key]
            return _c(
                st, ac, bl, "Xid 154: driver says recovery action is now %r" % am.group(1), x, b
            )
    return _c(
        "WARN",
        "none",
        "node",
        "Xid 154 without a recognised recovery action; follow the accompanying Xid",
        x,
        b,
    )


_WORKFLOWS = {
    "WORKFLOW_XID_45": _xid45,
    "WORKFLOW_XID_48": _xid48,
    "WORKFLOW_NVLINK_ERR": _nvlink,
    "WORKFLOW_NVLINK5_ERR": _nvlink5,
    "XID_154": _xid154,
}


def classify(
    event: XidEvent,
    overrides: Optional[Mapping[Any, Any]] = None,
    *,
    related: Optional[Iterable[int]] = None,
    catalog: Optional[XidCatalog] = None,
) -> Classification:
    """Decide what an Xid means for the node and the job.

    Decision table (catalog immediate bucket -> status / action / blame):

    ================== ============================================================
    RESET_GPU          FAIL / reset-gpu / node
    RESTART_BM         FAIL / reboot / node
    RESTART_VM         FAIL / reboot / node (the Slurm node is the VM)
    CONTACT_SUPPORT    FAIL / drain / node - unexpected code, not proof of bad hardware,
                       so we keep jobs off and leave RMA to a human (or an override)
    CHECK_MECHANICALS  FAIL / drain / node
    UPDATE_SWFW        FAIL / drain / node
    CHECK_UVM          FAIL / reset-gpu / node (UVM is always in use on CUDA nodes)
    RESTART_APP        WARN / none / job - job broken, node fine
    IGNORE             OK / none / job-or-node (per the catalog's user-app attribution)
    WORKFLOW_XID_45    with other Xids in ``related``: OK / none / job; alone: WARN / none / job
    WORKFLOW_XID_48    FAIL / reset-gpu / node (reason says "drain and reset" with 63/64)
    WORKFLOW_NVLINK_ERR FAIL / reset-gpu / node, unless the printed registers only carry
                       bits the catalog calls ignorable: WARN / none / node
    WORKFLOW_NVLINK5_ERR "Fatal" in the message: FAIL / reset-gpu; "Nonfatal": WARN / none;
                       neither: UNKNOWN
    XID_154            the action named in "... to 0xN (<action>)": None -> OK, Drain P2P ->
                       drain, Drain and Reset / GPU Reset Required -> reset-gpu, Node Reboot
                       Required -> reboot; otherwise WARN
    no bucket, our decision  the row's own "decision" with its basis (Xid 162-172: NVIDIA gives
                       free text or nothing; see slurm_hooks/data/xid_catalog.json)
    not in catalog     UNKNOWN / none / check (recorded, never drains)
    ================== ============================================================

    ``related`` are the other Xid numbers seen in the same window on the same GPU (used by the
    45 and 48 workflows; see :func:`classify_all`). ``overrides`` (see :func:`validate_overrides`)
    replace fields of the result; when an override sets ``status`` without ``action``, the action
    becomes "none" for OK/WARN/UNKNOWN and "drain" for a FAIL that had none.
    """
    cat = catalog or load_catalog()
    return _classify(event, validate_overrides(overrides), _related_set(related, event.xid), cat)


# Buckets whose decision reads the message text, and those that read the other Xids of the GPU.
_TEXT_BUCKETS = frozenset({"WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154"})
_RELATED_BUCKETS = frozenset({"WORKFLOW_XID_45", "WORKFLOW_XID_48"})


def _decision_key(
    event: XidEvent, entry: Optional[XidEntry], related: Optional[set]
) -> Tuple[Any, ...]:
    """What a classification depends on: the Xid, and the text or related Xids only where its bucket reads them."""
    bucket = entry.immediate if entry is not None else None
    return (
        event.xid,
        event.text if bucket in _TEXT_BUCKETS else None,
        frozenset(related) if bucket in _RELATED_BUCKETS and related else None,
    )


def _classify(
    event: XidEvent, ov: Mapping[int, Mapping[str, str]], related: Optional[set], cat: XidCatalog
) -> Classification:
    entry = cat.lookup(event.xid)
    result = _default_classification(event, entry, related)
    spec = ov.get(event.xid)
    if not spec:
        return result
    status = spec.get("status", result.status)
    if "action" in spec:
        action = spec["action"]
        if "status" not in spec and action != "none":
            status = "FAIL"  # asking for an action means the node fails
        elif "status" not in spec and status == "FAIL":
            status = "WARN"  # FAIL without an action is not a thing we produce
    elif "status" in spec:
        if status == "FAIL":
            action = result.action if result.action != "none" else "drain"
        else:
            action = "none"
    else:
        action = result.action
    if "blame" in spec:
        blame = spec["blame"]
    elif status == "FAIL" and result.status != "FAIL":
        blame = "node"
    elif status == "UNKNOWN":
        blame = "check"
    else:
        blame = result.blame
    reason = spec.get("reason") or "operator override (was %s/%s): %s" % (
        result.status,
        result.action,
        result.reason,
    )
    return Classification(
        status=status,
        action=action,
        blame=blame,
        reason=reason,
        xid=event.xid,
        bucket=result.bucket,
        overridden=True,
    )


def classify_all(
    events: Iterable[XidEvent],
    overrides: Optional[Mapping[Any, Any]] = None,
    catalog: Optional[XidCatalog] = None,
) -> List[Classification]:
    """Classify a window of events, passing each one the other Xids seen on the same GPU.

    Overrides are validated once, and events that decide alike (same Xid; same text or related
    Xids only where the bucket reads them) share one decision: a flood of 100,000 Xid lines is a
    few distinct decisions (bench/xid_scale.py).
    """
    evs = list(events)
    by_gpu: Dict[Optional[str], set] = {}
    for e in evs:
        by_gpu.setdefault(e.pci, set()).add(e.xid)
    ov = validate_overrides(overrides)
    # the packaged catalog (77 kB of JSON and ~170 rows: ~3 ms of CPU) only when there is an event
    # to classify: a node without Xids, every prolog's case, never reads it (round 7 of issue 29:
    # xid.events ran last in the check process, its catalog on the path the job waits on)
    cat = catalog or (load_catalog() if evs else None)
    decided: Dict[Tuple[Any, ...], Classification] = {}
    related_of: Dict[Tuple[Optional[str], int], Tuple[Optional[set], Tuple[Any, ...]]] = {}
    out = []
    for e in evs:
        known = related_of.get((e.pci, e.xid))
        if known is None:
            related = _related_set(by_gpu.get(e.pci, set()), e.xid)
            known = related_of[(e.pci, e.xid)] = (
                related,
                _decision_key(e, cat.lookup(e.xid), related),
            )
        related, key = known
        if key[1] is not None:  # the bucket reads the message: the key includes this event's text
            key = (key[0], e.text, key[2])
        cls = decided.get(key)
        if cls is None:
            cls = decided[key] = _classify(e, ov, related, cat)
        out.append(cls)
    return out


def classify_sxid(
    event: SxidEvent, overrides: Optional[Mapping[Any, Any]] = None
) -> Classification:
    """Classify an NVSwitch SXid by the severity printed in the line.

    Fatal -> FAIL / reboot / node: recovering from a fatal switch error needs the fabric's GPUs and
    NVSwitches reset and Fabric Manager restarted, which a reboot does in one step. Non-fatal ->
    WARN / none / node. No severity printed -> UNKNOWN / none / check. ``overrides`` use the same
    shape as for Xids, keyed by SXid number.
    """
    ov = validate_overrides(overrides)
    n, text = event.sxid, event.text
    if event.severity == "Fatal":
        base = Classification(
            "FAIL", "reboot", "node", "NVSwitch SXid %d Fatal: %s" % (n, text), None, "SXID_FATAL"
        )
    elif event.severity == "Non-fatal":
        base = Classification(
            "WARN",
            "none",
            "node",
            "NVSwitch SXid %d Non-fatal: %s" % (n, text),
            None,
            "SXID_NONFATAL",
        )
    else:
        base = Classification(
            "UNKNOWN",
            "none",
            "check",
            "NVSwitch SXid %d without severity: %s" % (n, text),
            None,
            None,
        )
    spec = ov.get(event.sxid)
    if not spec:
        return base
    status = spec.get("status", base.status)
    action = spec.get("action", base.action if status == "FAIL" else "none")
    if status in ("OK", "WARN", "UNKNOWN") and action != "none":
        raise ValueError(
            "sxid override for SXid %d: action %r contradicts status %r"
            % (event.sxid, action, status)
        )
    blame = spec.get("blame", "check" if status == "UNKNOWN" else base.blame)
    return Classification(
        status,
        action,
        blame,
        spec.get("reason") or "operator override: " + base.reason,
        None,
        base.bucket,
        True,
    )


# --------------------------------------------------------------------------------------------
# Explain
# --------------------------------------------------------------------------------------------


def _decided_by(
    cls: Classification, entry: Optional[XidEntry], cat: XidCatalog, override_source: Optional[str]
) -> str:
    """Where a decision comes from: the operator's config, NVIDIA's catalog, or our own reasoning."""
    if cls.overridden:
        return 'an operator override ([checks."xid.events"].overrides in %s)' % (
            override_source or "the configuration"
        )
    if entry is None:
        return "nothing: Xid %d is not in NVIDIA's catalog %s, so it is only recorded" % (
            cls.xid,
            cat.version,
        )
    if entry.decision is not None and entry.immediate == "UNKNOWN":
        return "slurm-hooks' own reasoning: NVIDIA's catalog %s lists Xid %d without a bucket" % (
            cat.version,
            entry.xid,
        )
    return "NVIDIA's catalog %s, immediate action bucket %s" % (cat.version, entry.immediate)


def explain(
    xid: Union[int, str],
    overrides: Optional[Mapping[Any, Any]] = None,
    catalog: Optional[XidCatalog] = None,
    override_source: Optional[str] = None,
) -> str:
    """Human-readable text for ``slurm-hooks explain xid N`` (``override_source``: the config files read)."""
    cat = catalog or load_catalog()
    try:
        n = int(str(xid).strip())
    except ValueError:
        return "%r is not an Xid number" % (xid,)
    entry = cat.lookup(n)
    cls = classify(
        XidEvent(xid=n, pci=None, pid=None, process=None, text=""), overrides, catalog=cat
    )
    lines: List[str] = []
    if entry is None:
        lines.append("Xid %d: not in the packaged catalog (catalog %s)" % (n, cat.version))
        lines.append("  Newer than our copy of NVIDIA's catalog, or not an NVIDIA Xid.")
    else:
        lines.append("Xid %d  %s" % (n, entry.mnemonic))
        lines.append(
            "  Description:          %s%s"
            % (entry.description, " (deprecated / pre-Ampere only)" if entry.unused else "")
        )
        lines.append(
            "  Applies to:           %s"
            % (", ".join(entry.applies_to) or "none of A100/H100/B100/GB200")
        )
        lines.append("  Component:            %s" % entry.component)
        lines.append(
            "  NVIDIA immediate:     %s - %s"
            % (entry.immediate, cat.buckets.get(entry.immediate, ""))
        )
        lines.append(
            "  NVIDIA investigatory: %s - %s"
            % (entry.investigatory, cat.investigatory_buckets.get(entry.investigatory, ""))
        )
        if entry.xid154_linkage:
            lines.append("  Xid 154 linkage:      %s" % entry.xid154_linkage)
        basis = entry.job_caused_basis
        lines.append(
            "  Caused by the job:    %s"
            % (
                "typically yes - " + (basis or "")
                if entry.job_caused
                else "not typically" + (" - " + basis if basis else "")
            )
        )
        if entry.notes:
            lines.append("  Notes:                %s" % entry.notes)
    node_verdict = {
        "OK": "nothing broken",
        "WARN": "a node/hardware fault, alert only (node stays in service)",
    }
    verdict = {
        "job": "job-broken (node stays in service)",
        "node": node_verdict.get(cls.status, "node-broken"),
        "check": "undecided (recorded only, no drain)",
    }[cls.blame]
    lines.append("slurm-hooks classification (message-independent default):")
    lines.append(
        "  Status: %s   Action: %s   Blame: %s - %s%s"
        % (
            cls.status,
            cls.action,
            cls.blame,
            verdict,
            "   [operator override]" if cls.overridden else "",
        )
    )
    lines.append("  Reason: %s" % cls.reason)
    lines.append("  Decided by: %s" % _decided_by(cls, entry, cat, override_source))
    if entry is not None and entry.immediate.startswith(("WORKFLOW_", "XID_154")):
        lines.append("  (this Xid's decision also depends on the message text / accompanying Xids)")
    lines.append("Source: %s" % cat.source_line)
    lines.append("Catalog version: %s" % cat.version)
    return "\n".join(lines)
