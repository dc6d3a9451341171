"""What a fix is: text edits with an applicability. Rules build these; ``zeropilot check --fix`` applies them.

Kept apart from the rules (which import it) so that ``fix`` never imports ``rules``: layers import downwards.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple


class Applicability(str, enum.Enum):
    """How far a fix can be trusted: ``--fix`` applies only safe ones."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    DISPLAY = "display"


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` of ``file`` with ``replacement``."""

    file: Path
    start: int
    end: int
    replacement: str


@dataclass
class Fix:
    """A described set of edits and how far they can be trusted."""

    description: str
    applicability: Applicability
    edits: Tuple[Edit, ...] = ()
