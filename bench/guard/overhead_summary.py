"""Guard overhead from paired runs' outputs (``RESULT`` lines of ``train_lm.py``).

Usage: python bench/guard/overhead_summary.py DIR

Two layouts:
  guard-N.out / plain-N.out            (the first pass's overhead.sh, in git history): pair N, median warm step.
  guard-gG-sS.out / plain-gG-sS.out    (overhead_ab.sh): GPU G, time slot S. The estimate compares guard and
      plain on the same GPU (the ABBA order balances drift in time): per GPU, the mean log median step of its
      guard runs minus that of its plain runs, then the mean over GPUs. Its uncertainty comes from the spread
      of runs of one kind on one GPU (the run-to-run noise), as a 95% interval (normal, 2 standard errors).
      Then the slot-paired estimate: guard against plain within each time slot (same moment, other GPU), the
      GPU difference cancelled by the alternation; this one sees through the host's slow spells, which hit
      both GPUs' jobs at once.
"""

import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def result(path: Path) -> dict:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{path}: no RESULT line")


def median_step(path: Path) -> float:
    data = result(path)
    return statistics.median(data["step_seconds"][data["spec"].get("warmup", 3):])


def pairs(root: Path) -> None:
    rows = []
    for n in sorted(int(p.stem.split("-")[1]) for p in root.glob("guard-*.out")):
        g, p = median_step(root / f"guard-{n}.out"), median_step(root / f"plain-{n}.out")
        rows.append((g - p) / p)
        print(f"pair {n}: guard {g * 1e3:.1f} ms, plain {p * 1e3:.1f} ms, overhead {100 * (g - p) / p:+.2f}%")
    print(f"median overhead over {len(rows)} pairs: {100 * statistics.median(rows):+.2f}%")


def ab(root: Path, files: list) -> None:
    runs = defaultdict(list)  # (gpu, kind) -> [(slot, median)]
    slots = defaultdict(dict)  # slot -> {kind: median}
    for path in files:
        kind, gpu, slot = re.fullmatch(r"(guard|plain)-g(\d+)-s(\d+)", path.stem).groups()
        try:
            med = median_step(path)
        except SystemExit as exc:
            print(f"skipped: {exc}")
            continue
        runs[(int(gpu), kind)].append((int(slot), med))
        slots[int(slot)][kind] = med
        print(f"GPU {gpu} slot {slot} {kind:5s}: median warm step {med * 1e3:.2f} ms")
    diffs, noise = [], []
    for gpu in sorted({g for g, _ in runs}):
        g = [math.log(m) for _, m in runs.get((gpu, "guard"), [])]
        p = [math.log(m) for _, m in runs.get((gpu, "plain"), [])]
        if not g or not p:
            continue
        diffs.append(statistics.mean(g) - statistics.mean(p))
        noise += [x - statistics.mean(g) for x in g] + [x - statistics.mean(p) for x in p]
        print(f"GPU {gpu}: guard {len(g)} runs, plain {len(p)} runs, overhead {100 * math.expm1(diffs[-1]):+.2f}%")
    for s in sorted(slots):
        if {"guard", "plain"} <= set(slots[s]):
            print(f"slot {s} (guard and plain at the same time, on different GPUs): "
                  f"{100 * (slots[s]['guard'] / slots[s]['plain'] - 1):+.2f}%")
    if not diffs:
        raise SystemExit("no GPU has both guard and plain runs")
    est = statistics.mean(diffs)
    dof = max(len(noise) - 2 * len(diffs), 1)
    sd = math.sqrt(sum(x * x for x in noise) / dof)  # run-to-run sd of one run's log median
    n_g = sum(len(v) for (g, k), v in runs.items() if k == "guard")
    n_p = sum(len(v) for (g, k), v in runs.items() if k == "plain")
    se = sd * math.sqrt(1 / n_g + 1 / n_p)
    print(f"run-to-run noise (sd of one run's median step): {100 * sd:.2f}%")
    print(f"same GPU, different times: {100 * math.expm1(est):+.2f}% (95% interval {100 * math.expm1(est - 2 * se):+.2f}% to "
          f"{100 * math.expm1(est + 2 * se):+.2f}%), {n_g} guard and {n_p} plain runs")
    _slot_paired(slots, runs)


def _slot_paired(slots: dict, runs: dict) -> None:
    """The estimate the design is built for: within a slot, guard and plain ran at the same time (the host's
    slow spells hit both); the GPU each ran on alternates, so averaging the two groups of slots (guard on GPU 0,
    guard on GPU 1) cancels the GPUs' difference. 95% interval from the spread of slots within their group."""
    on = {}
    for (gpu, kind), items in runs.items():
        if kind == "guard":
            for slot, _ in items:
                on[slot] = gpu
    groups = defaultdict(list)
    for s, v in slots.items():
        if {"guard", "plain"} <= set(v):
            groups[on[s]].append(math.log(v["guard"] / v["plain"]))
    if len(groups) < 2 or min(len(g) for g in groups.values()) < 2:
        print("slot-paired: needs at least two slots with the guard on each GPU")
        return
    means = [statistics.mean(g) for g in groups.values()]
    est = statistics.mean(means)
    dev = [x - m for g, m in zip(groups.values(), means) for x in g]
    sd = math.sqrt(sum(x * x for x in dev) / (len(dev) - len(means)))
    se = sd * math.sqrt(sum(1 / len(g) for g in groups.values())) / len(means)
    ratios = sorted(math.expm1(x) for g in groups.values() for x in g)
    print(f"OVERHEAD, slot-paired: median of the {len(ratios)} slots {100 * statistics.median(ratios):+.2f}%; estimate "
          f"(GPUs balanced) {100 * math.expm1(est):+.2f}% (95% interval {100 * math.expm1(est - 2 * se):+.2f}% to "
          f"{100 * math.expm1(est + 2 * se):+.2f}%; slot-to-slot sd {100 * sd:.2f}%)")


def main() -> None:
    root = Path(sys.argv[1])
    files = sorted(p for p in root.glob("*.out") if re.fullmatch(r"(guard|plain)-g\d+-s\d+", p.stem))
    if files:
        ab(root, files)
    else:
        pairs(root)


if __name__ == "__main__":
    main()
