"""What a plan is computed from: the model, the hardware and the launch settings, each with its source."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Tuple, Union

from zeropilot.errors import InputError
from zeropilot.launch.planfacts import Freeze
from zeropilot.memory import cards
from zeropilot.models.arch import Architecture

GIB = 1024**3
GB = 10**9
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ATTENTION = ("sdpa", "eager", "flash")


@dataclass(frozen=True)
class Hardware:
    """The GPUs of one launch.

    Attributes:
        gpus_per_node: GPUs (training processes) per node.
        gpu_bytes: memory of one GPU, as ``nvidia-smi`` reports its total.
        nodes: nodes.
        name: how the user wrote it (``4x16GiB``, ``4xH100``).
        card: the card table's key (``H100-SXM``: :mod:`zeropilot.memory.cards`) when the user named a card, None
            when they gave its memory.
    """

    gpus_per_node: int
    gpu_bytes: int
    nodes: int = 1
    name: str = ""
    card: Optional[str] = None

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


_GPUS = re.compile(r"^\s*(\d+)\s*[xX*]\s*([0-9]*\.?[0-9]+)\s*(GiB|GB|G|MiB|MB|M|TiB|TB)?\s*$")
#: COUNT x WHAT: the count, then the first ``x`` or ``*`` (``8xMI300X``: 8 of ``MI300X``)
_COUNT = re.compile(r"^\s*(\d+)\s*[xX*]\s*(.+?)\s*$")
_UNITS = {"gib": GIB, "g": GIB, "gb": GB, "mib": 1024**2, "m": 1024**2, "mb": 10**6, "tib": 1024**4,
          "tb": 10**12, None: GIB}


def has_count(text: str) -> bool:
    """Whether a ``--gpus`` value starts with its count (``4x16GiB``, ``8xMI300X``), unlike ``16GiB`` or ``MI300X``
    (whose ``x`` is the card's)."""
    return _COUNT.match(text or "") is not None and not cards.is_card(text.strip())


def parse_gpus(text: str, nodes: int = 1) -> Hardware:
    """``4x16GiB`` -> 4 GPUs of 16 GiB per node (a bare number or ``G`` means GiB); ``4xH100`` -> 4 GPUs of the
    card table's H100, its memory from the table (:func:`zeropilot.memory.cards.lookup`; a card's name wins over a
    bare number: ``4x4090`` is four RTX 4090s, not 4090 GiB).

    Raises:
        InputError: not of the form COUNTxMEM or COUNTxCARD, a card the table does not know (the message lists those
            it does), or a card whose memory is not public.
    """
    if nodes < 1:
        raise InputError(f"--nodes {nodes}: must be at least 1")
    m = _COUNT.match(text or "")
    if m and int(m.group(1)) >= 1 and cards.is_card(m.group(2)):
        return _card_gpus(int(m.group(1)), m.group(2), nodes, text.strip())
    m = _GPUS.match(text or "")
    if not m or int(m.group(1)) < 1 or float(m.group(2)) <= 0:
        raise InputError(f"--gpus {text!r}: expected COUNTxMEM such as 4x16GiB or 1x139.8GiB, or COUNTxCARD such as "
                         f"4xH100 with a card of the table: {cards.known_names()}")
    unit = _UNITS[m.group(3).lower() if m.group(3) else None]
    return Hardware(int(m.group(1)), int(float(m.group(2)) * unit), nodes, text.strip())


def _card_gpus(count: int, name: str, nodes: int, text: str) -> Hardware:
    card = cards.lookup(name)
    if card.memory_bytes.value is None:
        raise InputError(f"--gpus {text!r}: the card table has no memory figure for {card.key} "
                         f"({card.memory_bytes.source}): give COUNTxMEM, and run `zeropilot calibrate` on the card")
    return Hardware(count, int(card.memory_bytes.value), nodes, text, card.key)


QUANT_BITS = (4, 8)
OPTIMIZERS = ("adamw", "adamw_8bit")
#: why a quantized model is never built in zero.Init: transformers loads it outside (``modeling_utils.py``,
#: ``is_deepspeed_zero3_enabled() and not _is_quantized``); DeepSpeed partitions it at ``deepspeed.initialize`` and,
#: as for any model built outside, casts LoRA's adapters to 16 bits (no fp32 input copies)
QUANTIZED_BUILD = "a quantized model: transformers loads it outside zero.Init"
FUSED_LOSSES = ("liger", "cce")


@dataclass(frozen=True)
class PlanInputs:
    """Everything the estimator reads. Pure data: build it from flags, a launch, or both.

    Attributes:
        arch: the model.
        hardware: the GPUs; None when unknown (the plan then has no verdict).
        stage: ZeRO stage 0-3.
        micro_batch: ``train_micro_batch_size_per_gpu`` / ``per_device_train_batch_size``.
        seq_len: tokens per sample (``cutoff_len``, ``max_seq_length``): the longest batch sets the peak.
        grad_accum: gradient accumulation steps (keeps the global batch in ``--search``).
        gradient_checkpointing: activation recomputation on (non-reentrant, per decoder layer).
        lora_rank: LoRA rank, None without LoRA (full or freeze tuning).
        lora_targets: the modules LoRA wraps: None for all linear layers, names PEFT matches (``("q_proj",
            "v_proj")``), or one regular expression.
        lora_rank_pattern: PEFT's per-module ranks, (pattern, rank) pairs.
        dora: DoRA adapters (a magnitude vector per wrapped layer).
        modules_to_save: modules PEFT copies as trainable beside LoRA (``additional_target``): whole trainable
            copies, with fp32 master weights and AdamW states.
        freeze: LLaMA-Factory's freeze tuning (:class:`Freeze`), None otherwise.
        quant_bits: bitsandbytes quantization of the frozen base (4: QLoRA, 8), None without.
        double_quant: 4-bit: the scales quantized again (``bnb_4bit_use_double_quant``).
        fused_loss: ``liger`` (Liger's fused linear cross-entropy) or ``cce`` (cut cross-entropy): the loss never
            holds the whole logits.
        optimizer: ``adamw`` (two fp32 states per element) or ``adamw_8bit`` (bitsandbytes: two 8-bit states).
        trainer_optimizer: the HF Trainer builds the optimizer (a launch through the Trainer or LLaMA-Factory whose
            DeepSpeed config has no ``optimizer`` section): ``create_optimizer`` puts biases and norm weights in a
            group of their own without weight decay, and DeepSpeed flattens each group apart, emptying the cache
            before each (``stage_1_and_2.py``); its default ``adamw_torch_fused`` steps in place. False: DeepSpeed
            builds it from the config, one group (``deepspeed_init`` hands it the trainable parameters as one list).
        not_modelled: settings the launch gives that the plan does not model, as (setting with where it is, what the
            figure assumes instead): listed with the plan, which is then approximate.
        offload_optimizer / offload_param: ``none``, ``cpu`` or ``nvme``.
        torch_adam: the optimizer is torch's AdamW (the config's ``optimizer.params.torch_adam``, or a client
            optimizer allowed by ``zero_force_ds_cpu_optimizer: false``) rather than DeepSpeed's own (CPUAdam when
            offloaded, FusedAdam on the GPU) or the Trainer's fused AdamW: torch's foreach step makes fp32 temporaries
            of the partition (two on the host; on the GPU the square root of ``exp_avg_sq``), the others update in
            place.
        overlap_comm: DeepSpeed ``overlap_comm`` (default True for stage 3, False otherwise).
        reduce_bucket_size / prefetch_bucket_size / param_persistence_threshold / max_live_parameters:
            ZeRO bucket settings in elements (DeepSpeed defaults; HF "auto" resolves to h², 0.9h², 10h).
        max_reuse_distance: ``stage3_max_reuse_distance`` (elements): gathered parameters reused within
            it stay gathered, up to ``max_live_parameters``.
        sub_group_size: ZeRO-3's ``sub_group_size`` (elements): the optimizer step runs one sub-group
            of the partition at a time.
        zero_init: ZeRO-3 model built inside ``deepspeed.zero.Init`` (partitioned from the start: HF
            Trainer, accelerate, LLaMA-Factory); False for a script that builds the whole model and then
            calls ``deepspeed.initialize`` (every GPU holds the whole 16-bit model during init), and always False
            with ``quant_bits`` (:data:`QUANTIZED_BUILD`).
        hpz_partition_size: ZeRO++ ``zero_hpz_partition_size`` (1: off): a secondary copy of the 16-bit
            parameters partitioned within a node.
        host_mem_bytes: host RAM of one node (``--host-mem`` or detected), None when unknown.
        attn: attention implementation (``sdpa``, ``eager``, ``flash``).
        kv_cache: the training forward keeps transformers' key/value cache: the model is called without
            ``use_cache=False`` and its config's ``use_cache`` is on (a script calling the model itself, or the HF
            Trainer before transformers 5). LLaMA-Factory turns it off for training (``model_utils/kv_cache.py``),
            and so does transformers 5's Trainer (``TrainingArguments.use_cache``, default False); gradient
            checkpointing turns it off in any case. It changes what freeze tuning's frozen front layers keep.
        expandable_segments: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (LLaMA-Factory sets it).
        disk_write_bytes_per_s: checkpoint write speed of the disk the run saves to.
        save_total_limit: checkpoints kept (None: all are kept).
        save_steps: steps between saves, if known.
        exclude_frozen: whether saves leave frozen (LoRA base) weights out; None: work it out.
        gather_16bit_on_save: ``stage3_gather_16bit_weights_on_model_save``.
        save_only_model: ``save_only_model`` (skips optimizer state only where gather is on, FACTS A).
        collective_timeout_s: the timeout a save must finish within (NCCL groups DeepSpeed clones keep
            torch's 10 min, FACTS B).
        disk_free_bytes: free space where checkpoints go, None when unknown.
        max_steps: optimizer steps the launch trains (``max_steps``), None when it does not say.
        epochs: passes over the data (``num_train_epochs``; the Trainer's 3.0 when training arguments leave it out),
            None without training arguments.
        max_samples: LLaMA-Factory's ``max_samples``: each dataset cut to at most this many samples.
        samples: training samples of the dataset, as the user gives them (``--samples``), None when unknown.
        world: processes when no hardware is given (from the launch), else ignored.
        flavour: the training-arguments dialect (``llamafactory``, ``hf``), for naming suggested changes.
        sources: field name -> where its value came from (flag, file:line, default).
    """

    arch: Architecture
    hardware: Optional[Hardware] = None
    stage: int = 2
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    gradient_checkpointing: bool = False
    lora_rank: Optional[int] = None
    lora_targets: Union[None, str, Tuple[str, ...]] = None
    lora_rank_pattern: Tuple[Tuple[str, int], ...] = ()
    dora: bool = False
    modules_to_save: Tuple[str, ...] = ()
    freeze: Optional[Freeze] = None
    quant_bits: Optional[int] = None
    double_quant: bool = False
    fused_loss: Optional[str] = None
    optimizer: str = "adamw"
    trainer_optimizer: bool = False
    offload_optimizer: str = "none"
    offload_param: str = "none"
    torch_adam: bool = False
    overlap_comm: Optional[bool] = None
    reduce_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    zero_init: bool = True
    hpz_partition_size: int = 1
    host_mem_bytes: Optional[int] = None
    attn: str = "sdpa"
    kv_cache: bool = False
    expandable_segments: bool = False
    disk_write_bytes_per_s: float = 1.0 * GB
    save_total_limit: Optional[int] = None
    save_steps: Optional[int] = None
    exclude_frozen: Optional[bool] = None
    gather_16bit_on_save: bool = False
    save_only_model: bool = False
    collective_timeout_s: float = 600.0
    disk_free_bytes: Optional[int] = None
    max_steps: Optional[int] = None
    epochs: Optional[float] = None
    max_samples: Optional[int] = None
    samples: Optional[int] = None
    world: int = 1
    flavour: Optional[str] = None
    not_modelled: Tuple[Tuple[str, str], ...] = ()
    sources: Dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.quant_bits is not None and self.zero_init:  # one fact, here: every reader sees the build as it is
            object.__setattr__(self, "zero_init", False)
            object.__setattr__(self, "sources", {**self.sources, "zero_init": QUANTIZED_BUILD})

    @property
    def world_size(self) -> int:
        return self.hardware.world_size if self.hardware else self.world

    @property
    def overlap(self) -> bool:
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm

    def with_(self, **changes) -> "PlanInputs":
        """A copy with some fields changed (sources of changed fields become ``search``)."""
        sources = dict(self.sources)
        sources.update({k: "search" for k in changes})
        return replace(self, sources=sources, **changes)

    def validate(self) -> None:
        """Raise one InputError naming every value out of range."""
        bad = []
        if self.stage not in (0, 1, 2, 3):
            bad.append(f"ZeRO stage {self.stage} (0-3)")
        for name in ("micro_batch", "seq_len", "grad_accum"):
            if getattr(self, name) < 1:
                bad.append(f"{name} {getattr(self, name)} (at least 1)")
        if self.lora_rank is not None and self.lora_rank < 1:
            bad.append(f"lora_rank {self.lora_rank} (at least 1)")
        if self.freeze is not None and self.lora_rank is not None:
            bad.append("freeze tuning and LoRA together (one fine-tuning method)")
        if self.quant_bits is not None and (self.quant_bits not in QUANT_BITS or self.lora_rank is None):
            bad.append(f"quantization to {self.quant_bits} bits: bitsandbytes quantizes to 4 or 8 bits, and only "
                       "adapters train on a quantized model (LLaMA-Factory and PEFT refuse full or freeze tuning)")
        if self.optimizer not in OPTIMIZERS or (self.fused_loss is not None and self.fused_loss not in FUSED_LOSSES):
            bad.append(f"optimizer {self.optimizer!r} ({', '.join(OPTIMIZERS)}) or fused loss {self.fused_loss!r} "
                       f"({', '.join(FUSED_LOSSES)})")
        for name in ("offload_optimizer", "offload_param"):
            if getattr(self, name) not in OFFLOAD_DEVICES:
                bad.append(f"{name} {getattr(self, name)!r} (none, cpu, nvme)")
        if self.offload_optimizer != "none" and self.stage == 0:
            bad.append(f"offload_optimizer {self.offload_optimizer} needs ZeRO stage 1-3 (stage is 0)")
        if self.offload_param != "none" and self.stage != 3:
            bad.append(f"offload_param {self.offload_param} needs ZeRO stage 3 (stage is {self.stage})")
        if self.attn not in ATTENTION:
            bad.append(f"attn {self.attn!r} (sdpa, eager, flash)")
        if self.sub_group_size < 1 or self.max_live_parameters < 0 or self.max_reuse_distance < 0:
            bad.append("sub_group_size must be positive; live-parameter limits not negative")
        if self.hpz_partition_size < 1 or (self.hardware and self.hardware.gpus_per_node % self.hpz_partition_size):
            bad.append(f"zero_hpz_partition_size {self.hpz_partition_size} (must divide the GPUs per node)")
        if self.samples is not None and self.samples < 1:
            bad.append(f"samples {self.samples} (at least 1)")
        if self.epochs is not None and not self.epochs > 0:
            bad.append(f"epochs {self.epochs} (more than 0)")
        if self.disk_write_bytes_per_s <= 0:
            bad.append("disk write speed must be positive")
        if bad:
            raise InputError("plan inputs out of range: " + "; ".join(bad))
