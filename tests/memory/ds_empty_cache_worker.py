"""Witness for the plan's build-cache term: does ``deepspeed.initialize`` (ZeRO-3) empty the allocator cache?

Real DeepSpeed on CPU, one rank on gloo, a tiny Qwen2 built whole (no zero.Init), as a raw script does. Counts
calls of the accelerator's ``empty_cache`` during ``deepspeed.initialize`` with the parameters kept on the
device and with ``offload_param``; and at ZeRO-2 (the replay's second ``empty_cache``) with the HF Trainer's optimizer
groups (``Trainer.get_decay_parameter_names``: with and without weight decay) for full fine-tuning, and for a trained
subset without biases or norms, whose second group is empty. Usage: python ds_empty_cache_worker.py PORT -> prints
``RESULT {json}``.
"""
import json
import os
import sys


def main(port: str) -> None:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    acc = get_accelerator()
    calls = {"n": 0}
    real = acc.empty_cache

    def counting():
        calls["n"] += 1
        return real()

    acc.empty_cache = counting
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    out = {}
    for name, offload in (("params_on_device", False), ("offload_param", True)):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        zero = {"stage": 3}
        if offload:
            zero["offload_param"] = {"device": "cpu"}
        calls["n"] = 0
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                          config={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                                  "zero_optimization": zero, "zero_allow_untested_optimizer": True,
                                                  "steps_per_print": 10 ** 9})
        out[name] = calls["n"]
        engine.destroy()
    from transformers import Trainer

    cases = (("zero2_trainer_groups", lambda n: True), ("zero2_matrices_only", lambda n: n.endswith("proj.weight")))
    for name, trains in cases:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        for n, p in model.named_parameters():
            p.requires_grad_(trains(n))
        decay = Trainer.get_decay_parameter_names(None, model)  # what create_optimizer groups by
        groups = [{"params": [p for n, p in model.named_parameters() if p.requires_grad and (n in decay) == d],
                   "weight_decay": 0.01 if d else 0.0} for d in (True, False)]
        calls["n"] = 0
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(groups, lr=1e-3),
                                          config={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                                  "zero_optimization": {"stage": 2},
                                                  "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9})
        out[name] = [calls["n"], len(engine.optimizer.optimizer.param_groups)]
        engine.destroy()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
