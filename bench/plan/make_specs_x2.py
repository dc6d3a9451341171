"""Write the probe specs of the second plan pass (issue 14): ``bench/plan/specs/call3_x2.jsonl``.

Rows at world size 1 and 2 on a 2 x H200 machine: ZeRO-3 built inside ``deepspeed.zero.Init`` and
without it (a raw script: the whole bf16 model on the GPU before ``deepspeed.initialize``), full
fine-tuning of 7-8B models at ZeRO-3 (``sub_group_size`` default and smaller), optimizer and parameter
offload, ``stage3_max_live_parameters``, and 16 GiB-capped pairs. Every spec names its split
(``fit`` or ``holdout``) BEFORE it is measured: at least a third are held out of any fitting.
HF ``"auto"`` bucket values (LLaMA-Factory's ds_z3 config) are written out: rbs h², pbs 0.9·h², ppt 10·h.
Usage: python bench/plan/make_specs_x2.py [--call5 | --call8 | --call9 | --call12 | --call14 | --call16 | --call18 | --call19]   (later passes' rows, specs/callN_x2.jsonl)
"""
from __future__ import annotations

import json

from make_specs import HERE, MODELS

AUTO = "auto"


def spec(name, stage, mb, seq, ws, split, **kw):
    s = {"name": name, "model": MODELS[name], "stage": stage, "mb": mb, "seq": seq, "ws": ws, "split": split}
    if kw.pop("auto", False):
        h = MODELS[name]["hidden_size"]
        s.update(rbs=h * h, pbs=int(0.9 * h * h), ppt=10 * h)
    s.update(kw)
    return s


ROWS = [
    # the seed's shape (Qwen2-7B LoRA r16, mb1, cutoff 1024, HF auto buckets) with and without zero.Init
    spec("qwen2.5-7b", 3, 1, 1024, 2, "fit", gc=True, lora=16, zero_init=True, auto=True),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "holdout", gc=True, lora=16, zero_init=False, auto=True),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "fit", gc=True, lora=16, zero_init=True, auto=True, mlp=int(1e8)),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "fit", gc=True, lora=16, zero_init=True, auto=True, cap_gib=16),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "holdout", gc=True, lora=16, zero_init=False, auto=True, cap_gib=16),
    spec("llama-3.1-8b", 3, 2, 2048, 2, "holdout", gc=True, lora=16, zero_init=True),
    spec("llama-3.1-8b", 3, 2, 2048, 2, "fit", gc=True, lora=16, zero_init=False),
    # 7-8B full fine-tuning at ZeRO-3 (sub-groups): the biggest first, for packing
    spec("qwen2.5-7b", 3, 1, 1024, 2, "fit", gc=True, zero_init=True),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "holdout", gc=True, zero_init=True, sgs=int(2e8)),
    spec("llama-3.1-8b", 3, 1, 2048, 2, "holdout", gc=True, zero_init=True),
    spec("mistral-7b", 3, 2, 1024, 2, "fit", gc=True, zero_init=False),
    # offload (optimizer; optimizer + parameters)
    spec("qwen2.5-7b", 3, 1, 1024, 1, "fit", gc=True, lora=16, zero_init=True, auto=True, offload=True,
         offload_param=True),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "holdout", gc=True, lora=16, zero_init=True, auto=True, offload=True,
         offload_param=True),
    spec("qwen2.5-3b", 3, 2, 1024, 2, "fit", gc=True, zero_init=True, offload=True),
    spec("llama-3.2-3b", 3, 1, 2048, 1, "holdout", gc=True, zero_init=True, offload=True, offload_param=True),
    spec("qwen2.5-1.5b", 3, 4, 1024, 2, "fit", zero_init=True, offload=True, offload_param=True),
    spec("llama-3.1-8b", 3, 2, 1024, 2, "fit", gc=True, lora=16, zero_init=True, offload=True, offload_param=True),
    # ZeRO-3 at world size 2, no checkpointing at larger micro batches (the worst under-predictions)
    spec("qwen2.5-3b", 3, 4, 1024, 2, "fit", zero_init=True),
    spec("qwen2.5-3b", 3, 4, 1024, 2, "holdout", zero_init=False),
    spec("qwen2.5-1.5b", 3, 8, 1024, 2, "fit", zero_init=True),
    spec("llama-3.2-3b", 3, 2, 2048, 2, "holdout", gc=True, zero_init=True),
    spec("llama-3.2-1b", 3, 4, 2048, 2, "fit", zero_init=True, lora=16),
    # world size 1 with zero.Init; ZeRO-2 at world size 2
    spec("llama-3.2-3b", 3, 2, 1024, 1, "holdout", zero_init=True),
    spec("qwen2.5-1.5b", 2, 2, 1024, 2, "fit", gc=True),
    spec("llama-3.1-8b", 2, 1, 2048, 2, "holdout", gc=True, lora=16),
    # one whole GPU: last, so it cannot hold back the world-size-2 rows
    spec("qwen2.5-7b", 3, 1, 1024, 1, "fit", gc=True, zero_init=True),
]


# Call 5 (third pass): ZeRO-3 built whole (no zero.Init) with offload_param, the case the build-cache term
# (memory/gpu.py ``_build_cache``) was written for after one such row (qwen2.5-3b, below as "repeat") was
# under-predicted. Every new row is held out; their predictions are written into the spec before the run.
CALL5 = [
    spec("llama-3.2-3b", 3, 1, 2048, 1, "holdout", gc=True, zero_init=False, offload=True, offload_param=True),
    spec("mistral-7b", 3, 1, 2048, 1, "holdout", gc=True, lora=16, zero_init=False, offload=True, offload_param=True),
    spec("qwen2.5-7b", 3, 1, 1024, 2, "holdout", gc=True, lora=16, zero_init=False, auto=True, offload=True,
         offload_param=True),
    spec("qwen2.5-1.5b", 3, 4, 1024, 2, "holdout", zero_init=False, offload=True, offload_param=True),
    spec("qwen2.5-3b", 3, 2, 1024, 2, "holdout", gc=True, zero_init=False, offload_param=True),
    spec("qwen2.5-3b", 3, 1, 2048, 1, "repeat", gc=True, zero_init=False, offload=True, offload_param=True),
    # the older rows most wrong (under- or over-predicted by more than 11%), measured again to see whether the
    # first measurement repeats: "repeat", never fitted
    spec("qwen3-1.7b", 2, 4, 1024, 1, "repeat"),
    spec("mistral-1b-shape", 1, 4, 1024, 1, "repeat"),
    spec("mistral-1b-shape", 2, 2, 2048, 1, "repeat", gc=True, offload=True),
    spec("gemma-3-1b", 2, 4, 1024, 1, "repeat", gc=True),
]


# Call 8 (fourth pass): rows never measured before, held out, their predictions written into the spec before
# the run, after the ZeRO-1/2 segment floor (memory/gpu.py ``zero12_segments``) and the ZeRO-1/2 offload
# gradient fix were made from call 7's allocator traces. Mostly ZeRO-1/2 (what changed), world size 1 and 2,
# with and without checkpointing and offload, plus ZeRO-3 rows the change does not touch.
CALL8 = [
    spec("qwen3-4b", 2, 2, 1024, 1, "holdout"),
    spec("llama-3.2-1b", 2, 4, 1024, 1, "holdout"),
    spec("gemma-2-2b", 1, 2, 1024, 1, "holdout"),
    spec("phi-3-mini", 2, 1, 2048, 1, "holdout", gc=True),
    spec("qwen2.5-0.5b", 2, 8, 1024, 1, "holdout", gc=True),
    spec("mistral-1b-shape", 2, 4, 2048, 1, "holdout", gc=True),
    spec("qwen3-1.7b", 1, 2, 2048, 1, "holdout", gc=True),
    spec("qwen2.5-1.5b", 2, 2, 2048, 1, "holdout", gc=True, offload=True),
    spec("llama-3.2-3b", 2, 1, 2048, 1, "holdout", gc=True, offload=True),
    spec("gemma-3-1b", 2, 2, 2048, 1, "holdout"),
    spec("gemma-2-2b", 2, 2, 2048, 1, "holdout", lora=16),
    spec("qwen2.5-1.5b", 2, 4, 1024, 2, "holdout"),
    spec("llama-3.2-1b", 1, 2, 2048, 2, "holdout", gc=True),
    spec("qwen3-1.7b", 3, 2, 2048, 2, "holdout", gc=True, zero_init=True),
    spec("qwen2.5-1.5b", 3, 2, 1024, 1, "holdout", lora=16, zero_init=False),
    spec("llama-3.2-1b", 3, 4, 1024, 2, "holdout", zero_init=False),
]


# Call 9 (fifth pass): new held-out rows after the ZeRO-1/2 allocator replay (memory/segments.py), which was
# built from call 7's traces and corrected on call 8's rows; predictions written into the spec before the run.
CALL9 = [
    spec("qwen2.5-3b", 2, 1, 2048, 1, "holdout"),
    spec("llama-3.2-3b", 1, 1, 1024, 1, "holdout", gc=True),
    spec("gemma-2-2b", 2, 1, 2048, 1, "holdout", gc=True, offload=True),
    spec("qwen3-1.7b", 2, 4, 2048, 1, "holdout", gc=True, offload=True),
    spec("phi-3-mini", 2, 2, 1024, 1, "holdout", gc=True, lora=16),
    spec("qwen2.5-7b", 2, 1, 2048, 1, "holdout", gc=True, lora=8),
    spec("gemma-3-1b", 1, 1, 4096, 1, "holdout", gc=True),
    spec("mistral-1b-shape", 2, 8, 1024, 1, "holdout", gc=True),
    spec("qwen2.5-0.5b", 1, 4, 4096, 1, "holdout"),
    spec("llama-3.2-3b", 2, 2, 1024, 1, "holdout", lora=32),
    spec("qwen3-4b", 2, 1, 2048, 1, "holdout", gc=True, offload=True),
    spec("llama-3.2-1b", 2, 2, 2048, 2, "holdout"),
    spec("qwen3-1.7b", 2, 2, 1024, 2, "holdout", gc=True),
    spec("qwen2.5-3b", 3, 2, 2048, 2, "holdout", gc=True, zero_init=True),
    spec("gemma-2-2b", 3, 1, 2048, 2, "holdout", zero_init=True),
    spec("llama-3.1-8b", 3, 1, 2048, 2, "holdout", gc=True, lora=16, zero_init=False),
]


