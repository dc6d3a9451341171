"""Where a value of a launch came from: its file, line and key, and the words ``plan`` prints beside it.

One record for every value the launch gives the plan (:mod:`zeropilot.launch.planfacts`) and every memory-relevant
setting (:class:`zeropilot.launch.settings.Setting`), so a program can point at the line and a person reads the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass(frozen=True)
class Source:
    """Where a value came from.

    Attributes:
        text: as printed: ``ds.json:19 zero_optimization.stage``, followed by why when the launch implies the value
            rather than says it (``train.yaml (LLaMA-Factory enables it by default)``), or only why when no file
            says it (``LLaMA-Factory's default: LoRA r8``).
        file: the file that says it, None when none does.
        line: its line, None when unknown.
        key: the key path, variable or call as written (``zero_optimization.stage``, ``ROCR_VISIBLE_DEVICES``,
            ``LoraConfig(r=...)``), empty when no key says it.
    """

    text: str
    file: Optional[Path] = None
    line: Optional[int] = None
    key: str = ""


def at(file: Any, line: Optional[int], key: str, why: str = "") -> Source:
    """``file:line key`` (``file key`` without a line), then `why` as written (with its own separator)."""
    where = f"{file}:{line}" if line else f"{file}"
    return Source(f"{where} {key}{why}", Path(file), line or None, key)


def implied(file: Any, why: str, line: Optional[int] = None, key: str = "") -> Source:
    """A value the launch implies: ``file (why)``."""
    return Source(f"{file} ({why})", Path(file), line, key)
