"""Run issue 26's settings specs (``data/specs.jsonl``) with ``../zero_mem_probe_plan.py`` on one GPU, up to
MAX_JOBS at a time while their predicted peaks (``pred_gib`` x 1.25 + 2 GiB each) stay under POOL_GIB, the largest
first (each next row the largest that fits beside those running).

PyTorch's peak allocated and reserved are each process's own counters; memory outside PyTorch is NVML's per-process
figure (``non_torch_nvml_gb``), since the device-wide free memory counts the other probes (rows carry
``"concurrent": true``). Results go to $OUT/probe.jsonl, failures (with the probe's last output) to $OUT/fail.log;
one line per row is printed as it ends.
Usage (repo root on the GPU machine): OUT=DIR BUDGET_S=250 [SKIP_ROWS=row,row] python3 bench/plan/settings/run.py
[SPECS.jsonl]
"""
import json
import os
import subprocess
import sys
import time

MAX_JOBS, ROW_LIMIT_S = 4, 200
POOL_GIB = float(os.environ.get("POOL_GIB", "126"))  # GiB of the GPU the rows may be packed into
HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(os.path.dirname(HERE), "zero_mem_probe_plan.py")
OUT = os.environ["OUT"]
start = time.time()
deadline = start + float(os.environ.get("BUDGET_S", "250"))


def need(spec):
    return spec.get("pred_gib", 40) * 1.25 + 2


def line_of(res):
    snaps = {s["tag"]: s for s in res.get("snaps", [])}
    st = snaps.get("steady", snaps.get("at_oom", {}))
    init = snaps.get("after_init", {})
    return (f"{res['spec']['row']:12s} {res.get('status')} trainable={res.get('n_trainable', 0) / 1e6:.1f}M "
            f"init peakA={init.get('peak_alloc', 0):.2f} peakR={init.get('peak_reserved', 0):.2f} | step "
            f"peakA={st.get('peak_alloc', 0):.2f} peakR={st.get('peak_reserved', 0):.2f} GiB "
            f"nvml_non_torch={res.get('non_torch_nvml_gb')} step={res.get('step_s') or 0:.2f}s")


def collect(spec, proc, out, t0):
    out.seek(0)
    text = out.read()
    results = [x for x in text.splitlines() if x.startswith("RESULT ")]
    if results:
        res = json.loads(results[-1][7:])
        res["concurrent"] = True
        with open(os.path.join(OUT, "probe.jsonl"), "a") as f:
            f.write(json.dumps(res) + "\n")
        print(f"{line_of(res)} ({time.time() - t0:.0f}s, t={time.time() - start:.0f}s)", flush=True)
    else:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.write(f"FAILED rc={proc.returncode} {json.dumps(spec)}\n{text[-3000:]}\n")
        print(f"FAILED {spec['row']} (t={time.time() - start:.0f}s)", flush=True)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data", "specs.jsonl")
    skip = set(filter(None, os.environ.get("SKIP_ROWS", "").split(",")))  # rows left out when device time is short
    pending = sorted((s for s in map(json.loads, filter(str.strip, open(path))) if s["row"] not in skip),
                     key=need, reverse=True)  # largest first
    if skip:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.write(f"SKIPPED(SKIP_ROWS) {sorted(skip)}\n")
    running = []
    while pending or running:
        for item in list(running):
            spec, proc, out, t0 = item
            if proc.poll() is not None or time.time() - t0 > ROW_LIMIT_S or time.time() > deadline + 20:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                collect(spec, proc, out, t0)
                running.remove(item)
        used = sum(need(s) for s, *_ in running)
        if time.time() < deadline - 45:
            for spec in list(pending):
                if len(running) < MAX_JOBS and used + need(spec) <= POOL_GIB:
                    out = open(os.path.join("/tmp", f"zp_settings.{spec['row']}.log"), "w+")
                    proc = subprocess.Popen([sys.executable, PROBE, json.dumps(spec)], stdout=out,
                                            stderr=subprocess.STDOUT)
                    running.append((spec, proc, out, time.time()))
                    pending.remove(spec)
                    used += need(spec)
        elif pending:
            with open(os.path.join(OUT, "fail.log"), "a") as f:
                f.writelines(f"SKIPPED(budget) {json.dumps(s)}\n" for s in pending)
            pending = []
        time.sleep(0.5)
    print(f"elapsed {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
