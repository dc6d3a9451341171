"""Benchmark `zeropilot ckpt export` against DeepSpeed's zero_to_fp32.py on the same checkpoints.

For each ZeRO stage asked for, builds a real checkpoint with DeepSpeed on CPU (2 ranks, gloo,
tests/checkpoint/ds_build.py), then runs, alternately and after one warm-up each (warm page cache):

    python SAVE_DIR/zero_to_fp32.py SAVE_DIR OUT_DS                 (the script DeepSpeed wrote)
    python -m zeropilot ckpt export SAVE_DIR OUT_ZP --dtype fp32

timing wall clock and peak resident memory of each child (``os.wait4`` rusage), and checks that the
outputs are bitwise equal tensor for tensor. It also runs ``zero_to_fp32.py --safe_serialization``
once and records how it ends. Results: ``results-<size>.json`` and ``results-<size>.md`` here.

Usage (from the repo root)::

    python bench/ckpt/bench_export.py --size qwen0.5b --stages 2 3 --reps 3 --work .bench-tmp/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "tests" / "checkpoint" / "ds_build.py"
ENV = dict(os.environ, DS_ACCELERATOR="cpu",
           PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p))


def run_child(cmd):
    """Run `cmd`; return (exit code, wall seconds, peak RSS bytes, last line of stderr).

    Peak RSS comes from /usr/bin/time (%M) where it exists: the ru_maxrss that wait4 reports for a
    direct child also counts this (large) parent's memory at fork, which the kernel keeps across exec.
    """
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    with tempfile.NamedTemporaryFile(suffix=".rss") as rss_file:
        full = [timer, "-f", "%M", "-o", rss_file.name, *cmd] if timer else list(cmd)
        start = time.perf_counter()
        proc = subprocess.Popen(full, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = proc.stderr.read()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        rss = usage.ru_maxrss * 1024
        if timer:
            text = open(rss_file.name).read().split()
            rss = int(text[-1]) * 1024 if text and text[-1].isdigit() else rss
    lines = err.decode(errors="replace").strip().splitlines() if err else []
    errors = [ln.strip() for ln in lines if "Error" in ln or "share memory" in ln]
    return code, wall, rss, (errors[-1] if errors else (lines[-1] if lines else ""))


def build(size, stage, dest, big=False):
    spec = dict(stage=stage, world=2, dtype="bf16", arch="qwen2", tied=True, size=size, steps=1, reference=False)
    if big:  # >= 7B on a machine of 128 GiB: no Adam state, no step, created in bf16, untied (Qwen2.5-7B)
        spec.update(steps=0, optimizer="sgd", init_dtype="bf16", tied=False, fast_init=True)
    t0 = time.perf_counter()
    log = os.environ.get("BENCH_BUILD_LOG")  # stream the build's output there (a run that times out shows how far)
    if log:
        with open(log, "a") as f:
            proc = subprocess.run([sys.executable, str(BUILDER), json.dumps(spec), str(dest)],
                                  env=dict(ENV, DS_BUILD_TIMES="1"), stdout=f, stderr=subprocess.STDOUT, text=True)
        proc.stderr = open(log).read()
    else:
        proc = subprocess.run([sys.executable, str(BUILDER), json.dumps(spec), str(dest)], env=ENV,
                              capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"build failed:\n{proc.stderr[-4000:]}")
    return spec, time.perf_counter() - t0


def _hash(data) -> str:
    try:
        import xxhash

        return xxhash.xxh3_128_hexdigest(data)
    except ImportError:
        import zlib

        return f"{zlib.crc32(data):08x}"


def tensor_hashes(folder: Path):
    """name -> (dtype, shape, hash of the bytes) for every tensor of an output folder."""
    import torch
    from safetensors import safe_open

    out = {}
    bins = sorted(folder.glob("pytorch_model*.bin"))  # zero_to_fp32 shards at 5GB
    if bins:
        items = ((k, v) for f in bins
                 for k, v in torch.load(str(f), map_location="cpu", weights_only=True, mmap=True).items())
    else:
        items = ((k, h.get_tensor(k)) for f in sorted(folder.glob("*.safetensors"))
                 for h in [safe_open(str(f), framework="pt")] for k in h.keys())
    for key, t in items:
        raw = t.contiguous().view(-1).view(torch.uint8).numpy()
        out[key] = (str(t.dtype), tuple(t.shape), _hash(memoryview(raw)))
    return out


def compare_hashes(theirs, ours):
    """Bitwise comparison through per-tensor hashes (when both outputs do not fit on disk at once)."""
    equal, tied = True, []
    for key, value in theirs.items():
        name = key
        if key not in ours and key == "lm_head.weight":
            name = "model.embed_tokens.weight"
            tied.append(key)
        equal = equal and ours.get(name) == value
    return {"bitwise_equal": equal, "tensors_compared": len(theirs), "tied_written_once": tied,
            "zeropilot_tensors": len(ours), "zero_to_fp32_tensors": len(theirs), "by": "xxh3-128 of each tensor"}


def compare(ds_out: Path, zp_out: Path):
    """Bitwise comparison of zero_to_fp32's pytorch_model.bin with our safetensors."""
    import torch
    from safetensors import safe_open

    theirs = torch.load(str(ds_out / "pytorch_model.bin"), map_location="cpu", weights_only=True, mmap=True)
    files = sorted(zp_out.glob("*.safetensors"))
    where = {}
    handles = [safe_open(str(f), framework="pt") for f in files]
    for h in handles:
        for k in h.keys():
            where[k] = h
    equal, compared, tied = True, 0, []
    for key, tensor in theirs.items():
        name = key if key in where else None
        if name is None and key == "lm_head.weight":
            name, _ = "model.embed_tokens.weight", tied.append(key)
        got = where[name].get_tensor(name)
        compared += 1
        if got.dtype != tensor.dtype or not torch.equal(got, tensor):
            equal = False
    return {"bitwise_equal": equal, "tensors_compared": compared, "tied_written_once": tied,
            "zeropilot_tensors": len(where), "zero_to_fp32_tensors": len(theirs)}


