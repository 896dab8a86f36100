"""Kernel log records and the NVIDIA Xid / NVSwitch SXid reports in them: pure parsers, no I/O.

Where the lines come from
-------------------------
The NVIDIA kernel driver (``NVRM``) reports GPU faults as *Xid* messages, and the NVSwitch
driver (``nvidia-nvswitchN``) reports switch faults as *SXid* messages, through ``printk``.
They can be read from:

* ``/dev/kmsg`` - one record per ``read()``: ``"<prio>,<seq>,<usec>,<flags>[,...];<message>"``
  followed by optional continuation lines that start with a space (``" SUBSYSTEM=pci"``).
  ``prio`` is the syslog priority, facility * 8 + level; ``seq`` is a per-boot sequence number and
  ``usec`` the time since boot, which is what :func:`scan` uses to report only records after a
  remembered position.
* ``dmesg`` - ``"[12345.678901] NVRM: ..."``; ``dmesg -T`` - ``"[Wed Dec  2 10:00:00 2026] NVRM: ..."``;
  ``dmesg -r`` - ``"<4>[12345.678901] NVRM: ..."``; ``dmesg -x`` - ``"kern  :warn  : [12345.678901] NVRM: ..."``
  (also with ``--time-format iso``: ``"kern  :err   : 2025-01-25T10:34:54,859532+00:00 ..."``).
* ``journalctl -k`` (and syslog files) - ``"Dec 02 10:00:00 host kernel: NVRM: ..."``
  (also ISO timestamps, ``-o short-iso``; without the host word, ``--no-hostname``; the month in
  LC_TIME's language, ``"kwi 15 07:56:59 ..."``); a paste starting at ``"kernel: NVRM: ..."``.
* a CONFIG_PRINTK_CALLER kernel adds its caller id after the time: ``"[  130.456250] [ T1946] NVRM: ..."``.

Who wrote a line
----------------
The kernel log is written by users too. The kernel's own segfault report (arch/x86/mm/fault.c,
show_signal_msg: ``"%s[%d]: segfault at %lx ip %px sp %px error %lx"`` then ``" in %s[...]"`` with
the base name of the crashing binary) carries a file name any user chooses, and the task name at
its start is the user's too; whoever may write /dev/kmsg adds records of their own. So an Xid or
SXid is accepted only where the driver writes it (:func:`from_driver`):

* the record's *message* starts with the driver's prefix - ``NVRM: Xid (PCI:<bus id>): <code>`` or
  ``nvidia-nvswitchN: SXid (PCI:<bus id>): <code>`` - with a well-formed bus id, not anywhere in
  the line (the segfault line starts with the task name, which is at most 15 characters: too short
  to hold a whole prefix and bus id, and the kernel's own text follows it);
* where the record carries its syslog facility (/dev/kmsg, ``dmesg -r``, ``dmesg -x``), it is the
  kernel's (0). A write to /dev/kmsg from user space - root's too, with or without a ``<N>``
  prefix - never gets facility 0: kernel/printk devkmsg_write() starts from LOG_USER and only
  takes a non-zero facility from the prefix, so kernel-generated records can be told apart.

Text without the facility (``dmesg``, ``dmesg -T``, ``journalctl -k``, a pasted message) is judged
by the prefix alone. ``journalctl -k`` labels only kernel-facility records ``kernel:``; a syslog
file such as /var/log/messages does not protect that label (``logger -t kernel`` writes it), so
feed ``slurm-hooks xid`` the output of ``journalctl -k`` or ``dmesg -x``, not a syslog file. The
hooks themselves read /dev/kmsg only.

NVSwitch reports
----------------
The NVSwitch driver writes one fault as several lines with the same prefix (open-gpu-kernel-modules,
src/common/nvswitch/kernel/error_nvswitch.c): the event (``..., Fatal|Non-fatal, Link 44 <what>``),
then ``Severity N Engine instance NN Sub-engine instance NN`` (N: 0 non-fatal, 1 fatal -
NVSWITCH_ERROR_SEVERITY_*), then one or more ``Data {0x..., ...}`` lines; reports of several
switches interleave. :func:`scan_sxid` folds a report's lines into one :class:`SxidEvent`.

The parsers here are pure (``str -> value``) and total: any text gives a value or None. They do
not catch their own exceptions - a bug in them must show in the tests. Reading the
device/file/command is the caller's job (``Host.read_kmsg``); what the codes mean is
slurm_hooks.xid.catalog's job (catalog, classification, explain).
"""

