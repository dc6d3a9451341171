"""Rules about the HF Trainer (and LLaMA-Factory, which hands its YAML to it) together with a DeepSpeed config.

The training arguments come from HF/LLaMA-Factory YAML or JSON, or ``--flags`` on a launch command; their
names and defaults are those of ``transformers.TrainingArguments`` (LLaMA-Factory uses the same names).
axolotl configs use their own names and are not read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from zeropilot.launch import Launch
from zeropilot.launch.document import Document, Node
from zeropilot.launch.facts import truthy
from zeropilot.rules.deepspeed_config import auto_fix
from zeropilot.rules.registry import Hit, Severity, rule

# transformers.TrainingArguments defaults (4.x and 5.x alike) for the values the DeepSpeed integration uses.
HF_DEFAULTS: Dict[str, Any] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "max_grad_norm": 1.0,
    "learning_rate": 5e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0,
    "fp16": False, "bf16": False, "fp16_full_eval": False, "bf16_full_eval": False, "max_steps": -1,
    "warmup_steps": 0, "auto_find_batch_size": False, "fp16_backend": "auto", "fp16_opt_level": "O1",
}
_FLOATS = {"max_grad_norm", "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
           "warmup_steps"}
_INTS = {"per_device_train_batch_size", "gradient_accumulation_steps", "max_steps"}
_BOOLS = {"fp16", "bf16", "fp16_full_eval", "bf16_full_eval", "auto_find_batch_size"}
HF_FLAVOURS = ("hf", "llamafactory")


def _coerce(name: str, value: Any) -> Any:
    """A training-argument value as the dataclass field would hold it (YAML ``1e-4`` is a string)."""
    try:
        if name in _BOOLS and isinstance(value, str):
            return truthy(value) is True
        if name in _FLOATS and isinstance(value, (str, int)) and not isinstance(value, bool):
            return float(value)
        if name in _INTS and isinstance(value, (str, float)):
            number = float(value)
            return int(number) if number.is_integer() else value
    except ValueError:
        return value
    return value


def train_arg(doc: Document, name: str) -> Any:
    """A training argument's value, or the TrainingArguments default when the document does not set it."""
    node = doc.get(name)
    if node is None or node.value is None:
        return HF_DEFAULTS.get(name)
    return _coerce(name, node.plain())


# ms-swift YAML (``swift sft --config``) has its own argument classes on top of TrainingArguments.
MS_SWIFT_MARKERS = frozenset({"tuner_type", "train_type", "model_author", "model_name", "dataset_num_proc",
                              "split_dataset_ratio", "torch_dtype"})


def reads_as_hf(doc: Document) -> bool:
    """Whether the document's names and defaults are those of HF TrainingArguments (HF or LLaMA-Factory)."""
    if doc.flavour not in HF_FLAVOURS:
        return False
    keys = doc.root.value.keys() if doc.root.is_mapping else ()
    return not ("model" in keys and len(MS_SWIFT_MARKERS.intersection(keys)) >= 2)


@dataclass
class Mismatch:
    """One value the HF integration's ``fill_match`` will refuse: DeepSpeed's against the Trainer's."""

    ds_key: str
    node: Node
    ds_value: Any
    hf_key: str
    hf_value: Any

    def line(self) -> str:
        """As transformers writes it in its ValueError."""
        return f"ds {self.ds_key}={self.ds_value} vs hf {self.hf_key}={self.hf_value}"


def _precision(a: Dict[str, Any], apex_era: bool) -> List[Tuple[str, str, Any]]:
    """The fp16/bf16 (and, before transformers 5.0, Apex ``amp``) comparisons of ``trainer_config_process``."""
    fp16 = bool(a["fp16"] or a["fp16_full_eval"])
    bf16 = ("bf16.enabled", "bf16|bf16_full_eval", bool(a["bf16"] or a["bf16_full_eval"]))
    if not apex_era:
        return [("fp16.enabled", "fp16|fp16_full_eval", fp16), bf16]
    apex = fp16 and a["fp16_backend"] == "apex"
    return [("fp16.enabled", "fp16|fp16_full_eval+fp16_backend(amp)", fp16 and not apex),
            ("amp.enabled", "fp16+fp16_backend(apex)", apex),
            ("amp.opt_level", "fp16_opt_level", a["fp16_opt_level"]), bf16]


