"""Benchmark `zeropilot ckpt universal` against DeepSpeed's ds_to_universal.py on the same checkpoints.

For each ZeRO stage asked for, builds a real checkpoint with DeepSpeed on CPU (2 ranks, gloo, bf16, Adam, one
step: tests/checkpoint/ds_build.py, as bench_export.py does), then runs, alternately and after one warm-up each
(warm page cache)::

    python .../deepspeed/checkpoint/ds_to_universal.py --input_folder SAVE/TAG --output_folder OUT_DS/TAG \\
        --inject_missing_state --num_extract_workers 1 --num_merge_workers 1
    python -m zeropilot ckpt universal SAVE OUT_ZP --no-progress

timing wall clock and peak resident memory of each child (/usr/bin/time %M, as bench_export.py). DeepSpeed's
converter runs with one worker per phase: its default pool (4 extract, 2 merge workers) spreads memory over
processes whose peaks %M does not add up, and this machine has 2 cores; ``--ds-workers`` changes it.
``--inject_missing_state``: a plain transformers model declares no ``universal_checkpoint_info``, without which its
ZeRO-1/2 path stops at an assertion. Then every ``.pt`` file of both outputs is loaded with torch and compared,
tensor for tensor, bitwise (ZeRO-3's ``optimizer_state.pt`` without the partitions DeepSpeed adds and its loader
never reads), and the model-states files byte for byte. Results: ``results-universal-<size>.{json,md}`` here.

Usage (from the repo root)::

    python bench/ckpt/bench_universal.py --size qwen0.5b --stages 2 3 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_export import ROOT, build, machine, move_optim, run_child  # noqa: E402 - the shared harness


def ds_converter() -> str:
    import importlib.util

    return importlib.util.find_spec("deepspeed").submodule_search_locations[0] + "/checkpoint/ds_to_universal.py"


def _same(a, b, path):
    """Bitwise equality of two loaded objects; the first difference's path, or None."""
    import torch

    if torch.is_tensor(a):
        ok = torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return None if ok else path
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return path
        return next((d for k in a for d in [_same(a[k], b[k], f"{path}.{k}")] if d), None)
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return path
        return next((d for i, (x, y) in enumerate(zip(a, b)) for d in [_same(x, y, f"{path}[{i}]")] if d), None)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return _same(vars(a), vars(b), path) if type(a) is type(b) else path
    return None if a == b else path


def _slim_zero3(state):
    """ZeRO-3's optimizer_state.pt as ours keeps it: DeepSpeed's also holds rank 0's partitions (never read)."""
    state = dict(state)
    state.pop("fp32_flat_groups", None)
    inner = state["optimizer_state_dict"]
    state["optimizer_state_dict"] = {"state": {g: {"step": e["step"]} for g, e in inner["state"].items()},
                                     "param_groups": inner["param_groups"]}
    return state


def compare(theirs: Path, ours: Path, stage: int) -> dict:
    """Every .pt file of DeepSpeed's tag folder against ours: the same files, the same objects and tensors."""
    import torch

    files = sorted(str(p.relative_to(theirs)) for p in (theirs / "zero").rglob("*.pt"))
    mine = sorted(str(p.relative_to(ours)) for p in (ours / "zero").rglob("*.pt"))
    differ, tensors, only_cat_dim = [], 0, 0
    for rel in files if files == mine else []:
        a = torch.load(str(ours / rel), weights_only=False, mmap=True)
        b = torch.load(str(theirs / rel), weights_only=False, mmap=True)
        if rel.endswith("optimizer_state.pt") and stage == 3:
            b = _slim_zero3(b)
        where = _same(a, b, rel)
        if where:
            differ.append(where)
            # DeepSpeed writes a parameter with no optimizer state (SGD keeps none) from the 16-bit weights, without
            # "cat_dim" (its loader's default, 0): the same tensor, one key fewer
            if isinstance(a, dict) and isinstance(b, dict) and a.get("cat_dim") == 0 and "cat_dim" not in b \
                    and _same({k: v for k, v in a.items() if k != "cat_dim"}, b, rel) is None:
                only_cat_dim += 1
        tensors += sum(1 for v in (a.values() if isinstance(a, dict) else [a]) if torch.is_tensor(v))
    models = sorted(p.name for p in theirs.glob("*_model_states.pt"))
    same_models = models == sorted(p.name for p in ours.glob("*_model_states.pt")) and all(
        (ours / m).read_bytes() == (theirs / m).read_bytes() for m in models)
    return {"bitwise_equal": files == mine and not differ and same_models, "same_files": files == mine,
            "files_compared": len(files), "tensors_compared": tensors, "differ": differ[:10],
            "differ_count": len(differ), "differ_only_in_cat_dim": only_cat_dim,
            "model_states_identical": same_models}


