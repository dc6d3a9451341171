"""calibrate: the CPU path really runs (two gloo ranks), its profile says what is unmeasured, and plan uses
profiles; model-build detection reads raw deepspeed.initialize scripts."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeropilot.memory.profile import GIB, apply, from_dict, load
from zeropilot.errors import InputError
from zeropilot.launch.build import model_build
from zeropilot.memory.constants import DEFAULT
from zeropilot.memory.speed import speed_for
from tests.zp import extensions_dir

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "zeropilot" / "data" / "hardware"


GPU_SPEED = ("matmul_flops_per_s", "attention_flops_per_s", "mem_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s")


@pytest.mark.slow
def test_cpu_run_writes_a_profile_that_says_gpu_fields_are_unmeasured(tmp_path):
    """Two gloo ranks; the speed worker measures the host and says why each GPU figure is missing. No compiler
    (``CXX=/bin/false``): DeepSpeed's CPUAdam op fails to build in seconds, and the profile says so."""
    out = tmp_path / "cpu.json"
    env = dict(os.environ, CXX="/bin/false", TORCH_EXTENSIONS_DIR=extensions_dir(tmp_path / "ext"))
    proc = subprocess.run([sys.executable, "-m", "zeropilot", "calibrate", "--nproc", "2", "--out", str(out),
                           "--checkpoint-dir", str(tmp_path), "--disk-mib", "4", "--network-mib", "1",
                           "--adam-elems", str(1 << 20)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    profile = load(str(out))
    assert profile.vendor == "cpu" and profile.world_size == 2
    assert profile.outside_torch_bytes is None and "no GPU" in profile.unmeasured["outside_torch_bytes"]
    assert profile.disk_write_bytes_per_s > 0 and "unmeasured" in proc.stdout
    assert not list(tmp_path.glob(".zeropilot-calibrate-*"))  # the disk test file is gone
    speed = profile.speed
    assert all(speed[f] is None and "no GPU" in profile.unmeasured[f"speed.{f}"] for f in GPU_SPEED)
    assert speed["torch_cpu_adamw_elems_per_s"] > 0 and 0 < speed["launch_s"] < 1e-3
    assert speed["cpu_adam_elems"] == 1 << 20  # --adam-elems: the partition both optimizers stepped over
    assert speed["launch_device"] == "cpu" and speed["cpu_adam_threads"] >= 1 and speed["matmul_points"] == []
    assert speed["cpu_adam_elems_per_s"] is None and speed["cpu_adam_build_s"] > 0
    assert "DeepSpeedCPUAdam could not be built" in profile.unmeasured["speed.cpu_adam_elems_per_s"]
    assert "torch AdamW" in proc.stdout and "eager launch (cpu)" in proc.stdout
    # the two ranks timed their links (gloo: labelled a CPU figure), and plan's speed reads the host figures
    assert profile.network_backend == "gloo" and profile.network["world"]["all_gather"]["busbw_bytes_per_s"] > 0
    assert "gloo on CPU" in profile.unmeasured["network"]
    fig = speed_for(None, profile)
    assert fig.torch_cpu_adamw_elems_per_s.measured and fig.launch_s.measured and not fig.cpu_adam_elems_per_s.measured
    assert set(GPU_SPEED) <= set(fig.estimated()) and fig.intra_busbw_bytes_per_s.measured is False


def test_shipped_h200_profiles_load_and_replace_the_outside_torch_figure():
    for ws in (1, 2):
        p = load(str(SHIPPED / f"nvidia-h200-ws{ws}.json"))
        assert p.gpu_name == "NVIDIA H200" and p.world_size == ws and p.expandable_segments is True
        c, notes = apply(p, DEFAULT, ws, 3)
        assert c.non_torch_zero3_init == p.outside_torch_bytes and c.nccl_multi_gpu == 0
        assert 1.0 * GIB < p.outside_torch_bytes < 2.5 * GIB and notes


@pytest.mark.parametrize("bad", [{}, {"schema": 1, "world_size": 0, "vendor": "cuda"},
                                 {"schema": 1, "world_size": 1, "vendor": "cuda", "outside_torch_bytes": -1},
                                 {"schema": 1, "world_size": 1, "vendor": "tpu"}])
def test_a_bad_profile_is_an_input_error(bad):
    with pytest.raises(InputError):
        from_dict(bad)


def test_not_json_profile_is_an_input_error(tmp_path):
    f = tmp_path / "p.json"
    f.write_text("{nope")
    with pytest.raises(InputError):
        load(str(f))


def test_raw_deepspeed_initialize_script_is_not_zero_init():
    raw = "import deepspeed\nm = load()\nengine, *_ = deepspeed.initialize(model=m, config='ds.json')\n"
    assert model_build(ast.parse(raw)).zero_init is False
    wrapped = "import deepspeed\nwith deepspeed.zero.Init():\n    m = load()\ndeepspeed.initialize(model=m)\n"
    assert model_build(ast.parse(wrapped)).zero_init is True


def test_plan_no_zero_init_lets_the_init_phase_set_the_peak():
    cmd = [sys.executable, "-m", "zeropilot", "plan", "--model", "Qwen/Qwen2-7B", "--gpus", "2x16GiB", "--stage", "3",
           "--lora-rank", "16", "--micro-batch", "1", "--seq-len", "1024", "--gradient-checkpointing",
           "--host-mem", "64", "--format", "json"]
    raw = json.loads(subprocess.run(cmd + ["--no-zero-init"], capture_output=True, text=True, timeout=60).stdout)
    zi = json.loads(subprocess.run(cmd + ["--zero-init"], capture_output=True, text=True, timeout=60).stdout)
    assert raw["peak_phase"] == "init" and raw["verdict"]["kind"] != "fits"
    assert zi["peak_phase"] != "init" and zi["init_peak_bytes"] < raw["init_peak_bytes"]
    assert raw["host_verdict"]["kind"] == "fits"


@pytest.mark.parametrize("argv", [["calibrate", "--nproc", "0"], ["calibrate", "--disk-mib", "0"],
                                  ["calibrate", "--network-mib", "0"],
                                  ["plan", "--model", "Qwen/Qwen2-7B", "--gpus", "1x80GiB", "--hardware", "/nonexistent"]])
def test_bad_calibrate_and_profile_arguments_exit_2(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "zeropilot", *argv, *(["--out", str(tmp_path / "p.json")]
                           if argv[0] == "calibrate" else [])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.strip()
    assert not (tmp_path / "p.json").exists()


def test_check_finds_the_shipped_profile_for_the_named_gpu_at_the_launch_world_size():
    """check() uses a calibrate profile for the GPU model it is told (the CLI detects it); never by itself."""
    from pathlib import Path

    from zeropilot.check import check

    seed = Path(__file__).resolve().parents[2] / "examples" / "seed"
    _, launch = check([seed], gpus="16GiB", gpu_name="NVIDIA H200", use_installed=False)
    assert launch.world_size.value == 4 and Path(launch.hardware_profile.path).name == "nvidia-h200-ws2.json"
    _, launch = check([seed], gpus="16GiB", use_installed=False)
    assert getattr(launch, "hardware_profile", None) is None
