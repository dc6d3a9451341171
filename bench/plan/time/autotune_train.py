"""The training script DeepSpeed's autotuner launches for each of its experiments (``autotune.py``).

A random model from a HF config (``--model-file``), bf16, on the GPU, optionally LoRA and gradient checkpointing as
``../zero_mem_probe_plan.py`` builds them; ``deepspeed.initialize(args=...)`` with the config the autotuner passes
after ``--deepspeed_config`` (base64, DeepSpeedConfig decodes it); then micro batches of random tokens until the
engine ends the process itself: ``engine.step`` calls ``_autotuning_exit`` once ``global_steps`` reaches
``end_profile_step`` + 1 (the metrics file written), and the model-info run exits in its first forward
(runtime/engine.py, 0.19.8). Micro batch and accumulation are read from the engine, so no ``arg_mappings``.

The autotuner counts an experiment as failed when a line of its stderr holds "error" (``autotuning/utils.py``
``search_error``), so this script sends Python's stderr to stdout (library warnings are no failures) and writes one
``Error: ...`` line to the real stderr when it fails. ``faulthandler`` ends a hung experiment after
``--exp-timeout-s`` (the autotuner waits for each without a limit). ``ZP_PROBE_DEVICE=cpu`` (with
``DS_ACCELERATOR=cpu``): the same on the CPU, a smoke test of the autotuner's flow.
"""
import argparse
import faulthandler
import json
import os
import sys
import time

T0 = time.time()
DEV = os.environ.get("ZP_PROBE_DEVICE", "cuda")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--deepspeed_config", required=True)
    p.add_argument("--local_rank", type=int, default=0)
    p.add_argument("--model-file", required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--lora", type=int, default=0)
    p.add_argument("--gc", action="store_true")
    p.add_argument("--exp-timeout-s", type=float, default=240.0)
    return p.parse_known_args()[0]


def main(args):
    import torch
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM
    if DEV == "cuda":
        torch.cuda.set_device(args.local_rank)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**json.load(open(args.model_file)))
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    if args.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    engine, *_ = deepspeed.initialize(args=args, model=model,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    mb, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    print(f"autotune_train: mb {mb} ga {ga} stage {engine.zero_optimization_stage()} "
          f"ready {time.time() - T0:.1f}s", flush=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    for step in range(10**6):  # the engine exits the process at end_profile_step + 1
        t = time.time()
        for _ in range(ga):
            x = torch.randint(0, cfg.vocab_size, (mb, args.seq), device=DEV, generator=g)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
        if DEV == "cuda":
            torch.cuda.synchronize()
        print(f"autotune_train: step {step} {time.time() - t:.3f}s loss {loss.item():.3f} "
              f"(process {time.time() - T0:.1f}s)", flush=True)
    raise RuntimeError("the engine never ended the experiment (is autotuning enabled in its config?)")


if __name__ == "__main__":
    args = parse()
    real_stderr = os.fdopen(os.dup(2), "w")
    os.dup2(1, 2)
    faulthandler.dump_traceback_later(args.exp_timeout_s, exit=True, file=real_stderr)
    try:
        main(args)
    except SystemExit:
        raise
    except BaseException as e:  # one line the autotuner's search_error reads; the traceback went to stdout
        import traceback
        traceback.print_exc()
        real_stderr.write(f"Error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n")
        real_stderr.flush()
        sys.exit(1)
