"""Rules about the DeepSpeed config on its own: keys, types, and values DeepSpeed refuses or ignores.

What DeepSpeed reads is plain data in :mod:`zeropilot.rules.data_ds` (derived from DeepSpeed 0.19.8 and
checked against the installed DeepSpeed by the tests).
"""

from __future__ import annotations

import difflib
from typing import Iterator, List, Optional, Tuple

from zeropilot.fix.edits import rename_key, replace_value
from zeropilot.launch import Launch
from zeropilot.launch.facts import BATCH_KEYS, as_int, is_auto, is_on
from zeropilot.launch.facts import zero_stage as facts_zero_stage
from zeropilot.launch.document import Document, Node
from zeropilot.rules.data_ds import (NOT_DEEPSPEED_KEYS, REMOVED_TOP_LEVEL, REMOVED_ZERO_KEYS, STRICT_SECTIONS,
                                     STRICT_SINCE, TOP_LEVEL_KEYS, Section)
from zeropilot.rules.registry import Applicability, Fix, Gate, Hit, Severity, rule

def _enabled(doc, section: str):
    node = doc.get(f"{section}.enabled")
    return node if is_on(node) else None


def ds_version_in(launch: Launch, spec: str) -> bool:
    """Whether the assumed DeepSpeed is in ``spec``; an unknown version counts as the newest (in range)."""
    verdict = launch.versions.satisfies("deepspeed", spec)
    return True if verdict is None else verdict


def did_you_mean(key: str, known, cutoff: float = 0.6) -> Optional[str]:
    """The known key closest to ``key`` (difflib), or None."""
    if key in NOT_DEEPSPEED_KEYS:
        return NOT_DEEPSPEED_KEYS[key]
    matches = difflib.get_close_matches(key, sorted(known), n=1, cutoff=cutoff)
    return matches[0] if matches else None


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def strict_sections(doc: Document) -> Iterator[Tuple[str, Section, Node]]:
    """(section name, its known keys, its node) for each strictly validated section present in ``doc``."""
    for name, section in STRICT_SECTIONS.items():
        node = doc.get(name)
        if node is None and name == "bf16" and doc.get("bf16") is None:
            node = doc.get("bfloat16")  # DeepSpeed's legacy name for the same section
        if node is not None and node.is_mapping:
            yield name, section, node


@rule("DS001", "unknown-key-in-strict-section", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed >= 0.7.0 (fp16/bf16: >= 0.17.1, compile: >= 0.17.0); keys as of 0.19.8",
      witness="tests/rules/test_deepspeed_config.py::test_ds001_witness")
def unknown_key_in_strict_section(launch: Launch) -> Iterator[Hit]:
    """A key DeepSpeed does not know, in a section it validates strictly.

    `zero_optimization` (with `offload_param`/`offload_optimizer`), `fp16`/`bf16`, `tensorboard`, `wandb`,
    `csv_monitor`, `comet`, `comms_logger`, `compile`, `hybrid_engine`, `tensor_parallel` and
    `weight_quantization` are pydantic models with `extra="forbid"`. A key set to `"auto"` is dropped before
    validation, so a misspelled key with the value `"auto"` passes silently and does nothing: that case
    is a warning.

    ## Why is this bad?
    DeepSpeed raises a pydantic `ValidationError` ("Extra inputs are not permitted") in
    `deepspeed.initialize`, after the model has been loaded, or, with `"auto"`, ignores what you set.
    `stage3_offload_optimizer` / `stage3_offload_param` were never DeepSpeed keys.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "stage3_offload_optimizer": true}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}
    ```

    ## References
    - `deepspeed/runtime/config_utils.py` `DeepSpeedConfigModel` (`extra="forbid"`, `"auto"` dropped)
    - `deepspeed/runtime/zero/config.py`, `deepspeed/runtime/precision_config.py` (strict since 0.17.1, PR #6976)
    """
    for doc in launch.ds_configs:
        for name, section, node in strict_sections(doc):
            since = STRICT_SINCE.get(name.split(".")[0])
            if since and not ds_version_in(launch, f">={since}"):
                continue
            for key, child in node.value.items():
                if key in section.keys or (name == "zero_optimization" and key in REMOVED_ZERO_KEYS):
                    continue
                yield _unknown_key_hit(doc, name, section, key, child)


