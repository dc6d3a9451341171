"""The hand-over from launch to memory: a launch's plan facts become plan inputs for one model."""

from zeropilot.launch import load_launch
from zeropilot.launch.planfacts import plan_facts
from zeropilot.memory.from_launch import launch_inputs


def test_auto_bucket_sizes_resolve_from_hidden_size(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", '
                                      '"stage3_prefetch_bucket_size": "auto"}}')
    (tmp_path / "train.yaml").write_text("model_name_or_path: Qwen/Qwen2-7B\nfinetuning_type: full\n"
                                         "deepspeed: ds.json\ncutoff_len: 2048\n")
    given = launch_inputs(plan_facts(load_launch([tmp_path], use_installed=False)), 3584)
    values, notes = given.values, given.notes
    assert values["reduce_bucket_size"] == 3584 ** 2 and values["prefetch_bucket_size"] == int(0.9 * 3584 ** 2)
    assert values["lora_rank"] is None and "reduce_bucket_size" in notes
    assert given.sources["reduce_bucket_size"].endswith('reduce_bucket_size ("auto": filled from hidden_size)')
