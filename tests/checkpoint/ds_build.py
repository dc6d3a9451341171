"""Build a real DeepSpeed checkpoint on CPU (gloo, N processes) for tests and benchmarks.

Run as a script: ``python ds_build.py SPEC_JSON OUT_DIR``, or ``python ds_build.py --many PAIRS_JSON`` for several
checkpoints of one world size built one after the other by the same processes (PAIRS_JSON: a list of
``[SPEC, OUT_DIR]``; the raw engines first, then the Trainers): each rank process pays its imports of torch,
DeepSpeed and transformers (~4.5 s of CPU) once, not once per checkpoint. SPEC_JSON is a JSON object:

    stage        ZeRO stage (1, 2, 3)
    world        number of processes
    dtype        "bf16" or "fp32"
    arch         "qwen2" or "llama"
    tied         tie_word_embeddings
    lora         wrap in a PEFT LoRA model (r=4 on q_proj, v_proj)
    exclude_frozen  save with exclude_frozen_parameters=True
    trainer      build through the HF Trainer instead of the raw engine
    gather       (trainer) stage3_gather_16bit_weights_on_model_save
    steps        optimizer steps before the save (0: save right after deepspeed.initialize)
    optimizer    "adamw" (default) or "sgd" (no optimizer state beyond the fp32 master: big benchmarks)
    init_dtype   "fp32" (default) or "bf16": dtype the model is created in before DeepSpeed takes it
    fast_init    create the model on the meta device and fill every parameter with tiles of one random
                 block (a prime number of values) instead of transformers' per-module init: minutes
                 saved at 7B; buffers are left unset, so only for steps=0 and reference=false
    size         "tiny" (hidden 64, 2 layers, vocab 256) or "qwen0.5b" / "7b" (benchmarks)
    reference    write reference.pt (trained weights and logits); default true

OUT_DIR receives ``run/`` (the save dir: ``latest``, ``<tag>/``, ``zero_to_fp32.py``, config.json)
for the engine, or ``run/checkpoint-N/`` for the Trainer, and ``reference.pt`` with the trained
module's weights (in its training dtype), a fixed batch of input ids and the logits the trained
model produced on it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=64),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=32000, max_position_embeddings=128),
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=512),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, max_position_embeddings=512),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(spec):
    from transformers import AutoConfig

    kwargs = dict(SIZES[spec.get("size", "tiny")])
    kwargs["tie_word_embeddings"] = bool(spec.get("tied", False))
    config = AutoConfig.for_model(spec.get("arch", "qwen2"), **kwargs)
    config.torch_dtype = "bfloat16" if spec["dtype"] == "bf16" else "float32"
    return config


def _no_shm_op():
    """Skip DeepSpeed's CPU shared-memory all-reduce: a speed path only (it compiles with gcc on first
    use, about a minute); gloo does the same collectives and the checkpoint files do not change."""
    import importlib

    # Not `import deepspeed.comm.torch as m`: that resolves the attribute deepspeed.comm.torch, which is
    # the torch package deepspeed.comm imported, and the patch would miss DeepSpeed's module.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def _model(spec):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1234)
    import transformers

    dtype = torch.bfloat16 if spec.get("init_dtype") == "bf16" else torch.float32
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    if spec.get("fast_init"):
        if spec.get("steps", 2) or spec.get("reference", True):
            raise SystemExit("fast_init leaves buffers unset: only with steps=0 and reference=false")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(_config(spec), **{key: dtype})
        model = model.to_empty(device="cpu")
        _fill(model, dtype)
    else:
        model = AutoModelForCausalLM.from_config(_config(spec), **{key: dtype})
    if spec.get("lora"):
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                          init_lora_weights=False)
        model = get_peft_model(model, lora)
    return model


def _fill(model, dtype, block_len=16_777_259):
    """Every parameter: tiles of one normal(0, 0.02) block of a prime length (so no two tensors, or
    offsets within one, line up the same values unless they are block_len apart)."""
    import torch

    block = (torch.randn(block_len, generator=torch.Generator().manual_seed(1234)) * 0.02).to(dtype)
    shift = 0
    with torch.no_grad():
        for p in model.parameters():
            flat = p.data.view(-1)
            for start in range(0, flat.numel(), block_len):
                n = min(block_len, flat.numel() - start)
                first = min(n, block_len - shift)
                flat[start:start + first].copy_(block[shift:shift + first])
                if n > first:
                    flat[start + first:start + n].copy_(block[:n - first])
            shift = (shift + 7919) % block_len


def _log(rank, t0, what):
    if rank == 0 and os.environ.get("DS_BUILD_TIMES"):
        import time

        print(f"[ds_build] {time.perf_counter() - t0:7.1f} s  {what}", flush=True)


def _ds_config(spec, batch):
    cfg = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": spec["stage"]},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if spec["dtype"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _input_ids(spec):
    import torch

    gen = torch.Generator().manual_seed(7)
    vocab = SIZES[spec.get("size", "tiny")]["vocab_size"]
    return torch.randint(0, vocab, (2, 16), generator=gen)


def _engine_worker(rank, spec, out, t0):
    import deepspeed
    import torch

    torch.set_num_threads(1 if spec.get("size", "tiny") == "tiny" else max(1, os.cpu_count() // spec["world"]))
    model = _model(spec)
    _log(rank, t0, f"model created ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters)")
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.get("optimizer") == "sgd":
        optimizer = torch.optim.SGD(params, lr=1e-2)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=_ds_config(spec, 2))
    _log(rank, t0, "deepspeed.initialize done")
    gen = torch.Generator().manual_seed(100 + rank)
    vocab = SIZES[spec.get("size", "tiny")]["vocab_size"]
    seq = 16 if spec.get("size", "tiny") == "tiny" else 8
    for _ in range(int(spec.get("steps", 2))):
        ids = torch.randint(0, vocab, (2, seq), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    save_dir = Path(out) / "run"
    engine.save_checkpoint(str(save_dir), exclude_frozen_parameters=bool(spec.get("exclude_frozen")))
    _log(rank, t0, "checkpoint saved")
    if spec.get("reference", True):
        _write_reference(spec, engine, out, rank)
    if rank == 0:
        config = _config(spec)
        if not spec.get("no_config"):
            config.save_pretrained(str(save_dir))
        if spec.get("lora"):
            engine.module.peft_config["default"].save_pretrained(str(save_dir))


def _gathered_state(spec, module):
    """The trained module's weights, full, in their training dtype (all ranks take part)."""
    import deepspeed

    params = list(module.parameters())
    if spec["stage"] == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _write_reference(spec, engine, out, rank):
    import torch

    module = engine.module
    module.eval()
    ids = _input_ids(spec)
    with torch.no_grad():
        logits = module(input_ids=ids).logits.detach().clone()
    state = _gathered_state(spec, module)
    if rank == 0:
        torch.save({"input_ids": ids, "logits": logits, "state": state}, str(Path(out) / "reference.pt"))


