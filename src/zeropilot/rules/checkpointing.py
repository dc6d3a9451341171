"""Rules about what HF Trainer + DeepSpeed checkpoints hold: resumable or not, weights or not, frozen bases,
and whether they can be loaded by the launch's world size.

Which files a save writes was seen on real runs (transformers 5.24, DeepSpeed 0.19.8, 2 CPU ranks, see
``tests/witness/trainer_runs.py``); what older transformers do was read in their ``trainer.py``
(``Trainer.save_model`` and ``_save_optimizer_and_scheduler``), named in each rule's references.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from zeropilot.launch import Document, Launch, Node
from zeropilot.launch.facts import facts, is_on
from zeropilot.rules.deepspeed_config import zero_stage
from zeropilot.rules.registry import Hit, Severity, rule

GATHER_KEYS = ("zero_optimization.stage3_gather_16bit_weights_on_model_save",
               "zero_optimization.stage3_gather_fp16_weights_on_model_save")


def gathers_16bit(ds: Document) -> bool:
    """stage3_gather_16bit_weights_on_model_save (or its old fp16 name); DeepSpeed's default is false."""
    return any(is_on(ds.get(key)) for key in GATHER_KEYS)


def gather_node(ds: Document) -> Optional[Node]:
    for key in GATHER_KEYS:
        node = ds.get(key)
        if node is not None:
            return node
    return None


def uses_peft(launch: Launch, train: Document) -> bool:
    """Whether the training wraps the model in PEFT (:meth:`zeropilot.launch.facts.LaunchFacts.peft`)."""
    return facts(launch).peft(train)


def hf_pairs(launch: Launch) -> List[Tuple[Document, Document, int]]:
    """(training args, DeepSpeed config, ZeRO stage) for every HF Trainer launch with a readable stage."""
    out = []
    for train, ds in launch.training_pairs():
        stage = zero_stage(ds)
        if stage is not None:
            out.append((train, ds, stage))
    return out


def _peft_saves_adapter_only(launch: Launch, peft: bool) -> bool:
    """transformers >= 5.0 saves a PEFT model under ZeRO-3 as its adapter, without the engine."""
    return peft and launch.versions.satisfies("transformers", ">=5.0") is True


def _engine_saves_on_save_model(launch: Launch, train: Document, ds: Document, stage: int) -> bool:
    """Whether ``Trainer.save_model`` falls back to ``engine.save_checkpoint`` (ZeRO-3 without gather)."""
    return stage == 3 and not gathers_16bit(ds) and not _peft_saves_adapter_only(launch, uses_peft(launch, train))


@rule("CK001", "save-only-model-not-resumable", Severity.WARNING, packages=("transformers", "deepspeed"),
      versions="all transformers versions with save_only_model (>= 4.36)",
      witness="tests/rules/test_checkpointing.py::test_ck001_witness")
def save_only_model_not_resumable(launch: Launch) -> Iterator[Hit]:
    """`save_only_model: true` under DeepSpeed where the checkpoints then hold weights only.

    ## Why is this bad?
    With `save_only_model` the Trainer skips `engine.save_checkpoint`, the optimizer, the scheduler and
    the RNG state. Unless ZeRO-3 runs without `stage3_gather_16bit_weights_on_model_save` (see CK002),
    a `checkpoint-N` folder then holds only `model.safetensors` (or the adapter) and the trainer state:
    `resume_from_checkpoint` on it raises `ValueError: Can't find a valid checkpoint at …`, and a crash
    at step 900 restarts from step 0. Saving only the model does not avoid a deadlock either: there is
    none to avoid (the seed guides' claim is wrong).

    ## Example
    ```yaml
    deepspeed: ds_z3_config.json   # stage 3, stage3_gather_16bit_weights_on_model_save: true
    save_only_model: true
    ```

    ## Use instead
    ```yaml
    deepspeed: ds_z3_config.json
    save_only_model: false   # resumable: engine shards + optimizer + scheduler + RNG
    save_total_limit: 2      # bound the disk use instead
    ```

    ## References
    - `transformers/trainer.py` `Trainer._save_checkpoint` (`if not self.args.save_only_model:`)
    - `transformers/integrations/deepspeed.py` `deepspeed_load_checkpoint` ("Can't find a valid checkpoint")
    - LlamaFactory #2631
    """
    for train, ds, stage in hf_pairs(launch):
        node = train.get("save_only_model")
        if not is_on(node) or _engine_saves_on_save_model(launch, train, ds, stage):
            continue
        resume = " — and this launch resumes from a checkpoint" if train.get("resume_from_checkpoint") else ""
        yield Hit(train, node, f"save_only_model: true under DeepSpeed ZeRO-{stage}: checkpoints hold weights "
                               "only, no optimizer, scheduler or RNG state, so resuming from them fails with "
                               f"\"Can't find a valid checkpoint\"{resume}; set save_only_model: false and "
                               "bound disk use with save_total_limit.")


