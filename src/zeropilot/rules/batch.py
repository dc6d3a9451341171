"""Batch arithmetic when not all three batch values are given: DeepSpeed derives the missing ones, then asserts.

:func:`derive` is DeepSpeed's ``DeepSpeedConfig._set_batch_related_parameters`` and ``_batch_assertion``
(0.19.8, unchanged since 0.3), written as a pure function so that the rule can say which value is wrong and what
DeepSpeed would have computed. DS006 covers the case where all three are given and the world size is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.facts import BATCH_KEYS, Batch, facts
from zeropilot.rules.registry import Hit, Severity, rule

NOTHING_GIVEN = "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"


@dataclass(frozen=True)
class Derived:
    """What DeepSpeed ends with: the three values, and the assertion that fails (None when all hold)."""

    train: Optional[int]
    micro: Optional[int]
    ga: Optional[int]
    error: Optional[str]


def derive(t: Optional[int], m: Optional[int], g: Optional[int], world: int) -> Derived:
    """DeepSpeed's batch derivation and assertion for the given values (None: absent) at ``world`` ranks."""
    if t is not None and m is not None and g is None:
        g = t // m // world if m else None
    elif t is not None and g is not None and m is None:
        m = t // world // g if g else None
    elif m is not None and g is not None and t is None:
        t = m * g * world
    elif t is not None and m is None and g is None:
        g, m = 1, t // world
    elif m is not None and t is None and g is None:
        t, g = m * world, 1
    elif None in (t, m, g):
        return Derived(t, m, g, NOTHING_GIVEN)
    for name, value in (("train batch size", t), ("micro batch size", m), ("gradient accumulation steps", g)):
        if value is None or value <= 0:
            return Derived(t, m, g, f"{name} {value} has to be greater than 0")
    if t != m * g * world:
        return Derived(t, m, g, f"train_batch_size {t} != {m} * {g} * {world}")
    return Derived(t, m, g, None)


def unsatisfiable(b: Batch) -> Optional[str]:
    """Why no world size can satisfy the given values, or None."""
    t, m, g = b.train, b.micro, b.ga
    if t is None or t <= 0:
        return None
    if m and g and m > 0 and g > 0 and t % (m * g):
        return f"train_batch_size {t} is not a multiple of micro batch {m} × gradient accumulation {g}"
    if m and g is None and m > 0 and t % m:
        return f"train_batch_size {t} is not a multiple of the micro batch {m}"
    if g and m is None and g > 0 and t % g:
        return f"train_batch_size {t} is not a multiple of gradient accumulation {g}"
    return None


def _given(b: Batch) -> str:
    return ", ".join(f"{k} {v}" for k, v in zip(BATCH_KEYS, (b.train, b.micro, b.ga)) if v is not None) or "none"


@rule("DS020", "batch-values-unsatisfiable", Severity.ERROR, packages=("deepspeed",),
      versions="all DeepSpeed versions (derivation unchanged since 0.3; checked on 0.19.8)",
      witness="tests/rules/test_batch.py::test_ds020_witness")
def batch_values_unsatisfiable(launch: Launch) -> Iterator[Hit]:
    """Batch values DeepSpeed cannot complete: too few given, or none that divides at the launch's world size.

    DeepSpeed derives a missing `gradient_accumulation_steps` as `train_batch_size // micro // world` (and the
    micro batch likewise), with integer division, then asserts `train_batch_size == micro × GA × world`. Reported:
    only `gradient_accumulation_steps` (or nothing) given to a raw DeepSpeed launch; values that fail the
    derivation at the launch's world size; and, with any world size, a `train_batch_size` that is not a multiple
    of the values given with it. Configs with batch values set to `"auto"` are left to the HF rules (HF001).

    ## Why is this bad?
    `DeepSpeedConfig` asserts ("Check batch related parameters", "has to be greater than 0", or "Either
    train_batch_size or train_micro_batch_size_per_gpu needs to be provided") in `deepspeed.initialize`, on
    every rank, after the model has loaded.

    ## Example
    ```json
    {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}
    ```
    (4 ranks: 30 // 4 // 4 = 1 accumulation step, and 4 × 1 × 4 = 16 ≠ 30).

    ## Use instead
    ```json
    {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}
    ```

    ## References
    - `deepspeed/runtime/config.py` `DeepSpeedConfig._set_batch_related_parameters`, `_batch_assertion`
    """
    world = launch.world_size.value
    for f in facts(launch).ds:
        b = f.batch
        if b.auto or any(n is not None and v is None for n, v in zip(b.nodes, (b.train, b.micro, b.ga))):
            continue  # "auto" (the HF integration fills it) or a non-number (DS003/DS004 and the oracle say)
        given = sum(v is not None for v in (b.train, b.micro, b.ga))
        anchor = b.nodes[0] or b.nodes[1] or b.nodes[2]
        if b.train is None and b.micro is None:
            if f.hf is False:
                yield Hit(f.doc, anchor, f"only {_given(b)} is set: raw DeepSpeed needs train_batch_size or "
                                         f"train_micro_batch_size_per_gpu (assertion at initialize) — set the micro "
                                         f"batch", line=None if anchor else 1, key=None if anchor else BATCH_KEYS[1])
            continue
        why = unsatisfiable(b)
        if why:
            yield Hit(f.doc, b.nodes[0], f"{why}: no world size satisfies DeepSpeed's batch assertion — make it a "
                                         f"multiple")
            continue
        if given == 3 or not world:
            continue  # all three with a known world size: DS006
        d = derive(b.train, b.micro, b.ga, world)
        if d.error:
            yield Hit(f.doc, b.nodes[0] or anchor,
                      f"at world size {world} ({launch.world_size.reason}) DeepSpeed derives micro batch {d.micro}, "
                      f"gradient accumulation {d.ga} from {_given(b)}, then asserts: {d.error} — choose a "
                      f"train_batch_size divisible by micro × world, or give all three values")


