"""Edits that keep a file's comments, key order and indentation: each replaces one text span.

Rules build edits with :func:`replace_value`, :func:`rename_key` and :func:`delete_member`;
:func:`apply_edits` applies them to files atomically, and :func:`diff` shows them.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.document import Document, Node
from zeropilot.fix.model import Edit

_YAML_PLAIN = re.compile(r"^[A-Za-z_./][A-Za-z0-9_./-]*$")
_YAML_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def render_scalar(doc: Document, value: Any) -> str:
    """A scalar written as the document's format writes it."""
    if doc.fmt == "json":
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _YAML_PLAIN.match(text) and text.lower() not in _YAML_RESERVED:
        return text
    return json.dumps(text)


def replace_value(doc: Document, node: Node, value: Any) -> Optional[Edit]:
    """Replace a scalar's text with ``value``; None when the node has no text span (flags)."""
    if node.start is None or node.end is None or doc.fmt == "flags":
        return None
    return Edit(doc.path, node.start, node.end, render_scalar(doc, value))


def rename_key(doc: Document, node: Node, new_key: str) -> Optional[Edit]:
    """Rename the key of a mapping member."""
    if node.key_start is None or node.key_end is None or doc.fmt == "flags":
        return None
    old = doc.text[node.key_start:node.key_end]
    quote = old[0] if old[:1] in ("'", '"') else ""
    return Edit(doc.path, node.key_start, node.key_end, f"{quote}{new_key}{quote}")


def delete_member(doc: Document, node: Node) -> Optional[Edit]:
    """Delete a mapping member (key and value), with its comma in JSON or its lines in YAML."""
    if node.key_start is None or node.end is None or doc.fmt == "flags":
        return None
    text = doc.text
    if doc.fmt == "json":
        i = node.key_start - 1
        while i >= 0 and text[i] in " \t\r\n":
            i -= 1
        if i >= 0 and text[i] == ",":
            return Edit(doc.path, i, node.end, "")
        j = node.end
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        if j < len(text) and text[j] == ",":
            j += 1
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            return Edit(doc.path, _line_start(text, node.key_start) if _only_ws_before(text, node.key_start)
                        else node.key_start, _line_start(text, j) if _only_ws_before(text, j) else j, "")
        return Edit(doc.path, node.key_start, node.end, "")
    start = _line_start(text, node.key_start)
    end = text.find("\n", max(node.end - 1, node.key_start))
    end = len(text) if end < 0 else end + 1
    return Edit(doc.path, start, end, "")


def _line_start(text: str, offset: int) -> int:
    return text.rfind("\n", 0, offset) + 1


def _only_ws_before(text: str, offset: int) -> bool:
    return text[_line_start(text, offset):offset].strip() == ""


def _group(edits: Iterable[Edit]) -> Dict[Path, List[Edit]]:
    by_file: Dict[Path, List[Edit]] = {}
    for e in edits:
        by_file.setdefault(Path(e.file), []).append(e)
    return by_file


def apply_to_text(text: str, edits: List[Edit]) -> Tuple[str, int]:
    """Apply non-overlapping edits to text (overlapping ones after the first are skipped)."""
    out, last, applied = [], 0, 0
    for e in sorted(set(edits), key=lambda e: (e.start, e.end)):
        if e.start < last:
            continue
        out.append(text[last:e.start])
        out.append(e.replacement)
        last = e.end
        applied += 1
    out.append(text[last:])
    return "".join(out), applied


def planned(edits: Iterable[Edit], texts: Dict[Path, str]) -> Dict[Path, Tuple[str, str]]:
    """file -> (old text, new text) for every file the edits change."""
    out = {}
    for path, file_edits in _group(edits).items():
        old = texts[path]
        new, _ = apply_to_text(old, file_edits)
        if new != old:
            out[path] = (old, new)
    return out


def diff(changes: Dict[Path, Tuple[str, str]]) -> str:
    """A unified diff of planned changes."""
    chunks = []
    for path, (old, new) in changes.items():
        chunks.extend(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                           f"a/{path}", f"b/{path}"))
    return "".join(chunks)


def write_atomic(path: Path, text: str) -> None:
    """Write a file through a temporary sibling and a rename, keeping its mode.

    Raises:
        InputError: when the folder cannot be written.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".zeropilot", dir=str(path.parent))
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError(f"cannot write: {exc.strerror}", path) from None


def apply_edits(changes: Dict[Path, Tuple[str, str]]) -> List[Path]:
    """Write planned changes; a file whose text is unchanged is never touched."""
    written = []
    for path, (old, new) in changes.items():
        if old != new:
            write_atomic(path, new)
            written.append(path)
    return written
