"""What a lost node costs a large ZeRO-3 job: shrink to the surviving nodes, or wait for a replacement.

Two parts:

1. **measure** (``--measure SIZE``): a real ZeRO-3 checkpoint (DeepSpeed on CPU, 2 ranks, gloo, bf16 training, Adam,
   one step: ``bench/ckpt/bench_export.py``'s build) is converted by ``zeropilot ckpt universal`` (the conversion
   ``zeropilot run --heal --heal-allow shrink`` makes, :func:`zeropilot.checkpoint.universal.convert`) in a child
   process; its wall time gives the rate in GB of checkpoint read per second, one process. The rate of the committed
   7B run on a GPU host's CPU side (``bench/ckpt/results-universal-7b.json``: 45.7 GB in 34.8 s, one process) is
   read as the second measured rate.
2. **on paper** (always): a 70B ZeRO-3 job on 128 nodes x 8 GPUs loses one node. Its checkpoint's size (16-bit
   weights + fp32 master, Adam's two moments), the conversion's time at each measured rate (one converter process,
   or the parameters split over the surviving nodes, bounded by the shared file system), the restart, what
   :func:`zeropilot.heal.shrink.keep_samples` allows (the samples per step kept: a global batch of 1024 sequences
   does not split over 127 x 8 ranks, so the largest world that keeps it is taken), the throughput lost running
   smaller until the replacement comes and the job grows back (a second conversion), against waiting for it, and
   the break-even arrival time.

Every assumed figure is a named parameter of :class:`Assumed` and is printed with the results; measured figures say
where they come from.

Usage (repository root)::

    python bench/heal/shrink_cost.py --measure small bench/heal/results/shrink_cost.json
    python bench/heal/shrink_cost.py bench/heal/results/shrink_cost.json      # on paper only (rates from the file)
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GB = 1e9


@dataclass(frozen=True)
class Assumed:
    """What is not measured here, each named in the results."""

    params: float = 70e9  # Llama-2/3 70B
    nodes: int = 128
    gpus_per_node: int = 8
    micro_batch: int = 1  # sequences per GPU per micro step
    global_batch: int = 1024  # sequences per optimizer step (4 M tokens at 4096: Llama 2's)
    fs_gbps: float = 50.0  # the shared file system's aggregate read+write rate, GB/s, for the conversion and the load
    detect_s: float = 25.0  # the watchdog naming the node lost: SILENT_S 10 s + 3 beats + reading (measured ~13-20 s)
    start_s: float = 300.0  # a restart of 1024 ranks up to the first step, before the load: rendezvous, NCCL, init
    converters: int = 127  # converter processes when split by parameters over the surviving nodes (one per node)


def checkpoint_bytes(a: Assumed) -> Dict[str, float]:
    """ZeRO-3 with bf16 training and Adam: the 16-bit weights (model states) and 12 bytes per parameter of
    optimizer state (fp32 master, exp_avg, exp_avg_sq); the universal folder holds the three fp32 tensors."""
    weights = 2 * a.params
    optim = 12 * a.params
    return {"weights_bytes": weights, "optimizer_bytes": optim, "checkpoint_bytes": weights + optim,
            "universal_bytes": optim + weights}  # the model-state files are copied into the universal folder too


def shrink_world(a: Assumed) -> Dict[str, object]:
    """The largest node count below ``nodes`` whose ranks keep the samples per optimizer step (zeropilot's rule)."""
    sys.path.insert(0, str(ROOT / "src"))
    from zeropilot.heal.shrink import keep_samples

    world = a.nodes * a.gpus_per_node
    ga = a.global_batch // (a.micro_batch * world)
    tried = []
    for n in range(a.nodes - 1, 0, -1):
        kept = keep_samples(a.micro_batch, max(ga, 1), world, n * a.gpus_per_node)
        if not isinstance(kept, str):
            return {"nodes": n, "micro_batch": kept[0], "grad_accum": kept[1], "refused": tried[:3],
                    "refused_count": len(tried)}
        tried.append({"nodes": n, "why": kept})
    return {"nodes": None, "refused": tried[:3], "refused_count": len(tried)}


def _shrink_lost(a: Assumed, conv: float, restart: float, n2: int, arrive: float) -> float:
    """Full-job seconds lost by shrinking to ``n2`` nodes: stopped for detection, conversion and restart; running at
    n2/nodes of the throughput until the replacement is there (from the failure, ``arrive``); stopped again to grow
    back (the smaller world's save converted, a restart at full size)."""
    smaller = max(arrive - conv - restart, 0.0)
    return a.detect_s + 2 * (conv + restart) + smaller * (1 - n2 / a.nodes)


def _break_even(a: Assumed, conv: float, restart: float, n2: int) -> float:
    """The arrival time from which shrinking loses less than waiting (``detect + A + restart``)."""
    f = n2 / a.nodes
    # A + R = 2(C + R) + (A - C - R)(1 - f)  =>  A f = 2C + R - (C + R)(1 - f)
    return (2 * conv + restart - (conv + restart) * (1 - f)) / f


def costs(a: Assumed, rate_gbps: float, arrival_s: List[float]) -> Dict[str, object]:
    """The shrink's and the wait's cost in seconds of the full job's throughput, per arrival time of the replacement.

    Two shrinks: to the largest node count that keeps the samples per step (what zeropilot does), and to 127 nodes
    with the batch changed (what zeropilot refuses: another training; shown as the bound)."""
    size = checkpoint_bytes(a)
    to_n = shrink_world(a)
    moved = size["checkpoint_bytes"] + size["universal_bytes"]  # read the ZeRO files, write the universal ones
    convs = {"one": size["checkpoint_bytes"] / (rate_gbps * GB),
             "split": max(size["checkpoint_bytes"] / (rate_gbps * GB * a.converters), moved / (a.fs_gbps * GB))}
    load = size["checkpoint_bytes"] / (a.fs_gbps * GB)  # every rank reads its share: bounded by the file system
    restart = a.start_s + load
    plans = {f"kept_{to_n['nodes']}_one": (to_n["nodes"], convs["one"]),
             f"kept_{to_n['nodes']}_split": (to_n["nodes"], convs["split"]),
             f"batch_changed_{a.nodes - 1}_split": (a.nodes - 1, convs["split"])}
    rows = []
    for arrive in arrival_s:
        row = {"arrival_s": arrive, "wait_lost_s": a.detect_s + arrive + restart}
        row.update({k: _shrink_lost(a, c, restart, n, arrive) for k, (n, c) in plans.items()})
        rows.append(row)
    return {"rate_gbps": rate_gbps, "sizes": size, "shrink_to": to_n, "convert_one_s": convs["one"],
            "convert_split_s": convs["split"], "load_s": load, "restart_s": restart, "plans": list(plans),
            "rows": rows, "break_even_arrival_s": {k: _break_even(a, c, restart, n) for k, (n, c) in plans.items()}}


def measure(size: str, work: Path) -> Dict[str, object]:
    """Build a ZeRO-3 checkpoint of ``size`` and time ``zeropilot ckpt universal`` on it (one child process)."""
    sys.path.insert(0, str(ROOT / "bench" / "ckpt"))
    from bench_export import build, run_child

    dest = work / f"z3-{size}"
    if not dest.is_dir():
        spec, build_s = build(size, 3, dest)
    else:
        spec, build_s = {"size": size, "stage": 3, "kept": True}, None
    save = dest / "run"  # the build's save folder (tests/checkpoint/ds_build.py)
    total = sum(p.stat().st_size for p in save.rglob("*") if p.is_file())
    out = work / f"z3-{size}-universal"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # run_child passes this process's environment
    code, wall, rss, err = run_child([sys.executable, "-m", "zeropilot", "ckpt", "universal", str(save), str(out),
                                      "--no-progress"])
    if code:
        raise SystemExit(f"ckpt universal failed: {err}")
    written = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"size": size, "spec": spec, "build_s": build_s, "checkpoint_bytes": total, "universal_bytes": written,
            "wall_s": round(wall, 3), "peak_rss_bytes": rss, "rate_gbps": total / wall / GB,
            "command": f"python bench/heal/shrink_cost.py --measure {size} --work {work} RESULTS",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_avg": os.getloadavg()}, "warm_cache": "the checkpoint was just written (page cache)"}


def committed_7b() -> Optional[Dict[str, object]]:
    path = ROOT / "bench" / "ckpt" / "results-universal-7b.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    st = doc["stages"][0]
    wall = st["zeropilot"]["wall_s_median"]
    return {"from": str(path.relative_to(ROOT)), "checkpoint_bytes": st["checkpoint_bytes"], "wall_s": wall,
            "rate_gbps": st["checkpoint_bytes"] / wall / GB, "machine": doc["machine"], "stage": st["stage"]}


def render(doc: Dict[str, object]) -> str:
    a = doc["assumed"]
    lines = ["# A lost node of a 70B ZeRO-3 job on 128 nodes: shrink or wait", "",
             f"Command: `{doc['command']}`", "", "## Measured", ""]
    for name, m in doc["measured"].items():
        if m:
            lines.append(f"- {name}: {m['checkpoint_bytes'] / GB:.2f} GB converted by `zeropilot ckpt universal` in "
                         f"{m['wall_s']:.1f} s, one process: **{m['rate_gbps']:.3f} GB/s** ({m.get('from') + ', ' if m.get('from') else ''}"
                         f"{m['machine'].get('cpus')} CPUs"
                         + (f", load average {m['machine']['load_avg'][0]:.0f}-{max(m['machine']['load_avg']):.0f} from "
                            f"other jobs; {m['warm_cache']}; `{m['command']}`" if m['machine'].get('load_avg') else
                            ", ZeRO-2, SGD: no Adam moments") + ")")
    c0 = doc["paper"][0]
    s = c0["sizes"]
    to = c0["shrink_to"]
    lines += ["", "## Assumed", "", "| parameter | value |", "|---|---|"]
    lines += [f"| {k} | {v:g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in a.items()]
    lines += ["", "## On paper", "",
              f"Checkpoint: {s['checkpoint_bytes'] / GB:.0f} GB ({s['weights_bytes'] / GB:.0f} GB of 16-bit weights, "
              f"{s['optimizer_bytes'] / GB:.0f} GB fp32 master + Adam moments); the universal folder "
              f"{s['universal_bytes'] / GB:.0f} GB.", "",
              f"Shrinking keeps the samples per step ({a['global_batch']} sequences): the largest node count below "
              f"{a['nodes']} that does is **{to['nodes']}** (micro batch {to['micro_batch']} x accumulation "
              f"{to['grad_accum']}); {to['refused_count']} node counts refused, e.g. "
              f"{to['refused'][0]['nodes']}: {to['refused'][0]['why']}.", ""]
    for c in doc["paper"]:
        lines += [f"### At {c['rate_gbps']:.3f} GB/s per converter ({c['label']})", "",
                  f"- conversion, one process: {c['convert_one_s'] / 60:.1f} min; split over {a['converters']} "
                  f"processes (bounded by the file system's {a['fs_gbps']:g} GB/s for "
                  f"{(s['checkpoint_bytes'] + s['universal_bytes']) / GB:.0f} GB read and written): "
                  f"{c['convert_split_s'] / 60:.1f} min",
                  f"- restart: {a['start_s']:g} s start + {c['load_s']:.0f} s load = {c['restart_s'] / 60:.1f} min",
                  "- break-even arrival of the replacement (shrinking loses less when it comes later): "
                  + "; ".join(f"{k} {v / 60:.1f} min" for k, v in c["break_even_arrival_s"].items()), "",
                  "| replacement arrives after | wait | " + " | ".join(c["plans"]) + " |",
                  "|---|---|" + "---|" * len(c["plans"])]
        lines += [f"| {r['arrival_s'] / 60:g} min | {r['wait_lost_s'] / 60:.1f} | "
                  + " | ".join(f"{r[k] / 60:.1f}" for k in c["plans"]) + " |" for r in c["rows"]]
        lines.append("")
    lines += [doc["notes"], ""]
    return "\n".join(lines)


NOTES = ("zeropilot's converter is one process today: `split` is what a conversion split by parameters over the "
         "surviving nodes would take at the same per-process rate (not built). Table cells: minutes of the full 128-node job's throughput lost. kept_N: shrunk to N nodes with the "
         "samples per step kept (zeropilot's rule), the conversion by one process (one) or split by parameters over "
         "the surviving nodes (split); batch_changed_127: the bound if the batch could change (zeropilot refuses it). "
         " Wait: detection + the replacement's arrival + the "
         "restart (every rank loads the same ZeRO checkpoint). Shrink: detection + conversion + restart at the smaller "
         "world; then the smaller world runs at (nodes'/128) of the throughput until the replacement is there; then "
         "the job grows back, which needs the smaller world's checkpoint converted again and a restart (both "
         "counted). Both lose the steps since the last save alike (not counted). Throughput is assumed proportional "
         "to the node count (per-GPU speed unchanged; the step takes longer by the accumulation raised).")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="results JSON (the .md beside it); read for rates without --measure")
    p.add_argument("--measure", metavar="SIZE", help="build a ZeRO-3 checkpoint of this size (bench/ckpt sizes: "
                                                    "tiny, small, qwen0.5b) and time the conversion")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "zeropilot-shrink-cost")
    a = p.parse_args(argv)
    measured: Dict[str, object] = {}
    if a.measure:
        a.work.mkdir(parents=True, exist_ok=True)
        measured["this machine"] = measure(a.measure, a.work)
    elif a.results.exists():
        measured["this machine"] = json.loads(a.results.read_text())["measured"].get("this machine")
    measured["GPU host CPU side (7B, bench/ckpt)"] = committed_7b()
    assumed = Assumed()
    arrivals = [m * 60.0 for m in (5, 15, 30, 60, 120, 240, 480)]
    paper = []
    for label, m in measured.items():
        if m:
            paper.append(dict(costs(assumed, m["rate_gbps"], arrivals), label=label))
    doc = {"command": "python bench/heal/shrink_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "t": time.time(), "measured": measured, "assumed": asdict(assumed), "paper": paper, "notes": NOTES}
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps(doc, indent=1) + "\n")
    a.results.with_suffix(".md").write_text(render(doc))
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
