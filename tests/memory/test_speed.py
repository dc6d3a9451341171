"""speed_for: measured figures from a profile of the card, estimates from the card table with their ratio and its
source, what Speed.estimated() names, and a hostile profile's speed object refused in one line."""

import json
import math

import pytest

from zeropilot.errors import InputError
from zeropilot.memory.cards import CARDS
from zeropilot.memory.profile import GIB, from_dict, load
from zeropilot.memory.speed import (DEFAULT_LAUNCH_S, NOTES_MATMUL, STAND_IN, default_ratios, ratios_from,
                                    reference_profile, speed_for)

GPU_FIELDS = ["matmul_flops_per_s", "attention_flops_per_s", "mem_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s"]


def _speed(**over) -> dict:
    fig = {"matmul_flops_per_s": 700e12, "attention_flops_per_s": 400e12, "mem_bytes_per_s": 4.2e12,
           "h2d_bytes_per_s": 50e9, "d2h_bytes_per_s": 52e9, "cpu_adam_elems_per_s": 2e9,
           "torch_cpu_adamw_elems_per_s": 3e8, "cpu_adam_threads": 16, "launch_s": 6e-6, "launch_issue_s": 5e-6,
           "launch_device": "cuda", "cpu_adam_build_s": 55.0, "seconds": 19.0,
           "matmul_points": [{"m": 8192, "k": 4096, "n": 4096, "flops_per_s": 720e12}],
           "attention_points": [{"batch": 1, "heads": 32, "seq": 4096, "head_dim": 128, "flops_per_s": 400e12}]}
    fig.update(over)
    return fig


def _profile(gpu="NVIDIA H200", vendor="cuda", speed=None, network=None, path="h200.json"):
    data = {"schema": 1, "gpu_name": gpu, "vendor": vendor, "world_size": 1, "gpu_total_bytes": int(139.8 * GIB),
            "speed": speed}
    if network:
        data.update(network=network, network_backend="nccl", world_size=8)
    return from_dict(data, path)


def test_a_card_alone_is_estimated_from_its_datasheet_and_every_estimate_says_how():
    s = speed_for("A100")
    assert s.card_key == "A100-40GB" and s.estimated() == [n for n, _ in s.figures() if n != "peak_flops_per_s"]
    ratio = default_ratios()["matmul"].value
    assert ratio == pytest.approx(NOTES_MATMUL / (1979e12 / 2))  # 798 over the H100's 989.5
    assert s.matmul_flops_per_s.value == pytest.approx(312e12 * ratio)
    assert "A100" in s.matmul_flops_per_s.source and "798 TFLOP/s" in s.matmul_flops_per_s.source
    assert s.peak_flops_per_s.value == 312e12 and "datasheet" in s.peak_flops_per_s.source
    assert "FlashAttention-3" in s.attention_flops_per_s.source and "nvbandwidth" in s.h2d_bytes_per_s.source
    assert s.launch_s.value == DEFAULT_LAUNCH_S and "assumed" in s.launch_s.source
    assert "development host" in s.cpu_adam_elems_per_s.source and s.inter_busbw_bytes_per_s is None
    assert all(not f.measured and f.source for _, f in s.figures()) and s.notes == ()


def test_a_profile_of_the_card_is_measured_and_nothing_of_its_gpu_is_estimated():
    p = _profile(speed=_speed())
    for card in (None, "H200", "nvidia h200"):
        s = speed_for(card, p)
        assert s.card_key == "H200" and s.matmul_flops_per_s.value == 700e12 and s.matmul_flops_per_s.measured
        assert s.estimated() == ["intra_busbw_bytes_per_s"]  # one GPU measured: its links are the table's
        assert s.launch_s.value == 6e-6 and s.cpu_adam_threads == 16 and "h200.json" in s.h2d_bytes_per_s.source
        assert [(m.m, m.k, m.n) for m in s.matmul_points] == [(8192, 4096, 4096)]


def test_a_figure_the_profile_left_unmeasured_is_estimated_and_named():
    p = _profile(speed=_speed(attention_flops_per_s=None, cpu_adam_elems_per_s=None))
    s = speed_for("H200", p)
    assert {"attention_flops_per_s", "cpu_adam_elems_per_s"} <= set(s.estimated())
    assert "matmul_flops_per_s" not in s.estimated() and not s.attention_flops_per_s.measured


def test_a_profile_of_another_card_gives_its_host_figures_only():
    s = speed_for("A100-80GB", _profile(speed=_speed()))
    assert not s.matmul_flops_per_s.measured and s.cpu_adam_elems_per_s.measured
    assert s.cpu_adam_elems_per_s.value == 2e9 and any("not A100-80GB" in n for n in s.notes)


def test_a_cpu_profile_measures_the_host_and_leaves_every_gpu_figure_estimated():
    cpu = _speed(**{f: None for f in GPU_FIELDS}, launch_device="cpu", matmul_points=[], attention_points=[])
    s = speed_for(None, _profile(gpu=None, vendor="cpu", speed=cpu))
    assert set(GPU_FIELDS) <= set(s.estimated()) and s.card_key is None
    assert s.launch_s.measured and "cpu tensors" in s.launch_s.source
    assert s.torch_cpu_adamw_elems_per_s.measured and any(STAND_IN in n for n in s.notes)


