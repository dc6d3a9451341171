"""--search: ranked configurations that fit with the margin, global batch kept, order by speed."""

import pytest

from zeropilot.errors import InputError
from zeropilot.memory import SAFE_MARGIN, PlanInputs, deepspeed_config, parse_gpus, search
from zeropilot.models import CATALOGUE, from_config

QWEN2_7B = from_config(CATALOGUE["qwen2-7b"], "Qwen2-7B")


def _seed(**kw):
    base = dict(arch=QWEN2_7B, hardware=parse_gpus("4x16GiB"), stage=3, micro_batch=1, grad_accum=16,
                seq_len=1024, lora_rank=16, gradient_checkpointing=True)
    base.update(kw)
    return PlanInputs(**base)


def test_seed_scenario_gets_a_fitting_ranked_answer():
    ranked, closest = search(_seed())
    assert ranked and closest is None
    for cand in ranked:
        p = cand.plan.inputs
        assert cand.plan.gpu_peak_bytes <= p.hardware.gpu_bytes * (1 - SAFE_MARGIN)
        assert p.micro_batch * p.grad_accum == 16  # the global batch is kept
    keys = [c.rank_key for c in ranked]
    assert keys == sorted(keys)


def test_zero2_comes_before_zero3_when_both_fit():
    ranked, _ = search(_seed(hardware=parse_gpus("4x80GiB")))
    stages = [c.plan.inputs.stage for c in ranked]
    assert stages[0] == 2 and 3 in stages and stages.index(2) < stages.index(3)
    assert ranked[0].plan.inputs.offload_optimizer == "none"


def test_nothing_fits_gives_the_closest():
    ranked, closest = search(_seed(lora_rank=None, hardware=parse_gpus("1x16GiB"), seq_len=8192))
    assert ranked == [] and closest is not None and not closest.fits


def test_search_needs_hardware():
    with pytest.raises(InputError, match="--gpus"):
        search(_seed(hardware=None))


def test_deepspeed_config_keeps_hf_auto_batch_keys_and_offload_sections():
    cfg = deepspeed_config(_seed(offload_optimizer="cpu", offload_param="cpu"))
    assert cfg["train_micro_batch_size_per_gpu"] == "auto"
    assert cfg["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert cfg["zero_optimization"]["stage"] == 3


def test_training_changes_use_the_launch_dialect():
    from zeropilot.memory import training_changes

    before = _seed(gradient_checkpointing=True, flavour="llamafactory")
    after = before.with_(gradient_checkpointing=False, micro_batch=2, grad_accum=8)
    assert training_changes(before, after) == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                                               "disable_gradient_checkpointing": True}
    hf = _seed(gradient_checkpointing=True, flavour="hf")
    assert training_changes(hf, hf.with_(gradient_checkpointing=False)) == {"gradient_checkpointing": False}
