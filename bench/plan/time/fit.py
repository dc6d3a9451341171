"""Fit the time model's fitted constants (``memory/steptime.py`` ``TimeConstants``: the host costs ``host_forward``,
``host_backward``, ``grad_hook``, ``step_tensor``, ``zero3_fetch``, ``zero3_module``) on a call's fit rows, and
compare any rows with the model.

usage: python bench/plan/time/fit.py ROWS.jsonl PROFILE.json [--fit] [--split fit|holdout|all]

ROWS: what ``run_rows.py`` wrote (one probe result per line, the spec inside); PROFILE: the profile ``zeropilot
calibrate`` wrote in the same call (the card's measured speed figures). Without ``--fit`` it prints each row's
measured and predicted step time with the committed constants; with ``--fit`` it also minimises the squared log
error over the fit rows, of the step and (half weight) of each phase the probe timed with CUDA events (Nelder-Mead
on the logs of the seven constants, no other value touched) and prints the
constants and every row again with them. The printed constants go into ``TimeConstants`` by hand, with this command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "src"))

from zeropilot.memory.inputs import GIB, Hardware, PlanInputs  # noqa: E402
from zeropilot.memory.profile import load  # noqa: E402
from zeropilot.memory.speed import Speed, speed_for  # noqa: E402
from zeropilot.memory.steptime import TIME_DEFAULT, TimeConstants, estimate_time  # noqa: E402
from zeropilot.models.arch import from_config  # noqa: E402

FITTED = ("host_forward", "host_backward", "grad_hook", "step_tensor", "offload_hook", "zero3_fetch", "zero3_module",
          "zero3_fetch_backward", "zero3_module_backward")
#: the probe's CUDA-event phases (``phase_ms``) and the model's
PHASES = {"fwd": "forward", "bwd": "backward", "opt": "step"}


def inputs_of(spec: dict, total_gb: float = 80.0) -> PlanInputs:
    """The plan inputs of a timing spec (``matrix.py``): the probe's settings as a launch would say them."""
    from zeropilot.launch.settings import Freeze

    arch = from_config(spec["model"], spec.get("name", ""))
    gpu = spec.get("cap_gib") or total_gb
    ws = int(spec.get("ws", 1))
    offload = bool(spec.get("offload"))
    return PlanInputs(
        arch=arch, hardware=Hardware(ws, int(gpu * GIB), 1, f"{ws}x{gpu}GiB"), stage=spec["stage"],
        micro_batch=spec["mb"], seq_len=spec["seq"], grad_accum=int(spec.get("ga", 1)),
        gradient_checkpointing=bool(spec.get("gc")), lora_rank=spec.get("lora") or None,
        modules_to_save=tuple(spec.get("mts") or ()),
        offload_optimizer="cpu" if offload else "none", offload_param="cpu" if spec.get("offload_param") else "none",
        # the GPU step: torch's foreach AdamW only with the config's torch_adam ("torch"); fused otherwise (the HF
        # Trainer's adamw_torch_fused, DeepSpeed's FusedAdam); offloaded: CPUAdam unless torch's AdamW
        torch_adam=spec.get("adam") == "torch" or (offload and spec.get("adam") not in ("cpu",) and
                                                   not spec.get("cpu_adam")),
        overlap_comm=bool(spec.get("overlap", False)), fused_loss="liger" if spec.get("liger") else None,
        # the probe's DeepSpeed settings (zero_mem_probe_plan.py), not DeepSpeed's defaults
        reduce_bucket_size=int(spec.get("rbs", 5e8)), prefetch_bucket_size=int(spec.get("pbs", 5e8)),
        param_persistence_threshold=int(spec.get("ppt", 1e6)), attn=spec.get("attn", "sdpa"),
        zero_init=bool(spec.get("zero_init")), max_live_parameters=int(spec.get("mlp", 1e9)),
        sub_group_size=int(spec.get("sgs", 1e9)), freeze=Freeze(int(spec["freeze"])) if spec.get("freeze") else None,
        expandable_segments="expandable_segments:true" in str(spec.get("alloc_conf", "")).lower(),
        kv_cache=True)  # the probe calls the engine without use_cache=False (bench/plan/rows.py spec_inputs)