def _unknown_key_hit(doc: Document, section_name: str, section: Section, key: str, child: Node) -> Hit:
    guess = did_you_mean(key, section.keys)
    hint = f"did you mean `{guess}`?" if guess else "known keys: see `zeropilot explain DS001`"
    if key in NOT_DEEPSPEED_KEYS:
        hint = f"write {guess} instead"
    if is_auto(child):
        return Hit(doc, child, f"`{section_name}.{key}` is not a DeepSpeed key; DeepSpeed drops keys set to "
                               f"\"auto\" before validating, so it is silently ignored — {hint}",
                   severity=Severity.WARNING)
    return Hit(doc, child, f"`{section_name}.{key}` is not a DeepSpeed key: `{section_name}` is validated "
                           f"strictly, so deepspeed.initialize raises a ValidationError — {hint}")


@rule("DS002", "unknown-top-level-key", Severity.WARNING, packages=("deepspeed",),
      versions="all DeepSpeed versions; keys as of 0.19.8",
      witness="tests/rules/test_deepspeed_config.py::test_ds002_witness")
def unknown_top_level_key(launch: Launch) -> Iterator[Hit]:
    """A top-level key DeepSpeed never reads, so it is silently ignored.

    DeepSpeed reads each top-level setting with a plain dictionary lookup: a misspelled key such as
    `gradient_clip` leaves the real setting at its default, and `zero_optimisation` leaves ZeRO off
    (stage 0). A near-certain typo (the intended key is absent and the names are almost equal) is an
    error; other unknown keys are warnings. Keys starting with `_` (`_comment`) are a convention for
    comments and are not reported.

    ## Why is this bad?
    Nothing fails: the run starts with the default instead of what you wrote, which shows only later as
    memory, speed or divergence problems.

    ## Example
    ```json
    {"zero_optimisation": {"stage": 3}, "gradient_clip": 1.0}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3}, "gradient_clipping": 1.0}
    ```

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig._initialize_params` and the `get_*` getters
    - `deepspeed/runtime/config_utils.py` `get_scalar_param` (`param_dict.get(name, default)`)
    """
    for doc in launch.ds_configs:
        for key, child in doc.root.value.items():
            if key in TOP_LEVEL_KEYS or key.startswith("_") or "comment" in key.lower():
                continue
            guess = did_you_mean(key, TOP_LEVEL_KEYS)
            certain = guess is not None and guess not in doc.root.value and _similarity(key, guess) >= 0.85
            if guess:
                hint = f"did you mean `{guess}`?"
            else:
                hint = "remove it, or move it where the tool that needs it reads it"
            effect = "ZeRO stays off (stage 0)" if guess == "zero_optimization" and certain else \
                "DeepSpeed ignores it silently"
            yield Hit(doc, child, f"`{key}` is not a DeepSpeed config key: {effect} — {hint}",
                      severity=Severity.ERROR if certain else None)


def fractional(value) -> bool:
    """A float with a fractional part (``15099494.4``); whole floats such as ``1e9`` are fine."""
    return isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")) \
        and not value.is_integer()


@rule("DS003", "fractional-float-for-integer-field", Severity.ERROR, gates=(Gate("deepspeed", ">=0.7.0"),),
      versions="deepspeed >= 0.15.0 (error); 0.7.0-0.14.x (silently truncated: warning)",
      witness="tests/rules/test_deepspeed_config.py::test_ds003_witness")
