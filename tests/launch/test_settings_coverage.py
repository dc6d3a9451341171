"""Every memory-relevant argument of LLaMA-Factory is modelled by the plan or named by it as not modelled.

Two lists, each with a verdict per argument:

- ``tests/data/llamafactory_0.9.5_args.tsv``: LLaMA-Factory 0.9.5's own arguments, every annotated field of its
  argument dataclasses (``llamafactory/hparams/{data,finetuning,model,training}_args.py`` of the wheel, read with
  ``ast``: the library is not installed here, it pins its own transformers);
- ``tests/data/hf_training_args.tsv``: the HF ``Seq2SeqTrainingArguments`` LLaMA-Factory's ``TrainingArguments``
  extends, walked here on the installed transformers: a field added or removed upstream fails until it is judged.

A verdict is ``memory`` (then the key must be in ``launch.coverage``'s MODELLED, NOT_MODELLED or READ_AS_INPUT), or
one of :data:`NOT_MEMORY`'s words, or ``sub-option of KEY`` for a setting that only matters with KEY, which must
itself be modelled or named.
"""

import ast
import dataclasses
from pathlib import Path

import pytest

from tests.conftest import write_files
from zeropilot.launch.settings import KEYS
from zeropilot.launch.coverage import MODELLED, NOT_MODELLED, READ_AS_INPUT, modelled_or_named

DATA = Path(__file__).resolve().parents[1] / "data"
SRC = Path(__file__).resolve().parents[2] / "src" / "zeropilot"

#: Why an argument does not change GPU memory.
NOT_MEMORY = {
    "io": "paths, names, hub, logging, profiling and launcher settings",
    "data": "which samples and how they are tokenised or ordered (lengths come from cutoff_len)",
    "evaluation": "evaluation and prediction between training steps (the plan sizes training steps)",
    "inference": "inference, export and serving",
    "same-tensors": "values that change what is computed, not which tensors exist or their sizes (learning rates, "
                    "loss weights, scalings, seeds; reentrant or not, checkpointing keeps each layer's input)",
    "internal": "set by LLaMA-Factory itself (init=False)",
    "other-backend": "DDP's settings (DeepSpeed replaces DDP)",
}


def _rows(name):
    out = []
    for line in (DATA / name).read_text().splitlines():
        if line and not line.startswith("#"):
            *_, key, verdict = line.split("\t")
            out.append((key, verdict))
    return out


def _judged(rows):
    """Keys whose verdict does not hold: uncovered memory keys, unknown words, sub-options of uncovered keys."""
    bad = []
    for key, verdict in rows:
        if verdict == "memory":
            ok = modelled_or_named(key) is not None
        elif verdict.startswith("sub-option of "):
            ok = modelled_or_named(verdict[len("sub-option of "):]) is not None
        else:
            ok = verdict in NOT_MEMORY
        if not ok:
            bad.append(f"{key}: {verdict}")
    return bad


def test_llamafactory_arguments_are_modelled_or_named():
    rows = _rows("llamafactory_0.9.5_args.tsv")
    assert len(rows) == 223
    assert _judged(rows) == []


def test_hf_training_arguments_walked_on_installed_transformers():
    transformers = pytest.importorskip("transformers")
    listed = dict(_rows("hf_training_args.tsv"))
    fields = {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments) if f.init}
    assert sorted(fields - set(listed)) == [], "new training arguments: judge them in tests/data/hf_training_args.tsv"
    assert sorted(set(listed) - fields) == [], "arguments gone from transformers: drop them from the list"
    assert _judged(listed.items()) == []


def test_named_settings_are_read_by_the_launch_facts():
    """A key NOT_MODELLED names is one the launch facts read (else it could never be listed)."""
    read = {k for keys in KEYS.values() for k in keys}
    assert sorted(set(NOT_MODELLED) - read) == []


def test_inputs_are_read_by_the_plan_facts():
    tree = ast.parse((SRC / "launch" / "planfacts.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert sorted(set(READ_AS_INPUT) - strings - {"bf16", "fp16", "deepspeed"}) == []
    assert not set(READ_AS_INPUT) & set(NOT_MODELLED) and not set(MODELLED) & set(NOT_MODELLED)


@pytest.mark.parametrize("line,named", [
    ("label_smoothing_factor: 0.1", "label_smoothing_factor"),
    ("oft_block_size: 32", "oft_block_size"),
    ("torch_empty_cache_steps: 10", "torch_empty_cache_steps"),
    ("image_min_pixels: 1024", "image_min_pixels"),
])
def test_a_named_setting_reaches_the_plan(tmp_path, line, named):
    from zeropilot.launch import load_launch
    from zeropilot.launch.planfacts import plan_facts

    root = write_files(tmp_path / "l", {"train.yaml": "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\n"
                                                      f"template: qwen\noutput_dir: o\n{line}\n"})
    pf = plan_facts(load_launch([root], use_installed=False))
    assert any(setting.startswith(named + ":") for setting, _ in pf.values["not_modelled"])
