"""Real OOMs under a memory cap on one GPU, each re-run with the first fix zeropilot printed; the guard's overhead.

    python bench/guard/oom_pairs.py OUT [--budget-s 330]

For each scenario: the job runs under ``zeropilot run --no-check`` and runs out of memory; the driver reads the
OOM record (``oom-rank-0.json``: verdict and fixes, best first, as ``zeropilot report`` prints them), takes the
first fix that this machine can apply (one GPU: not "more GPUs"; a fix with no ``change`` is advice, not a
setting), applies its ``change`` to the job's spec or environment and runs the job again under the guard: the
pair holds when the second run ends with exit 0 and no OOM record. Then the guard's overhead: the same job with
and without ``zeropilot run`` (order guard, plain, plain, guard), median warm step of each, and the guard's own
work per optimizer step measured in a rank (``hook_cost.py``) against the plain job's median step.

Writes OUT/oom_pairs.json (the summary) and OUT/oom_pairs_runs.tar.gz (every run directory ``zeropilot run``
wrote, each command's output ``<name>.out`` and ``zeropilot report`` of each run ``<name>.report.txt``).
Scenarios run one at a time: memory outside PyTorch is read device-wide, so two jobs on one GPU would see each
other. Each run's time limit is cut to what is left of ``--budget-s``; a scenario that cannot start in time is
listed as skipped.
"""

import argparse
import copy
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LM, HF = str(HERE / "train_lm.py"), str(HERE / "hf_long_batch.py")
OV = {"size": "qwen0.5b", "stage": 2, "mb": 4, "seq": 1024, "steps": 40, "warmup": 5}

# name, job, spec, expected class, time limit (s), what a DeepSpeed expert would change first
SCENARIOS = [
    ("hf-long-batch", HF, {"size": "qwen0.5b", "stage": 3, "lora": 16, "cap_gib": 8, "seq": 256,
                           "long_seq": 32768, "long_at": 5, "steps": 6}, "capacity", 90,
     "cap the sequence length (the one 32k batch is the cause)"),
    ("ds-micro-batch", LM, {"size": "qwen0.5b", "stage": 2, "mb": 16, "seq": 2048, "cap_gib": 16, "steps": 3},
     "capacity", 60, "a smaller micro batch (same global batch) or gradient checkpointing"),
    ("ds-full-ft-optimizer", LM, {"size": "qwen0.5b", "stage": 2, "mb": 2, "seq": 512, "cap_gib": 7, "steps": 3},
     "capacity", 70, "offload the optimizer (full fine-tuning: Adam states are 8 bytes a parameter)"),
    ("ds-save-spike", LM, {"size": "tiny", "stage": 3, "zero_init": True, "gather": True,
                           "unused_head": 2147483648, "cap_after_init_gib": 7, "steps": 3, "save16": True},
     "save_spike", 60, "stage3_gather_16bit_weights_on_model_save: false"),
    ("fragmentation", str(HERE / "frag.py"), None, "fragmentation", 40, "expandable_segments:True"),
    ("ds-outside-torch", LM, {"size": "qwen0.5b", "stage": 2, "mb": 4, "seq": 1024, "steps": 6,
                              "empty_cache": True, "outside_grow_at": 4, "outside_leave_gib": 1},
     "outside_torch", 60, "free the GPU of the other process"),
]