from __future__ import annotations

import re

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

    _XidFields = Tuple[int, str, Optional[int], Optional[str], str, Optional[int], Optional[int]]

__all__ = [
    "MAX_LINE",
    "KmsgRecord",
    "KmsgView",
    "view",
    "XidEvent",
    "SxidEvent",
    "SxidLine",
    "parse_kmsg_record",
    "from_driver",
    "parse_xid",
    "parse_sxid",
    "parse_sxid_line",
    "normalize_pci",
    "scan",
    "scan_sxid",
    "scan_all",
    "gc_paused",
]


#: Lines longer than this are not kernel log records (printk caps a record at ~1 KiB); ignore them.
MAX_LINE = 8192

#: syslog facility of the kernel; user-space writes to /dev/kmsg get 1 (LOG_USER).
KERNEL_FACILITY = 0

# util-linux dmesg -x names (facility_names[], level_names[] in sys-utils/dmesg.c).
_FACILITIES = {
    name: number
    for number, name in enumerate(
        (
            "kern",
            "user",
            "mail",
            "daemon",
            "auth",
            "syslog",
            "lpr",
            "news",
            "uucp",
            "cron",
            "authpriv",
            "ftp",
            "res0",
            "res1",
            "res2",
            "res3",
            "local0",
            "local1",
            "local2",
            "local3",
            "local4",
            "local5",
            "local6",
            "local7",
        )
    )
}
_LEVELS = {
    name: number
    for number, name in enumerate(
        ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")
    )
}


class KmsgRecord(Struct):
    """One kernel log record, from /dev/kmsg, ``dmesg`` (plain, -T, -r, -x) or ``journalctl -k``.

    ``seq`` is only known for /dev/kmsg records; ``usec`` (microseconds since boot) for /dev/kmsg
    and ``dmesg`` with its default timestamps; ``wallclock`` is the timestamp text as printed by
    ``dmesg -T``/``--time-format iso``/journalctl. ``facility`` is known for /dev/kmsg, ``dmesg -r``
    and ``dmesg -x`` (0 = kernel), None where the format drops it.
    """

    message: str
    source: str  # "kmsg" | "dmesg" | "dmesg-r" | "dmesg-x" | "dmesg-T" | "journal" | "text" | "raw"
    priority: Optional[int] = (
        None  # syslog priority incl. facility (kmsg, dmesg -r); level = priority & 7
    )
    seq: Optional[int] = None
    usec: Optional[int] = None
    wallclock: Optional[str] = None
    host: Optional[str] = None
    continuation: bool = False  # kmsg flag "c": a fragment continued in the next record
    facility: Optional[int] = None

    @property
    def level(self) -> Optional[int]:
        return None if self.priority is None else self.priority & 7


class XidEvent(Struct):
    """One ``NVRM: Xid`` message. ``pci`` is a full bus id (``0000:3b:00.0``) or None if absent.

    On a MIG GPU the driver attributes an Xid to a partition inside the parentheses
    (``(PCI:0000:01:00 GPU-I:05)``, ``(PCI:0000:01:00 GPU-I:01 GPU-CI:02)``): ``gpu_instance`` and
    ``compute_instance`` are those ids (None when not printed); ``pci`` is still the physical GPU's.
    """

    xid: int
    pci: Optional[str]
    pid: Optional[int]
    process: Optional[str]
    text: str  # the message after "<xid>, [pid=..., name=..., ]"
    raw: str = field(default="", repr=False, compare=False)
    seq: Optional[int] = None
    usec: Optional[int] = None
    wallclock: Optional[str] = None
    gpu_instance: Optional[int] = None  # MIG GPU instance id (GI), "GPU-I:NN"
    compute_instance: Optional[int] = None  # MIG compute instance id (CI), "GPU-CI:NN"

    @property
    def mig(self) -> Optional[str]:
        """``GI 5`` / ``GI 1 CI 2`` for a partition-attributed Xid, None otherwise."""
        if self.gpu_instance is None:
            return None
        if self.compute_instance is None:
            return "GI %d" % self.gpu_instance
        return "GI %d CI %d" % (self.gpu_instance, self.compute_instance)


