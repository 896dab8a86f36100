"""host.mce: machine-check records in the kernel log since boot (health context).

Where the data comes from: /dev/kmsg (Host.read_kmsg), each record parsed by slurm_hooks.xid.kmsg's
parse_kmsg_record (one parser of kernel log records in this project). The x86 machine-check code
(arch/x86/kernel/cpu/mce/core.c, print_mce) writes, with the "[Hardware Error]: " prefix:

    mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 6: cc59dec000041152

the last number being the bank's MCi_STATUS: bit 63 VAL, 62 OVER (an earlier error was lost), 61 UC
(uncorrected), 57 PCC (processor context corrupt). "Machine check events logged" says the kernel
queued records for mcelog/rasdaemon (which decode them). "Memory failure: 0x...: recovery action"
(mm/memory-failure.c) says a page with an uncorrectable error was taken away from its user.

Only kernel-facility records count where the record says (a user writing to /dev/kmsg gets LOG_USER,
see slurm_hooks.xid.kmsg). The kernel log is since boot (as far as the ring buffer reaches): a record
stays until the node reboots, so everything here is WARN by default.
"""

from __future__ import annotations

from typing import List, Tuple

from ...core.lazyre import lazy_compile
from ...core.structs import Struct
from ...hw.host import HostError
from ...registry import Param, check, gatherer
from ...result import Result, Status
from ...xid.kmsg import parse_kmsg_record
from . import common

NAME = "host.mce"
KMSG = "/dev/kmsg"
_BANK = lazy_compile(
    r"\[Hardware Error\]: CPU (\d+): Machine Check(?: Exception)?: [0-9a-fA-F]+ Bank (\d+): ([0-9a-fA-F]{1,16})\b"
)
_MEMORY_FAILURE = lazy_compile(r"^Memory failure: (0x[0-9a-fA-F]+): (.*)")
VAL, OVER, UC, PCC = 1 << 63, 1 << 62, 1 << 61, 1 << 57


class MachineCheck(Struct):
    cpu: int
    bank: int
    status: int
    line: str

    @property
    def uncorrected(self) -> bool:
        return bool(self.status & VAL and self.status & UC)


class MceLog(Struct):
    checks: Tuple[MachineCheck, ...]
    memory_failures: Tuple[str, ...]  # "0x1234: recovery action for dirty LRU page: Recovered"
    error: str = ""


@gatherer(NAME)
def read_machine_checks(ctx) -> MceLog:
    """Machine-check and memory-failure records of /dev/kmsg (kernel facility only)."""
    try:
        records = ctx.host.read_kmsg(KMSG)
    except HostError as exc:
        return MceLog((), (), str(exc))
    checks: List[MachineCheck] = []
    failures: List[str] = []
    for raw in records:
        if "Hardware Error" not in raw and "Memory failure" not in raw:
            continue  # most records: skip the parse
        record = parse_kmsg_record(raw.split("\n", 1)[0])
        if record is None or (record.facility is not None and record.facility != 0):
            continue
        match = _BANK.search(record.message)
        if match:
            cpu, bank, status = match.groups()
            checks.append(MachineCheck(int(cpu), int(bank), int(status, 16), record.message))
            continue
        failure = _MEMORY_FAILURE.match(record.message)
        if failure:
            failures.append("%s: %s" % failure.groups())
    return MceLog(tuple(checks), tuple(failures))


@check(
    name=NAME,
    contexts=("health", "manual"),
    timeout=10.0,
    needs=(NAME,),
    params=(
        common.status_param(
            "uncorrected_status", "warn", "a machine check with the UC bit set, logged since boot"
        ),
        Param(
            "corrected_warn",
            int,
            10,
            "WARN at this many corrected machine checks of one CPU bank since boot; 0 = never",
            minimum=0,
            maximum=1 << 30,
        ),
        common.status_param(
            "memory_failure_status", "warn", "a page taken offline for a memory error since boot"
        ),
    ),
)
def mce(log: MceLog, params) -> List[Result]:
    """Machine checks: no uncorrected one, few corrected ones per bank, no poisoned page since boot (kernel log).

    Health context only (a full read of /dev/kmsg). Decoding which part failed is mcelog's or
    rasdaemon's job: the result names the CPU and bank and the raw status.
    """
    if log.error:
        return [Result(NAME, Status.UNKNOWN, "kernel log unreadable: %s" % log.error)]
    results: List[Result] = []
    uc_status = common.STATUS_OF[params.uncorrected_status]
    by_bank = {}
    for event in log.checks:
        by_bank.setdefault((event.cpu, event.bank), []).append(event)
    for (cpu, bank), events in sorted(by_bank.items()):
        component = "cpu:%d bank %d" % (cpu, bank)
        uncorrected = [e for e in events if e.uncorrected]
        if uncorrected and uc_status is not Status.OK:
            worst = uncorrected[-1]
            results.append(
                Result(
                    NAME,
                    uc_status,
                    "%d uncorrected machine check(s) on CPU %d bank %d since boot (status 0x%016x%s): decode with mcelog or ras-mc-ctl"
                    % (
                        len(uncorrected),
                        cpu,
                        bank,
                        worst.status,
                        ", processor context corrupt" if worst.status & PCC else "",
                    ),
                    component=component,
                    details={"lines": [e.line for e in uncorrected[-5:]]},
                )
            )
        corrected = [e for e in events if not e.uncorrected]
        if params.corrected_warn and len(corrected) >= params.corrected_warn:
            results.append(
                Result(
                    NAME,
                    Status.WARN,
                    "%d corrected machine check(s) on CPU %d bank %d since boot"
                    % (len(corrected), cpu, bank),
                    component=component,
                    details={"lines": [e.line for e in corrected[-5:]]},
                )
            )
    mf_status = common.STATUS_OF[params.memory_failure_status]
    if log.memory_failures and mf_status is not Status.OK:
        results.append(
            Result(
                NAME,
                mf_status,
                "%d page(s) taken offline for memory errors since boot: %s"
                % (len(log.memory_failures), log.memory_failures[-1]),
                component="memory",
                details={"pages": list(log.memory_failures[-20:])},
            )
        )
    if results:
        return results
    return [
        Result(
            NAME,
            Status.OK,
            "%d machine check record(s) since boot, none of concern" % len(log.checks),
        )
    ]
