"""A JSON reader that keeps positions and duplicate keys, linear in the file and bounded in memory.

``json.load`` forgets where a value was and silently keeps the last of two equal keys; DeepSpeed itself
(``hjson.load`` with ``dict_raise_error_on_duplicate_keys``, ``deepspeed/runtime/config.py``) refuses
duplicates, while the HF integrations (``json.load``) keep the last one. This reader does what ``json.load``
does for values and numbers (``1e9`` is a float, ``NaN``/``Infinity`` accepted) and records positions and
duplicates. It also accepts what DeepSpeed's hjson loader accepts beyond JSON and people write in configs:
``#``, ``//`` and ``/* */`` comments and trailing commas; where they were used is returned, because the HF
and accelerate integrations read the same file with ``json.load`` and refuse them.

Hand-written (not ``json``/``hjson``) because neither keeps positions; every scan is a compiled regular
expression and positions come from one line index, so reading is linear (see ``bench/check/readers.py``).
Limits: nesting depth 200, :func:`~zeropilot.launch.document.node_budget` values, numbers of at most 4300
characters (``json.load`` refuses longer integers, Python's ``int_max_str_digits``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.document import LineIndex, Node, node_budget, set_paths

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
# Whitespace and comments, as hjson skips them; an unterminated /* stops the match at the '/'.
_GAP = re.compile(r"(?:[ \t\n\r]+|//[^\n]*|#[^\n]*|/\*.*?\*/)*", re.S)
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_CONSTANTS = (("true", True), ("false", False), ("null", None), ("NaN", float("nan")),
              ("Infinity", float("inf")), ("-Infinity", float("-inf")))
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
MAX_DEPTH = 200
MAX_NUMBER_CHARS = 4300
_MAX_RELAXED = 5


@dataclass
class JsonRead:
    """A parsed file: its root and where it used comments or trailing commas ((line, what), first few)."""

    root: Node
    relaxed: List[Tuple[int, str]] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str, path: Path) -> None:
        self.text = text
        self.path = path
        self.pos = 0
        self.lines = LineIndex(text)
        self.budget = node_budget(text)
        self.relaxed: List[Tuple[int, str]] = []

    def fail(self, message: str, offset: int, prefix: str = "not valid JSON: ") -> InputError:
        line, col = self.lines.line_col(min(offset, len(self.text)))
        return InputError(f"{prefix}{message}", self.path, line, col)

    def note(self, what: str, offset: int) -> None:
        if len(self.relaxed) < _MAX_RELAXED:
            self.relaxed.append((self.lines.line(offset), what))

    def skip_ws(self) -> None:
        start = self.pos
        self.pos = _GAP.match(self.text, start).end()
        if self.pos > start and len(self.relaxed) < _MAX_RELAXED:
            gap = self.text[start:self.pos]
            comment = gap.lstrip(" \t\n\r")
            if comment:
                self.note("comment", self.pos - len(comment))

    def parse(self) -> Node:
        self.skip_ws()
        if self.pos >= len(self.text):
            raise self.fail("the file is empty", 0)
        node = self.value(0)
        self.skip_ws()
        if self.pos != len(self.text):
            what = "unterminated /* comment" if self.text.startswith("/*", self.pos) else \
                "extra text after the top-level value"
            raise self.fail(what, self.pos)
        return node

    def value(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.fail("nested too deeply", self.pos)
        self.budget -= 1
        if self.budget < 0:
            raise self.fail(f"more than {node_budget(self.text)} values: not a launch config (the limit grows "
                            "with the file's size)", self.pos, prefix="")
        self.skip_ws()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of file", self.pos)
        ch = self.text[self.pos]
        if ch == "{":
            return self.mapping(depth)
        if ch == "[":
            return self.sequence(depth)
        if ch == '"':
            start = self.pos
            s = self.string()
            return self.node(s, start)
        return self.scalar()

    def node(self, value, start: int) -> Node:
        line, col = self.lines.line_col(start)
        raw = self.text[start:self.pos] if not isinstance(value, (dict, list)) else None
        return Node(value, line=line, col=col, start=start, end=self.pos, raw=raw)

    def closes(self, bracket: str, comma_at: int) -> bool:
        """Whether the container ends here; a comma just before it is a trailing comma (hjson accepts it)."""
        if not self.text.startswith(bracket, self.pos):
            return False
        if comma_at >= 0:
            self.note("trailing comma", comma_at)
        self.pos += 1
        return True

    def mapping(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        members: dict = {}
        duplicates: List[Tuple[str, Node]] = []
        comma_at = -1
        while True:
            self.skip_ws()
            if self.closes("}", comma_at):
                break
            if not self.text.startswith('"', self.pos):
                raise self.fail("expected a quoted key", self.pos)
            key_start = self.pos
            key = self.string()
            key_end = self.pos
            self.skip_ws()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected ':' after the key", self.pos)
            self.pos += 1
            child = self.value(depth + 1)
            child.key_start, child.key_end = key_start, key_end
            child.key_line = self.lines.line(key_start)
            if key in members:
                duplicates.append((key, members[key]))
            members[key] = child
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                comma_at = self.pos
                self.pos += 1
                continue
            if self.closes("}", -1):
                break
            raise self.fail("expected ',' or '}'", self.pos)
        node = self.node(members, start)
        node.duplicates = duplicates
        return node

    def sequence(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        items = []
        comma_at = -1
        while True:
            self.skip_ws()
            if self.closes("]", comma_at):
                break
            items.append(self.value(depth + 1))
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                comma_at = self.pos
                self.pos += 1
                continue
            if self.closes("]", -1):
                break
            raise self.fail("expected ',' or ']'", self.pos)
        return self.node(items, start)

    def string(self) -> str:
        text = self.text
        start = self.pos
        self.pos += 1
        out = []
        while True:
            end = _PLAIN.match(text, self.pos).end()
            out.append(text[self.pos:end])
            self.pos = end
            if end >= len(text):
                raise self.fail("unterminated string", start)
            ch = text[end]
            if ch == '"':
                self.pos += 1
                return "".join(out)
            if ch != "\\":
                raise self.fail("control character in string", end)
            self.pos = self.escape(end, out)

    def escape(self, end: int, out: List[str]) -> int:
        """Append the character of the escape at ``end``; return the offset after it."""
        text = self.text
        esc = text[end + 1:end + 2]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            return end + 2
        if esc == "u" and _HEX4.fullmatch(text[end + 2:end + 6]):
            code = int(text[end + 2:end + 6], 16)
            low = text[end + 8:end + 12] if text[end + 6:end + 8] == "\\u" else ""
            if 0xD800 <= code <= 0xDBFF and _HEX4.fullmatch(low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)))
                return end + 12
            out.append(chr(code))
            return end + 6
        raise self.fail("invalid escape in string", end)

    def scalar(self) -> Node:
        start = self.pos
        for word, val in _CONSTANTS:
            if self.text.startswith(word, start):
                self.pos = start + len(word)
                return self.node(val, start)
        m = _NUMBER.match(self.text, start)
        if not m or m.end() == start:
            snippet = self.text[start:start + 20].split("\n")[0]
            raise self.fail(f"unexpected {snippet!r}", start)
        if m.end() - start > MAX_NUMBER_CHARS:
            raise self.fail(f"a number of {m.end() - start} characters (json.load refuses integers of more than "
                            f"{MAX_NUMBER_CHARS} digits)", start, prefix="")
        self.pos = m.end()
        raw = m.group(0)
        value = float(raw) if (m.group(1) or m.group(2)) else int(raw)
        return self.node(value, start)


def read_json(text: str, path: Path) -> JsonRead:
    """Parse JSON (with comments and trailing commas) into a Node tree with positions, paths, duplicates.

    Raises:
        InputError: with the line and column of the first syntax error or exceeded limit.
    """
    parser = _Parser(text, path)
    root = parser.parse()
    set_paths(root)
    return JsonRead(root, parser.relaxed)


def parse_json(text: str, path: Path) -> Node:
    """The root of :func:`read_json`."""
    return read_json(text, path).root
