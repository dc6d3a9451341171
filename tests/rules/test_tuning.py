"""LF001: fixture tests, and the witness against LLaMA-Factory's own checks.

LLaMA-Factory is not installed here (it pins its own transformers): the witness runs its v0.9.5 checks as the wheel
has them (``pip download llamafactory==0.9.5 --no-deps``; ``llamafactory/hparams/parser.py`` lines 377-413 and
``llamafactory/model/model_utils/quantization.py`` lines 166-200), the lines verbatim but for the arguments'
containers, on the same settings the fixture launches give, and requires LF001 to fire exactly where they raise,
with their message.
"""

from types import SimpleNamespace

import pytest

from tests.conftest import run_check
from zeropilot.rules.tuning import REFUSALS

V = "deepspeed=0.19.8,transformers=5.24.0"


def _launch(launch_dir, yaml_lines, stage):
    body = "model_name_or_path: m\nstage: sft\ntemplate: qwen\ndeepspeed: ds.json\noutput_dir: o\nbf16: true\n"
    return launch_dir({"train.yaml": body + yaml_lines, "ds.json": {"zero_optimization": {"stage": stage}}})


CASES = [  # (YAML lines, ZeRO stage)
    ("finetuning_type: lora\nquantization_bit: 8\n", 3),
    ("finetuning_type: lora\nquantization_bit: 8\n", 2),
    ("finetuning_type: lora\nquantization_bit: 4\n", 3),
    ("finetuning_type: lora\nquantization_bit: 4\nquantization_method: hqq\n", 3),
    ("finetuning_type: full\nuse_galore: true\n", 2),
    ("finetuning_type: full\nuse_apollo: true\n", 3),
    ("finetuning_type: lora\npissa_init: true\n", 3),
    ("finetuning_type: lora\npissa_init: true\n", 2),
    ("finetuning_type: full\npure_bf16: true\n", 3),
    ("finetuning_type: lora\nfp8: true\nquantization_bit: 4\n", 2),
    ("finetuning_type: lora\nuse_unsloth: true\n", 3),
    ("finetuning_type: lora\nuse_unsloth: true\n", 2),
    ("finetuning_type: lora\nuse_kt: true\n", 3),
    ("finetuning_type: lora\nenable_liger_kernel: true\nlora_target: q_proj,v_proj\n", 3),
]


def _llamafactory_checks(model_args, finetuning_args, training_args, zero3):
    """LLaMA-Factory v0.9.5's checks, verbatim; ``is_deepspeed_zero3_enabled()`` is ``zero3``; the training runs on
    one node (``parallel_mode`` distributed only matters for layer-wise GaLore/APOLLO and BAdam, not tested)."""
    def is_deepspeed_zero3_enabled():
        return zero3

    # hparams/parser.py
    if finetuning_args.pissa_init and is_deepspeed_zero3_enabled():
        raise ValueError("Please use scripts/pissa_init.py to initialize PiSSA in DeepSpeed ZeRO-3.")

    if finetuning_args.pure_bf16:
        if is_deepspeed_zero3_enabled():
            raise ValueError("`pure_bf16` is incompatible with DeepSpeed ZeRO-3.")

    if training_args.deepspeed is not None and (finetuning_args.use_galore or finetuning_args.use_apollo):
        raise ValueError("GaLore and APOLLO are incompatible with DeepSpeed yet.")

    if not finetuning_args.use_mca and training_args.fp8 and model_args.quantization_bit is not None:
        raise ValueError("FP8 training is not compatible with quantization. Please disable one of them.")

    if model_args.use_unsloth and is_deepspeed_zero3_enabled():
        raise ValueError("Unsloth is incompatible with DeepSpeed ZeRO-3.")

    if model_args.use_kt and is_deepspeed_zero3_enabled():
        raise ValueError("KTransformers is incompatible with DeepSpeed ZeRO-3.")

    # model/model_utils/quantization.py (on-the-fly quantization)
    if model_args.quantization_bit is not None:
        if model_args.quantization_method == "bnb":
            if is_deepspeed_zero3_enabled() or model_args.quantization_device_map == "auto":
                if model_args.quantization_bit != 4:
                    raise ValueError("Only 4-bit quantized model can use fsdp+qlora or auto device map.")
        elif model_args.quantization_method == "hqq":
            if is_deepspeed_zero3_enabled():
                raise ValueError("HQQ quantization is incompatible with DeepSpeed ZeRO-3 or FSDP.")


def _args(yaml_text):
    import yaml

    v = yaml.safe_load(yaml_text)
    model = SimpleNamespace(quantization_bit=v.get("quantization_bit"), quantization_method=v.get(
        "quantization_method", "bnb"), quantization_device_map=None, use_unsloth=v.get("use_unsloth", False),
        use_kt=v.get("use_kt", False))
    ft = SimpleNamespace(pissa_init=v.get("pissa_init", False), pure_bf16=v.get("pure_bf16", False),
                         use_galore=v.get("use_galore", False), use_apollo=v.get("use_apollo", False),
                         use_mca=v.get("use_mca", False))
    train = SimpleNamespace(deepspeed="ds.json", fp8=v.get("fp8", False))
    return model, ft, train


