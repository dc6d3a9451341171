"""The estimator's constants, each with where it came from.

Bytes-per-element figures come from the code paths (PyTorch, transformers 5, DeepSpeed 0.19.8) and are
documented in ``docs/plan.md``. The ``fit_*`` values were fitted on the TUNING split of the H200
measurements by ``python bench/plan/fit.py`` (least squares over the rows in ``bench/plan/data/rows.jsonl``;
the split is defined in ``bench/plan/rows.py``); the hold-out and new-architecture rows were not used.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Constants:
    """Tunable constants of the memory model (defaults: the fitted values).

    Attributes:
        act_h / act_q / act_kv / act_i: activation bytes saved per token per decoder layer for each unit
            of hidden size, query width, key/value width and MLP width (bf16, sdpa, no recomputation).
        eager_bytes: bytes per attention score saved by eager attention (fp32 softmax + bf16 copy).
        logits_bytes: bytes per vocabulary entry per token of the logits and loss buffers at the peak
            of the loss backward (bf16 logits, fp32 upcast, log-softmax output and its gradient).
        softcap_bytes: extra per vocabulary entry for Gemma 2's final logit soft-capping.
        step_temp: fp32 temporaries of the torch AdamW step, per trainable element of the partition.
        fit_act: multiplier on the activation estimate (fitted).
        fit_logits: multiplier on the logits estimate (fitted).
        fit_gap_state: reserved-but-unallocated bytes per byte of fp32 optimizer state on the GPU (fitted).
        fit_gap_trans: reserved-but-unallocated bytes per byte of the larger transient (fitted).
        fit_gap_overlap: extra reserved bytes per byte of reduce bucket with overlap_comm (fitted).
        gap_expandable: share of the fitted gap left with expandable segments, where no allocator replay applies
            (set by hand; the replay models the expandable allocator itself: ``segments.ExpandableAllocator``).
        non_torch_zero12 / non_torch_zero3: memory outside PyTorch at world size 1 (FACTS F, measured) with
            the model built on the GPU (ZeRO-3: without ``zero.Init``).
        non_torch_zero3_init: the same for ZeRO-3 built inside ``zero.Init`` (NVML per process, H200).
        nccl_multi_gpu: extra per GPU at world size 2 (NCCL communicators; measured on 2 x H200:
            1.76-1.77 GiB against 1.29-1.30 at world size 1).
        fit_gap_sub: ZeRO-3's reserved-but-unallocated bytes per byte of one sub-group's step
            temporaries (fitted; replaces ``fit_gap_state`` for ZeRO-3 with the optimizer on the GPU).
        fit_gap_gather: reserved-but-unallocated bytes while ZeRO-3 gathers parameters (world size > 1
            or parameter offload), per byte of the largest gathered tensor (fitted).
        init_reserved: reserved per allocated byte at the init phase's peak (measured: 1.01-1.03).
        source: where the outside-PyTorch figures come from (a hardware profile names itself here).
        outside_nodes: nodes the outside-PyTorch figure was measured across (1: one node, no inter-node
            NCCL transport; a plan for more nodes than this is not judged, see ``plan.verdict_of``).
        fit_live: share of ``stage3_max_live_parameters`` that stays gathered at the peak (fitted).
        host_base: host memory of one training process without offload (measured RSS, ~2.2 GiB).
    """

    act_h: float = 16.0
    act_q: float = 4.0
    act_kv: float = 4.0
    act_i: float = 8.0
    eager_bytes: float = 6.0
    logits_bytes: float = 12.0
    softcap_bytes: float = 4.0
    step_temp: float = 1.2
    fit_act: float = 0.9125
    fit_logits: float = 1.16
    fit_gap_state: float = 0.255
    fit_gap_trans: float = 0.06
    fit_gap_overlap: float = 6.0
    gap_expandable: float = 0.3
    non_torch_zero12: float = 1.30 * GIB
    non_torch_zero3: float = 1.68 * GIB
    non_torch_zero3_init: float = 1.29 * GIB
    nccl_multi_gpu: float = 0.47 * GIB
    fit_gap_sub: float = 0.8
    fit_gap_gather: float = 0.5
    fit_live: float = 1.0
    init_reserved: float = 1.02
    source: str = "measured on H200, bench/plan"
    outside_nodes: int = 1
    host_base: float = 2.2 * GIB


DEFAULT = Constants()