def port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Runner:
    def __init__(self, out: Path, budget: float):
        self.out, self.runs = out, out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.end = time.monotonic() + budget
        self.scratch = Path(tempfile.mkdtemp(prefix="oom_pairs_"))

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, name: str, script: str, spec, env=None, guard=True, limit=60, zp_args=()) -> dict:
        """One job, under the guard or plain; its output in runs/<name>.out, its run directory runs/<name>."""
        limit = min(limit, self.left() - 5)
        if limit < 15:
            return {"name": name, "skipped": "out of time"}
        job = [sys.executable, script] if spec is None else \
            ["torchrun", "--nproc_per_node", "1", "--master_port", str(port()), script, json.dumps(spec)]
        cmd = ([sys.executable, "-m", "zeropilot", "run", "--no-check", *zp_args, "--out", str(self.runs / name), "--"]
               if guard else []) + job
        t = time.monotonic()
        with open(self.runs / f"{name}.out", "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=limit, check=False,
                                    env=dict(os.environ, **(env or {}))).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        res = {"name": name, "cmd": cmd, "env": env or {}, "rc": rc, "wall_s": round(time.monotonic() - t, 1)}
        res["result"] = result_line(self.runs / f"{name}.out")
        if guard:
            res["oom_records"] = sorted(p.name for p in (self.runs / name).glob("oom-rank-*.json"))
            rep = subprocess.run([sys.executable, "-m", "zeropilot", "report", str(self.runs / name)],
                                 capture_output=True, text=True, timeout=60, check=False)
            (self.runs / f"{name}.report.txt").write_text(rep.stdout + rep.stderr)
        print(f"{name}: rc {rc}, {res['wall_s']} s, oom records {res.get('oom_records')}", flush=True)
        return res


def result_line(path: Path):
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def apply(spec, env: dict, change: dict, scratch: Path):
    """The spec and environment with a fix's ``change`` made, or None when one GPU cannot make it."""
    spec = copy.deepcopy(spec)
    env = dict(env)
    for key, value in change.items():
        if key == "expandable_segments" and value:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        elif spec is None:  # frag.py takes no spec: only environment changes apply
            return None
        elif key == "seq_len":
            spec["max_len"] = int(value)
        elif key == "micro_batch":
            spec["mb"] = int(value)
        elif key == "grad_accum":
            spec["ga"] = int(value)
            spec["steps"] = spec.get("steps", 3) * int(value)  # the same optimizer steps
        elif key == "gradient_checkpointing":
            spec["gc"] = bool(value)
        elif key == "stage":
            spec["stage"] = int(value)
        elif key in ("offload_optimizer", "offload_param"):
            spec["offload_opt" if key == "offload_optimizer" else "offload_param"] = None if value == "none" else value
        elif key == "gather_16bit_on_save" and value is False:
            spec["gather"] = False
            if spec.pop("save16", False):  # save ZeRO shards instead of the 16-bit gather
                spec["save_at"] = [spec.get("steps", 3)]
                spec["save_dir"] = str(scratch / "ckpt")
        elif key == "outside_torch_bytes":
            spec.pop("outside_grow_at", None)
        elif key == "packing" and value:
            return None  # one sample per micro batch in these jobs: nothing to pack
        else:  # world_size, save_only_model, ...: not on one GPU or not a setting of these jobs
            return None
    return spec, env


def pair(r: Runner, name, script, spec, expected, limit, expert) -> dict:
    row = {"name": name, "job": Path(script).name, "spec": spec, "expected_class": expected, "expert_pick": expert}
    if spec is not None and "save16" in spec:
        spec = dict(spec, save_dir=str(r.scratch / "s16"))
    first = r.run(name, script, spec, limit=limit, zp_args=("--memory-history",) if spec is None else ())
    row["oom_run"] = first
    recs = first.get("oom_records") or []
    if not recs:
        row["pair"] = "no OOM in the first run"
        return row
    record = json.loads((r.runs / name / recs[0]).read_text())
    fixes = record.get("fixes") or []
    row["verdict"] = record.get("verdict")
    row["class_ok"] = (record.get("verdict") or {}).get("kind") == expected
    row["fixes"] = [{k: f.get(k) for k in ("fix", "change", "predicted_peak_bytes", "limit_bytes", "fits", "ranked")}
                    for f in fixes]
    for i, f in enumerate(fixes):
        made = apply(spec, {}, f.get("change") or {}, r.scratch) if f.get("change") else None
        if made is not None:
            row["applied"] = {"index": i, "first_printed": i == 0, **row["fixes"][i]}
            second = r.run(f"{name}-fixed", script, made[0], env=made[1], limit=limit)
            second["spec"] = made[0]
            row["fixed_run"] = second
            ok = second.get("rc") == 0 and not second.get("oom_records")
            row["pair"] = "fits: the re-run with the fix ended without an OOM" if ok else "the re-run failed"
            res = second.get("result") or {}
            if res.get("peak_reserved") and f.get("predicted_peak_bytes"):
                row["fixed_peak_reserved_bytes"] = res["peak_reserved"]
            break
    else:
        row["pair"] = "no fix this machine can apply"
    shutil.rmtree(r.scratch / "ckpt", ignore_errors=True)
    shutil.rmtree(r.scratch / "s16", ignore_errors=True)
    return row