def fractional_float_for_integer_field(launch: Launch) -> Iterator[Hit]:
    """A fractional number (`15099494.4`) where DeepSpeed expects an integer.

    Whole-number floats such as `1e9` or `5e8` are accepted and converted: they are not reported.

    ## Why is this bad?
    Since DeepSpeed 0.15.0 (pydantic v2) the integer fields of the strict sections refuse a float with a
    fractional part (`int_from_float` ValidationError) at `deepspeed.initialize`; from 0.7 to 0.14 the
    value was silently truncated.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 15099494.4}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 15099494}}
    ```

    ## References
    - pydantic v2 lax mode `int_from_float`; DeepSpeed #6525
    - `deepspeed/runtime/zero/config.py` (integer fields)
    """
    truncated = not ds_version_in(launch, ">=0.15.0")
    for doc in launch.ds_configs:
        for name, section, node in strict_sections(doc):
            for key, child in node.value.items():
                if key not in section.int_fields or not fractional(child.value):
                    continue
                if truncated:
                    yield Hit(doc, child, f"`{name}.{key}` is {child.raw or child.value}, a fraction for an integer "
                                          f"field: this DeepSpeed truncates it silently (0.15+ refuses it) — write "
                                          f"a whole number", severity=Severity.WARNING)
                else:
                    yield Hit(doc, child, f"`{name}.{key}` is {child.raw or child.value}, a fraction for an integer "
                                          f"field: DeepSpeed >= 0.15 raises a ValidationError (int_from_float) — "
                                          f"write a whole number such as {int(child.value)}")


def _auto_nodes(doc: Document) -> Iterator[Node]:
    for node in doc.root.walk():
        if node is not doc.root and node.value == "auto":
            yield node


@rule("DS004", "auto-without-hf-integration", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions",
      witness="tests/rules/test_deepspeed_config.py::test_ds004_witness")
def auto_without_hf_integration(launch: Launch) -> Iterator[Hit]:
    """`"auto"` in a DeepSpeed config that only raw `deepspeed.initialize` reads.

    Only the HF integrations (the transformers Trainer and accelerate) replace `"auto"`. Reported only
    when the launch shows a script calling `deepspeed.initialize` and no Trainer/accelerate.

    ## Why is this bad?
    A top-level batch value `"auto"` (`train_batch_size`, `train_micro_batch_size_per_gpu`,
    `gradient_accumulation_steps`) makes `DeepSpeedConfig` fail with a `TypeError`; `"auto"` inside a
    section is dropped, so the DeepSpeed default is used instead of a value derived from your model.

    ## Example
    ```json
    {"train_batch_size": "auto", "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    ```

    ## Use instead
    ```json
    {"train_batch_size": 32, "zero_optimization": {"stage": 3, "reduce_bucket_size": 16777216}}
    ```

    ## References
    - `deepspeed/runtime/config.py` `_set_batch_related_parameters`, `_batch_assertion`
    - `deepspeed/runtime/config_utils.py` (`"auto"` dropped in `DeepSpeedConfigModel.__init__`)
    - `transformers/integrations/deepspeed.py` `HfTrainerDeepSpeedConfig.fill_match` (what fills `"auto"`)
    """
    for doc in launch.ds_configs:
        if launch.uses_hf_integration(doc) is not False:
            continue
        for node in _auto_nodes(doc):
            if node.path in BATCH_KEYS:
                yield Hit(doc, node, f"`{node.path}` is \"auto\" but nothing fills it (no HF Trainer or accelerate):"
                                     f" DeepSpeedConfig fails with a TypeError — write the number")
            elif "." in node.path:
                yield Hit(doc, node, f"`{node.path}` is \"auto\" but nothing fills it (no HF Trainer or accelerate):"
                                     f" DeepSpeed drops it and uses its default — write the value you want",
                          severity=Severity.WARNING)
            else:
                yield Hit(doc, node, f"`{node.path}` is \"auto\" but nothing fills it (no HF Trainer or accelerate):"
                                     f" DeepSpeed reads the string \"auto\" — write the value you want",
                          severity=Severity.WARNING)


def concrete_int(node: Optional[Node]) -> Optional[int]:
    """A node's value as an int when it is a whole number (``1e9`` counts), else None."""
    return as_int(node.value) if node is not None else None


@rule("DS005", "fp16-and-bf16-both-enabled", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions with bf16 support (>= 0.6)",
      witness="tests/rules/test_deepspeed_config.py::test_ds005_witness")