@rule("DS021", "batch-key-missing-under-hf", Severity.ERROR, packages=("transformers", "deepspeed"),
      versions="transformers with HfTrainerDeepSpeedConfig.fill_match (checked on 5.24 with DeepSpeed 0.19.8)",
      witness="tests/rules/test_batch.py::test_ds021_witness")
def batch_key_missing_under_hf(launch: Launch) -> Iterator[Hit]:
    """A batch key absent from a DeepSpeed config the HF Trainer reads: it fills only keys set to `"auto"`.

    With neither `train_batch_size` nor `train_micro_batch_size_per_gpu` in the file it is an error. With the micro
    batch present but `gradient_accumulation_steps` absent while the training arguments accumulate, or with
    `train_batch_size: "auto"` but no micro batch, it is a warning: DeepSpeed derives the missing value itself and
    disagrees with the training arguments without a word.

    ## Why is this bad?
    `HfTrainerDeepSpeedConfig.fill_match` replaces `"auto"` values and never adds a key. Without both batch keys
    `DeepSpeedConfig` asserts "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided" when
    the Trainer builds the engine. With `gradient_accumulation_steps` missing, DeepSpeed is built with 1 while the
    arguments say 4 (seen: train batch 2 instead of 8); with only `train_batch_size: "auto"`, it derives a micro batch
    of per-device × accumulation (8 instead of 2).

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    ```
    with `gradient_accumulation_steps: 4` in the training arguments.

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
     "zero_optimization": {"stage": 2}}
    ```

    ## References
    - `transformers/integrations/deepspeed.py` `HfTrainerDeepSpeedConfig.fill_match`, `trainer_config_process`
    - `deepspeed/runtime/config.py` `_set_batch_related_parameters`
    """
    from zeropilot.rules.hf_integration import reads_as_hf, train_arg

    for train, ds in facts(launch).hf_pairs:
        if not reads_as_hf(train):
            continue
        b = facts(launch).for_doc(ds).batch
        present = [n is not None for n in b.nodes]
        ga = train_arg(train, "gradient_accumulation_steps")
        if not present[0] and not present[1]:
            yield Hit(ds, None, "neither train_batch_size nor train_micro_batch_size_per_gpu is in the config: the HF "
                                "Trainer fills only keys set to \"auto\", so DeepSpeed asserts when the engine is built "
                                "— add \"train_micro_batch_size_per_gpu\": \"auto\"", line=1, key=BATCH_KEYS[1])
        elif present[1] and not present[2] and isinstance(ga, int) and ga > 1:
            yield Hit(ds, b.nodes[1], f"gradient_accumulation_steps is not in the config: the Trainer fills only "
                                      f"\"auto\" keys, so DeepSpeed is built with 1 while the training arguments say "
                                      f"{ga} — add \"gradient_accumulation_steps\": \"auto\"",
                      severity=Severity.WARNING)
        elif present[0] and not present[1] and "train_batch_size" in b.auto:
            yield Hit(ds, b.nodes[0], "train_micro_batch_size_per_gpu is not in the config: the Trainer fills only "
                                      "\"auto\" keys, so DeepSpeed derives the micro batch from train_batch_size "
                                      "(per-device × accumulation) instead of per_device_train_batch_size — add "
                                      "\"train_micro_batch_size_per_gpu\": \"auto\"", severity=Severity.WARNING)
