"""Plan accuracy at world size 2 (two H200s, NCCL): predicted per-GPU peak against each rank's measured
``peak_reserved + non_torch`` (``h200x2_probe.jsonl``, made by ``bench/plan/run_multigpu.sh`` with
``bench/plan/specs/multigpu_x2.jsonl``). None of these rows was used to fit any constant.

    python bench/multigpu/accuracy_x2.py        # prints the table and writes results_x2.{json,md}
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bench" / "plan"))

from rows import _measured, spec_inputs  # noqa: E402
from zeropilot.memory.inputs import GIB, Hardware  # noqa: E402
from zeropilot.memory.plan import make_plan  # noqa: E402


def main() -> int:
    records = []
    for line in (HERE / "h200x2_probe.jsonl").read_text().splitlines():
        r = json.loads(line)
        ws = r["world_size"]
        inputs = spec_inputs(r["spec"], r["total_gpu_gb"])
        inputs = dataclasses.replace(inputs, hardware=Hardware(ws, int(r["total_gpu_gb"] * GIB), 1,
                                                               f"{ws}x{r['total_gpu_gb']:.1f}GiB"))
        predicted = make_plan(inputs).gpu_peak_bytes
        measured = _measured(r)
        s = r["spec"]
        label = f"{s['name']} z{s['stage']} mb{s['mb']} s{s['seq']}" + (f" lora{s['lora']}" if s.get("lora") else "")
        records.append({"label": label, "rank": r["rank"], "world_size": ws,
                        "measured_gib": measured / GIB, "predicted_gib": predicted / GIB,
                        "error": (predicted - measured) / measured,
                        "non_torch_gib": r["non_torch_gb"], "ds_estimate_gib": r["ds_estimate_gpu_gb"],
                        "ds_error": (r["ds_estimate_gpu_gb"] * 2**30 - measured) / measured})
    errs = [abs(x["error"]) for x in records]
    ds_errs = [abs(x["ds_error"]) for x in records]
    summary = {"rows": len(records), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
               "ds_median_abs_error": statistics.median(ds_errs), "ds_max_abs_error": max(ds_errs)}
    lines = ["| configuration | rank | measured GiB | predicted GiB | error | outside PyTorch GiB | DeepSpeed's estimate error |",
             "|---|---|---|---|---|---|---|"]
    for x in records:
        lines.append(f"| {x['label']} | {x['rank']}/{x['world_size']} | {x['measured_gib']:.2f} | "
                     f"{x['predicted_gib']:.2f} | {x['error']:+.1%} | {x['non_torch_gib']:.2f} | {x['ds_error']:+.1%} |")
    lines.append(f"\nmedian |error| {summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%} "
                 f"(DeepSpeed's estimator: {summary['ds_median_abs_error']:.1%} / {summary['ds_max_abs_error']:.1%})")
    md = "\n".join(lines) + "\n"
    (HERE / "results_x2.md").write_text(md)
    (HERE / "results_x2.json").write_text(json.dumps({"summary": summary, "rows": records}, indent=2) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
