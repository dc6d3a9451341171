"""OOM fixes as what-ifs of the plan, on a real H200 OOM record given the setup the guard records in a rank.

The record is ``fixtures/oom/capacity.json`` (taken before the guard recorded setups); each test adds the
``setup``/``batch`` the guard writes for the job described, so the plan sizes *this* run.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zeropilot.guard.verdicts import classify_oom, just_before

GIB = 1 << 30
PAIRS = Path(__file__).resolve().parents[2] / "bench" / "guard" / "data" / "oom_pairs"
QWEN05 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
          "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
          "max_position_embeddings": 32768, "tie_word_embeddings": True}


def _base():
    rec = json.loads((Path(__file__).parent / "fixtures" / "oom" / "capacity.json").read_text())
    rec.pop("verdict")
    rec.pop("fixes")
    return rec


def _long_batch():
    """The issue's job: HF Trainer, ZeRO-3, LoRA r16, 8 GiB card, 256-token batches, then one of 32,768."""
    rec = _base()
    rec["allocator_limit_bytes"] = 8 * GIB - rec["mem"]["outside_torch_bytes"]
    rec["mem"]["allocated_bytes"], rec["request_bytes"] = int(6.5 * GIB), int(9.3 * GIB)
    rec["setup"] = {"model": {"config": QWEN05, "lora": {"type": "LORA", "r": 16, "target_modules": "all-linear"},
                              "gradient_checkpointing": False, "attn": "sdpa"},
                    "zero": {"stage": 3, "offload_optimizer": "none", "offload_param": "none"},
                    "train": {"micro_batch": 1, "grad_accum": 1, "world_size": 1, "precision": "bf16",
                              "optimizer": "torch.optim.adamw.AdamW", "gradient_checkpointing_arg": False}}
    rec["batch"] = {"micro_batch_size": 1, "seq_len": 32768, "tokens": 32768}
    rec["batch_history"] = {"steps": 4, "kept": 4, "median_seq_len": 256, "max_seq_len": 256,
                            "last_seq_lens": [256] * 4}
    return rec


def test_a_long_batch_is_named_and_capping_the_length_comes_first_with_its_predicted_peak():
    verdict, fixes = classify_oom(_long_batch())
    assert verdict["kind"] == "capacity" and "128 times the run's median length" in verdict["summary"]
    first = fixes[0]
    assert first["key"] == "seq_len_outlier" and first["ranked"] and first["fits"]
    assert 256 <= first["change"]["seq_len"] < 32768
    assert first["predicted_peak_bytes"] <= first["limit_bytes"] == 8 * GIB
    assert any("plan of this run at this batch" in e for e in verdict["evidence"])


def test_never_a_change_the_launch_already_has():
    _, fixes = classify_oom(_long_batch())
    keys = {f["key"] for f in fixes}
    assert "stage" not in keys  # already ZeRO-3
    assert "micro_batch" not in keys  # already 1
    assert all(f["change"].get("stage") != 3 or f["key"] == "offload_param" for f in fixes)


def test_fixes_that_fit_come_first_and_each_ranked_one_has_a_predicted_peak():
    rec = _base()
    rec["setup"] = {"model": {"config": QWEN05, "lora": None, "gradient_checkpointing": False},
                    "zero": {"stage": 2, "offload_optimizer": "none", "offload_param": "none"},
                    "train": {"micro_batch": 16, "grad_accum": 1, "world_size": 1, "precision": "bf16",
                              "optimizer": "torch.optim.adamw.AdamW"}}
    rec["batch"] = {"micro_batch_size": 16, "seq_len": 2048, "tokens": None}
    _, fixes = classify_oom(rec)
    ranked = [f for f in fixes if f["ranked"]]
    assert ranked and all(isinstance(f["predicted_peak_bytes"], int) for f in ranked)
    fits = [f["fits"] for f in ranked]
    assert fits[0] is True and fits == sorted(fits, reverse=True)
    assert "micro_batch" in fixes[0]["key"]
    assert fixes[0]["change"]["micro_batch"] * fixes[0]["change"]["grad_accum"] == 16  # the same global batch


def test_a_save_that_added_no_memory_is_not_blamed():
    rec = copy.deepcopy(_long_batch())
    same = {"reserved_bytes": 5 * GIB, "peak_reserved_bytes": 6 * GIB}
    rec["step"] = 4
    rec["last_save"] = {"step": 4, "mem_before": same, "mem_peak": same, "mem_after": same, "steps_since": 0}
    line = just_before(rec)
    assert "added no GPU memory" in line and "5.00 GiB before" in line
    rec["last_save"]["mem_peak"] = {"peak_reserved_bytes": 7 * GIB}
    rec["last_save"]["mem_after"] = {"reserved_bytes": 7 * GIB}
    assert "changed GPU memory" in just_before(rec) and "7.00 GiB at its peak" in just_before(rec)


def test_a_peft_models_lora_reads_the_same_in_the_rank_as_in_the_written_record():
    """Regression (H200 call of 2026-12-02, hf-long-batch): PEFT's ``peft_type`` is a ``str`` enum that ``json``
    writes as ``"LORA"`` but ``str()`` spells ``"PeftType.LORA"``; the rank's what-ifs read the live value, took the
    LoRA run for a full fine-tuning and offered no length cap, while the written record (and every test) said LoRA."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from zeropilot.guard import setup

    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=128)
    model = peft.get_peft_model(transformers.Qwen2ForCausalLM(cfg),
                                peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    lora = setup.model_facts(model)["lora"]
    assert type(lora["type"]) is str and lora["type"] == "LORA" and lora["r"] == 16
    record = json.loads((PAIRS / "hf-long-batch" / "oom-rank-0.json").read_text())
    record.pop("verdict"), record.pop("fixes")
    record["setup"]["model"]["lora"] = lora  # the live values, not read back from JSON
    _, fixes = classify_oom(record)
    assert fixes[0]["change"] == {"seq_len": 896} and fixes[0]["fits"] is True
