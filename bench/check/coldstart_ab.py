"""Cold start of `zeropilot check examples/seed`, this tree against an earlier commit, interleaved.

On a shared machine the absolute figure of `coldstart.py` moves with the load (python's own start-up alone
went from 52 to 96 ms between two runs); running the two trees in turn, under the same load, shows what a
change costs.

    python bench/check/coldstart_ab.py [--base d26c543] [--runs 30] [--out bench/check/coldstart_ab.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ["-m", "zeropilot", "check", "examples/seed", "--versions", "deepspeed=0.14.2+das.opt1.dtk25041"]


def export(commit: str, dest: Path) -> Path:
    """The ``src`` folder of ``commit`` under ``dest`` (git archive; the working tree is not touched)."""
    archive = dest / "src.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest)  # noqa: S202 - our own repository
    return dest / "src"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="d26c543")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench" / "check" / "coldstart_ab.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {f"base {args.base}": export(args.base, Path(tmp)), "this tree": ROOT / "src"}
        cmds = {name: ([sys.executable, *TARGET], {**os.environ, "PYTHONPATH": str(src)})
                for name, src in trees.items()}
        cmds["python -c pass"] = ([sys.executable, "-c", "pass"], dict(os.environ))
        times = {name: [] for name in cmds}
        for _ in range(args.runs):
            for name, (cmd, env) in cmds.items():
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[name].append(time.perf_counter() - t0)
                assert proc.returncode in (0, 1), (name, proc.returncode)
    result = {"command": f"python bench/check/coldstart_ab.py --base {args.base} --runs {args.runs}",
              "load_average_after": os.getloadavg(), "cpus": os.cpu_count(),
              **{name: {"median_s": round(statistics.median(v), 4), "min_s": round(min(v), 4), "runs": len(v)}
                 for name, v in times.items()}}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
