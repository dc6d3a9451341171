"""Witness for the plan's ZeRO buffers: what DeepSpeed holds for gradients, and when.

Real DeepSpeed on CPU, one rank on gloo, a tiny Qwen2 with only its last layer trainable (few trainable elements,
as with LoRA), torch AdamW (no op build). Reports, per configuration:
  bucket        elements of each contiguous-gradients reduce bucket DeepSpeed allocates (``reduce_bucket_size``
                whatever the number of trainable elements?)
  grads_at_loss ZeRO-1/2: elements of gradient partition held after a full step and the next forward, i.e. at
                the loss backward (released after each step?)
  grads_after_backward  the same after that backward, before the step (None-free ``averaged_gradients``;
                ``grads_in_partition`` is the flat buffer, never allocated with offload_optimizer)
  norm_dtype    the dtype DeepSpeed takes gradient norms in (``get_norm_dtype``: fp64 where the device has it)
Usage: python ds_buffers_worker.py PORT -> prints ``RESULT {json}``.
"""
import json
import sys

from ds_tiny import one_cpu_rank

RBS = 100_000  # more than the trainable elements (24,576)


def main(port: str) -> None:
    deepspeed, torch, AutoModelForCausalLM, cfg = one_cpu_rank(port)
    out = {}
    for name, stage, offload in (("zero2", 2, False), ("zero1", 1, False), ("zero2_offload", 2, True),
                                 ("zero3", 3, False)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        for n, p in model.named_parameters():
            p.requires_grad_(n.startswith("model.layers.1.mlp"))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        zero = {"stage": stage, "contiguous_gradients": True, "reduce_bucket_size": RBS, "overlap_comm": False}
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        params = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(params, lr=1e-3), model_parameters=params,
            config={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero,
                    "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
                    "steps_per_print": 10 ** 9})
        opt = engine.optimizer
        x = torch.randint(0, 512, (1, 16))
        rec = {"trainable": trainable}
        if stage == 3:  # the bucket is allocated in the optimizer's constructor
            rec["bucket"] = [b.buffer.numel() for b in opt.ipg_buckets.values() if b.buffer is not None]
            out[name] = rec
            engine.destroy()
            continue
        rec["bucket"] = []
        real_setup = opt.setup_buckets

        def setup():
            real_setup()
            rec["bucket"] += [t.numel() for b in opt.ipg_buckets.values() for t in b.buffer]
        opt.setup_buckets = setup

        def held():
            flat = getattr(opt, "grads_in_partition", None)
            avg = sum(t.numel() for g in opt.averaged_gradients.values() if g is not None
                      for t in (g if isinstance(g, list) else [g]))
            return {"flat": 0 if flat is None else flat.numel(), "averaged": avg}
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
        loss = engine(input_ids=x, labels=x).loss
        rec["grads_at_loss"] = held()
        engine.backward(loss)
        rec["grads_after_backward"] = held()
        engine.step()
        out[name] = rec
        engine.destroy()
    from deepspeed.runtime.zero.utils import get_norm_dtype

    out["norm_dtype"] = str(get_norm_dtype())
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