def _expected(train: Document, world: Optional[int], apex_era: bool = False) -> List[Tuple[str, str, Any]]:
    """(DeepSpeed key, HF name, value the Trainer will hold) for every ``fill_match`` that compares.

    ``apex_era``: transformers < 5.0, whose integration also compares Apex ``amp.enabled``/``opt_level``.
    """
    a = {name: train_arg(train, name) for name in HF_DEFAULTS}
    auto_bs = bool(a["auto_find_batch_size"])
    out: List[Tuple[str, str, Any]] = []
    if not auto_bs:
        out.append(("train_micro_batch_size_per_gpu", "per_device_train_batch_size",
                    a["per_device_train_batch_size"]))
    out.append(("gradient_accumulation_steps", "gradient_accumulation_steps", a["gradient_accumulation_steps"]))
    if world and not auto_bs and isinstance(a["per_device_train_batch_size"], int) \
            and isinstance(a["gradient_accumulation_steps"], int):
        out.append(("train_batch_size", "train_batch_size (calculated)",
                    world * a["per_device_train_batch_size"] * a["gradient_accumulation_steps"]))
    out += [("gradient_clipping", "max_grad_norm", a["max_grad_norm"]),
            ("optimizer.params.lr", "learning_rate", a["learning_rate"]),
            ("optimizer.params.betas", "adam_beta1+adam_beta2", [a["adam_beta1"], a["adam_beta2"]]),
            ("optimizer.params.eps", "adam_epsilon", a["adam_epsilon"]),
            ("optimizer.params.weight_decay", "weight_decay", a["weight_decay"]),
            ("scheduler.params.warmup_max_lr", "learning_rate", a["learning_rate"])]
    out += _precision(a, apex_era)
    steps = a["max_steps"]
    if isinstance(steps, int) and steps > 0:
        out.append(("scheduler.params.total_num_steps", "num_training_steps (calculated)", steps))
    warmup = a["warmup_steps"]
    if isinstance(warmup, float) and warmup >= 1:
        out.append(("scheduler.params.warmup_num_steps", "warmup_steps", int(warmup)))
    elif isinstance(warmup, float) and 0 < warmup < 1 and isinstance(steps, int) and steps > 0:
        out.append(("scheduler.params.warmup_num_steps", "warmup_steps", max(1, math.ceil(steps * warmup))))
    return out


def hf_mismatches(train: Document, ds: Document, world: Optional[int], apex_era: bool = False) -> List[Mismatch]:
    """What ``HfTrainerDeepSpeedConfig.trainer_config_process``/``_finalize`` will list as mismatches.

    A DeepSpeed value is compared only when it is present and not ``"auto"``, as ``fill_match`` does
    (Python ``!=``: ``1e9 == 1000000000``, ``[0.9, 0.999]`` is compared as a list).
    """
    out = []
    for ds_key, hf_key, hf_value in _expected(train, world, apex_era):
        node = ds.get(ds_key)
        if node is None:
            continue
        value = node.plain()
        if value is None or value == "auto" or value == hf_value:
            continue
        out.append(Mismatch(ds_key, node, value, hf_key, hf_value))
    return out


@rule("HF001", "deepspeed-value-contradicts-training-args", Severity.ERROR,
      packages=("transformers", "deepspeed"), versions="all transformers versions with the DeepSpeed integration",
      witness="tests/rules/test_hf_integration.py::test_hf001_witness", fixable=True)