def move_optim(save_dir: Path, dest: Path) -> None:
    """Move the optimizer files to `dest` (another file system), leaving symlinks: where the disk cannot
    hold the checkpoint and an export at once. Both tools read them through the same links."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in save_dir.rglob("*optim_states.pt"):
        target = dest / f"{f.parent.name}-{f.name}"
        shutil.move(str(f), str(target))
        f.symlink_to(target)


def bench_stage(size, stage, work: Path, reps: int, outputs: Path, low_disk: bool, safe_check: bool,
                big: bool, keep: bool = False, optim_dir: Path = None, z2f_args=()):
    ckpt_root = work / f"z{stage}"
    done = ckpt_root / "built.json"  # written after a whole build: --keep reuses it (a later call, same machine)
    if keep and done.exists():
        spec, build_s = json.loads(done.read_text())
    else:
        if ckpt_root.exists():
            shutil.rmtree(ckpt_root)
        spec, build_s = build(size, stage, ckpt_root, big)
        if optim_dir:
            move_optim(ckpt_root / "run", optim_dir / f"z{stage}")
        os.sync()  # no dirty pages of the build left to write back during the timed runs
        done.write_text(json.dumps([spec, build_s]))
        print(f"built ZeRO-{stage} in {build_s:.0f} s", flush=True)
    save_dir = ckpt_root / "run"
    ckpt_bytes = sum(f.stat().st_size for f in (save_dir).rglob("*.pt"))  # stat follows --optim-dir links
    ds_out, zp_out = outputs / f"out_ds_z{stage}", outputs / f"out_zp_z{stage}"
    cmds = {
        "zero_to_fp32": [sys.executable, str(save_dir / "zero_to_fp32.py"), str(save_dir), str(ds_out), *z2f_args],
        "zeropilot": [sys.executable, "-m", "zeropilot", "ckpt", "export", str(save_dir), str(zp_out),
                      "--dtype", "fp32", "--no-progress"],
    }
    runs = {k: [] for k in cmds}
    hashes = {}
    first = 1 if low_disk else 0  # rep 0 warms the page cache and is not counted (low_disk: no warm-up)
    for rep in range(first, reps + 1):
        for name, cmd in cmds.items():
            out_dir = ds_out if name == "zero_to_fp32" else zp_out
            if out_dir.exists():  # removed outside the timed run, for both
                shutil.rmtree(out_dir)
            code, wall, rss, tail = run_child(cmd)
            if code:
                raise SystemExit(f"{name} failed ({code}): {tail}")
            if rep:
                runs[name].append({"wall_s": round(wall, 3), "peak_rss_bytes": rss})
            if low_disk:  # hash, then delete: the next run (either tool) needs the room
                hashes[name] = tensor_hashes(out_dir)
                if name == "zeropilot":
                    out_bytes = sum(f.stat().st_size for f in zp_out.glob("*.safetensors"))
                shutil.rmtree(out_dir)
    result = {"stage": stage, "spec": spec, "build_s": round(build_s, 1), "checkpoint_bytes": ckpt_bytes,
              "warm_cache": not low_disk, "zero_to_fp32_args": list(z2f_args), "optimizer_files_in": str(optim_dir) if optim_dir else "the checkpoint",
              "output_bytes": out_bytes if low_disk else sum(f.stat().st_size for f in zp_out.glob("*.safetensors")),
              "runs": runs}
    for name in cmds:
        result[name] = {"wall_s_median": statistics.median(r["wall_s"] for r in runs[name]),
                        "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in runs[name])}
    result["wall_ratio"] = round(result["zeropilot"]["wall_s_median"] / result["zero_to_fp32"]["wall_s_median"], 3)
    result["rss_ratio"] = round(result["zeropilot"]["peak_rss_bytes_max"]
                                / result["zero_to_fp32"]["peak_rss_bytes_max"], 3)
    if low_disk:
        result["equality"] = compare_hashes(hashes["zero_to_fp32"], hashes["zeropilot"])
    else:
        result["equality"] = compare(ds_out, zp_out)
    safe_out = outputs / f"out_ds_safe_z{stage}"
    shutil.rmtree(zp_out, ignore_errors=True)
    if safe_check:
        code, _wall, _rss, tail = run_child(cmds["zero_to_fp32"][:3] + [str(safe_out), "--safe_serialization"])
        result["zero_to_fp32_safe_serialization"] = {"exit_code": code, "last_line": tail[-400:]}
    else:
        result["zero_to_fp32_safe_serialization"] = {"exit_code": None, "last_line": "not run"}
    for d in (ds_out, zp_out, safe_out) + (() if keep else (ckpt_root,)):
        shutil.rmtree(d, ignore_errors=True)
    return result


def machine():
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import deepspeed  # noqa: F401 - for its version only
    import torch

    return {"cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "memory_bytes": mem, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "deepspeed": sys.modules["deepspeed"].__version__}


def markdown(results, size, cmd):
    lines = [f"# ckpt export vs zero_to_fp32 ({size}, 2 ranks, bf16 training, fp32 output)", "",
             f"Command: `{cmd}`", "",
             f"Machine: {(results['machine'].get('gpu') + ' host, CPU side: ') if results['machine'].get('gpu') else ''}{results['machine']['cpus']} CPUs, {results['machine']['memory_bytes'] / 2**30:.0f} GiB, "
             f"torch {results['machine']['torch']}, deepspeed {results['machine']['deepspeed']}", "",
             "| stage | checkpoint | output | zero_to_fp32 wall | zeropilot wall | wall ratio | zero_to_fp32 peak RSS "
             "| zeropilot peak RSS | RSS ratio | bitwise equal | zero_to_fp32 --safe_serialization |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["stages"]:
        safe = r["zero_to_fp32_safe_serialization"]
        lines.append(
            f"| ZeRO-{r['stage']} | {r['checkpoint_bytes'] / 1e9:.2f} GB | {r['output_bytes'] / 1e9:.2f} GB "
            f"| {r['zero_to_fp32']['wall_s_median']:.2f} s | {r['zeropilot']['wall_s_median']:.2f} s "
            f"| {r['wall_ratio']:.2f} | {r['zero_to_fp32']['peak_rss_bytes_max'] / 1e9:.2f} GB "
            f"| {r['zeropilot']['peak_rss_bytes_max'] / 1e9:.2f} GB | {r['rss_ratio']:.2f} "
            f"| {r['equality']['bitwise_equal']} ({r['equality']['tensors_compared']} tensors) "
            f"| exit {safe['exit_code']}: {safe['last_line'][:120]} |")
    warm = all(r.get("warm_cache", True) for r in results["stages"])
    lines += ["", f"Wall: median of {results['reps']} runs" + (" after a warm-up run each (warm page cache)"
              if warm else ", no warm-up run (outputs do not fit twice on disk)")
              + "; peak RSS: max over those runs (/usr/bin/time %M of the command)."]
    extra = {" ".join(r.get("zero_to_fp32_args") or []) for r in results["stages"]} - {""}
    if extra:
        lines += ["", f"zero_to_fp32.py ran with `{', '.join(sorted(extra))}`: one output file. With its default 5GB "
                  "shards, DeepSpeed 0.19.8 writes the whole fp32 vector of a ZeRO-1/2 checkpoint into every shard "
                  "(its shards are views of one torch.cat; torch.save keeps whole storages)."]
    where = {r.get("optimizer_files_in", "the checkpoint") for r in results["stages"]} - {"the checkpoint"}
    if where:
        lines += ["", f"Optimizer files kept in {', '.join(sorted(where))} (tmpfs), linked from the checkpoint folder: "
                  "the machine's disk cannot hold the checkpoint and an export at once. Both tools read them "
                  "through the same links."]
    return "\n".join(lines) + "\n"


def render(json_path: Path) -> None:
    """Rewrite the markdown table of a results JSON (after a change of this renderer)."""
    results = json.loads(json_path.read_text())
    json_path.with_suffix(".md").write_text(markdown(results, results["size"], results["command"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="qwen0.5b")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench-tmp" / "ckpt")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--outputs", type=Path, help="where the exports go (default: --work)")
    parser.add_argument("--low-disk", action="store_true",
                        help="hash zero_to_fp32's output and delete it before zeropilot writes its own; no warm-up")
    parser.add_argument("--no-safe-check", action="store_true", help="skip the --safe_serialization run")
    parser.add_argument("--big", action="store_true", help=">=7B: SGD, no step, bf16 creation, untied")
    parser.add_argument("--keep", action="store_true",
                        help="reuse a checkpoint a previous run built whole in --work, and keep it")
    parser.add_argument("--optim-dir", type=Path,
                        help="keep the optimizer files there (e.g. a tmpfs), linked from the checkpoint")
    parser.add_argument("--z2f-args", default="", help="extra arguments for zero_to_fp32.py, e.g. "
                        "'--max_shard_size 100GB' (0.19.8 writes the whole fp32 vector into every ZeRO-1/2 shard)")
    parser.add_argument("--name", help="results file name: results-NAME.json (default: the size)")
    parser.add_argument("--render", type=Path, help="only re-render this results JSON as markdown")
    args = parser.parse_args()
    if args.render:
        return render(args.render)
    args.work.mkdir(parents=True, exist_ok=True)
    outputs = args.outputs or args.work
    outputs.mkdir(parents=True, exist_ok=True)
    results = {"size": args.size, "reps": args.reps, "machine": machine(), "stages": []}
    for stage in args.stages:
        results["stages"].append(bench_stage(args.size, stage, args.work, args.reps, outputs, args.low_disk,
                                             not args.no_safe_check, args.big, args.keep, args.optim_dir,
                                             args.z2f_args.split()))
        print(json.dumps(results["stages"][-1], indent=1), flush=True)
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    cmd = "python bench/ckpt/bench_export.py " + " ".join(sys.argv[1:])
    results["command"] = cmd
    args.results.mkdir(parents=True, exist_ok=True)
    name = args.name or args.size
    (args.results / f"results-{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.results / f"results-{name}.md").write_text(markdown(results, args.size, cmd))


if __name__ == "__main__":
    main()
