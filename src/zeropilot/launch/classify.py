"""Telling a DeepSpeed config from training arguments from an accelerate config, by their keys."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

# Top-level keys that only a DeepSpeed config has.
DS_MARKERS = frozenset({
    "zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_clipping",
    "zero_allow_untested_optimizer", "steps_per_print", "wall_clock_breakdown", "fp16", "bf16",
    "activation_checkpointing", "optimizer", "scheduler", "zero_force_ds_cpu_optimizer",
    "communication_data_type", "prescale_gradients", "gradient_predivide_factor", "amp",
    "flops_profiler", "aio", "tensorboard", "comms_logger", "data_types", "compression_training",
    "sparse_attention", "elasticity", "pipeline", "autotuning", "checkpoint",
})
# Keys that only training arguments (HF TrainingArguments, LLaMA-Factory, axolotl) have.
TRAIN_MARKERS = frozenset({
    "output_dir", "per_device_train_batch_size", "learning_rate", "num_train_epochs", "model_name_or_path",
    "save_steps", "logging_steps", "finetuning_type", "cutoff_len", "dataset", "template", "deepspeed",
    "max_steps", "lr_scheduler_type", "warmup_ratio", "base_model", "micro_batch_size", "save_strategy",
    "ddp_timeout", "save_only_model", "stage", "lora_rank", "do_train", "overwrite_output_dir",
})
LLAMAFACTORY_MARKERS = frozenset({
    "finetuning_type", "cutoff_len", "template", "lora_target", "lora_rank", "stage", "dataset_dir",
    "preprocessing_num_workers", "overwrite_cache", "plot_loss", "trust_remote_code", "dataset",
})
AXOLOTL_MARKERS = frozenset({"base_model", "micro_batch_size", "datasets", "sequence_len", "adapter",
                             "load_in_8bit", "load_in_4bit", "wandb_project"})
ACCELERATE_MARKERS = frozenset({"compute_environment", "distributed_type", "deepspeed_config",
                                "num_processes", "mixed_precision", "num_machines", "machine_rank",
                                "main_training_function", "downcast_bf16", "use_cpu"})
# gpt-neox YAML mixes its own keys with DeepSpeed's; it is neither of the above.
NEOX_MARKERS = frozenset({"num_layers", "hidden_size", "num_attention_heads", "seq_length",
                          "pipe_parallel_size", "model_parallel_size", "tokenizer_type"})


def _score(keys: Iterable[str], markers: frozenset) -> int:
    return sum(1 for k in keys if k in markers)


def classify(keys: Iterable[str], fmt: str, scalar_keys: Iterable[str] = ()) -> Tuple[str, Optional[str]]:
    """(kind, flavour) of a config file from its top-level keys.

    kind is ``ds_config``, ``train_args``, ``accelerate`` or ``other``; flavour (train_args only) is
    ``llamafactory``, ``axolotl`` or ``hf``. ``scalar_keys`` are the keys whose values are not mappings:
    ``fp16: true`` is a training argument, ``fp16: {enabled: true}`` a DeepSpeed section.
    """
    keys = set(keys)
    flags = {"fp16", "bf16"} & set(scalar_keys)
    keys -= flags
    # NeoX writes its own keys with hyphens as often as with underscores (num-layers, hidden-size).
    if _score({k.replace("-", "_") for k in keys}, NEOX_MARKERS) >= 2:
        return "other", "gpt-neox"
    ds = _score(keys, DS_MARKERS)
    train = _score(keys, TRAIN_MARKERS) + len(flags)
    acc = _score(keys, ACCELERATE_MARKERS)
    if acc >= 2 and ("distributed_type" in keys or "compute_environment" in keys):
        return "accelerate", None
    if train > ds and train >= 1:
        if _score(keys, AXOLOTL_MARKERS) >= 2:
            return "train_args", "axolotl"
        if _score(keys, LLAMAFACTORY_MARKERS) >= 2:
            return "train_args", "llamafactory"
        return "train_args", "hf"
    if ds >= 1:
        return "ds_config", None
    return "other", None
