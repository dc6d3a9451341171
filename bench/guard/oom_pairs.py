"""Real OOMs under a memory cap on one GPU, each re-run with the first fix zeropilot printed; the guard's overhead.

    python bench/guard/oom_pairs.py OUT [--budget-s 330] [--only NAME ...] [--part NAME]

For each scenario: the job runs under ``zeropilot run --no-check`` and runs out of memory; the driver reads the
OOM record (``oom-rank-0.json``: verdict and fixes, best first, as ``zeropilot report`` prints them), takes the
first fix that this machine can apply (one GPU: not "more GPUs"; a fix with no ``change`` is advice, not a
setting), applies its ``change`` to the job's spec or environment and runs the job again under the guard: the
pair holds when the second run ends with exit 0 and no OOM record. The guard's overhead (``overhead``): the same
GPU-bound job (the shape of ``overhead_ab.sh``) with and without ``zeropilot run`` in interleaved pairs (guard
plain, plain guard, guard plain), the median warm step of each run, the median of the per-pair ratios; and the
guard's own work per optimizer step measured in a rank (``hook_cost.py``) against the plain job's median step.

Writes OUT/oom_pairs-<part>.json (the summary) and OUT/oom_pairs_<part>_runs.tar.gz (folder ``oom_pairs/``:
every run directory ``zeropilot run`` wrote, each command's output ``<name>.out``, ``zeropilot report`` of each
run ``<name>.report.txt`` and the summary as ``summary-<part>.json``), so the tarballs of several calls unpack
into one folder. Scenarios run one at a time: memory outside PyTorch is read device-wide, so two jobs on one GPU
would see each other. A scenario starts only when its first run's limit fits in what is left of ``--budget-s``
(else it is listed as skipped); the re-run with the fix gets its own full limit.
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
# GPU-bound (as overhead_ab.sh): a launch-bound step (micro batch 4 x 1024, no checkpointing) varies by 15% from
# step to step and 5% from run to run, which hid the guard's cost in the first GPU call
OV = {"size": "qwen0.5b", "stage": 2, "mb": 8, "seq": 2048, "gc": True, "steps": 30, "warmup": 5}
OV_PAIRS = (("guard", "plain"), ("plain", "guard"), ("guard", "plain"))

# name, job, spec, expected class, time limit (s), what a DeepSpeed expert would change first
SCENARIOS = [
    ("hf-long-batch", HF, {"size": "qwen0.5b", "stage": 3, "lora": 16, "cap_gib": 8, "seq": 256,
                           "long_seq": 32768, "long_at": 5, "steps": 6}, "capacity", 90,
     "cap the sequence length (the one 32k batch is the cause)"),
    ("ds-micro-batch", LM, {"size": "qwen0.5b", "stage": 2, "mb": 16, "seq": 2048, "cap_gib": 16, "steps": 3},
     "capacity", 90, "a smaller micro batch (same global batch) or gradient checkpointing"),
    ("ds-full-ft-optimizer", LM, {"size": "qwen0.5b", "stage": 2, "mb": 2, "seq": 512, "cap_gib": 7, "steps": 3},
     "capacity", 90, "offload the optimizer (full fine-tuning: Adam states are 8 bytes a parameter)"),
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

    def run(self, name: str, script: str, spec, env=None, guard=True, limit=60, zp_args=(), own=False) -> dict:
        """One job, under the guard or plain; its output in runs/<name>.out, its run directory runs/<name>.

        It starts only when ``limit`` fits in what is left of the budget, unless it has its ``own`` time (a re-run
        with a fix: cutting it short would read as a fix that failed)."""
        if not own and self.left() < limit:
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
    if first.get("skipped"):
        row["pair"] = f"skipped: {first['skipped']}"
        return row
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
            second = r.run(f"{name}-fixed", script, made[0], env=made[1], limit=limit, own=True)
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
    out = {"spec": OV, "pairs": [], "runs": []}
    for i, kinds in enumerate(OV_PAIRS, 1):
        meds = {}
        for kind in kinds:
            res = r.run(f"overhead-{i}-{kind}", LM, OV, guard=kind == "guard", limit=60)
            data = res.get("result")
            med = statistics.median(data["step_seconds"][OV["warmup"]:]) if data else None
            meds[kind] = med
            out["runs"].append({"pair": i, "kind": kind, "rc": res.get("rc"), "median_step_s": med,
                                "skipped": res.get("skipped")})
        if meds.get("guard") and meds.get("plain"):
            out["pairs"].append({"pair": i, "order": list(kinds), "guard_s": meds["guard"], "plain_s": meds["plain"],
                                 "percent": round(100 * (meds["guard"] / meds["plain"] - 1), 3)})
    if out["pairs"]:
        out["end_to_end_percent"] = statistics.median(p["percent"] for p in out["pairs"])
    plain = [x["median_step_s"] for x in out["runs"] if x["kind"] == "plain" and x["median_step_s"]]
    if len(plain) > 1:
        out["plain_spread_percent"] = round(100 * (max(plain) / min(plain) - 1), 3)
    hook = r.run("hook-cost", str(HERE / "hook_cost.py"), None, limit=30)
    if hook.get("result") and plain:
        us = hook["result"]["median_us"]
        out["guard_work_per_step_us"] = round(us, 1)
        out["in_rank_percent"] = round(100 * us * 1e-6 / statistics.median(plain), 4)
    out["note"] = ("end_to_end_percent: median over the pairs of guard/plain - 1 (each pair: the two runs back to "
                   "back, the order alternating); plain_spread_percent: how far the plain runs' medians are apart "
                   "(the noise between runs); in_rank_percent: the guard's measured work per optimizer step over the "
                   "plain job's median step. zeropilot run also sets PyTorch's flight recorder "
                   "(TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE=2000): part of what is measured")
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
    ap.add_argument("--only", nargs="*", help="scenario names and 'overhead', in the order given (default: all)")
    ap.add_argument("--part", default="all", help="names this call's summary and tarball (several calls, one folder)")
    a = ap.parse_args()
    out = Path(a.out)
    r = Runner(out, a.budget_s)
    names = [s[0] for s in SCENARIOS] + ["overhead"]
    wanted = [n for n in (a.only or [names[0], names[1], "overhead", *names[2:-1]]) if n]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        sys.exit(f"oom_pairs: unknown scenario {', '.join(unknown)} (known: {', '.join(names)})")
    ver = subprocess.Popen([sys.executable, "-c", VERSIONS], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "part": a.part, "scenarios": wanted,
               "pairs": [], "overhead": None}
    by_name = {s[0]: s for s in SCENARIOS}
    try:
        for name in wanted:
            if name == "overhead":  # the version reader (a CUDA context of its own) ends before the timed runs
                summary.setdefault("versions", versions(ver))
                summary["overhead"] = overhead(r)
            else:
                summary["pairs"].append(pair(r, *by_name[name]))
    finally:
        summary.setdefault("versions", versions(ver))
        summary["wall_s"] = round(a.budget_s - r.left(), 1)
        (r.runs / f"summary-{a.part}.json").write_text(json.dumps(summary, indent=1))
        (out / f"oom_pairs-{a.part}.json").write_text(json.dumps(summary, indent=1))
        with tarfile.open(out / f"oom_pairs_{a.part}_runs.tar.gz", "w:gz") as tar:
            tar.add(r.runs, arcname="oom_pairs")
        shutil.rmtree(r.runs, ignore_errors=True)
        shutil.rmtree(r.scratch, ignore_errors=True)
    for row in summary["pairs"]:
        print(f"{row['name']}: class {(row.get('verdict') or {}).get('kind')} (expected {row['expected_class']}); "
              f"fix applied: {(row.get('applied') or {}).get('fix')}; {row.get('pair')}")
    print("overhead:", json.dumps({k: v for k, v in (summary["overhead"] or {}).items() if k != "runs"}))


if __name__ == "__main__":
    main()
