"""Rules about known failures of particular version combinations (DeepSpeed × transformers × accelerate).

A version-gated rule fires only when the versions it needs are known (installed, ``--versions``, or a
requirements file); vendor builds such as ``0.14.2+das.opt1.dtk25041`` compare by their public version.
"""

from __future__ import annotations

from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.document import Document
from zeropilot.rules.deepspeed_config import zero_stage
from zeropilot.rules.hf_integration import reads_as_hf, train_arg
from zeropilot.rules.registry import Gate, Hit, Severity, rule


def _known(launch: Launch, name: str, spec: str) -> bool:
    """True only when the package's version is known and in ``spec``."""
    return launch.versions.satisfies(name, spec) is True


def _ds_gradient_accumulation(ds: Document) -> Optional[int]:
    node = ds.get("gradient_accumulation_steps")
    if node is None or isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
        return None
    return int(node.value)


def _uses_accumulate(launch: Launch) -> bool:
    return any(".accumulate(" in py.text for py in launch.python_files)


@rule("VR001", "no-sync-assertion-with-zero-2-3", Severity.ERROR,
      packages=("deepspeed", "transformers", "accelerate"), gates=(Gate("deepspeed", ">=0.16.0", False),),
      versions="deepspeed >= 0.16.0 with transformers 4.46.0-4.47.0 (Trainer) or accelerate < 1.9.0 "
               "(accelerate.accumulate)",
      witness="tests/rules/test_versions.py::test_vr001_witness")
def no_sync_assertion_with_zero_2_3(launch: Launch) -> Iterator[Hit]:
    """Gradient accumulation under ZeRO-2/3 with versions whose Trainer or accelerate call `engine.no_sync()`.

    DeepSpeed 0.16.0 (PR #6675) added `DeepSpeedEngine.no_sync()`, which asserts under ZeRO stage 2 and 3.
    transformers 4.46.0 to 4.47.0 call it through `accelerator.no_sync` on every accumulation micro-step
    (fixed in 4.47.1, PR #35157), and `accelerator.accumulate()` of accelerate < 1.9.0 does too (fixed in
    PR #3656). Reported for the Trainer (HF or LLaMA-Factory arguments with `gradient_accumulation_steps` >
    1) and for accelerate scripts calling `accumulate(` with accumulation > 1; only when the versions are
    known.

    ## Why is this bad?
    The first accumulation step fails with `AssertionError: no_sync context manager is incompatible with
    gradient partitioning logic of ZeRO stage 2` (DeepSpeed #6793, transformers #34984, accelerate
    #3481, LlamaFactory #6194). Setting DeepSpeed's `gradient_accumulation_steps` to 1 while the
    Trainer accumulates does not help: the Trainer refuses the mismatch (HF001).

    ## Example
    ```yaml
    # transformers 4.46.1, deepspeed 0.16.0, ZeRO-2 config
    gradient_accumulation_steps: 16
    ```

    ## Use instead
    Upgrade transformers to >= 4.47.1 (and accelerate to >= 1.9.0), keeping `"auto"` in the DeepSpeed
    config; or pin `deepspeed==0.15.4`.

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.no_sync` (DeepSpeed PR #6675, 0.16.0)
    - transformers PR #35157 (4.47.1); accelerate PR #3656 (1.9.0)
    - DeepSpeed #6793, transformers #34984, accelerate #3481, LlamaFactory #6194
    """
    bad_trainer = _known(launch, "transformers", ">=4.46.0,<4.47.1")
    for train, ds in launch.training_pairs():
        stage, ga = zero_stage(ds), train_arg(train, "gradient_accumulation_steps")
        if bad_trainer and reads_as_hf(train) and stage is not None and stage >= 2 and isinstance(ga, int) \
                and ga > 1:
            yield Hit(train, train.get("gradient_accumulation_steps"),
                      f"gradient accumulation {ga} with ZeRO-{stage}: transformers "
                      f"{launch.versions.raw('transformers')} calls engine.no_sync(), which DeepSpeed "
                      f"{launch.versions.raw('deepspeed')} asserts against at the first step — upgrade "
                      f"transformers to >= 4.47.1 (or pin deepspeed 0.15.4); keep \"auto\" in the DeepSpeed config")
    if not (_known(launch, "accelerate", "<1.9.0") and _uses_accumulate(launch)):
        return
    for acc in launch.accelerate_configs:
        ds = launch.ds_config_for(acc)
        ga = _ds_gradient_accumulation(ds) if ds is not None else None
        node = acc.get("deepspeed_config.gradient_accumulation_steps")
        if ga is None and node is not None and isinstance(node.value, int):
            ga = node.value
        stage = zero_stage(ds) if ds is not None else acc.value("deepspeed_config.zero_stage")
        if isinstance(stage, int) and stage >= 2 and isinstance(ga, int) and ga > 1:
            yield Hit(acc, node or acc.get("deepspeed_config"),
                      f"accelerator.accumulate() with gradient accumulation {ga} under ZeRO-{stage}: accelerate "
                      f"{launch.versions.raw('accelerate')} calls engine.no_sync(), which DeepSpeed asserts "
                      f"against — upgrade accelerate to >= 1.9.0 (or pin deepspeed 0.15.4)")