# Call 12 (fifth pass): new held-out rows to choose between two versions of the ZeRO-1/2 replay, both predictions
# written before the run: pred_gib (the replay as call 9 tested it) and pred_gib_v5 (with the two cuBLAS
# workspaces and DeepSpeed's offload gradient buffer, which every trace shows).
CALL12 = [
    spec("qwen2.5-1.5b", 2, 4, 2048, 1, "holdout", gc=True, offload=True),
    spec("llama-3.2-1b", 2, 4, 2048, 1, "holdout", gc=True, offload=True),
    spec("gemma-2-2b", 2, 2, 1024, 1, "holdout", gc=True, offload=True),
    spec("qwen3-4b", 2, 2, 2048, 1, "holdout", gc=True, offload=True),
    spec("phi-3-mini", 2, 2, 2048, 1, "holdout", gc=True, offload=True),
    spec("gemma-3-1b", 2, 1, 2048, 1, "holdout"),
    spec("qwen2.5-0.5b", 2, 4, 1024, 1, "holdout"),
    spec("llama-3.2-1b", 1, 2, 1024, 1, "holdout"),
    spec("mistral-1b-shape", 2, 2, 1024, 1, "holdout"),
    spec("qwen3-1.7b", 2, 1, 2048, 1, "holdout", lora=16),
    spec("llama-3.2-3b", 2, 1, 4096, 1, "holdout", gc=True, lora=32),
    spec("qwen2.5-3b", 2, 2, 1024, 1, "holdout", lora=16),
    spec("gemma-2-2b", 2, 1, 1024, 1, "holdout", gc=True),
    spec("qwen2.5-1.5b", 1, 2, 1024, 1, "holdout", gc=True),
    spec("qwen3-1.7b", 2, 4, 1024, 2, "holdout", gc=True, offload=True),
    spec("llama-3.2-3b", 2, 2, 2048, 2, "holdout", gc=True),
]



# Call 14 (sixth pass): new held-out rows after the replay learnt the traces' request sequence (each layer's tensors at
# their real shapes, checkpointing's transient ones, the cuBLAS workspaces, the offload buffer, soft-capping, the
# embedding's gradient, the fp64 norm copies). pred_gib: that candidate (commit 4130fff); pred_gib_prev: the plan
# at 4c17d7d (call 12's), computed with that commit's memory/gpu.py. Rule fixed before the run: the plan keeps the
# candidate if, on these rows, neither its max abs error nor its worst under-prediction is worse than pred_gib_prev's.
# It was worse on both (16.5% against 10.8%), so the plan kept 4c17d7d's replay; the candidate is
# bench/plan/segments_v6_candidate.patch. Rerunning --call14 now writes today's plan into pred_gib.
CALL14 = [
    spec("gemma-2-2b", 2, 2, 2048, 1, "holdout", gc=True, offload=True),
    spec("qwen2.5-3b", 2, 2, 2048, 1, "holdout", gc=True, offload=True),
    spec("llama-3.2-1b", 2, 8, 1024, 1, "holdout", gc=True, offload=True),
    spec("qwen3-1.7b", 2, 2, 4096, 1, "holdout", gc=True, offload=True),
    spec("gemma-3-1b", 2, 4, 2048, 1, "holdout"),
    spec("gemma-3-1b", 1, 2, 1024, 1, "holdout"),
    spec("llama-3.2-1b", 1, 4, 1024, 1, "holdout"),
    spec("qwen3-1.7b", 2, 2, 2048, 1, "holdout"),
    spec("qwen2.5-1.5b", 2, 2, 2048, 1, "holdout"),
    spec("mistral-1b-shape", 2, 4, 1024, 1, "holdout"),
    spec("qwen3-1.7b", 2, 2, 1024, 1, "holdout", lora=16),
    spec("llama-3.2-3b", 2, 1, 2048, 1, "holdout", lora=16),
    spec("qwen2.5-0.5b", 1, 8, 2048, 1, "holdout"),
    spec("gemma-2-2b", 2, 1, 2048, 1, "holdout", gc=True, lora=16),
    spec("llama-3.2-1b", 2, 2, 2048, 2, "holdout", gc=True),
    spec("qwen2.5-1.5b", 2, 2, 2048, 2, "holdout"),
]


# Call 16 (seventh pass): new held-out rows after the replay learnt each layer's tensors from the allocator traces
# (LAYER_TEMPLATES in memory/gpu.py: llama-style, Qwen3, Gemma 2, Gemma 3, Phi-3; calls 13 and 15 traced the rows it
# missed). pred_gib: this plan (commit 726fe6e); pred_gib_prev: the plan at 1d0ae99, computed with that commit's
# memory/gpu.py and segments.py. Rule fixed before the run: the plan keeps the new replay if, on these rows, neither
# its max abs error nor its worst under-prediction is worse than pred_gib_prev's; otherwise it goes back. It was
# better on both (12.3% against 17.5%; median 0.2% against 1.8%): kept.
CALL16 = [
    spec("qwen2.5-7b", 2, 2, 2048, 1, "holdout", gc=True, lora=16),
    spec("llama-3.1-8b", 2, 1, 2048, 1, "holdout", gc=True, lora=16),
    spec("mistral-7b", 2, 1, 1024, 1, "holdout", lora=8),
    spec("qwen3-4b", 2, 1, 1024, 1, "holdout"),
    spec("phi-3-mini", 2, 2, 1024, 1, "holdout", lora=16),
    spec("gemma-2-2b", 2, 1, 4096, 1, "holdout"),
    spec("gemma-3-1b", 2, 4, 2048, 1, "holdout", gc=True),
    spec("llama-3.2-3b", 1, 2, 1024, 1, "holdout"),
    spec("qwen2.5-3b", 2, 4, 2048, 1, "holdout", gc=True, offload=True),
    spec("qwen2.5-0.5b", 2, 6, 1024, 1, "holdout"),
    spec("qwen3-1.7b", 2, 8, 1024, 1, "holdout", gc=True),
    spec("llama-3.2-1b", 2, 4, 1024, 1, "holdout", attn="eager"),
    spec("mistral-1b-shape", 2, 2, 2048, 1, "holdout", overlap=True),
    spec("qwen2.5-1.5b", 2, 4, 2048, 2, "holdout", gc=True),
    spec("llama-3.2-1b", 1, 4, 1024, 2, "holdout"),
    spec("gemma-2-2b", 2, 1, 4096, 1, "holdout", gc=True, offload=True),
]


# Call 18 (seventh pass, confirmation): more new held-out rows for the plan as call 16 left it (commit f6215c3 and
# later, no model change since), ZeRO-3 among them, and two runs capped at a 24 GiB card for the verdict.
CALL18 = [
    spec("gemma-2-2b", 2, 4, 2048, 1, "holdout", gc=True),
    spec("qwen2.5-7b", 2, 1, 1024, 1, "holdout", lora=16),
    spec("llama-3.2-3b", 2, 2, 2048, 2, "holdout", gc=True, offload=True),
    spec("phi-3-mini", 2, 2, 2048, 1, "holdout", gc=True),
    spec("qwen3-4b", 2, 2, 2048, 1, "holdout", gc=True, lora=32),
    spec("gemma-3-1b", 2, 1, 4096, 1, "holdout", lora=16),
    spec("mistral-1b-shape", 1, 2, 2048, 2, "holdout"),
    spec("qwen2.5-1.5b", 2, 4, 4096, 1, "holdout", gc=True, offload=True),
    spec("llama-3.2-1b", 2, 4, 2048, 1, "holdout", gc=True, lora=8),
    spec("qwen2.5-0.5b", 1, 2, 4096, 2, "holdout"),
    spec("qwen3-4b", 1, 1, 2048, 1, "holdout", gc=True),
    spec("llama-3.2-3b", 3, 2, 1024, 2, "holdout", gc=True, zero_init=True),
    spec("qwen2.5-3b", 3, 1, 2048, 2, "holdout", lora=16, zero_init=True),
    spec("qwen2.5-1.5b", 3, 2, 2048, 1, "holdout", zero_init=False),
    spec("qwen2.5-0.5b", 2, 2, 2048, 1, "holdout", cap_gib=24),
    spec("qwen3-1.7b", 2, 2, 2048, 1, "holdout", gc=True, offload=True, cap_gib=16),
]


# Call 19: new held-out rows after call 18's one miss (Gemma-3-1B LoRA, 22% over) led to LoRA's frozen norms: a
# tensor a norm keeps only for its weight's gradient is not kept when the weight is frozen (the W ops of
# LAYER_TEMPLATES). pred_gib: this plan; pred_gib_prev: the plan at f6215c3 (call 18's), computed with that commit's
# memory/gpu.py and segments.py. Rule fixed before the run: keep the change if, on these rows, neither max abs error
# nor worst under-prediction is worse than pred_gib_prev's; otherwise go back. Kept: max 15.7% against 23.7%, worst
# -0.8% both, median 1.9% against 2.0%.
CALL19 = [
    spec("gemma-3-1b", 2, 2, 2048, 1, "holdout", lora=16),
    spec("gemma-3-1b", 1, 1, 2048, 1, "holdout", gc=True, lora=32),
    spec("gemma-2-2b", 2, 1, 4096, 1, "holdout", lora=16),
    spec("qwen3-1.7b", 2, 2, 2048, 1, "holdout", lora=32),
    spec("qwen2.5-3b", 2, 1, 4096, 1, "holdout", gc=True, lora=16),
    spec("llama-3.2-3b", 1, 2, 2048, 1, "holdout", lora=8),
    spec("mistral-7b", 2, 2, 1024, 1, "holdout", gc=True, lora=16),
    spec("phi-3-mini", 2, 1, 4096, 1, "holdout", gc=True, lora=16),
    spec("qwen2.5-1.5b", 2, 4, 2048, 1, "holdout", lora=16),
    spec("llama-3.2-1b", 2, 2, 2048, 2, "holdout", lora=16),
    spec("qwen3-4b", 2, 1, 4096, 1, "holdout", gc=True, lora=16),
    spec("qwen2.5-0.5b", 2, 8, 1024, 1, "holdout", lora=8),
    spec("gemma-3-1b", 2, 1, 4096, 1, "holdout"),
    spec("llama-3.2-3b", 2, 2, 2048, 1, "holdout"),
    spec("qwen2.5-1.5b", 1, 2, 2048, 2, "holdout"),
    spec("gemma-2-2b", 2, 1, 1024, 1, "holdout"),
]