def _trainer_worker(rank, spec, out, t0):
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from transformers import Trainer, TrainingArguments
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    torch.set_num_threads(1)
    # a Trainer built after another in this process gets accelerate's state afresh (tests/witness/trainer_runs.py)
    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    ds = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": spec["stage"],
                              "stage3_gather_16bit_weights_on_model_save": bool(spec.get("gather", False))},
        "bf16": {"enabled": "auto"},
    }
    args = TrainingArguments(
        output_dir=str(Path(out) / "run"), use_cpu=True, deepspeed=ds, per_device_train_batch_size=2,
        max_steps=int(spec.get("steps", 2)), save_steps=int(spec.get("steps", 2)), save_strategy="steps",
        logging_steps=1000, report_to=[], bf16=spec["dtype"] == "bf16", learning_rate=1e-2,
        dataloader_num_workers=0, save_only_model=False, disable_tqdm=True,
    )
    model = _model(spec)
    vocab = SIZES[spec.get("size", "tiny")]["vocab_size"]
    gen = torch.Generator().manual_seed(5)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, vocab, (64, 16), generator=gen)]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    if spec.get("reference", True):
        _write_reference(spec, trainer.model_wrapped, out, rank)
    unset_hf_deepspeed_config()  # the next model is built outside this Trainer's ZeRO-3 zero.Init
    _log(rank, t0, "trainer checkpoint saved")


def build(spec: dict, out: str) -> None:
    """Build the checkpoint `spec` describes under `out` with `spec['world']` processes."""
    build_many([(spec, out)])


def build_many(pairs) -> None:
    """Build each ``(spec, out)`` in turn with the same ``world`` processes (one world size for all): the raw
    engines first, then the Trainers."""
    import torch.multiprocessing as mp

    pairs = sorted(((dict(spec), str(out)) for spec, out in pairs), key=lambda p: bool(p[0].get("trainer")))
    worlds = {int(spec["world"]) for spec, _ in pairs}
    if len(worlds) != 1:
        raise SystemExit(f"one world size per build, not {sorted(worlds)}")
    for _, out in pairs:
        os.makedirs(out, exist_ok=True)
    mp.spawn(_worker, args=(pairs, _free_port()), nprocs=worlds.pop(), join=True)


def _worker(rank, pairs, port):
    """Build every checkpoint on this rank, then exit without interpreter teardown (see tests/witness/common.py:
    exit_rank)."""
    import gc
    import time

    t0 = time.perf_counter()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(pairs[0][0]["world"]),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed
    import torch

    _no_shm_op()
    # Initialised before TrainingArguments so that zero.Init (ZeRO-3) sees the whole world.
    deepspeed.init_distributed(dist_backend="gloo")
    _log(rank, t0, "process group up")
    for spec, out in pairs:
        (_trainer_worker if spec.get("trainer") else _engine_worker)(rank, spec, out, t0)
        gc.collect()
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if sys.argv[1] == "--many":
        build_many(json.loads(sys.argv[2]))
    else:
        build(json.loads(sys.argv[1]), sys.argv[2])
