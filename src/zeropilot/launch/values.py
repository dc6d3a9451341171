"""Plain value helpers of the launch-facts layer: whether a setting is on, and whole numbers.

Kept apart from :mod:`zeropilot.launch.facts` (which re-exports them) so that :mod:`zeropilot.launch.settings`, which
facts builds on, can use them too.
"""

from __future__ import annotations

from typing import Any, Optional

# transformers' string_to_bool words, plus YAML 1.1 on/off and env-file conventions.
_TRUE = frozenset({"true", "t", "1", "yes", "y", "on"})
_FALSE = frozenset({"false", "f", "0", "no", "n", "off", ""})


def truthy(value: Any) -> Optional[bool]:
    """Whether a setting is on: booleans, 0/1, and the strings flags, env files and YAML 1.1 use.

    Returns None for anything else (``"auto"``, a mapping, ``None``): the caller decides what unknown means.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    return None


def as_int(value: Any) -> Optional[int]:
    """A whole number (``1e9`` counts, ``True`` does not) as an int, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (value == value and value.is_integer()):
        return None
    return int(value)


def positive_int(value: Any) -> Optional[int]:
    """A count a launch gives (a batch, a length, a bucket size): a whole number above 0, or a string of digits, as
    an int; else None (``True``, ``0``, ``"auto"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, float) and value.is_integer() and value > 0:  # not inf or nan (JSON's 1e999)
        return int(value)
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) <= 30:  # int() refuses "²"
        return int(value)
    return None
