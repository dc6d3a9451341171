"""Helpers shared by the witness runners: tiny models, free ports, running a runner in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from tests.zp import extensions_dir, pythonpath

REPO = Path(__file__).resolve().parents[2]

# Qwen2-shaped, about 100 k parameters: fast on one CPU core, still has q/k/v/o and MLP projections.
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, tie_word_embeddings=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_rank_env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def exit_rank() -> None:
    """End a spawned rank at once, after flushing its output, skipping interpreter teardown.

    Two ways teardown goes wrong: a rank stuck in a collective keeps the others from exiting, and a rank whose
    gloo/DeepSpeed threads are still joinable at exit aborts with "terminate called without an active exception"
    (SIGABRT; CI stop 23, the 2-rank Trainer saves, after their last case raised in ``Trainer.__init__``). Either
    makes ``mp.spawn`` fail a run whose results were all written.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def tiny_model(lora: bool = False):
    """A freshly initialised tiny Qwen2 causal LM, wrapped in PEFT LoRA (q_proj, v_proj) when asked."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **TINY), torch_dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    return model


def token_data(n: int = 64, seq: int = 16):
    import torch

    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, TINY["vocab_size"], (n, seq), generator=gen)
    return [{"input_ids": row, "labels": row} for row in ids]


def run_module(module: str, spec: Dict[str, Any], out: Path, timeout: float = 300.0,
               env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``python -m module SPEC OUT`` and return the JSON it wrote to ``OUT/result.json``.

    The child's output is kept in ``OUT/log.txt``; a failure raises with its tail.
    """
    out.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=pythonpath(REPO), OMP_NUM_THREADS="1",
                     TOKENIZERS_PARALLELISM="false", TORCH_EXTENSIONS_DIR=extensions_dir(out / "torch_extensions"),
                     **(env or {}))
    log = out / "log.txt"
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", module, json.dumps(spec), str(out)], cwd=str(REPO),
                              env=child_env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    result = out / "result.json"
    if proc.returncode != 0 or not result.is_file():
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{module} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(result.read_text())


def files_under(folder: Path) -> Dict[str, int]:
    """Relative path -> size of every file under folder."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
