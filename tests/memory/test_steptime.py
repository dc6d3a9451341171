"""The time model (memory/steptime.py): its counts against a real transformers layer run under torch's dispatcher,
its run length against the HF Trainer's count, and the orderings every launch shows."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from zeropilot.memory import PlanInputs, parse_gpus
from zeropilot.memory.speed import Figure, Speed
from zeropilot.memory.steptime import ELEMENTWISE, KERNELS, estimate_time, run_time
from zeropilot.models import CATALOGUE, from_config

ROOT = Path(__file__).resolve().parents[2]
QWEN2_7B = from_config(CATALOGUE["qwen2-7b"], "Qwen2-7B")


def _fig(v):
    return Figure(v, "test figure", True)


#: an H100-like card with every figure given (the values are the order of magnitude, not a claim)
CARD = Speed("test card", _fig(989e12), _fig(700e12), _fig(400e12), _fig(3.0e12), _fig(50e9), _fig(50e9), _fig(1.5e9),
             _fig(0.3e9), _fig(10e-6), 16, intra_busbw_bytes_per_s=_fig(300e9))


def _inputs(**kw):
    base = dict(arch=QWEN2_7B, hardware=parse_gpus("1x80GiB"), stage=2, micro_batch=2, seq_len=2048, lora_rank=16,
                gradient_checkpointing=True)
    base.update(kw)
    return PlanInputs(**base)


def _census():
    spec = importlib.util.spec_from_file_location("op_census", ROOT / "bench" / "plan" / "time" / "op_census.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["op_census"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("lora", [0, 8])
def test_elementwise_bytes_and_kernels_are_those_of_a_real_layer(lora):
    """One decoder layer's non-matmul kernels, counted under torch's dispatcher on transformers' Llama layer (two
    layers minus one), against the formula the model uses."""
    pytest.importorskip("transformers")
    census = _census()
    args = dict(model_type="llama", hidden=384, inter=1152, heads=6, kv=2, vocab=512, tokens=96, lora=lora, gc=False,
                fp32_adapters=False, names=False)

    def run(layers):
        import argparse
        return census.census(argparse.Namespace(**args, layers=layers))

    one, two = run(1), run(2)
    method = "lora" if lora else "full"
    kv = 2 * 384 // 6
    for which in ("forward", "backward"):
        key = f"{which}.other"
        per_token = (two["bytes"][key] - one["bytes"][key]) / 96
        a, b, c = ELEMENTWISE[(method, which)]
        assert per_token == pytest.approx(a * 384 + b * 1152 + c * kv, rel=0.03)
        assert two["ops"][key] - one["ops"][key] == KERNELS[(method, which)]


def test_terms_add_up_and_phases_split_them():
    step = estimate_time(_inputs(), CARD)
    assert sum(t.seconds for t in step.terms) == pytest.approx(step.step_s)
    assert sum(step.phases().values()) == pytest.approx(step.step_s)
    assert step.tokens_per_s == pytest.approx(2 * 2048 / step.step_s)
    assert 0 < step.mfu < 1
    assert all(t.reason for t in step.terms)


def test_what_every_launch_shows():
    t = lambda **kw: estimate_time(_inputs(**kw), CARD).step_s  # noqa: E731
    assert t(gradient_checkpointing=True) > t(gradient_checkpointing=False)  # a second forward
    assert t(stage=3) > 1.5 * t(stage=2)  # ZeRO-3's hooks on every module on one GPU
    full = dict(lora_rank=None, gradient_checkpointing=False)
    assert t(offload_optimizer="cpu", **full) > 5 * t(**full)  # full fine-tuning: CPU Adam over 7.6 B elements
    assert t(offload_optimizer="cpu") > t()  # LoRA: nothing to gain, DeepSpeed's per-tensor offload work to pay
    assert t(fused_loss="liger") < t()  # the 152k-vocabulary logits never written in fp32
    assert t(micro_batch=1, grad_accum=4) == pytest.approx(4 * t(micro_batch=1) - 3 * estimate_time(
        _inputs(micro_batch=1), CARD).terms[-1].seconds, rel=1e-6)  # accumulation repeats the passes, not the step


def test_the_run_is_counted_as_the_hf_trainer_counts_it():
    step = estimate_time(_inputs(), CARD)
    # 1000 samples on 4 ranks: 250 each, 125 micro batches of 2, 32 optimizer steps of 4 (the last one short), x 2
    p = _inputs(hardware=parse_gpus("4x80GiB"), grad_accum=4, epochs=2.0, samples=1000)
    run = run_time(step, p, gpu_hour_cost=2.0)
    assert run.steps == 2 * math.ceil(math.ceil(math.ceil(1000 / 4) / 2) / 4) == 64
    assert run.seconds == pytest.approx(64 * step.step_s)
    assert run.gpu_hours == pytest.approx(run.seconds * step.world_size / 3600)
    assert run.cost == pytest.approx(2.0 * run.gpu_hours)
    assert run_time(step, _inputs(max_steps=10, epochs=3.0, samples=5)).steps == 10  # max_steps wins
    unknown = run_time(step, _inputs(epochs=2.0))
    assert unknown.steps is None and "--samples" in unknown.reason


def test_the_committed_time_accuracy_is_what_the_rows_give():
    """bench/plan/time/results/time.md, every figure docs/plan.md quotes about the time model, recomputed from the
    committed GPU rows with the model as it is."""
    spec = importlib.util.spec_from_file_location("time_accuracy", ROOT / "bench" / "plan" / "time" / "accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0
