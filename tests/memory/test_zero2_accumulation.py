"""ZeRO-2 with gradient accumulation: the first micro batch's flat 16-bit gradient partition stays to the boundary
(``all_grad_tensors``) while each later micro batch reduces into a new one (DeepSpeed 0.19.8), and the replay holds
it."""
import json
import os
import shlex
import sys
from pathlib import Path

import pytest


def _witness(tmp_path: Path, world: int) -> dict:
    from tests.runjobs import free_port
    from tests.zp import extensions_dir, run_group

    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TORCH_EXTENSIONS_DIR=extensions_dir(tmp_path / "ext"))
    worker = Path(__file__).with_name("ds_zero2_accumulation_worker.py")
    port = str(free_port())
    cmd = [sys.executable, str(worker), port]
    if world == 1:
        out = run_group(cmd + ["0", "1"], timeout=300, env=env, cwd=tmp_path)
    else:  # rank 1 in the background, rank 0 reports
        others = " ".join(f"{shlex.join(cmd + [str(r), str(world)])} >/dev/null 2>&1 &" for r in range(1, world))
        out = run_group(["bash", "-c", f"{others} {shlex.join(cmd + ['0', str(world)])}; wait"], timeout=300,
                        env=env, cwd=tmp_path)
    return json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_witness_zero2_keeps_first_partition_between_micro_batches(tmp_path, world):
    """Real DeepSpeed on CPU (gloo, bf16, ZeRO-2, gradient accumulation 3): every micro batch makes its own flat bf16
    gradient partition, every parameter reaching into this rank's partition whole (at world size 2 more than the
    1/N ``partition_size``); the first one's stays in ``all_grad_tensors`` through the later micro batches' forward
    and becomes ``averaged_gradients`` at the boundary; the later ones, ``param.grad`` and the buckets are dropped by
    each epilogue; the boundary's step releases it all."""
    res = _witness(tmp_path, world)
    whole = res["in_partition"]
    assert res["made"] == [dict(micro=m, elements=whole, dtype="torch.bfloat16", beside=["buffer 1"] if m > 1 else [])
                           for m in (1, 2, 3)]  # each later one made while the first is held, the one before gone
    if world == 1:
        assert whole == res["trainable"]
    else:
        assert res["partition_size"][0] < whole < res["trainable"]
    between = {"param_grads": 0, "all_grad_tensors": ["buffer 1"], "averaged_gradients": [], "grads_in_partition": 0,
               "bucket": 0, "alive": ["buffer 1"]}
    for at in ("after_micro_1", "after_micro_2", "at_loss_3"):
        assert res[at] == between
    assert res["before_step"] == dict(between, all_grad_tensors=[], averaged_gradients=["buffer 1"])
    assert res["after_step"] == dict(between, all_grad_tensors=[], alive=[])


def test_zero2_accumulation_replayed():
    """The replay holds the first partition for ZeRO-2 with ga > 1 with the optimizer on the GPU (about 2 bytes per
    trainable element more at Qwen2.5-1.5B's mb 2 x 1024), whatever trains; with ``offload_optimizer`` (DeepSpeed
    accumulates in the CPU partition) and at ga = 1 as before."""
    from dataclasses import replace

    from tests.memory.test_zero1_accumulation import replay_case
    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.gpu import trainable_params, zero12_replay

    base, counts, segs = replay_case(2)
    ga4 = replace(base, grad_accum=4)
    args = zero12_replay(ga4, counts, trainable_params(ga4, counts), DEFAULT)
    assert args["micro_batches"] == 4 and args["partition_gradients"] and "layer_grads" not in args
    assert segs(ga4) - segs(base) > 2 * counts.total * 0.9
    assert "partition_gradients" in zero12_replay(replace(ga4, lora_rank=16), counts, 0, DEFAULT)
    offload = replace(base, offload_optimizer="cpu")
    assert segs(replace(offload, grad_accum=4)) == segs(offload)
