"""DeepSpeed 0.19.8's autotuner on one case, bounded in wall time, with what it chose and measured (issue 40, item 6).

Runs ``deepspeed --autotuning tune --num_gpus 1 autotune_train.py --deepspeed_config CONFIG ...`` (the launcher's
``run_autotuning``: ``Autotuner.tune``, ``print_tuning_results``, ``write_optimal_config``; ``tune`` writes the
choice, ``run`` would then train with it) on one model shape, sequence length and global batch, and writes
``OUT/autotune.json``: its wall time, the configuration it chose (ZeRO stage, micro batch, accumulation: its
``ds_config_optimal.json``), the metrics it measured for that choice (its ``metrics.json``: ``latency`` in
microseconds per optimizer step, ``throughput`` = train_batch_size x 1e6 / latency in samples per second, ``fwd``/
``bwd``/``step`` in microseconds per micro batch; and the derived ``step_s``/``samples_per_s``), every experiment
it ran (stage, micro batch, accumulation, metric or error, wall time), the lines of its log that say which ZeRO
stages it tuned or skipped and why, and where it wrote everything (``--workdir``, packed into
``OUT/autotune.tar.gz`` with its log).

What is bounded, and how (``autotuning/autotuner.py``, ``scheduler.py``, ``runtime/engine.py``):
- ``fast: true`` (its default): per ZeRO stage only the micro batch is tuned, no bucket or overlap grid; every
  experiment's ``zero_optimization`` is ``{"stage": s}`` alone (``run_tuning_micro_batch_sizes``), DeepSpeed's
  defaults for the rest.
- the stages it may try: ``zero_optimization.stage`` a list (``--stages``, default 1,2,3; stage 0 needs "all" or 0).
- the micro batches: ``train_micro_batch_size_per_gpu`` a list (``--micro-batches``): the autotuner then runs
  exactly those for each stage (``tuning_micro_batch_sizes_overwritten``: no search for the largest that fits, no
  binary search), with accumulation = global batch / micro batch (``gradient_accumulation_steps`` = global batch /
  the largest micro batch; ``max_train_batch_size_per_gpu`` = largest x that).
- profile steps: ``start_profile_step`` (the flops profiler's step) 2 and ``end_profile_step`` 3 by default (its
  defaults 3 and 5): the engine exits at ``global_steps == end + 1``; the latency it reports is the mean forward +
  backward + step of the micro batches of the last optimizer step (the global timers are logged and reset at every
  boundary before that), times the accumulation.
- one model-info run first (ZeRO-3, micro batch 1, exits in its first forward): the parameter count and activation
  memory that gate each stage (fp32 Adam arithmetic: 16 bytes a parameter, as ``fp16`` is off, + the activation
  must fit the GPU; a stage is also skipped when its computed largest micro batch is under the previous stage's).
- the whole run under ``--wall-s`` (default 330): past it the autotuner's processes are killed and what finished is
  reported, with ``error``; each experiment under ``--exp-timeout-s`` (its script ends itself).
Two stand-ins on ``PATH`` for its subprocesses: ``deepspeed`` (this Python's launcher; the experiments are started
by that name) and ``pdsh``, which does nothing: after each experiment its ``clean_up`` runs ``pdsh ... pkill -f
<experiment name>`` for multi-node jobs; on one node the experiment has ended when it is called. ``mlflow`` is kept out
of the autotuner (with it installed ``tune`` reads ``MLFLOW_RUN_ID`` from the environment).
Usage: python3 autotune.py OUT MODEL_JSON --global-batch 16 --seq 2048 [--micro-batches 2,4] [--stages 1,2,3]
       [--lora R] [--gc] [--start-step 2 --end-step 3] [--wall-s 330] [--exp-timeout-s 150]
MODEL_JSON: a file of HF config fields (``model_type`` ...) or the JSON itself.
"""
import argparse
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_rows import kill_group  # noqa: E402  (the group and every process under it: ninja's own groups too)