@rule("CK002", "save-only-model-ignored-without-gather", Severity.WARNING, packages=("transformers", "deepspeed"),
      versions="transformers >= 4.36 with DeepSpeed ZeRO-3 (PEFT models from transformers 5.0 excepted)",
      witness="tests/rules/test_checkpointing.py::test_ck002_witness")
def save_only_model_ignored_without_gather(launch: Launch) -> Iterator[Hit]:
    """`save_only_model: true` with ZeRO-3 and `stage3_gather_16bit_weights_on_model_save` false or absent.

    ## Why is this bad?
    Without gathering, ZeRO-3 cannot produce a full state dict, so `Trainer.save_model` falls back to
    `engine.save_checkpoint`, which writes every rank's model **and optimizer** shards
    (`zero_pp_rank_*_optim_states.pt`): each save is as large as a full checkpoint although
    `save_only_model` asked for weights only, and no loadable `model.safetensors` is written. The
    setting is not dangerous (there is no deadlock), it is ignored. DeepSpeed's default for the gather
    key is **false**; LLaMA-Factory's shipped `ds_z3_config.json` sets it true. From transformers 5.0 a
    PEFT (LoRA) model is saved as its adapter instead, and this rule stays quiet for it.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": false}}
    ```
    with `save_only_model: true` in the training arguments.

    ## Use instead
    ```json
    {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}}
    ```
    to save 16-bit weights only (gathered layer by layer on rank 0), or `save_only_model: false` to get
    resumable checkpoints on purpose.

    ## References
    - `transformers/trainer.py` `Trainer.save_model` (the `except ValueError` fallback to `save_checkpoint`)
    - `accelerate/accelerator.py` `Accelerator.get_state_dict` (raises without gather under ZeRO-3)
    - `deepspeed/runtime/zero/config.py` (`gather_16bit_weights_on_model_save` default False)
    """
    for train, ds, stage in hf_pairs(launch):
        node = train.get("save_only_model")
        if not is_on(node) or not _engine_saves_on_save_model(launch, train, ds, stage):
            continue
        gather = gather_node(ds)
        how = "is false" if gather is not None else "is not set (DeepSpeed's default is false)"
        yield Hit(train, node, f"save_only_model is ignored here: under ZeRO-3 stage3_gather_16bit_weights_on_"
                               f"model_save {how}, so every save writes all model and optimizer shards "
                               "anyway; set stage3_gather_16bit_weights_on_model_save: true to save weights "
                               "only, or drop save_only_model to keep resumable checkpoints.")


@rule("CK003", "save-only-model-with-load-best", Severity.ERROR, packages=("transformers",),
      versions="transformers >= 4.38.0",
      witness="tests/rules/test_checkpointing.py::test_ck003_witness")
