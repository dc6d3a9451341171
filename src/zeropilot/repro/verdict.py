"""From the ranks' result files to the repro verdict: is the resume exact, what differs, what the saves cost.

Pure (reads JSON written by :mod:`zeropilot.repro.worker`); no torch. The verdict's JSON (schema
:data:`SCHEMA`) is what ``zeropilot repro --format json`` prints and ``DIR/repro.json`` holds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.repro.spec import PARTS, ReproSpec

SCHEMA = "zeropilot.repro/1"
TOLERANCE_WHY = ("GPU kernels may add in a different order from run to run (atomics in attention and embedding "
                 "backward, NCCL's algorithm choice), which moves a bf16 value by one unit in the last place "
                 "(0.4 %): states within 1e-2 of their largest value and losses within 1e-3 count as equal; a "
                 "part left out of a resume (fresh Adam moments, a restarted schedule) differs by far more")
UNIVERSAL_WHY = ("on another number of ranks the gradient is summed over other ranks and partitions in another order, "
                 "so values differ in their last bits (fp32) or, once a weight is rounded to bf16 for the next "
                 "forward, by a bf16 unit in the last place (0.4 %); losses are compared per step (the mean over all "
                 "ranks' micro-batches: the same samples), weights and Adam's moments per parameter relative to the "
                 "largest value of each, from both runs' final checkpoints. A part left out (fresh moments, a "
                 "restarted schedule) differs by orders of magnitude more")


MAX_RESULT_BYTES = 256 << 20  # a rank's result: losses and memory per step, a few KB per step


def _read(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = safefile.read_json(path, MAX_RESULT_BYTES)
    except InputError:
        return None
    return data if isinstance(data, dict) else None


def _results(root: Path, leg: int, world: int) -> List[Optional[Dict[str, Any]]]:
    return [_read(root / f"leg{leg}-rank-{r}.json") for r in range(world)]


def _loss_diff(a: List[float], b: List[float]) -> float:
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x != y:
            worst = max(worst, abs(x - y) / max(abs(y), 1e-12) if math.isfinite(x - y) else math.inf)
    return worst


def _losses(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]], tol: float) -> Dict[str, Any]:
    """Loss of every step after the resume, every rank: bitwise, within tolerance, first step that differs."""
    first, worst, bitwise, compared = None, 0.0, True, 0
    for step in range(spec.resume_from + 1, spec.steps + 1):
        for a, b in zip(one, two):
            ref = (a or {}).get("steps", {}).get(str(step))
            got = (b or {}).get("steps", {}).get(str(step))
            if ref is None or got is None:
                continue
            compared += 1
            diff = _loss_diff(got["losses"], ref["losses"])
            if diff:
                bitwise = False
                worst = max(worst, diff)
                if first is None:
                    first = {"step": step, "rank": a["rank"], "uninterrupted": ref["losses"],
                             "resumed": got["losses"]}
    return {"bitwise": bitwise and compared > 0, "within_tolerance": compared > 0 and worst <= tol,
            "max_rel_diff": worst, "first_differing": first, "n_compared": compared}


def _data_order(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]]) -> Optional[int]:
    """The first step after the resume whose samples differ from the uninterrupted run's, or None."""
    for step in range(spec.resume_from + 1, spec.steps + 1):
        for a, b in zip(one, two):
            ref = (a or {}).get("steps", {}).get(str(step))
            got = (b or {}).get("steps", {}).get(str(step))
            if ref and got and ref["data"] != got["data"]:
                return step
    return None


def _saves(one: List[Optional[Dict]]) -> List[Dict[str, Any]]:
    saves = []
    for res in one:
        if not res:
            continue
        for s in res.get("saves", []):
            nxt = res.get("steps", {}).get(str(s["step"] + 1))
            saves.append({"step": s["step"], "rank": res["rank"], "bytes": s["bytes"], "seconds": s["seconds"],
                          "mem_before": s["mem_before"], "mem_peak": s["mem_peak"], "mem_after": s["mem_after"],
                          "first_step_after": {"step": s["step"] + 1, "mem": nxt["mem"]} if nxt else None})
    return sorted(saves, key=lambda s: (s["step"], s["rank"]))