TRAIN = os.path.join(HERE, "autotune_train.py")
#: the autotuner's log lines worth keeping (autotuner.py's logger.info texts)
LOG_KEYS = ("runable", "No need to tune", "optimal setup", "Tuning completed", "calculated_max_micro_batch_size",
            "activation memory", "parameters.", "tuning_micro_batch_sizes", "not run successfully",
            "did not run successfully", "No optimal", "Memory per GPU", "User-defined zero stages", "not runnable")
LAUNCHER = ("import sys; sys.modules['mlflow'] = None; sys.argv[0] = 'deepspeed'; "
            "from deepspeed.launcher.runner import main; main()")


def autotuning_config(global_batch, micro_batches, stages, start_step, end_step, results_dir, exps_dir):
    """The DeepSpeed config the autotuner reads (``--deepspeed_config``): the training settings and the
    ``autotuning`` block. Raises ValueError with one sentence when the case cannot be tuned as asked."""
    micro_batches = sorted(set(int(m) for m in micro_batches))
    stages = sorted(set(int(s) for s in stages))
    if not micro_batches or micro_batches[0] < 1:
        raise ValueError("micro batches must be integers >= 1")
    if any(global_batch % m for m in micro_batches):
        raise ValueError(f"every micro batch must divide the global batch {global_batch} (accumulation = global "
                         f"batch / micro batch): {micro_batches}")
    if not stages or not set(stages) <= {0, 1, 2, 3}:
        raise ValueError(f"stages must be among 0-3: {stages}")
    if not 0 <= start_step < end_step:
        raise ValueError(f"start_step {start_step} must be below end_step {end_step} (the flops profiler's step "
                         "is slowed by its hooks; the latency is read at the last step)")
    return {
        "train_micro_batch_size_per_gpu": micro_batches,
        "gradient_accumulation_steps": global_batch // micro_batches[-1],
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True, "adam_w_mode": True}},
        "zero_optimization": {"stage": stages},
        "steps_per_print": 10**9,
        "autotuning": {
            "enabled": True, "fast": True, "metric": "throughput", "tuner_type": "gridsearch",
            "start_profile_step": start_step, "end_profile_step": end_step,
            "results_dir": results_dir, "exps_dir": exps_dir, "overwrite": True,
        },
    }


def write_shims(bin_dir, python):
    os.makedirs(bin_dir, exist_ok=True)
    shims = {
        "deepspeed": f'#!/bin/sh\n# the launcher of this Python, by the name the autotuner starts experiments with\n'
                     f'exec "{python}" -u -c "import sys; sys.argv[0] = \'deepspeed\'; '
                     f'from deepspeed.launcher.runner import main; main()" "$@"\n',
        "pdsh": "#!/bin/sh\n# the autotuner's clean_up (pdsh ... pkill -f EXP_NAME, for multi-node jobs): on one\n"
                "# node the experiment has ended when it is called; nothing to do\nexit 0\n",
    }
    for name, text in shims.items():
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)


def first_error(path):
    """The autotuner's own test of an experiment (``search_error``): the text after the first 'error' of stderr."""
    if not os.path.exists(path):
        return "stderr.log does not exist"
    for line in open(path, errors="replace"):
        for s in ("Error", "error", "ERROR"):
            if s in line:
                return line[line.index(s) + len(s):].lstrip(": ").strip()[:300]
    return None


