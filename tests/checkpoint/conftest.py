"""Real DeepSpeed checkpoints, built once per test session on CPU (gloo, N processes).

The checkpoints of one world size are built together by ``ds_build.py --many`` (one launch of that many
processes) the first time a test asks for any of them, and reused after that. The matrix covers ZeRO-1/2/3,
1/2/3 ranks, bf16/fp32, tied and untied embeddings, full and LoRA training, with and without
``exclude_frozen_parameters``, the raw engine and the HF Trainer (ZeRO-3 + LoRA +
``stage3_gather_16bit_weights_on_model_save: false``, the seed user's layout).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.once import locked, shared_dir
from tests.zp import extensions_dir

HERE = Path(__file__).resolve().parent

SPECS = {
    "z1_w1_fp32": dict(stage=1, world=1, dtype="fp32", arch="llama", tied=False),
    "z2_w2_bf16_tied": dict(stage=2, world=2, dtype="bf16", arch="qwen2", tied=True),
    "z3_w2_bf16_tied": dict(stage=3, world=2, dtype="bf16", arch="qwen2", tied=True),
    "z3_w3_fp32": dict(stage=3, world=3, dtype="fp32", arch="llama", tied=False),
    "z2_w3_bf16_lora_frozen": dict(stage=2, world=3, dtype="bf16", arch="llama", tied=False, lora=True),
    # ZeRO-3 keeping its frozen base: what the seed user's 33.9 GB checkpoints hold (FACTS.md C).
    "z3_w3_bf16_lora_frozen": dict(stage=3, world=3, dtype="bf16", arch="qwen2", tied=True, lora=True),
    "z3_w2_fp32_lora_excl": dict(stage=3, world=2, dtype="fp32", arch="qwen2", tied=True, lora=True,
                                 exclude_frozen=True),
    "trainer_z2_full": dict(stage=2, world=2, dtype="bf16", arch="qwen2", tied=True, trainer=True),
    "trainer_z3_lora": dict(stage=3, world=2, dtype="bf16", arch="qwen2", tied=True, lora=True, trainer=True,
                            gather=False),
}
FULL = ["z1_w1_fp32", "z2_w2_bf16_tied", "z3_w2_bf16_tied", "z3_w3_fp32", "trainer_z2_full"]
LORA = ["z2_w3_bf16_lora_frozen", "z3_w3_bf16_lora_frozen", "z3_w2_fp32_lora_excl", "trainer_z3_lora"]


class Built:
    """A built checkpoint: its save dir (or HF output dir), its spec and the reference file."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.spec = SPECS[name]
        self.root = root
        self.path = root / "run"
        self.reference_file = root / "reference.pt"

    @property
    def save_dir(self) -> Path:
        if self.spec.get("trainer"):
            return sorted(self.path.glob("checkpoint-*"))[-1]
        return self.path

    def reference(self):
        import torch

        return torch.load(str(self.reference_file), weights_only=True)

    def copy(self, dest: Path) -> Path:
        """A private copy to damage."""
        shutil.copytree(self.root, dest)
        return dest / "run"


def _build(names, base: Path) -> None:
    """Build ``names`` (one world size) under ``base/NAME`` in one launch of that many processes."""
    world = SPECS[names[0]]["world"]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TORCH_EXTENSIONS_DIR=extensions_dir(base / f"w{world}-torch-extensions"))
    pairs = [(SPECS[name], str(base / name)) for name in names]
    proc = subprocess.run([sys.executable, str(HERE / "ds_build.py"), "--many", json.dumps(pairs)],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"building {', '.join(names)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


_CACHE = {}  # module-level so that tests/cli, which imports this fixture, shares the builds


@pytest.fixture(scope="session")
def checkpoints():
    """``checkpoints(name)`` returns the named checkpoint's :class:`Built`. The first time any test of the run asks for
    one (whichever pytest-xdist worker asks first, under a run-wide lock: tests/once.py), every checkpoint of the same
    world size is built, in one launch: a rank process's imports cost more than the tiny builds it runs."""
    keep = os.environ.get("ZEROPILOT_TEST_CKPT_CACHE")  # a folder kept across sessions (local runs only)
    base = Path(keep) if keep else shared_dir("ckpts")
    base.mkdir(parents=True, exist_ok=True)

    def built(name: str) -> bool:
        done = base / name / ".built.json"
        return done.is_file() and json.loads(done.read_text()) == SPECS[name]

    def get(name: str) -> Built:
        if name not in _CACHE:
            world = SPECS[name]["world"]
            with locked(f"ckpt-w{world}"):
                group = [n for n, spec in SPECS.items() if spec["world"] == world]
                missing = [n for n in group if not built(n)]
                for n in missing:
                    shutil.rmtree(base / n, ignore_errors=True)
                if missing:
                    _build(missing, base)
                for n in missing:
                    (base / n / ".built.json").write_text(json.dumps(SPECS[n]))
                _CACHE.update({n: Built(n, base / n) for n in group})
        return _CACHE[name]

    return get


def zeropilot(*args: str, cwd=None):
    """Run the CLI in a subprocess; returns the CompletedProcess."""
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    return subprocess.run([sys.executable, "-m", "zeropilot", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)
