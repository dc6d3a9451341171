"""Fit the estimator's ``fit_*`` constants and ``step_temp`` on the TUNING split only.

Coordinate descent over a grid, minimising the mean squared relative error of predicted
``gpu_peak_bytes`` against measured ``peak_reserved + non_torch`` on the tuning rows (see rows.py).
Prints the fitted constants, to be copied into ``src/zeropilot/memory/constants.py``. A constant that no row of the
split depends on (their peaks now come from the allocator replay, ``memory/segments.py``, which does not read it) is
named as such and keeps its value: the rows no longer constrain it, so a "fitted" value would be the grid's edge.
Usage: python bench/plan/fit.py          (tuning split: the original constants)
       python bench/plan/fit.py --x2     (x2-fit split: fit_gap_sub, fit_gap_gather, fit_live)
"""
from __future__ import annotations

import dataclasses
import statistics

from rows import load_rows

from zeropilot.memory.constants import DEFAULT
from zeropilot.memory.gpu import estimate_gpu

FREE = {"step_temp": (0.0, 12.0), "fit_act": (0.5, 1.6), "fit_logits": (0.5, 1.6), "fit_gap_state": (0.0, 0.6),
        "fit_gap_trans": (0.0, 0.6), "fit_gap_overlap": (0.0, 20.0)}
# issue 14: fitted on the x2-fit rows only (they alone gather parameters, the only place these act)
FREE_X2 = {"fit_gap_sub": (0.0, 4.0), "fit_gap_gather": (0.0, 4.0), "fit_live": (0.0, 1.0)}


def loss(consts, rows) -> float:
    errs = [estimate_gpu(r.inputs, consts).peak_bytes / r.measured_bytes - 1 for r in rows]
    return sum(e * e for e in errs) / len(errs)


def fit(rows, start=DEFAULT, rounds: int = 6, steps: int = 41, free=FREE):
    best = start
    for _ in range(rounds):
        for name, (lo, hi) in free.items():
            grid = [lo + (hi - lo) * k / (steps - 1) for k in range(steps)]
            best = min((dataclasses.replace(best, **{name: v}) for v in grid), key=lambda c: loss(c, rows))
    return best


def constrained(rows, free) -> dict:
    """The constants of ``free`` the rows' loss depends on (over their range, the others as they are)."""
    out = {}
    for name, (lo, hi) in free.items():
        values = {round(loss(dataclasses.replace(DEFAULT, **{name: v}), rows), 12)
                  for v in (lo, (lo + hi) / 2, hi, getattr(DEFAULT, name))}
        if len(values) > 1:
            out[name] = (lo, hi)
    return out


def show(best, free, acting) -> None:
    for name in free:
        if name in acting:
            print(f"    {name}: float = {getattr(best, name):.4g}")
        else:
            print(f"    {name}: no row depends on it; kept at {getattr(DEFAULT, name):.4g}")


def main() -> None:
    if "--x2" in __import__("sys").argv:
        return main_x2()
    rows = [r for r in load_rows() if r.split == "tuning" and r.ok]
    before = loss(DEFAULT, rows)
    acting = constrained(rows, FREE)
    best = fit(rows, free=acting) if acting else DEFAULT
    errs = [abs(estimate_gpu(r.inputs, best).peak_bytes / r.measured_bytes - 1) for r in rows]
    print(f"tuning rows: {len(rows)}; mean squared rel. error {before:.4f} (current constants) "
          f"-> {loss(best, rows):.4f}")
    print(f"tuning median |err| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}%")
    show(best, FREE, acting)


def main_x2() -> None:
    """``--x2``: the issue-14 constants on the x2-fit rows (the older constants stay as fitted)."""
    rows = [r for r in load_rows() if r.split == "x2-fit" and r.ok]
    acting = constrained(rows, FREE_X2)
    best = fit(rows, free=acting) if acting else DEFAULT
    errs = [abs(estimate_gpu(r.inputs, best).peak_bytes / r.measured_bytes - 1) for r in rows]
    print(f"x2-fit rows: {len(rows)}; mean squared rel. error {loss(DEFAULT, rows):.4f} -> {loss(best, rows):.4f}; "
          f"median |err| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}%")
    show(best, FREE_X2, acting)


if __name__ == "__main__":
    main()
