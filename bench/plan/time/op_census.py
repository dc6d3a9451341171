"""Count the kernels and bytes of one decoder layer's forward and backward, by op class, with torch's dispatcher.

Runs a real transformers decoder layer (and the LM head with its loss) on CPU under a ``TorchDispatchMode`` that
records every aten op that launches a kernel (views and metadata ops left out): its class (``matmul``,
``attention``, ``other``), its FLOPs (matmuls) and the bytes of its tensor inputs and outputs. Prints one JSON line
per configuration. What ``memory/steptime.py`` counts per layer is checked against this in tests/memory/test_steptime.py.

usage: python bench/plan/time/op_census.py [--model-type llama] [--hidden 256] [--tokens 64] [--lora 8] [--gc]
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = {"view", "_unsafe_view", "transpose", "t", "unsqueeze", "squeeze", "expand", "slice", "select", "as_strided",
         "detach", "alias", "permute", "reshape", "split", "split_with_sizes", "unbind", "chunk", "narrow",
         "lift_fresh", "_reshape_alias", "view_as", "clone_meta", "is_same_size", "sym_size", "sym_stride", "numel",
         "size", "stride", "dim", "is_contiguous", "_has_compatible_shallow_copy_type", "empty_like", "empty",
         "new_empty", "empty_strided", "new_empty_strided", "_local_scalar_dense", "set_", "_to_copy_meta"}
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm"}


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class Census(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()
        self.bytes = Counter()
        self.flops = 0
        self.names = Counter()
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in VIEWS:
            return out
        cls = "matmul" if name in MATMUL else "attention" if "attention" in name else "other"
        nbytes = sum(t.numel() * t.element_size() for t in _tensors(args)) + \
            sum(t.numel() * t.element_size() for t in _tensors(kwargs or {})) + \
            sum(t.numel() * t.element_size() for t in _tensors(out))
        if cls == "matmul":
            a = [t for t in _tensors(args) if t.dim() >= 2]
            if name in ("mm", "addmm"):
                m1, m2 = (args[0], args[1]) if name == "mm" else (args[1], args[2])
                self.flops += 2 * m1.shape[0] * m1.shape[1] * m2.shape[1]
            elif name in ("bmm", "baddbmm"):
                m1, m2 = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
                self.flops += 2 * m1.shape[0] * m1.shape[1] * m1.shape[2] * m2.shape[2]
        key = (self.phase, cls)
        self.ops[key] += 1
        self.bytes[key] += nbytes
        self.names[(self.phase, name)] += 1
        return out


def build(model_type: str, hidden: int, inter: int, heads: int, kv: int, vocab: int, layers: int):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(model_type, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                               max_position_embeddings=8192, tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")


def census(args) -> dict:
    model = build(args.model_type, args.hidden, args.inter, args.heads, args.kv, args.vocab, args.layers)
    model.train()
    if args.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
        if not args.fp32_adapters:  # DeepSpeed casts every parameter to bf16 (but inside zero.Init): memory/gpu.py
            model = model.to(torch.bfloat16)
    x = torch.randint(0, args.vocab, (1, args.tokens))
    mode = Census()
    with mode:
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        mode.phase = "backward"
        loss.backward()
    out = {"model_type": args.model_type, "hidden": args.hidden, "inter": args.inter, "heads": args.heads,
           "kv": args.kv, "vocab": args.vocab, "layers": args.layers, "tokens": args.tokens, "lora": args.lora,
           "gc": args.gc, "fp32_adapters": args.fp32_adapters, "flops": mode.flops,
           "ops": {f"{p}.{c}": n for (p, c), n in sorted(mode.ops.items())},
           "bytes": {f"{p}.{c}": n for (p, c), n in sorted(mode.bytes.items())}}
    if args.names:
        out["names"] = {f"{p}.{n}": k for (p, n), k in sorted(mode.names.items())}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-type", default="llama")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--gc", action="store_true")
    ap.add_argument("--fp32-adapters", action="store_true", help="LoRA adapters as PEFT leaves them (fp32)")
    ap.add_argument("--names", action="store_true")
    print(json.dumps(census(ap.parse_args())))


if __name__ == "__main__":
    main()
