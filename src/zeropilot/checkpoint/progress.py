"""The progress bar of ``ckpt export`` and ``ckpt universal``: tqdm on a terminal, a plain line without it."""

from __future__ import annotations

import sys
from typing import Callable, Optional


def bar(total: int, enabled: Optional[bool], desc: str) -> Callable[[Optional[int]], None]:
    """A function taking the bytes just written (``None`` closes the bar); shown when `enabled`, or when
    stderr is a terminal if `enabled` is None."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return lambda n: None
    try:
        from tqdm import tqdm

        shown = tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr)
        return lambda n: shown.update(n) if n is not None else shown.close()
    except ImportError:
        done = [0]

        def line(n: Optional[int]) -> None:
            if n is None:
                print(file=sys.stderr)
                return
            done[0] += n
            print(f"\r{desc}: {done[0] / 1e9:.2f} / {total / 1e9:.2f} GB", end="", file=sys.stderr)
        return line
