"""A JSON reader that keeps positions and duplicate keys.

``json.load`` forgets where a value was and silently keeps the last of two equal keys; DeepSpeed itself
(``hjson.load`` with ``dict_raise_error_on_duplicate_keys``) refuses duplicates, while the HF
integrations (``json.load``) keep the last one. This reader does what ``json.load`` does for values and
numbers (``1e9`` is a float, ``NaN``/``Infinity`` accepted) and records positions and duplicates.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.document import Node, line_col, set_paths

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_WS = " \t\n\r"
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_CONSTANTS = {"true": True, "false": False, "null": None, "NaN": float("nan"),
              "Infinity": float("inf"), "-Infinity": float("-inf")}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_MAX_DEPTH = 200


class _Parser:
    def __init__(self, text: str, path: Path) -> None:
        self.text = text
        self.path = path
        self.pos = 0

    def fail(self, message: str, offset: int) -> InputError:
        line, col = line_col(self.text, min(offset, len(self.text)))
        return InputError(f"not valid JSON: {message}", self.path, line, col)

    def skip_ws(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n and text[self.pos] in _WS:
            self.pos += 1

    def parse(self) -> Node:
        self.skip_ws()
        if self.pos >= len(self.text):
            raise self.fail("the file is empty", 0)
        node = self.value(0)
        self.skip_ws()
        if self.pos != len(self.text):
            raise self.fail("extra text after the top-level value", self.pos)
        return node

    def value(self, depth: int) -> Node:
        if depth > _MAX_DEPTH:
            raise self.fail("nested too deeply", self.pos)
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
        line, col = line_col(self.text, start)
        return Node(value, line=line, col=col, start=start, end=self.pos, raw=self.text[start:self.pos])

    def mapping(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        members: dict = {}
        duplicates: List[Tuple[str, Node]] = []
        self.skip_ws()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return self.node(members, start)
        while True:
            self.skip_ws()
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
            child.key_line = line_col(self.text, key_start)[0]
            if key in members:
                duplicates.append((key, members[key]))
            members[key] = child
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            if self.text.startswith("}", self.pos):
                self.pos += 1
                break
            raise self.fail("expected ',' or '}'", self.pos)
        node = self.node(members, start)
        node.duplicates = duplicates
        return node

    def sequence(self, depth: int) -> Node:
        start = self.pos
        self.pos += 1
        items = []
        self.skip_ws()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return self.node(items, start)
        while True:
            items.append(self.value(depth + 1))
            self.skip_ws()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            if self.text.startswith("]", self.pos):
                self.pos += 1
                break
            raise self.fail("expected ',' or ']'", self.pos)
        return self.node(items, start)

    def string(self) -> str:
        text = self.text
        start = self.pos
        self.pos += 1
        out = []
        while True:
            end = self.pos
            while end < len(text) and text[end] not in '"\\' and text[end] >= " ":
                end += 1
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
            esc = text[end + 1:end + 2]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                self.pos = end + 2
            elif esc == "u" and _HEX4.fullmatch(text[end + 2:end + 6] or ""):
                code = int(text[end + 2:end + 6], 16)
                self.pos = end + 6
                low = text[end + 8:end + 12] if text[end + 6:end + 8] == "\\u" else ""
                if 0xD800 <= code <= 0xDBFF and _HEX4.fullmatch(low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
                    code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
                    self.pos = end + 12
                out.append(chr(code))
            else:
                raise self.fail("invalid escape in string", end)

    def scalar(self) -> Node:
        start = self.pos
        for word, val in _CONSTANTS.items():
            if self.text.startswith(word, start):
                self.pos = start + len(word)
                return self.node(val, start)
        m = _NUMBER.match(self.text, start)
        if not m or m.end() == start:
            snippet = self.text[start:start + 20].split("\n")[0]
            raise self.fail(f"unexpected {snippet!r}", start)
        self.pos = m.end()
        raw = m.group(0)
        value = float(raw) if (m.group(1) or m.group(2)) else int(raw)
        return self.node(value, start)


def parse_json(text: str, path: Path) -> Node:
    """Parse JSON text into a Node tree with positions, paths and duplicate keys.

    Raises:
        InputError: with the line and column of the first syntax error.
    """
    root = _Parser(text, path).parse()
    set_paths(root)
    return root
