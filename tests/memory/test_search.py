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


def _exhaustive(inputs):
    """What search() must return, by planning every candidate (no replay stopped early): per family (offload, stage,
    recomputation) the first that fits in rank order, the five fastest; else the candidate with the smallest peak."""
    from zeropilot.memory import make_plan
    from zeropilot.memory.search import _rank, _variants

    variants = {}
    for v in _variants(inputs):
        variants.setdefault(_rank(v), v)
    most = inputs.hardware.gpu_bytes * (1 - SAFE_MARGIN)
    peaks = {key: make_plan(v).gpu_peak_bytes for key, v in variants.items()}
    best = {}
    for key in sorted(peaks):
        if key[:3] not in best and peaks[key] <= most:
            best[key[:3]] = (key, peaks[key])
    return sorted(best.values())[:5], (None if best else min(peaks.values()))


@pytest.mark.parametrize("kw", [
    dict(hardware=parse_gpus("1x16GiB")),  # the seed on one card: most families cannot fit
    dict(),
    dict(hardware=parse_gpus("2x24GiB"), lora_rank=None, arch=from_config(CATALOGUE["qwen2.5-1.5b"], "q"), stage=2),
    dict(hardware=parse_gpus("1x80GiB"), lora_rank=None, arch=from_config(CATALOGUE["gemma-2-2b"], "g"),
         gradient_checkpointing=False, micro_batch=4, grad_accum=2, seq_len=2048),
    dict(lora_rank=None, hardware=parse_gpus("1x16GiB"), seq_len=8192),  # nothing fits
])
def test_search_stops_replays_only_where_the_plan_would_not_fit(kw):
    """``exceeds`` stops a candidate's allocator replay once it passes the limit (``plan --search`` 0.12-0.14 s
    against 0.8-2.1 s, ``bench/plan/speed.py``): the answer is the one planning every candidate gives, peak for peak."""
    from zeropilot.memory.gpu import _REPLAYS

    inputs = _seed(**kw)
    _REPLAYS.clear()
    expected, closest = _exhaustive(inputs)
    _REPLAYS.clear()  # the replays again, each stopped at the limit
    ranked, nearest = search(inputs)
    assert [(c.rank_key, c.plan.gpu_peak_bytes) for c in ranked] == expected
    assert (nearest.plan.gpu_peak_bytes if nearest else None) == closest


def test_exceeds_is_exact_where_training_sets_the_peak():
    """The replay plus memory outside PyTorch is the plan's peak where training sets it: passes ``peak - 1``, not
    ``peak``; a replay stopped early is not remembered as a result."""
    from zeropilot.memory import make_plan
    from zeropilot.memory.gpu import _REPLAYS, exceeds

    both_offloaded = dict(stage=3, offload_optimizer="cpu", offload_param="cpu", hardware=parse_gpus("1x16GiB"))
    for kw in (dict(stage=2), both_offloaded,
               dict(stage=1, lora_rank=None, arch=from_config(CATALOGUE["qwen2.5-0.5b"], "q"))):
        inputs = _seed(**kw)
        peak = make_plan(inputs).gpu_peak_bytes
        assert make_plan(inputs).gpu.peak_phase != "init"
        _REPLAYS.clear()
        assert exceeds(inputs, peak - 1)
        assert not exceeds(inputs, peak)
        assert make_plan(inputs).gpu_peak_bytes == peak
    _REPLAYS.clear()
    assert exceeds(_seed(stage=2, hardware=parse_gpus("1x16GiB")), 8 * 2**30) and not _REPLAYS  # stopped early


def test_search_refuses_values_out_of_range_before_any_replay():
    with pytest.raises(InputError, match="micro_batch"):
        search(_seed(micro_batch=0))
