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


def _copies_key(train: Document, modules_to_save) -> Optional[str]:
    """The YAML key that gives LoRA full copies of modules: ``additional_target``, or ``resize_vocab`` (LLaMA-Factory
    then makes the embedding and the output layer ``additional_target`` itself: ``_setup_lora_tuning``)."""
    if modules_to_save:
        return "additional_target"
    return "resize_vocab" if _on(train, "resize_vocab") else None


def _alternatives(launch: Launch, train: Document) -> str:
    """The two launches that start, with the plan's peak per GPU for each where the model and GPUs are known."""
    from dataclasses import replace

    from zeropilot.memory.inputs import GIB
    from zeropilot.memory.plan import make_plan
    from zeropilot.rules.memory import _plans

    peaks = {}
    for doc, _ds, plan in _plans(launch):
        if doc is train:
            for name, change in (("z2", {"stage": 2}), ("offload", {"offload_param": "cpu"})):
                got = make_plan(replace(plan.inputs, **change))
                peaks[name] = f"; the plan: {got.gpu.peak_bytes / GIB:.1f} GiB per GPU, {got.verdict.kind}"
    return (f"ZeRO-2 (LLaMA-Factory then casts every trainable tensor to fp32{peaks.get('z2', '')}), or "
            f"\"offload_param\": {{\"device\": \"cpu\"}} in zero_optimization (nothing is defragmented"
            f"{peaks.get('offload', '')})")


@rule("LF002", "lora-copies-beside-fp32-adapters-under-zero3", Severity.ERROR, packages=("deepspeed", "peft"),
      versions="LLaMA-Factory 0.9.5, PEFT 0.21, DeepSpeed 0.19.8",
      witness="tests/rules/test_tuning.py::test_lf002_witness")
def lora_copies_beside_fp32_adapters_under_zero3(launch: Launch) -> Iterator[Hit]:
    """A LLaMA-Factory LoRA launch with `additional_target` (or `resize_vocab`, which adds the embedding and the
    output layer to it) under ZeRO-3 with the parameters on the GPU: DeepSpeed stops in `deepspeed.initialize`.

    ## Why is this bad?
    PEFT creates the LoRA adapters in fp32 (`get_peft_model`'s `autocast_adapter_dtype`), and the full copies of
    the `additional_target` modules in the model's bf16. Outside ZeRO-3 LLaMA-Factory then casts every trainable
    tensor to fp32; under ZeRO-3 it does not (`init_adapter`: "remaining trainable params in float32"), and
    DeepSpeed, for a model built in `zero.Init`, casts nothing. ZeRO-3 without `offload_param` copies the trainable
    partitions into one flat buffer (`_create_fp16_partitions_with_defragmentation`), whose `defragment` asserts one
    dtype: an `AssertionError` on every rank once the model has loaded, before the first step (seen on an H200 with
    a 1.5 B model, and on the CPU in the witness).

    ## Example
    ```yaml
    finetuning_type: lora
    additional_target: embed_tokens,lm_head
    deepspeed: ds_z3_config.json
    ```

    ## Use instead
    ```yaml
    finetuning_type: lora
    additional_target: embed_tokens,lm_head
    deepspeed: ds_z2_config.json
    ```

    ## References
    - LLaMA-Factory v0.9.5 `model/adapter.py` `_setup_lora_tuning` (get_peft_model, resize_vocab) and `init_adapter`
      (cast_trainable_params_to_fp32)
    - DeepSpeed 0.19.8 `runtime/zero/stage3.py` `_create_fp16_partitions_with_defragmentation`,
      `runtime/zero/utils.py` `defragment`, `runtime/engine.py` `_configure_distributed_model`
    - Witness: `tests/rules/peft_zero3_probe.py` runs `deepspeed.initialize` on a PEFT model built as LLaMA-Factory
      0.9.5 builds it; on an H200: `bench/plan/settings/data/call1` and `call2`, row `lora_mts`
    """
    from zeropilot.launch.facts import facts

    for train, ds in launch.training_pairs():
        if train.flavour != "llamafactory" or zero_stage(ds) != 3 or facts(launch).for_doc(ds).offload_param:
            continue
        s = facts(launch).settings(train)
        key = _copies_key(train, s.modules_to_save)
        # QLoRA: LLaMA-Factory casts the trainable tensors to fp32; pure_bf16 under ZeRO-3 is LF001's
        if s.method != "lora" or key is None or s.quant_bits is not None or _on(train, "pure_bf16") \
                or _on(train, "use_badam"):
            continue
        yield Hit(train, train.get(key),
                  f"`{key}` with LoRA under DeepSpeed ZeRO-3 ({ds.path.name}): deepspeed.initialize stops with an "
                  "AssertionError before the first step (runtime/zero/utils.py defragment wants one dtype among the "
                  "trainable tensors: PEFT keeps the adapters in fp32, LLaMA-Factory leaves the copies in bf16 under "
                  f"ZeRO-3); use {_alternatives(launch, train)}")
