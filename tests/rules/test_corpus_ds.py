"""The errors DS/HF/AC/VR rules raise on tests/data/corpus, each reviewed, and shown on the real libraries.

Versions as CI installs them. Each reviewed error says why it is right; the DeepSpeed ones are replayed on
the installed DeepSpeed (the corpus file itself, "auto" and batch keys neutralised) to show it fails there.
"""

import copy
import json
import shutil

import pytest

from tests.conftest import CORPUS, corpus_files
from zeropilot.check import check
from zeropilot.rules.registry import Severity

VERSIONS = "deepspeed=0.19.8,transformers=5.24.0,accelerate=1.15.0,torch=2.13.0,peft=0.21.2"
MINE = ("DS", "HF", "AC", "VR")
_REMOVED = "DeepSpeed >= 0.19.7/0.19.8 refuses removed feature blocks (DeepSpeedConfigError, issue #8489)"
_COMPILE = ("compile keys disable/backend: DeepSpeed 0.19.8's CompileConfig (strict since 0.17.0; 0.16 and "
            "earlier ignored the section) has neither (ValidationError)")
_WARMUP = ("transformers 5.24 has no warmup_ratio (removed in 5.15.0); LLaMA-Factory hands the YAML to "
           "HfArgumentParser, which refuses it (this LLaMA-Factory commit pins transformers <= 5.8.0)")
REVIEWED = [
    ("OpenGVLab__InternVL/segmentation__zero_configs__adam_zero1_amp.json", "DS008", "amp", _REMOVED),
    ("axolotl-ai-cloud__axolotl/deepspeed_configs__zero1_torch_compile.json", "DS001", "compile.backend", _COMPILE),
    ("axolotl-ai-cloud__axolotl/deepspeed_configs__zero1_torch_compile.json", "DS001", "compile.disable", _COMPILE),
    ("axolotl-ai-cloud__axolotl/deepspeed_configs__zero2_torch_compile.json", "DS001", "compile.backend", _COMPILE),
    ("axolotl-ai-cloud__axolotl/deepspeed_configs__zero2_torch_compile.json", "DS001", "compile.disable", _COMPILE),
    ("deepspeedai__DeepSpeed/tests__model__BingBertSquad__deepspeed_bsz24_fp16_eigenvalue_quantize_config.json",
     "DS008", "eigenvalue", _REMOVED),
    ("deepspeedai__DeepSpeed/tests__model__BingBertSquad__deepspeed_bsz24_fp16_eigenvalue_quantize_config.json",
     "DS008", "quantize_training", _REMOVED),
    ("deepspeedai__DeepSpeedExamples/compression__bert__config__ds_config_W1A8_Qgroup64_fp16.json", "DS008",
     "compression_training", _REMOVED),
    ("deepspeedai__DeepSpeedExamples/training__MoQ__test.json", "DS008", "quantize_training", _REMOVED),
    ("deepspeedai__DeepSpeedExamples/training__bing_bert__deepspeed_bsz4k_progressive_layer_drop_config_seq128.json",
     "DS008", "progressive_layer_drop", _REMOVED),
    ("deepspeedai__DeepSpeedExamples/training__bing_bert__deepspeed_bsz64k_lamb_config_seq128.json", "DS008",
     "sparse_attention", _REMOVED),
    ("huggingface__transformers/tests__deepspeed__ds_config_zero3.json", "DS019", "zero_optimization.reduce_bucket_size",
     "reduce_bucket_size 0: DeepSpeedZeroConfig declares it Field(gt=0) in 0.19.8 (ValidationError); "
     "DeepSpeed's own test_zero_config_reduce_bucket_size expects the refusal"),
] + [(f"hiyouga__LlamaFactory/examples__{name}.yaml", "HF003", "warmup_ratio", _WARMUP) for name in (
    "extras__asft__qwen2_full_asft", "extras__badam__llama3_full_sft", "extras__fp8__llama3_fp8_deepspeed_sft",
    "train_full__mossvl_full_sft", "train_full__qwen3_full_sft", "train_full__qwen3vl_full_sft",
    "train_lora__qwen3_lora_sft_ds3")]

