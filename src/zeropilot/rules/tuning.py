"""Rules about how a launch tunes the model (quantization, optimizers, adapters, kernels) together with DeepSpeed:
combinations the training library refuses before the first step.

The settings are those the launch facts read (:mod:`zeropilot.launch.settings`); LLaMA-Factory's names and defaults
are its v0.9.5 ones.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, NamedTuple, Optional

from zeropilot.launch import Launch
from zeropilot.launch.document import Document
from zeropilot.launch.values import truthy
from zeropilot.rules.deepspeed_config import zero_stage
from zeropilot.rules.registry import Hit, Severity, rule


class Refusal(NamedTuple):
    """One combination LLaMA-Factory refuses: the key the finding points at, when it applies, LLaMA-Factory's error
    (verbatim), where it is raised and what to do instead."""

    key: str
    applies: Callable[[Document, Optional[int]], bool]
    error: str
    where: str
    instead: str


def _on(doc: Document, key: str) -> bool:
    return truthy(doc.value(key)) is True


def _quant_bits(doc: Document) -> Any:
    value = doc.value("quantization_bit")
    return None if value is None or value == "" else value


def _bnb(doc: Document) -> bool:
    method = doc.value("quantization_method")
    return method is None or str(method).strip().lower() == "bnb"


#: LLaMA-Factory v0.9.5's refusals of a memory setting with DeepSpeed (``stage``: the config's ZeRO stage).
REFUSALS: List[Refusal] = [
    Refusal("quantization_bit",
            lambda d, stage: stage == 3 and _bnb(d) and _quant_bits(d) is not None and str(_quant_bits(d)) != "4",
            "Only 4-bit quantized model can use fsdp+qlora or auto device map.",
            "model/model_utils/quantization.py:186-188",
            "quantization_bit: 4 (QLoRA; LLaMA-Factory then sets bnb_4bit_quant_storage to the compute dtype, "
            "which ZeRO-3 needs to partition the packed weights), or ZeRO-2"),
    Refusal("quantization_method",
            lambda d, stage: stage == 3 and _quant_bits(d) is not None
            and str(d.value("quantization_method") or "").strip().lower() == "hqq",
            "HQQ quantization is incompatible with DeepSpeed ZeRO-3 or FSDP.",
            "model/model_utils/quantization.py:199-200",
            "quantization_method: bnb with quantization_bit: 4, or ZeRO-2"),
    Refusal("use_galore", lambda d, stage: _on(d, "use_galore"),
            "GaLore and APOLLO are incompatible with DeepSpeed yet.", "hparams/parser.py:400-401",
            "drop use_galore (plain AdamW, or optim: adamw_bnb_8bit for smaller optimizer states), or train "
            "without DeepSpeed"),
    Refusal("use_apollo", lambda d, stage: _on(d, "use_apollo"),
            "GaLore and APOLLO are incompatible with DeepSpeed yet.", "hparams/parser.py:400-401",
            "drop use_apollo, or train without DeepSpeed"),
    Refusal("pissa_init", lambda d, stage: stage == 3 and _on(d, "pissa_init"),
            "Please use scripts/pissa_init.py to initialize PiSSA in DeepSpeed ZeRO-3.", "hparams/parser.py:377-378",
            "run LLaMA-Factory's scripts/pissa_init.py first and train from its output without pissa_init"),
    Refusal("pure_bf16", lambda d, stage: stage == 3 and _on(d, "pure_bf16"),
            "`pure_bf16` is incompatible with DeepSpeed ZeRO-3.", "hparams/parser.py:384-385",
            "bf16: true (mixed precision with DeepSpeed's fp32 master weights), or ZeRO-2"),
    Refusal("fp8", lambda d, stage: _on(d, "fp8") and not _on(d, "use_mca") and _quant_bits(d) is not None,
            "FP8 training is not compatible with quantization. Please disable one of them.",
            "hparams/parser.py:403-404", "drop fp8 or quantization_bit"),
    Refusal("use_unsloth", lambda d, stage: stage == 3 and _on(d, "use_unsloth"),
            "Unsloth is incompatible with DeepSpeed ZeRO-3.", "hparams/parser.py:409-410",
            "drop use_unsloth, or ZeRO-2"),
    Refusal("use_kt", lambda d, stage: stage == 3 and _on(d, "use_kt"),
            "KTransformers is incompatible with DeepSpeed ZeRO-3.", "hparams/parser.py:412-413",
            "drop use_kt, or ZeRO-2"),
]


@rule("LF001", "llamafactory-refuses-setting-with-deepspeed", Severity.ERROR, packages=("deepspeed",),
      versions="LLaMA-Factory 0.9.5 (the refusals as its source has them)",
      witness="fixture:tests/rules/test_tuning.py::test_lf001_witness; LLaMA-Factory 0.9.5 hparams/parser.py:377-413 "
              "and model/model_utils/quantization.py:166-200, run verbatim (the library is not installed)")
def llamafactory_refuses_setting_with_deepspeed(launch: Launch) -> Iterator[Hit]:
    """A LLaMA-Factory YAML combines DeepSpeed with a setting LLaMA-Factory refuses with it: 8-bit (or HQQ)
    quantization under ZeRO-3, GaLore or APOLLO with any DeepSpeed config, PiSSA initialisation, `pure_bf16`,
    Unsloth or KTransformers under ZeRO-3, fp8 with quantization.

    ## Why is this bad?
    LLaMA-Factory raises a `ValueError` while it parses the arguments or loads the model, on every rank, before
    the first step: the launch never trains. Under ZeRO-3 it loads a bitsandbytes model without a device map and
    with `bnb_4bit_quant_storage` set to the compute dtype, which only its 4-bit path supports; GaLore's and
    APOLLO's layer-wise optimizers do not go through DeepSpeed's engine.

    ## Example
    ```yaml
    finetuning_type: lora
    quantization_bit: 8
    deepspeed: ds_z3_config.json
    ```

    ## Use instead
    ```yaml
    finetuning_type: lora
    quantization_bit: 4
    deepspeed: ds_z3_config.json
    ```

    ## References
    - LLaMA-Factory v0.9.5 `hparams/parser.py` `_check_extra_dependencies` / `get_train_args` (lines 377-413)
    - LLaMA-Factory v0.9.5 `model/model_utils/quantization.py` `configure_quantization` (lines 166-200)
    """
    for train, ds in launch.training_pairs():
        if train.flavour != "llamafactory":
            continue
        stage = zero_stage(ds)
        for r in REFUSALS:
            if r.applies(train, stage):
                under = f"DeepSpeed ZeRO-{stage}" if stage is not None else "DeepSpeed"
                yield Hit(train, train.get(r.key),
                          f"`{r.key}` with {under} ({ds.path.name}): LLaMA-Factory refuses the combination "
                          f"before training (\"{r.error}\", {r.where}); use {r.instead}")