@rule("VR002", "fractional-auto-prefetch-bucket", Severity.ERROR, packages=("deepspeed", "transformers", "accelerate"),
      gates=(Gate("deepspeed", ">=0.15.0", False),),
      versions="deepspeed >= 0.15.0 with transformers < 4.45.0 (Trainer) or accelerate < 0.31.0",
      witness="tests/rules/test_versions.py::test_vr002_witness")
def fractional_auto_prefetch_bucket(launch: Launch) -> Iterator[Hit]:
    """`stage3_prefetch_bucket_size: "auto"` under ZeRO-3 with an integration that fills it with a float.

    transformers < 4.45.0 (fixed by PR #33402) and accelerate < 0.31.0 (PR #2814) fill this key with
    `0.9 * hidden_size * hidden_size`, a fraction for most models (hidden size 4096 gives 15099494.4).
    Reported only when the versions are known.

    ## Why is this bad?
    DeepSpeed >= 0.15.0 refuses fractional integers: `deepspeed.initialize` raises a pydantic
    ValidationError (`int_from_float`) after the model has loaded (DeepSpeed #6525, LlamaFactory
    #5252/#5586).

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}}
    ```
    with transformers 4.44.2 and deepspeed 0.15.1.

    ## Use instead
    Upgrade transformers to >= 4.45.0 (accelerate >= 0.31.0), or write a whole number:
    ```json
    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 15099494}}
    ```

    ## References
    - transformers PR #33402 (4.45.0), accelerate PR #2814 (0.31.0)
    - DeepSpeed #6525; LlamaFactory #5252, #5586
    """
    old_hf = _known(launch, "transformers", "<4.45.0")
    old_acc = _known(launch, "accelerate", "<0.31.0")
    for ds in launch.ds_configs:
        node = ds.get("zero_optimization.stage3_prefetch_bucket_size")
        if node is None or node.value != "auto" or zero_stage(ds) != 3:
            continue
        hf = launch.uses_hf_integration(ds) is not False
        if old_hf and hf:
            who = f"transformers {launch.versions.raw('transformers')}"
        elif old_acc and hf and launch.accelerate_configs:
            who = f"accelerate {launch.versions.raw('accelerate')}"
        else:
            continue
        yield Hit(ds, node, f"{who} fills \"auto\" with 0.9·hidden², a fraction for most models (15099494.4 for "
                            f"hidden size 4096), which DeepSpeed {launch.versions.raw('deepspeed')} refuses "
                            f"(int_from_float) — upgrade transformers >= 4.45.0 / accelerate >= 0.31.0, or write "
                            f"a whole number")