def overhead(r: Runner) -> dict:
    out = {"spec": OV, "order": ["guard", "plain", "plain", "guard"], "runs": []}
    for i, kind in enumerate(out["order"], 1):
        res = r.run(f"overhead-{kind}-{i}", LM, OV, guard=kind == "guard", limit=90)
        data = res.get("result")
        med = statistics.median(data["step_seconds"][OV["warmup"]:]) if data else None
        out["runs"].append({"kind": kind, "rc": res.get("rc"), "median_step_s": med, "skipped": res.get("skipped")})
    g = [x["median_step_s"] for x in out["runs"] if x["kind"] == "guard" and x["median_step_s"]]
    p = [x["median_step_s"] for x in out["runs"] if x["kind"] == "plain" and x["median_step_s"]]
    if g and p:
        out["end_to_end_percent"] = round(100 * (statistics.mean(g) / statistics.mean(p) - 1), 3)
    hook = r.run("hook-cost", str(HERE / "hook_cost.py"), None, limit=60)
    if hook.get("result") and p:
        us = hook["result"]["median_us"]
        out["guard_work_per_step_us"] = round(us, 1)
        out["in_rank_percent"] = round(100 * us * 1e-6 / statistics.mean(p), 4)
    out["note"] = ("end_to_end_percent: guard runs against plain runs at different times (run-to-run noise of a "
                   "median step is ~1-3% on these machines); in_rank_percent: the guard's measured work per "
                   "optimizer step over the plain job's median step")
    return out


VERSIONS = ("import json,torch,deepspeed,transformers,peft;print(json.dumps({'torch':torch.__version__,"
            "'cuda':torch.version.cuda,'deepspeed':deepspeed.__version__,'transformers':transformers.__version__,"
            "'peft':peft.__version__,'gpu':torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")


def versions(proc: subprocess.Popen) -> dict:
    """The library versions (read beside the first runs, on the host's other cores)."""
    try:
        out, _ = proc.communicate(timeout=60)
        return json.loads(out.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - the summary says what it could not read
        proc.kill()
        return {"error": f"{exc.__class__.__name__}: {exc}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=330)
    ap.add_argument("--only", nargs="*", help="scenario names (default: all, then the overhead)")
    a = ap.parse_args()
    out = Path(a.out)
    r = Runner(out, a.budget_s)
    ver = subprocess.Popen([sys.executable, "-c", VERSIONS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pairs": [], "overhead": None}
    order = [s for s in SCENARIOS if not a.only or s[0] in a.only]
    try:
        for i, s in enumerate(order):
            summary["pairs"].append(pair(r, *s))
            if i == 1 and not a.only:  # the overhead after the first two pairs, so it is measured in any case
                summary["overhead"] = overhead(r)
        if summary["overhead"] is None and not a.only:
            summary["overhead"] = overhead(r)
    finally:
        summary["versions"] = versions(ver)
        summary["wall_s"] = round(a.budget_s - r.left(), 1)
        (r.runs / "oom_pairs.json").write_text(json.dumps(summary, indent=1))
        (out / "oom_pairs.json").write_text(json.dumps(summary, indent=1))
        with tarfile.open(out / "oom_pairs_runs.tar.gz", "w:gz") as tar:
            tar.add(r.runs, arcname="oom_pairs")
        shutil.rmtree(r.runs, ignore_errors=True)
        shutil.rmtree(r.scratch, ignore_errors=True)
    for row in summary["pairs"]:
        print(f"{row['name']}: class {(row.get('verdict') or {}).get('kind')} (expected {row['expected_class']}); "
              f"fix applied: {(row.get('applied') or {}).get('fix')}; {row.get('pair')}")
    print("overhead:", json.dumps({k: v for k, v in (summary["overhead"] or {}).items() if k != "runs"}))


if __name__ == "__main__":
    main()
