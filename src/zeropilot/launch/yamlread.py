"""A YAML reader that keeps positions and duplicate keys, bounded in memory: PyYAML's parser and safe
constructor, with our own composer.

PyYAML's composer builds its whole node graph before anything can be counted (a 7 MB flow list is
millions of node objects), and expanding its shared alias nodes into a tree is exponential (a 450-byte
"billion laughs" file is 10**9 values). So this module reads PyYAML's *events* one at a time and builds
:class:`Node` values directly, counting every value, aliases expanded, against
:func:`~zeropilot.launch.document.node_budget` (derived from the file's size), and nesting against a
depth of 200. Scalars are typed by PyYAML's own resolver and safe constructor, as ``yaml.safe_load`` types
them; a number longer than 4300 characters is refused (``yaml.safe_load`` raises ``ValueError`` on it).
Only the first document of a stream is read (the config; later ones are not parsed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import yaml

from zeropilot.errors import InputError
from zeropilot.launch.document import Node, node_budget, set_paths

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 200
MAX_NUMBER_CHARS = 4300
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _clone(node: Node) -> Node:
    """A copy of a value's tree, so that each place an alias expands gets its own key paths."""
    value = node.value
    if isinstance(value, dict):
        value = {k: _clone(v) for k, v in value.items()}
    elif isinstance(value, list):
        value = [_clone(v) for v in value]
    return Node(value, line=node.line, col=node.col, start=node.start, end=node.end, key_start=node.key_start,
                key_end=node.key_end, key_line=node.key_line, duplicates=list(node.duplicates), raw=node.raw)


class _Composer:
    """Builds one document's Node tree from parser events, within a value budget and a depth limit."""

    def __init__(self, loader, text: str, path: Path) -> None:
        self.loader = loader
        self.path = path
        self.limit = node_budget(text)
        self.count = 0
        self.anchors: Dict[str, Node] = {}
        self.constructor = yaml.constructor.SafeConstructor()
        self.typed: Dict[tuple, tuple] = {}  # (tag, text, implicit) -> (tag, value): configs repeat values

    def fail(self, message: str, mark=None) -> InputError:
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        return InputError(message, self.path, line, col)

    def spend(self, n: int, mark) -> None:
        self.count += n
        if self.count > self.limit:
            raise self.fail(f"more than {self.limit} values once aliases are expanded: not a launch config "
                            "(the limit grows with the file's size)", mark)

    def node(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.fail("not valid YAML: nested too deeply", self.loader.peek_event().start_mark)
        event = self.loader.get_event()
        if isinstance(event, yaml.AliasEvent):
            return self.alias(event)
        if isinstance(event, yaml.ScalarEvent):
            out = self.scalar(event)
        elif isinstance(event, yaml.SequenceStartEvent):
            out = self.sequence(event, depth)
        else:
            out = self.mapping(event, depth)
        if event.anchor is not None:
            self.anchors[event.anchor] = out
        return out

    def alias(self, event) -> Node:
        target = self.anchors.get(event.anchor)
        if target is None:
            raise self.fail(f"not valid YAML: found undefined alias {event.anchor!r}", event.start_mark)
        self.spend(sum(1 for _ in target.walk()), event.start_mark)
        return _clone(target)

    def scalar(self, event) -> Node:
        self.spend(1, event.start_mark)
        key = (event.tag, event.value, event.implicit)
        typed = self.typed.get(key)
        if typed is None:
            typed = self.typed[key] = self.construct(event)
        start, end = event.start_mark, event.end_mark
        value = typed[1]
        return Node(value, line=start.line + 1, col=start.column + 1, start=start.index, end=end.index,
                    raw=event.value)

    def construct(self, event) -> tuple:
        """(tag, value) of a scalar event, as ``yaml.safe_load`` types it."""
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag in _NUMBER_TAGS and len(event.value) > MAX_NUMBER_CHARS:
            raise self.fail(f"a number of {len(event.value)} characters (yaml.safe_load refuses integers of more "
                            f"than {MAX_NUMBER_CHARS} digits)", event.start_mark)
        ynode = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            return tag, self.constructor.construct_object(ynode, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, IndexError, AttributeError, OverflowError):
            # PyYAML's safe constructor raises plain Python errors on some explicitly tagged scalars
            # ("!!int " with no value: IndexError; "!!timestamp x": AttributeError): keep the text.
            return tag, event.value

    def sequence(self, event, depth: int) -> Node:
        self.spend(1, event.start_mark)
        items = []
        while not self.loader.check_event(yaml.SequenceEndEvent):
            items.append(self.node(depth + 1))
        end = self.loader.get_event().end_mark
        start = event.start_mark
        return Node(items, line=start.line + 1, col=start.column + 1, start=start.index, end=end.index)

    def mapping(self, event, depth: int) -> Node:
        self.spend(1, event.start_mark)
        start = event.start_mark
        out = Node({}, line=start.line + 1, col=start.column + 1, start=start.index)
        while not self.loader.check_event(yaml.MappingEndEvent):
            key_event = self.loader.peek_event()
            key_node = self.node(depth + 1)
            value = self.node(depth + 1)
            if key_node.is_mapping or key_node.is_sequence:
                continue  # a complex key: no launch setting is spelled so
            key = str(key_node.value)
            value.key_start, value.key_end = key_node.start, key_node.end
            value.key_line = key_event.start_mark.line + 1
            if key in out.value:
                out.duplicates.append((key, out.value[key]))
            out.value[key] = value
        out.end = self.loader.get_event().end_mark.index
        return out

    def document(self):
        """The first document's root Node, or None for an empty stream."""
        self.loader.get_event()  # StreamStart
        if self.loader.check_event(yaml.StreamEndEvent):
            return None
        self.loader.get_event()  # DocumentStart
        return self.node(0)


def parse_yaml(text: str, path: Path) -> Node:
    """Parse the first YAML document of ``text`` into a Node tree with positions.

    Raises:
        InputError: with the line and column of the syntax error or exceeded limit.
    """
    loader = _Loader(text)
    try:
        root = _Composer(loader, text, path).document()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = (exc.problem or str(exc)).strip()
        raise InputError(f"not valid YAML: {problem}", path, line, col) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise InputError(f"not valid YAML: {str(exc).splitlines()[0]}", path) from None
    finally:
        loader.dispose()
    if root is None:  # no document (empty, or comments only): None, as yaml.safe_load reads it
        return Node(None, line=1, col=1, start=0, end=0)
    set_paths(root)
    return root
