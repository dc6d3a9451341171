"""Whether transformers builds a model inside ``deepspeed.zero.Init`` under ZeRO-3, with and without a quantization
config (CPU, gloo, one rank). The quantizer is a registered no-op (``register_quantizer``): transformers decides on
``is_quantized`` alone, whatever the method, so bitsandbytes (CUDA) is not needed to take the quantized path.

Usage: python zero3_quantized_worker.py CKPT_DIR PORT -> prints one JSON line {"plain": bool, "quantized": bool}:
whether the loaded model's parameters are ZeRO-3 parameters (``ds_id``), i.e. were built in zero.Init.
"""
import json
import os
import sys


def main(ckpt: str, port: str) -> None:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    @register_quantization_config("zp_noop")
    class NoopConfig(QuantizationConfigMixin):
        def __init__(self, **kwargs):
            self.quant_method = "zp_noop"

    @register_quantizer("zp_noop")
    class NoopQuantizer(HfQuantizer):
        requires_calibration = False

        def _process_model_before_weight_loading(self, model, **kwargs):
            return model

        def _process_model_after_weight_loading(self, model, **kwargs):
            return model

        def is_serializable(self, safe_serialization=None):
            return True

        @property
        def is_trainable(self):
            return True

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(ckpt)
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    keep = HfDeepSpeedConfig(ds)  # noqa: F841  (kept alive: from_pretrained reads it)
    built = {}
    for name, extra in (("plain", {}), ("quantized", {"quantization_config": NoopConfig()})):
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, **extra)
        built[name] = all(hasattr(p, "ds_id") for p in model.parameters())
    print(json.dumps(built), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
