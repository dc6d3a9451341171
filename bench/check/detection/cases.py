"""Test cases taken from DeepSpeed's, transformers' and accelerate's own test suites.

Each case names the upstream test it comes from and what that test expects (``refuse`` / ``accept``); ``run.py``
re-verifies every expectation on the installed libraries (the verdict used for scoring is the installed one) and
then runs ``zeropilot check`` on the same files. Cases are config-level (what a user writes in a file or script);
tests of internal classes are expressed as the config section the class validates (``DeepSpeedFP16Config(**kw)``
→ ``{"fp16": kw}``). Non-finite numbers (``inf``/``nan``) are left out: JSON cannot write them.

Fields: name, source (``repo:path::test``), expect (upstream), verify (how the library judges it: ``ds``
DeepSpeedConfig at ``world``; ``hf`` the Trainer's DeepSpeed steps with ``train`` arguments; ``acc_plugin``
accelerate's DeepSpeedPlugin (``mixed_precision``); ``acc_prepare`` Accelerator.prepare with an ``optimizer``
(real/dummy); ``init`` deepspeed.initialize (``client`` optimizer, ``action``)), config, and the launch files
check sees.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

DS = "deepspeedai/DeepSpeed"
TF = "huggingface/transformers"
AC = "huggingface/accelerate"
DICT = f"{DS}:tests/unit/runtime/test_ds_config_dict.py"
MODEL = f"{DS}:tests/unit/runtime/test_ds_config_model.py"
ZCFG = f"{DS}:tests/unit/runtime/zero/test_zero_config.py"
LOSS = f"{DS}:tests/unit/runtime/test_precision_config_loss_scale.py"
DYN = f"{DS}:tests/unit/runtime/test_precision_config_dynamic_scale.py"
TFT = f"{TF}:tests/deepspeed/test_deepspeed.py"
ACT = f"{AC}:tests/deepspeed/test_deepspeed.py"

# transformers tests/deepspeed/ds_config_zero2.json and ds_config_zero3.json (as stored).
TF_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": 2e8, "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}
TF_ZERO3 = {
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
             "min_loss_scale": 1},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e14, "reduce_bucket_size": 0,
                          "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_fp16_weights_on_model_save": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500}},
    "steps_per_print": 2000, "wall_clock_breakdown": False,
}
RAW_SCRIPT = "import deepspeed\nengine, *_ = deepspeed.initialize(model=model, config='ds.json')\n"


def _case(name, source, expect, verify, config, world=1, **extra) -> Dict[str, Any]:
    return dict(name=name, source=source, expect=expect, verify=verify, config=config, world=world, **extra)


def _batch_cases() -> List[Dict[str, Any]]:
    """TestBatchConfig: world size 2, the subsets of (train, micro, gas) the test tries for each row."""
    out = []
    for batch, micro, gas, ok in [(32, 16, 1, True), (32, 8, 2, True), (33, 17, 2, False), (32, 18, 1, False)]:
        subsets = [("tmg", dict(train_batch_size=batch, train_micro_batch_size_per_gpu=micro,
                                gradient_accumulation_steps=gas)),
                   ("tm", dict(train_batch_size=batch, train_micro_batch_size_per_gpu=micro))]
        if ok:
            subsets += [("tg", dict(train_batch_size=batch, gradient_accumulation_steps=gas)),
                        ("mg", dict(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas))]
            if gas == 1:
                subsets += [("m", dict(train_micro_batch_size_per_gpu=micro)), ("t", dict(train_batch_size=batch))]
        else:
            subsets += [("g", dict(gradient_accumulation_steps=gas))]
            if gas != 1:
                subsets += [("tg", dict(train_batch_size=batch, gradient_accumulation_steps=gas))]
        for tag, values in subsets:
            out.append(_case(f"batch_{batch}_{micro}_{gas}_{tag}", f"{DICT}::TestBatchConfig",
                             "accept" if ok else "refuse", "ds", dict(values, steps_per_print=100), world=2,
                             script=RAW_SCRIPT, launcher="deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds.json"))
    return out


def _fp16(name, source, expect, section) -> Dict[str, Any]:
    return _case(name, source, expect, "ds", {"train_micro_batch_size_per_gpu": 1, "fp16": section})


def _zero(name, expect, section, source=ZCFG) -> Dict[str, Any]:
    return _case(name, source, expect, "ds", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": section})


def cases() -> List[Dict[str, Any]]:
    out = _batch_cases()
    out += [
        _case("only_train_batch_size", f"{MODEL}::test_only_required_fields", "accept", "ds",
              {"train_batch_size": 64}),
        _case("duplicate_key", f"{MODEL}::test_config_duplicate_key", "refuse", "ds", None,
              text='{\n    "train_batch_size": 24,\n    "train_batch_size": 24,\n    "steps_per_print": 10\n}\n'),
        _case("compression_training", f"{DICT}::test_compression_training_without_legacy_quantize_training_uses_"
              "defaults", "accept", "ds",
              {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
               "compression_training": {"weight_quantization": {"shared_parameters": {"enabled": True},
                                                                "different_groups": {}}}}),
        _case("base_config_bf16", f"{DICT}::TestConfigLoad::test_dict", "accept", "ds",
              {"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
               "bf16": {"enabled": True}}),
        _case("bfloat16_key", f"{DICT}::test_get_bfloat16_enabled", "accept", "ds",
              {"train_batch_size": 1, "bfloat16": {"enabled": True}}),
    ]
    for key in ("stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"):
        out.append(_zero(f"gather_{key}", "accept", {key: True}, f"{DICT}::test_gather_16bit_params_on_model_save"))
    for v in (0, 1.0, 128.0, 65536.0):
        out.append(_fp16(f"loss_scale_{v}", f"{MODEL}::test_fp16_loss_scale_valid", "accept", {"loss_scale": v}))
    out.append(_fp16("loss_scale_-1.0", f"{MODEL}::test_fp16_loss_scale_rejects_negative", "refuse",
                     {"loss_scale": -1.0}))
    for v in (-1, True, [], {}):
        out.append(_fp16(f"loss_scale_{json.dumps(v)}", f"{LOSS}::test_fp16_loss_scale_rejects_invalid_values",
                         "refuse", {"loss_scale": v}))
    for v in (0, 1, 2.0, "3"):
        out.append(_fp16(f"loss_scale_ok_{json.dumps(v)}", f"{LOSS}::test_fp16_loss_scale_accepts_valid_values",
                         "accept", {"loss_scale": v}))
    for field in ("loss_scale_window", "min_loss_scale"):
        for v in (0, -1, True, [], {}):
            out.append(_fp16(f"{field}_{json.dumps(v)}", f"{DYN}::test_fp16_dynamic_scale_rejects_invalid_values",
                             "refuse", {field: v}))
        for v in (1, 1000, "2"):
            out.append(_fp16(f"{field}_ok_{json.dumps(v)}", f"{DYN}::test_fp16_dynamic_scale_accepts_valid_values",
                             "accept", {field: v}))
    out += [
        _zero("reduce_bucket_size_1", "accept", {"reduce_bucket_size": 1}),
        _zero("reduce_bucket_size_0", "refuse", {"reduce_bucket_size": 0}),
        _zero("deprecated_cpu_offload_param", "accept", {"cpu_offload_param": True}),
        _zero("deprecated_cpu_offload", "accept", {"cpu_offload": True}),
        _zero("alias_prefetch", "accept", {"stage3_prefetch_bucket_size": 12345}),
        _zero("alias_persistence", "accept", {"stage3_param_persistence_threshold": 12345}),
        _zero("alias_reuse", "accept", {"stage3_max_reuse_distance": 12345}),
        _zero("offload_empty", "accept", {"offload_param": {}, "offload_optimizer": {}}),
        _zero("offload_none", "accept", {"offload_param": None, "offload_optimizer": None}),
        _zero("adaptive_prefetch_flag", "accept", {"stage3_adaptive_prefetch_bucket_size": True}),
        _zero("adaptive_prefetch_min", "accept", {"stage3_adaptive_prefetch_min_size": 5_000_000}),
        _zero("offload_pipeline_rw", "accept", {"offload_optimizer": {"pipeline_read": True, "pipeline_write": False}}),
    ]
    for stage in (0, 1, 2, 3):
        out.append(_zero(f"stage_{stage}", "accept", {"stage": stage}))
    out += _transformers_cases() + _accelerate_cases() + _init_cases()
    return out


def _transformers_cases() -> List[Dict[str, Any]]:
    mismatch = json.loads(json.dumps(TF_ZERO2))
    mismatch.update(train_micro_batch_size_per_gpu=4, train_batch_size=1000, gradient_accumulation_steps=4,
                    gradient_clipping=1.1)
    mismatch["optimizer"]["params"]["betas"] = [0.8, 0.89]
    mismatch["fp16"]["enabled"] = False
    no_opt = json.loads(json.dumps(TF_ZERO2))
    del no_opt["optimizer"]
    no_opt["zero_force_ds_cpu_optimizer"] = False
    args = {"output_dir": "out", "fp16": True}
    return [
        _case("tf_zero2", f"{TFT}::test_fake_notebook_no_launcher", "accept", "hf", TF_ZERO2, train=args),
        _case("tf_zero3", f"{TFT}::test_fake_notebook_no_launcher", "accept", "hf", TF_ZERO3, train=args),
        _case("tf_mismatch", f"{TFT}::test_hf_ds_config_mismatch", "refuse", "hf", mismatch,
              train=dict(args, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_grad_norm=1.0,
                         adam_beta1=0.9, adam_beta2=0.99)),
        _case("tf_hf_optimizer_offload", f"{TFT}::test_hf_optimizer_with_offload", "accept", "hf", no_opt,
              train=args),
        _case("tf_init_zero3", f"{TFT}::test_init_zero3", "accept", "ds",
              {"train_batch_size": 1, "zero_optimization": {"stage": 3}}),
    ]


def _accelerate_cases() -> List[Dict[str, Any]]:
    no_zero = {k: v for k, v in TF_ZERO2.items() if k != "zero_optimization"}
    no_ga = {k: v for k, v in TF_ZERO2.items() if k != "gradient_accumulation_steps"}
    acc_yaml = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                "  deepspeed_config_file: ds.json\nnum_processes: 1\n")
    no_opt = {k: v for k, v in TF_ZERO2.items() if k not in ("optimizer", "scheduler")}
    return [
        _case("acc_no_zero_section", f"{ACT}::test_deepspeed_plugin", "refuse", "acc_plugin", no_zero,
              accelerate=acc_yaml),
        _case("acc_missing_ga", f"{ACT}::test_deepspeed_plugin", "accept", "acc_plugin", no_ga, accelerate=acc_yaml),
        _case("acc_dummy_optim_no_config_optimizer", f"{ACT}::test_prepare_deepspeed", "refuse", "acc_prepare",
              no_opt, accelerate=acc_yaml, optimizer="dummy"),
        _case("acc_real_optimizer_and_config_optimizer", f"{ACT}::test_prepare_deepspeed", "refuse", "acc_prepare",
              TF_ZERO2, accelerate=acc_yaml, optimizer="real"),
        _case("acc_mixed_precision_fp16_vs_bf16", f"{ACT}::test_accelerate_state_deepspeed", "refuse", "acc_plugin",
              dict(no_ga, bf16={"enabled": True}), mixed_precision="fp16",
              launcher="accelerate launch --mixed_precision fp16 --deepspeed_config_file ds.json train.py"),
    ]


def _init_cases() -> List[Dict[str, Any]]:
    """TestNoSyncCtxt (world size 2 upstream; one rank here): no_sync() at each stage, step() inside no_sync().
    The config's Adam gets ``torch_adam`` so that no CUDA/CPU Adam op is built on the CPU machine."""
    src = f"{DS}:tests/unit/runtime/test_no_sync_ctxt.py::TestNoSyncCtxt"
    out = []
    for stage in (0, 1, 2, 3):
        cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 1,
               "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
               "zero_optimization": {"stage": stage}}
        body = "    engine.backward(engine(x))\n"
        out.append(_case(f"no_sync_stage{stage}", f"{src}::test_zero_stage", "refuse" if stage > 1 else "accept",
                         "init", cfg, action="no_sync", script=_loop(body)))
        if stage < 2:
            out.append(_case(f"step_in_no_sync_stage{stage}", f"{src}::test_engine_step", "refuse", "init", cfg,
                             action="step_in_no_sync", script=_loop(body + "    engine.step()\n")))
    return out


def _loop(body: str) -> str:
    return ("import deepspeed\nengine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), "
            "config='ds.json')\nwith engine.no_sync():\n  for x in data:\n" + body.replace("    ", "    "))
