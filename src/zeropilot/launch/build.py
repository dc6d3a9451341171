"""How a launch builds its model: inside ``deepspeed.zero.Init`` (partitioned from the start) or whole.

Read from a training script's ``ast`` (never run), torch-free, for ``plan`` and the rules' facts layer.
The HF Trainer, accelerate and LLaMA-Factory build a ZeRO-3 model inside ``zero.Init`` themselves
(``HfDeepSpeedConfig`` / ``is_deepspeed_zero3_enabled``); a script that calls ``deepspeed.initialize``
builds whatever it builds: whole, unless it enters ``deepspeed.zero.Init`` (or creates an
``HfDeepSpeedConfig`` before loading, which makes ``from_pretrained`` do it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

_ZERO_INIT_MARKERS = ("zero.Init", "HfDeepSpeedConfig", "TrainingArguments", "Trainer(", "SFTTrainer", "Accelerator(")


@dataclass(frozen=True)
class ModelBuild:
    """What a script says about building the model.

    Attributes:
        calls_initialize: the script calls ``deepspeed.initialize``.
        zero_init: True when the model is built inside ``zero.Init`` (or by a library that does),
            False for a raw ``deepspeed.initialize`` script without it, None when the script says neither.
        line: the ``deepspeed.initialize`` call's line (or the marker's), for messages.
        reason: why, in words.
    """

    calls_initialize: bool
    zero_init: Optional[bool]
    line: Optional[int]
    reason: str


def _name(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # odd trees
        return ""


def model_build(tree: ast.AST) -> ModelBuild:
    """Whether the script in ``tree`` builds its model inside ``zero.Init``."""
    init_line, marker = None, None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _name(node.func)
            if func.endswith("deepspeed.initialize") and init_line is None:
                init_line = node.lineno
            text = func + "("
            for m in _ZERO_INIT_MARKERS:
                if marker is None and (m in text or m == func):
                    marker = (m, node.lineno)
    if marker is not None:
        return ModelBuild(init_line is not None, True, marker[1],
                          f"line {marker[1]}: {marker[0].rstrip('(')} builds a ZeRO-3 model inside zero.Init")
    if init_line is not None:
        return ModelBuild(True, False, init_line, f"line {init_line}: deepspeed.initialize without "
                          "deepspeed.zero.Init: every GPU holds the whole 16-bit model until it partitions it")
    return ModelBuild(False, None, None, "the script calls neither deepspeed.initialize nor zero.Init")