def fp16_and_bf16_both_enabled(launch: Launch) -> Iterator[Hit]:
    """The DeepSpeed config enables both fp16 and bf16.

    ## Why is this bad?
    DeepSpeed asserts `bfloat16 and fp16 modes cannot be simultaneously enabled` when it builds its
    config, at `deepspeed.initialize`, after the model has been loaded. With the HF integration, `"auto"`
    for both is filled from `--fp16`/`--bf16`, which cannot both be true.

    ## Example
    ```json
    {"fp16": {"enabled": true}, "bf16": {"enabled": true}}
    ```

    ## Use instead
    ```json
    {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    ```
    and choose one with the training arguments (`bf16: true`), or enable only the one your cards support
    (bf16 needs Ampere or newer, or a DCU/ROCm build that supports it).

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig._initialize_params` (the assertion)
    """
    for doc in launch.ds_configs:
        fp16, bf16 = _enabled(doc, "fp16"), _enabled(doc, "bf16")
        if fp16 is not None and bf16 is not None:
            yield Hit(doc, bf16, "fp16 and bf16 are both enabled: DeepSpeed refuses this at initialize "
                                 "(assertion). Enable one, or set both to \"auto\" under the HF Trainer.")


@rule("DS006", "batch-size-identity-broken", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions",
      witness="tests/rules/test_deepspeed_config.py::test_ds006_witness")
def batch_size_identity_broken(launch: Launch) -> Iterator[Hit]:
    """`train_batch_size` is not `train_micro_batch_size_per_gpu × gradient_accumulation_steps × world size`.

    Checked when all three values are numbers and the world size is known (from the launcher, or
    `--world-size`). Under the HF Trainer the same comparison is reported by HF001 against the training
    arguments instead.

    ## Why is this bad?
    DeepSpeed asserts "Check batch related parameters. train_batch_size is not equal to
    micro_batch_per_gpu * gradient_acc_step * world_size" when it builds its config.

    ## Example
    ```json
    {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}
    ```
    launched on 4 GPUs (4 × 4 × 4 = 64).

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}
    ```
    (DeepSpeed then computes `train_batch_size` itself), or a consistent `train_batch_size: 64`.

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig._batch_assertion`
    """
    world = launch.world_size.value
    if not world:
        return
    linked = {id(ds) for _, ds in launch.training_pairs()}
    for doc in launch.ds_configs:
        if id(doc) in linked:
            continue
        tbs, mb, ga = (concrete_int(doc.get(k)) for k in BATCH_KEYS)
        if None in (tbs, mb, ga) or tbs == mb * ga * world:
            continue
        yield Hit(doc, doc.get("train_batch_size"),
                  f"train_batch_size {tbs} != micro batch {mb} × gradient accumulation {ga} × world size {world} "
                  f"({launch.world_size.reason}): DeepSpeed's batch assertion fails at initialize — remove "
                  f"train_batch_size or set it to {mb * ga * world}")


@rule("DS007", "duplicate-json-key", Severity.ERROR, packages=("deepspeed", "transformers", "accelerate"),
      versions="all DeepSpeed versions",
      witness="tests/rules/test_deepspeed_config.py::test_ds007_witness")
def duplicate_json_key(launch: Launch) -> Iterator[Hit]:
    """A key appears twice in the same object of a DeepSpeed JSON config.

    ## Why is this bad?
    DeepSpeed's own loader (`DeepSpeedConfig(path)`, `deepspeed --deepspeed_config`) refuses the file
    (`dict_raise_error_on_duplicate_keys`: "Duplicate keys in DeepSpeed config"). The HF Trainer and
    accelerate read the file with `json.load`, which keeps the **last** value silently, so the first one
    you wrote does nothing: an error for a raw DeepSpeed launch, a warning under the HF integration.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "stage": 3}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3}}
    ```

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig.__init__` (`hjson.load(..., object_pairs_hook=
      dict_raise_error_on_duplicate_keys)`)
    - `accelerate/utils/deepspeed.py` `HfDeepSpeedConfig` (`json.load`)
    """
    for doc in launch.ds_configs:
        if doc.fmt != "json":
            continue
        hf = launch.uses_hf_integration(doc)
        for node in doc.root.walk():
            for key, earlier in node.duplicates:
                last = node.value.get(key)
                where = f"line {last.line}" if last is not None and last.line else "the last one"
                if hf:
                    yield Hit(doc, earlier, f"`{earlier.path}` is set twice: the HF integration keeps the last value "
                                            f"({where}) and ignores this one (DeepSpeed's own loader would refuse the "
                                            f"file) — keep one", severity=Severity.WARNING)
                else:
                    yield Hit(doc, earlier, f"`{earlier.path}` is set twice: DeepSpeed refuses a config file with "
                                            f"duplicate keys (json.load would keep {where}) — keep one")