@pytest.mark.witness
@pytest.mark.parametrize("yaml_lines,stage", CASES)
def test_lf001_witness(yaml_lines, stage, launch_dir):
    try:
        _llamafactory_checks(*_args(yaml_lines), zero3=stage == 3)
        raised = None
    except ValueError as e:
        raised = str(e)
    findings = run_check(_launch(launch_dir, yaml_lines, stage), versions=V, select={"LF001"})
    if raised is None:
        assert findings == []
    else:
        assert len(findings) == 1 and f'"{raised}"' in findings[0].message


def test_lf001_points_at_the_key_and_says_what_to_do(launch_dir):
    root = _launch(launch_dir, "finetuning_type: lora\nquantization_bit: 8\n", 3)
    (f,) = run_check(root, versions=V, select={"LF001"})
    assert f.key == "quantization_bit" and "ZeRO-3" in f.message and "quantization_bit: 4" in f.message


def test_lf001_quiet_for_hf_yaml(launch_dir):
    root = launch_dir({"train.yaml": "output_dir: o\ndeepspeed: ds.json\nbf16: true\nquantization_bit: 8\n",
                       "ds.json": {"zero_optimization": {"stage": 3}}})
    assert run_check(root, versions=V, select={"LF001"}) == []


def test_every_refusal_is_witnessed():
    keys = {r.key for r in REFUSALS}
    tested = {k for text, _ in CASES for k in keys if f"{k}:" in text}
    assert keys <= tested


# LF002: LoRA's full copies beside PEFT's fp32 adapters under ZeRO-3 (one probe process per session)

LF002_CASES = {  # probe case (tests/rules/peft_zero3_probe.py) -> the LLaMA-Factory launch it stands for
    "z3_copies": ("finetuning_type: lora\nadditional_target: embed_tokens,lm_head\n", {"stage": 3}),
    "z3_copies_offload_param": ("finetuning_type: lora\nadditional_target: embed_tokens,lm_head\n",
                                {"stage": 3, "offload_param": {"device": "cpu"}}),
    "z3_no_copies": ("finetuning_type: lora\n", {"stage": 3}),
    "z2_copies": ("finetuning_type: lora\nadditional_target: embed_tokens,lm_head\n", {"stage": 2}),
}


@pytest.fixture(scope="module")
def peft_zero3_probe(tmp_path_factory):
    """What ``deepspeed.initialize`` did with each case of ``tests/rules/peft_zero3_probe.py`` (one process)."""
    import json

    from tests.rules.conftest import run_probe

    out = tmp_path_factory.mktemp("peft_zero3_probe")
    log = run_probe("tests.rules.peft_zero3_probe", [out / "probe.json"], out)
    assert (out / "probe.json").exists(), log[-3000:]
    return json.loads((out / "probe.json").read_text())


def _lf002(launch_dir, yaml_lines, zero, **kw):
    body = "model_name_or_path: m\nstage: sft\ntemplate: qwen\ndeepspeed: ds.json\noutput_dir: o\nbf16: true\n"
    root = launch_dir({"train.yaml": body + yaml_lines, "ds.json": {"zero_optimization": zero}})
    return run_check(root, versions=V, select={"LF002"}, **kw)


@pytest.mark.parametrize("case", sorted(LF002_CASES))
def test_lf002_witness(case, peft_zero3_probe, launch_dir):
    """LF002 fires exactly on the launches whose model, built as LLaMA-Factory 0.9.5 builds it, stops DeepSpeed."""
    got = peft_zero3_probe[case]
    findings = _lf002(launch_dir, *LF002_CASES[case])
    if got["result"] == "ok":
        assert findings == [], (case, got)
    else:
        assert got["result"].startswith("AssertionError at deepspeed/runtime/zero/utils.py"), got
        assert got["dtypes"] == ["bfloat16", "float32"]  # the fp32 adapters beside the bf16 copies
        assert len(findings) == 1 and "defragment" in findings[0].message


def test_lf002_names_the_key_and_both_ways_out(launch_dir):
    (f,) = _lf002(launch_dir, "finetuning_type: lora\nadditional_target: embed_tokens\n", {"stage": 3})
    assert f.key == "additional_target" and "ZeRO-2" in f.message and "offload_param" in f.message
    (f,) = _lf002(launch_dir, "finetuning_type: lora\nresize_vocab: true\n", {"stage": 3})
    assert f.key == "resize_vocab"  # LLaMA-Factory adds the embedding and the output layer to additional_target


def test_lf002_gives_the_plans_peak_for_each_way_out_when_the_gpus_are_known(launch_dir):
    from zeropilot.check import check

    body = "model_name_or_path: qwen2.5-7b\nstage: sft\ntemplate: qwen\ncutoff_len: 1024\ndeepspeed: ds.json\n" \
           "output_dir: o\nbf16: true\nfinetuning_type: lora\nadditional_target: embed_tokens,lm_head\n"
    root = launch_dir({"train.yaml": body, "ds.json": {"zero_optimization": {"stage": 3}}})
    result, _ = check([root], versions=V, select={"LF002"}, use_installed=False, gpus="2x80GiB")
    (f,) = result.findings
    assert f.message.count("GiB per GPU") == 2, f.message


def test_lf002_quiet_where_llamafactory_casts_or_refuses(launch_dir):
    assert _lf002(launch_dir, "finetuning_type: lora\nadditional_target: lm_head\nquantization_bit: 4\n",
                  {"stage": 3}) == []  # QLoRA: every trainable tensor cast to fp32
    assert _lf002(launch_dir, "finetuning_type: full\nadditional_target: lm_head\n", {"stage": 3}) == []
