"""Issue 40's timing rows: each spec of a file in its own process, one at a time on one GPU, under a time budget.

Unlike ``../run_x2.py`` and ``../settings/run.py`` (which pack runs side by side for memory), nothing else runs on
the GPU while a row is timed. In the file's order, each row:
- is skipped (``"status": "skipped", "skipped": "budget"``) when the budget left is less than its ``est_wall_s`` +
  ``--margin-s``, or (``"skipped": "build"``) when the DeepSpeed op its optimizer needs failed to build;
- is not run again when ``OUT/rows.jsonl`` already holds a result of its id (``row``, else ``name``): a second call
  resumes a killed one (device.sh's RESUME_ROWS); skipped rows are tried again;
- runs as ``PROBE... '<spec json>'`` (``--probe``; default: ``python3 ../zero_mem_probe_plan.py``) with
  ``CUDA_VISIBLE_DEVICES=--gpu``, in a process group of its own, killed with that group at its timeout
  (``timeout_s``, or twice ``est_wall_s`` and at least ``est_wall_s`` + 60 s, never past the budget) or
  ``--grace-s`` after its ``RESULT`` line (``killed_after_result``);
- appends one line to ``OUT/rows.jsonl`` as it ends: the probe's ``RESULT`` object (or ``status`` "failed" /
  "timeout" without one) with the row's id as ``row``, and ``runner``: wall time, exit code, timeout,
  ``est_wall_s``, start time, the GPU's clocks, power and temperature as it started (``gpu_before``); failures
  and non-ok rows get their output's tails in ``OUT/fail.log``; whole logs go to ``--logs`` (outside OUT: the
  device returns 8 files).
Before the rows, ``OUT/machine.json``: versions (package metadata, no import), ``nvidia-smi`` (GPU, clocks, power,
``-q`` text), CPU count, the environment that matters; ``after`` the same clocks at the end. The DeepSpeed ops the
rows' optimizers need (FusedAdam, CPUAdam: ``spec_check.op_builds``) are built once first, side by side
(``--build-cmd``; default ``build_op.py``) into the ``TORCH_EXTENSIONS_DIR`` all rows share (default
``/tmp/zp_torch_extensions``), each build's time in ``machine.json`` ``op_builds``.
The spec file is checked first (``spec_check.py``, timing rules); any problem stops the call before the GPU is touched.
Usage: python3 run_rows.py SPECS.jsonl OUT [--budget-s 480] [--margin-s 15] [--gpu 0] [--probe CMD]
       python3 run_rows.py SPECS.jsonl --check      (the spec check alone, no GPU: run it before a call)
"""
import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spec_check as specs_mod  # noqa: E402

PROBE = [sys.executable, os.path.join(os.path.dirname(HERE), "zero_mem_probe_plan.py")]
BUILD = [sys.executable, os.path.join(HERE, "build_op.py")]
PACKAGES = ("torch", "deepspeed", "transformers", "peft", "accelerate", "liger-kernel", "triton", "pydantic",
            "pydantic-core", "hjson", "py-cpuinfo", "ninja", "numpy", "pynvml", "nvidia-ml-py")
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "TORCH_EXTENSIONS_DIR", "PYTORCH_CUDA_ALLOC_CONF", "PYTHONPATH", "NCCL_NVLS_ENABLE",
            "OMP_NUM_THREADS", "TORCH_CUDA_ARCH_LIST", "DS_ACCELERATOR")
OP_LOAD = re.compile(r"Time to load (\w+) op: ([0-9.]+) seconds")
TAIL = 3000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("specs")
    p.add_argument("out", nargs="?")
    p.add_argument("--check", action="store_true", help="check the spec file and exit")
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--margin-s", type=float, default=15.0, help="added to est_wall_s before a row may start")
    p.add_argument("--gpu", default="0")
    p.add_argument("--probe", help="the probe command (the spec JSON is appended); default: the probe of this tree")
    p.add_argument("--build-cmd", help="the op-build command (the op's name is appended); default: build_op.py")
    p.add_argument("--build-timeout-s", type=float, default=420.0)
    p.add_argument("--grace-s", type=float, default=20.0, help="how long a row may take to exit after its RESULT")
    p.add_argument("--logs", default="/tmp/zp_time_logs", help="each row's whole stdout/stderr (kept out of OUT)")
    p.add_argument("--min-warmup", type=int, default=2)
    p.add_argument("--min-timed", type=int, default=5)
    args = p.parse_args(argv)
    if not args.check and not args.out:
        p.error("OUT is needed unless --check")
    return args


