"""Drain reasons: how ours are written and how any reason is read (whose drain it is).

Written (format_reason): '<prefix><worst check>[ g<GPU>][ +<other checks>]: <component> <summary>
-> <action> (+N more)', e.g. 'sh:gpu.remap g3 +gpu.ecc: gpu:3 0000:3b:00.0 row-remap pending ->
reset-gpu (+1 more)'. `sinfo -R` shows 20 characters of a reason by default ("%20E"), so those say
what broke: 'sh:gpu.remap g3 +gpu'. An admin's drain through `slurm-hooks drain` is 'sh:manual: TEXT'.

Read (read_reason), exactly: a reason is ours only when the prefix is followed by precisely what
format_reason writes up to the first ':' (or 'manual'); 'sh: see ticket 42' is an admin's. The
format of the release before ('slurm-hooks: gpu.count,gpu.ecc: ...', and 'slurm-hooks: manual:
...') is read too, so an upgrade does not orphan the drains it made. Slurm's own bare prolog/epilog
reasons are recognised as refinable (is_refinable).
"""

from __future__ import annotations

import re

from ..core.lazyre import lazy_compile
from ..core.structs import Struct
from ..result import Action, Result

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

REASON_LIMIT = 512  # the longest reason the Slurm client accepts from us (slurm.MAX_REASON)
# Slurm's own bare reasons for a failed prolog/epilog (slurmctld, 25.11.7 source): "Prolog error"
# (node_mgr.c, ESLURMD_PROLOG_FAILED), "Epilog error" (job_mgr.c), "Prolog/Epilog failure" (agent.c,
# an RPC answered ESLURMD_PROLOG_FAILED or ESLURMD_EPILOG_FAILED)
REFINABLE_REASONS = ("Prolog error", "Epilog error", "Prolog/Epilog failure")
# What every reason started with before the short "sh:" (up to the release before tracker 25): still
# read as ours, so an upgrade does not orphan the drains made before it
LEGACY_PREFIX = "slurm-hooks:"


_UNSAFE = lazy_compile(r"[^A-Za-z0-9 .,:;_=+/@%()\[\]<>#|-]")


def sanitize(text: str) -> str:
    """Reasons go through scontrol/RPC and into sinfo tables: no newlines, quotes or control bytes."""
    for quote in ('"', "'", "`"):  # quoting marks carry no meaning in a reason: dropped, not '?'
        text = text.replace(quote, "")
    return re.sub(r"\s+", " ", _UNSAFE.sub("?", text)).strip()


