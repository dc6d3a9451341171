"""Cold start to exit of `zeropilot check` on the three-file seed launch (examples/seed).

Runs the installed `zeropilot` console script and `python -m zeropilot` N times each, in fresh processes,
and reports median / p90 / min wall time next to a bare `python -c pass` (the interpreter's own start).
Also records whether torch/deepspeed/transformers were imported (they must not be).

    python bench/check/coldstart.py [--runs 30] [--out bench/check/results.json]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ["check", "examples/seed", "--versions", "deepspeed=0.14.2+das.opt1.dtk25041"]


def timed(cmd, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        assert proc.returncode in (0, 1), (cmd, proc.returncode)
    times.sort()
    return {"median_s": statistics.median(times), "p90_s": times[int(0.9 * (len(times) - 1))],
            "min_s": times[0], "runs": runs}


def heavy_imports():
    code = ("import sys, io, contextlib; "
            "from zeropilot.cli import main\nwith contextlib.redirect_stdout(io.StringIO()): main(%r)\n"
            "print(','.join(m for m in ('torch','deepspeed','transformers') if m in sys.modules))" % TARGET)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench" / "check" / "results.json"))
    args = ap.parse_args()
    script = shutil.which("zeropilot")
    results = {
        "command": "zeropilot " + " ".join(TARGET),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "python_startup": timed([sys.executable, "-c", "pass"], args.runs),
        "python_m_zeropilot": timed([sys.executable, "-m", "zeropilot", *TARGET], args.runs),
    }
    if script:
        results["console_script"] = timed([script, *TARGET], args.runs)
        results["console_script"]["path"] = script  # a pyenv shim adds its own bash start-up
    results["load_average_after"] = os.getloadavg()
    results["heavy_modules_imported"] = heavy_imports() or "none"
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name in ("python_startup", "python_m_zeropilot", "console_script"):
        if name in results:
            r = results[name]
            print(f"{name:<20} median {r['median_s'] * 1000:6.1f} ms  p90 {r['p90_s'] * 1000:6.1f} ms")
    print(f"heavy modules imported: {results['heavy_modules_imported']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
