"""Run probe specs several at a time on one GPU, packing them by their predicted peak.

A spec starts when fewer than MAX_JOBS run and the predicted peaks (``pred_gib`` x 1.25 + 2 GiB each,
or ``cap_gib`` for capped runs) of the running ones plus its own stay under POOL_GIB. Each probe's
memory outside PyTorch is then read per process through NVML (``non_torch_nvml_gb``), since the
device-wide free memory counts the other probes; step times of concurrent runs are not comparable.
Results go to $OUT/probe.jsonl (with ``"concurrent": true``), failures to $OUT/fail.log.
Usage (repo root on the GPU machine): BUDGET_S=400 python3 bench/plan/run_parallel.py SPECS.jsonl
"""
import json
import os
import subprocess
import sys
import time

MAX_JOBS, POOL_GIB = 4, 126.0
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ["OUT"]
start = time.time()
deadline = start + float(os.environ.get("BUDGET_S", "400"))


def need(spec):
    return spec["cap_gib"] if spec.get("cap_gib") else spec.get("pred_gib", 40) * 1.25 + 2


def launch(spec):
    out = open(f"/tmp/o.{len(done) + len(running)}.{spec['name']}", "w+")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "zero_mem_probe_plan.py"), json.dumps(spec)],
                            stdout=out, stderr=subprocess.STDOUT)
    return proc, out, time.time()


def collect(spec, proc, out, t0):
    out.seek(0)
    text = out.read()
    lines = [x for x in text.splitlines() if x.startswith("RESULT ")]
    if lines:
        res = json.loads(lines[-1][7:])
        res["concurrent"] = True
        with open(os.path.join(OUT, "probe.jsonl"), "a") as f:
            f.write(json.dumps(res) + "\n")
        print(f"ok {spec['name']} {res.get('status')} {time.time() - t0:.0f}s (t={time.time() - start:.0f}s)", flush=True)
    else:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.write(f"FAILED rc={proc.returncode} {json.dumps(spec)}\n{text[-1500:]}\n")
        print(f"FAILED {spec['name']} (t={time.time() - start:.0f}s)", flush=True)


pending = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
running, done = [], []
while pending or running:
    for item in list(running):
        spec, proc, out, t0 = item
        if proc.poll() is not None or time.time() - t0 > 220 or time.time() > deadline + 20:
            if proc.poll() is None:
                proc.kill(); proc.wait()
            collect(spec, proc, out, t0)
            running.remove(item); done.append(spec)
    used = sum(need(s) for s, *_ in running)
    if time.time() < deadline - 45:
        for spec in list(pending):
            if len(running) < MAX_JOBS and used + need(spec) <= POOL_GIB:
                running.append((spec, *launch(spec))); pending.remove(spec); used += need(spec)
    elif pending:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.writelines(f"SKIPPED(budget) {json.dumps(s)}\n" for s in pending)
        pending = []
    time.sleep(0.5)
print(f"elapsed {time.time() - start:.0f}s", flush=True)
