"""NVIDIA Xid / NVSwitch SXid events: parse kernel-log lines, look them up, classify them.

Where the lines come from
-------------------------
The NVIDIA kernel driver (``NVRM``) reports GPU faults as *Xid* messages, and the NVSwitch
driver (``nvidia-nvswitch``) reports switch faults as *SXid* messages, through ``printk``.
They can be read from:

* ``/dev/kmsg`` - one record per ``read()``: ``"<prio>,<seq>,<usec>,<flags>[,...];<message>"``
  followed by optional continuation lines that start with a space (``" SUBSYSTEM=pci"``).
  ``seq`` is a per-boot sequence number and ``usec`` the time since boot, which is what
  :func:`scan` uses to report only records after a remembered position.
* ``dmesg`` - ``"[12345.678901] NVRM: ..."``; ``dmesg -T`` - ``"[Wed Dec  2 10:00:00 2026] NVRM: ..."``.
* ``journalctl -k`` (and syslog files) - ``"Dec 02 10:00:00 host kernel: NVRM: ..."``
  (also ISO timestamps, ``-o short-iso``).

The parsers here are pure (``str -> value``); reading the device/file/command is the caller's
job. Every parser returns ``None`` for anything it does not recognise and never raises.

What the codes mean
-------------------
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
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

__all__ = [
    "STATUSES",
    "ACTIONS",
    "BLAMES",
    "IMMEDIATE_BUCKETS",
    "KmsgRecord",
    "XidEvent",
    "SxidEvent",
    "XidEntry",
    "Classification",
    "XidCatalog",
    "parse_kmsg_record",
    "parse_xid",
    "parse_sxid",
    "normalize_pci",
    "scan",
    "scan_sxid",
    "classify",
    "classify_all",
    "classify_sxid",
    "validate_overrides",
    "explain",
    "load_catalog",
]

# Values match slurm_hooks.result.Status / Action / Blame.
STATUSES = ("OK", "WARN", "FAIL", "UNKNOWN")
ACTIONS = ("none", "drain", "reset-gpu", "reboot", "rma")
BLAMES = ("node", "job", "check")

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

#: Lines longer than this are not kernel log records (printk caps a record at ~1 KiB); ignore them.
MAX_LINE = 8192

_DATA_FILE = "xid_catalog.json"


# --------------------------------------------------------------------------------------------
# Data classes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record, from /dev/kmsg, ``dmesg``, ``dmesg -T`` or ``journalctl -k``.

    ``seq`` is only known for /dev/kmsg records; ``usec`` (microseconds since boot) for /dev/kmsg
    and plain ``dmesg``; ``wallclock`` is the timestamp text as printed by ``dmesg -T``/journalctl.
    """

    message: str
    source: str  # "kmsg" | "dmesg" | "dmesg-T" | "journal"
    priority: Optional[int] = None  # syslog priority incl. facility (kmsg only); level = priority & 7
    seq: Optional[int] = None
    usec: Optional[int] = None
    wallclock: Optional[str] = None
    host: Optional[str] = None
    continuation: bool = False  # kmsg flag "c": a fragment continued in the next record

    @property
    def level(self) -> Optional[int]:
        return None if self.priority is None else self.priority & 7


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` message. ``pci`` is a full bus id (``0000:3b:00.0``) or None if absent."""

    xid: int
    pci: Optional[str]
    pid: Optional[int]
    process: Optional[str]
    text: str  # the message after "<xid>, [pid=..., name=..., ]"
    raw: str = field(default="", repr=False, compare=False)
    seq: Optional[int] = None
    usec: Optional[int] = None
    wallclock: Optional[str] = None


@dataclass(frozen=True)
class SxidEvent:
    """One ``nvidia-nvswitchN: SXid`` message. ``severity`` is "Fatal", "Non-fatal" or None (not printed)."""

    sxid: int
    switch: Optional[int]  # N of nvidia-nvswitchN
    pci: Optional[str]
    severity: Optional[str]
    link: Optional[int]
    text: str
    raw: str = field(default="", repr=False, compare=False)
    seq: Optional[int] = None
    usec: Optional[int] = None
    wallclock: Optional[str] = None

    @property
    def fatal(self) -> Optional[bool]:
        return None if self.severity is None else self.severity == "Fatal"


@dataclass(frozen=True)
class XidEntry:
    """One row of the packaged Xid catalog."""

    xid: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA "Resolution Bucket (Immediate Action)", or UNKNOWN when the catalog gives none
    investigatory: str  # NVIDIA "Resolution Bucket (Investigatory Action)"
    applies_to: Tuple[str, ...]
    unused: bool  # catalog description "Unused": deprecated / V100-or-earlier only
    job_caused: bool  # typically caused by the user application (our annotation, see job_caused_basis)
    component: str
    xid154_linkage: Optional[str] = None
    job_caused_basis: Optional[str] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class Classification:
    """Our decision about one event. Strings match slurm_hooks.result Status/Action/Blame values."""

    status: str  # OK | WARN | FAIL | UNKNOWN
    action: str  # none | drain | reset-gpu | reboot | rma
    blame: str  # node | job | check
    reason: str
    xid: Optional[int] = None
    bucket: Optional[str] = None  # catalog immediate bucket the decision came from
    overridden: bool = False


# --------------------------------------------------------------------------------------------
# Line parsing
# --------------------------------------------------------------------------------------------

# /dev/kmsg: "6,1234,5678901,-;message" (some tools show the priority as "<6>").
_KMSG_RE = re.compile(r"^<?(\d{1,4})>?,(\d{1,20}),(\d{1,20}),([^,;]*)(?:,[^;]*)?;(.*)$", re.S)
# dmesg: "[12345.678901] message" (also "[    1.000000]").
_DMESG_RE = re.compile(r"^\[\s*(\d{1,12})\.(\d{1,9})\]\s?(.*)$", re.S)
# dmesg -T: "[Wed Dec  2 10:00:00 2026] message"
_DMESG_T_RE = re.compile(
    r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} "
    r"\d{2}:\d{2}:\d{2} \d{4})\]\s?(.*)$",
    re.S,
)
# journalctl -k / syslog: "Dec 02 10:00:00 host kernel: message" or "2026-12-02T10:00:00+0000 host kernel: ..."
_JOURNAL_RE = re.compile(
    r"^((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r" (\S{1,255}) kernel: ?(.*)$",
    re.S,
)
# "host kernel: " after a monotonic timestamp (journalctl -o short-monotonic).
_HOST_KERNEL_RE = re.compile(r"^(\S{1,255}) kernel: ?(.*)$", re.S)


def _clean(line: Any) -> Optional[str]:
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not isinstance(line, str):
        return None
    if len(line) > MAX_LINE:
        return None
    return line.rstrip("\r\n")


def parse_kmsg_record(line: Union[str, bytes]) -> Optional[KmsgRecord]:
    """Parse one kernel log line in any of the supported formats; None if unrecognised.

    Formats: /dev/kmsg records, plain ``dmesg``, ``dmesg -T`` and ``journalctl -k`` (short or
    short-iso, and short-monotonic). /dev/kmsg continuation lines (starting with a space: the
    ``KEY=value`` dictionary) are metadata and return None, as do empty, oversized or unrecognised
    lines. Never raises.
    """
    try:
        return _parse_kmsg_record(line)
    except Exception:  # pragma: no cover - defensive: a parser must never break a prolog
        return None


def _parse_kmsg_record(line: Any) -> Optional[KmsgRecord]:
    text = _clean(line)
    if not text or text[0] in " \t":
        return None
    m = _KMSG_RE.match(text)
    if m:
        prio, seq, usec, flags, msg = m.groups()
        return KmsgRecord(
            message=msg,
            source="kmsg",
            priority=int(prio),
            seq=int(seq),
            usec=int(usec),
            continuation="c" in flags,
        )
    m = _DMESG_RE.match(text)
    if m:
        secs, frac, msg = m.groups()
        usec = int(secs) * 1_000_000 + int((frac + "000000")[:6])
        host = None
        hk = _HOST_KERNEL_RE.match(msg)
        if hk and not hk.group(1).endswith(":"):
            host, msg = hk.groups()
        return KmsgRecord(message=msg, source="dmesg", usec=usec, host=host)
    m = _DMESG_T_RE.match(text)
    if m:
        return KmsgRecord(message=m.group(2), source="dmesg-T", wallclock=m.group(1))
    m = _JOURNAL_RE.match(text)
    if m:
        ts, host, msg = m.groups()
        usec = None
        d = _DMESG_RE.match(msg)  # syslog files often keep the dmesg timestamp after "kernel:"
        if d:
            usec = int(d.group(1)) * 1_000_000 + int((d.group(2) + "000000")[:6])
            msg = d.group(3)
        return KmsgRecord(message=msg, source="journal", wallclock=ts, host=host, usec=usec)
    return None


_PCI_RE = re.compile(r"^(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def normalize_pci(addr: str) -> Optional[str]:
    """``PCI:0000:3B:00`` / ``0000:3b:00`` / ``00000000:3B:00.0`` / ``3b:00`` -> ``0000:3b:00.0``; None if not an address."""
    if not isinstance(addr, str):
        return None
    m = _PCI_RE.match(addr.strip())
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    dom_i = int(dom, 16) if dom else 0
    dev_i = int(dev, 16)
    if dev_i > 0x1F:
        return None
    return "%04x:%02x:%02x.%d" % (dom_i, int(bus, 16), dev_i, int(fn or 0))


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
_XID_RE = re.compile(r"NVRM: ?Xid \(([^()]{1,40})\): ?(\d{1,5})(?:,\s*|\s+|$)(.*)$", re.S)
_PID_RE = re.compile(r"^pid=\s*'?([^,\s']{0,32})'?(?:,\s*|\s+|$)(.*)$", re.S)
_NAME_RE = re.compile(r"^name=(.*?)(?:,\s+|,$|$)(.*)$", re.S)


def parse_xid(message: Union[str, bytes]) -> Optional[XidEvent]:
    """Extract an Xid event from a kernel message (with or without a log prefix); None otherwise.

    Handles the variants printed by several driver generations::

        NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
        NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.
        NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ...
        NVRM: Xid (0000:3b:00): 31, pid=..., ...          (older drivers: no "PCI:" prefix)
        NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x...)

    ``pid``/``process`` are None when absent or printed as ``<unknown>``/``<n/a>``. Never raises.
    """
    try:
        return _parse_xid(message)
    except Exception:  # pragma: no cover - defensive
        return None


def _parse_xid(message: Any) -> Optional[XidEvent]:
    text = _clean(message)
    if not text:
        return None
    m = _XID_RE.search(text)
    if not m:
        return None
    addr, num, rest = m.groups()
    pci = normalize_pci(addr)
    if pci is None:
        return None
    xid = int(num)
    pid: Optional[int] = None
    process: Optional[str] = None
    rest = rest.strip()
    pm = _PID_RE.match(rest)
    if pm:
        value = pm.group(1)
        if value.isdigit() and int(value) > 0:
            pid = int(value)
        rest = pm.group(2)
    nm = _NAME_RE.match(rest)
    if nm:
        name = nm.group(1).strip().strip("'\"")
        if name and not (name.startswith("<") and name.endswith(">")):
            process = name
        rest = nm.group(2)
    return XidEvent(xid=xid, pci=pci, pid=pid, process=process, text=rest.strip(), raw=text)


# "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
_SXID_RE = re.compile(r"nvidia-nvswitch(\d{0,4}): ?SXid \(([^()]{1,40})\): ?(\d{1,6})(?:,\s*|\s+|$)(.*)$", re.S)
_SEV_RE = re.compile(r"^(Fatal|Non-fatal|Nonfatal|Non fatal)\b,?\s*(.*)$", re.S | re.I)
_LINK_RE = re.compile(r"\bLink (\d{1,4})\b")


def parse_sxid(message: Union[str, bytes]) -> Optional[SxidEvent]:
    """Extract an NVSwitch SXid event (``nvidia-nvswitchN: SXid (PCI:...): code, Fatal|Non-fatal, ...``).

    ``severity`` is normalised to "Fatal"/"Non-fatal", or None when the line does not say. Never raises.
    """
    try:
        return _parse_sxid(message)
    except Exception:  # pragma: no cover - defensive
        return None


def _parse_sxid(message: Any) -> Optional[SxidEvent]:
    text = _clean(message)
    if not text:
        return None
    m = _SXID_RE.search(text)
    if not m:
        return None
    sw, addr, num, rest = m.groups()
    pci = normalize_pci(addr)
    if pci is None:
        return None
    severity = None
    rest = rest.strip()
    sm = _SEV_RE.match(rest)
    if sm:
        severity = "Fatal" if sm.group(1).lower() == "fatal" else "Non-fatal"
        rest = sm.group(2)
    lm = _LINK_RE.search(rest)
    return SxidEvent(
        sxid=int(num),
        switch=int(sw) if sw else None,
        pci=pci,
        severity=severity,
        link=int(lm.group(1)) if lm else None,
        text=rest.strip(),
        raw=text,
    )


# --------------------------------------------------------------------------------------------
# Scanning a log for events since a remembered position
# --------------------------------------------------------------------------------------------


def _after(rec: KmsgRecord, since_seq: Optional[int], since_usec: Optional[int]) -> bool:
    if since_seq is not None:
        if rec.seq is None or rec.seq <= since_seq:
            return False
    if since_usec is not None:
        if rec.usec is None or rec.usec <= since_usec:
            return False
    return True


def _records(lines: Iterable[Union[str, bytes]]) -> Iterable[KmsgRecord]:
    for line in lines:
        rec = parse_kmsg_record(line)
        if rec is None:
            text = _clean(line)
            # a bare message (e.g. `grep NVRM /var/log/...` output cut to the message): keep it,
            # without a position.
            if text and ("NVRM" in text or "nvswitch" in text) and text[0] not in " \t":
                rec = KmsgRecord(message=text, source="raw")
            else:
                continue
        yield rec


def scan(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int] = None,
    since_usec: Optional[int] = None,
) -> List[XidEvent]:
    """Xid events in ``lines`` (as read from /dev/kmsg, ``dmesg`` or ``journalctl -k``), oldest first.

    With ``since_seq`` only /dev/kmsg records with a larger sequence number are returned; with
    ``since_usec`` only records with a larger boot-relative time (kmsg or plain ``dmesg``). When a
    filter is given, records that do not carry that position (``dmesg -T``, journal lines) are
    skipped rather than re-reported - filter those with ``journalctl --since`` instead. Sequence
    numbers and boot time restart at reboot: store the boot id (/proc/sys/kernel/random/boot_id)
    with the position and pass no filter when it changed. Each event carries its ``seq``/``usec``
    so the caller can remember the last one.
    """
    out: List[XidEvent] = []
    for rec in _records(lines):
        if not _after(rec, since_seq, since_usec):
            continue
        ev = parse_xid(rec.message)
        if ev is not None:
            out.append(replace(ev, seq=rec.seq, usec=rec.usec, wallclock=rec.wallclock))
    return out


def scan_sxid(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int] = None,
    since_usec: Optional[int] = None,
) -> List[SxidEvent]:
    """Like :func:`scan`, for NVSwitch SXid events."""
    out: List[SxidEvent] = []
    for rec in _records(lines):
        if not _after(rec, since_seq, since_usec):
            continue
        ev = parse_sxid(rec.message)
        if ev is not None:
            out.append(replace(ev, seq=rec.seq, usec=rec.usec, wallclock=rec.wallclock))
    return out


# --------------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------------


def _read_packaged_text() -> str:
    try:
        from importlib import resources

        files = getattr(resources, "files", None)
        if files is not None:
            return (files("slurm_hooks") / "data" / _DATA_FILE).read_text(encoding="utf-8")
    except (ImportError, FileNotFoundError, ModuleNotFoundError, TypeError, AttributeError):
        pass
    return (Path(__file__).resolve().parent / "data" / _DATA_FILE).read_text(encoding="utf-8")


class XidCatalog:
    """The packaged Xid catalog (or one loaded from ``path``/``data``)."""

    def __init__(self, data: Optional[Mapping[str, Any]] = None, path: Optional[Union[str, Path]] = None):
        if data is None:
            text = Path(path).read_text(encoding="utf-8") if path is not None else _read_packaged_text()
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
        raise ValueError("xid overrides must be a mapping of Xid -> settings, got %s" % type(overrides).__name__)
    out: Dict[int, Dict[str, str]] = {}
    for key, spec in overrides.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ValueError("xid override key %r is not an Xid number" % (key,))
        skey = str(key).strip()
        if not skey.isdigit() or not 0 < int(skey) < 100000:
            raise ValueError("xid override key %r is not an Xid number" % (key,))
        xid = int(skey)
        if not isinstance(spec, Mapping):
            raise ValueError("xid override for Xid %d must be a mapping, got %s" % (xid, type(spec).__name__))
        if not spec:
            raise ValueError("xid override for Xid %d is empty" % xid)
        clean: Dict[str, str] = {}
        for k, v in spec.items():
            if k not in _OVERRIDE_KEYS:
                raise ValueError(
                    "xid override for Xid %d: unknown key %r (allowed: %s)" % (xid, k, ", ".join(_OVERRIDE_KEYS))
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
        if clean.get("status") in ("OK", "WARN", "UNKNOWN") and clean.get("action", "none") != "none":
            raise ValueError(
                "xid override for Xid %d: key 'action' %r contradicts status %r"
                % (xid, clean["action"], clean["status"])
            )
        out[xid] = clean
    return out


def _c(status: str, action: str, blame: str, reason: str, xid: Optional[int], bucket: Optional[str]) -> Classification:
    return Classification(status=status, action=action, blame=blame, reason=reason, xid=xid, bucket=bucket)


# Xid 74 register bits the catalog says can be ignored / are threshold notices (register index -> bits).
_NVLINK_BENIGN_BITS = {0: {0, 23, 30}, 4: {20, 23, 26, 29}}
_HEX_TUPLE_RE = re.compile(r"\(\s*(0x[0-9a-fA-F]{1,16}(?:\s*,?\s*0x[0-9a-fA-F]{1,16}){1,8})\s*\)")
_NVL5_SEV_RE = re.compile(r"\b(Nonfatal|Non-fatal|Fatal)\b", re.I)
_XID154_RE = re.compile(r"\bto 0x[0-9a-fA-F]{1,8} \(([^()]{1,40})\)")
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


def _default_classification(event: XidEvent, entry: Optional[XidEntry], related: Optional[set]) -> Classification:
    x = event.xid
    if entry is None:
        return _c("UNKNOWN", "none", "check", "Xid %d is not in the packaged catalog; recorded only" % x, x, None)
    b = entry.immediate
    app = "typically caused by the application" if entry.job_caused else "job affected, node healthy"
    if b == "RESET_GPU":
        return _c("FAIL", "reset-gpu", "node", "catalog RESET_GPU: %s" % entry.description, x, b)
    if b == "RESTART_BM":
        return _c("FAIL", "reboot", "node", "catalog RESTART_BM: %s" % entry.description, x, b)
    if b == "RESTART_VM":
        # A Slurm node that is itself a VM is the VM that owns the GPU.
        return _c(
            "FAIL", "reboot", "node", "catalog RESTART_VM (restart the VM owning the GPU): %s" % entry.description, x, b
        )
    if b == "CONTACT_SUPPORT":
        # Unexpected on current GPUs; nothing says the part is bad, so keep jobs off and let a human look.
        return _c(
            "FAIL", "drain", "node", "catalog CONTACT_SUPPORT (unexpected Xid, escalate): %s" % entry.description, x, b
        )
    if b == "CHECK_MECHANICALS":
        return _c(
            "FAIL",
            "drain",
            "node",
            "catalog CHECK_MECHANICALS (check seating/power connections): %s" % entry.description,
            x,
            b,
        )
    if b == "UPDATE_SWFW":
        return _c(
            "FAIL", "drain", "node", "catalog UPDATE_SWFW (driver/firmware update needed): %s" % entry.description, x, b
        )
    if b == "CHECK_UVM":
        # nvidia-uvm is in use on any node that runs CUDA jobs, so the catalog's UVM branch applies.
        return _c(
            "FAIL",
            "reset-gpu",
            "node",
            "catalog CHECK_UVM (UVM in use on CUDA nodes -> reset GPU): %s" % entry.description,
            x,
            b,
        )
    if b == "RESTART_APP":
        return _c("WARN", "none", "job", "catalog RESTART_APP: %s (%s)" % (entry.description, app), x, b)
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
    if b == "WORKFLOW_XID_45":
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
    if b == "WORKFLOW_XID_48":
        if related and related & {63, 64}:
            return _c(
                "FAIL", "reset-gpu", "node", "Xid 48 (uncorrectable ECC) with Xid 63/64: drain and reset the GPU", x, b
            )
        return _c(
            "FAIL", "reset-gpu", "node", "Xid 48 (uncorrectable ECC): reset the GPU; run field diag if it recurs", x, b
        )
    if b == "WORKFLOW_NVLINK_ERR":
        regs = _nvlink_registers(event.text)
        if regs and any(regs):
            benign = all(
                (v & ~sum(1 << bit for bit in _NVLINK_BENIGN_BITS.get(i, ()))) == 0 for i, v in enumerate(regs)
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
            "Xid 74 NVLink error: GPU reset (or reboot) needed to clear; check the link and its peer if it recurs",
            x,
            b,
        )
    if b == "WORKFLOW_NVLINK5_ERR":
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
            return _c("FAIL", "reset-gpu", "node", "Xid %d NVLink5 error marked Fatal: reset the GPU" % x, x, b)
        return _c(
            "WARN",
            "none",
            "node",
            "Xid %d NVLink5 error marked Nonfatal: no reset; follow Xid 154 if one is logged" % x,
            x,
            b,
        )
    if b == "XID_154":
        am = _XID154_RE.search(event.text)
        if am:
            key = " ".join(am.group(1).lower().split())
            if key in _XID154_ACTIONS:
                st, ac, bl = _XID154_ACTIONS[key]
                return _c(st, ac, bl, "Xid 154: driver says recovery action is now %r" % am.group(1), x, b)
        return _c(
            "WARN", "none", "node", "Xid 154 without a recognised recovery action; follow the accompanying Xid", x, b
        )
    # UNKNOWN: the catalog lists the Xid but gives no bucket.
    return _c(
        "UNKNOWN",
        "none",
        "check",
        "catalog gives no resolution bucket for Xid %d (%s); recorded only" % (x, entry.description),
        x,
        b,
    )


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
    no bucket / not in catalog  UNKNOWN / none / check (recorded, never drains)
    ================== ============================================================

    ``related`` are the other Xid numbers seen in the same window on the same GPU (used by the
    45 and 48 workflows; see :func:`classify_all`). ``overrides`` (see :func:`validate_overrides`)
    replace fields of the result; when an override sets ``status`` without ``action``, the action
    becomes "none" for OK/WARN/UNKNOWN and "drain" for a FAIL that had none.
    """
    cat = catalog or load_catalog()
    ov = validate_overrides(overrides)
    entry = cat.lookup(event.xid)
    result = _default_classification(event, entry, _related_set(related, event.xid))
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
    reason = spec.get("reason") or "operator override (was %s/%s): %s" % (result.status, result.action, result.reason)
    return Classification(
        status=status, action=action, blame=blame, reason=reason, xid=event.xid, bucket=result.bucket, overridden=True
    )


def classify_all(
    events: Iterable[XidEvent],
    overrides: Optional[Mapping[Any, Any]] = None,
    catalog: Optional[XidCatalog] = None,
) -> List[Classification]:
    """Classify a window of events, passing each one the other Xids seen on the same GPU."""
    evs = list(events)
    by_gpu: Dict[Optional[str], set] = {}
    for e in evs:
        by_gpu.setdefault(e.pci, set()).add(e.xid)
    validate_overrides(overrides)
    return [classify(e, overrides, related=by_gpu.get(e.pci, set()), catalog=catalog) for e in evs]


def classify_sxid(event: SxidEvent, overrides: Optional[Mapping[Any, Any]] = None) -> Classification:
    """Classify an NVSwitch SXid by the severity printed in the line.

    Fatal -> FAIL / reboot / node: recovering from a fatal switch error needs the fabric's GPUs and
    NVSwitches reset and Fabric Manager restarted, which a reboot does in one step. Non-fatal ->
    WARN / none / node. No severity printed -> UNKNOWN / none / check. ``overrides`` use the same
    shape as for Xids, keyed by SXid number.
    """
    ov = validate_overrides(overrides)
    if event.severity == "Fatal":
        base = Classification(
            "FAIL", "reboot", "node", "NVSwitch SXid %d Fatal: %s" % (event.sxid, event.text), None, "SXID_FATAL"
        )
    elif event.severity == "Non-fatal":
        base = Classification(
            "WARN", "none", "node", "NVSwitch SXid %d Non-fatal: %s" % (event.sxid, event.text), None, "SXID_NONFATAL"
        )
    else:
        base = Classification(
            "UNKNOWN", "none", "check", "NVSwitch SXid %d without severity: %s" % (event.sxid, event.text), None, None
        )
    spec = ov.get(event.sxid)
    if not spec:
        return base
    status = spec.get("status", base.status)
    action = spec.get("action", base.action if status == "FAIL" else "none")
    if status in ("OK", "WARN", "UNKNOWN") and action != "none":
        raise ValueError("sxid override for SXid %d: action %r contradicts status %r" % (event.sxid, action, status))
    blame = spec.get("blame", "check" if status == "UNKNOWN" else base.blame)
    return Classification(
        status, action, blame, spec.get("reason") or "operator override: " + base.reason, None, base.bucket, True
    )


# --------------------------------------------------------------------------------------------
# Explain
# --------------------------------------------------------------------------------------------


def explain(
    xid: Union[int, str], overrides: Optional[Mapping[Any, Any]] = None, catalog: Optional[XidCatalog] = None
) -> str:
    """Human-readable text for ``slurm-hooks explain xid N``."""
    cat = catalog or load_catalog()
    try:
        n = int(str(xid).strip())
    except ValueError:
        return "%r is not an Xid number" % (xid,)
    entry = cat.lookup(n)
    cls = classify(XidEvent(xid=n, pci=None, pid=None, process=None, text=""), overrides, catalog=cat)
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
        lines.append("  Applies to:           %s" % (", ".join(entry.applies_to) or "none of A100/H100/B100/GB200"))
        lines.append("  Component:            %s" % entry.component)
        lines.append("  NVIDIA immediate:     %s - %s" % (entry.immediate, cat.buckets.get(entry.immediate, "")))
        lines.append(
            "  NVIDIA investigatory: %s - %s"
            % (entry.investigatory, cat.investigatory_buckets.get(entry.investigatory, ""))
        )
        if entry.xid154_linkage:
            lines.append("  Xid 154 linkage:      %s" % entry.xid154_linkage)
        lines.append(
            "  Caused by the job:    %s"
            % (
                ("typically yes - " + (entry.job_caused_basis or ""))
                if entry.job_caused
                else "not typically" + (" - " + entry.job_caused_basis if entry.job_caused_basis else "")
            )
        )
        if entry.notes:
            lines.append("  Notes:                %s" % entry.notes)
    verdict = {
        "job": "job-broken (node stays in service)",
        "node": "node-broken" if cls.status != "OK" else "nothing broken",
        "check": "undecided (recorded only, no drain)",
    }[cls.blame]
    lines.append("slurm-hooks classification (message-independent default):")
    lines.append(
        "  Status: %s   Action: %s   Blame: %s - %s%s"
        % (cls.status, cls.action, cls.blame, verdict, "   [operator override]" if cls.overridden else "")
    )
    lines.append("  Reason: %s" % cls.reason)
    if entry is not None and entry.immediate.startswith(("WORKFLOW_", "XID_154")):
        lines.append("  (this Xid's decision also depends on the message text / accompanying Xids)")
    lines.append("Source: %s" % cat.source_line)
    lines.append("Catalog version: %s" % cat.version)
    return "\n".join(lines)