def bench_stage(size, stage, work: Path, reps: int, ds_workers: int, keep: bool = False, warmup: bool = True,
                big: bool = False, optim_dir: Path = None, ds_outputs: Path = None) -> dict:
    ckpt_root = work / f"z{stage}"
    done = ckpt_root / "built.json"  # written after a whole build: --keep reuses it
    if keep and done.exists():
        spec, build_s = json.loads(done.read_text())
    else:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        spec, build_s = build(size, stage, ckpt_root, big)
        if optim_dir:
            move_optim(ckpt_root / "run", optim_dir / f"z{stage}")
        os.sync()
        done.write_text(json.dumps([spec, build_s]))
        print(f"built ZeRO-{stage} in {build_s:.0f} s", flush=True)
    save_dir = ckpt_root / "run"
    tag = (save_dir / "latest").read_text().strip()
    ckpt_bytes = sum(f.stat().st_size for f in (save_dir / tag).glob("*.pt"))  # stat follows --optim-dir links
    ds_out, zp_out = (ds_outputs or work) / f"out_ds_z{stage}", work / f"out_zp_z{stage}"
    cmds = {
        "ds_to_universal": [sys.executable, ds_converter(), "--input_folder", str(save_dir / tag),
                            "--output_folder", str(ds_out / tag), "--inject_missing_state",
                            "--num_extract_workers", str(ds_workers), "--num_merge_workers", str(ds_workers)],
        "zeropilot": [sys.executable, "-m", "zeropilot", "ckpt", "universal", str(save_dir), str(zp_out),
                      "--no-progress"] + (["--follow-symlinks"] if optim_dir else []),
    }
    runs = {k: [] for k in cmds}
    for rep in range(0 if warmup else 1, reps + 1):  # rep 0 warms the page cache and is not counted
        for name, cmd in cmds.items():
            out_dir = ds_out if name == "ds_to_universal" else zp_out
            shutil.rmtree(out_dir, ignore_errors=True)  # outside the timed run, for both
            code, wall, rss, tail = run_child(cmd)
            if code:
                raise SystemExit(f"{name} failed ({code}): {tail}")
            if rep:
                runs[name].append({"wall_s": round(wall, 3), "peak_rss_bytes": rss})
            print(f"ZeRO-{stage} rep {rep} {name}: {wall:.2f} s, {rss / 2**20:.0f} MiB", flush=True)
    result = {"stage": stage, "spec": spec, "build_s": round(build_s, 1), "checkpoint_bytes": ckpt_bytes,
              "optimizer_files_in": str(optim_dir) if optim_dir else "the checkpoint",
              "ds_output_in": str(ds_outputs or work),
              "output_bytes": sum(f.stat().st_size for f in zp_out.rglob("*.pt")), "ds_workers": ds_workers,
              "warm_cache": warmup, "runs": runs}
    for name in cmds:
        result[name] = {"wall_s_median": statistics.median(r["wall_s"] for r in runs[name]),
                        "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in runs[name])}
    result["wall_ratio"] = round(result["zeropilot"]["wall_s_median"] / result["ds_to_universal"]["wall_s_median"], 3)
    result["rss_ratio"] = round(result["zeropilot"]["peak_rss_bytes_max"]
                                / result["ds_to_universal"]["peak_rss_bytes_max"], 3)
    result["equality"] = compare(ds_out / tag, zp_out / tag, stage)
    for d in (ds_out, zp_out) + (() if keep else (ckpt_root,) + ((optim_dir / f"z{stage}",) if optim_dir else ())):
        shutil.rmtree(d, ignore_errors=True)
    return result


def markdown(results) -> str:
    m = results["machine"]
    optim = "SGD, saved before any step" if results.get("big") else "Adam"
    lines = [f"# ckpt universal vs ds_to_universal.py ({results['size']}, 2 ranks, bf16 training, {optim})", "",
             f"Command: `{results['command']}`", "",
             f"Machine: {m['cpus']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB, torch {m['torch']}, "
             f"deepspeed {m['deepspeed']}", "",
             "| stage | checkpoint | output | ds_to_universal wall | zeropilot wall | wall ratio "
             "| ds_to_universal peak RSS | zeropilot peak RSS | RSS ratio | bitwise equal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["stages"]:
        eq = r["equality"]
        lines.append(
            f"| ZeRO-{r['stage']} | {r['checkpoint_bytes'] / 1e9:.2f} GB | {r['output_bytes'] / 1e9:.2f} GB "
            f"| {r['ds_to_universal']['wall_s_median']:.2f} s | {r['zeropilot']['wall_s_median']:.2f} s "
            f"| {r['wall_ratio']:.2f} | {r['ds_to_universal']['peak_rss_bytes_max'] / 1e9:.2f} GB "
            f"| {r['zeropilot']['peak_rss_bytes_max'] / 1e9:.3f} GB | {r['rss_ratio']:.3f} "
            f"| {eq['bitwise_equal']} ({eq['files_compared']} files, {eq['tensors_compared']} tensors"
            + (f"; {eq['differ_count']} differ, {eq['differ_only_in_cat_dim']} of them only in DeepSpeed's missing "
               "cat_dim" if eq.get("differ_count") else "") + ") |")
    warm = all(r.get("warm_cache", True) for r in results["stages"])
    lines += ["", f"Wall: median of {results['reps']} run(s)" + (" after a warm-up run each (warm page cache)" if warm
              else ", no warm-up run") + "; peak RSS: max "
              "over those runs (/usr/bin/time %M of the command). ds_to_universal.py ran with "
              f"{results['stages'][0]['ds_workers']} extract and merge worker(s) and --inject_missing_state."]
    if results.get("note"):
        lines += ["", results["note"]]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="qwen0.5b")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--ds-workers", type=int, default=1, help="ds_to_universal's extract and merge workers")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench-tmp" / "ckpt-universal")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--keep", action="store_true", help="reuse a checkpoint a previous run built whole in --work, "
                        "and keep it")
    parser.add_argument("--no-warmup", action="store_true", help="no warm-up run before the timed ones")
    parser.add_argument("--note", default="", help="a line for the results' markdown (e.g. the machine's load)")
    parser.add_argument("--big", action="store_true", help=">=7B: SGD, no step, bf16 creation, untied (as "
                        "bench_export.py --big: Adam's states would not fit the GPU host twice)")
    parser.add_argument("--optim-dir", type=Path, help="keep the optimizer files there (e.g. a tmpfs), linked from "
                        "the checkpoint")
    parser.add_argument("--ds-outputs", type=Path, help="where ds_to_universal.py writes (its output and its tmp "
                        "folder of slices; default --work)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = {"size": args.size, "reps": args.reps, "machine": machine(), "stages": [], "note": args.note,
               "big": args.big,
               "command": "python bench/ckpt/bench_universal.py " + " ".join(sys.argv[1:])}
    args.results.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:  # results written after every stage: a run stopped later keeps the stages done
        results["stages"].append(bench_stage(args.size, stage, args.work, args.reps, args.ds_workers, args.keep,
                                             not args.no_warmup, args.big, args.optim_dir, args.ds_outputs))
        print(json.dumps(results["stages"][-1], indent=1), flush=True)
        write(results, args.results)
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)


def write(results: dict, folder: Path) -> None:
    (folder / f"results-universal-{results['size']}.json").write_text(json.dumps(results, indent=2) + "\n")
    (folder / f"results-universal-{results['size']}.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
