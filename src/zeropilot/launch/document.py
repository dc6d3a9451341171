"""A read configuration file: values with the file, key path, line and text span they came from.

Every reader (JSON, YAML, flags on a command line) produces a :class:`Document` whose values are
:class:`Node` objects, so a rule can say *where* a setting is and a fix can replace exactly its text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

_MISSING = object()


@dataclass
class Node:
    """One value of a configuration file.

    Attributes:
        value: the plain Python value for scalars; for mappings a ``dict`` of key -> Node (last one wins,
            as ``json.load`` and ``yaml.safe_load`` do); for sequences a ``list`` of Node.
        path: dotted key path inside the file (``zero_optimization.stage``); list items as ``[i]``.
        line, col: 1-based position of the value's first character; ``None`` when not from a file.
        start, end: character offsets of the value's text in the file, for fixes.
        key_start, key_end: character offsets of the key (with its quotes) for mapping members.
        key_line: line of the key for mapping members.
        duplicates: for mappings, members whose key appeared more than once, in order, earlier ones first.
        raw: the source text of a scalar (``1e9``, ``"auto"``) as written.
    """

    value: Any
    path: str = ""
    line: Optional[int] = None
    col: Optional[int] = None
    start: Optional[int] = None
    end: Optional[int] = None
    key_start: Optional[int] = None
    key_end: Optional[int] = None
    key_line: Optional[int] = None
    duplicates: List[Tuple[str, "Node"]] = field(default_factory=list)
    raw: Optional[str] = None

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.value, list)

    def child(self, key: str) -> Optional["Node"]:
        if isinstance(self.value, dict):
            return self.value.get(key)
        return None

    def plain(self) -> Any:
        """The value with every Node unwrapped, as ``json.load`` would return it."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value

    def walk(self) -> Iterator["Node"]:
        """This node and every node below it, depth first."""
        yield self
        if isinstance(self.value, dict):
            for v in self.value.values():
                yield from v.walk()
        elif isinstance(self.value, list):
            for v in self.value:
                yield from v.walk()


@dataclass
class Document:
    """A configuration file as read.

    Attributes:
        path: the file (for flags: the script that holds the command line).
        kind: ``ds_config``, ``train_args``, ``accelerate``, or ``other``.
        fmt: ``json``, ``yaml`` or ``flags``.
        root: the top-level mapping.
        text: the file's text, kept for fixes.
        flavour: for ``train_args``: ``llamafactory``, ``hf`` or ``axolotl``; for flags, the launcher.
        relaxed: for JSON, where the file uses what DeepSpeed's hjson loader accepts but ``json.load`` refuses
            (comments, trailing commas), as (line, what); the first few only.
    """

    path: Path
    kind: str
    fmt: str
    root: Node
    text: str = ""
    flavour: Optional[str] = None
    relaxed: List[Tuple[int, str]] = field(default_factory=list)

    def get(self, dotted: str) -> Optional[Node]:
        """The node at a dotted key path, or None when any part is absent."""
        node: Optional[Node] = self.root
        for part in dotted.split("."):
            if node is None or not isinstance(node.value, dict):
                return None
            node = node.value.get(part)
        return node

    def value(self, dotted: str, default: Any = None) -> Any:
        node = self.get(dotted)
        return default if node is None else node.plain()

    def has(self, dotted: str) -> bool:
        return self.get(dotted) is not None

    @property
    def name(self) -> str:
        return str(self.path)


def set_paths(node: Node, prefix: str = "") -> None:
    """Fill in each node's dotted path from its position in the tree."""
    node.path = prefix
    if isinstance(node.value, dict):
        for key, child in node.value.items():
            set_paths(child, f"{prefix}.{key}" if prefix else key)
        for key, dup in node.duplicates:
            set_paths(dup, f"{prefix}.{key}" if prefix else key)
    elif isinstance(node.value, list):
        for i, child in enumerate(node.value):
            set_paths(child, f"{prefix}[{i}]")


def line_col(text: str, offset: int) -> Tuple[int, int]:
    """1-based line and column of a character offset (one scan of the text: use :class:`LineIndex` for many)."""
    line = text.count("\n", 0, offset) + 1
    last_nl = text.rfind("\n", 0, offset)
    return line, offset - last_nl


class LineIndex:
    """Line and column of any offset in O(log lines), after one linear scan of the text.

    Readers ask for a position per value; counting newlines each time made reading quadratic
    (a 1 MB JSON file took a minute).
    """

    __slots__ = ("_starts",)

    def __init__(self, text: str) -> None:
        self._starts = [0]
        self._starts.extend(m.end() for m in _NEWLINE.finditer(text))

    def line_col(self, offset: int) -> Tuple[int, int]:
        """1-based (line, column) of a character offset."""
        i = bisect_right(self._starts, offset) - 1
        return i + 1, offset - self._starts[i] + 1

    def line(self, offset: int) -> int:
        return bisect_right(self._starts, offset)


_NEWLINE = re.compile("\n")
MAX_NODES = 50_000


def node_budget(text: str) -> int:
    """How many values a file of this size may hold once read (aliases expanded).

    Without aliases a value takes at least two characters, so ``len(text)`` is never reached by an honest
    file; YAML aliases may repeat values, but not beyond this (a 450-byte file expanded to 10**9 values).
    Capped at :data:`MAX_NODES`, far above any launch config (the largest file of the public corpus holds 106
    values) and low enough that reading stays under about a second (bench/check/readers.json).
    """
    return min(MAX_NODES, len(text) + 10_000)


def from_plain(value: Any, path: str = "") -> Node:
    """A Node tree for a value that has no file position (defaults, values built by code)."""
    if isinstance(value, dict):
        node = Node({k: from_plain(v) for k, v in value.items()})
    elif isinstance(value, list):
        node = Node([from_plain(v) for v in value])
    else:
        node = Node(value)
    set_paths(node, path)
    return node


def flat_items(doc: Document) -> Dict[str, Node]:
    """Top-level members of a document, key -> node."""
    return dict(doc.root.value) if isinstance(doc.root.value, dict) else {}
