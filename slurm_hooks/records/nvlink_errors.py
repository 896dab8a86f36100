"""NVLink error counters of one GPU for the counter snapshot (counters.py): five counters per active link.

Where they come from (`nvidia-smi nvlink -e`): nvmlDeviceGetNvLinkState per link says which links are
active (probing ends at INVALID_ARGUMENT, past the last link). Their counters are asked for in one
nvmlDeviceGetFieldValues call per GPU, NVML_FI_DEV_NVLINK_<counter>_ERROR_COUNT_L<n> (nvml.h, ids below),
each entry also carrying its link in scopeId, as newer nvml.h headers ask. nvml.h has such ids for
links 0-11 only; a link past 11, an entry the driver answers with anything but SUCCESS (a driver that
predates the field, or one that serves it only through the per-link call), and every entry when the
call itself fails (no nvmlDeviceGetFieldValues, a pynvml that cannot pass scopeId) are read as before
the batch, with nvmlDeviceGetNvLinkErrorCounter per link and counter, whose answer or error stands.

Why batched: an 8-GPU node with 18 links per GPU made 720 per-link counter calls per snapshot, each an
ioctl on a real driver and ~20 µs of Python around it; the batch makes that 8 calls, plus 240 per-link
calls for links 12-17.
"""

from __future__ import annotations

from ..hw import nvml

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS in current nvml.h; probing stops at the first invalid link
# nvmlNvLinkErrorCounter_t 0..4, the codes nvmlDeviceGetNvLinkErrorCounter takes
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
# nvml.h (nvidia-nvml-dev 13.x, unchanged since the ids were added): per counter, runs of consecutive
# field ids as (first link, first id, links in the run). Links 0-5 came first; 6-11 were added later
# in a second run for the four older counters.
ERROR_FIELD_RUNS: Dict[str, Tuple[Tuple[int, int, int], ...]] = {
    "replay": ((0, 46, 6), (6, 108, 6)),  # NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0 / _L6
    "recovery": ((0, 53, 6), (6, 114, 6)),  # NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0 / _L6
    "crc_flit": ((0, 32, 6), (6, 96, 6)),  # NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0 / _L6
    "crc_data": ((0, 39, 6), (6, 102, 6)),  # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0 / _L6
    "ecc_data": ((0, 148, 12),),  # NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0
}


def error_field_id(counter: str, link: int) -> Optional[int]:
    """The nvmlDeviceGetFieldValues id of `counter` on `link`; None past the links nvml.h numbers."""
    for first_link, first_id, links in ERROR_FIELD_RUNS[counter]:
        if first_link <= link < first_link + links:
            return first_id + link - first_link
    return None


def _fields_by_link() -> Dict[int, List[Tuple[str, int]]]:
    """Per link nvml.h numbers: [(counter, field id)] in NVLINK_COUNTERS order."""
    out: Dict[int, List[Tuple[str, int]]] = {}
    for name in NVLINK_COUNTERS:
        for first_link, first_id, links in ERROR_FIELD_RUNS[name]:
            for link in range(first_link, first_link + links):
                out.setdefault(link, []).append((name, first_id + link - first_link))
    return out


_FIELDS_BY_LINK = _fields_by_link()


def read(session: nvml.NvmlSession, handle: Any, gpu: Dict[str, Any]) -> None:
    """gpu["nvlink"][link] = {counter: value} per active link, gpu["counters"]["nvlink.<counter>"] = their
    sums. An NvmlError that stops the link probe or a per-link read propagates after the links read
    before it are recorded (the snapshot then lists "nvlink" under unavailable, without totals)."""
    links, probe_error = _active_links(session, handle)
    batched = _batched(session, handle, links)
    totals = dict.fromkeys(NVLINK_COUNTERS, 0)
    for link in links:
        values = {}
        for code, name in enumerate(NVLINK_COUNTERS):
            value = batched.get((link, name))
            if value is None:
                value = int(session.call("nvmlDeviceGetNvLinkErrorCounter", handle, link, code))
            values[name] = value
        gpu["nvlink"][str(link)] = values
        for name, value in values.items():
            totals[name] += value
    if probe_error is not None:
        raise probe_error
    for name, value in totals.items():
        gpu["counters"]["nvlink.%s" % name] = value


def _active_links(
    session: nvml.NvmlSession, handle: Any
) -> Tuple[List[int], Optional[nvml.NvmlError]]:
    """The active links in order, and the error that ended the probe early (None at its normal end)."""
    active: List[int] = []
    for link in range(MAX_NVLINKS):
        try:
            state = session.call("nvmlDeviceGetNvLinkState", handle, link)
        except nvml.NvmlError as exc:
            if exc.code == nvml.INVALID_ARGUMENT and link > 0:
                break
            return active, exc
        if state:
            active.append(link)
    return active, None


def _batched(
    session: nvml.NvmlSession, handle: Any, links: List[int]
) -> Dict[Tuple[int, str], int]:
    """{(link, counter): value} for the entries the driver answered with SUCCESS for the field asked
    there (its fieldId echoed back); {} when the call fails."""
    wanted = [
        ((link, name), field_id)
        for link in links
        for name, field_id in _FIELDS_BY_LINK.get(link, ())
    ]
    if not wanted:
        return {}
    try:
        # (field id, scopeId = link): right whether a driver takes the link from the id or the scope
        entries = session.call(
            "nvmlDeviceGetFieldValues", handle, [(fid, key[0]) for key, fid in wanted]
        )
    except (nvml.NvmlError, TypeError):  # TypeError: a pynvml that takes bare field ids only
        return {}
    out: Dict[Tuple[int, str], int] = {}
    for (key, field_id), entry in zip(wanted, entries):
        if entry.nvmlReturn != 0:  # NOT_SUPPORTED and the like: the per-link call answers instead
            continue
        if entry.fieldId != field_id:  # not the field asked in that place: not booked under it
            continue
        member = _INTEGER_MEMBERS.get(entry.valueType)
        value = getattr(entry.value, member) if member else None
        if isinstance(value, int) and value >= 0:
            out[key] = value
    return out


# nvmlValueType_t -> nvmlValue_t member, integer types only (a counter in a double is not taken)
_INTEGER_MEMBERS = {k: v for k, v in nvml.FIELD_VALUE_MEMBERS.items() if v != "dVal"}
