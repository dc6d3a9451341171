"""What the ``--heal`` runs on real ranks share (tests/heal/test_heal_runs.py, test_heal_preempt.py): the launches'
settings and the ways to compare a healed run with the run that never failed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests import runjobs

JOBS = runjobs.JOBS
Z2 = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
      "gradient_clipping": "auto", "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
HEAL = ["--heal", "--heal-backoff", "0.2"]
MATRIX = runjobs.REPO / "bench" / "heal" / "matrix.py"


def _matrix():
    """bench/heal/matrix.py, the instrument whose comparison these tests share (no second copy of it here)."""
    spec = importlib.util.spec_from_file_location("zeropilot_bench_heal_matrix", MATRIX)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bitwise_equal(a: Path, b: Path) -> int:
    """The number of tensors compared; fails on the first that differs in shape, dtype or any bit."""
    result = _matrix().compare(a, b)
    assert result["tensors"] and result["bitwise_equal"], result
    return result["tensors"]


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
