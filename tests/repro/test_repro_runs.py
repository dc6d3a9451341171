"""``zeropilot repro`` on real DeepSpeed (CPU, gloo, 2 ranks): exact resumes and the non-exact ones it must name, and
resumes on 1 and 3 ranks through the universal checkpoint ``zeropilot ckpt universal`` writes, loaded by DeepSpeed's
own loader (``load_universal``).

One module-scoped run does every configuration: all cases of a leg share one process group (one engine after the
other), so the whole matrix costs two launches of 2 ranks plus one of 1 rank and one of 3 (the world-size changes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.conftest import write_files
from zeropilot.repro.prepare import prepare
from zeropilot.repro.spec import UNIVERSAL_TOLERANCE, Options

pytestmark = [pytest.mark.slow]

STEPS, EVERY = 6, 2
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": False}

# name -> (stage, LoRA?, precision, options beyond the defaults)
CASES: Dict[str, Tuple[int, bool, str, dict]] = {
    "z1-full": (1, False, "fp32", {}),
    "z2-full": (2, False, "bf16", {}),
    "z3-full": (3, False, "bf16", {}),
    "z1-lora": (1, True, "bf16", {}),
    "z2-lora": (2, True, "fp32", {}),
    "z3-lora": (3, True, "bf16", {}),
    "z2-no-optimizer": (2, False, "bf16", {"leave_out": ("optimizer",)}),
    "z3-lora-no-scheduler": (3, True, "bf16", {"leave_out": ("scheduler",)}),
    "z1-no-data-position": (1, False, "fp32", {"leave_out": ("data",)}),
    "z2-world-2-to-1": (2, False, "bf16", {"resume_nproc": 1, "resume_via": "zero"}),
}
# Through a universal checkpoint: 4 steps of 6 samples (2 ranks x 3 accumulation), resumed after step 2 on 1 rank
# (6 accumulation steps) or 3 (2 steps): the same samples in every step.
# Every stage, both new world sizes, bf16 and fp32 (its tolerance 1e-4), full and LoRA: four cases, not the six of
# every stage on both sizes, to keep the module's cost down (each case is one more engine in each leg's launch).
UNIVERSAL = {
    "z1-universal-2-to-3": (1, False, "bf16", 3),
    "z2-universal-2-to-1": (2, True, "bf16", 1),
    "z3-universal-2-to-3": (3, True, "bf16", 3),
    "z3-universal-2-to-1": (3, False, "fp32", 1),
}
for _name, (_stage, _lora, _precision, _ranks) in UNIVERSAL.items():
    CASES[_name] = (_stage, _lora, _precision, {"resume_nproc": _ranks, "steps": 4, "grad_accum": 3})
CASES["z2-universal-no-scheduler"] = (2, False, "bf16", {"resume_nproc": 3, "steps": 4, "grad_accum": 3,
                                                         "leave_out": ("scheduler",)})
EXACT = ("z1-full", "z2-full", "z3-full", "z1-lora", "z2-lora", "z3-lora")


def launch(root: Path, stage: int, lora: bool, precision: str) -> Path:
    """A LLaMA-Factory launch: training YAML + DeepSpeed JSON with the HF integration's "auto" values."""
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": stage}}
    lines = [f"model_name_or_path: {root / 'model'}", "stage: sft", "do_train: true",
             f"finetuning_type: {'lora' if lora else 'full'}", "deepspeed: ds.json", "cutoff_len: 16",
             "per_device_train_batch_size: 1", "gradient_accumulation_steps: 2", "learning_rate: 1.0e-3",
             "lr_scheduler_type: cosine", "warmup_ratio: 0.2", "output_dir: out", "dataset: x", "template: alpaca"]
    if lora:
        lines += ["lora_rank: 4", "lora_target: q_proj,v_proj"]
    if precision == "bf16":
        lines.append("bf16: true")
    return write_files(root, {"train.yaml": "\n".join(lines) + "\n", "ds.json": ds, "model/config.json": TINY})


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    from zeropilot.repro.run import run_cases

    base = tmp_path_factory.mktemp("repro")
    cases = []
    for name, (stage, lora, precision, extra) in CASES.items():
        folder = launch(base / "launches" / name, stage, lora, precision)
        spec, _ = prepare([str(folder)], None, Options(**{"cpu": True, "nproc": 2, "steps": STEPS, "save_every": EVERY,
                                                          **extra}))
        spec.name = name
        cases.append((spec, base / "runs" / name))
    results = run_cases(cases, timeout=600)
    return {v["case"]: v for v in results}


@pytest.mark.parametrize("name", EXACT)
def test_resume_is_bitwise_exact(verdicts, name):
    v = verdicts[name]
    assert v["failures"] == []
    assert v["resume_exact"] is True, v["differs"]
    parts = {"weights", "optimizer", "scheduler", "step", "rng", "data"}
    assert set(v["details"]) == parts | {"loss", "restored"}
    assert all(v["details"][p]["bitwise"] for p in parts | {"loss"})
    assert set(v["details"]["restored"]) == parts and all(d["bitwise"] for d in v["details"]["restored"].values())
    assert v["not_restored"] == []
    assert v["details"]["loss"]["n_compared"] == 2 * (STEPS - EVERY)  # every step after the resume, both ranks
    assert [(s["step"], s["rank"]) for s in v["saves"]] == [(2, 0), (2, 1), (4, 0), (4, 1)]
    assert all(s["bytes"] > 0 and s["seconds"] > 0 for s in v["saves"])


