"""Checkpoint size and save time of ``engine.save_checkpoint`` (DeepSpeed 0.19.8 layout, FACTS C).

Stage 1/2: rank 0 writes ``mp_rank_00_model_states.pt`` (the whole 16-bit module, plus
``frozen_param_fragments`` of frozen weights unless they are excluded) and every rank writes
``[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`` (its fp32 master + AdamW slice: 12 B per element).
Stage 3: every rank writes ``zero_pp_rank_R_mp_rank_00_model_states.pt`` (its slice of frozen weights
unless excluded; placeholders otherwise) and its optimizer slice. Measured on an H200 (FACTS C): Qwen2.5-7B
+ LoRA r16 wrote 15.7 GB per save at ZeRO-3 and 31.0 GB at ZeRO-2 with frozen weights included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from zeropilot.memory import tuning
from zeropilot.memory.inputs import PlanInputs
from zeropilot.models.params import count_params


@dataclass(frozen=True)
class Checkpoint:
    """One save.

    Attributes:
        total_bytes: all files of one save.
        per_rank_bytes: the most any one rank writes.
        frozen_bytes: how much of ``total_bytes`` is frozen (LoRA base) weight.
        excludes_frozen: whether frozen weights are left out.
        save_seconds: time to write it at the disk speed (ranks write in parallel to one disk).
        disk_peak_bytes: checkpoints on disk at the moment of a save (``save_total_limit + 1``), or None
            when every checkpoint is kept.
        reason: why frozen weights are or are not in it, and the files.
    """

    total_bytes: int
    per_rank_bytes: int
    frozen_bytes: int
    excludes_frozen: bool
    save_seconds: float
    disk_peak_bytes: Optional[int]
    reason: str


def _excludes_frozen(inputs: PlanInputs) -> "tuple[bool, str]":
    if inputs.exclude_frozen is not None:
        return inputs.exclude_frozen, "as set"
    if inputs.freeze is not None:
        return False, ("freeze tuning is no PEFT model: HF Trainer calls save_checkpoint without "
                       "exclude_frozen_parameters, so the frozen weights are written on every save")
    if inputs.lora_rank is None:
        return True, "full fine-tuning: nothing is frozen"
    if inputs.stage == 3 and not inputs.gather_16bit_on_save:
        return False, ("HF Trainer's save_model falls back to engine.save_checkpoint without "
                       "exclude_frozen_parameters under ZeRO-3 with stage3_gather_16bit_weights_on_model_save "
                       "false: the frozen base is written on every save (FACTS C)")
    return True, "HF Trainer passes exclude_frozen_parameters=True for PEFT models"


def estimate_checkpoint(inputs: PlanInputs, params: int, trainable: int) -> Checkpoint:
    """Bytes and seconds of one ``save_checkpoint`` of ``inputs``."""
    n = inputs.world_size
    frozen = params - trainable
    if inputs.save_only_model and (inputs.stage < 3 or inputs.gather_16bit_on_save):
        size = 2 * (trainable if inputs.lora_rank else params)
        return Checkpoint(size, size, 0, True, size / inputs.disk_write_bytes_per_s,
                          None if inputs.save_total_limit is None else size * (inputs.save_total_limit + 1),
                          "save_only_model: only the 16-bit model (the adapter for LoRA), gathered on rank 0; "
                          "not resumable (FACTS A)")
    excl, why = _excludes_frozen(inputs)
    frozen_written = 0 if excl else frozen
    if frozen_written and inputs.quant_bits is not None:  # the quantized base: its packed bytes and state, in halves
        packed, state, _ = tuning.frozen_base_bytes(inputs, count_params(inputs.arch), trainable)
        frozen_written = (packed + state) / 2
    optim = (4 + tuning.adam_bytes(inputs)) * trainable  # fp32 master + the optimizer's states
    if inputs.stage == 3:
        model = 2 * frozen_written
        per_rank = (model + optim) / n
        files = "per rank: model_states (frozen slice) + optim_states (fp32 master + AdamW slice)"
    else:
        module = 2 * (params if frozen_written else trainable)
        model = module + 2 * frozen_written  # the module state dict, plus frozen_param_fragments
        per_rank = model + optim / n
        files = "rank 0: model_states (16-bit module); every rank: optim_states slice"
    total = model + optim
    seconds = total / inputs.disk_write_bytes_per_s
    disk_peak = None if inputs.save_total_limit is None else int(total * (inputs.save_total_limit + 1))
    return Checkpoint(int(total), int(per_rank), int(2 * frozen_written), excl, seconds, disk_peak,
                      f"{files}; frozen weights {'left out' if excl else 'written'}: {why}")
