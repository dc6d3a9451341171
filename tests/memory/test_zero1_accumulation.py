"""ZeRO-1 with gradient accumulation: autograd's 16-bit gradients and the reduce bucket stay from the first micro
batch to the accumulation boundary (DeepSpeed 0.19.8 reduces ZeRO-1 only there), and the replay holds them."""
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest


@pytest.mark.slow
def test_witness_zero1_holds_gradients_between_micro_batches(tmp_path):
    """Real DeepSpeed on CPU (one gloo rank, bf16, gradient accumulation 2): after the first micro batch, and still at
    the second one's loss, ZeRO-1 holds every parameter's bf16 ``param.grad`` and the whole reduce bucket (also with
    offload_optimizer); the default ``grad_accum_dtype`` is the model's, so ``use_grad_accum_attribute`` is off and no
    fp32 ``grad_accum`` exists; an fp32 ``grad_accum_dtype`` makes the engine wrap ZeRO-1 in ``BF16_Optimizer`` (not
    replayed). ZeRO-2 holds neither ``param.grad`` nor the bucket there. The boundary's step releases it all."""
    from tests.runjobs import free_port
    from tests.zp import extensions_dir, run_group

    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=extensions_dir(tmp_path / "ext"))
    worker = Path(__file__).with_name("ds_accumulation_worker.py")
    out = run_group([sys.executable, str(worker), str(free_port())], timeout=300, env=env, cwd=tmp_path)
    res = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    empty = {"grads": 0, "grad_dtypes": [], "grad_accum": 0, "accum_dtypes": [], "bucket": 0, "flat": 0}
    for name in ("zero1", "zero1_offload"):
        rec = res[name]
        assert rec["optimizer"] == "DeepSpeedZeroOptimizer" and rec["use_grad_accum_attribute"] is False
        for at in ("after_first_backward", "at_second_loss"):
            assert rec[at] == dict(empty, grads=rec["trainable"], grad_dtypes=["torch.bfloat16"], bucket=100_000)
        assert rec["after_boundary_step"] == empty
    assert res["zero1_fp32_accum"]["optimizer"] == "BF16_Optimizer"
    assert res["zero2"]["use_grad_accum_attribute"] is False
    assert res["zero2"]["at_second_loss"] == empty


def test_zero1_accumulation_replayed_for_full_fine_tuning_only():
    """The replay adds the held gradients for ZeRO-1 full fine-tuning with ga > 1 (about 2 bytes per trainable
    element more); ga = 1 and LoRA are replayed as before (ZeRO-2: tests/memory/test_zero2_accumulation.py)."""
    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.gpu import trainable_params, zero12_replay

    base, counts, segs = replay_case(1)
    ga4 = replace(base, grad_accum=4)
    assert zero12_replay(ga4, counts, trainable_params(ga4, counts), DEFAULT)["micro_batches"] == 4
    assert segs(ga4) - segs(base) > 2 * counts.total * 0.9
    assert segs(replace(ga4, lora_rank=16)) == segs(replace(base, lora_rank=16))


def replay_case(stage: int):
    """Qwen2.5-1.5B full fine-tuning at ``stage``, micro batch 2 x 1024 on one 79 GiB card: ``(inputs, counts,
    segs)``, ``segs(inputs)`` the bytes the ZeRO-1/2 replay reserves (the accumulation tests of both stages)."""
    from zeropilot.memory import PlanInputs, parse_gpus
    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.gpu import trainable_params, zero12_segments
    from zeropilot.models import CATALOGUE, count_params, from_config

    base = PlanInputs(arch=from_config(CATALOGUE["qwen2.5-1.5b"], "qwen2.5-1.5b"), hardware=parse_gpus("1x79GiB"),
                      stage=stage, micro_batch=2, seq_len=1024)
    counts = count_params(base.arch)
    return base, counts, lambda inputs: zero12_segments(inputs, counts, trainable_params(inputs, counts), DEFAULT)