def save_only_model_with_load_best(launch: Launch) -> Iterator[Hit]:
    """`save_only_model` and `load_best_model_at_end` together under DeepSpeed.

    ## Why is this bad?
    The Trainer refuses the combination: `ValueError: DeepSpeed can't be used with save_only_model
    along with load_best_model_at_end.` (raised while the Trainer is built, after the model loaded;
    transformers 5.24 raises it in `Trainer.create_accelerator_and_postprocess`). Loading the best
    checkpoint back into a ZeRO engine needs the engine's own checkpoint, which save_only_model skips.

    ## Example
    ```yaml
    deepspeed: ds_z3_config.json
    save_only_model: true
    load_best_model_at_end: true
    ```

    ## Use instead
    ```yaml
    deepspeed: ds_z3_config.json
    save_only_model: false
    load_best_model_at_end: true
    save_total_limit: 2
    ```

    ## References
    - `transformers/trainer.py` `Trainer.create_accelerator_and_postprocess`
    - transformers PR #28866 (first released in 4.38.0)
    """
    if launch.versions.satisfies("transformers", ">=4.38.0") is False:
        return
    for train, _ds, _stage in hf_pairs(launch):
        node = train.get("save_only_model")
        best = train.get("load_best_model_at_end")
        if is_on(node) and is_on(best):
            yield Hit(train, best, "load_best_model_at_end with save_only_model under DeepSpeed: the Trainer "
                                   "raises ValueError when it is built (after the model loaded); drop "
                                   "save_only_model, or turn load_best_model_at_end off.")


def _frozen_base_case(launch: Launch, train: Document, ds: Document, stage: int) -> Optional[str]:
    """Why this launch writes the frozen base into its checkpoints, or None when it does not."""
    old = launch.versions.satisfies("transformers", "<4.37")
    new = launch.versions.satisfies("transformers", ">=5.0")
    only_model = is_on(train.get("save_only_model"))
    fallback = stage == 3 and not gathers_16bit(ds)
    if new is True:
        return None
    if old is True and not only_model:
        return "transformers < 4.37 saves every checkpoint with engine.save_checkpoint without exclude_frozen_parameters"
    if fallback and only_model:
        version = "" if old is not None else " (transformers 4.37–4.x)"
        return ("with save_only_model and no gather, Trainer.save_model falls back to engine.save_checkpoint "
                f"without exclude_frozen_parameters{version}")
    return None


@rule("CK004", "frozen-base-in-every-checkpoint", Severity.WARNING, packages=("transformers", "deepspeed", "peft"),
      versions="transformers < 4.37: every save without save_only_model; < 5.0: ZeRO-3 without gather "
               "with save_only_model; never from 5.0 (4.57.6 and 5.0.0 trainer.py read)",
      witness="tests/rules/test_checkpointing.py::test_ck004_witness")
def frozen_base_in_every_checkpoint(launch: Launch) -> Iterator[Hit]:
    """A LoRA/PEFT run whose DeepSpeed checkpoints hold the whole frozen base model, on every save.

    ## Why is this bad?
    `engine.save_checkpoint` writes frozen parameters unless it is called with
    `exclude_frozen_parameters=True` (DeepSpeed >= 0.10.1): ZeRO-1/2 put the whole 16-bit module in
    `mp_rank_00_model_states.pt`, ZeRO-3 each rank's slice of the frozen weights in its
    `zero_pp_rank_*_model_states.pt`. For a 7B LoRA run that is gigabytes per save for a few megabytes
    of adapter (the seed user's 4 x 7.65 GB `model_states` next to 4 x 825 MB `optim_states`). The
    Trainer passes the flag for PEFT models in `_save_optimizer_and_scheduler` since 4.37, but not on
    the `save_model` fallback that ZeRO-3 takes without gather, which is the only engine save when
    `save_only_model` is on. From 5.0 `save_model` gathers just the adapter and the frozen base is never
    written (seen on 5.24 with ZeRO-2 and ZeRO-3, gather on and off).

    ## Example
    ```yaml
    finetuning_type: lora
    deepspeed: ds_z3.json   # stage 3, stage3_gather_16bit_weights_on_model_save: false
    save_only_model: true
    ```

    ## Use instead
    ```yaml
    finetuning_type: lora
    deepspeed: ds_z3.json   # with "stage3_gather_16bit_weights_on_model_save": true
    save_only_model: false
    ```
    or upgrade transformers to >= 5.0, or use ZeRO-2 (LoRA rarely needs ZeRO-3).

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine.save_checkpoint(exclude_frozen_parameters=...)`
    - `transformers/trainer.py` `Trainer.save_model` and `_save_optimizer_and_scheduler` (4.37–4.57: fallback
      without the flag; 5.0: `_zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)` for PEFT)
    - transformers PR #27825 (4.37: exclude frozen parameters for PEFT); DeepSpeed PR #3953
    """
    for train, ds, stage in hf_pairs(launch):
        if not uses_peft(launch, train):
            continue
        why = _frozen_base_case(launch, train, ds, stage)
        if why is None:
            continue
        node = (train.get("save_only_model") if is_on(train.get("save_only_model")) else None) \
            or train.get("finetuning_type") or train.get("adapter") or train.get("deepspeed")
        yield Hit(train, node, f"every checkpoint of this LoRA run holds the whole frozen base model: {why}; "
                               "set stage3_gather_16bit_weights_on_model_save: true and save_only_model: false, "
                               "or upgrade transformers to >= 5.0.")


