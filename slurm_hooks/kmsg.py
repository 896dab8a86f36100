"""Kernel log records and the NVIDIA Xid / NVSwitch SXid lines in them: pure parsers, no I/O.

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
job (``Host.read_kmsg``). Every parser returns ``None`` for anything it does not recognise and
never raises. What the codes mean is slurm_hooks.xid's job (catalog, classification, explain).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from .structs import Struct, field, replace

__all__ = [
    "MAX_LINE",
    "KmsgRecord",
    "KmsgView",
    "view",
    "XidEvent",
    "SxidEvent",
    "parse_kmsg_record",
    "parse_xid",
    "parse_sxid",
    "normalize_pci",
    "scan",
    "scan_sxid",
]


#: Lines longer than this are not kernel log records (printk caps a record at ~1 KiB); ignore them.
MAX_LINE = 8192


class KmsgRecord(Struct):
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


class XidEvent(Struct):
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


class SxidEvent(Struct):
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


class KmsgView(Struct):
    """What a hook needs from one read of /dev/kmsg: the newest record's sequence number (where the
    job's window starts or ends) and the first line of every record mentioning Xid or SXid.

    A live /dev/kmsg returns one record per read(2) (~1.6 us each; a full 1 MiB ring holds ~10,000
    records), so the Xid checks read it once and the counter snapshot reuses this view.
    """

    last_seq: Optional[int]
    xid_lines: Tuple[str, ...]


def view(records: Sequence[str]) -> KmsgView:
    """KmsgView of raw /dev/kmsg records, oldest first (Host.read_kmsg); a record's message is its first line."""
    last_seq = None
    for record in reversed(records):
        parsed = parse_kmsg_record(record.split("\n", 1)[0])
        if parsed is not None and parsed.seq is not None:
            last_seq = parsed.seq
            break
    return KmsgView(last_seq, tuple(r.split("\n", 1)[0] for r in records if "Xid" in r))


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