def measured_rows(path: Path, split: str) -> List[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        spec = r.get("spec") or {}
        if r.get("status") != "ok" or not r.get("step_median_s"):
            continue
        if split != "all" and spec.get("split") != split:
            continue
        rows.append(r)
    return rows


def measured_phases(r: dict) -> dict:
    """The median of each CUDA-event phase over the timed steps (after the warm-up), seconds."""
    ph = r.get("phase_ms") or {}
    warm = int(r["spec"].get("warmup", 0))
    return {PHASES[k]: statistics.median(v[warm:]) / 1e3 for k, v in ph.items() if k in PHASES and v[warm:]}


def predict(rows: Sequence[dict], speed: Speed, c: TimeConstants) -> List[Tuple[str, float, float, dict, dict]]:
    out = []
    for r in rows:
        spec = r["spec"]
        p = estimate_time(inputs_of(spec, r.get("total_gpu_gb", 80.0)), speed, c)
        out.append((spec.get("row", spec.get("name", "?")), r["step_median_s"], p.step_s, measured_phases(r),
                    p.phases()))
    return out


def loss(rows: Sequence[dict], speed: Speed, c: TimeConstants) -> float:
    total = 0.0
    for _, meas, pred, mph, pph in predict(rows, speed, c):
        total += math.log(pred / meas) ** 2
        total += 0.5 * sum(math.log(max(pph[k], 1e-6) / v) ** 2 for k, v in mph.items() if v > 0)
    return total


def nelder_mead(f: Callable[[List[float]], float], x0: List[float], step: float = 0.5, iters: int = 400
                ) -> List[float]:
    """Minimise ``f`` from ``x0`` (the logs of the constants): the textbook simplex, enough for four parameters."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centre = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centre, worst)]
        fr = f(refl)
        if fr < values[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            fc = f(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s)] for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda i: values[i])]


def fit(rows: Sequence[dict], speed: Speed, base: TimeConstants = TIME_DEFAULT) -> TimeConstants:
    x0 = [math.log(getattr(base, name)) for name in FITTED]

    def of(x: List[float]) -> TimeConstants:
        return dataclasses.replace(base, **{name: math.exp(v) for name, v in zip(FITTED, x)})

    return of(nelder_mead(lambda x: loss(rows, speed, of(x)), x0))


def table(rows: Sequence[dict], speed: Speed, c: TimeConstants, title: str) -> List[str]:
    out = [f"## {title}", "", "| row | measured s | predicted s | error | forward | backward | step |",
           "|---|---|---|---|---|---|---|"]
    errs = []
    for name, meas, pred, mph, pph in predict(rows, speed, c):
        err = 100 * (pred / meas - 1)
        errs.append(abs(err))
        cells = [f"{mph.get(k, float('nan')):.3f} / {pph[k]:.3f}" for k in ("forward", "backward", "step")]
        out.append(f"| {name} | {meas:.3f} | {pred:.3f} | {err:+.1f}% | " + " | ".join(cells) + " |")
    if errs:
        out.append(f"\nmedian |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}% ({len(errs)} rows)")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path)
    ap.add_argument("profile")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--split", default="fit", choices=["fit", "holdout", "all"])
    args = ap.parse_args(argv)
    speed = speed_for(None, load(args.profile))
    rows = measured_rows(args.rows, args.split)
    print("\n".join(table(rows, speed, TIME_DEFAULT, "committed constants (phases: measured / predicted s)")))
    if args.fit:
        c = fit(rows, speed)
        print("\nfitted: " + ", ".join(f"{name}={getattr(c, name):.4g}" for name in FITTED))
        print("\n".join(table(rows, speed, c, "fitted constants")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