def _failures(one: List[Optional[Dict]], two: List[Optional[Dict]], legs: Dict[int, Any]) -> List[Dict[str, Any]]:
    out = []
    for leg, results in ((1, one), (2, two)):
        for r, res in enumerate(results):
            if res is None:
                if leg in legs:
                    out.append({"leg": leg, "rank": r, "kind": "no result",
                                "message": legs[leg].get("killed") or f"exit status {legs[leg]['codes'][r]}"})
                continue
            if res.get("oom"):
                out.append({"leg": leg, "rank": r, "kind": "oom", **res["oom"]})
            if res.get("error"):
                out.append({"leg": leg, "rank": r, "kind": "error", **res["error"]})
    return out


def build(spec: ReproSpec, root: Path, legs: Dict[int, Any],
          conversion: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The verdict of one case from its run directory ``root`` (``legs``: how each leg's processes ended;
    ``conversion``: what ``ckpt universal`` wrote between the legs, or why it could not)."""
    one = _results(root, 1, spec.nproc)
    two = _results(root, 2, spec.resume_nproc) if spec.resume_from is not None else []
    tol = spec.tolerance()
    failures = _failures(one, two, legs)
    if conversion and conversion.get("error"):
        failures.append({"leg": 2, "rank": None, "kind": "conversion", "message": conversion["error"]})
    details, differs, cause = _differences(spec, one, two, failures, tol)
    exact = None
    if spec.resume_from is not None and not failures:
        exact = not differs
    return {
        "schema": SCHEMA, "case": spec.name, "run_dir": str(root), "resume_exact": exact,
        "differs": [p for p in PARTS if p in differs], "not_restored": cause, "details": details,
        "tolerance": _tolerance(spec, tol), "universal": conversion,
        "saves": _saves(one), "loads": [dict(res["load"], rank=res["rank"]) for res in two if res and res.get("load")],
        "steps": {str(leg): _step_peaks(res) for leg, res in ((1, one), (2, two)) if res},
        "cap": [res.get("cap") for res in one if res and res.get("cap")],
        "failures": failures, "legs": legs,
        "spec": {k: getattr(spec, k) for k in ("model_note", "stage", "precision", "micro_batch", "grad_accum",
                                               "seq_len", "lora", "gradient_checkpointing", "steps", "save_every",
                                               "resume_from", "nproc", "resume_nproc", "device", "gpu_mem_cap",
                                               "exclude_frozen", "leave_out", "universal", "resume_micro_batch",
                                               "resume_grad_accum")},
        "notes": spec.notes,
    }


def _tolerance(spec: ReproSpec, tol: Dict[str, float]) -> Dict[str, Any]:
    if not any(tol.values()):
        return {"kind": "bitwise", **tol, "why": "CPU runs are deterministic: any difference is a resume error"}
    return {"kind": "relative", **tol, "why": UNIVERSAL_WHY if spec.universal and spec.resume_nproc != spec.nproc
            else TOLERANCE_WHY}


def _differences(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]],
                 failures: List[Dict[str, Any]], tol: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """(details, parts that differ, parts not restored) of the resumed run against the uninterrupted one.

    Nothing is compared without a resume or when the first leg failed; only the world size when the second did.
    """
    details: Dict[str, Any] = {}
    differs: List[str] = []
    cause: List[str] = []
    if spec.resume_from is None or any(f["leg"] == 1 for f in failures):
        return details, differs, cause
    if spec.universal:
        return _universal_differences(spec, one, two, failures, tol)
    if spec.resume_nproc != spec.nproc:
        differs.append("world_size")
        cause.append("world_size")
        details["world_size"] = {"uninterrupted": spec.nproc, "resumed": spec.resume_nproc}
    if any(f["leg"] == 2 for f in failures):
        return details, differs, cause
    if spec.resume_nproc == spec.nproc:
        details["loss"] = _losses(spec, one, two, tol["loss"])
        if not details["loss"]["within_tolerance"]:
            differs.append("loss")
    _add_compared(details, differs, two)
    restored = _merge_compare(two, "restored")
    if restored:
        details["restored"] = restored
        cause = [p for p in PARTS if p in restored and not restored[p]["within_tolerance"]]
        differs += [p for p in cause if p not in differs]
    step = _data_order(spec, one, two) if spec.resume_nproc == spec.nproc else None
    if step is not None:
        if "data" not in differs:
            differs.append("data")
        details.setdefault("data", {})["first_step_with_other_samples"] = step
    return details, differs, cause


def _add_compared(details: Dict[str, Any], differs: List[str], two: List[Optional[Dict]]) -> None:
    """Rank 0's comparison of both runs' final states into ``details``; the parts out of tolerance into ``differs``."""
    for part, cmp in _merge_compare(two).items():
        details[part] = cmp
        if not cmp["within_tolerance"]:
            differs.append(part)


def _universal_differences(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]],
                           failures: List[Dict[str, Any]], tol: Dict[str, Any]
                           ) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """Through a universal checkpoint: the loss of each step (all ranks' micro-batches), the samples of each step,
    and rank 0's comparison of both runs' final checkpoints."""
    details: Dict[str, Any] = {}
    differs: List[str] = []
    if any(f["leg"] == 2 for f in failures):
        return details, differs, []
    details["loss"] = _step_losses(spec, one, two, tol["loss"])
    if not details["loss"]["within_tolerance"]:
        differs.append("loss")
    _add_compared(details, differs, two)
    step = _other_samples(spec, one, two)
    details["data"] = {"bitwise": step is None, "within_tolerance": step is None,
                       "first_step_with_other_samples": step}
    if step is not None:
        differs.append("data")
    return details, [p for p in PARTS if p in differs], []


def _step_mean(results: List[Optional[Dict]], step: int) -> Optional[float]:
    losses = [x for res in results for x in ((res or {}).get("steps", {}).get(str(step)) or {}).get("losses", [])]
    return sum(losses) / len(losses) if losses else None


def _step_losses(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]], tol: float) -> Dict[str, Any]:
    """Per step after the resume: the mean loss over every rank's micro-batches (each step reads the same samples
    whatever the world size; micro-batches of one run are all the same size, so this is the step's mean)."""
    first, worst, compared = None, 0.0, 0
    for step in range(spec.resume_from + 1, spec.steps + 1):
        ref, got = _step_mean(one, step), _step_mean(two, step)
        if ref is None or got is None:
            continue
        compared += 1
        diff = _loss_diff([got], [ref])
        if diff and first is None:
            first = {"step": step, "rank": None, "uninterrupted": [ref], "resumed": [got]}
        worst = max(worst, diff)
    return {"bitwise": compared > 0 and worst == 0.0, "within_tolerance": compared > 0 and worst <= tol,
            "max_rel_diff": worst, "first_differing": first, "n_compared": compared}


def _other_samples(spec: ReproSpec, one: List[Optional[Dict]], two: List[Optional[Dict]]) -> Optional[int]:
    """The first step after the resume whose samples (over all ranks) differ from the uninterrupted run's."""
    def samples(results, step):
        return sorted(i for res in results
                      for i in ((res or {}).get("steps", {}).get(str(step)) or {}).get("samples", []))

    for step in range(spec.resume_from + 1, spec.steps + 1):
        if samples(one, step) != samples(two, step):
            return step
    return None


def _merge_compare(two: List[Optional[Dict]], key: str = "compare") -> Dict[str, Dict[str, Any]]:
    """Per part, over ranks: equal only if every rank's is; the worst difference and the first paths.

    ``key``: ``compare`` (the final states) or ``restored`` (right after the load against right after the save).
    """
    merged: Dict[str, Dict[str, Any]] = {}
    for res in two:
        cmp = (res or {}).get(key) or {}
        for part, c in cmp.items():
            m = merged.setdefault(part, {"bitwise": True, "within_tolerance": True, "max_rel_diff": 0.0,
                                         "differing": [], "n_differing": 0, "n_compared": 0})
            m["n_compared"] += c.get("n_compared", 0)
            m["bitwise"] = m["bitwise"] and c["bitwise"]
            m["within_tolerance"] = m["within_tolerance"] and c["within_tolerance"]
            m["max_rel_diff"] = max(m["max_rel_diff"], c["max_rel_diff"])
            m["n_differing"] += c["n_differing"]
            m["differing"] += [f"rank {res['rank']}: {p}" for p in c["differing"][:3]]
    return merged


def _step_peaks(results: List[Optional[Dict]]) -> List[Dict[str, Any]]:
    rows = []
    for res in results:
        if not res:
            continue
        for step, rec in sorted(res.get("steps", {}).items(), key=lambda kv: int(kv[0])):
            mem = rec.get("mem") or {}
            rows.append({"step": int(step), "rank": res["rank"], "seconds": rec.get("seconds"),
                         "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
                         "peak_allocated_bytes": mem.get("peak_allocated_bytes"),
                         "host_rss_bytes": mem.get("host_rss_bytes")})
    return rows
