"""The memory-relevant training settings, read once by the launch-facts layer from LLaMA-Factory YAML, HF/TRL/axolotl
arguments, PEFT adapter configs and training scripts."""

import json

from zeropilot.launch import load_launch


def _settings(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    launch = load_launch([tmp_path / n for n in files], use_installed=False)
    assert not launch.read_errors
    train = launch.train_args[0] if launch.train_args else None
    return launch.facts().settings(train)


LF = "model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\ndataset: alpaca\ntemplate: llama3\ncutoff_len: 1024\n"


def test_llamafactory_defaults_to_lora_on_all_linear_layers(tmp_path):
    s = _settings(tmp_path, {"t.yaml": LF})
    assert (s.method, s.lora_rank, s.lora_targets, s.modules_to_save, s.quant_bits) == ("lora", 8, None, (), None)


def test_llamafactory_lora_targets_additional_target_dora_quantization(tmp_path):
    s = _settings(tmp_path, {"t.yaml": LF + "finetuning_type: lora\nlora_rank: 16\nlora_target: q_proj, v_proj\n"
                                       "additional_target: embed_tokens,lm_head\nuse_dora: true\nquantization_bit: 4\n"
                                       "enable_liger_kernel: true\noptim: paged_adamw_8bit\n"})
    assert (s.lora_rank, s.lora_targets, s.modules_to_save, s.dora) == (16, ("q_proj", "v_proj"),
                                                                        ("embed_tokens", "lm_head"), True)
    assert (s.quant_bits, s.double_quant, s.quant_storage_auto, s.fused_loss) == (4, True, True, "liger")
    assert s.optimizer == "paged_adamw_8bit"
    source = s.given("lora_target").source
    assert source.text.endswith("t.yaml:8 lora_target") and (source.line, source.key) == (8, "lora_target")


def test_llamafactory_freeze_and_llama_pro(tmp_path):
    s = _settings(tmp_path, {"t.yaml": LF + "finetuning_type: freeze\nfreeze_trainable_layers: -4\n"
                                       "freeze_trainable_modules: mlp,self_attn\nfreeze_extra_modules: embed_tokens\n"})
    assert (s.method, s.freeze_layers, s.freeze_modules, s.freeze_extra, s.lora_rank) == (
        "freeze", -4, ("mlp", "self_attn"), ("embed_tokens",), None)
    s = _settings(tmp_path, {"t.yaml": LF + "finetuning_type: freeze\nuse_llama_pro: true\n"})
    assert (s.freeze_layers, s.freeze_modules, s.llama_pro) == (2, ("all",), True)


def test_liger_is_not_fused_where_llamafactory_needs_the_logits(tmp_path):
    s = _settings(tmp_path, {"t.yaml": LF.replace("stage: sft", "stage: dpo") + "enable_liger_kernel: true\n"})
    assert s.fused_loss is None and s.given("enable_liger_kernel") is not None


def test_llamafactory_optimizers(tmp_path):
    for key, name in (("use_galore", "galore"), ("use_badam", "badam"), ("use_muon", "muon"),
                      ("use_adam_mini", "adam_mini"), ("use_apollo", "apollo")):
        assert _settings(tmp_path, {"t.yaml": LF + f"{key}: true\n"}).optimizer == name


def test_trl_flags_for_qlora(tmp_path):
    s = _settings(tmp_path, {"t.json": json.dumps({
        "model_name_or_path": "Qwen/Qwen2.5-7B", "output_dir": "o", "per_device_train_batch_size": 2,
        "use_peft": True, "lora_r": 32, "lora_target_modules": ["q_proj", "k_proj"], "load_in_4bit": True,
        "use_bnb_nested_quant": True, "use_liger_kernel": True, "optim": "adamw_8bit", "packing": True})})
    assert (s.method, s.lora_rank, s.lora_targets, s.quant_bits, s.double_quant) == (
        "lora", 32, ("q_proj", "k_proj"), 4, True)
    assert (s.fused_loss, s.optimizer, s.quant_storage, s.quant_storage_auto) == ("liger", "adamw_8bit", None, False)
    assert s.given("packing").value is True


def test_hf_liger_config_without_the_fused_loss(tmp_path):
    s = _settings(tmp_path, {"t.json": json.dumps({"output_dir": "o", "per_device_train_batch_size": 2,
                                                   "use_liger_kernel": True,
                                                   "liger_kernel_config": {"fused_linear_cross_entropy": False}})})
    assert s.fused_loss is None


def test_axolotl_qlora_and_plugins(tmp_path):
    s = _settings(tmp_path, {"a.yaml": "base_model: NousResearch/Meta-Llama-3-8B\nadapter: qlora\nlora_r: 16\n"
                                       "lora_target_linear: true\nmicro_batch_size: 2\nsequence_len: 2048\n"
                                       "sample_packing: true\ncut_cross_entropy: true\noutput_dir: o\n"})
    assert (s.method, s.lora_rank, s.lora_targets, s.quant_bits, s.fused_loss) == ("lora", 16, "all-linear", 4, "cce")


def test_adapter_config_and_scripts_fill_what_the_arguments_leave_unsaid(tmp_path):
    adapter = {"peft_type": "LORA", "r": 64, "target_modules": ["gate_proj", "up_proj", "down_proj"],
               "modules_to_save": ["lm_head"], "rank_pattern": {"down_proj": 8}, "use_dora": False}
    script = ("import torch\nfrom transformers import BitsAndBytesConfig\nfrom peft import LoraConfig\n"
              "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)\n"
              "cfg = LoraConfig(r=4, target_modules='all-linear')\n")
    s = _settings(tmp_path, {"adapter_config.json": json.dumps(adapter), "train.py": script})
    assert (s.method, s.lora_rank, s.lora_targets, s.rank_pattern, s.modules_to_save) == (
        "lora", 64, ("gate_proj", "up_proj", "down_proj"), {"down_proj": 8}, ("lm_head",))
    assert (s.quant_bits, s.quant_storage) == (4, "bfloat16")
    s = _settings(tmp_path, {"train.py": script.replace(", bnb_4bit_quant_storage=torch.bfloat16", "")})
    assert (s.lora_targets, s.lora_rank, s.quant_storage) == ("all-linear", 4, "uint8")


def test_plain_hf_arguments_train_everything(tmp_path):
    s = _settings(tmp_path, {"t.json": json.dumps({"output_dir": "o", "per_device_train_batch_size": 2,
                                                   "gradient_checkpointing": True})})
    assert (s.method, s.lora_rank, s.settings) == ("full", None, [])
