"""Values DeepSpeed refuses when it loads the config or builds the engine (0.19.8 validators, read in its source).

Each rule mirrors one validator of ``deepspeed/runtime/config.py``, ``precision_config.py``, ``zero/config.py``,
``zero/stage_1_and_2.py``, ``engine.py`` or ``lr_schedules.py``; the witnesses run the real ones
(``DeepSpeedConfig`` in the test process, ``deepspeed.initialize`` in ``tests/rules/init_probe.py``). With the
oracle on (``zeropilot check --oracle``) the installed DeepSpeed's own config classes judge the same values;
these rules stay for versions that are not installed and for what only ``initialize`` finds.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.document import Node
from zeropilot.launch.facts import DsFacts, as_int, facts, is_auto, truthy
from zeropilot.rules.registry import Gate, Hit, Severity, rule

ALLREDUCE_OPS = ("mean", "sum")
TAG_MODES = ("IGNORE", "WARN", "FAIL")
DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
          "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
          "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32"}


def _configs(launch: Launch) -> Iterator[DsFacts]:
    yield from facts(launch).ds


@rule("DS013", "gradient-allreduce-op-refused", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed versions with gradient_allreduce_op (checked on 0.19.8)",
      witness="tests/rules/test_ds_values.py::test_ds013_witness")
def gradient_allreduce_op_refused(launch: Launch) -> Iterator[Hit]:
    """`gradient_allreduce_op` is neither `mean` nor `sum`, or is `sum` at ZeRO-3.

    ## Why is this bad?
    `DeepSpeedConfig` raises `ValueError` ("Invalid gradient_allreduce_op" or "'sum' is not supported with ZeRO
    stage 3") when the engine is built, after the model has loaded.

    ## Example
    ```json
    {"gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}}
    ```

    ## Use instead
    ```json
    {"gradient_allreduce_op": "mean", "zero_optimization": {"stage": 3}}
    ```

    ## References
    - `deepspeed/runtime/config.py` `get_gradient_allreduce_op`, `DeepSpeedConfig._do_error_check`
    """
    for f in _configs(launch):
        node = f.doc.get("gradient_allreduce_op")
        if node is None or node.value is None or is_auto(node):
            continue
        value = node.value.lower() if isinstance(node.value, str) else node.value
        if value not in ALLREDUCE_OPS:
            yield Hit(f.doc, node, f"`gradient_allreduce_op` is {node.raw or node.value!r}: DeepSpeed accepts only "
                                   f"\"mean\" or \"sum\" and raises a ValueError when it builds its config")
        elif value == "sum" and f.stage == 3:
            yield Hit(f.doc, node, "`gradient_allreduce_op` \"sum\" at ZeRO-3: DeepSpeed raises a ValueError (not "
                                   "supported with stage 3) — use \"mean\" or ZeRO-1/2")


@rule("DS014", "invalid-checkpoint-tag-validation", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions with checkpoint.tag_validation (checked on 0.19.8)",
      witness="tests/rules/test_ds_values.py::test_ds014_witness")
def invalid_checkpoint_tag_validation(launch: Launch) -> Iterator[Hit]:
    """`checkpoint.tag_validation` is not `Ignore`, `Warn` or `Fail`, or `checkpoint.parallel_write.pipeline_stage`
    is not a boolean.

    ## Why is this bad?
    `DeepSpeedConfig` raises `DeepSpeedConfigError` (a non-string `tag_validation` fails with an
    `AttributeError`) when it builds its config.

    ## Example
    ```json
    {"checkpoint": {"tag_validation": "strict"}}
    ```

    ## Use instead
    ```json
    {"checkpoint": {"tag_validation": "Fail"}}
    ```

    ## References
    - `deepspeed/runtime/config.py` `get_checkpoint_tag_validation_mode`, `get_checkpoint_parallel_write_pipeline`
    """
    for f in _configs(launch):
        node = f.doc.get("checkpoint.tag_validation")
        if node is not None and not (isinstance(node.value, str) and node.value.upper() in TAG_MODES):
            yield Hit(f.doc, node, f"`checkpoint.tag_validation` is {node.raw or node.value!r}: DeepSpeed accepts "
                                   f"Ignore, Warn or Fail (any case) and refuses the config otherwise")
        pipe = f.doc.get("checkpoint.parallel_write.pipeline_stage")
        if pipe is not None and not isinstance(pipe.value, bool):
            yield Hit(f.doc, pipe, f"`checkpoint.parallel_write.pipeline_stage` is {pipe.raw or pipe.value!r}: "
                                   f"DeepSpeed accepts only true or false (DeepSpeedConfigError)")


def _number(value) -> Optional[float]:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _loss_scale_problem(node: Node) -> Optional[str]:
    value = _number(node.value)
    if value is None:
        return "must be a number (not a bool or a string)"
    if not math.isfinite(value):
        return "must be finite"
    if value < 0:
        return "must be >= 0 (0 means dynamic loss scaling)"
    return None


def _scale_int_problem(node: Node, dynamic: bool) -> Optional[str]:
    value = node.value
    if isinstance(value, bool):
        return "must be an integer, not a bool"
    number = _number(value)
    if number is None:
        return "must be an integer"
    if not math.isfinite(number):
        return "must be finite"
    if isinstance(value, float) and not number.is_integer():
        return "must be a whole number"
    if dynamic and number <= 0:
        return "must be > 0 with dynamic loss scaling (loss_scale 0)"
    return None


@rule("DS015", "fp16-loss-scale-refused", Severity.ERROR, gates=(Gate("deepspeed", ">=0.19.8"),),
      versions="deepspeed >= 0.19.8 (the fp16 validators; older versions fail later, in the loss scaler)",
      witness="tests/rules/test_ds_values.py::test_ds015_witness")
def fp16_loss_scale_refused(launch: Launch) -> Iterator[Hit]:
    """An fp16 `loss_scale`, `loss_scale_window` or `min_loss_scale` DeepSpeed's fp16 config refuses.

    `loss_scale` must be a finite number >= 0; `loss_scale_window` and `min_loss_scale` integers (not booleans),
    and > 0 when fp16 is enabled with dynamic scaling (`loss_scale` 0).

    ## Why is this bad?
    `DeepSpeedFP16Config` raises a pydantic `ValidationError` when the config is built. Before these validators,
    a `loss_scale_window` of 0 raised `ZeroDivisionError` at the first overflow, mid-training.

    ## Example
    ```json
    {"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 0}}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000}}
    ```

    ## References
    - `deepspeed/runtime/precision_config.py` `DeepSpeedFP16Config` (`_validate_loss_scale`,
      `_reject_non_integer_scale_params`, `_validate_dynamic_loss_scale_params`)
    """
    for f in _configs(launch):
        fp16 = f.doc.get("fp16")
        if fp16 is None or not fp16.is_mapping:
            continue
        scale = fp16.child("loss_scale")
        problem = _loss_scale_problem(scale) if scale is not None and not is_auto(scale) else None
        if problem:
            yield Hit(f.doc, scale, f"`fp16.loss_scale` is {scale.raw or scale.value!r}: it {problem}; DeepSpeed "
                                    f"refuses the config (ValidationError)")
        dynamic = truthy(fp16.value.get("enabled").value if fp16.child("enabled") else None) is True and \
            (scale is None or _number(scale.value) == 0)
        for key in ("loss_scale_window", "min_loss_scale"):
            node = fp16.child(key)
            problem = _scale_int_problem(node, dynamic) if node is not None and not is_auto(node) else None
            if problem:
                yield Hit(f.doc, node, f"`fp16.{key}` is {node.raw or node.value!r}: it {problem}; DeepSpeed refuses "
                                       f"the config (ValidationError)")


@rule("DS016", "odd-allgather-bucket-size", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions with ZeRO-1/2 (checked on 0.19.8)",
      witness="tests/rules/test_ds_values.py::test_ds016_witness")
def odd_allgather_bucket_size(launch: Launch) -> Iterator[Hit]:
    """An odd `allgather_bucket_size` at ZeRO-1/2.

    ## Why is this bad?
    The ZeRO-1/2 optimizer asserts `allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2`
    in `deepspeed.initialize`, after the model has loaded.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "allgather_bucket_size": 500000001}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2, "allgather_bucket_size": 500000000}}
    ```

    ## References
    - `deepspeed/runtime/zero/stage_1_and_2.py` `DeepSpeedZeroOptimizer.__init__` (the assertion)
    """
    for f in _configs(launch):
        node = f.doc.get("zero_optimization.allgather_bucket_size")
        value = as_int(node.value) if node is not None else None
        if f.stage in (1, 2) and value is not None and value % 2:
            yield Hit(f.doc, node, f"`allgather_bucket_size` {value} is odd: the ZeRO-{f.stage} optimizer asserts it "
                                   f"is a multiple of 2 at initialize — use {value + 1}")


@rule("DS017", "scheduler-warmup-steps-not-positive-integer", Severity.ERROR,
      gates=(Gate("deepspeed", ">=0.19.6"),), versions="deepspeed >= 0.19.6 (before: accepted; 0 divided by zero)",
      witness="tests/rules/test_ds_values.py::test_ds017_witness")
def scheduler_warmup_steps_not_positive_integer(launch: Launch) -> Iterator[Hit]:
    """A DeepSpeed warmup scheduler whose `warmup_num_steps` is not a positive integer (`0`, `-5`, `10.0`).

    ## Why is this bad?
    Since 0.19.6 `WarmupLR` / `WarmupDecayLR` raise `ValueError: warmup_num_steps must be a positive integer` in
    `deepspeed.initialize`, after the model has loaded; a whole float such as `10.0` is refused too.

    ## Example
    ```json
    {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}
    ```

    ## Use instead
    ```json
    {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1}}}
    ```

    ## References
    - `deepspeed/runtime/lr_schedules.py` `WarmupLR.__init__`, `WarmupDecayLR` (0.19.6 sdist and later)
    """
    for f in _configs(launch):
        kind = f.doc.value("scheduler.type")
        node = f.doc.get("scheduler.params.warmup_num_steps")
        if kind not in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR") or node is None or is_auto(node):
            continue
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            yield Hit(f.doc, node, f"`scheduler.params.warmup_num_steps` is {node.raw or value!r}: {kind} raises "
                                   f"ValueError at initialize (a positive integer is required) — write a whole "
                                   f"number >= 1")


@rule("DS018", "grad-accum-dtype-without-zero", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed versions with data_types.grad_accum_dtype (checked on 0.19.8)",
      witness="tests/rules/test_ds_values.py::test_ds018_witness")
def grad_accum_dtype_without_zero(launch: Launch) -> Iterator[Hit]:
    """`data_types.grad_accum_dtype` differs from the model dtype without ZeRO (stage 0).

    The model dtype is bf16 or fp16 when that section is enabled, fp32 otherwise.

    ## Why is this bad?
    Without ZeRO, DeepSpeed supports only accumulating in the model's dtype: `deepspeed.initialize` raises
    `NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype`. ZeRO-1/2/3 accept the mix.

    ## Example
    ```json
    {"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}}
    ```

    ## Use instead
    ```json
    {"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}}
    ```

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.get_data_types`, `_do_optimizer_sanity_check`
    """
    for f in _configs(launch):
        node = f.doc.get("data_types.grad_accum_dtype")
        if node is None or f.stage != 0 or f.precision is None or not isinstance(node.value, str):
            continue
        wanted = DTYPES.get(node.value.lower())
        if wanted is not None and wanted != f.precision:
            yield Hit(f.doc, node, f"`data_types.grad_accum_dtype` {node.value} with a {f.precision} model and no "
                                   f"ZeRO: deepspeed.initialize raises NotImplementedError (unsupported mix) — "
                                   f"accumulate in {f.precision}, or use ZeRO stage >= 1")


# Numeric bounds of DeepSpeed 0.19.8's pydantic fields (zero/config.py, zero/offload_config.py): key -> (low,
# low inclusive, high). Aliases are listed under the name configs use.
BOUNDS = {
    "zero_optimization.reduce_bucket_size": (0, False, None),
    **{f"zero_optimization.{k}": (0, True, None) for k in (
        "allgather_bucket_size", "sub_group_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
        "stage3_max_live_parameters", "stage3_max_reuse_distance", "zero_hpz_partition_size")},
    **{f"zero_optimization.offload_param.{k}": (0, True, None) for k in ("buffer_count", "buffer_size", "max_in_cpu")},
    "zero_optimization.offload_optimizer.buffer_count": (0, True, None),
    "zero_optimization.offload_optimizer.ratio": (0, True, 1.0),
}


def _out_of_bounds(doc) -> Iterator[Hit]:
    for key, (low, inclusive, high) in BOUNDS.items():
        node = doc.get(key)
        value = _number(node.value) if node is not None and not is_auto(node) else None
        if value is None:
            continue
        if value < low or (value == low and not inclusive) or (high is not None and value > high):
            need = f"{'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
            yield Hit(doc, node, f"`{key}` is {node.raw or node.value}: DeepSpeed requires {need} "
                                 f"(ValidationError when it builds its config)")


def _other_refusals(f: DsFacts) -> Iterator[Hit]:
    doc = f.doc
    yield from _out_of_bounds(doc)
    zero = doc.get("zero_optimization")
    if zero is not None and not zero.is_mapping and not isinstance(zero.value, bool):
        yield Hit(doc, zero, "`zero_optimization` must be a section (or the deprecated true/false): DeepSpeed "
                             "refuses the config")
    if f.stage is None and f.stage_node is not None and not is_auto(f.stage_node):
        yield Hit(doc, f.stage_node, f"{f.stage_reason}: the stage must be 0, 1, 2 or 3 (ValidationError)")
    cgn = doc.get("zero_optimization.compute_grad_norm")
    if cgn is not None and cgn.value is False and f.stage not in (1, 2, None):
        yield Hit(doc, cgn, f"`compute_grad_norm: false` at ZeRO-{f.stage}: supported only at ZeRO-1/2 "
                            f"(ValidationError)")
    ratio = doc.get("zero_optimization.offload_optimizer.ratio")
    rv = _number(ratio.value) if ratio is not None else None
    if rv is not None and rv < 1.0 and f.stage not in (3, None):
        yield Hit(doc, ratio, f"`offload_optimizer.ratio` {rv} (partial offload) at ZeRO-{f.stage}: supported only "
                              f"at ZeRO-3 (assertion)")
    comm = doc.get("communication_data_type")
    if comm is not None and comm.value is not None and not is_auto(comm) and \
            not (isinstance(comm.value, str) and comm.value.lower() in ("fp16", "bf16", "fp32")):
        yield Hit(doc, comm, f"`communication_data_type` is {comm.raw or comm.value!r}: DeepSpeed accepts fp16, bf16 "
                             f"or fp32 (ValueError)")
    for section, key in (("fp16", "fp16_master_weights_and_grads"), ("bf16", "bf16_master_weights_and_grads"),
                         ("bf16", "bf16_optimizer_states")):
        node = doc.get(f"{section}.{key}")
        if node is not None and node.value is True and f.stage == 0:
            yield Hit(doc, node, f"`{section}.{key}` without ZeRO: supported only with ZeRO stage 1, 2 or 3 "
                                 f"(assertion when DeepSpeed builds its config)")
    states = doc.get("bf16.bf16_optimizer_states")
    if states is not None and states.value is True and doc.value("bf16.bf16_master_weights_and_grads") is not True:
        yield Hit(doc, states, "`bf16_optimizer_states` requires `bf16_master_weights_and_grads: true` (assertion)")
    keep = doc.get("data_types.keep_in_fp32_modules")
    if keep is not None and not is_auto(keep) and not (keep.is_sequence and all(
            isinstance(n.value, str) for n in keep.value)):
        yield Hit(doc, keep, "`data_types.keep_in_fp32_modules` must be \"auto\" or a list of name patterns "
                             "(DeepSpeedConfigError)")


@rule("DS019", "config-value-refused-at-load", Severity.ERROR, packages=("deepspeed",),
      versions="validators as of deepspeed 0.19.8",
      witness="tests/rules/test_ds_values.py::test_ds019_witness")
def config_value_refused_at_load(launch: Launch) -> Iterator[Hit]:
    """A value one of DeepSpeed's other config validators refuses.

    Covered: numeric bounds of the ZeRO fields (`reduce_bucket_size` > 0, bucket and threshold sizes >= 0,
    `offload_optimizer.ratio` in [0, 1]), a ZeRO stage outside 0-3, `zero_optimization` neither a section nor a boolean,
    `compute_grad_norm: false` outside ZeRO-1/2, a partial `offload_optimizer.ratio` below ZeRO-3, an unknown
    `communication_data_type`, fp16/bf16 master weights or `bf16_optimizer_states` without ZeRO,
    `bf16_optimizer_states` without `bf16_master_weights_and_grads`, and `data_types.keep_in_fp32_modules`
    neither `"auto"` nor a list of strings.

    ## Why is this bad?
    `DeepSpeedConfig` (or its pydantic ZeRO/precision models) raises at `deepspeed.initialize`, after the model
    has loaded.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "compute_grad_norm": false}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2, "compute_grad_norm": false}}
    ```

    ## References
    - `deepspeed/runtime/zero/config.py` (`compute_grad_norm_valid`, `offload_ratio_check`, `ZeroStageEnum`)
    - `deepspeed/runtime/config.py` `get_communication_data_type`, `_do_error_check`, `keep_in_fp32_modules`
    """
    for f in _configs(launch):
        yield from _other_refusals(f)

