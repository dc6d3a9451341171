"""Issue 26: the plan's pre-registered predictions for one GPU call (``data/CALL/predictions.jsonl``, written by
``specs.py`` before the call) against the H200 measurement of the same rows (``device.sh``'s ``probe.jsonl``,
committed as ``data/CALL/h200.jsonl``), row by row:
PyTorch's peak allocated and reserved (the larger of the init and the training phase, as ``rows.py`` measures), and
the nvidia-smi peak (reserved + memory outside PyTorch, NVML's per process figure since the rows ran several at a
time). Error = predicted / measured - 1.
``--now``: the current plan's predictions of the same specs instead, as the rows ran (``data/CALL/as_run.json``
names what a row ran with that its spec did not say): post hoc, a check of a fix, not evidence.
``--pred NAME``: the predictions in ``data/CALL/NAME`` (a candidate's, committed beside the plan's before the call).
Usage: python bench/plan/settings/compare.py [CALL] [--now] [--json] [--pred NAME]   (CALL: call1, call2 ...; default
the last measured)
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rows import _measured  # noqa: E402

from zeropilot.memory.inputs import GIB  # noqa: E402


def _peaks(r: dict) -> dict:
    snaps = {s["tag"]: s for s in r.get("snaps", [])}
    phases = [snaps[t] for t in ("after_init", "steady") if t in snaps]
    out = {"allocated": max(s["peak_alloc"] for s in phases), "reserved": max(s["peak_reserved"] for s in phases)}
    peak = _measured(r)
    if peak is not None:
        out["peak"] = peak / GIB
    return out


def _err(pred: float, meas: float) -> float:
    return round(100 * (pred / meas - 1), 1)


def compare(preds: list, measured: dict) -> list:
    """One record per pre-registered row: predicted, measured and error for each quantity (None: not measured)."""
    out = []
    for p in preds:
        rec = {"row": p["row"], "what": p["what"], "not_modelled": p["not_modelled"], "split": p.get("split")}
        r = measured.get(p["row"])
        rec["status"] = "not run" if r is None else r.get("status", "?")
        m = _peaks(r) if r is not None and r.get("status") == "ok" else {}
        for q in ("allocated", "reserved", "peak"):
            pred = p[f"predicted_{q}_gib"]
            rec[q] = {"predicted": pred, "measured": round(m[q], 3) if q in m else None,
                      "error_pct": _err(pred, m[q]) if q in m else None}
        if r is not None:
            rec["trainable"] = {"predicted": p["trainable"], "measured": r.get("n_trainable")}
        out.append(rec)
    return out


def render(recs: list) -> str:
    lines = ["| row | status | allocated pred / meas (err) | reserved pred / meas (err) | peak pred / meas (err) | "
             "trainable pred / meas |", "|---|---|---|---|---|---|"]
    cell = lambda x: ("—" if x["measured"] is None else
                      f"{x['predicted']:.2f} / {x['measured']:.2f} ({x['error_pct']:+.1f}%)")
    for r in recs:
        t = r.get("trainable") or {}
        lines.append(f"| {r['row']} | {r['status']} | {cell(r['allocated'])} | {cell(r['reserved'])} | "
                     f"{cell(r['peak'])} | {t.get('predicted', '—')} / {t.get('measured', '—')} |")
    splits = sorted({r["split"] for r in recs if r.get("split")})
    for split in [None] + splits:  # every row, then each split declared before the call
        errs = [r["peak"]["error_pct"] for r in recs if r["peak"]["error_pct"] is not None
                and (split is None or r.get("split") == split)]
        if errs:
            absolute = [abs(e) for e in errs]
            name = "peak" if split is None else f"peak, {split}"
            lines += ([""] if split is None else []) + [
                f"{name}: {len(errs)} rows measured, median abs error {statistics.median(absolute):.1f}%, max "
                f"{max(absolute):.1f}% (from {min(errs):+.1f}% to {max(errs):+.1f}%)"]
    return "\n".join(lines)


def main(argv) -> int:
    args = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--pred")]
    calls = sorted(p.parent.name for p in (HERE / "data").glob("call*/h200.jsonl"))
    call = HERE / "data" / (args[0] if args else calls[-1])
    name = argv[argv.index("--pred") + 1] if "--pred" in argv else "predictions.jsonl"  # or a candidate's
    preds = [json.loads(x) for x in (call / name).read_text().splitlines() if x]
    if "--now" in argv:
        from specs import prediction

        as_run = json.loads((call / "as_run.json").read_text())["rows"] if (call / "as_run.json").is_file() else {}
        what = {p["row"]: p["what"] for p in preds}
        specs = [json.loads(x) for x in (call / "specs.jsonl").read_text().splitlines() if x]
        preds = [prediction(s["row"], what[s["row"]], {**s, **as_run.get(s["row"], {})}) for s in specs]
    measured = {}
    for line in open(call / "h200.jsonl"):
        if line.strip():
            r = json.loads(line)
            measured[r["spec"].get("row")] = r
    recs = compare(preds, measured)
    print(render(recs) if "--json" not in argv else json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
