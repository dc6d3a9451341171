"""Text output for people: grouped by file, readable in 80 columns, coloured only on a terminal."""

from __future__ import annotations

import os
import textwrap
from itertools import groupby
from typing import Callable, List

from zeropilot.findings import CheckResult
from zeropilot.rules.registry import Finding

_COLOURS = {"error": "\033[31m", "warning": "\033[33m", "info": "\033[36m", "bold": "\033[1m", "dim": "\033[2m"}
_RESET = "\033[0m"
WIDTH = 80


def use_colour(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR") \
        and os.environ.get("TERM") != "dumb"


def _painter(colour: bool) -> Callable[[str, str], str]:
    def paint(text: str, style: str) -> str:
        return f"{_COLOURS[style]}{text}{_RESET}" if colour else text

    return paint


def _sort_key(f: Finding):
    return (f.file or "", f.line or 0, -f.severity.rank, f.code)


def render(result: CheckResult, colour: bool = False) -> str:
    paint = _painter(colour)
    lines: List[str] = []
    indent = " " * 6
    for file, group in groupby(sorted(result.findings, key=_sort_key), key=lambda f: f.file or "(launch)"):
        lines.append(paint(file, "bold"))
        for f in group:
            where = f"{f.line}" if f.line else "-"
            head = f"  {where:>4}  {paint(f'{f.severity.value:<7}', f.severity.value)} {f.code} {f.name}"
            lines.append(head)
            if f.key:
                lines.append(f"{indent}{paint('at', 'dim')} {f.key}")
            lines.extend(textwrap.wrap(f.message, WIDTH, initial_indent=indent, subsequent_indent=indent,
                                       break_on_hyphens=False, break_long_words=False))
            if f.fix is not None:
                fix = f"fix ({f.fix.applicability.value}): {f.fix.description}"
                lines.extend(textwrap.wrap(fix, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                           break_on_hyphens=False, break_long_words=False))
        lines.append("")
    for err in result.read_errors:
        # One line each, never wrapped: "file:line:col: message" is what editors jump to.
        lines.append(f"{paint('cannot read', 'error')}: {err.render()}")
    lines.extend(_footer(result, paint))
    return "\n".join(lines) + "\n"


def _footer(result: CheckResult, paint) -> List[str]:
    s = result.summary()
    counts = f"{s['errors']} error(s), {s['warnings']} warning(s), {s['info']} info in {s['files']} file(s)"
    if s["fixed"]:
        counts += f"; fixed {s['fixed']}"
    if s["unreadable"]:
        counts += f"; {s['unreadable']} file(s) could not be read"
    if s["suppressed"]:
        counts += f"; {s['suppressed']} suppressed"
    if s["skipped"]:
        counts += f"; {s['skipped']} skipped (not launch files)"
    ws = result.world_size
    world = f"world size: {ws.value if ws.value is not None else 'unknown'} ({ws.reason})"
    versions = ", ".join(f"{n} {pv.raw or 'unknown'}" + (f" [{pv.source}]" if pv.raw and pv.source != "installed"
                                                           else "")
                         for n, pv in result.versions.packages.items())
    out = [paint(counts, "bold")]
    out.extend(textwrap.wrap(world, WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    out.extend(textwrap.wrap(f"versions assumed: {versions}", WIDTH, subsequent_indent="  ",
                             break_on_hyphens=False))
    return out
