"""DeepSpeed's and the HF Trainer's checkpoint file and folder names: the one place zeropilot spells them.

Plain data and regular expressions, importable at no cost (``zeropilot check`` uses it while it walks a
launch folder). What the files hold and how they fit together is :mod:`zeropilot.checkpoint.layout`.
Names are those of DeepSpeed 0.19.8 (FACTS.md C) and transformers' ``Trainer``.
"""

from __future__ import annotations

import re

LATEST_FILE = "latest"
ZERO_TO_FP32_SCRIPT = "zero_to_fp32.py"
MODEL_STATES_SUFFIX = "_model_states.pt"
OPTIM_STATES_SUFFIX = "_optim_states.pt"
# ZeRO-1/2 write one module file, from data-parallel rank 0.
ZERO12_MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_PREFIXES = ("bf16_", "fp16_", "")

# The universal layout (``ds_to_universal.py``; loaded with ``"checkpoint": {"load_universal": true}``):
# ``save_dir/latest_universal`` names the tag; ``<tag>/`` holds the model-states files and ``zero/``, with
# ``zero/optimizer_state.pt`` and one folder per parameter holding ``<state>.pt`` files (``fp32.pt``,
# ``exp_avg.pt``, ``exp_avg_sq.pt``, ZeRO-1/2 also ``step.pt``).
LATEST_UNIVERSAL_FILE = "latest_universal"
UNIVERSAL_ZERO_DIR = "zero"
UNIVERSAL_OPTIMIZER_FILE = "optimizer_state.pt"
UNIVERSAL_STATE_SUFFIX = ".pt"
UNIVERSAL_FP32 = "fp32"
UNIVERSAL_STEP = "step"

MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
OPTIM_RE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
HF_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
GLOBAL_STEP_RE = re.compile(r"^global_step(\d+)$")

# Files of the Hugging Face / PEFT world that export copies or inspect reports.
HF_MODEL_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
)
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
TRAINER_FILES = ("trainer_state.json", "training_args.bin", "scheduler.pt", "rng_state.pth")
RNG_STATE_RE = re.compile(r"^rng_state_\d{1,6}\.pth$")  # the Trainer's per-process RNG states
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")


def is_checkpoint_dir(name: str) -> bool:
    """Whether a folder name is an HF ``checkpoint-N`` or a DeepSpeed ``global_stepN`` tag."""
    return bool(HF_CHECKPOINT_RE.match(name) or GLOBAL_STEP_RE.match(name))