@rule("DS008", "removed-deepspeed-feature", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed >= 0.19.7 (nebula, compression_training, quantize_training, sparse_attention, mics_*); "
               ">= 0.19.8 (amp, sparse_gradients, eigenvalue, elasticity, graph_harvesting, curriculum_learning, "
               "progressive_layer_drop, zeropp_loco_param)",
      witness="tests/rules/test_deepspeed_config.py::test_ds008_witness")
def removed_deepspeed_feature(launch: Launch) -> Iterator[Hit]:
    """A config block for a feature DeepSpeed has removed (`amp`, `sparse_attention`, `elasticity`, ...).

    With an unknown DeepSpeed version the finding is a warning.

    ## Why is this bad?
    Since 0.19.7 (more keys in 0.19.8) DeepSpeed refuses these keys with `DeepSpeedConfigError` when it builds its config,
    rather than silently training without the feature. Older configs (Apex `amp`, MoQ
    `quantize_training`, MiCS `mics_shard_size`) break on upgrade.

    ## Example
    ```json
    {"amp": {"enabled": true, "opt_level": "O1"}}
    ```

    ## Use instead
    ```json
    {"bf16": {"enabled": true}}
    ```
    or pin an older DeepSpeed (< 0.19.7 / < 0.19.8, see above) if you rely on the feature.

    ## References
    - DeepSpeed issue #8489; `deepspeed/runtime/config.py` `_reject_removed_config_keys` (0.19.7 and 0.19.8 sdists)
    """
    severity = None if launch.versions.get("deepspeed") is not None else Severity.WARNING
    for doc in launch.ds_configs:
        for key, (why, since) in REMOVED_TOP_LEVEL.items():
            node = doc.get(key)
            if node is not None and ds_version_in(launch, f">={since}"):
                yield Hit(doc, node, f"`{key}`: {why}; DeepSpeed >= {since} refuses the config "
                                     f"(DeepSpeedConfigError) — remove it or pin an older DeepSpeed",
                          severity=severity)
        zero = doc.get("zero_optimization")
        if zero is None or not zero.is_mapping:
            continue
        for key, (why, since) in REMOVED_ZERO_KEYS.items():
            node = zero.child(key)
            if node is not None and ds_version_in(launch, f">={since}"):
                yield Hit(doc, node, f"`zero_optimization.{key}`: {why}; DeepSpeed >= {since} refuses "
                                     f"the config (DeepSpeedConfigError) — remove it",
                          severity=severity)


def zero_stage(doc: Document) -> Optional[int]:
    """The ZeRO stage DeepSpeed runs for a config (:func:`zeropilot.launch.facts.zero_stage`), None if unknown."""
    return facts_zero_stage(doc)[0]


@rule("DS009", "zero3-setting-below-stage-3", Severity.WARNING, packages=("deepspeed",),
      versions="all DeepSpeed versions",
      witness="tests/rules/test_deepspeed_config.py::test_ds009_witness")
