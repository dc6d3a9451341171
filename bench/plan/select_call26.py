"""Draw call 26's rows and write the candidate's predictions into its specs (issue 14, ninth pass).

Usage:
    python bench/plan/select_call26.py CANDIDATE_ROOT            print the draw (the rows of CALL26 in make_specs_x2.py)
    python bench/plan/select_call26.py CANDIDATE_ROOT --write    add pred_gib_v11 to specs/call26_x2.jsonl

CANDIDATE_ROOT is a checkout with ``bench/plan/layers_init_v11_candidate.patch`` applied (``git worktree add /tmp/v11
c499297 && git -C /tmp/v11 apply bench/plan/layers_init_v11_candidate.patch``). Each checkout predicts in its own
process, as both are the package ``zeropilot``.

The draw: every ZeRO-1/2 configuration of the catalogued small models (micro batch 1-8, 1024-4096 tokens, world size
1-2, with and without checkpointing, full or LoRA r8/r16, with and without offload_optimizer) never measured in
``bench/plan/data`` whose two predictions stay under 90 GiB; shuffled with seed 26; four strata where the predictions
differ by 2% or more, largest difference first, one row per model per stratum and at most two per model in all, and
three rows where they differ by under 2%.
"""
from __future__ import annotations

import collections
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen3-1.7b", "qwen3-4b", "llama-3.2-1b", "llama-3.2-3b",
         "gemma-2-2b", "gemma-3-1b", "phi-3-mini", "mistral-1b-shape"]
STRATA = [("world size 2, full, checkpointing", 4, lambda p: p[4] == 2 and p[5] and not p[6] and not p[7]),
          ("world size 2, offload_optimizer", 3, lambda p: p[4] == 2 and p[7]),
          ("world size 1, LoRA, no checkpointing", 3,
           lambda p: p[4] == 1 and p[6] and not p[5] and not p[7] and p[2] * p[3] <= 8192),
          ("full, no checkpointing", 3, lambda p: not p[5] and not p[6] and not p[7] and p[2] * p[3] <= 8192),
          ("differ by under 2%", 3, None)]
PREDICT = """
import json, sys
root = sys.argv[1]
sys.path[:0] = [root + '/src', root + '/bench/plan']
from rows import spec_inputs
from zeropilot.memory.plan import make_plan
for line in sys.stdin:
    s = json.loads(line)
    print(round(make_plan(spec_inputs(s, 139.8)).gpu_peak_bytes / 2**30, 2))
"""


def _predict(root: str, specs: list) -> list:
    text = "".join(json.dumps(s) + "\n" for s in specs)
    out = subprocess.run([sys.executable, "-c", PREDICT, root], input=text, capture_output=True, text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def pool() -> list:
    sys.path.insert(0, str(HERE))
    from make_specs_x2 import spec

    done = set()
    for path in (HERE / "data").glob("*.jsonl"):  # call 26 itself left out, so the draw stays reproducible
        if path.name.startswith("h200x2_call26"):
            continue
        for line in path.read_text().splitlines():
            s = json.loads(line).get("spec", {})
            done.add((s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
                      s.get("lora") or 0, bool(s.get("offload"))))
    out = []
    for key in itertools.product(NAMES, (1, 2), (1, 2, 4, 8), (1024, 2048, 4096), (1, 2), (False, True), (0, 8, 16),
                                 (False, True)):
        if key in done:
            continue
        name, stage, mb, seq, ws, gc, lora, off = key
        kw = {k: v for k, v in (("gc", gc), ("lora", lora), ("offload", off)) if v}
        out.append((key, spec(name, stage, mb, seq, ws, "holdout", **kw)))
    return out


def draw(candidate: str) -> list:
    rows = pool()
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    cand = _predict(candidate, [s for _, s in rows])
    table = [(k, s, a, b) for (k, s), a, b in zip(rows, plan, cand) if max(a, b) <= 90]
    random.Random(26).shuffle(table)
    chosen: list = []
    for label, n, keep in STRATA:
        if keep is None:
            pick = [r for r in table if abs(r[3] - r[2]) / r[2] < 0.02]
        else:
            pick = sorted((r for r in table if keep(r[0]) and abs(r[3] - r[2]) / r[2] >= 0.02),
                          key=lambda r: -abs(r[3] - r[2]) / r[2])
        used = collections.Counter(r[0][0] for r in chosen)
        here: set = set()
        for r in pick:
            if len(here) == n:
                break
            if r in chosen or r[0][0] in here or used[r[0][0]] >= 2:
                continue
            here.add(r[0][0])
            chosen.append(r)
            print(f"{label:38s} {'|'.join(map(str, r[0])):48s} plan {r[2]:6.2f}  candidate {r[3]:6.2f}")
    return chosen


def main(argv: list) -> int:
    if not argv:
        print(__doc__)
        return 2
    if "--write" not in argv:
        draw(argv[0])
        return 0
    path = HERE / "specs" / "call26_x2.jsonl"
    specs = [json.loads(line) for line in path.read_text().splitlines()]
    for s, p in zip(specs, _predict(argv[0], specs)):
        if s.get("split") == "holdout":
            s["pred_gib_v11"] = round(p, 1)
    path.write_text("".join(json.dumps(s) + "\n" for s in specs))
    print(f"{path}: pred_gib_v11 for {sum('pred_gib_v11' in s for s in specs)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
