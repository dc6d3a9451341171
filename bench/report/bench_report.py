"""How long `zeropilot report` takes on a large run, how large the page is, and how fast Chromium opens it.

Writes a synthetic run (default 100k steps x 8 ranks, a save every 5000 steps, GPU memory fields)
with the real EventWriter, then runs `zeropilot report DIR --format F --out FILE` for each format as
its own process and records wall time, CPU time and peak RSS (from wait4), the output's size, and
the time headless Chromium takes to load the page and to take a full-page screenshot.

    python bench/report/bench_report.py --out bench/report/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.report import browser  # noqa: E402
from tests.report.synth import Spec, write_run  # noqa: E402


def timed(cmd, env=None):
    """Run ``cmd``; wall seconds, CPU seconds (user+sys) and peak RSS in MiB of that process."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed: {proc.stderr.read().decode()}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--save-every", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "report" / "results.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zp-report-bench-") as tmp:
        run = Path(tmp) / "run"
        t = time.monotonic()
        write_run(run, Spec(ranks=args.ranks, steps=args.steps, save_every=args.save_every))
        size = sum(p.stat().st_size for p in run.iterdir())
        result = {"command": " ".join(sys.argv), "ranks": args.ranks, "steps": args.steps,
                  "run_dir_mib": round(size / 2**20, 1), "write_run_s": round(time.monotonic() - t, 1),
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                  "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "formats": {}}
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        for fmt in ("text", "json", "html"):
            out = Path(tmp) / f"report.{fmt}"
            rec = timed([sys.executable, "-m", "zeropilot", "report", str(run), "--format", fmt, "--out", str(out)],
                        env)
            rec["output_kib"] = round(out.stat().st_size / 1024, 1)
            result["formats"][fmt] = rec
        if browser.chromium():
            page = Path(tmp) / "report.html"
            with browser.Browser(timeout=120) as b:
                t = time.monotonic()
                seen = b.visit(page, "document.querySelectorAll('polyline.series').length", screenshot=False)
                loaded = time.monotonic() - t
                t = time.monotonic()
                shot = b.visit(page, "1", screenshot=True)
                result["chromium"] = {"load_and_query_s": round(loaded, 2), "series": seen.facts,
                                      "load_and_full_page_screenshot_s": round(time.monotonic() - t, 2),
                                      "console_errors": seen.console_errors + shot.console_errors,
                                      "requests_other_than_the_page": [u for u in seen.requests
                                                                       if u != page.resolve().as_uri()]}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
