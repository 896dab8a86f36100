"""Result tables: plain text for the terminal, Markdown for bench/results.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence


@dataclass
class Section:
    title: str
    headers: Sequence[str]
    rows: List[Sequence[Any]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def ms(value: Optional[float], digits: int = 1) -> str:
    """Milliseconds for display; '-' when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "%.*f" % (digits, value)


def mib(kib: Optional[float]) -> str:
    return "-" if not kib else "%.1f" % (kib / 1024.0)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _cells(row: Sequence[Any]) -> List[str]:
    return ["" if c is None else str(c) for c in row]


def text(sections: Sequence[Section], header: Sequence[str]) -> str:
    out = list(header) + [""]
    for sec in sections:
        out.append("== %s" % sec.title)
        rows = [_cells(sec.headers)] + [_cells(r) for r in sec.rows]
        widths = [
            max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(len(sec.headers))
        ]
        for n, row in enumerate(rows):
            cells = [
                c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)
            ]
            out.append("  " + "  ".join(cells).rstrip())
            if n == 0:
                out.append("  " + "  ".join("-" * w for w in widths))
        out.extend("  * " + note for note in sec.notes)
        out.append("")
    return "\n".join(out)


def markdown(sections: Sequence[Section], header: Sequence[str], title: str) -> str:
    out = ["# " + title, ""] + list(header) + [""]
    for sec in sections:
        out += ["## " + sec.title, ""]
        out.append("| " + " | ".join(_cells(sec.headers)) + " |")
        out.append(
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(sec.headers))) + "|"
        )
        for row in sec.rows:
            cells = [c.replace("|", "\\|") for c in _cells(row)]
            if cells and cells[0].startswith(" "):  # a sub-row: Markdown would drop the indent
                cells[0] = "&nbsp;&nbsp;&nbsp;" + cells[0].lstrip()
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        out.extend("- " + note for note in sec.notes)
        if sec.notes:
            out.append("")
    return "\n".join(out)