def format_reason(
    result: Result, prefix: str, max_length: int, more: int = 0, checks: Sequence[str] = ()
) -> str:
    """'sh:gpu.remap g3 +gpu.ecc: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu (+1 more)'.

    `sinfo -R` shows 20 characters of a reason, so those say what broke: the prefix, the worst
    check, and the GPU (g3) when its component names one ('gpu:3 ...'). Then the other checks that
    caused the drain ('+gpu.ecc,gpu.count'): the reason alone says what must pass again. When they
    would take more than half of max_length, the first ones are kept and the rest counted
    ('+gpu.ecc,+5'): read_reason then knows the list is incomplete. `more` counts the other
    findings ('(+N more)': other GPUs, other checks). Bounded and sanitized.
    A long summary is cut, not the end: the action and the '(+N more)' count are what an admin
    reading `sinfo -R` acts on, so they survive the cut ('... redirected to the root c... -> drain').
    """
    names = [c for c in checks if c != result.check]
    gpu = gpu_index(result.component)
    lead = _lead(prefix)
    parts = [lead + _head_field(result.check, gpu, names, max_length // 2 - len(lead) - 1) + ":"]
    if result.component:
        parts.append(result.component)
    parts.append(result.summary)
    tail = []
    if result.action is not Action.NONE:
        tail.append("-> " + result.action.value)
    if more:
        tail.append("(+%d more)" % more)
    head = sanitize(" ".join(parts))
    end = sanitize(" ".join(tail))
    reason = (head + " " + end).strip()
    if len(reason) > max_length:
        keep = max_length - 3 - (len(end) + 1 if end else 0)
        if keep < len(parts[0]):  # too short for the tail: plain cut
            return reason[: max(max_length - 3, 0)].rstrip() + "..."
        reason = head[:keep].rstrip() + "..." + (" " + end if end else "")
    return reason


def _lead(prefix: str) -> str:
    """The prefix as a reason starts with it: 'sh:' runs into the check name ('sh:gpu.remap'); a
    prefix ending in a letter or digit is followed by a space."""
    prefix = prefix.strip()
    return prefix if not prefix[-1:].isalnum() else prefix + " "


def gpu_index(component: Optional[str]) -> Optional[int]:
    """3 for a component 'gpu:3 0000:3b:00.0' (the checks' own way to name a GPU), else None."""
    m = re.match(r"gpu:(\d{1,4})(?:\s|\Z)", component or "")
    return int(m.group(1)) if m else None


def _head_field(first: str, gpu: Optional[int], others: Sequence[str], budget: int) -> str:
    """'gpu.remap g3 +gpu.ecc,gpu.count' (the others cut so that the whole stays within `budget`
    characters where it can, the rest counted; the first check and the GPU are always there)."""
    field = first + ("" if gpu is None else " g%d" % gpu)
    if not others:
        return field
    budget -= len(field) + 2  # ' +'
    kept: List[str] = []
    for name in others:
        rest = len(others) - len(kept) - 1
        if len(",".join(kept + [name] + (["+%d" % rest] if rest else []))) > budget:
            break
        kept.append(name)
    rest = len(others) - len(kept)
    return field + " +" + ",".join(kept + (["+%d" % rest] if rest else []))


MANUAL = "manual"  # the word after the prefix in drains made with `slurm-hooks drain`
# The pseudo-check named by drains of straggler suspects (slurm/straggler_drain.py, on an admin host): an automatic
# drain (the breaker counts it) that a node's health run never resumes or adopts; an admin clears it.
FLEET_CHECK = "fleet.straggler"


def format_manual_reason(text: str, prefix: str, max_length: int) -> str:
    """The reason of an admin's `slurm-hooks drain --reason TEXT`: 'sh:manual: TEXT' (bounded)."""
    reason = sanitize("%s%s: %s" % (_lead(prefix), MANUAL, text))
    max_length = min(max_length, REASON_LIMIT)
    if len(reason) > max_length:
        reason = reason[: max(max_length - 3, 0)].rstrip() + "..."
    return reason


def is_ours(reason: Optional[str], prefix: str) -> bool:
    """The reason is one of ours in form: automatic or manual, in today's format or the one before
    (it may still be an old one Slurm kept: see drainer). A reason that only starts with the prefix
    is not ("sh: see ticket 42" is an admin's)."""
    return read_reason(reason, prefix).kind != ""


class ReasonOwner(Struct):
    """What one of our reasons says about its drain. kind: 'auto' (a hook drained the node for
    `checks`), 'manual' (an admin through `slurm-hooks drain`), or '' (not ours: no prefix, or a
    prefix followed by something we never write). gpu: the GPU index the reason leads with."""

    kind: str
    checks: Tuple[str, ...] = ()
    complete: bool = True  # every check that caused the drain is named
    gpu: Optional[int] = None

    @property
    def automatic(self) -> bool:
        return self.kind == "auto"


# patterns, not compiled objects: the prolog imports this module and reads no reason on its happy path
# (re caches them at the first use)
_CHECK_NAME = r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)+\Z"
_MORE_NAMES = r"\+\d+\Z"
_GPU_TOKEN = r"g(\d{1,4})\Z"


def read_reason(reason: Optional[str], prefix: str) -> ReasonOwner:
    """'sh:gpu.remap g3 +gpu.ecc: ...' -> auto (gpu.remap, gpu.ecc), GPU 3; 'sh:manual: x' -> manual.

    Exact: after the prefix comes exactly what format_reason writes up to the first ':' -- a check
    name, optionally ' gN', optionally ' +' and more names ('+N' last: more not named) -- or
    'manual'; anything else is not ours. Also read: the format of the release before (the prefix
    'slurm-hooks:' or the configured one, a space, the comma-joined names: 'slurm-hooks:
    gpu.count,gpu.ecc: ...'), and reasons from before every check was named ('slurm-hooks:
    gpu.count: ... (+1 more)', read as naming their first check only).
    """
    if not reason:
        return ReasonOwner("")
    for lead in dict.fromkeys((prefix.strip(), LEGACY_PREFIX)):
        if lead and reason.startswith(lead):
            rest = reason[len(lead) :]
            if lead[-1].isalnum() and not rest.startswith(" "):
                continue  # we write 'HC gpu.ecc: ...' (_lead); 'HCgpu.ecc: ...' is someone else's
            owner = _read_head(rest)
            if owner.kind:
                return owner
    return ReasonOwner("")


def _read_head(rest: str) -> ReasonOwner:
    """The part between the prefix and the first ':' (at most one space before it)."""
    head, colon, _ = (rest[1:] if rest.startswith(" ") else rest).partition(":")
    if not colon or not head:
        return ReasonOwner("")
    if head == MANUAL:
        return ReasonOwner("manual")
    tokens = head.split(" ")
    names, complete = _names(tokens[0])
    gpu = None
    rest_tokens = tokens[1:]
    if rest_tokens and re.match(_GPU_TOKEN, rest_tokens[0]):
        gpu = int(rest_tokens.pop(0)[1:])
    if rest_tokens and rest_tokens[0].startswith("+") and complete:
        more, complete = _names(rest_tokens.pop(0)[1:])
        names = None if names is None or more is None else names + more
    if not names or rest_tokens:
        return ReasonOwner("")
    return ReasonOwner("auto", tuple(dict.fromkeys(names)), complete, gpu)


def _names(field: str) -> Tuple[Optional[List[str]], bool]:
    """'gpu.count,gpu.ecc,+3' -> (names, complete); (None, _) when it is not a list of check names."""
    names = field.split(",")
    complete = True
    if re.match(_MORE_NAMES, names[-1]):
        names, complete = names[:-1], False
    if not all(re.match(_CHECK_NAME, n) for n in names):
        return None, complete
    return names, complete


def is_refinable(reason: Optional[str]) -> bool:
    """Slurm's own generic drain reason after a failed prolog/epilog: ours to replace with a precise one."""
    return bool(reason) and reason.strip() in REFINABLE_REASONS