class SxidEvent(Struct):
    """One NVSwitch SXid report (its event line, ``Severity`` line and ``Data`` lines folded together).

    ``severity`` is "Fatal", "Non-fatal" or None (neither the event line nor a Severity line said);
    ``severity_level`` the N of ``Severity N`` (0 non-fatal, 1 fatal), ``instance`` its engine
    instance, ``data`` the words of the Data lines. ``seq``/``usec``/``wallclock`` are those of the
    report's first line seen (the event line, or the Severity line when the event line is gone).
    """

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
    severity_level: Optional[int] = None
    instance: Optional[int] = None
    data: Tuple[int, ...] = ()
    lines: int = 1  # kernel log lines folded into this report

    @property
    def fatal(self) -> Optional[bool]:
        return None if self.severity is None else self.severity == "Fatal"


class SxidLine(Struct):
    """One line of an NVSwitch report: ``kind`` is "event", "severity" or "data"."""

    kind: str
    sxid: int
    switch: Optional[int]
    pci: str
    text: str  # what follows "<code>, "
    severity: Optional[str] = None  # event lines: Fatal / Non-fatal as printed
    severity_level: Optional[int] = None  # severity lines
    instance: Optional[int] = None  # severity lines
    link: Optional[int] = None  # event lines
    data: Tuple[int, ...] = ()  # data lines


# --------------------------------------------------------------------------------------------
# Record parsing
# --------------------------------------------------------------------------------------------

# /dev/kmsg: "6,1234,5678901,-;message" (some tools show the priority as "<6>").
_KMSG_RE = lazy_compile(r"^<?(\d{1,4})>?,(\d{1,20}),(\d{1,20}),([^,;]*)(?:,[^;]*)?;(.*)$", re.S)
# dmesg: "[12345.678901] message" (also "[    1.000000]").
_DMESG_RE = lazy_compile(r"^\[\s*(\d{1,12})\.(\d{1,9})\]\s?(.*)$", re.S)
# dmesg -T: "[Wed Dec  2 10:00:00 2026] message" (strftime "%a %b %e %H:%M:%S %Y": the day and month
# names are LC_TIME's, "[mer. déc.  2 ...]" in French, so any two words are accepted).
_DMESG_T_RE = lazy_compile(
    r"^\[(\S{1,16} \S{1,16} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]\s?(.*)$",
    re.S,
)
# dmesg --time-format iso: "2025-01-25T10:34:54,859532+00:00 message"
_DMESG_ISO_RE = lazy_compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?) (.*)$", re.S
)
# dmesg -r: "<4>[12345.678901] message" (raw syslog priority in front)
_DMESG_RAW_RE = lazy_compile(r"^<(\d{1,4})>(.*)$", re.S)
# dmesg -x: "kern  :warn  : [12345.678901] message"
_DMESG_X_RE = lazy_compile(r"^([a-z][a-z0-9]{2,7}) {0,8}:([a-z]{3,6}) {0,8}: (.*)$", re.S)
# The caller id a CONFIG_PRINTK_CALLER kernel prints after the time (kernel/printk/printk.c
# print_caller(): "[%6s]" of "T<pid>" or "C<cpu>"): "[  130.456250] [ T1946] NVRM: Xid ...".
_CALLER_RE = lazy_compile(r"^\[ {0,9}[TC]\d{1,10}\] ?(.*)$", re.S)
# journalctl -k / syslog: "Dec 02 10:00:00 host kernel: message", "2026-12-02T10:00:00+0000 host kernel: ...";
# --no-hostname drops the host word. The month is LC_TIME's abbreviation ("kwi 15", "Okt 06",
# "12月 02"): any word, so no month table decides whether a line is read.
_JOURNAL_RE = lazy_compile(
    r"^(\S{1,24} {1,2}\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
    r"(?: (\S{1,255}))? kernel: ?(.*)$",
    re.S,
)
# "host kernel: " after a monotonic timestamp (journalctl -o short-monotonic), "kernel: " with --no-hostname.
_HOST_KERNEL_RE = lazy_compile(r"^(?:(\S{1,255}) )?kernel: ?(.*)$", re.S)
# A pasted line with the date and host trimmed: "kernel: NVRM: Xid ...".
_BARE_KERNEL_RE = lazy_compile(r"^kernel: ?(.*)$", re.S)


def _clean(line: Any) -> Optional[str]:
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", "replace")
    if not isinstance(line, str):
        return None
    if len(line) > MAX_LINE:
        return None
    return line.rstrip("\r\n")


