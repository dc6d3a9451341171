"""Median step time with and without the guard, per pair, from overhead.sh's outputs (``RESULT`` lines).

Usage: python bench/guard/overhead_summary.py DIR   (DIR holds guard-N.out and plain-N.out)
"""

import json
import statistics
import sys
from pathlib import Path


def median_step(path: Path) -> float:
    for line in path.read_text().splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[7:])
            steps = data["step_seconds"][data["spec"].get("warmup", 3):]
            return statistics.median(steps)
    raise SystemExit(f"{path}: no RESULT line")


def main() -> None:
    root = Path(sys.argv[1])
    pairs = sorted(int(p.stem.split("-")[1]) for p in root.glob("guard-*.out"))
    rows = []
    for n in pairs:
        g, p = median_step(root / f"guard-{n}.out"), median_step(root / f"plain-{n}.out")
        rows.append((n, g, p, (g - p) / p))
        print(f"pair {n}: guard {g * 1e3:.1f} ms, plain {p * 1e3:.1f} ms, overhead {100 * (g - p) / p:+.2f}%")
    print(f"median overhead over {len(rows)} pairs: {100 * statistics.median(r[3] for r in rows):+.2f}%")


if __name__ == "__main__":
    main()