FILES = corpus_files()


def test_errors_on_corpus_are_the_reviewed_ones():
    found = set()
    for path in FILES:
        result, _ = check([path], versions=VERSIONS, use_installed=False)
        found |= {(str(path.relative_to(CORPUS)), f.code, f.key) for f in result.findings
                  if f.severity == Severity.ERROR and f.code.startswith(MINE)}
    assert found == {(f, c, k) for f, c, k, _ in REVIEWED}
    assert all(why for *_, why in REVIEWED)


def _neutralised(path):
    """The corpus DeepSpeed config as DeepSpeedConfig would get it once the HF integration filled it."""
    cfg = json.loads(path.read_text())
    for key in ("train_batch_size", "gradient_accumulation_steps"):
        cfg.pop(key, None)
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg.setdefault("bf16", {})["enabled"] = False
    return cfg


@pytest.mark.witness
@pytest.mark.parametrize("name,code,key", sorted({(f, c, k) for f, c, k, _ in REVIEWED if c.startswith("DS")}))
def test_reviewed_deepspeed_errors_fail_on_installed_deepspeed(name, code, key):
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    from pydantic import ValidationError

    cfg = _neutralised(CORPUS / name)
    for other in {k for f, c, k, _ in REVIEWED if f == name and c == "DS008" and k != key}:
        cfg.pop(other)  # DeepSpeed stops at the first removed block: show each one on its own
    expected = {"DS001": ValidationError, "DS008": DeepSpeedConfigError, "DS019": ValidationError}[code]
    with pytest.raises(expected, match="(?i)" + key.split(".")[-1]):
        DeepSpeedConfig(copy.deepcopy(cfg))


def _layout(tmp_path, files):
    """Put corpus files back at their original paths (MANIFEST), so references between them resolve."""
    for local, original in files.items():
        target = tmp_path / original
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CORPUS / local, target)
    return tmp_path


def test_llamafactory_pairs_raise_no_pair_errors(tmp_path):
    """LLaMA-Factory YAMLs with the ds configs they name: no HF001/AC002/VR error (only HF003 on 5.24)."""
    lf = "hiyouga__LlamaFactory/examples__"
    root = _layout(tmp_path, {
        f"{lf}deepspeed__ds_z3_config.json": "examples/deepspeed/ds_z3_config.json",
        f"{lf}deepspeed__ds_z3_fp8_config.json": "examples/deepspeed/ds_z3_fp8_config.json",
        f"{lf}train_lora__qwen3_lora_sft_ds3.yaml": "examples/train_lora/qwen3_lora_sft_ds3.yaml",
        f"{lf}extras__fp8__llama3_fp8_deepspeed_sft.yaml": "examples/extras/fp8/llama3_fp8_deepspeed_sft.yaml"})
    for versions in (VERSIONS, "deepspeed=0.16.9,transformers=4.57.6,accelerate=1.10.0"):
        result, launch = check([root], versions=versions, world_size=4, use_installed=False)
        assert len(launch.training_pairs()) == 2
        errors = {(f.code, f.key) for f in result.findings if f.severity == Severity.ERROR and f.code.startswith(MINE)}
        assert errors <= {("HF003", "warmup_ratio")}, errors


def test_accelerate_template_pair_quiet(tmp_path):
    acc = "huggingface__accelerate/examples__"
    root = _layout(tmp_path, {
        f"{acc}config_yaml_templates__deepspeed.yaml": "examples/config_yaml_templates/deepspeed.yaml",
        f"{acc}deepspeed_config_templates__zero_stage1_config.json":
            "examples/deepspeed_config_templates/zero_stage1_config.json"})
    result, launch = check([root], versions=VERSIONS, use_installed=False)
    assert launch.links, "the accelerate config should name its DeepSpeed config"
    assert [f for f in result.findings if f.severity == Severity.ERROR and f.code.startswith(MINE)] == []
