"""An ordinary HF Trainer + DeepSpeed script (knows nothing of zeropilot), run by tests under `zeropilot run`.

    torchrun --nproc_per_node 2 hf_train.py OUT_DIR [--stage 2] [--steps 4] [--save-steps 2] [--load-best]
                                            [--report-to tensorboard,mlflow --logging-steps 1]
    python hf_train.py OUT_DIR --stage 0      (no DeepSpeed: a plain Trainer in one process)

CPU (``use_cpu=True``, gloo); a tiny Qwen2 from config, random tokens. ``--load-best`` evaluates at
every save and loads the best checkpoint back when training ends (``load_best_model_at_end``: under
DeepSpeed the Trainer calls ``DeepSpeedEngine.load_checkpoint`` on it, in the same process).
"""

import argparse

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--load-best", action="store_true")
    p.add_argument("--report-to", default="none",
                   help="the Trainer's report_to, comma-separated (tensorboard: event files in OUT/runs)")
    p.add_argument("--logging-steps", type=int, default=1000)
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.stage:  # --stage 0: a plain Trainer, no DeepSpeed
        deepspeed.init_distributed(dist_backend="gloo")  # before TrainingArguments: ZeRO-3's zero.Init on CPU
    ds = None if not a.stage else {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": a.stage},
          "zero_allow_untested_optimizer": True}
    best = dict(eval_strategy="steps", eval_steps=a.save_steps, load_best_model_at_end=True,
                per_device_eval_batch_size=2) if a.load_best else {}
    args = TrainingArguments(output_dir=a.out, use_cpu=True, deepspeed=ds, per_device_train_batch_size=2,
                             max_steps=a.steps, save_steps=a.save_steps, save_strategy="steps",
                             logging_steps=a.logging_steps, report_to=[] if a.report_to == "none" else a.report_to.split(","),
                             learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
                             **best)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **TINY))
    gen = torch.Generator().manual_seed(5)
    data = [{"input_ids": r, "labels": r} for r in torch.randint(0, TINY["vocab_size"], (64, 16), generator=gen)]
    evals = data[:8] if a.load_best else None
    Trainer(model=model, args=args, train_dataset=data, eval_dataset=evals).train()


if __name__ == "__main__":
    main()
