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


def _cache(root, index: int, level: int, kind: str, size: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_the_host_optimizers_partition_is_sized_past_the_last_level_cache(tmp_path):
    """Call 4's host (300 MiB L3): 4 x 300 MiB / 16 B = 78.6 M elements, rounded up to 2^27; a small cache still
    steps 2^26; a host short of memory halves it; a cache sysfs does not give is taken as 256 MiB."""
    _cache(tmp_path, 0, 1, "Data", "48K")
    _cache(tmp_path, 1, 1, "Instruction", "32K")
    _cache(tmp_path, 2, 2, "Unified", "2048K")
    _cache(tmp_path, 3, 3, "Unified", "300M")
    assert speed.last_level_cache(str(tmp_path)) == 300 << 20
    assert speed.adam_elems(300 << 20, 512 << 30) == 1 << 27
    assert speed.adam_elems(32 << 20, None) == 1 << 26
    assert speed.adam_elems(300 << 20, 4 << 30) == 1 << 26  # 2^27 x 16 B = 2 GiB > a quarter of 4 GiB
    assert speed.adam_elems(None, None) == 1 << 26 and speed.last_level_cache(str(tmp_path / "none")) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:         10 kB\nMemAvailable:    2048 kB\n")
    assert speed.mem_available(str(meminfo)) == 2048 * 1024


def test_the_host_figures_record_the_partition_they_stepped_over():
    out, why = speed.measure(torch, "not measured here", elems=1 << 12)
    assert out["cpu_adam_elems"] == 1 << 12 and out["torch_cpu_adamw_elems_per_s"] > 0
    assert speed_fields(out, "test")["cpu_adam_elems"] == 1 << 12
