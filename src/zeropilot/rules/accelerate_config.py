"""Rules about accelerate launch configs (``accelerate launch --config_file``) and the DeepSpeed config they use."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional

from zeropilot.launch import Document, Launch
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
    for ds in launch.hf_linked_configs():
        if id(ds) in seen or ds.kind != "ds_config" or not ds.root.is_mapping:
            continue
        seen.add(id(ds))
        if ds.get("zero_optimization") is None:
            yield Hit(ds, None, "no `zero_optimization` section: accelerate (and the HF Trainer through it) raises "
                                "\"Please specify the ZeRO optimization config\" — add one (`{\"stage\": 0}` for "
                                "no ZeRO)", line=1, key="zero_optimization")


def _ds_for_command(launch: Launch, lc) -> Optional[Document]:
    """The DeepSpeed config an ``accelerate launch`` command uses: its --deepspeed_config_file, or the one its
    accelerate config names."""
    flag = lc.flags.get("deepspeed_config_file")
    if flag and flag[0]:
        name = Path(flag[0]).name
        return next((d for d in launch.ds_configs if d.path.name == name), None)
    for acc in launch.accelerate_configs:
        if lc.config_file and Path(lc.config_file).name == acc.path.name or len(launch.accelerate_configs) == 1:
            return launch.ds_config_for(acc)
    return None


def _cli_precision(launch: Launch, lc) -> Optional[str]:
    flag = lc.flags.get("mixed_precision")
    if flag and flag[0]:
        return flag[0].lower()
    env = lc.command.env.get("ACCELERATE_MIXED_PRECISION") or launch.env().get("ACCELERATE_MIXED_PRECISION")
    return env.value.lower() if env is not None else None


@rule("AC003", "mixed-precision-flag-contradicts-deepspeed-config", Severity.ERROR, packages=("accelerate",),
      versions="accelerate versions with DeepSpeedPlugin.set_mixed_precision (verified 1.15.0)",
      witness="tests/rules/test_accelerate_rules.py::test_ac003_witness")
def mixed_precision_flag_contradicts_deepspeed_config(launch: Launch) -> Iterator[Hit]:
    """`accelerate launch --mixed_precision fp16` (or `ACCELERATE_MIXED_PRECISION`) while the DeepSpeed config
    enables bf16, or `bf16`/`fp8` while it enables fp16.

    ## Why is this bad?
    `DeepSpeedPlugin.set_mixed_precision` raises `ValueError: --mixed_precision arg cannot be set to fp16 when bf16
    is set in the DeepSpeed config file` when the `Accelerator` is created.

    ## Example
    ```bash
    accelerate launch --mixed_precision fp16 --deepspeed_config_file ds.json train.py  # ds.json: bf16 enabled
    ```

    ## Use instead
    ```bash
    accelerate launch --mixed_precision bf16 --deepspeed_config_file ds.json train.py
    ```
    or `"enabled": "auto"` in the DeepSpeed config.

    ## References
    - `accelerate/utils/dataclasses.py` `DeepSpeedPlugin.set_mixed_precision`
    """
    for lc in launch.commands:
        if lc.launcher != "accelerate":
            continue
        prec, ds = _cli_precision(launch, lc), _ds_for_command(launch, lc)
        if prec in (None, "no") or ds is None:
            continue
        other = "bf16" if prec == "fp16" else "fp16"
        node = ds.get(f"{other}.enabled")
        if node is not None and str(node.value).lower() == "true":
            yield Hit(ds, node, f"`{other}.enabled` is true while `accelerate launch` asks for --mixed_precision "
                                f"{prec} ({lc.command.file.name}:{lc.command.line}): accelerate raises a ValueError "
                                f"when the Accelerator starts — use --mixed_precision {other}, or \"auto\" here")


def _prepare_optimizers(launch: Launch) -> Iterator[tuple]:
    """(python file, prepare call, "dummy" | "real") for optimizers passed to ``accelerator.prepare``."""
    import ast

    for py in launch.python_files:
        tree = py.tree
        if tree is None or "prepare(" not in py.text:
            continue
        kinds = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "DummyOptim":
                    kinds[node.targets[0].id] = "dummy"
                elif "optim" in ast.unparse(func) or name in ("AdamW", "Adam", "SGD", "Adafactor", "Lion"):
                    kinds[node.targets[0].id] = "real"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "prepare":
                for arg in node.args:
                    if isinstance(arg, ast.Name) and arg.id in kinds:
                        yield py, node, kinds[arg.id]


def _prepared(launch: Launch, kind: str) -> Iterator[tuple]:
    """(python file, prepare call) for optimizers of ``kind`` ("dummy" | "real") passed to ``prepare``."""
    for py, call, found in _prepare_optimizers(launch):
        if found == kind:
            yield py, call


def _prepare_hit(py, call, message: str) -> Hit:
    """A finding at a ``prepare(...)`` call of a script."""
    return Hit(None, None, message, file=py.path, line=call.lineno, key="prepare")


def _accelerate_ds_configs(launch: Launch) -> List[Document]:
    out = []
    for acc in launch.accelerate_configs:
        ds = launch.ds_config_for(acc)
        if ds is not None and ds not in out:
            out.append(ds)
    for lc in launch.commands:
        ds = _ds_for_command(launch, lc) if lc.launcher == "accelerate" else None
        if ds is not None and ds not in out:
            out.append(ds)
    return out


@rule("AC004", "optimizer-in-config-and-in-prepare", Severity.ERROR, packages=("accelerate",),
      versions="accelerate versions with DummyOptim (verified 1.15.0)",
      witness="tests/rules/test_accelerate_rules.py::test_ac004_witness")
def optimizer_in_config_and_in_prepare(launch: Launch) -> Iterator[Hit]:
    """The DeepSpeed config has an `optimizer` section and the script passes a real torch optimizer to
    `accelerator.prepare()`.

    ## Why is this bad?
    `Accelerator.prepare` raises `ValueError: You cannot specify an optimizer in the config file and in the code
    at the same time`, after the model has loaded.

    ## Example
    ```python
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))  # ds.json has "optimizer"
    ```

    ## Use instead
    ```python
    model, opt = accelerator.prepare(model, accelerate.utils.DummyOptim(model.parameters()))
    ```
    or remove `optimizer` from the DeepSpeed config.

    ## References
    - `accelerate/accelerator.py` `Accelerator._prepare_deepspeed`
    """
    configs = [ds for ds in _accelerate_ds_configs(launch) if ds.get("optimizer") is not None]
    if not configs:
        return
    for py, call in _prepared(launch, "real"):
        yield _prepare_hit(py, call, f"a torch optimizer passed to {ast_text(call)} while {configs[0].path.name} has "
                                     f"an `optimizer` section: accelerate raises a ValueError — pass DummyOptim, or "
                                     f"remove the config's optimizer")


@rule("AC005", "dummy-optim-without-config-optimizer", Severity.ERROR, packages=("accelerate",),
      versions="accelerate versions with DummyOptim (verified 1.15.0)",
      witness="tests/rules/test_accelerate_rules.py::test_ac005_witness")
def dummy_optim_without_config_optimizer(launch: Launch) -> Iterator[Hit]:
    """`accelerate.utils.DummyOptim` passed to `prepare()` while the DeepSpeed config has no `optimizer`.

    ## Why is this bad?
    `Accelerator.prepare` raises `ValueError: You cannot create a DummyOptim without specifying an optimizer in the
    config file`, after the model has loaded.

    ## Example
    ```python
    model, opt = accelerator.prepare(model, DummyOptim(model.parameters()))  # ds.json: no "optimizer"
    ```

    ## Use instead
    ```json
    {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "zero_optimization": {"stage": 2}}
    ```

    ## References
    - `accelerate/accelerator.py` `Accelerator._prepare_deepspeed`
    """
    configs = _accelerate_ds_configs(launch)
    if not configs or any(ds.get("optimizer") is not None for ds in configs):
        return
    for py, call in _prepared(launch, "dummy"):
        yield _prepare_hit(py, call, f"DummyOptim passed to {ast_text(call)} but {configs[0].path.name} has no "
                                     f"`optimizer` section: accelerate raises a ValueError — add the optimizer to "
                                     f"the config, or pass a torch optimizer")


def ast_text(node) -> str:
    import ast

    try:
        return ast.unparse(node.func) + "()"
    except Exception:
        return "prepare()"
