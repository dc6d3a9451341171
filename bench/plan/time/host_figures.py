"""The host's figures where the rows run, beside the rows (issue 40, call 4): DeepSpeed's CPUAdam and torch's AdamW
at partitions of several sizes, the host's memory bandwidth, the eager launch, and the CPU.

    python3 bench/plan/time/host_figures.py OUT.json [--sizes 24,26,28]

Why: call 3's ``zeropilot calibrate`` timed DeepSpeed's CPUAdam at 4.80 G elements/s over ``1 << 24`` elements
(calibrate's size), yet the same call's optimizer-offload row (Llama-3.2-3B, 3.2 G trainable elements) spent what
2.7 G elements/s would take in its step. This measures whether the rate depends on the partition's size (a
partition past the host's caches runs at its memory bandwidth: CPUAdam reads the parameter, gradient and two moments
and writes three, 28 bytes an element), on the same host as the rows, so the next comparison uses figures of the
machine it runs on. Each figure is the median of 5 timed steps after one (calibrate's ``_median_host``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))


def _cpu() -> dict:
    out = {"nproc": os.cpu_count(), "platform": platform.platform()}
    try:
        out["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        out["lscpu"] = f"lscpu failed: {exc}"
    caches = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            caches[f"L{(d / 'level').read_text().strip()}{(d / 'type').read_text().strip()[0]}"] = (
                d / "size").read_text().strip()
        except OSError:
            pass
    out["cpu0_caches"] = caches
    try:
        out["meminfo"] = {k: v.strip() for k, v in (line.split(":", 1) for line in
                                                    Path("/proc/meminfo").read_text().splitlines()[:3])}
    except OSError:
        pass
    return out


def _bandwidth(torch, speed) -> dict:
    n = 1 << 28  # 1 GiB of fp32 each
    a, b, c = torch.ones(n), torch.empty(n), torch.ones(n)
    copy = speed._median_host(lambda: b.copy_(a))
    triad = speed._median_host(lambda: torch.add(a, c, alpha=0.5, out=b))
    del a, b, c
    return {"copy_bytes_per_s": 2 * 4 * n / copy, "triad_bytes_per_s": 3 * 4 * n / triad}


def _adam(torch, speed, exp: int, which: str) -> dict:
    n = 1 << exp
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    if which == "cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam([p], lr=1e-4)
    else:
        opt = torch.optim.AdamW([p], lr=1e-4)
    s = speed._median_host(opt.step)
    del opt, p
    return {"optimizer": which, "elements": n, "step_s": s, "elems_per_s": n / s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--sizes", default="24,26,28", help="log2 of the partition's elements")
    args = ap.parse_args(argv)
    import torch
    from zeropilot.calibrate import speed

    t0 = time.perf_counter()
    res = {"cpu": _cpu(), "threads": speed.threads(torch), "torch": torch.__version__}
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res["launch"] = speed.launch(torch, dev)
    res["launch_device"] = dev.type
    res["bandwidth"] = _bandwidth(torch, speed)
    res["adam"] = []
    for which in ("cpu_adam", "torch_adamw"):
        for exp in (int(x) for x in args.sizes.split(",")):
            try:
                res["adam"].append(_adam(torch, speed, exp, which))
            except Exception as exc:  # a size the host cannot hold, an op that does not build: recorded
                res["adam"].append({"optimizer": which, "elements": 1 << exp, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(json.dumps(res["adam"][-1]), flush=True)
    res["seconds"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("launch", "bandwidth", "threads", "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
