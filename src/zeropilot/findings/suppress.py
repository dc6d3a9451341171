"""Inline suppressions: a comment in the launch file that silences named rules on one line or the whole file.

Syntax (``#`` in YAML, shell, Python and DeepSpeed JSON, ``//`` also in JSON)::

    "stage": 3,   # zeropilot: ignore[DS001]          this line
    # zeropilot: ignore[DS001, fp16-and-bf16-both-enabled]   alone on its line: the next line
    # zeropilot: ignore-file[HF]                      anywhere: the whole file

Inside the brackets go codes, rule names or prefixes, as ``--ignore`` takes them; a bare ``ignore`` without
brackets is not a suppression (as ruff asks for codes, so a comment cannot hide a future rule). A finding is
silenced when its line (the key's line for a setting) carries a directive for its code. JSON comments are
possible only where DeepSpeed itself reads the file (hjson); a config the HF Trainer or accelerate reads goes
through ``json.load``, so use ``per-file-ignores`` in ``[tool.zeropilot]`` or ``--ignore`` there.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Set, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.document import LineIndex
from zeropilot.rules.registry import Finding, Rule, match_selector

_DIRECTIVE = re.compile(r"(?:#|//)[ \t]*zeropilot:[ \t]*ignore(-file)?\[([^\]\n]*)\]", re.I)


@dataclass
class FileSuppressions:
    """The directives of one file: codes per line, codes for the whole file, and selectors nothing matched."""

    by_line: Dict[int, Set[str]] = field(default_factory=dict)
    whole_file: Set[str] = field(default_factory=set)
    unknown: List[Tuple[int, str]] = field(default_factory=list)


def scan(text: str, rules: Sequence[Rule]) -> FileSuppressions:
    """The suppression directives of a file's text (linear: one regular expression over the text)."""
    out = FileSuppressions()
    if "zeropilot:" not in text:
        return out
    lines = LineIndex(text)
    for m in _DIRECTIVE.finditer(text):
        line = lines.line(m.start())
        codes = _codes(m.group(2).split(","), rules, line, out)
        if m.group(1):
            out.whole_file |= codes
            continue
        line_start = text.rfind("\n", 0, m.start()) + 1
        alone = not text[line_start:m.start()].strip()
        out.by_line.setdefault(line + 1 if alone else line, set()).update(codes)
    return out


def _codes(selectors: Iterable[str], rules: Sequence[Rule], line: int, out: FileSuppressions) -> Set[str]:
    codes: Set[str] = set()
    for selector in (s.strip() for s in selectors):
        if not selector:
            continue
        try:
            codes.update(r.code for r in match_selector(selector, rules)[0])
        except InputError:
            out.unknown.append((line, selector))
    return codes


def _per_file(path: str, per_file_ignores: Dict[str, Sequence[str]], rules: Sequence[Rule]) -> Set[str]:
    """Codes ``per-file-ignores`` silences for a file.

    A glob without ``/`` matches the file's name; one with ``/`` matches its absolute path (the CLI joins
    globs from ``pyproject.toml`` to that file's folder).
    """
    codes: Set[str] = set()
    name, absolute = Path(path).name, Path(path).absolute().as_posix()
    for glob, selectors in per_file_ignores.items():
        if fnmatch.fnmatch(absolute if "/" in glob else name, glob):
            for selector in selectors:
                codes.update(r.code for r in match_selector(selector, rules)[0])
    return codes


def apply(findings: List[Finding], texts: Dict[str, str], rules: Sequence[Rule],
          per_file_ignores: Dict[str, Sequence[str]]) -> Tuple[List[Finding], int, List[str]]:
    """(kept findings, how many were suppressed, notices about directives that name no rule)."""
    scanned = {file: scan(text, rules) for file, text in texts.items()}
    notices = [f"{file}:{line}: suppression names no rule: {selector!r}"
               for file, sup in scanned.items() for line, selector in sup.unknown]
    kept: List[Finding] = []
    for f in findings:
        silenced = set()
        if f.file is not None:
            sup = scanned.get(f.file)
            if sup is not None:
                silenced = sup.whole_file | sup.by_line.get(f.line, set())
            if per_file_ignores:
                silenced |= _per_file(f.file, per_file_ignores, rules)
        if f.code not in silenced:
            kept.append(f)
    return kept, len(findings) - len(kept), notices
