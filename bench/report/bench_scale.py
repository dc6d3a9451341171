"""The report, ``top`` and the run directory at 1,024 ranks: a synthetic job of nodes x ranks x steps.

    python bench/report/bench_scale.py write DIR [--nodes 128 --per-node 8 --steps 100000 --jobs 2]
    python bench/report/bench_scale.py measure DIR --out bench/report/results/scale-<name>.json
    python bench/report/bench_scale.py split DIR --out bench/report/results/scale-split-<name>.json

``write`` makes the job's run directory as ``zeropilot run`` leaves it (``tests/report/synth.py``: ``job_records``
gives every rank's records as the guard writes them, ``write_job`` writes them through the guard's writer, which
closes a segment past 4 MiB, and ends each rank as the supervisor does, ``runlog.compact.finish_rank``: segments
compacted and merged into one file per rank). ``measure`` times ``zeropilot report`` (text, json, html) and
``zeropilot top`` (its first look, then a refresh after every rank appended a step) each in a process of its own
(wall seconds, CPU seconds, peak RSS: ``getrusage`` of the child), against reading the same bytes (``cat``) and
decoding every row of them (``runlog.segread.decode_segment``, what a reader that does not sample would do), and
sizes the directory per rank-step against the JSON lines the writer wrote. ``split`` says where the text report's
CPU time goes, in one process: reading (``runlog.job.read_job``), each part of the summary
(``runlog.summary.summarize``), rendering.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), DS_ACCELERATOR="cpu")


def write(args: argparse.Namespace) -> int:
    from tests.report import synth

    spec = synth.JobSpec(nodes=args.nodes, per_node=args.per_node, steps=args.steps, save_every=args.save_every,
                         straggler=args.straggler, heavy=args.heavy, slow_gpu=args.slow_gpu)
    t0 = time.time()
    synth.write_job(Path(args.dir), spec, jobs=args.jobs)
    info = {"nodes": spec.nodes, "per_node": spec.per_node, "ranks": spec.world, "steps": spec.steps,
            "straggler": spec.straggler, "heavy": spec.heavy, "slow_gpu": spec.slow_gpu,
            "write_wall_s": round(time.time() - t0, 1), "jobs": args.jobs,
            "lines_bytes_per_rank_step": _lines_bytes(spec)}
    (Path(args.dir) / "bench-job.json").write_text(json.dumps(info), encoding="utf-8")
    print(f"wrote {args.dir}: {spec.world} ranks x {spec.steps} steps in {info['write_wall_s']:.0f} s wall")
    return 0


def _lines_bytes(spec) -> float:
    """The bytes per step of the JSON lines the writer appends (rank 0's first 2,000 records: what the directory
    would hold uncompacted)."""
    from itertools import islice

    from tests.report import synth
    from zeropilot.runlog.events import line

    recs = list(islice(synth.job_records(spec, 0), 2000))
    steps = sum(1 for r in recs if r["event"] == "step")
    return round(sum(len(line(r)) for r in recs) / max(steps, 1), 1)


# -- measuring ---------------------------------------------------------------------------------------------------


def child(cmd: List[str], stdout=subprocess.DEVNULL) -> Dict[str, Any]:
    """Run ``cmd`` in a process of its own (through ``_run``, so that ``getrusage`` of children is its alone)."""
    out = subprocess.run([sys.executable, __file__, "_run", json.dumps(cmd)], capture_output=True, text=True,
                         env=ENV, check=False)
    if out.returncode != 0 and not out.stdout.strip():
        raise SystemExit(f"{cmd}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run(args: argparse.Namespace) -> int:
    cmd = json.loads(args.cmd)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, check=False)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": round(wall, 3), "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
                      "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "rc": done.returncode,
                      "stdout_lines": done.stdout.count(b"\n"), "stdout_bytes": len(done.stdout),
                      "stderr_tail": done.stderr.decode("utf-8", "replace")[-400:]}))
    return 0


def _dir_bytes(root: Path) -> Dict[str, int]:
    files = [p for p in root.iterdir() if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "col_bytes": sum(p.stat().st_size for p in files if p.name.endswith(".col"))}


def _decode_all(args: argparse.Namespace) -> int:
    """Every row of every compacted file decoded (``runlog.segread.decode_segment``)."""
    from zeropilot.runlog.segread import decode_segment

    rows = 0
    for p in sorted(Path(args.dir).glob("rank-*.col")):
        got = decode_segment(p)
        rows += got.rows.n if got is not None else 0
    print(rows)
    return 0


def _top(args: argparse.Namespace) -> int:
    """``top``'s first look at the directory, a refresh with nothing new, then one after every rank appended a step
    record to its live file (the guard's writer): the seconds of each (read + the screen), and the screen's lines."""
    from itertools import islice

    from tests.report import synth
    from zeropilot.cli.top import screen
    from zeropilot.runlog import EventWriter
    from zeropilot.runlog.layout import RunDir
    from zeropilot.runlog.live import LiveRun

    root = Path(args.dir)
    info = json.loads((root / "bench-job.json").read_text(encoding="utf-8"))
    out: Dict[str, Any] = {}
    t0 = time.perf_counter()
    live = LiveRun.open(root)
    live.refresh()
    lines = screen(live, time.time())
    out["first_look_s"], out["screen_lines"] = round(time.perf_counter() - t0, 3), len(lines)
    t0 = time.perf_counter()
    live.refresh()
    screen(live, time.time())
    out["refresh_nothing_new_s"] = round(time.perf_counter() - t0, 3)
    spec = synth.JobSpec(nodes=info["nodes"], per_node=info["per_node"], steps=info["steps"] + 1)
    d = RunDir(root)
    sizes = {r: d.events(r).stat().st_size if d.events(r).exists() else None for r in range(info["ranks"])}
    for rank in range(info["ranks"]):  # the next step of each rank, as its guard appends it
        rec = next(islice((r for r in synth.job_records(spec, rank) if r["event"] == "step"), info["steps"], None))
        with EventWriter(d.events(rank)) as w:
            w.write(rec)
    t0 = time.perf_counter()
    new = live.refresh()
    lines = screen(live, time.time())
    out["refresh_after_append_s"], out["new_steps_read"] = round(time.perf_counter() - t0, 3), len(new)
    out["screen_lines_after"] = len(lines)
    for rank, size in sizes.items():  # the directory as it was
        if size is None:
            os.unlink(d.events(rank))
        else:
            os.truncate(d.events(rank), size)
    print(json.dumps(out))
    return 0


#: the parts of ``runlog.summary.summarize`` that ``split`` times, as (module, function) of what it calls
SPLIT_PARTS = (("summary", "_rank_summary"), ("summary", "_checkpoint_ops"), ("summary", "_step_seconds"),
               ("summary", "spread_section"), ("stragglers", "from_records"), ("stragglers", "gpu_from_records"),
               ("timing", "section"), ("timeouts", "report"), ("job", "nodes_section"), ("summary", "_verdict"))


def split(args: argparse.Namespace) -> int:
    """CPU seconds of the text report's steps in this process (the functions of :data:`SPLIT_PARTS` wrapped), its
    peak RSS, and the rows the sampled reading decoded and kept."""
    from zeropilot.runlog import segments
    from zeropilot.runlog import summary as summary_mod
    from zeropilot.runlog import text as text_render
    from zeropilot.runlog.job import read_job

    parts: Dict[str, float] = {}

    def timed(mod: Any, name: str, key: str) -> None:
        fn = getattr(mod, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                parts[key] = parts.get(key, 0.0) + time.process_time() - t0
        setattr(mod, name, wrapper)

    for where, name in SPLIT_PARTS:  # the names summarize() calls, in the modules it reads them from
        timed(summary_mod if where == "summary" else getattr(summary_mod, where), name, f"{where}.{name}")
    decoded = {"groups": 0, "rows": 0}
    real_decode = segments.decode_group

    def counting(data: bytes, skip: frozenset = frozenset()) -> Any:
        got = real_decode(data, skip)
        decoded["groups"] += 1
        decoded["rows"] += got[0].n
        return got
    segments.decode_group = counting
    t0 = time.process_time()
    records = read_job([args.dir])
    t1 = time.process_time()
    summary = summary_mod.summarize(records)
    t2 = time.process_time()
    text = text_render.render(summary)
    t3 = time.process_time()
    out = {"before_reading_s": round(t0, 3), "read_s": round(t1 - t0, 3), "summarize_s": round(t2 - t1, 3),
           "render_text_s": round(t3 - t2, 3),
           "summarize_parts_s": {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "groups_decoded": decoded["groups"], "rows_decoded": decoded["rows"],
           "rows_kept": summary["reading"]["rows_read"], "sample_every": summary["reading"]["sample_every"],
           "ranks": len(records.ranks), "text_lines": text.count("\n"), "load_average": os.getloadavg()}
    return _emit(out, args.out)


def _emit(result: Dict[str, Any], out: Optional[str]) -> int:
    """Print a measurement as JSON, and write it to ``out`` when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")
    return 0


def measure(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    info = json.loads((root / "bench-job.json").read_text(encoding="utf-8"))
    rank_steps = info["ranks"] * info["steps"]
    size = _dir_bytes(root)
    res: Dict[str, Any] = {"job": info, "cores": os.cpu_count(), "python": sys.version.split()[0],
                           "dir": dict(size, rank_steps=rank_steps,
                                       bytes_per_rank_step=round(size["bytes"] / rank_steps, 2),
                                       lines_bytes_per_rank_step=info["lines_bytes_per_rank_step"])}
    res["cat"] = child(["sh", "-c", f"cat {root}/* > /dev/null"])
    if not args.skip_decode:
        res["decode_every_row"] = child([sys.executable, __file__, "_decode", str(root)])
    zp = [sys.executable, "-m", "zeropilot"]
    for fmt in ("text", "json", "html"):
        extra = ["--out", str(Path(args.tmp) / "report.html")] if fmt == "html" else []
        res[f"report_{fmt}"] = child(zp + ["report", str(root), "--format", fmt] + extra)
    res["top_once"] = child(zp + ["top", str(root), "--once"])
    got = subprocess.run([sys.executable, __file__, "_top", str(root)], capture_output=True, text=True, env=ENV,
                         check=True)
    res["top_live"] = json.loads(got.stdout.strip().splitlines()[-1])
    cat = res["cat"]["wall_s"]
    res["ratios"] = {f"report_{f}_vs_cat": round(res[f"report_{f}"]["wall_s"] / cat, 1) if cat else None
                     for f in ("text", "json", "html")}
    if "decode_every_row" in res:
        res["ratios"]["report_text_vs_decode_every_row"] = round(
            res["report_text"]["wall_s"] / res["decode_every_row"]["wall_s"], 3)
    return _emit(res, args.out)


def table(args: argparse.Namespace) -> int:
    """The results of several ``measure`` runs as one markdown table (``results/scale.md``)."""
    rows = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.results]
    head = ["job (ranks x steps)"] + [f"{r['job']['ranks']:,} x {r['job']['steps']:,}" for r in rows]

    def run(key: str, what: str) -> List[str]:
        return [f"{what}"] + [f"{r[key]['wall_s']:.2f} s wall, {r[key]['cpu_s']:.2f} s CPU, "
                              f"{r[key]['peak_rss_mb']:.0f} MB" for r in rows]

    lines = [head, ["rank-steps"] + [f"{r['dir']['rank_steps']:,}" for r in rows],
             ["run directory"] + [f"{r['dir']['bytes'] / 1e6:,.1f} MB in {r['dir']['files']:,} files" for r in rows],
             ["bytes per rank-step"] + [f"{r['dir']['bytes_per_rank_step']:.1f} (JSON lines: "
                                        f"{r['dir']['lines_bytes_per_rank_step']:.0f})" for r in rows],
             run("cat", "`cat` of the directory"), run("report_text", "`report` (text)"),
             run("report_json", "`report --format json`"), run("report_html", "`report --format html`"),
             ["report text vs `cat`"] + [f"{r['ratios']['report_text_vs_cat']:.1f}x" for r in rows],
             run("top_once", "`top --once` (a process)"),
             ["top: first look (in process)"] + [f"{r['top_live']['first_look_s']:.2f} s" for r in rows],
             ["top: refresh, nothing new"] + [f"{r['top_live']['refresh_nothing_new_s']:.3f} s" for r in rows],
             ["top: refresh after every rank appended a step"] + [
                 f"{r['top_live']['refresh_after_append_s']:.3f} s ({r['top_live']['new_steps_read']:,} steps read)"
                 for r in rows],
             ["screen lines (report text / top)"] + [f"{r['report_text']['stdout_lines']} / "
                                                     f"{r['top_live']['screen_lines']}" for r in rows]]
    if all("decode_every_row" in r for r in rows):
        lines.insert(5, run("decode_every_row", "decoding every row (`segread.decode_segment`)"))
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(row) + " |" for row in lines[1:]]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
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
    w.add_argument("--slow-gpu", type=int, default=300)
    w.add_argument("--jobs", type=int, default=2)
    w.set_defaults(func=write)
    m = sub.add_parser("measure")
    m.add_argument("dir")
    m.add_argument("--out")
    m.add_argument("--tmp", default="/tmp")
    m.add_argument("--skip-decode", action="store_true")
    m.set_defaults(func=measure)
    sp = sub.add_parser("split")
    sp.add_argument("dir")
    sp.add_argument("--out")
    sp.set_defaults(func=split)
    t = sub.add_parser("table")
    t.add_argument("results", nargs="+")
    t.add_argument("--out")
    t.set_defaults(func=table)
    for name, fn in (("_decode", _decode_all), ("_top", _top)):
        s = sub.add_parser(name)
        s.add_argument("dir")
        s.set_defaults(func=fn)
    r = sub.add_parser("_run")
    r.add_argument("cmd")
    r.set_defaults(func=_run)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
