"""What a launch says about a plan (``launch.planfacts``), read from real launch files (the seed scenario and a
healthy launch) and small ones, with where each value came from."""

from pathlib import Path

import pytest

from zeropilot.launch import load_launch
from zeropilot.launch.planfacts import plan_facts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_seed_launch_values_and_where_they_came_from():
    lv = plan_facts(load_launch([EXAMPLES / "seed"], use_installed=False))
    v = lv.values
    assert (v["stage"], v["seq_len"], v["micro_batch"], v["grad_accum"], v["lora_rank"]) == (3, 1024, 1, 16, 16)
    assert v["gradient_checkpointing"] is True  # LLaMA-Factory's default
    assert v["overlap_comm"] is False and v["reduce_bucket_size"] == 200_000_000
    assert v["prefetch_bucket_size"] == 20_000_000 and v["gather_16bit_on_save"] is False
    assert v["expandable_segments"] is False  # ROCm/DCU launch: not known to work there
    assert lv.world_size == 4
    assert lv.sources["seq_len"].text.endswith("binding_paired_000.yaml:16 cutoff_len")
    assert (lv.sources["seq_len"].line, lv.sources["seq_len"].key) == (16, "cutoff_len")
    assert "deepspeed_z3_offload_4x16g.json" in lv.sources["stage"].text
    assert lv.sources["gradient_checkpointing"].line is None  # implied by LLaMA-Factory, said by no line
    assert lv.model == "/public/home/a15657581978/merged_correct_2epoch"


def test_auto_bucket_sizes_are_kept_for_the_model_to_fill(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}')
    pf = plan_facts(load_launch([tmp_path / "ds.json"], use_installed=False))
    assert pf.values["reduce_bucket_size"] == "auto"
    assert pf.sources["reduce_bucket_size"].text.endswith('reduce_bucket_size ("auto": filled from hidden_size)')


def test_the_facts_are_read_once_and_frozen():
    launch = load_launch([EXAMPLES / "seed"], use_installed=False)
    pf = plan_facts(launch)
    assert plan_facts(launch) is pf
    with pytest.raises(TypeError):
        pf.values["stage"] = 2  # type: ignore[index]


def test_healthy_launch_reads_save_total_limit_and_cuda_expandable_segments():
    lv = plan_facts(load_launch([EXAMPLES / "healthy"], use_installed=False))
    assert lv.values["save_total_limit"] == 2 and lv.values["stage"] == 2 and lv.values["seq_len"] == 768
    assert lv.values["expandable_segments"] is True  # LLaMA-Factory on CUDA sets it
    assert lv.model == "Qwen/Qwen2-7B"


def test_accelerate_yaml_zero_settings_without_a_deepspeed_json(tmp_path):
    (tmp_path / "accel.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                                         "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n"
                                         "  offload_param_device: none\nnum_processes: 8\n")
    lv = plan_facts(load_launch([tmp_path / "accel.yaml"], use_installed=False))
    assert lv.values["stage"] == 3 and lv.values["offload_optimizer"] == "cpu"
    assert lv.sources["stage"].text.endswith("deepspeed_config.zero_stage")


def test_sub_groups_live_parameters_and_raw_builds_are_read(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3, "sub_group_size": 100000000, '
                                      '"stage3_max_live_parameters": 30000000, "stage3_max_reuse_distance": 0, '
                                      '"zero_hpz_partition_size": 8}}')
    (tmp_path / "train.py").write_text("import deepspeed\nm = build()\n"
                                       "engine, *_ = deepspeed.initialize(model=m, config='ds.json')\n")
    lv = plan_facts(load_launch([tmp_path], use_installed=False))
    v = lv.values
    assert (v["sub_group_size"], v["max_live_parameters"], v["hpz_partition_size"]) == (100_000_000, 30_000_000, 8)
    assert v["zero_init"] is False and lv.sources["zero_init"].text.startswith(str(tmp_path / "train.py") + ":3")


def test_the_seed_launch_builds_inside_zero_init():
    lv = plan_facts(load_launch([EXAMPLES / "seed"], use_installed=False))
    assert lv.values.get("zero_init", True) is True  # LLaMA-Factory: the HF Trainer builds in zero.Init


