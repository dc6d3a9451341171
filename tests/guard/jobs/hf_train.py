"""An ordinary HF Trainer + DeepSpeed script (knows nothing of zeropilot), run by tests under `zeropilot run`.

    torchrun --nproc_per_node 2 hf_train.py OUT_DIR [--stage 2] [--steps 4] [--save-steps 2] [--load-best]
                                            [--report-to tensorboard,mlflow --logging-steps 1]
                                            [--per_device_train_batch_size 2 --gradient_accumulation_steps 1]
                                            [--seq 16 --max_length N] [--deepspeed ds.json] [--step-sleep S]
                                            [--fault kill-rank1|hang-rank1 --fault-step K --fault-once FILE]
                                            [--data-sleep R:S]
    python hf_train.py OUT_DIR --stage 0      (no DeepSpeed: a plain Trainer in one process)

The batch flags carry the Trainer's own argument names, as scripts built on ``HfArgumentParser`` take them;
``--deepspeed`` names a DeepSpeed config file (else the script builds one with ``"auto"`` values); ``--max_length``
cuts the samples (TRL's name for it).
``--fault`` makes rank 1 die (SIGKILL) or hang (sleep) at the end of step K, once: FILE is created when the fault
fires and no fault fires while it exists (a transient fault, as a restart meets it). ``--step-sleep`` slows each
step (a callback sleeps), so that a signal lands mid-run. ``--data-sleep R:S``: rank R's dataset takes S seconds
more to hand over each batch (a slow disk or data pipeline on its node: a straggler).

CPU (``use_cpu=True``, gloo); a tiny Qwen2 from config, random tokens. ``--load-best`` evaluates at
every save and loads the best checkpoint back when training ends (``load_best_model_at_end``: under
DeepSpeed the Trainer calls ``DeepSpeedEngine.load_checkpoint`` on it, in the same process).
"""

import argparse
import os
import signal
import time

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)


class Faults(TrainerCallback):
    """A fault on rank 1 at the end of one step, once; and a sleep per step."""

    def __init__(self, fault, step, once, sleep):
        self.fault, self.step, self.once, self.sleep = fault, step, once, sleep

    def on_step_end(self, args, state, control, **kwargs):
        if self.sleep:
            time.sleep(self.sleep)
        rank = int(os.environ.get("RANK", "0"))
        if self.fault == "none" or rank != 1 or state.global_step != self.step or os.path.exists(self.once):
            return
        open(self.once, "w").close()
        if self.fault == "kill-rank1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # hang-rank1


class Rows(torch.utils.data.Dataset):
    """The samples; each batch (``__getitems__``: the DataLoader fetches a batch at once) takes ``sleep`` s more."""

    def __init__(self, rows, sleep):
        self.rows, self.sleep = rows, sleep

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __getitems__(self, indices):
        if self.sleep:
            time.sleep(self.sleep)
        return [self.rows[i] for i in indices]


def _data_sleep(text, rank):
    """``R:S`` -> the seconds rank ``rank`` sleeps per batch."""
    r, _, seconds = text.partition(":")
    return float(seconds) if text and int(r) == rank else 0.0


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
    p.add_argument("--per_device_train_batch_size", type=int, default=2)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--max_length", type=int, default=0)
    p.add_argument("--deepspeed", default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--fault", choices=("none", "kill-rank1", "hang-rank1"), default="none")
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--fault-once", default="")
    p.add_argument("--data-sleep", default="")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.stage:  # --stage 0: a plain Trainer, no DeepSpeed
        deepspeed.init_distributed(dist_backend="gloo")  # before TrainingArguments: ZeRO-3's zero.Init on CPU
    ds = None if not a.stage else {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": a.stage},
          "zero_allow_untested_optimizer": True}
    if a.deepspeed:
        ds = a.deepspeed
    best = dict(eval_strategy="steps", eval_steps=a.save_steps, load_best_model_at_end=True,
                per_device_eval_batch_size=2) if a.load_best else {}
    args = TrainingArguments(output_dir=a.out, use_cpu=True, deepspeed=ds,
                             per_device_train_batch_size=a.per_device_train_batch_size,
                             gradient_accumulation_steps=a.gradient_accumulation_steps,
                             max_steps=a.steps, save_steps=a.save_steps, save_strategy="steps",
                             logging_steps=a.logging_steps, report_to=[] if a.report_to == "none" else a.report_to.split(","),
                             learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
                             **best)
    torch.manual_seed(1234)
    sizes = dict(TINY, max_position_embeddings=max(64, a.seq))
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **sizes))
    gen = torch.Generator().manual_seed(5)
    rows = torch.randint(0, TINY["vocab_size"], (64, a.seq), generator=gen)[:, :a.max_length or a.seq]
    data = [{"input_ids": r, "labels": r} for r in rows]
    evals = data[:8] if a.load_best else None
    if a.data_sleep:
        data = Rows(data, _data_sleep(a.data_sleep, int(os.environ.get("RANK", "0"))))
    callbacks = [Faults(a.fault, a.fault_step, a.fault_once, a.step_sleep)] if a.fault != "none" or a.step_sleep \
        else None
    Trainer(model=model, args=args, train_dataset=data, eval_dataset=evals, callbacks=callbacks).train()


if __name__ == "__main__":
    main()
