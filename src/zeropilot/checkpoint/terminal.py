"""Make text that came from a checkpoint safe to print on a terminal.

Tag names, ``latest``, ``ds_version``, tensor names and file names are written by whoever made the
checkpoint. Printed raw, an escape sequence in one of them can rewrite the screen, set the window
title, hide the verdict line or, on some terminals, answer back into the shell. Every control
character (C0, DEL, C1), bidirectional and other format characters, line and paragraph separators
and lone surrogates are shown as Python escapes (``\\x1b``, ``\\u202e``); everything else is kept.
"""

from __future__ import annotations

import unicodedata

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def clean(text: object) -> str:
    """`text` (any object, via ``str``) with every character a terminal might act on escaped."""
    s = str(text)
    if s.isprintable() and s.isascii():
        return s
    return "".join(_escape(c) if _unsafe(c) else c for c in s)


def _unsafe(c: str) -> bool:
    if c == " ":
        return False
    return unicodedata.category(c) in _UNSAFE_CATEGORIES


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