def zero3_setting_below_stage_3(launch: Launch) -> Iterator[Hit]:
    """A ZeRO-3-only setting (`offload_param`, `stage3_*`) in a config whose stage is below 3.

    ## Why is this bad?
    Parameter partitioning, prefetching, persistence thresholds, live-parameter limits and parameter
    offload exist only in ZeRO-3: at stages 0-2 DeepSpeed accepts these keys and does nothing with them,
    so memory you expected to save with `offload_param` is not saved.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    ```
    or remove the ZeRO-3 keys at stage 2.

    ## References
    - `deepspeed/runtime/engine.py` `_configure_zero_optimizer` (stage 1/2 build `DeepSpeedZeroOptimizer`,
      which takes no parameter-offload or `stage3_*` argument)
    - `deepspeed/runtime/zero/stage3.py` (the only reader of these settings)
    """
    for doc in launch.ds_configs:
        stage = zero_stage(doc)
        zero = doc.get("zero_optimization")
        if stage is None or stage >= 3 or zero is None or not zero.is_mapping:
            continue
        for key, child in zero.value.items():
            if key == "offload_param" and child.is_mapping and child.value.get("device") is not None \
                    and child.value["device"].value not in ("none", None):
                yield Hit(doc, child, f"`offload_param` does nothing at ZeRO stage {stage}: only ZeRO-3 "
                                      f"partitions and offloads parameters — use stage 3 or remove it")
            elif key.startswith("stage3_") and key in STRICT_SECTIONS["zero_optimization"].keys and not is_auto(child):
                yield Hit(doc, child, f"`{key}` does nothing at ZeRO stage {stage} (ZeRO-3 only) — remove it or "
                                      f"use stage 3", severity=Severity.INFO)


def gradient_clipping_filled(launch: Launch, doc: Document) -> bool:
    """Whether something sets gradient clipping for this config (a value, or the HF integration's fill)."""
    return doc.get("gradient_clipping") is not None


@rule("DS010", "gradient-clipping-default-changed", Severity.INFO, gates=(Gate("deepspeed", ">=0.19.3"),),
      versions="deepspeed >= 0.19.3 (default 1.0; before: 0.0, no clipping)",
      witness="tests/rules/test_deepspeed_config.py::test_ds010_witness")
def gradient_clipping_default_changed(launch: Launch) -> Iterator[Hit]:
    """The config does not set `gradient_clipping`, whose default changed from 0.0 to 1.0 in 0.19.3.

    The HF Trainer fills `gradient_clipping` from `max_grad_norm` only when the key is present (as
    `"auto"` or a number): when it is absent, DeepSpeed's default applies whatever `max_grad_norm` says.

    ## Why is this bad?
    Gradients are clipped to norm 1.0 with DeepSpeed >= 0.19.3 and not clipped at all before: the same
    config trains differently across versions, and `--max_grad_norm` has no effect.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
    ```
    (`"auto"` under the HF Trainer, or the number you want).

    ## References
    - DeepSpeed PR #8068; `deepspeed/runtime/constants.py` `GRADIENT_CLIPPING_DEFAULT` (`0.` in the 0.19.0
      sdist, `1.0` in 0.19.3)
    - `transformers/integrations/deepspeed.py` `fill_match` (fills only keys that are present)
    """
    for doc in launch.ds_configs:
        if gradient_clipping_filled(launch, doc) or not doc.root.value:
            continue
        yield Hit(doc, None, "`gradient_clipping` is not set: DeepSpeed >= 0.19.3 clips at 1.0 by default (before: "
                             "no clipping), and max_grad_norm is not applied — set it (\"auto\" under the HF "
                             "Trainer)", line=1, key="gradient_clipping")


def auto_fix(doc: Document, node: Node, what: str) -> Optional[Fix]:
    """A safe fix that sets a DeepSpeed value to ``"auto"`` (the HF integration then fills it)."""
    edit = replace_value(doc, node, "auto")
    if edit is None:
        return None
    return Fix(f"set {what} to \"auto\"", Applicability.SAFE, (edit,))


def section_keys() -> List[str]:
    return sorted(STRICT_SECTIONS)


@rule("DS011", "stage-1-2-setting-at-stage-3", Severity.INFO, packages=("deepspeed",),
      versions="all DeepSpeed versions with ZeRO-3 (checked on 0.19.8)",
      witness="tests/rules/test_deepspeed_config.py::test_ds011_witness")