def _json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def experiments(results_dir):
    """Each experiment folder of the results: its stage, micro batch, accumulation, metrics or error, wall time."""
    out = []
    for d in sorted(glob.glob(os.path.join(results_dir, "*", ""))):
        cfg = _json(os.path.join(d, "ds_config.json")) or {}
        metrics = _json(os.path.join(d, "metrics.json"))
        start = os.path.join(d, "exp.json")  # written as it starts; its logs are closed (fsync) as it ends
        ends = [os.path.getmtime(p) for p in (os.path.join(d, "stdout.log"), os.path.join(d, "stderr.log"))
                if os.path.exists(p)]
        wall = max(ends) - os.path.getmtime(start) if ends and os.path.exists(start) else None
        out.append({"name": os.path.basename(os.path.dirname(d)),
                    "stage": (cfg.get("zero_optimization") or {}).get("stage"),
                    "mb": cfg.get("train_micro_batch_size_per_gpu"), "ga": cfg.get("gradient_accumulation_steps"),
                    "metrics": metrics, "model_info": _json(os.path.join(d, "model_info.json")),
                    "error": first_error(os.path.join(d, "stderr.log")),
                    "wall_s": None if wall is None else round(wall, 1),
                    "cmd": open(os.path.join(d, "cmd.txt")).read().strip()
                    if os.path.exists(os.path.join(d, "cmd.txt")) else None})
    return out


def derived(metrics, train_batch_size):
    """Seconds per optimizer step and samples per second from the autotuner's ``latency``, which is in
    microseconds: ``SynchronizedWallClockTimer.get_mean`` multiplies the timers' milliseconds by 1000 again
    (utils/timer.py), so its ``throughput`` (train_batch_size x 1e6 / latency) is samples per second."""
    if not metrics or not metrics.get("latency"):
        return {}
    return {"step_s": metrics["latency"] / 1e6, "samples_per_s": train_batch_size * 1e6 / metrics["latency"]}