def versions():
    from importlib import metadata
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_text(cmd, timeout=30):
    """A command's stdout, or what went wrong as text (a missing nvidia-smi is an answer, not an error)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.stdout if r.returncode == 0 else f"rc={r.returncode}: {r.stderr.strip()[-500:]}"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"


def gpu_state():
    # long-standing fields only (one unknown field fails the whole query); why clocks drop: nvidia_smi_q
    fields = ("name,memory.total,driver_version,pstate,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,"
              "clocks.max.sm,clocks.max.mem,utilization.gpu,memory.used")
    return {"query": run_text(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"]).strip(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def machine():
    return {"versions": versions(), "gpu": gpu_state(),
            "nvidia_smi_q": run_text(["nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE,MEMORY"]),
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "env": {k: os.environ.get(k) for k in ENV_KEYS}}


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def append_row(out, row):
    with open(os.path.join(out, "rows.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def append_fail(out, text):
    with open(os.path.join(out, "fail.log"), "a") as f:
        f.write(text.rstrip("\n") + "\n")


def done_ids(out):
    """Row ids with a result in OUT/rows.jsonl (skipped rows are not results: a later call runs them)."""
    path = os.path.join(out, "rows.jsonl")
    done = set()
    if os.path.exists(path):
        for line in open(path):
            if line.strip():
                row = json.loads(line)
                if row.get("status") != "skipped":
                    done.add(row.get("row") or specs_mod.row_id(row.get("spec", {})))
    return done


def results_in(text):
    """The ``RESULT {json}`` objects a process printed, in order."""
    out = []
    for line in text.splitlines():
        if "RESULT " in line:
            try:
                out.append(json.loads(line[line.index("RESULT ") + 7:]))
            except ValueError:
                pass
    return out


def row_timeout(spec, left, margin):
    """A row's timeout: its own, else twice its estimate (at least the estimate + 60 s); never past the budget."""
    est = float(spec["est_wall_s"])
    own = float(spec["timeout_s"]) if spec.get("timeout_s") else max(2 * est, est + 60)
    return max(1.0, min(own, left - margin / 3))


RUNNING = []  # the process group of the row or build running now (the signal handler ends it)


def descendants(pid):
    """Every live process under ``pid`` (from /proc): ninja runs each compiler in a process group of its own, so
    killing a row's or a build's group leaves them running otherwise."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_group(proc, wait=True):
    """End ``proc``'s process group (it and what it started) and every process under it, by id. From a signal
    handler ``wait=False``: the interrupted ``proc.wait`` may hold Popen's wait lock."""
    under = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in under:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if wait:
        proc.wait()


def on_term(signum, frame):
    """Killed from outside (the command's time limit): end the row's processes too, which hold the GPU."""
    for proc in RUNNING:
        kill_group(proc, wait=False)
    sys.exit(128 + signum)


def run_process(cmd, env, timeout, log_base, grace_after_result=None):
    """Run ``cmd`` in a process group of its own (the same session: the device's end of a command still reaches
    it); kill that group at ``timeout``, or ``grace_after_result`` seconds after it printed its ``RESULT`` line (a
    process that hangs in its exit, in NCCL's teardown say, costs no more). Returns (rc or None, stdout, stderr,
    wall seconds)."""
    t0 = time.time()
    with open(log_base + ".out", "w+") as so, open(log_base + ".err", "w+") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env, process_group=0)
        RUNNING.append(proc)
        rc, result_at = None, None
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.time()
                if grace_after_result is not None and result_at is None:
                    with open(log_base + ".out") as f:
                        result_at = now if "RESULT " in f.read() else None
                if now - t0 > timeout or (result_at is not None and now - result_at > grace_after_result):
                    kill_group(proc)
                    break
        finally:
            RUNNING.remove(proc)
        so.seek(0)
        se.seek(0)
        return rc, so.read(), se.read(), time.time() - t0


def build_ops(names, args, env, deadline, out):
    """Each op once, before the rows, side by side (each in its own folder of the TORCH_EXTENSIONS_DIR the rows
    then load it from; a build uses the CPU, and no row runs yet)."""
    builds = {}
    cmd = shlex.split(args.build_cmd) if args.build_cmd else BUILD
    left = deadline - time.time()
    if names and left < args.margin_s:
        return {name: {"ok": False, "error": "no budget left to build it"} for name in names}
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        done = dict(zip(names, pool.map(lambda name: run_process(
            cmd + [name], env, min(args.build_timeout_s, left - args.margin_s / 3),
            os.path.join(args.logs, f"build_{name}")), names)))
    for name in names:
        rc, so, se, wall = done[name]
        builds[name] = {"ok": rc == 0, "wall_s": round(wall, 2), "rc": rc}
        m = OP_LOAD.search(so + se)
        if m:
            builds[name]["load_s"] = float(m.group(2))  # DeepSpeed's own figure: the build and the load
        if rc is None:  # killed mid-build: torch's FileBaton lock would make every later load of it wait forever
            lock = os.path.join(env["TORCH_EXTENSIONS_DIR"], name, "lock")
            if os.path.exists(lock):
                os.remove(lock)
                builds[name]["removed_lock"] = lock
        if rc != 0:
            builds[name]["error"] = (se or so).strip()[-TAIL:]
            append_fail(out, f"BUILD {name} failed (rc={rc}, {wall:.0f}s)\n{(so + se)[-TAIL:]}\n")
        print(f"build {name}: {'ok' if rc == 0 else 'FAILED'} {wall:.1f}s", flush=True)
    return builds