@rule("CK005", "zero3-save-model-writes-no-weights", Severity.INFO, packages=("transformers", "deepspeed"),
      versions="all", witness="tests/rules/test_checkpointing.py::test_ck005_witness")
def zero3_save_model_writes_no_weights(launch: Launch) -> Iterator[Hit]:
    """Full fine-tuning under ZeRO-3 without `stage3_gather_16bit_weights_on_model_save`.

    ## Why is this bad?
    `Trainer.save_model` (each checkpoint and the final save) cannot build a state dict without
    gathering, so it writes only DeepSpeed's rank shards and no `model.safetensors`:
    `from_pretrained(output_dir)` then fails or loads nothing. The weights are recoverable offline
    from the shards, which is often the better choice for large models (no gather on rank 0 at each
    save), but it has to be planned for.

    ## Example
    ```json
    {"zero_optimization": {"stage": 3}}
    ```

    ## Use instead
    Keep it and export after training (`zeropilot ckpt export CHECKPOINT OUT`, or DeepSpeed's
    `zero_to_fp32.py`), or gather at each save:
    ```json
    {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}}
    ```

    ## References
    - `transformers/trainer.py` `Trainer.save_model` (fallback: "Saving the full checkpoint instead, use
      zero_to_fp32.py to recover weights")
    - `deepspeed/runtime/zero/config.py` (`gather_16bit_weights_on_model_save` default False)
    """
    for train, ds, stage in hf_pairs(launch):
        if stage != 3 or gathers_16bit(ds) or uses_peft(launch, train):
            continue
        node = gather_node(ds) or ds.get("zero_optimization.stage")
        yield Hit(ds, node, "ZeRO-3 without stage3_gather_16bit_weights_on_model_save: save_model writes only "
                            "rank shards, no loadable model.safetensors; export after training with `zeropilot "
                            "ckpt export` (or zero_to_fp32.py), or set the key true to gather at each save.")