def _usec(secs: str, frac: str) -> int:
    return int(secs) * 1_000_000 + int((frac + "000000")[:6])


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
    return KmsgView(
        last_seq, tuple((r.split("\n", 1)[0] if "\n" in r else r) for r in records if "Xid" in r)
    )


def parse_kmsg_record(line: Union[str, bytes]) -> Optional[KmsgRecord]:
    """Parse one kernel log line in any of the supported formats; None if unrecognised.

    Formats: /dev/kmsg records, ``dmesg`` (plain, ``-T``, ``-r``, ``-x``, ``--time-format iso``)
    and ``journalctl -k`` (short, short-iso, short-precise, short-monotonic). /dev/kmsg
    continuation lines (starting with a space: the ``KEY=value`` dictionary) are metadata and
    return None, as do empty, oversized or unrecognised lines, and values that are not text.
    """
    text = _clean(line)
    if not text or text[0] in " \t":
        return None
    m = _KMSG_RE.match(text)
    if m:
        prio, seq, usec, flags, msg = m.groups()
        priority = int(prio)
        return KmsgRecord(
            message=msg,
            source="kmsg",
            priority=priority,
            seq=int(seq),
            usec=int(usec),
            continuation="c" in flags,
            facility=priority >> 3,
        )
    m = _DMESG_RAW_RE.match(text)
    if m:
        priority = int(m.group(1))
        inner = _dmesg_body(m.group(2), "dmesg-r")
        return KmsgRecord(
            message=inner.message,
            source="dmesg-r",
            priority=priority,
            usec=inner.usec,
            wallclock=inner.wallclock,
            facility=priority >> 3,
        )
    m = _DMESG_X_RE.match(text)
    if m and m.group(1) in _FACILITIES and m.group(2) in _LEVELS:
        facility, level = _FACILITIES[m.group(1)], _LEVELS[m.group(2)]
        inner = _dmesg_body(m.group(3), "dmesg-x")
        return KmsgRecord(
            message=inner.message,
            source="dmesg-x",
            priority=facility * 8 + level,
            usec=inner.usec,
            wallclock=inner.wallclock,
            facility=facility,
        )
    m = _DMESG_RE.match(text)
    if m:
        secs, frac, msg = m.groups()
        msg = _without_caller(msg)
        host = None
        hk = _HOST_KERNEL_RE.match(msg)  # journalctl -o short-monotonic
        if hk and not (hk.group(1) or "").endswith(":"):
            host, msg = hk.groups()
        return KmsgRecord(message=msg, source="dmesg", usec=_usec(secs, frac), host=host)
    m = _DMESG_T_RE.match(text)
    if m:
        return KmsgRecord(
            message=_without_caller(m.group(2)), source="dmesg-T", wallclock=m.group(1)
        )
    m = _JOURNAL_RE.match(text)
    if m:
        ts, host, msg = m.groups()
        usec, msg = _kernel_body(msg)
        return KmsgRecord(message=msg, source="journal", wallclock=ts, host=host, usec=usec)
    m = _BARE_KERNEL_RE.match(text) or _CALLER_RE.match(text)
    if m:  # "kernel: ..." pasted without date and host; "[ T1946] ..." from dmesg -t
        usec, msg = _kernel_body(text)
        return KmsgRecord(message=msg, source="text", usec=usec)
    return None


def _without_caller(message: str) -> str:
    """The message without the "[ T1946] " caller id of a CONFIG_PRINTK_CALLER kernel (once, at its start)."""
    if message[:1] != "[":
        return message
    m = _CALLER_RE.match(message)
    return m.group(1) if m else message


def _kernel_body(text: str) -> Tuple[Optional[int], str]:
    """(usec, message) of what follows a syslog "kernel:" label, or of a pasted line starting with it.

    Each wrapping is taken off at most once and only at its place: the "kernel:" label, then the
    dmesg time syslog daemons keep ("[82659.755847] "), then the caller id ("[ T1946] "). What
    remains must then start with the driver's own prefix, so a user's text at the start of a
    message (a task name, at most 15 characters) still cannot make an Xid.
    """
    m = _BARE_KERNEL_RE.match(text)
    if m:
        text = m.group(1)
    usec = None
    d = _DMESG_RE.match(text)
    if d:
        usec = _usec(d.group(1), d.group(2))
        text = d.group(3)
    return usec, _without_caller(text)


