"""Reading a Python training script: ``ast.parse`` within bounds, never run.

``ast.parse`` is linear, but its memory is about 200 bytes per source byte on hostile input (``1+1+...``:
a 1 MB line takes 217 MB before it fails), and it raises ``MemoryError`` or ``RecursionError`` on deep
expressions (``not not not ... 1``, ``a.b.b.b...``). A tree it does build can still be deeper than the
recursive visitors of the rules can walk. So: a size cap first, those errors turned into one input error,
and the depth of the built tree measured without recursion.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional, Tuple

from zeropilot.errors import InputError

MAX_PYTHON_BYTES = 512 * 1024
MAX_DEPTH = 300


def _depth(tree: ast.AST) -> int:
    """The depth of an AST, walked with an explicit stack; stops counting past :data:`MAX_DEPTH`."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_python(text: str, path: Path) -> Tuple[Optional[ast.Module], Optional[str]]:
    """(tree, None), or (None, why) for a script that is not valid Python for this interpreter.

    A syntax error is not an input error: the script may be written for a newer Python than the one
    running zeropilot; rules about scripts then skip it.

    Raises:
        InputError: the script is larger than :data:`MAX_PYTHON_BYTES`, or nested too deeply to read.
    """
    if len(text) > MAX_PYTHON_BYTES:
        raise InputError(f"a Python file of {len(text) // 1024} KiB: larger than any training script zeropilot "
                         f"reads ({MAX_PYTHON_BYTES // 1024} KiB)", path)
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError) as exc:
        return None, str(exc)
    except (RecursionError, MemoryError):
        raise InputError("Python expression nested too deeply to read", path) from None
    if _depth(tree) > MAX_DEPTH:
        raise InputError(f"Python code nested more than {MAX_DEPTH} levels deep: not read", path)
    return tree, None
