"""A YAML reader that keeps positions and duplicate keys (PyYAML's composer, safe constructor)."""

from __future__ import annotations

from pathlib import Path

import yaml

from zeropilot.errors import InputError
from zeropilot.launch.document import Node, set_paths

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAX_DEPTH = 200


def _scalar(node: yaml.ScalarNode, constructor: yaml.constructor.SafeConstructor):
    try:
        return constructor.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, IndexError, AttributeError, OverflowError):
        # PyYAML's safe constructor raises plain Python errors on some explicitly tagged scalars
        # ("!!int " with no value: IndexError; "!!timestamp x": AttributeError): keep the text.
        return node.value


def _convert(node: yaml.Node, constructor, depth: int, path: Path) -> Node:
    if depth > _MAX_DEPTH:
        raise InputError("not valid YAML: nested too deeply", path, node.start_mark.line + 1)
    start, end = node.start_mark.index, node.end_mark.index
    line, col = node.start_mark.line + 1, node.start_mark.column + 1
    if isinstance(node, yaml.MappingNode):
        members: dict = {}
        out = Node(members, line=line, col=col, start=start, end=end)
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = str(_scalar(key_node, constructor))
            child = _convert(value_node, constructor, depth + 1, path)
            child.key_start, child.key_end = key_node.start_mark.index, key_node.end_mark.index
            child.key_line = key_node.start_mark.line + 1
            if key in members:
                out.duplicates.append((key, members[key]))
            members[key] = child
        return out
    if isinstance(node, yaml.SequenceNode):
        items = [_convert(v, constructor, depth + 1, path) for v in node.value]
        return Node(items, line=line, col=col, start=start, end=end)
    raw = node.value
    return Node(_scalar(node, constructor), line=line, col=col, start=start, end=end, raw=raw)


def parse_yaml(text: str, path: Path) -> Node:
    """Parse the first YAML document of ``text`` into a Node tree with positions.

    Raises:
        InputError: with the line and column of the syntax error.
    """
    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.composer.ComposerError as exc:
            if "single document" not in str(exc.context or ""):
                raise
            loader.dispose()  # several documents: the first one is the config
            loader = _Loader(text)
            root = loader.get_node() if loader.check_node() else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        col = mark.column + 1 if mark else None
        problem = (exc.problem or str(exc)).strip()
        raise InputError(f"not valid YAML: {problem}", path, line, col) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise InputError(f"not valid YAML: {str(exc).splitlines()[0]}", path) from None
    try:
        if root is None:
            return Node({}, line=1, col=1, start=0, end=0)
        constructor = yaml.constructor.SafeConstructor()
        out = _convert(root, constructor, 0, path)
    except RecursionError:
        raise InputError("not valid YAML: nested too deeply", path) from None
    finally:
        loader.dispose()
    set_paths(out)
    return out