def _dmesg_body(body: str, source: str) -> KmsgRecord:
    """The part of a ``dmesg -r``/``-x`` line after its priority: a timestamp in any dmesg form, or none."""
    m = _DMESG_RE.match(body)
    if m:
        return KmsgRecord(
            message=_without_caller(m.group(3)),
            source=source,
            usec=_usec(m.group(1), m.group(2)),
        )
    m = _DMESG_T_RE.match(body) or _DMESG_ISO_RE.match(body)
    if m:
        return KmsgRecord(message=_without_caller(m.group(2)), source=source, wallclock=m.group(1))
    return KmsgRecord(message=_without_caller(body), source=source)  # dmesg -t: no timestamp


def from_driver(record: KmsgRecord) -> bool:
    """Whether the record may come from a kernel driver: kernel facility where the format keeps it.

    The message prefix is checked by the Xid/SXid patterns themselves (anchored at its start).
    """
    return record.facility is None or record.facility == KERNEL_FACILITY


_PCI_RE = lazy_compile(
    r"^(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$"
)


def normalize_pci(addr: Any) -> Optional[str]:
    """``PCI:0000:3B:00`` / ``0000:3b:00`` / ``00000000:3B:00.0`` / ``3b:00`` -> ``0000:3b:00.0``; None if not an address.

    Domains keep every digit they have: VMD (``10000:01:00.0``) and Hyper-V guests use domains
    wider than 16 bits; only NVML's zero padding to 8 digits is dropped, as the kernel prints
    ``%04x`` (at least 4 digits).
    """
    if not isinstance(addr, str):
        return None
    m = _PCI_RE.match(addr.strip())
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    dev_i = int(dev, 16)
    if dev_i > 0x1F:
        return None
    return "%04x:%02x:%02x.%d" % (int(dom, 16) if dom else 0, int(bus, 16), dev_i, int(fn or 0))


# The driver prints the bus id as "%04x:%02x:%02x" (domain, bus, device; no function for Xids).
_ADDR = r"(?:PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# One pattern for the whole line (one regex call per line matters at 100,000 lines):
# prefix, bus id, the MIG instance ids, code, then the optional "pid=N, " and "name=X, " fields,
# then the text. The MIG attribution is the driver's (open-gpu-kernel-modules,
# src/nvidia/src/kernel/gpu/rc/kernel_rc.c): "(PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u)" or
# "(PCI:%04x:%02x:%02x GPU-I:%02u)".
_XID_RE = lazy_compile(
    r"NVRM: Xid \((" + _ADDR + r")(?: GPU-I:(\d{1,5})(?: GPU-CI:(\d{1,5}))?)?\): ?(\d{1,5})"
    r"(?:,\s*|\s+|$)"
    r"(?:pid=\s*'?([^,\s']{0,32})'?(?:,\s*|\s+|$))?"
    r"(?:name=(.*?)(?:,\s+|,$|$))?(.*)$",
    re.S,
)


# A /dev/kmsg record holding an Xid message, in one match (the hooks' hot path): priority, seq, usec,
# then the message and the same groups as _XID_RE.
_KMSG_XID_RE = lazy_compile(
    r"<?(\d{1,4})>?,(\d{1,20}),(\d{1,20}),[^;]*;(" + _XID_RE.pattern + ")", re.S
)


def _xid_fields(message: str) -> Optional[_XidFields]:
    """(xid, pci, pid, process, text, gi, ci) when the message *starts with* the driver's Xid prefix."""
    m = _XID_RE.match(message)
    return _xid_groups(*m.groups()) if m else None


def _xid_groups(
    addr: str,
    gi: Optional[str],
    ci: Optional[str],
    num: str,
    pid_text: Optional[str],
    name: Optional[str],
    rest: str,
) -> Optional[_XidFields]:
    pci = _PCI_CACHE.get(addr)
    if pci is None:
        pci = normalize_pci(addr)
        if pci is None:
            return None
        if (
            len(_PCI_CACHE) < 4096
        ):  # a node has a few dozen bus ids; bound it against hostile input anyway
            _PCI_CACHE[addr] = pci
    pid = int(pid_text) if pid_text and pid_text.isdigit() and int(pid_text) > 0 else None
    process = None
    if name:
        name = name.strip().strip("'\"")
        if name and not (name.startswith("<") and name.endswith(">")):
            process = name
    return (
        int(num),
        pci,
        pid,
        process,
        rest.strip(),
        int(gi) if gi is not None else None,
        int(ci) if ci is not None else None,
    )


