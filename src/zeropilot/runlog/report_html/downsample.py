"""Downsampling for display that keeps every extreme: the lowest and highest point of each bucket.

A chart is about a thousand pixels wide; 100k steps do not fit in it. Averaging would smooth a
one-step spike away, and a spike is what a memory chart is for, so each bucket of x keeps its
minimum and its maximum, in the order they happened (as in the M4 method of Jugel et al., 2014,
without the first/last points). A line through them passes through every peak and every trough.
Hand-written because it is fifteen lines and numpy is not a dependency of the core.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

Point = Tuple[float, float]


def bucket_index(xs: Sequence[float], x0: float, x1: float, buckets: int) -> List[int]:
    """Bucket of each x in ``[x0, x1]`` (shared by every series that has these x values)."""
    scale = buckets / (x1 - x0) if x1 > x0 else 0.0
    last = buckets - 1
    try:  # the usual case, every x finite and inside the range: one plain pass
        fast = [int((x - x0) * scale) for x in xs]
        if not fast or (min(fast) >= 0 and max(fast) <= last):
            return fast
        if min(fast) >= 0 and max(fast) == buckets:  # x == x1 exactly lands one past the end
            return [b if b < buckets else last for b in fast]
    except ValueError:  # a NaN
        pass
    return [min(last, max(0, int((x - x0) * scale))) if x == x else -1 for x in xs]


def minmax(xs: Sequence[float], ys: Sequence[float], index: Optional[List[int]], buckets: int) -> List[Point]:
    """The min and max point of each bucket, in x order; NaN values are skipped.

    With ``index`` None (few points) every finite point is kept.
    """
    if index is None:
        return [(x, y) for x, y in zip(xs, ys) if not (math.isnan(x) or math.isnan(y))]
    lo: List[int] = [-1] * buckets
    hi: List[int] = [-1] * buckets
    for i, (b, y) in enumerate(zip(index, ys)):
        if b < 0 or y != y:  # y != y: NaN
            continue
        j = lo[b]
        if j < 0:
            lo[b] = hi[b] = i
        elif y < ys[j]:
            lo[b] = i
        elif y > ys[hi[b]]:
            hi[b] = i
    out: List[Point] = []
    for a, b in zip(lo, hi):
        if a < 0:
            continue
        for i in ((a, b) if a < b else (b, a) if a != b else (a,)):
            out.append((xs[i], ys[i]))
    return out