def test_an_unknown_card_stands_in_with_a_note_and_a_bad_name_is_an_input_error():
    s = speed_for(None, _profile(gpu="Tesla V100-SXM2-16GB", speed=None))
    assert s.card == "Tesla V100-SXM2-16GB" and any("V100" in n and STAND_IN in n for n in s.notes)
    assert s.peak_flops_per_s.value == CARDS[STAND_IN].bf16_flops_per_s.value
    with pytest.raises(InputError, match="H100-SXM"):
        speed_for("V100")


def test_a_card_without_a_public_figure_takes_the_stand_ins_and_says_so():
    s = speed_for("K100")
    assert s.peak_flops_per_s.value == CARDS[STAND_IN].bf16_flops_per_s.value
    assert "NA" in s.peak_flops_per_s.source and "stands in" in s.peak_flops_per_s.source
    assert "PCIe Gen4 x16" in s.intra_busbw_bytes_per_s.source  # DCU links: not public, assumed


def test_a_reference_profile_gives_the_ratios_and_names_itself():
    ref = _profile(speed=_speed(matmul_flops_per_s=791.6e12), path="nvidia-h200-ws1.json")
    ratios = ratios_from(ref)
    assert ratios["matmul"].value == pytest.approx(0.8) and "nvidia-h200-ws1.json" in ratios["matmul"].source
    s = speed_for("A100", reference=ref)
    assert s.matmul_flops_per_s.value == pytest.approx(312e12 * 0.8)
    assert "nvidia-h200-ws1.json" in s.matmul_flops_per_s.source and s.launch_s.value == 6e-6
    assert not s.launch_s.measured and not s.cpu_adam_elems_per_s.measured  # another machine's figures
    assert ratios_from(None) == default_ratios() and ratios_from(_profile(speed=None)) == default_ratios()


def test_measured_bus_bandwidth_replaces_the_links_estimate():
    op = {"busbw_bytes_per_s": 300e9, "bytes": 64 << 20, "seconds": 0.01}
    p = _profile(speed=_speed(), network={"intra_node": {"all_gather": op, "reduce_scatter": {**op,
                                                         "busbw_bytes_per_s": 280e9}, "ranks": 8}})
    s = speed_for("H200", p)
    assert s.intra_busbw_bytes_per_s.measured and s.intra_busbw_bytes_per_s.value == 280e9 and s.estimated() == []


def test_the_shipped_profiles_load_with_or_without_speed():
    ref = reference_profile()
    assert ref is None or (ref.speed["matmul_flops_per_s"] > 0 and speed_for("A100", reference=ref))


@pytest.mark.parametrize("bad", [
    [], "fast", {"matmul_flops_per_s": -1.0}, {"matmul_flops_per_s": 0}, {"matmul_flops_per_s": True},
    {"mem_bytes_per_s": 1e20}, {"launch_s": 2.0}, {"cpu_adam_elems_per_s": "1e9"}, {"cpu_adam_threads": 0},
    {"cpu_adam_threads": 1.5}, {"launch_device": "tpu"}, {"matmul_points": {}}, {"matmul_points": [1]},
    {"matmul_points": [{"m": -1, "k": 2, "n": 2, "flops_per_s": 1e12}]},
    {"attention_points": [{"batch": 1, "heads": 1, "seq": 1, "head_dim": 1, "flops_per_s": -5}]},
    {"matmul_points": [{"m": 1, "k": 1, "n": 1, "flops_per_s": 1.0}] * 257}])
def test_a_hostile_speed_object_is_one_input_error(bad):
    speed = bad if not isinstance(bad, dict) else _speed(**bad)
    with pytest.raises(InputError) as err:
        _profile(speed=speed)
    assert "speed" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_in_a_profile_file_are_refused(tmp_path, token):
    path = tmp_path / "p.json"
    text = json.dumps({"schema": 1, "gpu_name": "NVIDIA H200", "vendor": "cuda", "world_size": 1,
                       "speed": _speed(matmul_flops_per_s=1.0)})
    path.write_text(text.replace('"matmul_flops_per_s": 1.0', f'"matmul_flops_per_s": {token}'))
    assert not math.isfinite(json.loads(path.read_text())["speed"]["matmul_flops_per_s"])
    with pytest.raises(InputError, match="speed.matmul_flops_per_s"):
        load(str(path))


def test_a_profile_without_speed_stays_valid_and_keeps_none():
    p = from_dict({"schema": 1, "gpu_name": "NVIDIA H200", "vendor": "cuda", "world_size": 1})
    assert p.speed is None and p.to_dict()["speed"] is None
    again = from_dict({**p.to_dict(), "speed": _speed(extra_key=1)})
    assert "extra_key" not in again.speed and again.speed["matmul_flops_per_s"] == 700e12
