"""A raw DeepSpeed loop with one fault, as users write them (knows nothing of zeropilot).

    deepspeed --num_gpus 2 ds_faults.py --fault FAULT --save-dir DIR --deepspeed_config CFG

FAULT:
  kill-in-save     rank 1 is SIGKILLed while it writes its model states (its client_state pickles a bomb)
  save-rank0-only  the save runs under ``if rank == 0`` (the others go on training: a hang)
  sleep-rank1      rank 1 sleeps before a barrier the others are waiting in (a hang)
  data-stall-rank1 rank 1's dataset never returns its third batch (a read without a timeout: a hang)
  storage-stall-rank1  the save at step 2 writes rank 1's model states into a file that never takes the bytes
                   (a FIFO nobody reads: a stalled network filesystem, as the rank sees it)
  mismatch         rank 0 averages its loss with an all_reduce the other ranks never call, then every rank
                   meets in a barrier (a hang)
  none             no fault

Slowness, with any FAULT (learned timeouts, stragglers):
  --data-sleep R:S[,R:S]  rank R takes S seconds more to load each batch (a slow disk or data pipeline on its node)
  --slow-save S           rank 0's saves take S seconds more (its model states pickle slowly: a slow disk)
  --save-every K          with FAULT none, save at every K-th step (default: once, at step 2)
  --stall-at K            rank 1 stops for good inside step K's forward (a hung step: a kernel or a collective
                          that never returns)
"""

import argparse
import os
import signal
import time

import deepspeed
import torch


class _KillOnPickle:
    """Kills its process when pickled: a rank dying in the middle of ``torch.save``."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)
        return (int, (0,))


class _SlowPickle:
    """Takes ``seconds`` to pickle: a model-states file written to a slow disk."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        time.sleep(self.seconds)
        return (int, (0,))


class Samples(torch.utils.data.Dataset):
    """Random inputs; with ``stall_at``, that sample's read never returns; each batch of 4 takes ``sleep`` s more."""

    def __init__(self, stall_at=None, sleep=0.0):
        self.stall_at = stall_at
        self.sleep = sleep

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if i == self.stall_at:
            time.sleep(3600)
        if self.sleep and i % 4 == 0:
            time.sleep(self.sleep)
        return torch.randn(32)


def _data_sleep(text, rank):
    """``R:S,...`` -> the seconds rank ``rank`` sleeps per batch."""
    for part in filter(None, text.split(",")):
        r, seconds = part.split(":")
        if int(r) == rank:
            return float(seconds)
    return 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none")
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p.add_argument("--data-sleep", default="")
    p.add_argument("--slow-save", type=float, default=0.0)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--stall-at", type=int, default=0)
    p = deepspeed.add_config_arguments(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend=os.environ.get("FAULTS_BACKEND", "gloo"))  # nccl on GPUs
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    engine, _, _, _ = deepspeed.initialize(args=a, model=model, model_parameters=model.parameters())
    rank = engine.global_rank
    stall = 8 if a.fault == "data-stall-rank1" and rank == 1 else None  # the third batch of 4
    batches = iter(torch.utils.data.DataLoader(Samples(stall, _data_sleep(a.data_sleep, rank)), batch_size=4))
    for step in range(1, a.steps + 1):
        if step == a.stall_at and rank == 1:
            model.register_forward_pre_hook(lambda module, inputs: time.sleep(3600))
        x = next(batches).to(engine.device)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if a.fault == "none":
            if step % a.save_every == 0 if a.save_every else step == 2:
                slow = {"slow": _SlowPickle(a.slow_save)} if a.slow_save and rank == 0 else {}
                engine.save_checkpoint(a.save_dir, client_state=slow)
        elif step == 2:
            if a.fault == "kill-in-save":
                state = {"bomb": _KillOnPickle()} if rank == 1 else {}
                engine.save_checkpoint(a.save_dir, client_state=state)
            elif a.fault == "save-rank0-only":
                if rank == 0:
                    engine.save_checkpoint(a.save_dir)
            elif a.fault == "storage-stall-rank1":
                if rank == 1:
                    tag = os.path.join(a.save_dir, "global_step2")
                    os.makedirs(tag, exist_ok=True)
                    os.mkfifo(os.path.join(tag, "zero_pp_rank_1_mp_rank_00_model_states.pt"))
                engine.save_checkpoint(a.save_dir)
            elif a.fault == "mismatch":
                if rank == 0:
                    torch.distributed.all_reduce(loss.detach().clone())
                torch.distributed.barrier()
            elif a.fault == "sleep-rank1":
                if rank == 1:
                    time.sleep(3600)
                torch.distributed.barrier()
            else:
                engine.save_checkpoint(a.save_dir)


if __name__ == "__main__":
    main()