# Call 21 (eighth pass): new held-out rows after calls 17 and 20's traces changed the replay's layers: each layer
# begins at its input norm (Qwen3, Gemma 2/3 and Phi-3 began mid-layer, so the last layer before the loss was wrong),
# and with LoRA each linear layer's output is followed by lora_B's output, its scaled copy and their sum. Mostly rows
# without checkpointing, where the layers' holes decide the peak. pred_gib: this plan (commit 6f982ae); pred_gib_prev:
# the plan at 6a70b38, computed with that commit's memory/gpu.py and segments.py. Rule fixed before the run: keep the
# change if, on these rows, neither its max abs error nor its worst under-prediction is worse than pred_gib_prev's;
# otherwise go back. Gone back: max 15.1% against 15.6%, but worst -14.2% against -10.0% (phi-3-mini at world size 2
# without checkpointing; call 22 traced it). The change is bench/plan/layers_v8_candidate.patch.
CALL21 = [
    spec("qwen3-1.7b", 2, 3, 2048, 1, "holdout"),
    spec("qwen3-4b", 2, 2, 1024, 1, "holdout", lora=16),
    spec("gemma-2-2b", 2, 2, 1024, 1, "holdout", lora=8),
    spec("gemma-2-2b", 1, 1, 2048, 2, "holdout"),
    spec("gemma-3-1b", 2, 3, 2048, 1, "holdout", lora=8),
    spec("phi-3-mini", 2, 4, 2048, 2, "holdout"),
    spec("phi-3-mini", 2, 2, 2048, 1, "holdout", lora=16),
    spec("phi-3-mini", 2, 3, 1024, 2, "holdout"),
    spec("llama-3.2-1b", 2, 4, 1024, 1, "holdout", lora=32),
    spec("qwen2.5-1.5b", 2, 3, 1024, 2, "holdout", lora=8),
    spec("mistral-7b", 2, 1, 2048, 1, "holdout", lora=16),
    spec("qwen3-4b", 2, 3, 1024, 2, "holdout", lora=8),
    spec("qwen2.5-0.5b", 2, 4, 1024, 2, "holdout", lora=8),
    spec("qwen3-1.7b", 2, 3, 2048, 1, "holdout", gc=True, lora=16),
    spec("gemma-2-2b", 2, 2, 2048, 2, "holdout", gc=True, lora=16),
    spec("qwen2.5-1.5b", 2, 2, 1024, 1, "holdout", offload=True),
]


# Call 23 (eighth pass): ZeRO-1/2's reserved memory from the allocator replay alone (never below the allocated peak),
# no longer the larger of the replay and the fitted fragmentation gap: on every committed row where the two differ the
# replay was nearer (20 rows, none worse). The rows are ones where the two predictions differ most (large token counts,
# checkpointing, LoRA, offload), and two more ZeRO-3 raw builds with offload_param and the optimizer on the GPU (the
# kind the plan warns about; the change does not touch them). pred_gib: this plan; pred_gib_prev: the plan at 31c1f40
# without the change. Rule fixed before the run: keep the change if, on these rows, neither its max abs error nor its
# worst under-prediction is worse than pred_gib_prev's; otherwise go back. Gone back: max 14.3% against 20.4% and
# median 1.2% against 6.6%, but worst under-prediction -4.3% against 0.0% (the kept plan was under on none of them).
# The change is bench/plan/reserved_v9_candidate.patch. The first run measured one row and then waited on a spec that
# asked for more than run_x2's pool (fixed); call23_rest_x2.jsonl ran the others, without the two ZeRO-3 rows and the
# no-checkpointing Qwen2.5-0.5B row (device time).
CALL23 = [
    spec("llama-3.2-3b", 2, 8, 4096, 1, "holdout", gc=True),
    spec("qwen2.5-0.5b", 2, 4, 1024, 2, "holdout", gc=True),
    spec("qwen3-1.7b", 2, 8, 2048, 1, "holdout", gc=True),
    spec("qwen2.5-1.5b", 2, 8, 4096, 2, "holdout", gc=True),
    spec("gemma-3-1b", 2, 8, 2048, 2, "holdout", gc=True),
    spec("llama-3.2-1b", 1, 8, 1024, 2, "holdout", gc=True),
    spec("gemma-2-2b", 2, 8, 2048, 2, "holdout", gc=True, lora=16),
    spec("qwen2.5-0.5b", 2, 8, 4096, 1, "holdout", gc=True, lora=16),
    spec("llama-3.2-3b", 2, 8, 4096, 1, "holdout", gc=True, lora=16),
    spec("mistral-1b-shape", 2, 8, 4096, 1, "holdout", lora=16),
    spec("llama-3.1-8b", 2, 8, 1024, 1, "holdout", lora=16),
    spec("qwen2.5-3b", 2, 8, 1024, 1, "holdout", lora=16),
    spec("qwen2.5-1.5b", 2, 8, 4096, 2, "holdout", gc=True, lora=16, offload=True),
    spec("gemma-2-2b", 2, 8, 2048, 2, "holdout", gc=True, offload=True),
    spec("qwen2.5-0.5b", 2, 8, 2048, 2, "holdout"),
    spec("mistral-1b-shape", 3, 2, 2048, 2, "holdout", gc=True, offload_param=True, zero_init=False),
    spec("qwen2.5-3b", 3, 1, 2048, 2, "holdout", gc=True, offload_param=True, zero_init=False),
]


# Call 24 (eighth pass): the candidate call 23 turned down (reserved_v9_candidate.patch: ZeRO-1/2 reserved from the
# replay alone), tested again on new rows under a rule set after call 23 and stated here before the run: call 23's rule
# compared worst under-predictions with the kept plan's, which a change that can only lower predictions fails as soon as
# it is under on any row, however little. This rule takes the issue's own bound instead: adopt the candidate if, on
# these rows, its worst under-prediction is within -8% and its max abs error is not above the kept plan's; otherwise
# keep the plan. pred_gib: the kept plan (commit 2da6855); pred_gib_v9: with the patch applied. Adopted: worst
# under-prediction -2.4%, max 11.3% against the plan's 16.6% (median 1.8% against 5.9%).
CALL24 = [
    spec("llama-3.2-1b", 2, 8, 4096, 2, "holdout", gc=True),
    spec("qwen2.5-0.5b", 2, 8, 1024, 2, "holdout", gc=True),
    spec("qwen2.5-1.5b", 1, 8, 2048, 1, "holdout", gc=True),
    spec("gemma-2-2b", 2, 4, 4096, 2, "holdout", gc=True),
    spec("qwen2.5-0.5b", 1, 8, 2048, 1, "holdout", gc=True),
    spec("llama-3.2-1b", 2, 8, 2048, 1, "holdout", gc=True),
    spec("qwen3-1.7b", 2, 8, 4096, 2, "holdout", gc=True),
    spec("gemma-3-1b", 2, 8, 2048, 1, "holdout", gc=True, lora=16),
    spec("qwen2.5-1.5b", 2, 8, 4096, 1, "holdout", gc=True, lora=16),
    spec("qwen3-1.7b", 2, 8, 4096, 1, "holdout", gc=True, lora=16),
    spec("llama-3.2-3b", 2, 8, 2048, 1, "holdout", lora=16),
    spec("gemma-2-2b", 2, 8, 1024, 1, "holdout", lora=16),
    spec("mistral-7b", 2, 8, 1024, 1, "holdout", lora=16),
    spec("gemma-2-2b", 2, 8, 1024, 2, "holdout", lora=16, offload=True),
    spec("mistral-1b-shape", 2, 8, 4096, 2, "holdout", lora=16, offload=True),
    spec("qwen2.5-0.5b", 2, 8, 2048, 2, "holdout"),
]


# Call 25 (eighth pass): a candidate (bench/plan/replay_v10_candidate.patch): where ZeRO-1/2's allocator replay peaks
# below the fitted allocated peak, the plan takes the replay's (the fitted soft-capped logits of Gemma 2 over-count at
# large token counts: +10% to +14% on calls 21, 23 and 24, where the replay was within 2%). Rows where the two differ
# most, and three where they differ little. Rule, stated before the run (call 24's): adopt if, on these rows, the
# candidate's worst under-prediction is within -8% and its max abs error is not above the kept plan's; otherwise keep
# the plan. pred_gib: the kept plan (commit d748b79); pred_gib_v10: with the patch applied.
# Adopted: median 0.9%, max 3.7%, worst -1.8% against 11.4%, 14.0%, 0.0% (six rows: the Qwen3 one was left out by
# run_x2's budget).
CALL25 = [
    spec("gemma-2-2b", 2, 4, 4096, 1, "holdout", gc=True, lora=16),
    spec("gemma-2-2b", 1, 8, 1024, 2, "holdout", gc=True, lora=16),
    spec("gemma-2-2b", 2, 2, 4096, 1, "holdout", gc=True, lora=16, offload=True),
    spec("gemma-2-2b", 2, 2, 4096, 1, "holdout", lora=16, offload=True),
    spec("gemma-2-2b", 2, 1, 4096, 2, "holdout", gc=True, lora=16),
    spec("gemma-3-1b", 2, 4, 4096, 2, "holdout", gc=True),
    spec("qwen3-1.7b", 1, 8, 4096, 2, "holdout", gc=True),
]