def test_plan_reads_the_stage_as_the_launch_facts_do(tmp_path):
    """One fact, one place: plan and the rules agree on ``"stage": 3.0``, ``"3"`` and the boolean form."""
    from zeropilot.launch.facts import facts

    for text, stage in (('{"zero_optimization": {"stage": 3.0}}', 3), ('{"zero_optimization": {"stage": "3"}}', 3),
                        ('{"zero_optimization": true}', 1), ('{"train_batch_size": 8}', 0)):
        (tmp_path / "ds.json").write_text(text)
        launch = load_launch([tmp_path / "ds.json"], use_installed=False)
        assert plan_facts(launch).values["stage"] == stage == facts(launch).ds[0].stage, text


def test_plan_reads_offload_devices_through_the_launch_facts(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "CPU"},'
                                      ' "offload_param": {"device": "none"}}}')
    v = plan_facts(load_launch([tmp_path / "ds.json"], use_installed=False)).values
    assert (v["offload_optimizer"], v["offload_param"]) == ("cpu", "none")


def test_which_optimizer_an_offloaded_launch_gets(tmp_path):
    """DeepSpeed 0.19.8 picks torch's AdamW for an offloaded optimizer only when the config's optimizer says
    ``torch_adam`` (``DeepSpeedEngine.get_optimizer_configuration``, run here as installed), or when a client
    optimizer is allowed by ``zero_force_ds_cpu_optimizer: false``; otherwise its CPUAdam. The plan reads which one
    a launch gets (the host memory of the step differs: ``memory/host.py``)."""
    import types

    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    stand_in = types.SimpleNamespace(zero_use_cpu_optimizer=lambda: True, bf16_optimizer_states=lambda: False,
                                     zenflow=False)
    chosen = DeepSpeedEngine.get_optimizer_configuration(stand_in, {"lr": 1e-5, "torch_adam": True}, True)[0]
    assert chosen is torch.optim.AdamW
    chosen = DeepSpeedEngine.get_optimizer_configuration(stand_in, {"lr": 1e-5}, True)[0]
    assert chosen.__name__ == "DeepSpeedCPUAdam"
    # DeepSpeed tests the value as Python does: the string "false" picks torch's AdamW, the boolean false CPUAdam
    chosen = DeepSpeedEngine.get_optimizer_configuration(stand_in, {"lr": 1e-5, "torch_adam": "false"}, True)[0]
    assert chosen is torch.optim.AdamW
    chosen = DeepSpeedEngine.get_optimizer_configuration(stand_in, {"lr": 1e-5, "torch_adam": False}, True)[0]
    assert chosen.__name__ == "DeepSpeedCPUAdam"

    def read(ds: str) -> dict:
        (tmp_path / "ds.json").write_text(ds)
        (tmp_path / "train.yaml").write_text("model_name_or_path: Qwen/Qwen2-7B\nfinetuning_type: full\n"
                                             "deepspeed: ds.json\n")
        return plan_facts(load_launch([tmp_path], use_installed=False)).values

    offload = '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
    assert "torch_adam" not in read("{" + offload + ', "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}')
    assert read("{" + offload + ', "optimizer": {"type": "AdamW", "params": {"torch_adam": true}}}')["torch_adam"]
    assert read("{" + offload + ', "optimizer": {"type": "AdamW", "params": {"torch_adam": "false"}}}')["torch_adam"]
    assert read("{" + offload + ', "optimizer": {"type": "AdamW", "params": {"torch_adam": false}}}')[
        "torch_adam"] is False
    assert read("{" + offload + ', "zero_force_ds_cpu_optimizer": false}')["torch_adam"] is True
    assert "torch_adam" not in read("{" + offload + "}")


def test_a_trainer_launch_without_an_optimizer_section_gets_the_trainers_optimizer(tmp_path):
    """The HF Trainer (here through LLaMA-Factory's YAML) builds its own optimizer when the DeepSpeed config has no
    ``optimizer`` section (``deepspeed_optim_sched``: ``DummyOptim`` only when there is one), with its weight-decay
    groups: ``trainer_optimizer``, which the allocator replay reads (``memory.tuning.second_param_group``)."""
    def read(ds: str) -> dict:
        (tmp_path / "ds.json").write_text(ds)
        (tmp_path / "train.yaml").write_text("model_name_or_path: Qwen/Qwen2-7B\nfinetuning_type: full\n"
                                             "deepspeed: ds.json\n")
        return plan_facts(load_launch([tmp_path], use_installed=False)).values

    assert read('{"zero_optimization": {"stage": 2}}')["trainer_optimizer"] is True
    assert "trainer_optimizer" not in read('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}')
