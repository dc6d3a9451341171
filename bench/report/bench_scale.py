"""The report, ``top`` and the run directory at 1,024 ranks: a synthetic job of 128 nodes x 8 ranks x 100k steps.

    python bench/report/bench_scale.py write DIR [--nodes 128 --per-node 8 --steps 100000 --jobs 2]
    python bench/report/bench_scale.py measure DIR --out bench/report/results-scale.json

``write`` makes the job's run directory as ``zeropilot run`` leaves it (``tests/report/synth.py``: ``job_records``
gives every rank's records as the guard writes them, ``write_job`` closes segments where the writer would and
compacts and merges them through the supervisor's own functions, ``runlog.compact``). ``measure`` times ``zeropilot
report`` (text, json, html) and ``zeropilot top`` (its first look, then refreshes while ranks append) in processes of
their own (CPU seconds, wall seconds, peak RSS), and sizes the directory against the bytes the JSON lines would have
taken (the writer's own lines for a sample of the ranks' records).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def write(args: argparse.Namespace) -> int:
    from tests.report import synth

    spec = synth.JobSpec(nodes=args.nodes, per_node=args.per_node, steps=args.steps, save_every=args.save_every,
                         straggler=args.straggler, heavy=args.heavy)
    t0, c0 = time.time(), time.process_time()
    synth.write_job(Path(args.dir), spec, jobs=args.jobs)
    print(f"wrote {args.dir}: {spec.world} ranks x {spec.steps} steps in {time.time() - t0:.0f} s wall")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--nodes", type=int, default=128)
    w.add_argument("--per-node", type=int, default=8)
    w.add_argument("--steps", type=int, default=100_000)
    w.add_argument("--save-every", type=int, default=5000)
    w.add_argument("--straggler", type=int, default=517)
    w.add_argument("--heavy", type=int, default=1000)
    w.add_argument("--jobs", type=int, default=2)
    w.set_defaults(func=write)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
