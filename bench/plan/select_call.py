"""Draw a pre-registered call's rows and write the candidate's predictions into its specs (issue 14, ninth pass).

Usage:
    python bench/plan/select_call.py CALL CANDIDATE_ROOT            print the draw (the rows of CALLn in make_specs_x2.py)
    python bench/plan/select_call.py CALL CANDIDATE_ROOT --write    add the candidate's prediction to specs/callN_x2.jsonl

CALL is 26 (candidate ``layers_init_v11_candidate.patch``, field ``pred_gib_v11``), 28 (``reduction_v12_candidate
.patch``, ``pred_gib_v12``) or 32 (branch ``z3-v13``, ``pred_gib_v13``). CANDIDATE_ROOT is a checkout of the commit
the call names with the patch applied (``git worktree add /tmp/cand c499297 && git -C /tmp/cand apply
bench/plan/layers_init_v11_candidate.patch``; for call 32, ``git worktree add /tmp/z3cand z3-v13``); the plan's
predictions come from this checkout at that call's commit. Each checkout predicts in its own process, as both are
the package ``zeropilot``.

The draw: every ZeRO-1/2 configuration of the catalogued small models (micro batch 1-8, 1024-4096 tokens, world size
1-2, with and without checkpointing, full or LoRA r8/r16, with and without offload_optimizer) never measured in
``bench/plan/data`` whose two predictions stay under 90 GiB; shuffled with seed 26; four strata where the predictions
differ by 2% or more, largest difference first, one row per model per stratum and at most two per model in all, and
three rows where they differ by under 2%. Call 28 draws the same way with seed 28, also leaving out call 26 and 27's
rows.

Call 32 (tenth pass, one GPU) tests a ZeRO-3 candidate instead: every configuration of ZeRO-3 with offload_param, the
optimizer on the GPU and full fine-tuning at world size 1 (micro batch 1-4, 1024-4096 tokens up to 8192 a step, with
and without checkpointing, built whole on the GPU or in zero.Init, sub_group_size 1e9 or 5e8), none ever measured,
whose two predictions stay under 90 GiB; shuffled with seed 32; six rows of each build, one per model and build.

Call 33 (one GPU) is no candidate's test but the plan's on ZeRO-3 at world size 1, where few rows were measured:
every configuration of ZeRO-3 (the small models and, with LoRA r16, Qwen2.5-7B, Llama-3.1-8B and Mistral-7B), built
whole or in zero.Init, full or LoRA r16, optimizer on the GPU, offloaded, or both offloaded, micro batch 1-4 and
1024-4096 tokens up to 8192 a step, with and without checkpointing, never measured at world size 1, whose predicted
GPU peak is under 80 GiB and host memory under 28 GiB a process; shuffled with seed 33; six rows of each build, one
per model and build. Usage: ``python bench/plan/select_call.py 33 .``; call 38 draws the same way with seed 38.

Call 36 (one GPU) tests candidate v14 (branch ``v14``): ZeRO-3 built whole with offload_param, without
checkpointing, LoRA r16 or full fine-tuning with the optimizer offloaded (where the plan counts the cached build
blocks), micro batch 1-4 and 1024-4096 tokens up to 8192 a step, world size 1, never measured, whose two predictions
stay under 80 GiB, host memory under 28 GiB a process, and differ by 2% or more; shuffled with seed 36; one row per
model, six rows.

Call 37 (one GPU) adds evidence on candidate v12 (branch ``adopt-v12``) where one GPU can give it, and decides
nothing: call 28 still decides v12. Its pool is call 28's at world size 1 (leaving out every row measured so far),
shuffled with seed 37: eight rows where the two predictions differ by 2% or more and four where they differ by less,
at most two per model.

Call 40 (one GPU) tests candidate v15 (branch ``v15``, ``zero3_gpu_v15_candidate.patch``): every configuration of
ZeRO-3 at world size 1 with the parameters and the optimizer on the GPU (the small models full or LoRA r16, and
Qwen2.5-7B, Llama-3.1-8B and Mistral-7B with LoRA r16), built whole or in zero.Init, with and without checkpointing
and overlap_comm, micro batch 1-4 and 1024-4096 tokens up to 8192 a step, never measured, whose two predictions stay
under 80 GiB; shuffled with seed 40; per build six rows where the predictions differ by 2% or more and two where they
differ by less, one per model in each. Usage: ``python bench/plan/select_call.py 40 /tmp/v15wt``.

Call 42 (two GPUs) checks the plan after v12 and v15 at world size 2, where v12 changed most and call 28 had twelve
rows: call 28's pool at world size 2 (every row measured before call 42 left out), shuffled with seed 42, ten rows,
one per model. Usage: ``python bench/plan/select_call.py 42 .``

Call 44 (one GPU) tests candidate v16 (branch ``v16``, ``zero3_offload_v16_candidate.patch``): as call 40's pool but
with the optimizer offloaded, host memory under 16 GiB a process and both predictions under 50 GiB; shuffled with
seed 44; per build four rows where the predictions differ by 2% or more and one where they differ by less. Usage:
``python bench/plan/select_call.py 44 /tmp/v16wt``.

Call 46 (one GPU) tests candidate v17 (branch ``v17``, ``zero3_v17_candidate.patch``) on ZeRO-3 at world size 1,
never measured, in three kinds: LoRA r16 with both offloads (the small models and Qwen2.5-7B, Llama-3.1-8B and
Mistral-7B; host memory under 28 GiB a process), full fine-tuning with the optimizer offloaded (under 16 GiB) and full
fine-tuning with offload_param and the optimizer on the GPU (under 28 GiB); built whole or in zero.Init, with and
without checkpointing, micro batch 1-4 and 1024-4096 tokens up to 8192 a step, both predictions under 50 GiB;
shuffled with seed 46; one row per model in each group: with both offloads, per build four rows where plan and
candidate differ by 2% or more and one where they differ by less; with the optimizer offloaded one row per build, and
with offload_param two in zero.Init, where they differ by 2% or more. Usage: ``python bench/plan/select_call.py 46
/tmp/v17wt``.

Call 47 (one GPU) is no candidate's test but the plan's after v17, at world size 1: twelve ZeRO-3 rows drawn as call
33's (seed 47: six per build, one per model and build, every mode of offload) and six ZeRO-1/2 rows from call 37's
pool (seed 47, one per model, predicted under 80 GiB). Usage: ``python bench/plan/select_call.py 47 .``

Call 48 (one GPU) is the plan's too, on the seed's kind at world size 1, which call 46 did not draw: LoRA r16 with
both offloads on Qwen2.5-7B, Llama-3.1-8B and Mistral-7B, built whole or in zero.Init, with and without
checkpointing, micro batch 1-4 and 1024-4096 tokens up to 8192 a step, never measured, host memory under 40 GiB a
process; shuffled with seed 48; three rows per build, one per model. Usage: ``python bench/plan/select_call.py 48 .``

Call 50 (one GPU) tests candidate v18 (branch ``v18``, ``zero3_v18_candidate.patch``) on ZeRO-3 with parameter offload
at world size 1, never measured: LoRA r16 with both offloads (the small models and the 7-8B ones) and full
fine-tuning with the optimizer on the GPU, built whole or in zero.Init, with and without checkpointing, micro batch
1-4 and 1024-4096 tokens up to 8192 a step, host memory under 28 GiB a process and both predictions under 50 GiB,
where plan and candidate differ by 1% or more; shuffled with seed 50; per kind and build three rows, one per model.
Usage: ``python bench/plan/select_call.py 50 /tmp/v18wt``.

Call 51 (one GPU) is the plan's, on the kind it warns about as ``KNOWN_UNDER["zero3_states_in_logits"]`` (full
fine-tuning at ZeRO-3, world size 1, everything on the GPU, where one fp32 copy of the logits can hold a sub-group's
fp32 block), to measure how often the warning comes true: the small models, built whole or in zero.Init, with and
without checkpointing, micro batch 1-4 and 1024-4096 tokens up to 8192 a step, never measured, predicted under 80
GiB; shuffled with seed 51; four rows per build, one per model. Usage: ``python bench/plan/select_call.py 51 .``

Call 52 (one GPU) tests candidate v19 (branch ``v19``, ``nograd_v19_candidate.patch``) on checkpointed runs at world
size 1, never measured: ZeRO-1/2 from call 26's pool, and ZeRO-3 from call 46's pool in five kinds (everything on the
GPU, LoRA r16, the optimizer offloaded, offload_param, LoRA r16 with both offloads; host memory under 28 GiB a
process), both predictions under 50 GiB; shuffled with seed 52; four ZeRO-1/2 and four ZeRO-3 rows where plan and
candidate differ by 2% or more, then two of any stage where they differ by less, one per model in each. Usage:
``python bench/plan/select_call.py 52 /tmp/v19wt``.

Call 53 (one GPU) is the plan's after v19, on call 52's pool (every row measured before call 53 left out), predicted
under 50 GiB; shuffled with seed 53; per layer kind of ``memory.gpu.NO_GRAD_TEMPLATES`` (llama-style, Qwen3, Gemma 2,
Gemma 3, Phi-3's fused) one ZeRO-1/2 and one ZeRO-3 row. Usage: ``python bench/plan/select_call.py 53 .``

Call 54 (prepared in the eleventh pass, not yet run; its world-size-2 rows need two GPUs) tests candidate v20 (branch
``v20``, ``grad_v20_candidate.patch``): every never-measured run of call 26's ZeRO-1/2 pool (world size 1 and 2) and of
call 46's ZeRO-3 pool in call 52's five kinds (world size 1, with and without checkpointing), both predictions under
50 GiB; shuffled with seed 54; four rows each of ZeRO-1/2 at world size 1, ZeRO-3 at world size 1 and ZeRO-1/2 at
world size 2 where plan and candidate differ by 2% or more, then two of any kind where they differ by less, one per
model in each. Usage: ``python bench/plan/select_call.py 54 /tmp/v20wt``.
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


FIELD = {26: "pred_gib_v11", 28: "pred_gib_v12", 32: "pred_gib_v13", 33: "pred_gib", 36: "pred_gib_v14",
         37: "pred_gib_v12", 38: "pred_gib", 40: "pred_gib_v15", 42: "pred_gib",
         44: "pred_gib_v16", 46: "pred_gib_v17", 47: "pred_gib", 48: "pred_gib", 50: "pred_gib_v18", 51: "pred_gib",
         52: "pred_gib_v19", 53: "pred_gib", 54: "pred_gib_v20"}


def measured_specs(call: int):
    """The spec of every committed measurement made before call ``call`` (this call's and later calls' rows left out,
    so that a draw stays reproducible once its own rows are measured)."""
    for path in (HERE / "data").glob("*.jsonl"):
        number = path.stem.partition("_call")[2].partition("_")[0]
        if path.name.startswith("h200x2_call") and number.isdigit() and int(number) >= call:
            continue
        for line in path.read_text().splitlines():
            yield json.loads(line).get("spec", {})


def pool(call: int) -> list:
    sys.path.insert(0, str(HERE))
    from make_specs_x2 import spec

    done = {(s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
             s.get("lora") or 0, bool(s.get("offload"))) for s in measured_specs(call)}
    out = []
    for key in itertools.product(NAMES, (1, 2), (1, 2, 4, 8), (1024, 2048, 4096), (1, 2), (False, True), (0, 8, 16),
                                 (False, True)):
        if key in done:
            continue
        name, stage, mb, seq, ws, gc, lora, off = key
        kw = {k: v for k, v in (("gc", gc), ("lora", lora), ("offload", off)) if v}
        out.append((key, spec(name, stage, mb, seq, ws, "holdout", **kw)))
    return out


def draw(call: int, candidate: str) -> list:
    rows = pool(call)
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    cand = _predict(candidate, [s for _, s in rows])
    table = [(k, s, a, b) for (k, s), a, b in zip(rows, plan, cand) if max(a, b) <= 90]
    random.Random(call).shuffle(table)
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


def draw_zero3(call: int, candidate: str) -> list:
    """Call 32's draw (see the module docstring)."""
    sys.path.insert(0, str(HERE))
    from make_specs_x2 import spec

    rows = []
    for name, mb, seq, gc, zero_init, sgs in itertools.product(NAMES, (1, 2, 4), (1024, 2048, 4096), (False, True),
                                                               (False, True), (int(1e9), int(5e8))):
        if mb * seq <= 8192:
            kw = {"gc": True} if gc else {}
            rows.append(spec(name, 3, mb, seq, 1, "holdout", offload_param=True, zero_init=zero_init, sgs=sgs, **kw))
    plan = _predict(str(HERE.parents[1]), rows)
    cand = _predict(candidate, rows)
    table = [(s, a, b) for s, a, b in zip(rows, plan, cand) if max(a, b) <= 90]
    random.Random(call).shuffle(table)
    chosen: list = []
    for build in (False, True):
        here: set = set()
        for s, a, b in table:
            if s["zero_init"] == build and s["name"] not in here and len(here) < 6:
                here.add(s["name"])
                chosen.append(s)
                print(f"{'zero.Init' if build else 'raw build':10s} {s['name']:17s} mb{s['mb']} s{s['seq']} "
                      f"gc={bool(s.get('gc'))} sgs={s['sgs']:.0e}  plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_zero3_plan(call: int) -> list:
    """Call 33's draw (see the module docstring): the plan's predictions only."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    done = {(s["name"], s["mb"], s["seq"], bool(s.get("gc")), s.get("lora") or 0, bool(s.get("offload")),
             bool(s.get("offload_param")), bool(s.get("zero_init")))
            for s in measured_specs(call) if s.get("stage") == 3 and s.get("ws", 1) == 1}
    table = []
    for name, zero_init, lora, mode, gc, mb, seq in itertools.product(
            NAMES + ["qwen2.5-7b", "llama-3.1-8b", "mistral-7b"], (False, True), (0, 16), ("gpu", "opt", "both"),
            (False, True), (1, 2, 4), (1024, 2048, 4096)):
        key = (name, mb, seq, gc, lora, mode != "gpu", mode == "both", zero_init)
        if mb * seq > 8192 or key in done or (name.endswith(("7b", "8b")) and not lora):
            continue
        kw = {k: v for k, v in (("gc", gc), ("lora", lora), ("offload", mode != "gpu"), ("offload_param", mode == "both"))
              if v}
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=zero_init, **kw)
        plan = make_plan(spec_inputs(s, 139.8))
        if plan.gpu_peak_bytes < 80 * 2**30 and plan.host.per_process_bytes < 28 * 2**30:
            table.append((s, plan.gpu_peak_bytes / 2**30))
    random.Random(call).shuffle(table)
    chosen: list = []
    _per_build(table, chosen, 6, lambda row: True,
               lambda s, gib: f"offload={bool(s.get('offload'))} offload_param={bool(s.get('offload_param'))}  "
                              f"plan {gib:6.2f}")
    return chosen


def _per_build(table: list, chosen: list, per_build: int, keep, tail) -> None:
    """Add to ``chosen``, for each build (whole, then zero.Init), up to ``per_build`` rows of ``table`` that ``keep``
    accepts, one per model, in the table's order; print each (``tail``: the row's end of line)."""
    for build in (False, True):
        here: set = set()
        for row in table:
            s = row[0]
            if (s["zero_init"] == build and keep(row) and s["name"] not in here and len(here) < per_build
                    and s not in chosen):
                here.add(s["name"])
                chosen.append(s)
                print(f"{'zero.Init' if build else 'raw build':10s} {s['name']:17s} mb{s['mb']} s{s['seq']} "
                      f"gc={bool(s.get('gc'))} lora={s.get('lora', 0)} {tail(*row)}")


def draw_build_cache(call: int, candidate: str) -> list:
    """Call 36's draw (see the module docstring)."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    done = {(s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
             s.get("lora") or 0, bool(s.get("offload")), bool(s.get("offload_param")), bool(s.get("zero_init")))
            for s in measured_specs(call)}
    rows = []
    for name, lora, mb, seq in itertools.product(NAMES + ["qwen2.5-7b", "llama-3.1-8b", "mistral-7b"], (0, 16),
                                                 (1, 2, 4), (1024, 2048, 4096)):
        if mb * seq > 8192 or (name.endswith(("7b", "8b")) and not lora):
            continue
        if (name, 3, mb, seq, 1, False, lora, True, True, False) in done:
            continue
        kw = {"lora": lora} if lora else {}
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=False, offload=True, offload_param=True, **kw)
        if make_plan(spec_inputs(s, 139.8)).host.per_process_bytes < 28 * 2**30:
            rows.append(s)
    plan = _predict(str(HERE.parents[1]), rows)
    cand = _predict(candidate, rows)
    table = [(s, a, b) for s, a, b in zip(rows, plan, cand) if max(a, b) < 80 and abs(b - a) / a >= 0.02]
    random.Random(call).shuffle(table)
    chosen: list = []
    for s, a, b in table:
        if s["name"] not in {c["name"] for c in chosen} and len(chosen) < 6:
            chosen.append(s)
            print(f"{s['name']:17s} mb{s['mb']} s{s['seq']} lora={s.get('lora', 0)}  plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_world_size_1(call: int, candidate: str) -> list:
    """Call 37's draw (see the module docstring)."""
    rows = [(k, s) for k, s in pool(call) if k[4] == 1]
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    cand = _predict(candidate, [s for _, s in rows])
    table = [(k, s, a, b) for (k, s), a, b in zip(rows, plan, cand) if max(a, b) <= 90]
    random.Random(call).shuffle(table)
    chosen: list = []
    for wanted, differ in ((8, True), (4, False)):
        here = 0
        for k, s, a, b in table:
            used = collections.Counter(c[0][0] for c in chosen)
            if here < wanted and (abs(b - a) / a >= 0.02) == differ and used[k[0]] < 2:
                chosen.append((k, s, a, b))
                here += 1
                print(f"{'|'.join(map(str, k)):48s} plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def _zero3_world_size_1(call: int, offload: bool) -> list:
    """Calls 40 and 44's pool: ZeRO-3 at world size 1 with the parameters on the GPU, the optimizer on the GPU or
    offloaded (then with host memory under 16 GiB a process), never measured before ``call``."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    done = {(s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
             s.get("lora") or 0, bool(s.get("offload")), bool(s.get("offload_param")), bool(s.get("zero_init")),
             bool(s.get("overlap"))) for s in measured_specs(call)}
    rows = []
    for name, zero_init, lora, gc, overlap, mb, seq in itertools.product(
            NAMES + ["qwen2.5-7b", "llama-3.1-8b", "mistral-7b"], (False, True), (0, 16), (False, True),
            (False, True), (1, 2, 4), (1024, 2048, 4096)):
        if mb * seq > 8192 or (name.endswith(("7b", "8b")) and not lora):
            continue
        if (name, 3, mb, seq, 1, gc, lora, offload, False, zero_init, overlap) in done:
            continue
        kw = {k: v for k, v in (("gc", gc), ("lora", lora), ("overlap", overlap), ("offload", offload)) if v}
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=zero_init, **kw)
        if not offload or make_plan(spec_inputs(s, 139.8)).host.per_process_bytes < 16 * 2**30:
            rows.append(s)
    return rows


def _draw_zero3_world_size_1(call: int, candidate: str, offload: bool, limit: float, counts) -> list:
    """Calls 40 and 44's draw: per build, ``counts`` rows where plan and candidate differ by 2% or more, then where
    they differ by less, one per model in each, from the shuffled pool whose predictions stay under ``limit`` GiB."""
    rows = _zero3_world_size_1(call, offload)
    plan = _predict(str(HERE.parents[1]), rows)
    cand = _predict(candidate, rows)
    table = [(s, a, b) for s, a, b in zip(rows, plan, cand) if max(a, b) < limit]
    random.Random(call).shuffle(table)
    chosen: list = []
    for differ, per_build in zip((True, False), counts):
        _per_build(table, chosen, per_build, lambda row: (abs(row[2] - row[1]) / row[1] >= 0.02) == differ,
                   lambda s, a, b: f"overlap={bool(s.get('overlap'))}  plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_zero3_gpu(call: int, candidate: str) -> list:
    """Call 40's draw (see the module docstring)."""
    return _draw_zero3_world_size_1(call, candidate, False, 80, (6, 2))


def draw_zero3_offload(call: int, candidate: str) -> list:
    """Call 44's draw (see the module docstring)."""
    return _draw_zero3_world_size_1(call, candidate, True, 50, (4, 1))


def _zero3_kinds_pool(call: int, kinds: dict, key, host_gib) -> list:
    """Calls 46 and 50's pool: (kind, spec) for each of ``kinds`` (its name: the spec's keywords) at ZeRO-3 and world
    size 1, built whole or in zero.Init, with and without checkpointing, micro batch 1-4 and 1024-4096 tokens up to
    8192 a step (the 7-8B models with both offloads only); left out, a spec whose ``key`` a measurement made before
    ``call`` has (``key`` returns None for measurements that do not count), or whose host memory is not under
    ``host_gib(kind)`` GiB a process."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    done = {key(s) for s in measured_specs(call)} - {None}
    rows = []
    for kind, name, zero_init, gc, mb, seq in itertools.product(
            kinds, NAMES + ["qwen2.5-7b", "llama-3.1-8b", "mistral-7b"], (False, True), (False, True), (1, 2, 4),
            (1024, 2048, 4096)):
        kw = dict(kinds[kind], **({"gc": True} if gc else {}))
        if mb * seq > 8192 or (name.endswith(("7b", "8b")) and kind != "both"):
            continue
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=zero_init, **kw)
        if key(s) not in done and make_plan(spec_inputs(s, 139.8)).host.per_process_bytes < host_gib(kind) * 2**30:
            rows.append((kind, s))
    return rows


def draw_zero3_v17(call: int, candidate: str) -> list:
    """Call 46's draw (see the module docstring)."""
    rows = _zero3_kinds_pool(
        call, {"both": dict(lora=16, offload=True, offload_param=True), "opt": dict(offload=True),
               "param": dict(offload_param=True)},
        lambda s: (s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
                   s.get("lora") or 0, bool(s.get("offload")), bool(s.get("offload_param")), bool(s.get("zero_init")),
                   bool(s.get("overlap"))),
        lambda kind: 16 if kind == "opt" else 28)
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    cand = _predict(candidate, [s for _, s in rows])
    table = [(s, a, b, k) for (k, s), a, b in zip(rows, plan, cand) if max(a, b) < 50]
    random.Random(call).shuffle(table)
    chosen: list = []
    for kind, differ, zero_init_only, count in (("both", True, False, 4), ("both", False, False, 1),
                                                ("opt", True, False, 1), ("param", True, True, 2)):
        _per_build(table, chosen, count,
                   lambda row, kind=kind, differ=differ, only=zero_init_only: (
                       row[3] == kind and (abs(row[2] - row[1]) / row[1] >= 0.02) == differ
                       and (row[0]["zero_init"] or not only)),
                   lambda s, a, b, k: f"{k:5s} plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def _one_per_model(call: int, world_size: int, limit: float, count: int) -> list:
    """Calls 42 and 47's draw from ``pool`` at ``world_size``: (key, spec, the plan's GiB) of ``count`` rows, one per
    model, from the shuffled rows the plan predicts at ``limit`` GiB or less."""
    rows = [(k, s) for k, s in pool(call) if k[4] == world_size]
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    table = [(k, s, a) for (k, s), a in zip(rows, plan) if a <= limit]
    random.Random(call).shuffle(table)
    chosen: list = []
    for k, s, a in table:
        if len(chosen) < count and k[0] not in {c[0][0] for c in chosen}:
            chosen.append((k, s, a))
            print(f"{'|'.join(map(str, k)):48s} plan {a:6.2f}")
    return chosen


def draw_plan_world_size_1(call: int) -> list:
    """Call 47's draw (see the module docstring): the plan's predictions only."""
    return draw_zero3_plan(call) + [s for _, s, _ in _one_per_model(call, 1, 80, 6)]


def draw_large_both_offloads(call: int) -> list:
    """Call 48's draw (see the module docstring): the plan's predictions only."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    done = {(s["name"], s["mb"], s["seq"], bool(s.get("gc")), bool(s.get("zero_init")))
            for s in measured_specs(call) if s.get("stage") == 3 and s.get("ws", 1) == 1 and s.get("lora")
            and s.get("offload") and s.get("offload_param")}
    table = []
    for name, zero_init, gc, mb, seq in itertools.product(("qwen2.5-7b", "llama-3.1-8b", "mistral-7b"),
                                                          (False, True), (False, True), (1, 2, 4), (1024, 2048, 4096)):
        if mb * seq > 8192 or (name, mb, seq, gc, zero_init) in done:
            continue
        kw = {"gc": True} if gc else {}
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=zero_init, lora=16, offload=True, offload_param=True, **kw)
        plan = make_plan(spec_inputs(s, 139.8))
        if plan.gpu_peak_bytes < 80 * 2**30 and plan.host.per_process_bytes < 40 * 2**30:
            table.append((s, plan.gpu_peak_bytes / 2**30))
    random.Random(call).shuffle(table)
    chosen: list = []
    _per_build(table, chosen, 3, lambda row: True, lambda s, gib: f"plan {gib:6.2f}")
    return chosen


def draw_zero3_v18(call: int, candidate: str) -> list:
    """Call 50's draw (see the module docstring)."""
    kinds = {"both": dict(lora=16, offload=True, offload_param=True), "param": dict(offload_param=True)}
    rows = _zero3_kinds_pool(
        call, kinds,
        lambda s: ((s.get("name"), s.get("mb"), s.get("seq"), bool(s.get("gc")), s.get("lora") or 0,
                    bool(s.get("offload")), bool(s.get("zero_init")))
                   if s.get("stage") == 3 and s.get("ws", 1) == 1 and s.get("offload_param") else None),
        lambda kind: 28)
    plan = _predict(str(HERE.parents[1]), [s for _, s in rows])
    cand = _predict(candidate, [s for _, s in rows])
    table = [(s, a, b, k) for (k, s), a, b in zip(rows, plan, cand) if max(a, b) < 50]
    random.Random(call).shuffle(table)
    chosen: list = []
    for kind in kinds:
        _per_build(table, chosen, 3, lambda row, kind=kind: row[3] == kind and abs(row[2] - row[1]) / row[1] >= 0.01,
                   lambda s, a, b, k: f"{k:5s} plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_states_in_logits(call: int) -> list:
    """Call 51's draw (see the module docstring): the plan's predictions only."""
    sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]
    from make_specs_x2 import spec
    from rows import spec_inputs

    from zeropilot.memory.gpu import zero3_replay
    from zeropilot.memory.plan import make_plan

    def states_in_logits(inputs) -> bool:  # KNOWN_UNDER["zero3_states_in_logits"] until v19 (call 52) removed it
        replay = zero3_replay(inputs)
        logits = 4 * inputs.micro_batch * inputs.seq_len * inputs.arch.vocab
        return replay is not None and inputs.lora_rank is None and logits >= max(replay["sub_groups"],
                                                                                 default=logits + 1)

    done = {(s.get("name"), s.get("mb"), s.get("seq"), bool(s.get("gc")), bool(s.get("zero_init")))
            for s in measured_specs(call) if s.get("stage") == 3 and s.get("ws", 1) == 1 and not s.get("lora")
            and not s.get("offload") and not s.get("offload_param")}
    table = []
    for name, zero_init, gc, mb, seq in itertools.product(NAMES, (False, True), (False, True), (1, 2, 4),
                                                          (1024, 2048, 4096)):
        if mb * seq > 8192 or (name, mb, seq, gc, zero_init) in done:
            continue
        s = spec(name, 3, mb, seq, 1, "holdout", zero_init=zero_init, **({"gc": True} if gc else {}))
        inputs = spec_inputs(s, 139.8)
        plan = make_plan(inputs)
        if states_in_logits(inputs) and plan.gpu_peak_bytes < 80 * 2**30:
            table.append((s, plan.gpu_peak_bytes / 2**30))
    random.Random(call).shuffle(table)
    chosen: list = []
    _per_build(table, chosen, 4, lambda row: True, lambda s, gib: f"plan {gib:6.2f}")
    return chosen


def _all_kinds_pool(call: int) -> list:
    """Calls 52-54's pool: runs never measured before ``call``, ZeRO-1/2 from call 26's pool (world size 1 and 2) and
    ZeRO-3 from call 46's (world size 1) in five kinds (host memory under 28 GiB a process)."""
    kinds = {"gpu": {}, "lora": dict(lora=16), "opt": dict(offload=True), "param": dict(offload_param=True),
             "both": dict(lora=16, offload=True, offload_param=True)}
    zero3 = _zero3_kinds_pool(
        call, kinds,
        lambda s: (s.get("name"), s.get("stage"), s.get("mb"), s.get("seq"), s.get("ws", 1), bool(s.get("gc")),
                   s.get("lora") or 0, bool(s.get("offload")), bool(s.get("offload_param")), bool(s.get("zero_init")),
                   bool(s.get("overlap"))),
        lambda kind: 28)
    return [s for _, s in pool(call)] + [s for _, s in zero3]


def _checkpointed_pool(call: int) -> list:
    """Calls 52 and 53's pool: the checkpointed runs at world size 1 of :func:`_all_kinds_pool`."""
    return [s for s in _all_kinds_pool(call) if s.get("gc") and s["ws"] == 1]


def draw_checkpointed_plan(call: int) -> list:
    """Call 53's draw (see the module docstring): the plan's predictions only."""
    layer_kind = {"qwen3": "qwen3", "gemma-2": "gemma2", "gemma-3": "gemma3", "phi-3": "fused"}
    rows = _checkpointed_pool(call)
    plan = _predict(str(HERE.parents[1]), rows)
    table = [(s, a) for s, a in zip(rows, plan) if a < 50]
    random.Random(call).shuffle(table)
    chosen: list = []
    for kind in ("llama", "qwen3", "gemma2", "gemma3", "fused"):
        for zero3 in (False, True):
            for s, a in table:
                mine = next((v for k, v in layer_kind.items() if s["name"].startswith(k)), "llama")
                if mine == kind and (s["stage"] == 3) == zero3:
                    chosen.append(s)
                    print(f"{kind:7s} z{s['stage']} {s['name']:17s} mb{s['mb']} s{s['seq']} lora={s.get('lora', 0)} "
                          f"offload={bool(s.get('offload'))} offload_param={bool(s.get('offload_param'))} "
                          f"zero_init={bool(s.get('zero_init'))}  plan {a:6.2f}")
                    break
    return chosen


def draw_v20(call: int, candidate: str) -> list:
    """Call 54's draw (see the module docstring)."""
    rows = _all_kinds_pool(call)
    plan = _predict(str(HERE.parents[1]), rows)
    cand = _predict(candidate, rows)
    table = [(s, a, b) for s, a, b in zip(rows, plan, cand) if max(a, b) < 50]
    random.Random(call).shuffle(table)
    chosen: list = []
    strata = (("world size 1, ZeRO-1/2", lambda s: s["stage"] < 3 and s["ws"] == 1, True, 4),
              ("world size 1, ZeRO-3", lambda s: s["stage"] == 3, True, 4),
              ("world size 2, ZeRO-1/2", lambda s: s["ws"] == 2, True, 4),
              ("any", lambda s: True, False, 2))
    for label, keep, differ, count in strata:
        here: set = set()
        for s, a, b in table:
            if (keep(s) and (abs(b - a) / a >= 0.02) == differ and s["name"] not in here and len(here) < count
                    and s not in chosen):
                here.add(s["name"])
                chosen.append(s)
                print(f"{label:22s} z{s['stage']} ws{s['ws']} {s['name']:17s} mb{s['mb']} s{s['seq']} "
                      f"gc={bool(s.get('gc'))} lora={s.get('lora', 0)} offload={bool(s.get('offload'))} "
                      f"offload_param={bool(s.get('offload_param'))} zero_init={bool(s.get('zero_init'))}  "
                      f"plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_checkpointed(call: int, candidate: str) -> list:
    """Call 52's draw (see the module docstring)."""
    rows = _checkpointed_pool(call)
    plan = _predict(str(HERE.parents[1]), rows)
    cand = _predict(candidate, rows)
    table = [(s, a, b) for s, a, b in zip(rows, plan, cand) if max(a, b) < 50]
    random.Random(call).shuffle(table)
    chosen: list = []
    for stage, differ, count in (((1, 2), True, 4), ((3,), True, 4), ((1, 2, 3), False, 2)):
        here: set = set()
        for s, a, b in table:
            if (s["stage"] in stage and (abs(b - a) / a >= 0.02) == differ and s["name"] not in here
                    and len(here) < count and s not in chosen):
                here.add(s["name"])
                chosen.append(s)
                print(f"z{s['stage']} {s['name']:17s} mb{s['mb']} s{s['seq']} lora={s.get('lora', 0)} "
                      f"offload={bool(s.get('offload'))} offload_param={bool(s.get('offload_param'))} "
                      f"zero_init={bool(s.get('zero_init'))}  plan {a:6.2f}  candidate {b:6.2f}")
    return chosen


def draw_world_size_2(call: int) -> list:
    """Call 42's draw (see the module docstring): the plan's predictions only."""
    return _one_per_model(call, 2, 90, 10)


def main(argv: list) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) not in FIELD:
        print(__doc__)
        return 2
    call, candidate = int(argv[0]), argv[1]
    if "--write" not in argv:
        plan_only = {33: draw_zero3_plan, 38: draw_zero3_plan, 42: draw_world_size_2, 47: draw_plan_world_size_1,
                     48: draw_large_both_offloads, 51: draw_states_in_logits, 53: draw_checkpointed_plan}
        with_candidate = {26: draw, 28: draw, 32: draw_zero3, 36: draw_build_cache, 37: draw_world_size_1,
                          40: draw_zero3_gpu, 44: draw_zero3_offload, 46: draw_zero3_v17, 50: draw_zero3_v18,
                          52: draw_checkpointed, 54: draw_v20}
        if call in plan_only:
            plan_only[call](call)
        else:
            with_candidate[call](call, candidate)
        return 0
    path, field = HERE / "specs" / f"call{call}_x2.jsonl", FIELD[call]
    specs = [json.loads(line) for line in path.read_text().splitlines()]
    for s, p in zip(specs, _predict(candidate, specs)):
        if s.get("split") == "holdout":
            s[field] = round(p, 1)
            if call in (32, 36, 37, 40, 44, 46, 50, 52, 54):  # packing the runs on one GPU (make_specs_x2.py, above CALL32)
                s["need_gib"] = round(1.1 * max(p, s["pred_gib"]) + 3)
    path.write_text("".join(json.dumps(s) + "\n" for s in specs))
    print(f"{path}: {field} for {sum(field in s for s in specs)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