# Call 26 (ninth pass): a candidate (bench/plan/layers_init_v11_candidate.patch) that is call 21's layer change
# (layers_v8_candidate.patch: each layer begins at its input norm; with LoRA each linear layer's output is followed by
# PEFT's lora_B output, its scaled copy and their sum) plus the order DeepSpeed builds the fp32 master in
# (stage_1_and_2.py clones this rank's 16-bit partition, 1/N of the flat buffer, and casts it; the replay took a second
# whole flat buffer). Call 22's world-size-2 traces show the 1/N clone; call 21's miss with v8 (phi-3-mini at world
# size 2, -14.2%) came from it. On the committed allocator traces the candidate ends within 2% of 26 of the 29 at world
# size 1 (the plan: 23), and at world size 2 at -0.0%, -0.0%, +1.0% and -14.4% (the plan: +10.7%, -3.6%, +0.8%, -0.7%).
# Rows: every ZeRO-1/2 configuration never measured whose two predictions stay under 90 GiB (5,482), drawn by
# bench/plan/select_call.py 26: four strata where the two differ by 2% or more, largest difference first, one row per
# model per stratum and at most two per model (world size 2 full fine-tuning with checkpointing; world size 2 with
# offload_optimizer; world size 1 LoRA without checkpointing; full fine-tuning without checkpointing), and three rows
# where they differ by under 2%; ties broken by a shuffle seeded 26. Rule, stated before the run (calls 24 and 25's):
# adopt if, on these rows, the candidate's worst under-prediction is within -8% and its max abs error is not above the
# kept plan's; otherwise keep the plan. pred_gib: the kept plan (commit c499297); pred_gib_v11: with the patch applied.
# One more row, not scored: Qwen2.5-0.5B at world size 2 with checkpointing (call 23's row, +16.5% with the
# candidate) measured again with the allocator's history recorded.
CALL26 = [
    spec("qwen2.5-0.5b", 2, 2, 2048, 2, "holdout", gc=True),
    spec("gemma-3-1b", 2, 8, 1024, 2, "holdout", gc=True),
    spec("qwen3-1.7b", 2, 4, 2048, 2, "holdout", gc=True),
    spec("mistral-1b-shape", 1, 8, 1024, 2, "holdout", gc=True),
    spec("phi-3-mini", 1, 4, 1024, 2, "holdout", gc=True, offload=True),
    spec("gemma-2-2b", 2, 1, 1024, 2, "holdout", gc=True, offload=True),
    spec("qwen2.5-0.5b", 1, 8, 1024, 2, "holdout", lora=16, offload=True),
    spec("gemma-3-1b", 1, 2, 2048, 1, "holdout", lora=8),
    spec("gemma-2-2b", 1, 4, 2048, 1, "holdout", lora=8),
    spec("llama-3.2-1b", 1, 2, 1024, 1, "holdout", lora=8),
    spec("phi-3-mini", 1, 2, 1024, 2, "holdout"),
    spec("mistral-1b-shape", 1, 1, 1024, 2, "holdout"),
    spec("qwen2.5-1.5b", 2, 1, 2048, 2, "holdout"),
    spec("qwen3-4b", 1, 4, 2048, 1, "holdout", lora=8, offload=True),
    spec("qwen3-1.7b", 2, 4, 2048, 2, "holdout"),
    spec("llama-3.2-3b", 1, 2, 4096, 1, "holdout", lora=16),
]
CALL26_TRACE = spec("qwen2.5-0.5b", 2, 4, 1024, 2, "trace", gc=True, trace="qwen2.5-0.5b_z2_mb4_s1024_gc_ws2", steps=2,
                    need_gib=40)


# Call 28 (ninth pass): a candidate (bench/plan/reduction_v12_candidate.patch): call 26's (v11) and where ZeRO-1/2 takes
# its 16-bit gradient partition: at the first reduction of a bucket holding one of rank 0's gradients, after the
# bucket has been flattened for the reduction across ranks (stage_1_and_2.py copy_grads_in_partition and
# allreduce_bucket), which is backward's end when rank 0's gradients arrive last or all fit in one bucket; the
# partition holds every tensor reaching into it whole (call 26's trace of Qwen2.5-0.5B at world size 2: +16.5% with
# v11, -0.0% with v12; call 27's of Gemma-3-1B: the same 379 MiB flatten and 955 MiB partition). Its known misses on
# committed rows: Gemma-3-1B at world size 2 with checkpointing and 8192 tokens (-17.4%: a cuBLAS workspace lands in a
# 36 MiB hole the real allocator did not have, so an AdamW state does not split an fp32 logits block) and Qwen2.5-0.5B
# LoRA at world size 2 (-13.0%, the same workspace). Rows drawn as call 26's (bench/plan/select_call.py 28, seed 28,
# calls 26 and 27's rows left out of the pool); the first is a Gemma-3-1B row with the same 8192 tokens, whose replay
# is that miss's. Rule, stated before the run and set after call 26: call 26's rule turned a candidate down for one
# under-prediction (-17.3%) although it was nearer the measurement on 13 of 16 rows and the kept plan broke the same
# bound on another row (-11.2%) and the +12% bound on six. The targets hold row by row (beyond -8% under is an
# OOM the user was told would not happen; beyond +12% over, a card wrongly called too small), so this rule counts, for
# each model, the rows outside [-8%, +12%]: adopt the candidate if it has fewer of them than the kept plan and a median
# abs error no higher; otherwise keep the plan. pred_gib: the kept plan (commit c499297's memory code); pred_gib_v12:
# with the patch applied.
CALL28 = [
    spec("gemma-3-1b", 2, 2, 4096, 2, "holdout", gc=True),
    spec("qwen3-1.7b", 1, 2, 4096, 2, "holdout", gc=True),
    spec("mistral-1b-shape", 1, 4, 2048, 2, "holdout", gc=True),
    spec("qwen3-4b", 2, 8, 2048, 2, "holdout", gc=True),
    spec("phi-3-mini", 2, 2, 1024, 2, "holdout", gc=True, offload=True),
    spec("gemma-2-2b", 1, 1, 1024, 2, "holdout", gc=True, offload=True),
    spec("qwen2.5-0.5b", 2, 2, 4096, 2, "holdout", lora=16, offload=True),
    spec("qwen2.5-0.5b", 2, 2, 4096, 1, "holdout", lora=16),
    spec("gemma-3-1b", 1, 4, 1024, 1, "holdout", lora=8),
    spec("gemma-2-2b", 2, 2, 4096, 1, "holdout", lora=8),
    spec("qwen2.5-1.5b", 1, 2, 1024, 2, "holdout"),
    spec("qwen3-4b", 2, 1, 2048, 2, "holdout"),
    spec("qwen2.5-3b", 1, 2, 1024, 2, "holdout"),
    spec("qwen2.5-3b", 2, 8, 2048, 2, "holdout", gc=True, lora=16, offload=True),
    spec("mistral-1b-shape", 1, 2, 2048, 1, "holdout", lora=8, offload=True),
    spec("phi-3-mini", 1, 4, 2048, 2, "holdout", gc=True, lora=16, offload=True),
]

# Call 32 (tenth pass, one GPU): a ZeRO-3 candidate (branch z3-v13, src/zeropilot/memory/segments.py
# zero3_offload_param_reserved): with offload_param and the optimizer on the GPU, full fine-tuning, what the allocator
# reserves comes from a replay of DeepSpeed's sequence (the whole-model build left cached without zero.Init, each
# sub-group's fp32 master made through a converted copy, the zeroed gradient buffer, the bucket and gradient partition,
# and per step the gathered layers, the loss and the sub-groups' fp32 gradients, AdamW states and temporaries) instead
# of the fitted gap and build cache. Built on call 7's and call 21's traces of the three world-size-2 rows of this kind
# (Qwen2.5-3B -11.2% with the plan, -1.2% with the candidate; Qwen2.5-1.5B -6.7%/-1.3%; Llama-3.2-3B +1.4%/-1.4%); no
# row at world size 1 or built in zero.Init was ever measured. Rows drawn by ``bench/plan/select_call.py 32
# /tmp/z3cand`` (seed 32; six per build). Rule, stated before the run, call 28's: count the rows outside [-8%, +12%];
# adopt the candidate if it has fewer of them than the plan and a median abs error no higher, or, both having none, a
# lower median; otherwise keep the plan. If it is adopted for one build only (a rule per build, the same one), the
# other keeps the plan. pred_gib: the plan (main at the commit that adds these rows); pred_gib_v13: the candidate.
# need_gib: 1.1 x the larger prediction + 3 GiB, to pack twelve runs on one GPU.
CALL32 = [
    spec("llama-3.2-3b", 3, 1, 2048, 1, "holdout", offload_param=True, zero_init=False, sgs=int(5e8)),
    spec("qwen3-1.7b", 3, 2, 2048, 1, "holdout", offload_param=True, zero_init=False, sgs=int(1e9), gc=True),
    spec("phi-3-mini", 3, 4, 1024, 1, "holdout", offload_param=True, zero_init=False, sgs=int(1e9), gc=True),
    spec("mistral-1b-shape", 3, 2, 4096, 1, "holdout", offload_param=True, zero_init=False, sgs=int(1e9)),
    spec("llama-3.2-1b", 3, 1, 2048, 1, "holdout", offload_param=True, zero_init=False, sgs=int(5e8), gc=True),
    spec("qwen2.5-1.5b", 3, 1, 4096, 1, "holdout", offload_param=True, zero_init=False, sgs=int(5e8)),
    spec("mistral-1b-shape", 3, 1, 1024, 1, "holdout", offload_param=True, zero_init=True, sgs=int(1e9), gc=True),
    spec("phi-3-mini", 3, 2, 1024, 1, "holdout", offload_param=True, zero_init=True, sgs=int(1e9), gc=True),
    spec("qwen2.5-3b", 3, 1, 2048, 1, "holdout", offload_param=True, zero_init=True, sgs=int(1e9), gc=True),
    spec("llama-3.2-1b", 3, 1, 1024, 1, "holdout", offload_param=True, zero_init=True, sgs=int(5e8), gc=True),
    spec("qwen3-4b", 3, 1, 1024, 1, "holdout", offload_param=True, zero_init=True, sgs=int(1e9), gc=True),
    spec("qwen2.5-1.5b", 3, 2, 4096, 1, "holdout", offload_param=True, zero_init=True, sgs=int(1e9)),
]

