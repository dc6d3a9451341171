"""Checkpoint sizes: the formula against real DeepSpeed saves (H200 measurements and a CPU run here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeropilot.memory import PlanInputs, estimate_checkpoint, parse_gpus
from zeropilot.models import count_params, from_config, lora_trainable
from tests.zp import extensions_dir

HERE = Path(__file__).resolve().parent
H200 = HERE.parents[1] / "bench" / "plan" / "data" / "rows.jsonl"  # the save runs: source h200_call2


def _plan_ckpt(model: dict, world: int, stage: int, lora, exclude=None):
    arch = from_config(model, "m")
    trainable = lora_trainable(arch, lora) if lora else count_params(arch).total
    params = count_params(arch).total + (trainable if lora else 0)
    inputs = PlanInputs(arch, parse_gpus(f"{world}x80GiB"), stage=stage, lora_rank=lora, exclude_frozen=exclude)
    return estimate_checkpoint(inputs, params, trainable), params, trainable


def _h200_saves():
    rows = [json.loads(x) for x in H200.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("ckpt_bytes")]


@pytest.mark.parametrize("row", _h200_saves(), ids=lambda r: f"{r['spec']['name']}-z{r['spec']['stage']}-"
                                                          f"lora{r['spec'].get('lora', 0)}-"
                                                          f"excl{int(bool(r['spec'].get('exclude_frozen')))}")
def test_checkpoint_bytes_match_h200_saves(row):
    """engine.save_checkpoint on an H200 (DeepSpeed 0.19.8): total bytes within 0.5% of the formula."""
    s = row["spec"]
    ckpt, _, _ = _plan_ckpt(s["model"], 1, s["stage"], s.get("lora"), bool(s.get("exclude_frozen")) if s.get("lora")
                            else None)
    assert row["ckpt_bytes"] == pytest.approx(ckpt.total_bytes, rel=0.005)


@pytest.mark.slow
def test_checkpoint_bytes_match_a_real_deepspeed_save(tmp_path):
    """Two CPU ranks (gloo) save with the installed DeepSpeed: per-rank optimizer slices and the module.

    On CPU, ``param.detach().cpu()`` returns the same storage, so torch.save writes frozen fragments
    once; on GPUs they are copies (the H200 test above). Full fine-tuning and excluded frozen weights,
    compared here, do not depend on that. Each file carries ~30 KB of pickle metadata.
    """
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=extensions_dir(tmp_path / "torch_extensions"))
    subprocess.run([sys.executable, str(HERE / "ds_save_worker.py"), str(tmp_path)], check=True, env=env,
                   capture_output=True, timeout=300)
    sizes = json.loads((tmp_path / "sizes.json").read_text())
    sys.path.insert(0, str(HERE))
    from ds_save_worker import MODEL

    full, params, _ = _plan_ckpt(MODEL, 2, 2, None)
    assert sizes["z2_full"]["mp_rank_00_model_states.pt"] == pytest.approx(2 * params, abs=64_000)
    for rank in (0, 1):
        assert sizes["z2_full"][f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"] == pytest.approx(
            12 * params / 2, abs=64_000)
    assert sum(sizes["z2_full"].values()) == pytest.approx(full.total_bytes, abs=200_000)
    excl, _, trainable = _plan_ckpt(MODEL, 2, 3, 8, exclude=True)
    assert excl.frozen_bytes == 0
    optim = [v for k, v in sizes["z3_lora_excl"].items() if "optim_states" in k]
    assert sum(optim) == pytest.approx(12 * trainable, abs=100_000)
    assert sum(sizes["z3_lora_excl"].values()) == pytest.approx(excl.total_bytes, abs=200_000)


def test_frozen_weights_written_for_zero3_lora_without_gather():
    from zeropilot.models import CATALOGUE

    ckpt, params, trainable = _plan_ckpt(CATALOGUE["qwen2.5-7b"], 4, 3, 16)
    assert not ckpt.excludes_frozen and ckpt.frozen_bytes == 2 * (params - trainable) == 2 * count_params(
        from_config(CATALOGUE["qwen2.5-7b"], "q")).total
    assert ckpt.total_bytes / 1e9 == pytest.approx(15.7, abs=0.1)  # FACTS C: 15.7 GB per save, measured
    z2, _, _ = _plan_ckpt(CATALOGUE["qwen2.5-7b"], 4, 2, 16, exclude=False)
    assert z2.total_bytes / 1e9 == pytest.approx(31.0, abs=0.2)  # FACTS C: 31.0 GB at ZeRO-2, measured


def test_save_time_and_disk_peak():
    from dataclasses import replace

    from zeropilot.models import CATALOGUE

    arch = from_config(CATALOGUE["qwen2.5-7b"], "q")
    inputs = PlanInputs(arch, parse_gpus("4x80GiB"), stage=3, lora_rank=16, save_total_limit=2,
                        disk_write_bytes_per_s=0.5e9)
    trainable = lora_trainable(arch, 16)
    params = count_params(arch).total + trainable
    ckpt = estimate_checkpoint(inputs, params, trainable)
    assert ckpt.save_seconds == pytest.approx(ckpt.total_bytes / 0.5e9)
    assert ckpt.disk_peak_bytes == 3 * ckpt.total_bytes
    gathered = estimate_checkpoint(replace(inputs, gather_16bit_on_save=True), params, trainable)
    assert gathered.excludes_frozen and gathered.total_bytes < ckpt.total_bytes / 10


def test_disk_free_gives_a_disk_verdict_in_the_plan():
    from zeropilot.memory import make_plan
    from zeropilot.models import CATALOGUE

    arch = from_config(CATALOGUE["qwen2.5-7b"], "q")
    plan = make_plan(PlanInputs(arch, parse_gpus("4x80GiB"), stage=3, lora_rank=16, save_total_limit=3,
                                disk_free_bytes=int(50e9)))
    need = f"{4 * plan.checkpoint.total_bytes / 1e9:.1f} GB"  # 3 kept + the one being written
    assert any("does NOT fit" in n and need in n for n in plan.notes)
