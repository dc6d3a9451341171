"""The committed accuracy figures (bench/plan/results) are what the estimator gives today."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan"


def test_committed_accuracy_results_match_a_fresh_computation():
    proc = subprocess.run([sys.executable, str(BENCH / "accuracy.py"), "--check"], capture_output=True, text=True,
                          timeout=120, cwd=BENCH)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_not_tuned_rows_meet_the_accuracy_goal():
    sys.path.insert(0, str(BENCH))
    from accuracy import compute

    summary = compute()["summary"]
    unseen = summary["not tuned (holdout + new-arch + x2-holdout)"]
    assert unseen["rows"] >= 70 and unseen["median_abs_error_pct"] <= 5  # issue 14's median target
    assert summary["new-arch"]["rows"] >= 10 and summary["new-arch"]["max_abs_error_pct"] <= 12


def test_every_never_fitted_row_under_predicted_beyond_8_percent_is_of_a_kind_the_plan_warns_about():
    """Issue 14: never under-predict by more than 8%. Where the model still does, the plan must say so (its note
    quotes the measured worst, ``memory.plan.KNOWN_UNDER``)."""
    sys.path.insert(0, str(BENCH))
    from accuracy import NOT_TUNED
    from rows import load_rows

    from zeropilot.memory.gpu import estimate_gpu
    from zeropilot.memory.plan import known_under

    unwarned = [r.label for r in load_rows() if r.split in NOT_TUNED and r.measured_bytes
                and estimate_gpu(r.inputs).peak_bytes / r.measured_bytes - 1 < -0.08 and known_under(r.inputs) is None]
    assert unwarned == []


def test_the_plans_known_under_predictions_are_the_measured_ones():
    """`memory.plan.KNOWN_UNDER` states the worst under-prediction per kind of run: it must be what the committed
    never-fitted rows give (one fact: the bench results; the plan only quotes them)."""
    sys.path.insert(0, str(BENCH))
    from accuracy import NOT_TUNED
    from rows import load_rows

    from zeropilot.memory.gpu import estimate_gpu
    from zeropilot.memory.plan import KNOWN_UNDER, known_under

    worst = {}
    for r in load_rows():
        if r.split in NOT_TUNED and r.measured_bytes:
            kind = known_under(r.inputs)
            if kind is not None:
                err = round(100 * (estimate_gpu(r.inputs).peak_bytes / r.measured_bytes - 1), 1)
                worst[kind] = min(worst.get(kind, 0.0), err)
    assert worst == {k: v[0] for k, v in KNOWN_UNDER.items()}


def test_the_plans_known_spreads_are_the_measured_ones():
    """`memory.plan.KNOWN_SPREAD` states, per kind of run, how far apart one configuration's measured peaks came in
    different runs: it must be the largest spread among the committed configurations of that kind measured more than
    once, and every configuration measured more than once that spread beyond 0.05 GiB must be of a kind the plan
    warns about (43 of 45 repeated configurations gave the same peak to 0.01 GiB)."""
    from collections import defaultdict

    sys.path.insert(0, str(BENCH))
    from rows import load_rows

    from zeropilot.memory.plan import KNOWN_SPREAD, known_spread, make_plan

    runs = defaultdict(list)
    for r in load_rows():
        if r.measured_bytes and not r.cap_gib:
            s = r.raw["spec"]
            key = (r.label, s.get("ws", 1), bool(s.get("zero_init")), s.get("sgs"), s.get("rbs"), s.get("mlp"),
                   s.get("alloc_conf"), s.get("attn"))
            runs[key].append(r)
    spread = {}
    for rs in runs.values():
        if len(rs) > 1:
            gib = round((max(r.measured_bytes for r in rs) - min(r.measured_bytes for r in rs)) / 2**30, 2)
            kind = known_spread(rs[0].inputs)
            assert gib <= 0.05 or kind is not None, (rs[0].label, gib)
            if kind is not None:
                spread[kind] = max(spread.get(kind, 0.0), gib)
                assert any(f"up to {KNOWN_SPREAD[kind][0]:.1f} GiB more" in n for n in make_plan(rs[0].inputs).notes)
    assert spread == {k: v[0] for k, v in KNOWN_SPREAD.items()}


def test_zero12_allocator_replay_against_the_committed_allocator_traces():
    """The ZeRO-1/2 allocator replay (memory/segments.py, fed by memory/gpu.py ``zero12_replay``) against the
    caching allocator's own history of the traced H200 runs (bench/plan/data/traces, made by ``run_specs.sh`` on the
    specs of rows with ``trace``): the segments after ``deepspeed.initialize`` and at the end of training. At world size
    1 the replay ends within 1% of the trace on most rows and never under it by more than 2% (two no-checkpointing
    rows end 6% over), except Gemma-2-2B without checkpointing at 4096 tokens (call 17, 2.1% under) and Gemma-2-2B LoRA
    without checkpointing at 8192 tokens (call 27, 12% over); at world size 2 within 1%, except Qwen2.5-0.5B LoRA
    without checkpointing (call 22), where the backward's cuBLAS workspace settles in a hole the real allocator did not
    have and so does not split an fp32 logits block that the next step then needs whole (14% under). Call 27's
    Gemma-3-1B at world size 2 was 18% under the same way until v19 replayed checkpointing's first forward without
    autograd (``memory.gpu.NO_GRAD_TEMPLATES``): now within 0.1%."""
    import statistics

    sys.path.insert(0, str(BENCH))
    from rows import spec_inputs, traced_runs

    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.gpu import trainable_params, zero12_replay
    from zeropilot.memory.segments import zero12_reserved
    from zeropilot.models.params import count_params

    # (low, high) where the replay is known to miss, each a cuBLAS workspace placed elsewhere than the real one
    known_misses = {"gemma-2-2b_z2_mb1_s4096_ws1": (-0.03, 0), "gemma-2-2b_z2_mb8_s1024_lora16_ws1": (0, 0.13),
                    "qwen2.5-0.5b_z2_mb4_s1024_lora8_ws2": (-0.15, 0)}
    errors = []
    for r, init, final in traced_runs():
        spec = r["spec"]
        if spec["stage"] not in (1, 2):
            continue
        inputs = spec_inputs(spec, r["total_gpu_gb"])
        counts = count_params(inputs.arch)
        args = zero12_replay(inputs, counts, trainable_params(inputs, counts), DEFAULT)
        err = zero12_reserved(**args) / final - 1
        init_replay = zero12_reserved(**dict(args, steps=0))
        assert abs(init_replay - init) <= 0.04 * init, (spec["trace"], init_replay, init)
        low, high = known_misses.get(spec["trace"], (-0.02, 0.07) if inputs.world_size == 1 else (-0.01, 0.011))
        assert low <= err <= high, (spec["trace"], err)
        if inputs.world_size == 1:
            errors.append(abs(err))
    assert len(errors) >= 20
    assert statistics.median(errors) <= 0.005


def test_zero3_allocator_replay_against_the_allocator_traces():
    """The ZeRO-3 replay (memory/segments.py ``zero3_reserved``, fed by memory/gpu.py ``zero3_replay``) against the
    caching allocator's history of every traced run of its kinds: offload_param at world size 2 (call 7: Qwen2.5-3B, two
    sub-groups; call 21: Qwen2.5-1.5B and Llama-3.2-3B, built whole), and the parameters on the GPU at world size 1
    (call 11's LoRA save run; call 39: full fine-tuning in zero.Init and built whole, overlap_comm, Gemma 2's
    soft-capped logits, LoRA; call 41), and the optimizer offloaded (calls 34, 43 and 45), and LoRA with both offloads
    at world size 1 (calls 34 and 35: in zero.Init and built whole, checkpointed or not; call 49: the two largest
    over-predictions of call 46's rows). The segments after ``deepspeed.initialize`` within 6% under (the small pool's 2
    MiB segments are not replayed; nor, with the parameters on the GPU, the build's one extra embedding-sized block,
    which a tied model built whole keeps from its own output layer: v18 replays it with parameter offload, where call
    21's two traces were 5.3% and 3.7% under and call 49's Gemma-2-2B 18.9% under before) or 1% over, and at the end of
    training within 2% under or 1% over (with both offloads 4% under or 3% over: the gathered parameters are replayed
    per layer, not per module; Gemma-2-2B in zero.Init 12.8% over call 35's run, which peaked 0.97 GiB under call 33's
    run of that configuration: ``memory.plan.KNOWN_SPREAD``; call 49's two runs 8.4% and 11.7% over: the backward's
    cuBLAS workspace and, in the Qwen2.5-0.5B run, the gathered window split released logits blocks, so the second
    step's logits take one more segment; the Gemma-2-2B run was 13.0% over before v18 released the output layer's weight
    after its forward). Call 41's Qwen2.5-3B run (8192 tokens a step) was 11% under until v19: there the first step's
    AdamW states settled in the logits' released fp32 blocks because the output layer's input gradient had taken the
    hole the last layer's output left, and the backward's workspace split the block the states needed; v19 replays
    checkpointing's forward without autograd and that input gradient, and ends within 0.1%. Before the replay the
    plan's fitted gap was 11.2% under on
    the Qwen2.5-3B offload_param row, 13.7% under on Gemma-3-1B (call 38) and 12.3% under on Qwen2.5-0.5B with the
    optimizer offloaded (call 33); before the hooks' gathers were replayed (``hooked``), 15.6% over on Gemma-3-1B with
    the optimizer offloaded (call 33; call 45's trace); before LoRA with both offloads was replayed, its fitted gap was
    20.5% over on Gemma-2-2B in zero.Init (call 33) and 18.6% over on Qwen2.5-0.5B (call 38)."""

    sys.path.insert(0, str(BENCH))
    from rows import spec_inputs, traced_runs

    from zeropilot.memory.gpu import estimate_gpu, zero3_replay
    from zeropilot.memory.segments import zero3_reserved

    known_misses = {  # call 49: v17's two largest over-predictions of call 46's rows, traced for a later pass
                    "gemma-2-2b_z3_mb1_s1024_lora16_offload_offload_param_ws1_frames": (0.0, 0.14),
                    "qwen2.5-0.5b_z3_mb2_s2048_lora16_offload_offload_param_zinit_ws1_frames": (0.0, 0.13)}
    for name in ("gemma-2-2b_z3_mb1_s1024_lora16_offload_offload_param_zinit_ws1", ):  # calls 34 and 35
        known_misses[name] = known_misses[name + "_frames"] = (0.0, 0.13)

    seen = []
    for r, init, final in traced_runs():
        inputs = spec_inputs(r["spec"], r["total_gpu_gb"])
        args = zero3_replay(inputs)
        if args is None:
            continue
        init_replay = zero3_reserved(**dict(args, steps=0))
        init_err = init_replay / init - 1
        err = zero3_reserved(**args) / final - 1
        both = r["spec"].get("offload") and r["spec"].get("offload_param")  # LoRA: the gathered window replayed
        low, high = known_misses.get(r["spec"]["trace"], (-0.04, 0.03) if both else (-0.02, 0.01))
        assert -0.06 <= init_err <= 0.01 and low <= err <= high, (r["spec"]["trace"], init_err, err)
        # the plan's init phase peak is that replay's (plus memory outside PyTorch), not the allocated estimate
        gpu = estimate_gpu(inputs)
        outside = next(c.bytes for c in gpu.components if c.name == "non_torch")
        assert gpu.init_peak_bytes == init_replay + outside, r["spec"]["trace"]
        seen.append(r["spec"]["trace"])
    assert len(seen) == 22


def test_checkpointed_forward_templates_are_the_traces_own_sequence():
    """``memory.gpu.NO_GRAD_TEMPLATES`` (v19, call 52): gradient checkpointing's first forward runs each decoder layer
    without autograd, so each tensor goes once its last user is done. Expanded for a traced run, the template's
    tensors of 1 MiB or more must occur in that run's allocator history with the same sizes and the same releases
    (released before the same later tensor; the layer's output, the last, lives on as the next layer's input), once per
    layer and step: the traces it was read off (Qwen2.5-3B, Qwen3-1.7B, Gemma-2-2B, Gemma-3-1B at 8192 tokens: there
    its 22 sliding-window layers; the 4 global ones take one copy of the attention's output fewer) and a LoRA run with
    bf16 adapters (Gemma-2-2B, call 22). zero.Init LoRA's fp32 transients (call 35's Qwen2.5-7B, where parameter
    offload's gathers interleave with most layers) must match at least once. Not asserted, seen: at 2048 tokens every
    Gemma-3-1B layer takes that copy fewer, and llama-style LoRA runs show one more 1 MiB tensor after the
    attention."""
    sys.path.insert(0, str(BENCH))
    from rows import spec_inputs, step_tensors, traced_runs

    from zeropilot.memory.gpu import layer_tensors

    want = {"qwen2.5-3b_z3_mb2_s4096_gc_zinit_ws1_frames": 2 * 36, "qwen3-1.7b_z2_mb4_s2048_gc_offload_ws1": 2 * 28,
            "gemma-2-2b_z3_mb4_s1024_gc_ws1_frames": 2 * 26, "gemma-3-1b_z2_mb8_s1024_gc_ws2": 2 * 22,
            "gemma-2-2b_z2_mb2_s2048_gc_lora16_ws2": 2 * 26,
            "qwen2.5-7b_z3_mb1_s1024_gc_lora16_offload_offload_param_zinit_ws1_frames": None}  # None: at least once
    seen = {}
    for r, _, _ in traced_runs():
        trace = r["spec"]["trace"]
        if trace not in want or trace in seen:
            continue
        inputs = spec_inputs(r["spec"], r["total_gpu_gb"])
        matches = len(_occurrences(layer_tensors(inputs, no_grad=True), *step_tensors(trace), trace))
        seen[trace] = matches
        assert matches == want[trace] if want[trace] else matches >= 1, (trace, matches)
    assert set(seen) == set(want)


def _occurrences(layer, got_sizes, got_until, trace, strict=True):
    """Where a layer template's tensors of 1 MiB or more occur in a trace's training phase (``rows.step_tensors``):
    the start of each run of the same sizes that releases its tensors before the same later tensors (a release past
    the run, or none, reads as kept); ``strict``: every run of the same sizes must."""
    large = [i for i, (size, _) in enumerate(layer) if size >= 2**20]  # the replay leaves smaller ones out too
    renumber = {i: k for k, i in enumerate(large)}
    sizes = [int(layer[i][0]) for i in large]
    until = [None if layer[i][1] is None else next((renumber[j] for j in large if j >= layer[i][1]), len(large))
             for i in large]
    starts = []
    for k in range(len(got_sizes) - len(sizes) + 1):
        if got_sizes[k:k + len(sizes)] != sizes:
            continue
        rel = [None if u is None or u - k >= len(sizes) else u - k for u in got_until[k:k + len(sizes)]]
        same = rel == [None if u is not None and u >= len(sizes) else u for u in until]
        assert same or not strict, (trace, k)
        if same:
            starts.append(k)
    return starts


def test_frozen_front_layers_are_the_traces_own_sequence_with_the_key_value_cache_without_checkpointing():
    """Freeze tuning's frozen layers before the first trainable one (``memory.gpu.front_layer``): call 3's traces,
    Llama 3.1 8B and Qwen2 7B shapes. With checkpointing they run as its first forward does (the template it was read
    off, as every layer's first forward is there); without it the probe's forward keeps transformers' key/value cache
    (``PlanInputs.kv_cache``): two kv-sized copies per frozen layer after the key's rotary embedding, released together
    right after the loss's bf16 logits (once its two fp32 copies are made), once per frozen layer and step. l8_f2's and
    q7_f2's traces were recorded after their held-out rows were measured, and shaped this test."""
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(BENCH / "settings"))
    import json

    from rows import step_tensors
    from specs import inputs_of

    from zeropilot.memory.gpu import front_layer
    from zeropilot.memory.tuning import first_saving_layer

    data = BENCH / "settings" / "data"
    specs = [json.loads(x) for x in (data / "call3" / "specs.jsonl").read_text().splitlines() if x]
    specs += [json.loads(x)["spec"] for x in (data / "call3_trace" / "h200.jsonl").read_text().splitlines() if x]
    traced = {s["trace"]: s for s in specs if s.get("trace") and s.get("freeze")}
    assert sorted(traced) == ["call3_l8_f2", "call3_l8_f4", "call3_l8_f4_gc", "call3_l8_f8", "call3_l8_f8_gc",
                              "call3_q7_f2"]
    for trace, spec in traced.items():
        inputs = inputs_of(spec)
        a, tokens = inputs.arch, inputs.micro_batch * inputs.seq_len
        layer = front_layer(inputs)
        copies = [k for k, (_, until) in enumerate(layer[:-1]) if until is None]
        assert len(copies) == (0 if spec.get("gc") else 2), trace
        got_sizes, got_until = step_tensors(trace)
        logits = [k for k in range(len(got_sizes) - 2) if got_sizes[k] == 2 * tokens * a.vocab
                  and got_sizes[k + 1] == got_sizes[k + 2] == 4 * tokens * a.vocab]  # each step's forward loss
        # without checkpointing a trained layer (LAYER_TEMPLATES) takes the same sizes and keeps more; with it every
        # layer's first forward is this one
        starts = _occurrences(layer, got_sizes, got_until, trace, strict=False)
        runs = a.layers if spec.get("gc") else first_saving_layer(inputs)
        per_step = [sum(1 for k in starts if start < k < end) for start, end in zip([-1] + logits, logits)]
        # the first step's first layer may take one-off tensors among its own (Qwen2's: a 1 MiB one, kept)
        assert per_step[1:] == [runs] * (len(logits) - 1) and per_step[0] >= runs - 1, (trace, per_step)
        for k in starts:
            loss = next(i for i in logits if i > k)
            assert all(got_until[k + i] == loss + 3 for i in copies), trace  # released after the logits go


def test_zero1_and_zero2_and_the_split_of_tokens_reserve_alike_at_world_size_1():
    """Measured on H200s: at world size 1, ZeRO-1 and ZeRO-2 runs of one model and the same tokens per micro-batch
    (micro batch x sequence, SDPA) reserve the same memory, however the tokens are split, to 0.05 GiB (11 groups of
    committed rows; both stages reduce through the buckets into one flat gradient partition in DeepSpeed 0.19.8).
    The plan must give such runs one figure too. Models with sliding-window layers (Gemma 2 and 3) are left out:
    their attention depends on the sequence itself; at 4096 tokens sequence 4096 reserved 2.0 GiB more than 2 x 2048
    for Gemma-2-2B (call 17) and 0.37 GiB more for Gemma-3-1B (calls 10 and 19)."""
    from collections import defaultdict

    sys.path.insert(0, str(BENCH))
    from rows import load_rows

    from zeropilot.memory.gpu import estimate_gpu

    groups = defaultdict(list)
    for r in load_rows():
        i = r.inputs
        if (r.measured_bytes and not r.cap_gib and i.stage in (1, 2) and i.world_size == 1 and i.attn == "sdpa"
                and i.arch.norms_per_layer == 2 and not i.overlap and not i.expandable_segments
                and not r.raw["spec"].get("save")):
            key = (r.raw["spec"]["name"], i.micro_batch * i.seq_len, i.gradient_checkpointing, i.lora_rank,
                   i.offload_optimizer)
            groups[key].append((r.label, r.measured_bytes, estimate_gpu(i).peak_bytes))
    alike = [g for g in groups.values() if len({label for label, _, _ in g}) > 1]
    assert len(alike) >= 11
    stages_mixed = 0
    for g in alike:
        measured = [m for _, m, _ in g]
        assert max(measured) - min(measured) <= 0.05 * 2**30, g
        assert len({p for _, _, p in g}) == 1, g
        stages_mixed += len({" z1 " in label for label, _, _ in g}) > 1
    assert stages_mixed >= 4


def test_host_memory_of_the_offload_runs_against_their_peak_rss():
    """The host estimate (memory/host.py, buffer by buffer as calls 29-31 logged them) against the probe's peak RSS on
    every committed offload run: within 1% at the median and 2% (or 0.25 GiB) on every full fine-tuning run but ZeRO-3
    parameter offload built in zero.Init; never more than 4% under; LoRA rows, whose offloaded state is tiny, up to 11%
    over (the process's own 2.1-2.3 GiB). In zero.Init with parameter offload, models with tied embeddings hold one more
    pinned block of the embedding's partition, rounded up to a power of two (the output layer's, partitioned before
    transformers ties it; found on calls 32, 33 and 46's rows, so fitted there; call 50's two tied zero.Init rows,
    measured after, within 1.9%): before it, 2.7-3.9% under on call 32's tied full fine-tunings and 8.5-17.2% under on
    LoRA with both offloads (Gemma-2-2B 2.2 GiB). Before call 30 the per-element constant missed by -18% to +12%, and
    ZeRO-3 parameter offload with the optimizer on the GPU by -55%."""
    import statistics

    sys.path.insert(0, str(BENCH))
    from accuracy import _host_records
    from rows import load_rows

    recs = _host_records(load_rows())
    errors = [x["error_pct"] for x in recs]
    assert len(recs) >= 50
    assert statistics.median(abs(e) for e in errors) <= 1.0
    assert min(errors) >= -4.0 and max(errors) <= 11.0
    built_whole = [r for r in load_rows() if not (r.inputs.zero_init and r.inputs.offload_param != "none")]
    # within 2%, or 0.25 GiB where the offloaded state is small beside the process's own 2.1-2.3 GiB (Qwen2.5-0.5B at
    # world size 2, call 42: +2.6%, 8.9 GiB predicted for 8.7)
    assert all(abs(x["predicted_gib"] - x["measured_rss_gib"]) <= max(0.02 * x["measured_rss_gib"], 0.25)
               for x in _host_records(built_whole) if "lora" not in x["config"])


def test_host_memory_of_the_logged_runs():
    """Calls 29-31's runs (bench/plan/data/host/call*_probe_*.json: the probe's result line, one GPU), whose logs
    (call*_host_*.log beside them) the host formulas were read from: ZeRO-3 parameter offload with the optimizer on
    the GPU, optimizer offload at ZeRO-2 and ZeRO-3, with torch's AdamW and with DeepSpeed's CPUAdam (9.2 and 7.4 GiB
    less at the peak). Each within 3%."""
    import json

    sys.path.insert(0, str(BENCH))
    from rows import spec_inputs

    from zeropilot.memory.plan import make_plan

    seen = {}
    for path in sorted((BENCH / "data" / "host").glob("call*_probe_*.json")):
        line = [x for x in path.read_text().splitlines() if x.startswith("RESULT ")][-1]
        r = json.loads(line[len("RESULT "):])
        predicted = make_plan(spec_inputs(r["spec"], 139.8)).host.per_process_bytes / 2**30
        assert abs(predicted / r["host_peak_rss_gb"] - 1) <= 0.03, (path, predicted, r["host_peak_rss_gb"])
        seen[(r["spec"]["name"], r["spec"]["stage"], bool(r["spec"].get("zero_init")), bool(r["spec"].get("offload")),
              bool(r["spec"].get("cpu_adam")))] = r["host_peak_rss_gb"]
    assert len(seen) == 9
    assert seen[("llama-3.2-1b", 2, False, True, False)] - seen[("llama-3.2-1b", 2, False, True, True)] > 9.0