def deepspeed_value_contradicts_training_args(launch: Launch) -> Iterator[Hit]:
    """A concrete DeepSpeed value that disagrees with the training arguments the HF Trainer will use.

    The HF integration fills `"auto"` values from `TrainingArguments` and compares every concrete one
    (`fill_match`): micro batch, gradient accumulation, `train_batch_size` (world size × micro batch ×
    accumulation), `gradient_clipping` vs `max_grad_norm`, optimizer `lr`/`betas`/`eps`/`weight_decay`,
    scheduler `warmup_max_lr`/`total_num_steps`/`warmup_num_steps`, `fp16`/`bf16.enabled`, and before
    transformers 5.0 the Apex `amp.enabled` (`fp16_backend: apex`) and `amp.opt_level`. Arguments not
    written take the TrainingArguments defaults (micro batch 8, accumulation 1, `max_grad_norm` 1.0,
    `learning_rate` 5e-5, betas 0.9/0.999, eps 1e-8, weight decay 0.0).

    ## Why is this bad?
    `Trainer.train()` raises `ValueError: Please correct the following DeepSpeed config values that
    mismatch TrainingArguments values` after the model has loaded. Setting DeepSpeed's
    `gradient_accumulation_steps` to 1 while the Trainer accumulates 16 steps (advice in a seed guide)
    is such a mismatch, not a workaround.

    ## Example
    ```json
    {"gradient_accumulation_steps": 1}
    ```
    with `gradient_accumulation_steps: 16` in the training YAML.

    ## Use instead
    ```json
    {"gradient_accumulation_steps": "auto"}
    ```

    ## Fix safety
    Safe: `"auto"` makes DeepSpeed take the value the Trainer uses anyway; the Trainer's value is the
    one you chose on the command line or in the YAML.

    ## References
    - `transformers/integrations/deepspeed.py` `HfTrainerDeepSpeedConfig.fill_match`,
      `trainer_config_process`, `trainer_config_finalize` (5.24; 4.57.6 for the Apex `amp` comparisons)
    """
    world = launch.world_size.value
    apex_era = launch.versions.satisfies("transformers", "<5.0.0") is True
    for train, ds in launch.training_pairs():
        if not reads_as_hf(train):
            continue
        for m in hf_mismatches(train, ds, world, apex_era):
            where = f" (world size {world}: {launch.world_size.reason})" if m.ds_key == "train_batch_size" else ""
            yield Hit(ds, m.node, f"{m.line()}{where}: the HF Trainer raises a ValueError at train() for "
                                  f"mismatched DeepSpeed values — set `{m.ds_key}` to \"auto\"",
                      fix=auto_fix(ds, m.node, f"`{m.ds_key}`"))


@rule("HF002", "fp16-and-bf16-in-training-args", Severity.ERROR, packages=("transformers",),
      versions="all transformers versions with bf16",
      witness="tests/rules/test_hf_integration.py::test_hf002_witness")
def fp16_and_bf16_in_training_args(launch: Launch) -> Iterator[Hit]:
    """The training arguments turn on both `fp16` and `bf16` (or both full-eval variants).

    ## Why is this bad?
    `TrainingArguments` raises `ValueError: At most one of fp16 and bf16 can be True, but not both`
    while parsing, before anything runs; with DeepSpeed `"auto"` both precisions would be enabled.

    ## Example
    ```yaml
    fp16: true
    bf16: true
    ```

    ## Use instead
    ```yaml
    bf16: true
    ```
    (fp16 on cards without bf16 support).

    ## References
    - `transformers/training_args.py` `TrainingArguments.__post_init__`
    """
    for doc in launch.train_args:
        if not reads_as_hf(doc):
            continue
        for a, b in (("fp16", "bf16"), ("fp16_full_eval", "bf16_full_eval")):
            if train_arg(doc, a) is True and train_arg(doc, b) is True:
                yield Hit(doc, doc.get(b), f"`{a}` and `{b}` are both true: TrainingArguments raises a ValueError "
                                           f"(at most one of fp16 and bf16) — keep one")


@dataclass(frozen=True)
class Removed:
    """A TrainingArguments field removed in ``since`` (first version without it), and what replaces it."""

    since: str
    instead: str
    source: str