def collect(results_dir, log_text):
    """What the autotuner chose and measured, read from its results folder and its log."""
    exps = experiments(results_dir)
    optimal = _json(os.path.join(results_dir, "ds_config_optimal.json"))
    cmd_path = os.path.join(results_dir, "cmd_optimal.txt")
    cmd = open(cmd_path).read().strip() if os.path.exists(cmd_path) else None
    chosen = None
    if optimal:
        best = next((e for e in exps if cmd and e["cmd"] == cmd), None)
        tbs = optimal.get("train_batch_size") or (optimal.get("train_micro_batch_size_per_gpu", 0)
                                                  * optimal.get("gradient_accumulation_steps", 0))
        chosen = {"stage": (optimal.get("zero_optimization") or {}).get("stage"),
                  "mb": optimal.get("train_micro_batch_size_per_gpu"),
                  "ga": optimal.get("gradient_accumulation_steps"), "train_batch_size": tbs,
                  "experiment": best["name"] if best else None,
                  "metrics": best["metrics"] if best else None,
                  **derived(best["metrics"] if best else None, tbs), "ds_config": optimal}
    lines = [x.strip() for x in log_text.splitlines() if any(k in x for k in LOG_KEYS)]
    return {"chosen": chosen, "experiments": [{k: v for k, v in e.items() if k != "cmd"} for e in exps],
            "log_lines": lines[-60:]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("model", help="a file of HF config fields, or the JSON itself")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--micro-batches", default="2,4")
    p.add_argument("--stages", default="1,2,3")
    p.add_argument("--lora", type=int, default=0)
    p.add_argument("--gc", action="store_true")
    p.add_argument("--start-step", type=int, default=2)
    p.add_argument("--end-step", type=int, default=3)
    p.add_argument("--wall-s", type=float, default=330.0)
    p.add_argument("--exp-timeout-s", type=float, default=150.0)
    p.add_argument("--workdir", default="/tmp/zp_autotune")
    p.add_argument("--master-port", type=int, default=29700)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    report = {"args": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out_json = os.path.join(args.out, "autotune.json")
    try:
        model = json.loads(args.model) if args.model.lstrip().startswith("{") else json.load(open(args.model))
        if not isinstance(model, dict) or "model_type" not in model:
            raise ValueError("the model must be a JSON object of HF config fields with a model_type")
        work = os.path.abspath(args.workdir)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        results, exps = os.path.join(work, "results"), os.path.join(work, "exps")
        config = autotuning_config(args.global_batch, args.micro_batches.split(","), args.stages.split(","),
                                   args.start_step, args.end_step, results, exps)
    except (OSError, ValueError) as e:
        print(f"autotune: {e}", file=sys.stderr)
        report["error"] = str(e)
        json.dump(report, open(out_json, "w"), indent=1)
        return 2
    missing = [m for m in ("deepspeed", "tabulate") if importlib.util.find_spec(m) is None]
    if missing:  # the autotuner asserts tabulate (deepspeed[autotuning]) only once it starts
        report["error"] = f"not importable here: {', '.join(missing)} (carry their wheels)"
        print(f"autotune: {report['error']}", file=sys.stderr)
        json.dump(report, open(out_json, "w"), indent=1)
        return 2
    cfg_path, model_path = os.path.join(work, "ds_config.json"), os.path.join(work, "model.json")
    json.dump(config, open(cfg_path, "w"), indent=1)
    json.dump(model, open(model_path, "w"))
    write_shims(os.path.join(work, "bin"), sys.executable)
    # PYTHONWARNINGS: the autotuner fails an experiment for any 'error' in its stderr, which the launcher processes
    # share (a warning's text would do); the training script sends its own stderr to stdout
    env = dict(os.environ, PATH=os.path.join(work, "bin") + os.pathsep + os.environ.get("PATH", ""),
               PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0", PYTHONWARNINGS="ignore")
    cmd = ([sys.executable, "-u", "-c", LAUNCHER, "--autotuning", "tune", "--num_gpus", "1",
            "--master_port", str(args.master_port), TRAIN, "--deepspeed_config", cfg_path,
            "--model-file", model_path, "--seq", str(args.seq), "--exp-timeout-s", str(args.exp_timeout_s)]
           + (["--lora", str(args.lora)] if args.lora else []) + (["--gc"] if args.gc else []))
    report.update(command=cmd, config=config, workdir=work, results_dir=results, exps_dir=exps)
    log_path = os.path.join(work, "autotune.log")
    t0 = time.time()
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, process_group=0)

        def kill(wait=True):  # the autotuner's process group (it and the experiment it runs) and all under it
            kill_group(proc, wait)
        terminated = []
        # stopped from outside (the command's limit): end the autotuner, then report what finished
        signal.signal(signal.SIGTERM, lambda signum, frame: (terminated.append(signum), kill(wait=False)))
        try:
            rc = proc.wait(timeout=args.wall_s)
        except subprocess.TimeoutExpired:
            kill()
            rc = None
        log.seek(0)
        log_text = log.read()
    report.update(wall_s=round(time.time() - t0, 1), rc=rc, **collect(results, log_text),
                  log_tail=log_text[-4000:])
    report["experiments_wall_s"] = round(sum(e["wall_s"] or 0 for e in report["experiments"]), 1)
    if terminated:
        report["error"] = "stopped from outside (SIGTERM): the autotuner was killed"
    elif rc is None:
        report["error"] = f"the wall bound ({args.wall_s:.0f} s) was reached: the autotuner was killed"
    elif rc != 0:
        report["error"] = f"the autotuner exited with {rc} (log_tail)"
    elif not report["chosen"]:
        report["error"] = "the autotuner chose nothing (no experiment gave a metric: see experiments and log_lines)"
    with tarfile.open(os.path.join(args.out, "autotune.tar.gz"), "w:gz") as tar:
        tar.add(work, arcname="autotune")
    report["total_s"] = round(time.time() - t_start, 1)
    json.dump(report, open(out_json, "w"), indent=1)
    chosen = report["chosen"]
    print(f"autotune: {report['wall_s']:.0f}s, {len(report['experiments'])} experiments, "
          + (f"chose ZeRO-{chosen['stage']} mb {chosen['mb']} ga {chosen['ga']}"
             + (f" ({chosen['step_s']:.3f} s/step)" if chosen.get("step_s") else "") if chosen
             else f"no choice: {report.get('error')}"), flush=True)
    return 0 if chosen and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
