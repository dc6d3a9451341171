"""Run probe specs on a 2-GPU machine: world-size-1 specs packed on either GPU, world-size-2 specs on both.

A spec needs ``need_gib``, else ``pred_gib`` x 1.3 + 4 GiB per GPU (``cap_gib`` for capped runs); specs
start in file order, and once one is blocked only runs needing at most SMALL_GIB may pass it; a spec
starts when its GPUs
(the emptier one for ``ws`` 1, both for ``ws`` 2, through ``torchrun``) have that much of POOL_GIB left
and fewer than MAX_JOBS probes run there. Memory outside PyTorch is read per process through NVML
(``non_torch_nvml_gb``; rows carry ``"concurrent": true``). Results are appended to $OUT/probe.jsonl as
each run ends (a timeout still returns what finished); failures to $OUT/fail.log.
On a machine with one GPU (``NGPU=1``, or one found by ``nvidia-smi -L``) only the world-size-1 specs run; the others
are listed in fail.log as SKIPPED(ws), so one call's rows can be measured in two parts.
Usage (repo root on the GPU machine): BUDGET_S=400 python3 bench/plan/run_x2.py SPECS.jsonl
"""
import json
import os
import subprocess
import sys
import time

MAX_JOBS, POOL_GIB, JOB_S, SMALL_GIB = 4, 128.0, 260, 24.0
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ["OUT"]
START = time.time()
DEADLINE = START + float(os.environ.get("BUDGET_S", "400"))
PROBE = os.path.join(HERE, "zero_mem_probe_plan.py")
NGPU = os.environ.get("NGPU") or subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                text=True).stdout.count("GPU ")
GPUS = tuple(range(min(int(NGPU), 2)))


def need(spec):
    if spec.get("need_gib"):
        return min(float(spec["need_gib"]), POOL_GIB)  # more than the pool would wait forever at the queue's head
    return float(spec["cap_gib"]) if spec.get("cap_gib") else min(spec.get("pred_gib", 40) * 1.3 + 4, POOL_GIB)


def command(spec, gpus, port):
    if spec.get("ws", 1) == 1:
        return [sys.executable, PROBE, json.dumps(spec)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(len(gpus)),
            "--master_addr", "127.0.0.1", "--master_port", str(port), PROBE, json.dumps(spec)]


def launch(spec, gpus, n):
    log = open(f"/tmp/x2.{n}.log", "w+")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), MASTER_PORT=str(29600 + n),
               PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    proc = subprocess.Popen(command(spec, gpus, 29600 + n), stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    return {"spec": spec, "gpus": gpus, "proc": proc, "log": log, "t0": time.time()}


def results_in(text):
    """The probe's result objects in a run's log: each after ``RESULT ``; two ranks' can share one line of it."""
    out = []
    for x in text.splitlines():
        rest = x[x.index("RESULT "):] if "RESULT " in x else ""
        while rest.strip():
            rest = rest.strip()
            rest = rest[7:] if rest.startswith("RESULT ") else rest
            res, end = json.JSONDecoder().raw_decode(rest)
            out.append(res)
            rest = rest[end:]
    return out


def collect(job):
    job["log"].seek(0)
    text = job["log"].read()
    lines = results_in(text)
    spec = job["spec"]
    for res in lines:
        res.update(concurrent=True, gpus=job["gpus"])
        with open(os.path.join(OUT, "probe.jsonl"), "a") as f:
            f.write(json.dumps(res) + "\n")
    status = lines[-1].get("status") if lines else "FAILED"
    if not lines:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.write(f"FAILED rc={job['proc'].returncode} {json.dumps(spec)}\n{text[-2500:]}\n")
    print(f"{status} {spec['name']} ws{spec.get('ws', 1)} gpus{job['gpus']} {time.time() - job['t0']:.0f}s "
          f"(t={time.time() - START:.0f}s)", flush=True)


def place(spec, running):
    used = dict.fromkeys(GPUS, 0.0)
    count = dict.fromkeys(GPUS, 0)
    for job in running:
        for g in job["gpus"]:
            used[g] += need(job["spec"])
            count[g] += 1
    ok = [g for g in GPUS if used[g] + need(spec) <= POOL_GIB and count[g] < MAX_JOBS]
    if spec.get("ws", 1) == 2:
        return [0, 1] if len(ok) == 2 else None
    return [min(ok, key=lambda g: used[g])] if ok else None


def kill(job):
    try:
        os.killpg(job["proc"].pid, 9)
    except ProcessLookupError:
        pass
    job["proc"].wait()


def main():
    pending = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
    if len(GPUS) < 2:
        with open(os.path.join(OUT, "fail.log"), "a") as f:
            f.writelines(f"SKIPPED(ws) {json.dumps(s)}\n" for s in pending if s.get("ws", 1) > 1)
        pending = [s for s in pending if s.get("ws", 1) == 1]
    running, n = [], 0
    while pending or running:
        for job in list(running):
            late = time.time() - job["t0"] > JOB_S or time.time() > DEADLINE
            if job["proc"].poll() is not None or late:
                if job["proc"].poll() is None:
                    kill(job)
                collect(job)
                running.remove(job)
        if time.time() < DEADLINE - 60:
            blocked = False
            for spec in list(pending):
                if blocked and need(spec) > SMALL_GIB:
                    continue  # only small runs may pass a blocked one, so big runs are not starved
                gpus = place(spec, running)
                if gpus is None:
                    blocked = True
                else:
                    running.append(launch(spec, gpus, n))
                    n += 1
                    pending.remove(spec)
        elif pending:
            with open(os.path.join(OUT, "fail.log"), "a") as f:
                f.writelines(f"SKIPPED(budget) {json.dumps(s)}\n" for s in pending)
            print(f"skipped {len(pending)} (budget)", flush=True)
            pending = []
        time.sleep(0.5)
    print(f"elapsed {time.time() - START:.0f}s", flush=True)


if __name__ == "__main__":
    main()