def _last_checkpoint(train: Document) -> Optional[Path]:
    """The ``checkpoint-N`` with the highest N in a training document's output_dir (what resume=True takes)."""
    out = train.value("output_dir")
    if not isinstance(out, str) or not out.strip():
        return None
    raw = Path(out.strip()).expanduser()
    for base in ([raw] if raw.is_absolute() else [train.path.parent / raw, Path.cwd() / raw]):
        if base.is_dir():
            found = [p for p in base.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
            return max(found, key=lambda p: int(p.name[11:])) if found else None
    return None


def _explicit_resume(train: Document) -> Optional[Tuple[Path, Node]]:
    node = train.get("resume_from_checkpoint")
    if node is None:
        return None
    if is_on(node):
        last = _last_checkpoint(train)
        return (last, node) if last is not None else None
    if not isinstance(node.value, str) or node.value.strip().lower() in ("", "false", "none", "null"):
        return None
    raw = Path(node.value.strip()).expanduser()
    for base in ([raw] if raw.is_absolute() else [train.path.parent / raw, Path.cwd() / raw]):
        if base.is_dir():
            return base, node
    return None


def _resume_targets(launch: Launch) -> Iterator[Tuple[Path, Optional[Document], Optional[Node]]]:
    """(checkpoint folder, doc, node) for each checkpoint a launch resumes from (doc set) or holds."""
    seen = set()
    for train in launch.train_args:
        target = _explicit_resume(train)
        if target is not None:
            seen.add(target[0].resolve())
            yield target[0], train, target[1]
    for folder in launch.checkpoint_dirs:
        if folder.resolve() not in seen and folder.resolve().parent not in seen:
            yield folder, None, None


def _saved_layout(folder: Path) -> Tuple[Optional[int], Optional[int]]:
    """(world size, ZeRO stage) of the checkpoint in a folder, from file names and pickle opcodes."""
    from zeropilot.checkpoint.layout import read_layout
    from zeropilot.errors import InputError

    try:
        layout = read_layout(folder)
    except (InputError, OSError):
        return None, None
    return layout.world_size, layout.stage


def _loads_universal(launch: Launch) -> bool:
    return any(is_on(ds.get("checkpoint.load_universal")) for ds in launch.ds_configs)


@rule("CK006", "resume-on-another-world-size", Severity.ERROR, packages=("deepspeed",),
      versions="all (universal checkpoints: DeepSpeed >= 0.14.5 for ZeRO-3)",
      witness="tests/rules/test_checkpointing.py::test_ck006_witness")
def resume_on_another_world_size(launch: Launch) -> Iterator[Hit]:
    """Resuming from a ZeRO checkpoint saved by a different number of ranks than this launch starts.

    ## Why is this bad?
    A ZeRO checkpoint holds one optimizer partition per rank. Loading it on another world size fails
    when the engine loads the optimizer state, after the model and data are loaded: `ZeRORuntimeException:
    The checkpoint being loaded used a DP world size of 2 but the current world size is 1` (seen for
    ZeRO-2 and ZeRO-3 through the HF Trainer). `resume_from_checkpoint: true` takes the last
    `checkpoint-N` of `output_dir`; a `checkpoint-N` folder found beside the launch is reported as a
    warning, since it is resumed only when asked (or by LLaMA-Factory's automatic resume).

    ## Example
    A `checkpoint-500` written by 4 ranks, resumed by `NPROC_PER_NODE=2`.

    ## Use instead
    Resume with the same number of ranks, or convert the checkpoint to a universal one and load that:
    ```
    python -m deepspeed.checkpoint.ds_to_universal --input_folder checkpoint-500/global_step500 \\
        --output_folder checkpoint-500/global_step500_universal
    echo global_step500_universal > checkpoint-500/latest
    ```
    ```json
    {"checkpoint": {"load_universal": true}}
    ```
    (ZeRO-3 needs DeepSpeed >= 0.14.5), or export the weights and start a fresh run.

    ## References
    - `deepspeed/runtime/engine.py` `DeepSpeedEngine._load_zero_checkpoint` (the world-size check)
    - `deepspeed/checkpoint/ds_to_universal.py`; DeepSpeed docs "Universal Checkpointing"
    """
    world = launch.world_size.value
    if world is None or _loads_universal(launch):
        return
    for folder, doc, node in _resume_targets(launch):
        saved, stage = _saved_layout(folder)
        if saved is None or saved == world:
            continue
        universal = "convert it with ds_to_universal and set checkpoint.load_universal"
        if stage == 3 and launch.versions.satisfies("deepspeed", "<0.14.5") is True:
            universal = "upgrade DeepSpeed to >= 0.14.5 to convert it to a universal checkpoint (ZeRO-3)"
        message = (f"checkpoint {folder.name} was saved by {saved} ranks but this launch starts {world} "
                   f"({launch.world_size.reason}): DeepSpeed refuses its ZeRO optimizer state on load "
                   f"(ZeRORuntimeException); resume with {saved} ranks, or {universal}.")
        if doc is not None:
            yield Hit(doc, node, message)
        else:
            # A checkpoint beside the launch is only resumed when asked (resume_from_checkpoint: true,
            # LLaMA-Factory's automatic resume): a warning, not an error.
            yield Hit(None, None, message, file=folder, key="checkpoint", severity=Severity.WARNING)