_PCI_CACHE: Dict[str, str] = {}


class gc_paused:  # noqa: N801 - used like a function: `with gc_paused():`
    """The cyclic garbage collector off for a block that builds many acyclic objects, then back as it was.

    Scanning a kernel log of 100,000 Xid lines creates ~100,000 events; each 700 allocations start a
    young-generation collection and the older ones grow with them, ~30% of the scan's time
    (bench/xid_scale.py). Events hold no reference cycles, so the collector has nothing to free there.
    """

    def __enter__(self) -> None:
        import gc

        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.was_enabled:
            import gc

            gc.enable()


def _new(cls: Any, *values: Any) -> Any:
    """A Struct built from all its field values in order, without Struct.__init__'s argument checks.

    The scanners build one event per log line: on a kernel log of 100,000 Xid lines
    (bench/xid_scale.py) the generic __init__ (~7 us per event) was the largest single cost; this
    is ~1.5 us. Values must be given for every field, in the class's field order.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(zip(cls._fields, values))
    return obj


def _record(line: Any) -> Optional[KmsgRecord]:
    """A log record, or - for text that is none of the formats - the line as a bare message."""
    rec = parse_kmsg_record(line)
    if rec is not None:
        return rec
    text = _clean(line)
    if text and text[0] not in " \t":
        return KmsgRecord(message=text, source="raw")
    return None


def parse_xid(line: Union[str, bytes]) -> Optional[XidEvent]:
    """The Xid event of one kernel log line (any supported format, or a bare message); None otherwise.

    Handles the variants printed by several driver generations::

        NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
        NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.
        NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ...
        NVRM: Xid (0000:3b:00): 31, pid=..., ...          (older drivers: no "PCI:" prefix)
        NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x...)
        NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). ...
        NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 13, pid=..., name=..., ...  (MIG)

    Only where the driver writes it (see the module docstring): the message starts with the
    prefix, and the record's facility, where known, is the kernel's. ``pid``/``process`` are None
    when absent or printed as ``<unknown>``/``<n/a>``.
    """
    rec = _record(line)
    if rec is None or not from_driver(rec):
        return None
    fields = _xid_fields(rec.message)
    if fields is None:
        return None
    xid, pci, pid, process, text, gi, ci = fields
    return XidEvent(
        xid,
        pci,
        pid,
        process,
        text,
        raw=rec.message,
        seq=rec.seq,
        usec=rec.usec,
        wallclock=rec.wallclock,
        gpu_instance=gi,
        compute_instance=ci,
    )


# "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
_SXID_RE = lazy_compile(
    r"nvidia-nvswitch(\d{1,4}): SXid \((" + _ADDR + r")\): (\d{1,6}), ?(.*)$", re.S
)
_SEV_RE = lazy_compile(r"^(Fatal|Non-fatal|Nonfatal|Non fatal)\b,?\s*(.*)$", re.S | re.I)
_SEVERITY_LINE_RE = lazy_compile(
    r"^Severity (\d{1,3}) Engine instance (\d{1,5}) Sub-engine instance (\d{1,5})\s*$"
)
_DATA_LINE_RE = lazy_compile(r"^Data \{([^{}]{0,400})\}")
_WORD_RE = lazy_compile(r"0x([0-9a-fA-F]{1,16})")
_LINK_RE = lazy_compile(r"\bLink (\d{1,4})\b")
#: NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, NVSWITCH_ERROR_SEVERITY_FATAL = 1 (ctrl_dev_nvswitch.h)
SEVERITY_LEVELS = {0: "Non-fatal", 1: "Fatal"}


def parse_sxid_line(message: str) -> Optional[SxidLine]:
    """One NVSwitch report line (a kernel *message*, starting with ``nvidia-nvswitchN: SXid (``); None otherwise."""
    m = _SXID_RE.match(message) if isinstance(message, str) else None
    if not m:
        return None
    sw, addr, num, rest = m.groups()
    pci = _PCI_CACHE.get(addr) or normalize_pci(addr)
    if pci is None:
        return None
    if len(_PCI_CACHE) < 4096:
        _PCI_CACHE[addr] = pci
    rest = rest.strip()
    code, switch = int(num), int(sw)
    # SxidLine fields: kind, sxid, switch, pci, text, severity, severity_level, instance, link, data
    sev = _SEVERITY_LINE_RE.match(rest)
    if sev:
        return _new(
            SxidLine,
            "severity",
            code,
            switch,
            pci,
            rest,
            None,
            int(sev.group(1)),
            int(sev.group(2)),
            None,
            (),
        )
    data = _DATA_LINE_RE.match(rest)
    if data:
        words = tuple(int(w, 16) for w in _WORD_RE.findall(data.group(1)))
        return _new(SxidLine, "data", code, switch, pci, rest, None, None, None, None, words)
    severity = None
    sm = _SEV_RE.match(rest)
    if sm:
        severity = "Fatal" if sm.group(1).lower() == "fatal" else "Non-fatal"
        rest = sm.group(2).strip()
    lm = _LINK_RE.search(rest)
    return _new(
        SxidLine,
        "event",
        code,
        switch,
        pci,
        rest,
        severity,
        None,
        None,
        int(lm.group(1)) if lm else None,
        (),
    )


def parse_sxid(line: Union[str, bytes]) -> Optional[SxidEvent]:
    """The SXid event of one kernel log line: only a report's *event* line gives one (see :func:`scan_sxid`).

    ``severity`` is normalised to "Fatal"/"Non-fatal", or None when the line does not say. The
    same origin rule as :func:`parse_xid` applies.
    """
    rec = _record(line)
    if rec is None or not from_driver(rec):
        return None
    part = parse_sxid_line(rec.message)
    if part is None or part.kind != "event":
        return None
    return _Report(part, rec).event()


class _Report:
    """An SXid report being folded together from its lines."""

    __slots__ = ("head", "record", "severity", "severity_level", "instance", "data", "lines")

    def __init__(self, head: SxidLine, record: KmsgRecord):
        self.head, self.record, self.lines = head, record, 1
        self.severity, self.severity_level, self.instance = (
            head.severity,
            head.severity_level,
            head.instance,
        )
        if (
            head.kind == "severity"
        ):  # the event line is gone: the Severity line still says how bad it was
            self.severity = SEVERITY_LEVELS.get(
                head.severity_level if head.severity_level is not None else -1
            )
        self.data: List[int] = list(head.data)

    def add(self, part: SxidLine) -> None:
        self.lines += 1
        if part.kind == "severity":
            if self.severity_level is None:
                self.severity_level, self.instance = part.severity_level, part.instance
            level = SEVERITY_LEVELS.get(
                part.severity_level if part.severity_level is not None else -1
            )
            if level == "Fatal" or self.severity is None:  # a report is as severe as its worst line
                self.severity = level or self.severity
        elif part.kind == "data":
            self.data.extend(part.data)

    def event(self) -> SxidEvent:
        head, rec = self.head, self.record
        return SxidEvent(
            sxid=head.sxid,
            switch=head.switch,
            pci=head.pci,
            severity=self.severity,
            link=head.link,
            text=head.text,
            raw=rec.message,
            seq=rec.seq,
            usec=rec.usec,
            wallclock=rec.wallclock,
            severity_level=self.severity_level,
            instance=self.instance,
            data=tuple(self.data),
            lines=self.lines,
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


def scan_all(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int] = None,
    since_usec: Optional[int] = None,
    kinds: Sequence[str] = ("xid", "sxid"),
) -> Tuple[List[XidEvent], List[SxidEvent]]:
    """Xid events and SXid reports in ``lines`` (read from /dev/kmsg, ``dmesg`` or ``journalctl -k``), oldest first.

    One pass over the lines. With ``since_seq`` only /dev/kmsg records with a larger sequence
    number count; with ``since_usec`` only records with a larger boot-relative time (kmsg or plain
    ``dmesg``). When a filter is given, records that do not carry that position (``dmesg -T``,
    journal lines) are skipped rather than re-reported - filter those with ``journalctl --since``
    instead. Sequence numbers and boot time restart at reboot: store the boot id
    (/proc/sys/kernel/random/boot_id) with the position and pass no filter when it changed. Each
    event carries its ``seq``/``usec`` so the caller can remember the last one. ``kinds`` limits
    the pass to Xids or SXids (the other list comes back empty).

    SXid reports: a report's Severity and Data lines join the newest open report of the same
    switch, bus id and code (reports of several switches interleave). A Severity line without an
    event line before it (overwritten in the ring buffer, or before the window) makes a report of
    its own - it still says how severe the fault was; a Data line alone is dropped.
    """
    want_xid, want_sxid = "xid" in kinds, "sxid" in kinds
    needle = "Xid" if want_xid and want_sxid else ("NVRM: Xid" if want_xid else "SXid")
    with gc_paused():
        return _scan_all(lines, since_seq, since_usec, needle, want_xid, want_sxid)


def _scan_all(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int],
    since_usec: Optional[int],
    needle: str,
    want_xid: bool,
    want_sxid: bool,
) -> Tuple[List[XidEvent], List[SxidEvent]]:
    xids: List[XidEvent] = []
    reports: List[_Report] = []
    open_reports: Dict[Tuple[int, str, int], _Report] = {}
    # bound at the first line past the pre-filter: a log without one (every healthy prolog's)
    # compiles neither pattern (~0.9 ms of the check process, round 8)
    kmsg_match = kmsg_xid_match = None
    for line in lines:
        if isinstance(line, str):
            if needle not in line:
                continue  # cheap pre-filter: every line of the kinds asked for contains it
            if len(line) > MAX_LINE:
                continue
            if kmsg_xid_match is None:
                kmsg_match, kmsg_xid_match = _KMSG_RE.match, _KMSG_XID_RE.match
            x = kmsg_xid_match(line) if want_xid else None
            if x is not None:  # the common case, in one regex call: a /dev/kmsg record of an Xid
                g = x.groups()  # priority, seq, usec, message, then _XID_RE's groups
                seq, usec = int(g[1]), int(g[2])
                if (
                    int(g[0]) >> 3 == KERNEL_FACILITY
                    and (since_seq is None or seq > since_seq)
                    and (since_usec is None or usec > since_usec)
                ):
                    fields = _xid_groups(*g[4:11])
                    if fields is not None:
                        xids.append(
                            _new(
                                XidEvent,
                                fields[0],
                                fields[1],
                                fields[2],
                                fields[3],
                                fields[4],
                                g[3],
                                seq,
                                usec,
                                None,
                                fields[5],
                                fields[6],
                            )
                        )
                continue
            m = kmsg_match(line)
        else:
            m = None
        if m is not None:  # /dev/kmsg, the hooks' source: parsed inline, no KmsgRecord per line
            prio, seq_text, usec_text, _flags, message = m.groups()
            seq, usec = int(seq_text), int(usec_text)
            if (
                int(prio) >> 3 != KERNEL_FACILITY
                or (since_seq is not None and seq <= since_seq)
                or (since_usec is not None and usec <= since_usec)
            ):
                continue
            wallclock = None
            message = message.rstrip("\r\n")
        else:
            rec = _record(line)
            if rec is None or not _after(rec, since_seq, since_usec) or not from_driver(rec):
                continue
            message, seq, usec, wallclock = rec.message, rec.seq, rec.usec, rec.wallclock
        if message.startswith("NVRM: Xid"):
            fields = _xid_fields(message) if want_xid else None
            if fields is not None:
                xids.append(_new(XidEvent, *fields[:5], message, seq, usec, wallclock, *fields[5:]))
            continue
        part = (
            parse_sxid_line(message)
            if want_sxid and message.startswith("nvidia-nvswitch")
            else None
        )
        if part is None:
            continue
        key = (part.switch if part.switch is not None else -1, part.pci, part.sxid)
        current = open_reports.get(key)
        if part.kind == "event" or (current is None and part.kind == "severity"):
            # KmsgRecord fields: message, source, priority, seq, usec, wallclock, host, continuation, facility
            report = _Report(
                part,
                _new(
                    KmsgRecord,
                    message,
                    "kmsg" if m is not None else "text",
                    None,
                    seq,
                    usec,
                    wallclock,
                    None,
                    False,
                    None,
                ),
            )
            reports.append(report)
            open_reports[key] = report
        elif current is not None:
            current.add(part)
    return xids, [report.event() for report in reports]


def scan(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int] = None,
    since_usec: Optional[int] = None,
) -> List[XidEvent]:
    """Xid events in ``lines``, oldest first (see :func:`scan_all` for the position filters)."""
    return scan_all(lines, since_seq, since_usec)[0]


def scan_sxid(
    lines: Iterable[Union[str, bytes]],
    since_seq: Optional[int] = None,
    since_usec: Optional[int] = None,
) -> List[SxidEvent]:
    """NVSwitch SXid reports in ``lines``, one event per report (see :func:`scan_all`)."""
    return scan_all(lines, since_seq, since_usec)[1]
