"""Witness for the plan's ZeRO-1 gradient accumulation term: what DeepSpeed holds between micro batches.

Real DeepSpeed on CPU, one rank on gloo, a tiny Qwen2 in bf16 (full fine-tuning), torch AdamW, gradient accumulation 2.
After the first micro batch's backward (before the accumulation boundary) and again after the second one's forward,
reports per configuration:
  grads         elements of autograd's ``param.grad`` still held, and their dtypes
  grad_accum    elements held in ``param.grad_accum`` (DeepSpeed's separate accumulator), and their dtypes
  bucket        elements of the reduce buckets held (``setup_buckets``)
  flat          elements of ZeRO-2's flat gradient partition (``grads_in_partition``)
  use_grad_accum_attribute  the ZeRO optimizer's flag (``gradient_accumulation_dtype`` differs from the parameters')
  optimizer     the wrapper's class: bf16 with an fp32 ``grad_accum_dtype`` at ZeRO-1 is ``BF16_Optimizer``
                (``engine._do_optimizer_sanity_check``), whose fp32 accumulator is a different term
Configurations: ZeRO-1 (default ``data_types``), ZeRO-1 with ``grad_accum_dtype`` fp32, ZeRO-1 with CPU optimizer
offload, ZeRO-2. Usage: python ds_accumulation_worker.py PORT -> prints ``RESULT {json}``.
"""
import json
import sys

from ds_tiny import one_cpu_rank

RBS = 100_000


def main(port: str) -> None:
    deepspeed, torch, AutoModelForCausalLM, cfg = one_cpu_rank(port)
    out = {}
    for name, stage, offload, accum in (("zero1", 1, False, None), ("zero1_fp32_accum", 1, False, "fp32"),
                                        ("zero1_offload", 1, True, None), ("zero2", 2, False, None)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        params = list(model.parameters())
        zero = {"stage": stage, "contiguous_gradients": True, "reduce_bucket_size": RBS, "overlap_comm": False}
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
                  "zero_optimization": zero, "zero_allow_untested_optimizer": True,
                  "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10 ** 9}
        if accum:
            config["data_types"] = {"grad_accum_dtype": accum}
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-3),
                                          model_parameters=params, config=config)
        opt = engine.optimizer

        def held():
            grads = [p.grad for p in params if p.grad is not None]
            accs = [p.grad_accum for p in params if getattr(p, "grad_accum", None) is not None]
            flat = getattr(opt, "grads_in_partition", None)
            return {"grads": sum(g.numel() for g in grads), "grad_dtypes": sorted({str(g.dtype) for g in grads}),
                    "grad_accum": sum(g.numel() for g in accs), "accum_dtypes": sorted({str(g.dtype) for g in accs}),
                    "bucket": sum(t.numel() for b in getattr(opt, "ipg_buckets", {}).values() for t in b.buffer),
                    "flat": 0 if flat is None else flat.numel()}
        x = torch.randint(0, 512, (1, 16))
        rec = {"trainable": sum(p.numel() for p in params), "optimizer": type(opt).__name__,
               "use_grad_accum_attribute": getattr(opt, "use_grad_accum_attribute", None)}
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()  # not the boundary: the optimizer does not step
        rec["after_first_backward"] = held()
        loss = engine(input_ids=x, labels=x).loss
        rec["at_second_loss"] = held()
        engine.backward(loss)
        engine.step()  # the boundary
        rec["after_boundary_step"] = held()
        out[name] = rec
        engine.destroy()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