# Call 33 (one GPU): no candidate; the plan (main at the commit that adds these rows) on ZeRO-3 at world size 1, where
# few rows were ever measured, drawn by ``bench/plan/select_call.py 33 .`` (seed 33: six built whole, six in zero.Init;
# full or LoRA r16, optimizer on the GPU, offloaded, or both offloaded). Stated before the run: the figures are reported
# as they come; a row outside [-8%, +12%] is a miss of the plan, and one under -8% gets its kind a KNOWN_UNDER note
# (tests/memory/test_accuracy_bench.py requires it). need_gib: 1.1 x pred_gib + 3 GiB, to pack twelve runs on one GPU.
CALL33 = [
    spec("llama-3.2-1b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("phi-3-mini", 3, 1, 4096, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("gemma-2-2b", 3, 4, 1024, 1, "holdout", zero_init=False, gc=True),
    spec("llama-3.2-3b", 3, 1, 1024, 1, "holdout", zero_init=False, lora=16, offload=True),
    spec("mistral-7b", 3, 2, 1024, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("gemma-3-1b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, offload=True),
    spec("qwen2.5-1.5b", 3, 1, 4096, 1, "holdout", zero_init=True, lora=16),
    spec("gemma-3-1b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen2.5-0.5b", 3, 2, 4096, 1, "holdout", zero_init=True, offload=True),
    spec("mistral-1b-shape", 3, 1, 1024, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True),
    spec("gemma-2-2b", 3, 1, 1024, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("qwen3-1.7b", 3, 1, 1024, 1, "holdout", zero_init=True, lora=16, offload=True),
]

# Call 34 (one GPU): allocator histories of call 33's three misses, and of the older ZeRO-3 LoRA row with both offloads
# in zero.Init whose allocated memory the plan also over-counts (x2-fit, call 3), for bench/plan/analyze_trace.py.
CALL34_TRACE = [
    spec("phi-3-mini", 3, 1, 4096, 1, "trace", zero_init=False, lora=16, offload=True, offload_param=True, steps=2,
         trace="phi-3-mini_z3_mb1_s4096_lora16_offload_offload_param_ws1", need_gib=32),
    spec("gemma-2-2b", 3, 1, 1024, 1, "trace", zero_init=True, lora=16, offload=True, offload_param=True, steps=2,
         trace="gemma-2-2b_z3_mb1_s1024_lora16_offload_offload_param_zinit_ws1", need_gib=22),
    spec("qwen2.5-0.5b", 3, 2, 4096, 1, "trace", zero_init=True, offload=True, steps=2,
         trace="qwen2.5-0.5b_z3_mb2_s4096_offload_zinit_ws1", need_gib=42),
    spec("qwen2.5-7b", 3, 1, 1024, 1, "trace", gc=True, lora=16, zero_init=True, auto=True, offload=True,
         offload_param=True, steps=2, trace="qwen2.5-7b_z3_mb1_s1024_gc_lora16_offload_offload_param_zinit_ws1",
         need_gib=14),
]

# Call 35 (one GPU): the same LoRA runs with both offloads again, each large allocation with its DeepSpeed /
# transformers frames (``trace_frames``), to tell what ZeRO-3 holds at their peaks.
CALL35_TRACE = [dict(s, trace=s["trace"] + "_frames", trace_frames=True)
                for s in (CALL34_TRACE[0], CALL34_TRACE[1], CALL34_TRACE[3])]

# Call 36 (one GPU): candidate v14 (branch v14, bench/plan/build_cache_v14_candidate.patch): ZeRO-3 built whole with
# offload_param keeps the build's per-parameter blocks cached; without checkpointing the backward's peak holds every
# layer's activations, which fit in those blocks, so the plan counts only what the gathered parameters and the
# activations leave of them (call 35's trace of Phi-3-mini LoRA at 4096 tokens: +17.5% with the plan, -0.4% with the
# candidate; no other committed row changes). Rows drawn by ``bench/plan/select_call.py 36 /tmp/v14`` (seed 36).
# Rule, stated before the run, call 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of
# them than the plan and a median abs error no higher, or, both having none, a lower median; otherwise keep the plan.
# pred_gib: the plan (main at the commit that adds these rows); pred_gib_v14: the candidate; need_gib as call 32's.
CALL36 = [
    spec("llama-3.1-8b", 3, 1, 1024, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
    spec("phi-3-mini", 3, 4, 2048, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
    spec("qwen3-4b", 3, 4, 1024, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
    spec("mistral-7b", 3, 2, 4096, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
    spec("llama-3.2-3b", 3, 2, 1024, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
    spec("gemma-2-2b", 3, 2, 2048, 1, "holdout", zero_init=False, offload=True, offload_param=True, lora=16),
]

# Call 37 (one GPU): evidence on candidate v12 (branch adopt-v12, bench/plan/reduction_v12_adopt.patch) at world
# size 1, deciding nothing (call 28 decides v12). Rows drawn by ``bench/plan/select_call.py 37 /tmp/adopt`` (seed 37:
# eight where the predictions differ by 2% or more, four where they differ by less). pred_gib: the plan (main at the
# commit that adds these rows); pred_gib_v12: the candidate; need_gib as call 32's. Reported as they come.
CALL37 = [
    spec("qwen2.5-0.5b", 2, 4, 2048, 1, "holdout", lora=8, offload=True),
    spec("mistral-1b-shape", 1, 2, 4096, 1, "holdout", lora=8, offload=True),
    spec("gemma-2-2b", 1, 2, 4096, 1, "holdout", lora=8),
    spec("phi-3-mini", 2, 1, 4096, 1, "holdout", lora=16, offload=True),
    spec("mistral-1b-shape", 1, 8, 4096, 1, "holdout", lora=16, offload=True),
    spec("qwen2.5-1.5b", 2, 1, 4096, 1, "holdout", lora=8, offload=True),
    spec("qwen2.5-0.5b", 1, 8, 1024, 1, "holdout", lora=16),
    spec("phi-3-mini", 2, 1, 4096, 1, "holdout", lora=8, offload=True),
    spec("llama-3.2-3b", 2, 4, 1024, 1, "holdout", gc=True, lora=16),
    spec("llama-3.2-3b", 1, 4, 4096, 1, "holdout", gc=True, lora=8),
    spec("llama-3.2-1b", 2, 1, 1024, 1, "holdout", lora=8),
    spec("qwen2.5-1.5b", 2, 4, 4096, 1, "holdout", lora=8),
]


# Call 38 (one GPU, eleventh pass): no candidate; the plan (main at the commit that adds these rows) on twelve more
# never-measured ZeRO-3 runs at world size 1, drawn as call 33's by ``bench/plan/select_call.py 38 .`` (seed 38; every
# row measured before this call left out of the pool). Stated before the run, call 33's: the figures are reported as
# they come; a row outside [-8%, +12%] is a miss of the plan, and one under -8% gets its kind a KNOWN_UNDER note
# (tests/memory/test_accuracy_bench.py requires it); no row of this call is used to fit or choose anything before its
# figures are committed. need_gib: 1.1 x pred_gib + 3 GiB, to pack twelve runs on one GPU.
CALL38 = [
    spec("gemma-2-2b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True),
    spec("gemma-3-1b", 3, 1, 2048, 1, "holdout", zero_init=False, lora=16),
    spec("mistral-1b-shape", 3, 4, 1024, 1, "holdout", zero_init=False, lora=16),
    spec("llama-3.2-3b", 3, 1, 2048, 1, "holdout", zero_init=False),
    spec("qwen2.5-0.5b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-7b", 3, 4, 1024, 1, "holdout", zero_init=False, lora=16, offload=True),
    spec("gemma-3-1b", 3, 2, 2048, 1, "holdout", zero_init=True),
    spec("mistral-1b-shape", 3, 2, 1024, 1, "holdout", zero_init=True),
    spec("llama-3.2-3b", 3, 2, 1024, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("gemma-2-2b", 3, 2, 2048, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen2.5-3b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True),
    spec("llama-3.2-1b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
]


# Call 39 (one GPU): allocator histories, with each large block's frames, of ZeRO-3 runs at world size 1 with the
# parameters and the optimizer on the GPU, for a replay of that kind (nothing is gathered there): two rows it matches
# on allocated and reserved memory (Mistral-1B-shape full fine-tuning in zero.Init; Llama-3.2-1B with overlap_comm,
# whose reduction stream keeps its own blocks) and three where the allocated peak matches and reserved does not
# (Gemma-3-1B LoRA with overlap_comm, Gemma-2-2B checkpointed, Qwen2.5-1.5B LoRA). Already measured; not scored.
CALL39_TRACE = [
    spec("gemma-2-2b", 3, 4, 1024, 1, "trace", gc=True, zero_init=False, steps=2, trace_frames=True,
         trace="gemma-2-2b_z3_mb4_s1024_gc_ws1_frames", need_gib=75),
    spec("llama-3.2-1b", 3, 2, 2048, 1, "trace", overlap=True, zero_init=False, steps=2, trace_frames=True,
         trace="llama-3.2-1b_z3_mb2_s2048_overlap_ws1_frames", need_gib=47),
    spec("mistral-1b-shape", 3, 2, 1024, 1, "trace", zero_init=True, steps=2, trace_frames=True,
         trace="mistral-1b-shape_z3_mb2_s1024_zinit_ws1_frames", need_gib=35),
    spec("gemma-3-1b", 3, 2, 2048, 1, "trace", lora=16, overlap=True, zero_init=False, steps=2, trace_frames=True,
         trace="gemma-3-1b_z3_mb2_s2048_lora16_overlap_ws1_frames", need_gib=31),
    spec("qwen2.5-1.5b", 3, 2, 1024, 1, "trace", lora=16, zero_init=False, steps=2, trace_frames=True,
         trace="qwen2.5-1.5b_z3_mb2_s1024_lora16_ws1_frames", need_gib=18),
]


# Call 40 (one GPU): candidate v15 (branch v15, bench/plan/zero3_gpu_v15_candidate.patch): ZeRO-3 at world size 1
# with the parameters and the optimizer on the GPU, where nothing is gathered, replayed through the allocator model
# instead of the fitted gap (memory/segments.py zero3_reserved): deepspeed.initialize partitions each tensor into a
# copy, defragments the trainable ones through the CPU and empties the cache; each gradient's norm through an fp64 copy
# (get_grad_norm_direct); with overlap_comm the reduction stream's own pool. Built on call 39's five traces (within 1%
# on three; +8% and +15% on the two LoRA ones, where the layer template over-counts LoRA's transients, as for
# ZeRO-1/2 on main) and on the 32 committed rows of this kind (plan: 4 outside [-8%, +12%]; v15: 1). Also the
# fp64 norms for the v13 kind (offload_param), which moves its three call-32 rows of sub_group_size 5e8 nearer.
# Rows drawn by ``bench/plan/select_call.py 40 /tmp/v15wt`` (seed 40; per build six where the two predictions differ
# by 2% or more, two where they differ by less). Rule, stated before the run, call 28's: count the rows outside
# [-8%, +12%]; adopt the candidate if it has fewer of them than the plan and a median abs error no higher, or, both
# having none, a lower median; otherwise keep the plan. pred_gib: the plan (main at the commit that adds these rows);
# pred_gib_v15: the candidate; pred_gib_v15_v12: the candidate with v12 (reduction_v12_adopt.patch) applied as well,
# evidence only (v12 waits for call 28). need_gib: 1.1 x the largest prediction + 3 GiB, to pack the runs on one GPU.
CALL40 = [
    spec("qwen2.5-0.5b", 3, 1, 4096, 1, "holdout", zero_init=False, gc=True),
    spec("llama-3.2-1b", 3, 1, 1024, 1, "holdout", zero_init=False, overlap=True),
    spec("mistral-1b-shape", 3, 2, 4096, 1, "holdout", zero_init=False, lora=16, overlap=True),
    spec("gemma-3-1b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("gemma-2-2b", 3, 2, 4096, 1, "holdout", zero_init=False, lora=16),
    spec("qwen2.5-7b", 3, 2, 2048, 1, "holdout", zero_init=False, lora=16),
    spec("qwen2.5-3b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True),
    spec("mistral-1b-shape", 3, 4, 1024, 1, "holdout", zero_init=True, gc=True, overlap=True),
    spec("gemma-3-1b", 3, 4, 2048, 1, "holdout", zero_init=True, lora=16, overlap=True),
    spec("gemma-2-2b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen2.5-7b", 3, 2, 1024, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen3-1.7b", 3, 4, 2048, 1, "holdout", zero_init=True, gc=True, lora=16, overlap=True),
    spec("mistral-1b-shape", 3, 1, 4096, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("qwen2.5-7b", 3, 4, 1024, 1, "holdout", zero_init=False, gc=True, lora=16, overlap=True),
    spec("gemma-2-2b", 3, 1, 1024, 1, "holdout", zero_init=True, lora=16),
    spec("llama-3.2-3b", 3, 2, 1024, 1, "holdout", zero_init=True, gc=True),
]


# Call 41 (one GPU): the allocator history, with frames, of call 40's one miss of candidate v15 (Qwen2.5-3B, full
# fine-tuning in zero.Init, checkpointed, 8192 tokens a step: allocated within 0.1%, reserved 10.7% under).
CALL41_TRACE = [
    spec("qwen2.5-3b", 3, 2, 4096, 1, "trace", zero_init=True, gc=True, steps=2, trace_frames=True,
         trace="qwen2.5-3b_z3_mb2_s4096_gc_zinit_ws1_frames", need_gib=85),
]


# Call 42 (two GPUs): no candidate; the plan after v12 and v15 (main at the commit that adds these rows) on ten
# never-measured ZeRO-1/2 runs at world size 2, where v12 changed the most and call 28 had twelve rows; drawn by
# ``bench/plan/select_call.py 42 .`` (seed 42, one per model). Stated before the run: the figures are reported as
# they come; a row outside [-8%, +12%] is a miss of the plan, and one under -8% must be of a kind the plan warns
# about (tests/memory/test_accuracy_bench.py), else it gets a note.
CALL42 = [
    spec("qwen2.5-1.5b", 2, 4, 4096, 2, "holdout", lora=8, offload=True),
    spec("qwen3-1.7b", 2, 1, 4096, 2, "holdout", lora=16),
    spec("gemma-3-1b", 1, 4, 1024, 2, "holdout"),
    spec("llama-3.2-3b", 1, 4, 4096, 2, "holdout", gc=True, lora=8),
    spec("mistral-1b-shape", 2, 1, 4096, 2, "holdout", gc=True, lora=8),
    spec("phi-3-mini", 2, 2, 1024, 2, "holdout", lora=8),
    spec("qwen2.5-3b", 2, 1, 2048, 2, "holdout", gc=True, lora=16),
    spec("qwen2.5-0.5b", 2, 1, 2048, 2, "holdout", gc=True, offload=True),
    spec("qwen3-4b", 1, 1, 4096, 2, "holdout", gc=True, lora=16),
    spec("gemma-2-2b", 1, 1, 4096, 2, "holdout", gc=True, lora=16, offload=True),
]


# Call 43 (one GPU): allocator histories, with frames, of ZeRO-3 at world size 1 with the parameters on the GPU and
# the optimizer offloaded, the one kind of ZeRO-3 at world size 1 left on the fitted gap: call 33's Qwen2.5-0.5B miss
# (-12.3%) and call 38's Gemma-2-2B LoRA row (+10.6%). Already measured; not scored.
CALL43_TRACE = [
    spec("qwen2.5-0.5b", 3, 2, 4096, 1, "trace", zero_init=True, offload=True, steps=2, trace_frames=True,
         trace="qwen2.5-0.5b_z3_mb2_s4096_offload_zinit_ws1_frames", need_gib=42),
    spec("gemma-2-2b", 3, 1, 2048, 1, "trace", zero_init=False, gc=True, lora=16, offload=True, steps=2,
         trace_frames=True, trace="gemma-2-2b_z3_mb1_s2048_gc_lora16_offload_ws1_frames", need_gib=22),
]


# Call 44 (one GPU): candidate v16 (branch v16, bench/plan/zero3_offload_v16_candidate.patch): ZeRO-3 at world size 1
# with the parameters on the GPU and the optimizer offloaded, replayed (memory/segments.py zero3_reserved) instead of
# the fitted gap: v15's sequence without the GPU optimizer, and at backward's end each reduction's flattened bucket,
# each gradient's partition back on the GPU, its fp64 norm in 250 M-element chunks and its fp32 copy to the CPU
# (stage3.py partition_grads, _offload_grad_partition_at_boundary; call 43's traces: 0.0% and +1.0% at the end). On
# the eight committed rows of the kind: seven within 1% (the plan -12.3% to +10.6%), Gemma-3-1B full fine-tuning
# +15.6% (the plan +0.9%). Rows drawn by ``bench/plan/select_call.py 44 /tmp/v16wt`` (seed 44). Rule, stated before
# the run, call 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of them than the plan
# and a median abs error no higher, or, both having none, a lower median; otherwise keep the plan. pred_gib: the plan
# (main at the commit that adds these rows); pred_gib_v16: the candidate; need_gib as call 32's.
CALL44 = [
    spec("qwen2.5-0.5b", 3, 1, 4096, 1, "holdout", zero_init=False, offload=True),
    spec("gemma-3-1b", 3, 1, 1024, 1, "holdout", zero_init=False, offload=True, gc=True, lora=16, overlap=True),
    spec("llama-3.2-3b", 3, 4, 1024, 1, "holdout", zero_init=False, offload=True, lora=16),
    spec("gemma-2-2b", 3, 1, 2048, 1, "holdout", zero_init=False, offload=True, gc=True, lora=16, overlap=True),
    spec("qwen2.5-0.5b", 3, 2, 2048, 1, "holdout", zero_init=True, offload=True, lora=16, overlap=True),
    spec("phi-3-mini", 3, 4, 1024, 1, "holdout", zero_init=True, offload=True, gc=True, lora=16, overlap=True),
    spec("qwen3-4b", 3, 2, 1024, 1, "holdout", zero_init=True, offload=True, lora=16, overlap=True),
    spec("mistral-1b-shape", 3, 2, 1024, 1, "holdout", zero_init=True, offload=True, gc=True, lora=16),
    spec("qwen2.5-1.5b", 3, 1, 4096, 1, "holdout", zero_init=False, offload=True, lora=16),
    spec("qwen2.5-7b", 3, 1, 1024, 1, "holdout", zero_init=True, offload=True, gc=True, lora=16, overlap=True),
]


# Call 45 (one GPU): the allocator history, with frames, of v16's one over-prediction on committed rows (Gemma-3-1B
# full fine-tuning built whole, optimizer offloaded, checkpointed: +15.6%; call 33's row). Already measured; not scored.
CALL45_TRACE = [
    spec("gemma-3-1b", 3, 1, 2048, 1, "trace", zero_init=False, gc=True, offload=True, steps=2, trace_frames=True,
         trace="gemma-3-1b_z3_mb1_s2048_gc_offload_ws1_frames", need_gib=16),
]


# Call 46 (one GPU): candidate v17 (branch v17, bench/plan/zero3_v17_candidate.patch), four changes to the ZeRO-3
# replay (memory/segments.py zero3_reserved): (1) create_reduce_and_remove_grad_hooks gathers each trainable
# parameter whole once at the init's end (call 45's trace: Gemma-3-1B with the optimizer offloaded, +15.6% -> 0.0%);
# (2) LoRA with both offloads at world size 1 replayed instead of the fitted gap, with the coordinator's prefetched
# window of stage3_max_live_parameters gathered elements from the second step on (calls 34 and 35's traces: the
# plan +20.3% and +29.2% on two of them); (3) zero.Init with offload_param: the embedding gathered twice while the
# model is built, each a buffer and a CPU copy (call 35's traces); (4) under checkpointing a layer's output is kept as
# the next one's input instead of a separate input, and the last one released after the final norm (call 41's
# trace). On the committed never-fitted rows: 7 outside [-8%, +12%] before, 4 after (all under-predictions the plan
# names); LoRA with both offloads at world size 1: the plan -5.0% to +20.5% on 11 rows, the candidate -2.8% to
# +10.0%. Rows drawn by ``bench/plan/select_call.py 46 /tmp/v17wt`` (seed 46). Rule, stated before the run, call
# 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of them than the plan and a median
# abs error no higher, or, both having none, a lower median; otherwise keep the plan. pred_gib: the plan (main at the
# commit that adds these rows); pred_gib_v17: the candidate; need_gib as call 32's.
CALL46 = [
    spec("qwen2.5-1.5b", 3, 2, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("qwen3-1.7b", 3, 2, 4096, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True, offload_param=True),
    spec("gemma-2-2b", 3, 1, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("phi-3-mini", 3, 4, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("qwen3-4b", 3, 1, 2048, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("gemma-2-2b", 3, 1, 4096, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-1.5b", 3, 2, 1024, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("llama-3.2-1b", 3, 4, 1024, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("phi-3-mini", 3, 2, 4096, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-0.5b", 3, 2, 2048, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-0.5b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, offload=True),
    spec("qwen2.5-0.5b", 3, 2, 1024, 1, "holdout", zero_init=True, gc=True, offload=True),
    spec("qwen2.5-1.5b", 3, 1, 1024, 1, "holdout", zero_init=True, gc=True, offload_param=True),
    spec("llama-3.2-1b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, offload_param=True),
]


# Call 47 (one GPU): no candidate's test but the plan's after v17 (commit that adds these rows), on never-measured runs
# at world size 1 of every kind: twelve ZeRO-3 rows drawn as call 33's (seed 47) and six ZeRO-1/2 rows from call 37's
# pool (seed 47), ``bench/plan/select_call.py 47 .``. Reported as they come against the bounds (median <= 5%,
# max <= 12%, no under-prediction beyond 8%); pred_gib: the plan; need_gib as call 33's.
CALL47 = [
    spec("qwen2.5-1.5b", 3, 1, 1024, 1, "holdout", zero_init=False),
    spec("gemma-3-1b", 3, 1, 2048, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True),
    spec("qwen2.5-3b", 3, 2, 2048, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("mistral-7b", 3, 2, 1024, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True),
    spec("qwen3-1.7b", 3, 1, 4096, 1, "holdout", zero_init=False, lora=16),
    spec("gemma-2-2b", 3, 4, 1024, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True, offload_param=True),
    spec("phi-3-mini", 3, 4, 2048, 1, "holdout", zero_init=True, lora=16, offload=True),
    spec("qwen3-1.7b", 3, 1, 2048, 1, "holdout", zero_init=True, lora=16),
    spec("qwen2.5-3b", 3, 1, 4096, 1, "holdout", zero_init=True, lora=16),
    spec("mistral-1b-shape", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen3-4b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("qwen2.5-1.5b", 3, 1, 1024, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-0.5b", 2, 2, 4096, 1, "holdout", lora=8),
    spec("mistral-1b-shape", 2, 4, 4096, 1, "holdout", gc=True, lora=8),
    spec("qwen2.5-1.5b", 1, 4, 2048, 1, "holdout", lora=8),
    spec("llama-3.2-3b", 2, 2, 1024, 1, "holdout", lora=8),
    spec("gemma-3-1b", 2, 2, 1024, 1, "holdout", lora=16, offload=True),
    spec("gemma-2-2b", 1, 4, 1024, 1, "holdout", lora=16),
]


# Call 48 (one GPU): the plan after v17 (no candidate) on the seed's kind at world size 1, which call 46 did not draw:
# LoRA r16 with both offloads on 7-8B models, ``bench/plan/select_call.py 48 .`` (seed 48, three rows per build).
# Reported as they come against the bounds; pred_gib: the plan at the commit that adds these rows; need_gib as
# call 33's.
CALL48 = [
    spec("qwen2.5-7b", 3, 1, 4096, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("llama-3.1-8b", 3, 2, 4096, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("mistral-7b", 3, 2, 1024, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True, offload_param=True),
    spec("mistral-7b", 3, 1, 2048, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("llama-3.1-8b", 3, 1, 2048, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-7b", 3, 2, 2048, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True),
]


# Call 49 (one GPU): allocator histories, with frames, of v17's two largest over-predictions on call 46's rows (LoRA
# with both offloads: Gemma-2-2B built whole +11.4%, allocated right and reserved 1.4 GiB more; Qwen2.5-0.5B in
# zero.Init +10.8%). Already measured; not scored.
CALL49_TRACE = [
    spec("gemma-2-2b", 3, 1, 1024, 1, "trace", zero_init=False, lora=16, offload=True, offload_param=True, steps=2,
         trace_frames=True, trace="gemma-2-2b_z3_mb1_s1024_lora16_offload_offload_param_ws1_frames", need_gib=20),
    spec("qwen2.5-0.5b", 3, 2, 2048, 1, "trace", zero_init=True, lora=16, offload=True, offload_param=True, steps=2,
         trace_frames=True, trace="qwen2.5-0.5b_z3_mb2_s2048_lora16_offload_offload_param_zinit_ws1_frames",
         need_gib=27),
]


# Call 50 (one GPU): candidate v18 (branch v18, bench/plan/zero3_v18_candidate.patch), two changes to the ZeRO-3
# replay with parameter offload: a tied model built whole keeps the block of its own output-layer weight, released
# when transformers ties it to the embedding (calls 21 and 49's traces: the init's end -5.3% and -3.7% -> -0.6% and
# 0.0% at world size 2, -18.9% -> -1.3% on call 49's Gemma-2-2B); and the output layer's gathered weight is released
# after its forward and gathered again for its backward, as call 49's Gemma-2-2B trace shows (+13.0% -> +8.4%). On
# the committed rows: 12 change, 10 nearer (largest moves: call 46's Gemma-2-2B +11.4% -> +7.4%, call 48's
# Llama-3.1-8B +3.8% -> +5.5%). Rows drawn by ``bench/plan/select_call.py 50 /tmp/v18wt`` (seed 50). Rule, stated
# before the run, call 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of them than the
# plan and a median abs error no higher, or, both having none, a lower median; otherwise keep the plan. pred_gib: the
# plan (main at the commit that adds these rows); pred_gib_v18: the candidate; need_gib as call 32's.
CALL50 = [
    spec("gemma-2-2b", 3, 1, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True, gc=True),
    spec("llama-3.2-3b", 3, 2, 2048, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True, gc=True),
    spec("phi-3-mini", 3, 1, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("gemma-2-2b", 3, 1, 2048, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True, gc=True),
    spec("mistral-7b", 3, 2, 1024, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True, gc=True),
    spec("llama-3.2-3b", 3, 1, 1024, 1, "holdout", zero_init=True, lora=16, offload=True, offload_param=True, gc=True),
    spec("qwen2.5-0.5b", 3, 2, 1024, 1, "holdout", zero_init=False, offload_param=True, gc=True),
    spec("qwen2.5-1.5b", 3, 2, 2048, 1, "holdout", zero_init=False, offload_param=True, gc=True),
    spec("llama-3.2-1b", 3, 2, 1024, 1, "holdout", zero_init=False, offload_param=True, gc=True),
]


# Call 51 (one GPU): the plan (no candidate) on the kind it warns about as KNOWN_UNDER["zero3_states_in_logits"]:
# full fine-tuning at ZeRO-3, world size 1, everything on the GPU, where one fp32 copy of the logits can hold a
# sub-group's fp32 block (seven of eight committed rows within 0.2%, call 40's Qwen2.5-3B -10.7%); how often the
# warning comes true. ``bench/plan/select_call.py 51 .`` (seed 51, four rows per build). Reported as they come;
# pred_gib: the plan at the commit that adds these rows; need_gib as call 33's.
CALL51 = [
    spec("gemma-3-1b", 3, 4, 1024, 1, "holdout", zero_init=False),
    spec("gemma-2-2b", 3, 1, 4096, 1, "holdout", zero_init=False, gc=True),
    spec("qwen2.5-0.5b", 3, 2, 2048, 1, "holdout", zero_init=False, gc=True),
    spec("llama-3.2-3b", 3, 2, 4096, 1, "holdout", zero_init=False, gc=True),
    spec("gemma-3-1b", 3, 2, 4096, 1, "holdout", zero_init=True),
    spec("llama-3.2-3b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True),
    spec("qwen2.5-0.5b", 3, 2, 2048, 1, "holdout", zero_init=True),
    spec("gemma-2-2b", 3, 4, 1024, 1, "holdout", zero_init=True, gc=True),
]

# Call 52 (one GPU): candidate v19 (branch v19, bench/plan/nograd_v19_candidate.patch). Gradient checkpointing runs
# each layer's first forward without autograd, so each tensor goes once its last user is done; the replay took the
# layer's tensors with the backward's lifetimes. v19 adds each layer's forward without autograd
# (memory.gpu.NO_GRAD_TEMPLATES, read off checkpointed traces: traces41, 10, 39 and 27; Phi-3's fused layer by analogy);
# in zero.Init PEFT's fp32 transients (the input cast to fp32; lora_B's output, its scaled copy and the sum in fp32,
# cast back: call 35's Qwen2.5-7B trace); and ZeRO-3's input gradient of the output layer before the autograd thread's
# workspace, under checkpointing (LinearFunctionForZeroStage3.backward; call 41's trace). On the traces: call 41's
# Qwen2.5-3B -10.9% -> 0.0%, call 27's Gemma-3-1B at world size 2 -18.1% -> -0.1%, none further than 1.6 points
# from before. On the 381 never-fitted rows: 2 outside [-8%, +12%] against 4 (Qwen2.5-3B -10.7% -> 0.0%; both
# Gemma-3-1B rows at world size 2, -17.4% -> -0.1%; new: call 50's Mistral-7B LoRA with both offloads in zero.Init,
# -5.6% -> -9.1%, a kind whose repeated runs differ by up to 1.16 GiB), median 0.4% -> 0.2%. Rows drawn by
# ``bench/plan/select_call.py 52 /tmp/v19wt`` (seed 52): checkpointed runs at world size 1 never measured, ZeRO-1/2
# (call 26's pool) and ZeRO-3 (call 46's pool, five kinds: everything on the GPU, LoRA r16, the optimizer offloaded,
# offload_param, LoRA r16 with both offloads), both predictions under 50 GiB; four ZeRO-1/2 and four ZeRO-3 rows where
# plan and candidate differ by 2% or more and two where they differ by less, one per model in each. Rule, stated
# before the run, call 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of them than the
# plan and a median abs error no higher, or, both having none, a lower median; otherwise keep the plan. pred_gib: the
# plan (main at the commit that adds these rows); pred_gib_v19: the candidate; need_gib as call 32's.
CALL52 = [
    spec("qwen3-4b", 1, 8, 2048, 1, "holdout", gc=True, lora=8, offload=True),
    spec("phi-3-mini", 1, 4, 2048, 1, "holdout", gc=True, lora=16),
    spec("qwen3-1.7b", 2, 8, 2048, 1, "holdout", gc=True, lora=8, offload=True),
    spec("llama-3.2-1b", 1, 4, 4096, 1, "holdout", gc=True, offload=True),
    spec("qwen3-1.7b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("phi-3-mini", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-3b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16),
    spec("mistral-7b", 3, 2, 4096, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("llama-3.2-1b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True, offload_param=True),
    spec("qwen3-4b", 1, 1, 2048, 1, "holdout", gc=True, lora=16, offload=True),
]

# Call 53 (one GPU): the plan after v19 (no candidate), on checkpointed runs at world size 1 never measured (call 52's
# pool), one ZeRO-1/2 and one ZeRO-3 row per layer kind of NO_GRAD_TEMPLATES (the llama-style layer, Qwen3, Gemma 2,
# Gemma 3, and Phi-3's fused layer, the one written by analogy rather than read off a trace), predicted under 50 GiB.
# ``bench/plan/select_call.py 53 .`` (seed 53). Reported as they come; pred_gib: the plan at the commit that adds these
# rows; need_gib as call 32's.
CALL53 = [
    spec("llama-3.2-1b", 1, 1, 1024, 1, "holdout", gc=True, lora=8, offload=True),
    spec("qwen2.5-1.5b", 3, 4, 1024, 1, "holdout", zero_init=False, gc=True, lora=16),
    spec("qwen3-4b", 2, 8, 1024, 1, "holdout", gc=True, offload=True),
    spec("qwen3-4b", 3, 4, 2048, 1, "holdout", zero_init=False, gc=True, lora=16, offload=True, offload_param=True),
    spec("gemma-2-2b", 2, 1, 2048, 1, "holdout", gc=True, lora=16, offload=True),
    spec("gemma-2-2b", 3, 2, 2048, 1, "holdout", zero_init=True, gc=True, lora=16, offload=True, offload_param=True),
    spec("gemma-3-1b", 1, 2, 2048, 1, "holdout", gc=True),
    spec("gemma-3-1b", 3, 1, 4096, 1, "holdout", zero_init=True, gc=True),
    spec("phi-3-mini", 2, 4, 1024, 1, "holdout", gc=True, lora=8, offload=True),
    spec("phi-3-mini", 3, 1, 1024, 1, "holdout", zero_init=True, gc=True, lora=16),
]

# Call 54 (prepared in the eleventh pass, not yet run; its four world-size-2 rows need two GPUs): candidate v20 (branch
# v20, bench/plan/grad_v20_candidate.patch), read off the traces with the layer templates matched against them tensor
# by tensor (tests/memory/test_accuracy_bench.py, the templates test): without checkpointing each layer's output lives
# until the next layer returns (the decoder loop holds a layer's input while it runs) and the last one until the final
# norm has read it, as every trace shows; with LoRA the frozen norm's product input is released after the next tensor,
# not before it; Phi-3's layer keeps one more copy of the attention output (traces15 and traces22). On the traces:
# call 22's Qwen2.5-0.5B LoRA at world size 2 -14.4% -> -0.3%, Phi-3 LoRA with both offloads -3.0% -> +2.2%, call 39's
# Qwen2.5-1.5B LoRA -1.2% -> +7.7%. On the 398 never-fitted rows: 1 outside [-8%, +12%] against 2 (Qwen2.5-0.5B LoRA at
# world size 2 -13.0% -> -0.2%; left: call 50's Mistral-7B, -9.1%), median 0.2% both, max +11.9% against +11.4%; 123
# rows move, 79 nearer. Rows drawn by ``bench/plan/select_call.py 54 /tmp/v20wt`` (seed 54). Rule, stated before any
# run, call 28's: count the rows outside [-8%, +12%]; adopt the candidate if it has fewer of them than the plan and a
# median abs error no higher, or, both having none, a lower median; otherwise keep the plan; applied once all fourteen
# rows are measured (the world-size-1 ones may run first on one GPU, as call 28's did). pred_gib: the plan (main at
# the commit that adds these rows, v19); pred_gib_v20: the candidate; need_gib as call 32's.
CALL54 = [
    spec("qwen3-4b", 2, 1, 2048, 1, "holdout", lora=8),
    spec("phi-3-mini", 2, 4, 2048, 1, "holdout", lora=8),
    spec("qwen2.5-3b", 1, 1, 2048, 1, "holdout", lora=16),
    spec("qwen2.5-0.5b", 2, 1, 4096, 1, "holdout", lora=8),
    spec("qwen3-4b", 3, 1, 2048, 1, "holdout", zero_init=False, lora=16),
    spec("phi-3-mini", 3, 4, 1024, 1, "holdout", zero_init=False, lora=16),
    spec("qwen2.5-0.5b", 3, 4, 1024, 1, "holdout", zero_init=False, lora=16, offload=True, offload_param=True),
    spec("qwen2.5-3b", 3, 1, 2048, 1, "holdout", zero_init=False, lora=16),
    spec("qwen2.5-0.5b", 2, 4, 1024, 2, "holdout", lora=16, offload=True),
    spec("phi-3-mini", 2, 2, 1024, 2, "holdout", offload=True),
    spec("qwen2.5-3b", 2, 2, 1024, 2, "holdout", lora=16),
    spec("qwen2.5-1.5b", 2, 1, 2048, 2, "holdout", lora=8),
    spec("qwen3-1.7b", 2, 8, 2048, 2, "holdout", gc=True, lora=8, offload=True),
    spec("phi-3-mini", 2, 2, 1024, 1, "holdout", gc=True, offload=True),
]


def main() -> None:
    import sys
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    from rows import spec_inputs
    from zeropilot.memory.plan import make_plan

    calls = {"call3": ROWS, "call5": CALL5, "call8": CALL8, "call9": CALL9, "call12": CALL12, "call14": CALL14,
             "call16": CALL16, "call18": CALL18, "call19": CALL19, "call21": CALL21, "call23": CALL23, "call24": CALL24,
             "call25": CALL25, "call26": CALL26, "call28": CALL28, "call32": CALL32, "call33": CALL33,
             "call34": CALL34_TRACE, "call35": CALL35_TRACE, "call36": CALL36, "call37": CALL37, "call38": CALL38,
             "call39": CALL39_TRACE, "call40": CALL40, "call41": CALL41_TRACE, "call42": CALL42, "call43": CALL43_TRACE,
             "call44": CALL44, "call45": CALL45_TRACE, "call46": CALL46, "call47": CALL47, "call48": CALL48,
             "call49": CALL49_TRACE, "call50": CALL50, "call51": CALL51, "call52": CALL52,
             "call53": CALL53, "call54": CALL54}
    which = next((a[2:] for a in sys.argv[1:] if a.startswith("--") and a[2:] in calls), "call3")
    rows = calls[which]
    traced = all(s["split"] == "trace" for s in rows)  # allocator histories only: no prediction to write
    out = HERE / "specs" / (f"{which}_trace.jsonl" if traced else f"{which}_x2.jsonl")
    with out.open("w") as f:
        for s in rows + ([CALL26_TRACE] if which == "call26" else []):
            if s["split"] == "trace":
                f.write(json.dumps(s) + "\n")
                continue
            p = make_plan(spec_inputs(s, 139.8)).gpu_peak_bytes / 2**30
            s["pred_gib"] = round(p, 1)
            if which in ("call33", "call38", "call47", "call48", "call51", "call53"):
                s["need_gib"] = round(1.1 * p + 3)
            if s.get("lora") is None and s["name"] in ("qwen2.5-7b", "llama-3.1-8b", "mistral-7b") \
                    and not s.get("offload"):
                s["need_gib"] = 128 if s["ws"] == 1 else 80  # full fine-tuning of 7-8B: packing hint
            f.write(json.dumps(s) + "\n")
    held = sum(1 for s in rows if s["split"] == "holdout")
    print(f"{out}: {len(rows)} specs, {held} held out")


if __name__ == "__main__":
    main()