def stage_1_2_setting_at_stage_3(launch: Launch) -> Iterator[Hit]:
    """`allgather_bucket_size` in a ZeRO-3 config, where nothing reads it.

    ## Why is this bad?
    Only the ZeRO-1/2 optimizer (and the bf16 optimizer without ZeRO) take `allgather_bucket_size`; the
    ZeRO-3 optimizer gathers parameters with `stage3_prefetch_bucket_size` and
    `stage3_max_live_parameters`. Tuning it at stage 3 changes nothing (a common source of confusion when
    memory does not move).

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "allgather_bucket_size": 2e8}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 2e8}}
    ```

    ## References
    - `deepspeed/runtime/engine.py` `_configure_zero_optimizer`, `_configure_bf16_optimizer` (the only
      callers of `zero_allgather_bucket_size()`)
    - `deepspeed/runtime/zero/stage3.py` `DeepSpeedZeroOptimizer_Stage3.__init__` (no such argument)
    """
    for doc in launch.ds_configs:
        node = doc.get("zero_optimization.allgather_bucket_size")
        if node is not None and zero_stage(doc) == 3 and not is_auto(node):
            yield Hit(doc, node, "`allgather_bucket_size` does nothing at ZeRO stage 3 (only stages 1-2 read it) "
                                 "— remove it; stage 3 prefetches by stage3_prefetch_bucket_size")


# Deprecated zero_optimization keys: (what to write instead, whether DeepSpeed maps the value, safe rename).
DEPRECATED_ZERO_KEYS = {
    "cpu_offload": ('"offload_optimizer": {"device": "cpu"}', True, None),
    "cpu_offload_param": ('"offload_param": {"device": "cpu"}', True, None),
    "cpu_offload_use_pin_memory": ('"pin_memory" inside offload_optimizer / offload_param', False, None),
    "stage3_gather_fp16_weights_on_model_save": ('"stage3_gather_16bit_weights_on_model_save"', True,
                                                 "stage3_gather_16bit_weights_on_model_save"),
}


@rule("DS012", "deprecated-zero-key", Severity.INFO, packages=("deepspeed",),
      versions="deepspeed >= 0.6 (deprecated fields of DeepSpeedZeroConfig, still accepted in 0.19.8)",
      witness="tests/rules/test_deepspeed_config.py::test_ds012_witness", fixable=True)
def deprecated_zero_key(launch: Launch) -> Iterator[Hit]:
    """A deprecated `zero_optimization` key (`cpu_offload`, `cpu_offload_param`, `cpu_offload_use_pin_memory`,
    `stage3_gather_fp16_weights_on_model_save`).

    ## Why is this bad?
    DeepSpeed still maps most of them to the new settings with a warning, but `cpu_offload_use_pin_memory`
    is dropped (it sets nothing), and configs mixing old and new names fail ("Cannot provide deprecated
    parameter ... and replacing parameter ... together"). Tools that read the JSON themselves (the HF
    integration's offload detection) only know the new names.

    ## Example
    ```json
    {"zero_optimization": {"stage": 2, "cpu_offload": true}}
    ```

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    ```

    ## Fix safety
    Only `stage3_gather_fp16_weights_on_model_save` is renamed automatically (safe: DeepSpeed maps it to
    the same field). The offload keys change shape and are left to you.

    ## References
    - `deepspeed/runtime/zero/config.py` (fields with `deprecated=True`, `new_param`, `set_new_param`)
    - `deepspeed/runtime/config_utils.py` `DeepSpeedConfigModel._process_deprecated_field`
    """
    for doc in launch.ds_configs:
        zero = doc.get("zero_optimization")
        if zero is None or not zero.is_mapping:
            continue
        for key, (instead, mapped, rename) in DEPRECATED_ZERO_KEYS.items():
            node = zero.child(key)
            if node is None:
                continue
            effect = "DeepSpeed maps it with a warning" if mapped else "DeepSpeed ignores its value"
            fix = None
            if rename and zero.child(rename) is None:
                edit = rename_key(doc, node, rename)
                fix = Fix(f"rename to {rename}", Applicability.SAFE, (edit,)) if edit else None
            yield Hit(doc, node, f"`zero_optimization.{key}` is deprecated: {effect} — write {instead}", fix=fix,
                      severity=Severity.WARNING if not mapped else None)
