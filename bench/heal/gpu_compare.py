"""The GPU heal run's figures (``gpu_oom.sh``).

    python gpu_compare.py cap REFERENCE_RUN_DIR     -> the memory cap in bytes (stdout)
    python gpu_compare.py compare WORK CAP          -> results JSON (stdout)

``cap``: halfway between the reference's peak allocated memory at the end of step 4 (the last step of short samples:
the allocator's peak counter is cumulative) and at its last step. Not reserved memory: under a cap the allocator
frees its cache and retries before it fails, so a capped run needs what it allocates (plus fragmentation), not what
an uncapped one keeps cached (seen on an H200: a cap halfway between the reserved peaks, 31.66 GiB, never failed;
the capped run's reserved peak was 29.92 GiB, its allocated peak 27.83 GiB as uncapped). ``compare``: what the heal
did (from ``heal.json``) and the loss of every step after the resume against the reference's at the same step, from
the final checkpoints' ``trainer_state.json`` (the Trainer logs every step).
"""

import json
import sys
from pathlib import Path

TOLERANCE = 0.02  # relative: bf16, and the fix changes how the same samples are split into micro batches


def _steps(run_dir):
    out = {}
    for line in (Path(run_dir) / "rank-0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "step":
            out[rec["step"]] = rec["mem"]
    return out


def cap(run_dir):
    steps = _steps(run_dir)
    short = steps[4]["peak_allocated_bytes"]
    long = steps[max(steps)]["peak_allocated_bytes"]
    if short is None or long is None:  # a CPU dry run (--tiny): no GPU memory to cap
        return None, short, long
    return (short + long) // 2, short, long


def _losses(ckpt_dir):
    last = max(Path(ckpt_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def compare(work, cap_bytes):
    work = Path(work)
    heal = json.loads((work / "healed" / "heal.json").read_text())
    last = heal["attempts"][-1]
    resumed = ((last.get("resume") or {}).get("chosen") or {}).get("step") or 0
    ref, healed = _losses(work / "ref-ckpt"), _losses(work / "heal-ckpt")
    rows = [{"step": s, "reference": ref[s], "healed": healed[s],
             "rel_diff": abs(healed[s] - ref[s]) / abs(ref[s])} for s in sorted(healed) if s > resumed and s in ref]
    first = heal["attempts"][0]
    oom_file = work / "healed" / "oom-rank-0.json"
    oom = json.loads(oom_file.read_text()) if oom_file.exists() else {}
    fixes = [a.get("fix") for a in heal["attempts"] if a.get("fix")]
    worst = max((r["rel_diff"] for r in rows), default=None)
    _, short, long = cap(work / "reference")
    return {"cap_bytes": int(cap_bytes) if str(cap_bytes).isdigit() else None,
            "reference_peak_allocated_short": short, "reference_peak_allocated_all": long,
            "outcome": heal["outcome"], "attempts": len(heal["attempts"]),
            "first_failure": first.get("failure"), "first_ranked_fix": (oom.get("fixes") or [{}])[0].get("fix"),
            "fixes_applied": [{"key": f.get("key"), "fix": f.get("fix"), "settings": f.get("settings"),
                               "passed": f.get("passed")} for f in fixes],
            "resumed_from_step": resumed, "steps_redone": last.get("steps_redone"), "losses_after_resume": rows,
            "max_rel_diff": worst, "tolerance": TOLERANCE,
            "within_tolerance": worst is not None and worst <= TOLERANCE,
            "healed": heal["outcome"]["status"] == "healed"}


if __name__ == "__main__":
    if sys.argv[1] == "cap":
        print(cap(sys.argv[2])[0])
    else:
        print(json.dumps(compare(sys.argv[2], sys.argv[3]), indent=1))