def run_row(spec, args, env, deadline, probe):
    left = deadline - time.time()
    timeout = row_timeout(spec, left, args.margin_s)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    before = gpu_state()["query"]  # clocks, power and temperature as the row starts (a hot card clocks down)
    rid = specs_mod.row_id(spec)
    rc, so, se, wall = run_process(probe + [json.dumps(spec)], env, timeout, os.path.join(args.logs, rid),
                                   grace_after_result=args.grace_s)
    found = results_in(so)
    row = dict(found[-1]) if found else {"spec": spec, "status": "timeout" if rc is None else "failed"}
    row["row"] = rid
    row["runner"] = {"wall_s": round(wall, 3), "rc": rc, "timeout_s": round(timeout, 1),
                     "est_wall_s": spec["est_wall_s"], "started": started, "gpu": args.gpu, "gpu_before": before}
    if rc is None and found:
        row["runner"]["killed_after_result"] = True
    return row, so, se


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    signal.signal(signal.SIGTERM, on_term)
    rows, errors = specs_mod.read(args.specs, timing=True, min_warmup=args.min_warmup, min_timed=args.min_timed)
    if errors:
        for e in errors:
            print(f"run_rows: {args.specs}: {e}", file=sys.stderr)
        print(f"run_rows: {len(errors)} problem(s) in {args.specs}; nothing ran", file=sys.stderr)
        return 2
    if args.check:
        est = sum(float(s["est_wall_s"]) for s in rows)
        print(f"{args.specs}: {len(rows)} rows, est_wall_s {est:.0f} s in all "
              f"(+{args.margin_s:.0f} s margin each to start), ops to build: {specs_mod.op_builds(rows) or 'none'}")
        return 0
    deadline = start + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.logs, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=args.gpu, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    env.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/zp_torch_extensions")
    info = machine()
    info["env"]["TORCH_EXTENSIONS_DIR"] = env["TORCH_EXTENSIONS_DIR"]
    info.update(specs=os.path.abspath(args.specs), budget_s=args.budget_s, margin_s=args.margin_s)
    write_json(os.path.join(args.out, "machine.json"), info)
    print(f"machine: {info['gpu']['query']}", flush=True)
    done = done_ids(args.out)
    todo = [s for s in rows if specs_mod.row_id(s) not in done]
    if len(todo) < len(rows):
        print(f"resume: {len(rows) - len(todo)} rows already in {args.out}/rows.jsonl", flush=True)
    info["op_builds"] = build_ops(specs_mod.op_builds(todo), args, env, deadline, args.out)
    write_json(os.path.join(args.out, "machine.json"), info)
    failed_builds = {n for n, b in info["op_builds"].items() if not b["ok"]}
    probe = shlex.split(args.probe) if args.probe else PROBE
    counts = {}
    for spec in todo:
        left = deadline - time.time()
        need_build = set(specs_mod.op_builds([spec])) & failed_builds
        if need_build or left < float(spec["est_wall_s"]) + args.margin_s:
            why = "build" if need_build else "budget"
            row = {"row": specs_mod.row_id(spec), "spec": spec, "status": "skipped", "skipped": why,
                   "budget_left_s": round(left, 1)}
            append_row(args.out, row)
            counts["skipped"] = counts.get("skipped", 0) + 1
            print(f"skipped ({why}) {specs_mod.row_id(spec)} (est {spec['est_wall_s']} s, {left:.0f} s left)",
                  flush=True)
            continue
        row, so, se = run_row(spec, args, env, deadline, probe)
        append_row(args.out, row)
        status = row.get("status")
        counts[status] = counts.get(status, 0) + 1
        if status != "ok":
            append_fail(args.out, f"{str(status).upper()} {specs_mod.row_id(spec)} rc={row['runner']['rc']} "
                                  f"{row['runner']['wall_s']:.0f}s {json.dumps(spec)}\n"
                                  f"--- stderr ---\n{se[-TAIL:]}\n--- stdout ---\n{so[-TAIL // 3:]}\n")
        median = row.get("step_median_s")
        print(f"{status} {specs_mod.row_id(spec)} {row['runner']['wall_s']:.1f}s"
              + (f" step_median {median:.4f}s" if median is not None else "")
              + f" ({deadline - time.time():.0f}s left)", flush=True)
    info["after"] = gpu_state()
    info["elapsed_s"] = round(time.time() - start, 1)
    info["counts"] = counts
    write_json(os.path.join(args.out, "machine.json"), info)
    print(f"rows: {counts or 'none run'}; {info['elapsed_s']:.0f}s of {args.budget_s:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
