"""The caching-allocator model behind the ZeRO-1/2 replay (memory/segments.py)."""

from zeropilot.memory.segments import MIB, Allocator, ExpandableAllocator, _Window


def test_best_fit_split_and_merge_and_reserved_never_shrinks():
    pool = Allocator()
    a = pool.alloc(100 * MIB)
    b = pool.alloc(60 * MIB)
    assert pool.reserved == 160 * MIB  # each request its own segment, rounded to 2 MiB
    pool.free(a)
    pool.free(b)
    c = pool.alloc(50 * MIB)  # best fit: the 60 MiB block, split, not the 100 MiB one
    d = pool.alloc(90 * MIB)
    assert pool.reserved == 160 * MIB
    pool.free(c)
    pool.free(d)
    pool.alloc(110 * MIB)  # free 100 + 60 in two segments: blocks never span segments
    assert pool.reserved == 270 * MIB
    pool.free(pool.alloc(5 * MIB))  # under 10 MiB: a 20 MiB segment unless a free block fits
    assert pool.reserved == 270 * MIB
    assert pool.alloc(MIB // 2) is None  # the small pool is left out


def test_expandable_segments_map_only_the_pages_a_request_lacks_beyond_the_free_end():
    """``expandable_segments:True``: one address range, 20 MiB pages mapped as needed (call 1's trace
    ``call1_q3_freeze_z2_exp`` opens with these very requests: 593.5 MiB maps 600, 8 MiB maps 20 more, the next 8 MiB
    none, 43 MiB maps 40); a free block inside the range is used before the free end; ``empty_cache`` unmaps the whole
    pages of free blocks, and a later request maps that hole again when it fits there."""
    pool = ExpandableAllocator()
    head = pool.alloc(593.5 * MIB)
    assert pool.reserved == 600 * MIB
    small = [pool.alloc(8 * MIB), pool.alloc(8 * MIB)]
    assert pool.reserved == 620 * MIB
    pool.alloc(43 * MIB)  # 10.5 MiB free at the end: 32.5 MiB lacking, two pages
    assert pool.reserved == 660 * MIB
    assert pool.alloc(MIB) is None  # the small pool is left out
    pool.free(small[0])
    pool.alloc(7 * MIB)  # the freed 8 MiB block, not the 7.5 MiB free end, which could grow
    assert pool.reserved == 660 * MIB and pool._free == [(MIB, int(600.5 * MIB)), (int(7.5 * MIB), int(652.5 * MIB))]
    pool.free(head)
    pool.empty_cache()  # the 29 whole pages inside the freed 593.5 MiB go back; the blocks' other free ends hold none
    assert pool.reserved == 80 * MIB
    pool.alloc(590 * MIB)  # the hole (580 MiB) with the free 13.5 MiB after it: mapped again, 29 pages
    assert pool.reserved == 660 * MIB
    pool.alloc(100 * MIB)  # nothing free fits: the end grows by what it lacks
    assert pool.reserved == 760 * MIB


def test_the_gathered_window_keeps_its_budget_and_never_releases_the_layer_it_gathers():
    """ZeRO-3's prefetched parameters (``_Window``, from the second step on): a layer's parameters are gathered after
    releasing the longest-gathered ones beyond the budget, never its own; a parameter already gathered is not taken
    again; the step's end releases everything."""
    pool = Allocator()
    window = _Window(pool, budget=100 * MIB)
    window.fetch(0, [40 * MIB, 40 * MIB])
    window.fetch(1, [40 * MIB])  # over budget: layer 0's first parameter goes first
    assert [k for k in window.live] == [(0, 1), (1, 0)] and window.held == 80 * MIB
    assert pool.reserved == 80 * MIB  # released first, so layer 1's parameter took the released block
    window.fetch(1, [40 * MIB])  # already gathered
    assert window.held == 80 * MIB and pool.reserved == 80 * MIB
    window.fetch(2, [60 * MIB, 60 * MIB])  # its own first parameter stays while the second is gathered
    assert list(window.live) == [(2, 0), (2, 1)] and window.held == 120 * MIB and pool.reserved == 200 * MIB
    window.release_all()
    assert not window.live and window.held == 0
    for _ in range(2):  # both blocks free again: no new segment
        pool.alloc(60 * MIB)
    assert pool.reserved == 200 * MIB


def test_a_split_block_merges_back_with_its_free_neighbours():
    pool = Allocator()
    whole = pool.alloc(64 * MIB)
    pool.free(whole)
    parts = [pool.alloc(16 * MIB) for _ in range(4)]
    assert pool.reserved == 64 * MIB
    for p in (parts[1], parts[3], parts[2], parts[0]):
        pool.free(p)
    pool.alloc(64 * MIB)  # the four pieces merged back into one block
    assert pool.reserved == 64 * MIB


def test_the_model_allocator_reproduces_the_h200_traces_from_their_own_requests():
    """Replaying each committed H200 trace's own requests (alloc, free, and ``empty_cache`` where the trace gave
    segments back) through the model gives the segments the real caching allocator reserved: ZeRO-1, 2 and 3, LoRA,
    offload, world size 1 and 2 (bench/plan/data/traces, made by bench/plan/run_specs.sh on the specs of the rows of
    bench/plan/data/rows.jsonl that carry ``trace``).
    """
    import gzip
    import json
    from pathlib import Path

    traces = Path(__file__).resolve().parents[2] / "bench" / "plan" / "data" / "traces"
    # overlap_comm reduces on a side stream, whose blocks the real allocator keeps in a pool of their own: the model
    # has one pool and lands 2.9 GiB under that trace, so it is left out (docs/plan.md)
    paths = [p for p in sorted(traces.glob("*.json.gz")) if "overlap" not in p.name and "streams" not in p.name]
    assert len(paths) >= 53
    for path in paths:
        with gzip.open(path, "rt") as f:
            events = json.load(f)
        pool, live, real, last = Allocator(), {}, 0, None
        for action, addr, size, *_ in events:
            if action == "segment_alloc":
                real += size
            elif action == "segment_free":
                real -= size
                if last != "segment_free":
                    pool.empty_cache()
            elif action == "alloc":
                live[addr] = pool.alloc(size)
            elif action == "free_completed":
                pool.free(live.pop(addr, None))
            last = action
        # the model leaves out requests under 1 MiB (PyTorch's small pool): at most a few hundred MiB. Two exceptions:
        # Gemma-2-2B LoRA with both offloads in zero.Init (calls 34 and 35, not understood), where the model needs
        # one more 1000 MiB segment for the second step's fp32 logits than the real allocator (+0.9 GiB; those runs
        # copy parameters on a side stream, whose blocks the trace does not tell apart), and Mistral-1B-shape in
        # zero.Init (call 39): +0.19 GiB, one 250 MiB request the real allocator served from a cached block that the
        # model had already split
        known = {"gemma-2-2b_z3_mb1_s1024_lora16_offload_offload_param_zinit": 0.95,
                 "mistral-1b-shape_z3_mb2_s1024_zinit_ws1": 0.2}
        high = next((v for k, v in known.items() if path.name.startswith(k)), 0.05)
        assert -0.2 * 2**30 <= pool.reserved - real <= high * 2**30, (path.name, pool.reserved / 2**30, real / 2**30)


def _inputs(**kw):
    from zeropilot.memory import PlanInputs
    from zeropilot.models import CATALOGUE, from_config

    base = dict(arch=from_config(CATALOGUE["qwen2.5-1.5b"], "qwen2.5-1.5b"), hardware=None, stage=2, micro_batch=2,
                seq_len=1024)
    base.update(kw)
    return PlanInputs(**base)


def test_the_llama_layer_template_keeps_what_the_activation_estimate_counts_per_token():
    """One fact in two places: the replay's llama-style layer (memory/gpu.py LAYER_TEMPLATES, read off an H200
    trace) keeps per token exactly the activation estimate's units (act_h, act_q, act_kv, act_i)."""
    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.gpu import layer_tensors

    inputs = _inputs()
    a, t = inputs.arch, inputs.micro_batch * inputs.seq_len
    kept = sum(size for size, until in layer_tensors(inputs) if until is None)
    units = (DEFAULT.act_h * a.hidden + DEFAULT.act_q * a.heads * a.head_dim + DEFAULT.act_kv * a.kv_heads * a.head_dim
             + DEFAULT.act_i * a.intermediate)
    assert kept == units * t


def test_lora_releases_what_frozen_norms_would_keep_for_their_weights():
    from zeropilot.memory.gpu import final_norm, layer_tensors

    full, lora = _inputs(), _inputs(lora_rank=16)
    kept = lambda ops: sum(size for size, until in ops if until is None)  # noqa: E731
    t, h = full.micro_batch * full.seq_len, full.arch.hidden
    adapters = 7 * 2 * t * 16  # lora_A's output on each of the 7 linear layers, kept for lora_B's gradient
    assert kept(layer_tensors(full)) - kept(layer_tensors(lora)) == 2 * (2 * t * h) - adapters  # a bf16 copy per norm
    assert kept(final_norm(full)) - kept(final_norm(lora)) == 2 * t * h


def test_a_ceiling_stops_the_pool_at_the_segment_that_passes_it():
    from zeropilot.memory.segments import Exceeded

    pool = Allocator()
    pool.ceiling = 150 * MIB
    pool.free(pool.alloc(100 * MIB))
    pool.alloc(60 * MIB)  # in the cached block: nothing new reserved
    pool.alloc(50 * MIB)  # a new segment: 150 MiB, at the ceiling, not past it
    assert pool.reserved == 150 * MIB
    pool.alloc(40 * MIB)  # the cached block's rest
    try:
        pool.alloc(MIB)  # a 20 MiB segment
    except Exceeded as exc:
        assert pool.reserved == 170 * MIB and exc.args == (170 * MIB,)
    else:
        raise AssertionError("a segment past the ceiling was taken")


def test_the_8bit_optimizer_replays_its_own_first_step_tensors():
    """bitsandbytes' 8-bit AdamW goes through the ZeRO-1/2 replay with its own first-step tensors (two one-byte
    states and their fp32 absmax, no foreach temporary): it reserves less than AdamW, by less than AdamW's states
    are larger, and the plan says it replayed."""
    from zeropilot.memory.gpu import estimate_gpu
    from zeropilot.memory.inputs import GIB, PlanInputs
    from zeropilot.models import from_config

    arch = from_config(dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                            tie_word_embeddings=False), "llama")
    plain, eight = (estimate_gpu(PlanInputs(arch, stage=2, micro_batch=2, seq_len=1024, gradient_checkpointing=True,
                                            optimizer=opt)) for opt in ("adamw", "adamw_8bit"))
    gap = {e: next(c for c in e.components if c.name == "allocator_overhead") for e in (plain, eight)}
    assert all("replaying" in g.reason for g in gap.values())
    states = {e: next(c.bytes for c in e.components if c.name == "optimizer_states") for e in (plain, eight)}
    saved = plain.reserved_peak_bytes - eight.reserved_peak_bytes
    assert 0 < saved < states[plain] - states[eight]
    assert eight.reserved_peak_bytes >= eight.allocated_peak_bytes + 1 * GIB  # the replay's fragmentation shows


def test_frozen_layers_before_the_first_trainable_one_keep_nothing_for_the_backward():
    """Freeze tuning's frozen front layers run without autograd: with more of them frozen the forward keeps less, so
    the replay reserves less; with none frozen it is the plain replay."""
    from zeropilot.memory.gpu import layer_tensors
    from zeropilot.memory.segments import zero12_reserved

    inputs = _inputs()
    layer, front = layer_tensors(inputs), layer_tensors(_inputs(gradient_checkpointing=True), no_grad=True)
    t, h = inputs.micro_batch * inputs.seq_len, inputs.arch.hidden
    base = dict(build=[], frozen=[], trainable=0, world_size=1, gpu_optimizer=True, layer=layer, layers=8,
                checkpointed=False, edges=(2.0 * t * h, ()), logits_bf16=0.0, logits_fp32=0.0, output_grad=0.0,
                buckets=[], front_layer=front)
    reserved = [zero12_reserved(**base, frozen_layers=k) for k in (0, 4, 6)]
    assert reserved[0] == zero12_reserved(**{k: v for k, v in base.items() if k != "front_layer"})
    assert reserved[0] > reserved[1] > reserved[2]
