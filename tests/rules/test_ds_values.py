"""DS013-DS019 (values DeepSpeed refuses at load or initialize): fixtures, and witnesses on the installed DeepSpeed."""

import pytest

from tests.conftest import run_check

DS_NEW = "deepspeed=0.19.8"
OPT = {"type": "AdamW", "params": {"lr": 1e-3}}


def _cfg(**extra):
    cfg = {"train_micro_batch_size_per_gpu": 1}
    cfg.update(extra)
    return cfg


def _findings(launch_dir, cfg, code, versions=DS_NEW):
    return run_check(launch_dir({"ds.json": cfg}), versions=versions, select={code})


def _refusal(cfg):
    """What DeepSpeedConfig (the real one, no process group) says about a config: None when it accepts it."""
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        DeepSpeedConfig(dict(cfg))
    except Exception as exc:  # the refusal is the witness: any type
        return f"{type(exc).__name__}: {exc}"
    return None


# Each case: (rule, config, whether the rule fires). The witness asserts DeepSpeedConfig agrees on every one.
LOAD_CASES = [
    ("DS013", _cfg(gradient_allreduce_op="max"), True),
    ("DS013", _cfg(gradient_allreduce_op="sum", zero_optimization={"stage": 3}), True),
    ("DS013", _cfg(gradient_allreduce_op="SUM", zero_optimization={"stage": 2}), False),
    ("DS013", _cfg(gradient_allreduce_op="mean", zero_optimization={"stage": 3.0}), False),
    ("DS014", _cfg(checkpoint={"tag_validation": "strict"}), True),
    ("DS014", _cfg(checkpoint={"tag_validation": "fail"}), False),
    ("DS014", _cfg(checkpoint={"parallel_write": {"pipeline_stage": "yes"}}), True),
    ("DS015", _cfg(fp16={"enabled": True, "loss_scale": -1}), True),
    ("DS015", _cfg(fp16={"enabled": True, "loss_scale": True}), True),
    ("DS015", _cfg(fp16={"enabled": True, "loss_scale": 0, "loss_scale_window": 0}), True),
    ("DS015", _cfg(fp16={"enabled": True, "min_loss_scale": 0}), True),
    ("DS015", _cfg(fp16={"enabled": True, "loss_scale": 128, "min_loss_scale": 0}), False),
    ("DS015", _cfg(fp16={"enabled": True, "loss_scale_window": False}), True),
    ("DS015", _cfg(fp16={"enabled": False, "loss_scale_window": 0}), False),
    ("DS019", _cfg(zero_optimization={"stage": 3, "compute_grad_norm": False}), True),
    ("DS019", _cfg(zero_optimization={"stage": 2, "compute_grad_norm": False}), False),
    ("DS019", _cfg(zero_optimization={"stage": 2.5}), True),
    ("DS019", _cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), True),
    ("DS019", _cfg(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), False),
    ("DS019", _cfg(communication_data_type="int8"), True),
    ("DS019", _cfg(communication_data_type="BF16"), False),
    ("DS019", _cfg(bf16={"enabled": True, "bf16_master_weights_and_grads": True}), True),
    ("DS019", _cfg(bf16={"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
                   zero_optimization={"stage": 2}), False),
    ("DS019", _cfg(bf16={"enabled": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 2}), True),
    ("DS019", _cfg(data_types={"keep_in_fp32_modules": "norm"}), True),
    ("DS019", _cfg(data_types={"keep_in_fp32_modules": ["norm"]}), False),
    ("DS019", _cfg(zero_optimization={"stage": 3, "reduce_bucket_size": 0}), True),
    ("DS019", _cfg(zero_optimization={"stage": 3, "stage3_prefetch_bucket_size": 0}), False),
    ("DS019", _cfg(zero_optimization={"stage": 2, "allgather_bucket_size": -2}), True),
    ("DS019", _cfg(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}), True),
]


@pytest.mark.parametrize("code,cfg,fires", LOAD_CASES)
def test_load_rules(launch_dir, code, cfg, fires):
    assert bool(_findings(launch_dir, cfg, code)) is fires


def _load_witness(code):
    for c, cfg, fires in LOAD_CASES:
        if c == code:
            assert (_refusal(cfg) is not None) is fires, (cfg, _refusal(cfg))


@pytest.mark.witness
def test_ds013_witness():
    _load_witness("DS013")


@pytest.mark.witness
def test_ds014_witness():
    _load_witness("DS014")


@pytest.mark.witness
def test_ds015_witness():
    _load_witness("DS015")


@pytest.mark.witness
def test_ds019_witness():
    _load_witness("DS019")


def test_ds013_points_at_the_key(launch_dir):
    [f] = _findings(launch_dir, _cfg(gradient_allreduce_op="sum", zero_optimization={"stage": 3}), "DS013")
    assert f.key == "gradient_allreduce_op" and f.line == 3 and "ZeRO-3" in f.message


# ---- initialize-time rules, witnessed by tests/rules/init_probe.py ----------------------------------------------

INIT_CASES = [
    # (probe case, rule, config as the rule sees it, fires)
    ("allgather_odd_z1", "DS016", {"zero_optimization": {"stage": 1, "allgather_bucket_size": 500000001}}, True),
    ("allgather_odd_z2", "DS016", {"zero_optimization": {"stage": 2, "allgather_bucket_size": 3}}, True),
    ("allgather_even_z2", "DS016", {"zero_optimization": {"stage": 2, "allgather_bucket_size": 4}}, False),
    ("gad_fp32_bf16_z0", "DS018", {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}, True),
    ("gad_bf16_fp32_z0", "DS018", {"data_types": {"grad_accum_dtype": "bf16"}}, True),
    ("gad_fp32_bf16_z1", "DS018", {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
                                   "zero_optimization": {"stage": 1}}, False),
    ("gad_same_z0", "DS018", {"data_types": {"grad_accum_dtype": "fp32"}}, False),
    ("warmup_zero", "DS017", {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}, True),
    ("warmup_float", "DS017", {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10.0}}}, True),
    ("warmup_decay_neg", "DS017", {"scheduler": {"type": "WarmupDecayLR",
                                                 "params": {"warmup_num_steps": -5, "total_num_steps": 100}}}, True),
    ("warmup_ok", "DS017", {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}, False),
]


@pytest.mark.parametrize("case,code,cfg,fires", INIT_CASES)
def test_init_rules(launch_dir, case, code, cfg, fires):
    assert bool(_findings(launch_dir, _cfg(optimizer=OPT, **cfg), code)) is fires


def _init_witness(init_probe, code):
    for case, c, _, fires in INIT_CASES:
        if c == code:
            assert (init_probe[case] != "ok") is fires, (case, init_probe[case])


@pytest.mark.witness
@pytest.mark.slow
def test_ds016_witness(init_probe):
    _init_witness(init_probe, "DS016")
    assert "multiple of nccl_start_alignment_factor" in init_probe["allgather_odd_z2"]


@pytest.mark.witness
@pytest.mark.slow
def test_ds017_witness(init_probe):
    _init_witness(init_probe, "DS017")


@pytest.mark.witness
@pytest.mark.slow
def test_ds018_witness(init_probe):
    _init_witness(init_probe, "DS018")
    assert "unsupported mix" in init_probe["gad_fp32_bf16_z0"]


def test_ds017_quiet_before_0_19_6(launch_dir):
    cfg = _cfg(optimizer=OPT, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}})
    assert _findings(launch_dir, cfg, "DS017", versions="deepspeed=0.19.5") == []
