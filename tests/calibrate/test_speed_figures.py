"""calibrate's speed measurements: the GPU code run on CPU tensors (the same functions, the host's clock for CUDA
events, small shapes), the FLOPs attention is counted with, and impossible timings dropped with a reason."""

import math

import pytest

torch = pytest.importorskip("torch")

from zeropilot.calibrate import speed  # noqa: E402
from zeropilot.memory.profile import speed_fields  # noqa: E402

SMALL = speed.Shapes(matmul_m=(16, 2048), matmul_kn=((32, 32), (64, 16)), attention=((1, 2, 64, 16),),
                     copy_bytes=1 << 20, matmul_work=1e6, warm_s=0.0)


def test_the_device_measurements_run_on_cpu_tensors_and_give_a_valid_speed_object():
    out, why = speed.device_figures(torch, torch.device("cpu"), SMALL)
    assert why == {}
    assert [(p["m"], p["k"], p["n"]) for p in out["matmul_points"]] == [(16, 32, 32), (16, 64, 16), (2048, 32, 32),
                                                                        (2048, 64, 16)]
    large = sorted(p["flops_per_s"] for p in out["matmul_points"] if p["m"] >= 2048)
    assert out["matmul_flops_per_s"] == pytest.approx(sum(large) / 2)  # the median of the m >= 2048 points
    assert [p["seq"] for p in out["attention_points"]] == [64] and out["attention_flops_per_s"] > 0
    assert all(out[f] > 0 for f in ("mem_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s"))
    launch = speed.launch(torch, torch.device("cpu"))
    assert 0 < launch["launch_issue_s"] <= launch["launch_s"] * 1.5 < 1e-2
    checked = speed_fields({**out, **launch, "launch_device": "cpu"}, "test")
    assert checked["matmul_points"] == out["matmul_points"] and checked["cpu_adam_threads"] is None


def test_attention_is_counted_as_the_causal_forward_and_two_and_a_half_times_it_backward():
    forward = 4 * 1 * 32 * 4096**2 * 128 / 2
    assert speed.attention_flops(1, 32, 4096, 128) == pytest.approx(3.5 * forward)


def test_an_impossible_timing_is_dropped_with_its_value_as_the_reason():
    out = {"matmul_flops_per_s": math.inf, "launch_s": 5.0, "mem_bytes_per_s": 3e12, "seconds": -1.0,
           "matmul_points": [{"m": 1, "k": 1, "n": 1, "flops_per_s": math.nan},
                             {"m": 2, "k": 2, "n": 2, "flops_per_s": 1e12}]}
    why = {}
    speed._drop_impossible(out, why)
    assert out["matmul_flops_per_s"] is None and out["launch_s"] is None and out["seconds"] is None
    assert out["mem_bytes_per_s"] == 3e12 and [p["m"] for p in out["matmul_points"]] == [2]
    assert "inf" in why["speed.matmul_flops_per_s"] and set(why) == {"speed.matmul_flops_per_s", "speed.launch_s",
                                                                     "speed.seconds"}