def test_lora_saves_leave_out_the_frozen_base(verdicts):
    """The HF Trainer saves PEFT models with exclude_frozen_parameters: the LoRA checkpoint is the smaller one."""
    full = sum(s["bytes"] for s in verdicts["z2-full"]["saves"] if s["step"] == 2)
    lora = sum(s["bytes"] for s in verdicts["z2-lora"]["saves"] if s["step"] == 2)
    assert verdicts["z2-lora"]["spec"]["exclude_frozen"] is True
    assert lora < full / 2


def test_resume_without_optimizer_state_is_named(verdicts):
    v = verdicts["z2-no-optimizer"]
    assert v["resume_exact"] is False
    # DeepSpeed's load_optimizer_states=False skips the whole ZeRO file: no Adam state, fp32 master weights rebuilt
    # from the bf16 ones (rounded), and the learning rate in force is the fresh optimizer's until the next step.
    assert v["not_restored"] == ["weights", "optimizer", "scheduler"]
    restored = v["details"]["restored"]
    assert all("fp32" in p for p in restored["weights"]["differing"])
    assert any("exp_avg" in p for p in restored["optimizer"]["differing"])
    assert "loss" in v["differs"]


def test_resume_with_a_restarted_schedule_is_named(verdicts):
    v = verdicts["z3-lora-no-scheduler"]
    assert v["resume_exact"] is False
    assert v["not_restored"] == ["scheduler"]
    # then every later step runs at another learning rate: weights and Adam moments follow
    assert {"scheduler", "loss", "weights"} <= set(v["differs"])


def test_resume_that_rereads_the_first_samples_is_named(verdicts):
    v = verdicts["z1-no-data-position"]
    assert v["resume_exact"] is False
    assert v["not_restored"] == ["data"]
    assert "data" in v["differs"] and "loss" in v["differs"]
    assert v["details"]["data"]["first_step_with_other_samples"] == EVERY + 1


def test_resume_on_another_world_size_is_named(verdicts):
    v = verdicts["z2-world-2-to-1"]
    assert v["resume_exact"] is not True
    assert "world_size" in v["differs"] and v["not_restored"] == ["world_size"]
    assert v["details"]["world_size"] == {"uninterrupted": 2, "resumed": 1}
    # ZeRO-2 refuses to load optimizer partitions saved by another number of ranks (FACTS B)
    assert [(f["leg"], f["kind"]) for f in v["failures"]] == [(2, "error")]  # leg 2 has one rank
    assert "DP world size of 2" in v["failures"][0]["message"]


def test_run_directory_opens_in_report(verdicts):
    from zeropilot.runlog import read_run, summarize

    v = verdicts["z3-lora"]
    summary = summarize(read_run(Path(v["run_dir"])))
    assert summary["verdict"]["kind"] == "ok"
    assert summary["steps"] == STEPS
    assert {(s["step"], s["rank"]) for s in summary["saves"]} >= {(2, 0), (2, 1), (4, 0), (4, 1)}
    assert sorted((ld["step"], ld["rank"]) for ld in summary["loads"]) == [(2, 0), (2, 1)]  # by time: either rank first
    saved = json.loads((Path(v["run_dir"]) / "repro.json").read_text())
    assert saved["resume_exact"] is True


@pytest.mark.parametrize("name", sorted(UNIVERSAL))
def test_universal_resume_on_another_world_size_follows_the_uninterrupted_run(verdicts, name):
    v = verdicts[name]
    stage, _lora, precision, ranks = UNIVERSAL[name]
    assert v["failures"] == [], v["failures"]
    assert v["spec"]["universal"] and v["spec"]["resume_nproc"] == ranks
    assert (v["spec"]["resume_micro_batch"], v["spec"]["resume_grad_accum"]) == (1, 6 // ranks)
    conv = v["universal"]  # leg 1's save at step 2, converted between the legs
    assert conv["tag"] == "global_step2" and conv["files"] > 0 and conv["states"][:3] == ["fp32", "exp_avg",
                                                                                          "exp_avg_sq"]
    assert sorted(ld["rank"] for ld in v["loads"]) == list(range(ranks))  # DeepSpeed's loader on every new rank
    tol = UNIVERSAL_TOLERANCE[precision]
    assert v["tolerance"]["kind"] == "relative" and v["tolerance"]["state"] == tol["state"]
    assert v["resume_exact"] is True, (v["differs"], v["details"])
    d = v["details"]
    assert set(d) == {"loss", "weights", "optimizer", "scheduler", "step", "data"}
    assert d["loss"]["n_compared"] == 2 and d["loss"]["max_rel_diff"] <= tol["loss"]  # steps 3 and 4
    for part in ("weights", "optimizer"):
        assert d[part]["max_rel_diff"] <= tol["state"] and d[part]["n_compared"] > 0
    assert d["scheduler"]["bitwise"] and d["step"]["bitwise"] and d["data"]["bitwise"]


def test_universal_resume_that_restarts_the_schedule_is_named(verdicts):
    """The control of the tolerance: a resume that loses a part moves the weights far past it."""
    v = verdicts["z2-universal-no-scheduler"]
    assert v["failures"] == [] and v["resume_exact"] is False
    assert {"scheduler", "weights"} <= set(v["differs"])
    assert v["details"]["weights"]["max_rel_diff"] > 3 * UNIVERSAL_TOLERANCE["bf16"]["state"]
    assert v["details"]["scheduler"]["max_rel_diff"] == float("inf")  # the schedule's step counters differ