_V5 = "transformers 5.0.0 (absent from training_args.py of the 5.0.0 wheel, present in 4.57.6)"
REMOVED_ARGS: Dict[str, Removed] = {
    "sharded_ddp": Removed("4.35.0", "`deepspeed` or `fsdp`", "PR #25702 (fairscale removed)"),
    "evaluation_strategy": Removed("4.46.0", "`eval_strategy`", "deprecated in 4.41, removed in 4.46"),
    "no_cuda": Removed("5.0.0", "`use_cpu: true`", _V5),
    "use_mps_device": Removed("5.0.0", "nothing (MPS is used when available)", _V5),
    "overwrite_output_dir": Removed("5.0.0", "nothing (remove it)", _V5),
    "push_to_hub_token": Removed("5.0.0", "`hub_token`", _V5),
    "push_to_hub_model_id": Removed("5.0.0", "`hub_model_id`", _V5),
    "push_to_hub_organization": Removed("5.0.0", "`hub_model_id: org/name`", _V5),
    "fsdp_min_num_params": Removed("5.0.0", "`fsdp_config: {min_num_params: N}`", _V5),
    "fsdp_transformer_layer_cls_to_wrap": Removed("5.0.0", "`fsdp_config: {transformer_layer_cls_to_wrap: [...]}`",
                                                  _V5),
    "tpu_num_cores": Removed("5.0.0", "nothing (remove it)", _V5),
    "tpu_metrics_debug": Removed("5.0.0", "`debug: tpu_metrics_debug`", _V5),
    "save_safetensors": Removed("5.0.0", "nothing (safetensors is always used)", _V5),
    "fp16_backend": Removed("5.0.0", "nothing (native AMP only)", _V5),
    "half_precision_backend": Removed("5.0.0", "nothing (native AMP only)", _V5),
    "fp16_opt_level": Removed("5.0.0", "nothing (Apex removed)", _V5),
    "per_gpu_train_batch_size": Removed("5.0.0", "`per_device_train_batch_size`", _V5),
    "per_gpu_eval_batch_size": Removed("5.0.0", "`per_device_eval_batch_size`", _V5),
    "include_inputs_for_metrics": Removed("5.0.0", "`include_for_metrics: [inputs]`", _V5),
    "include_tokens_per_second": Removed("5.0.0", "nothing (remove it)", _V5),
    "jit_mode_eval": Removed("5.0.0", "nothing (remove it)", _V5),
    "torchdynamo": Removed("5.0.0", "`torch_compile_backend`", _V5),
    "use_legacy_prediction_loop": Removed("5.0.0", "nothing (remove it)", _V5),
    "ray_scope": Removed("5.0.0", "nothing (remove it)", _V5),
    "mp_parameters": Removed("5.0.0", "nothing (remove it)", _V5),
    "past_index": Removed("5.0.0", "nothing (remove it)", _V5),
    "adafactor": Removed("5.0.0", "`optim: adafactor`", _V5),
    "group_by_length": Removed("5.2.0", "`train_sampling_strategy: group_by_length`",
                               "absent from the 5.2.0 wheel's training_args.py, present in 5.1.0"),
    "warmup_ratio": Removed("5.15.0", "`warmup_steps` with a float in [0, 1) (a ratio of the total steps)",
                            "absent from the 5.15.0 wheel's training_args.py, present in 5.14.0"),
    "logging_dir": Removed("5.15.0", "nothing (the reporting integrations choose their folder)",
                           "absent from the 5.15.0 wheel's training_args.py, present in 5.14.0"),
}
# Names LLaMA-Factory defines itself on top of TrainingArguments (src/llamafactory/hparams/training_args.py).
LLAMAFACTORY_OWN = frozenset({"overwrite_output_dir"})


@rule("HF003", "removed-training-argument", Severity.ERROR, packages=("transformers",),
      versions="transformers >= 4.35 (each argument from the version it was removed in)",
      witness="tests/rules/test_hf_integration.py::test_hf003_witness")
def removed_training_argument(launch: Launch) -> Iterator[Hit]:
    """A training argument the assumed transformers version no longer has (`sharded_ddp`, `no_cuda`, ...).

    LLaMA-Factory passes its YAML to `HfArgumentParser`, so the same keys fail there (unless
    `ALLOW_EXTRA_ARGS=1`); `overwrite_output_dir` is one LLaMA-Factory still defines itself. With an
    unknown transformers version the newest behaviour is assumed and the finding is a warning.

    ## Why is this bad?
    `HfArgumentParser.parse_dict` raises "Some keys are not used by the HfArgumentParser" (a `--flag`
    gives "unrecognized arguments"): the run does not start. `sharded_ddp: zero3` (seed guide 001) was
    removed in 2023.

    ## Example
    ```yaml
    sharded_ddp: zero3
    no_cuda: false
    ```

    ## Use instead
    ```yaml
    deepspeed: ds_z3_config.json
    use_cpu: false
    ```

    ## References
    - `transformers/training_args.py` at each version (wheels 4.34.0/4.35.0, 4.45.2/4.46.0, 4.57.6/5.0.0,
      5.1.0/5.2.0, 5.14.0/5.15.0 compared); transformers PR #25702 (`sharded_ddp`)
    - `transformers/hf_argparser.py` `HfArgumentParser.parse_dict` (`allow_extra_keys=False`)
    """
    for doc in launch.train_args:
        if not reads_as_hf(doc):
            continue
        for key, child in doc.root.value.items():
            gone = REMOVED_ARGS.get(key)
            if gone is None or (doc.flavour == "llamafactory" and key in LLAMAFACTORY_OWN):
                continue
            if launch.versions.satisfies("transformers", f">={gone.since}") is False:
                continue
            known = launch.versions.raw("transformers")
            yield Hit(doc, child, f"`{key}` was removed from TrainingArguments in transformers {gone.since} "
                                  f"(assumed: {known or 'unknown, newest assumed'}): argument parsing fails before "
                                  f"training — use {gone.instead}", severity=None if known else Severity.WARNING)
