"""Rules about accelerate launch configs (``accelerate launch --config_file``) and the DeepSpeed config they use."""

from __future__ import annotations

from typing import Iterator

from zeropilot.launch import Launch
from zeropilot.rules.registry import Hit, Severity, rule

# accelerate/utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks: settings that a
# deepspeed_config_file replaces (the env names there, less ACCELERATE_/DEEPSPEED_, lower-cased).
IGNORED_WITH_CONFIG_FILE = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                            "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                            "offload_optimizer_nvme_path", "zero3_save_16bit_model")


def _mixed_precision_on_command_line(launch: Launch) -> bool:
    return any(lc.launcher == "accelerate" and "mixed_precision" in lc.flags for lc in launch.commands)


@rule("AC001", "accelerate-setting-duplicates-deepspeed-config-file", Severity.ERROR, packages=("accelerate",),
      versions="accelerate with deepspeed_config_file support (verified on 1.15.0)",
      witness="tests/rules/test_accelerate_config.py::test_ac001_witness")
def accelerate_setting_duplicates_deepspeed_config_file(launch: Launch) -> Iterator[Hit]:
    """An accelerate config names a `deepspeed_config_file` and also sets what that file decides.

    `gradient_accumulation_steps`, `gradient_clipping`, `zero_stage`, `offload_*_device`,
    `offload_*_nvme_path`, `zero3_save_16bit_model` under `deepspeed_config`, and a top-level
    `mixed_precision` (any value, `no` included, unless `--mixed_precision` is given on the command line).

    ## Why is this bad?
    `accelerate launch` passes the names of these settings to the training processes, and
    `DeepSpeedPlugin` raises `ValueError: When using deepspeed_config_file, the following accelerate config
    variables will be ignored: [...]` in every process as the Accelerator is built.

    ## Example
    ```yaml
    distributed_type: DEEPSPEED
    mixed_precision: bf16
    deepspeed_config:
      deepspeed_config_file: ds_z3.json
      zero_stage: 3
    ```

    ## Use instead
    ```yaml
    distributed_type: DEEPSPEED
    deepspeed_config:
      deepspeed_config_file: ds_z3.json
    ```
    with the stage and `"bf16": {"enabled": "auto"}` (or `true`) in `ds_z3.json`.

    ## References
    - `accelerate/utils/dataclasses.py` `DeepSpeedPlugin._deepspeed_config_checks`
    - `accelerate/commands/launch.py` `launch_command` (`deepspeed_fields_from_accelerate_config`)
    """
    mp_on_cli = _mixed_precision_on_command_line(launch)
    for doc in launch.accelerate_configs:
        ds_section = doc.get("deepspeed_config")
        if ds_section is None or not ds_section.is_mapping or ds_section.child("deepspeed_config_file") is None:
            continue
        for key in IGNORED_WITH_CONFIG_FILE:
            node = ds_section.child(key)
            if node is not None:
                yield Hit(doc, node, f"`deepspeed_config.{key}` is set together with `deepspeed_config_file`: "
                                     f"accelerate raises a ValueError at start-up — set it in the DeepSpeed "
                                     f"config file and remove it here")
        mp = doc.get("mixed_precision")
        if mp is not None and mp.value is not None and not mp_on_cli:
            yield Hit(doc, mp, "`mixed_precision` is set together with `deepspeed_config.deepspeed_config_file`: "
                               "accelerate raises a ValueError at start-up — set fp16/bf16 in the DeepSpeed config "
                               "file and remove it here (or pass --mixed_precision on the command line)")


@rule("AC002", "deepspeed-config-without-zero-section", Severity.ERROR, packages=("accelerate", "transformers"),
      versions="accelerate versions with DeepSpeedPlugin(hf_ds_config=...) (all recent; verified 1.15.0)",
      witness="tests/rules/test_accelerate_config.py::test_ac002_witness")
def deepspeed_config_without_zero_section(launch: Launch) -> Iterator[Hit]:
    """A DeepSpeed config read through accelerate (accelerate launch or the HF Trainer) has no `zero_optimization`.

    Reported only for configs that a training-args or accelerate config of the launch names.

    ## Why is this bad?
    `DeepSpeedPlugin` raises `ValueError: Please specify the ZeRO optimization config in the DeepSpeed
    config.` The HF Trainer builds this plugin from `--deepspeed` when `TrainingArguments` is created, so the
    run stops before the model loads.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}}
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 0}}
    ```

    ## References
    - `accelerate/utils/dataclasses.py` `DeepSpeedPlugin.__post_init__`
    - `transformers/training_args.py` (`DeepSpeedPlugin(hf_ds_config=...)`)
    """
    seen = set()
    for ds in launch.links.values():
        if id(ds) in seen or ds.kind != "ds_config" or not ds.root.is_mapping:
            continue
        seen.add(id(ds))
        if ds.get("zero_optimization") is None:
            yield Hit(ds, None, "no `zero_optimization` section: accelerate (and the HF Trainer through it) raises "
                                "\"Please specify the ZeRO optimization config\" — add one (`{\"stage\": 0}` for "
                                "no ZeRO)", line=1, key="zero_optimization")
