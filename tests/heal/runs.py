"""What the ``--heal`` runs on real ranks share (tests/heal/test_heal_runs.py, test_heal_preempt.py): the launches'
settings and the ways to compare a healed run with the run that never failed."""

from __future__ import annotations

import json
from pathlib import Path

from tests import runjobs

JOBS = runjobs.JOBS
Z2 = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
      "gradient_clipping": "auto", "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
HEAL = ["--heal", "--heal-backoff", "0.2"]


def _tensors(folder: Path) -> dict:
    """Every tensor of a DeepSpeed tag folder's files, by file and key path."""
    import torch

    out = {}

    def walk(obj, key):
        if isinstance(obj, torch.Tensor):
            out[key] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{key}[{i}]")

    for f in sorted(folder.glob("*.pt")):
        walk(torch.load(f, map_location="cpu", weights_only=False), f.name)
    return out


def bitwise_equal(a: Path, b: Path) -> int:
    """The number of tensors compared; fails on the first that differs in shape, dtype or any bit."""
    import torch

    ta, tb = _tensors(a), _tensors(b)
    assert ta and sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k
    return len(ta)


def heal_record(job) -> dict:
    return json.loads((job.run_dir / "heal.json").read_text())


def events(folder: Path, kind: str) -> list:
    out = []
    for f in sorted(folder.glob("rank-*.jsonl")):
        out += [r for r in map(json.loads, f.read_text().splitlines()) if r.get("event") == kind]
    return out


def losses(ckpt: Path) -> dict:
    state = json.loads((ckpt / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
