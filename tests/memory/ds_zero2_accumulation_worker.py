"""Witness for the plan's ZeRO-2 gradient accumulation term: the gradient buffers DeepSpeed holds between micro batches.

Real DeepSpeed on CPU, gloo, a tiny Qwen2 in bf16 (full fine-tuning, tied embeddings), torch AdamW, ZeRO-2 with
``contiguous_gradients``, gradient accumulation 3; one process per rank. Every 16-bit flat gradient partition
``copy_grads_in_partition`` makes (``grads_in_partition``) is recorded with its micro batch and the earlier ones
still referenced then (``beside``), and at each point below the storages the optimizer still reaches are reported,
by which buffer they are:
  after_micro_1 / after_micro_2   after the micro batch's backward and ``engine.step()`` (not the boundary)
  at_loss_3                       the last micro batch's loss, before its backward
  before_step                     the boundary's backward done, before ``engine.step()``
  after_step                      after the boundary's step
Each point: ``param_grads`` (``param.grad`` still set), ``all_grad_tensors`` and ``averaged_gradients`` (the buffers
their tensors view: ``"buffer N"`` is the flat partition made in micro batch N, ``"other"`` anything else),
``grads_in_partition`` and ``bucket`` elements, and ``alive``: the buffers DeepSpeed still references (their
storage's use count: every view of one holds it; the witness keeps each, so no later one reuses its address).
Usage: python ds_zero2_accumulation_worker.py PORT RANK WORLD -> rank 0 prints ``RESULT {json}``.
"""
import json
import os
import sys

RBS = 100_000
GA = 3


def main(port: str, rank: str, world: str) -> None:
    os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                               tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    params = list(model.parameters())
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": GA, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "contiguous_gradients": True, "reduce_bucket_size": RBS,
                                    "overlap_comm": False},
              "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
              "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-3),
                                      model_parameters=params, config=config)
    opt = engine.optimizer
    made = []  # (micro batch, the tensor, kept here so that no later one takes its address) of each partition
    beside = []  # the buffers still referenced as each one is made
    micro = [0]
    copy = opt.copy_grads_in_partition

    def recording_copy(param, group_idx=None):
        copy(param, group_idx)
        flat = opt.grads_in_partition
        if flat is not None and (not made or made[-1][1] is not flat):
            beside.append([f"buffer {m}" for m, t in made if holders(t) > 0])
            made.append((micro[0], flat))

    opt.copy_grads_in_partition = recording_copy

    def holders(t):  # references to t's storage besides t's own and the witness's (its views each hold one)
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata) - 2

    def which(tensors):
        names = {t.untyped_storage().data_ptr(): f"buffer {m}" for m, t in made}
        return sorted({names.get(t.untyped_storage().data_ptr(), "other") for t in tensors})

    def held():
        flat = opt.grads_in_partition
        return {"param_grads": sum(p.grad is not None for p in params),
                "all_grad_tensors": which(t for ts in opt.all_grad_tensors.values() if ts for t in ts),
                "averaged_gradients": which(t for ts in opt.averaged_gradients.values() if ts for t in ts),
                "grads_in_partition": 0 if flat is None else flat.numel(),
                "bucket": sum(t.numel() for b in opt.ipg_buckets.values() for t in b.buffer),
                "alive": [f"buffer {m}" for m, t in made if holders(t) > 0 or t is flat]}

    x = torch.randint(0, 512, (1, 16))
    rec = {"trainable": sum(p.numel() for p in params),
           "in_partition": sum(p.numel() for g in opt.params_in_partition for p in g),
           "partition_size": [int(s) for s in opt.partition_size]}
    for m in range(1, GA + 1):
        micro[0] = m
        loss = engine(input_ids=x, labels=x).loss
        if m == GA:
            rec[f"at_loss_{m}"] = held()
            engine.backward(loss)
            rec["before_step"] = held()
            engine.step()
            rec["after_step"] = held()
        else:
            engine.backward(loss)
            engine.step()  # not the boundary: the optimizer does not step
            rec[f"after_micro_{m}"] = held()
    rec["made"] = [dict(micro=m, elements=t.numel(), dtype=str(t.dtype), beside=b) for (m, t), b in zip(made, beside)]
    if rank == "0":
        print("RESULT " + json.dumps(rec), flush=True)
    engine.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:4])
