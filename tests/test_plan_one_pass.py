"""One pass from launch to plan: ``zeropilot plan`` reads the launch in ``launch/`` and then hands ``memory/`` its
:class:`~zeropilot.launch.planfacts.PlanFacts`; the call path never goes back.

Measured by running the command in-process under :func:`sys.setprofile`: every Python call whose code lies in
``src/zeropilot/launch/`` or ``src/zeropilot/memory/``, in order, gives the sequence of packages the input path runs
in; a crossing is a change of package in it (and a *direct* crossing a call from one package's code into the other's).
Module bodies are imported before measuring (an import is not the input path), and dataclass methods the standard
library generates (a record's ``__repr__``) are no package's code. Before this pass existed, ``plan examples/seed
--model Qwen/Qwen2-7B --gpus 4x16GiB --search`` crossed 53 times, 48 of them directly (``memory/from_launch.py``
re-reading documents key by key); ``PYTHONPATH=src python -m tests.test_plan_one_pass plan ARGS...`` (from the
repository root) prints the figures for any command.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

import zeropilot.launch
import zeropilot.memory
from tests.conftest import write_files
from zeropilot.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED = str(ROOT / "examples" / "seed")
PACKAGES = {Path(p.__file__).parent: p.__name__ for p in (zeropilot.launch, zeropilot.memory)}


_FILES: Dict[str, Optional[str]] = {}


def _package(code) -> Optional[str]:
    """The package of the directory a function's code lies in (either of the two, else None), once per file."""
    name = code.co_filename
    if name not in _FILES:
        _FILES[name] = PACKAGES.get(Path(name).parent)
    return _FILES[name]


def trace_plan(argv: List[str]) -> Tuple[int, List[str], List[str]]:
    """(exit status, the packages the calls ran in with repeats collapsed, direct cross-package calls)."""
    for package in (zeropilot.launch, zeropilot.memory):
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    phases: List[str] = []
    direct: List[str] = []

    def profile(frame, event, _arg):
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        callee = _package(frame.f_code)
        if callee is None:
            return
        caller = _package(frame.f_back.f_code) if frame.f_back is not None else None
        if caller is not None and caller != callee:
            direct.append(f"{frame.f_back.f_code.co_name} -> {callee}.{frame.f_code.co_name}")
        if not phases or phases[-1] != callee:
            phases.append(callee)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(argv)
    finally:
        sys.setprofile(previous)
    return status, phases, direct


ONE_PASS = ["zeropilot.launch", "zeropilot.memory"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("extra", [["--search"], ["--format", "json"],
                                   ["--lora-target", "q_proj,v_proj", "--stage", "auto", "--host-mem", "64"],
                                   ["--lora-rank", "0", "--freeze-layers", "2", "--optim", "adamw_8bit"]])
def test_the_seed_plan_reads_the_launch_once_then_plans(extra):
    status, phases, direct = trace_plan(["plan", SEED, "--model", "Qwen/Qwen2-7B", "--gpus", "4x16GiB", *extra])
    assert status == 0
    assert (phases, direct) == (ONE_PASS, [])


def test_a_launch_with_every_kind_of_source_is_read_in_one_pass(tmp_path, monkeypatch):
    """Training arguments with LLaMA-Factory defaults and settings the plan does not model, a DeepSpeed config with
    ``"auto"`` buckets, an exported allocator setting, an adapter config and a script's ``LoraConfig``; planned on
    this machine's GPU (none: no ``nvidia-smi`` on PATH) and on a hardware profile."""
    root = write_files(tmp_path, {
        "train.yaml": "model_name_or_path: Qwen/Qwen2-7B\nstage: sft\nfinetuning_type: lora\nlora_rank: 16\n"
                      "quantization_bit: 4\ncutoff_len: 2048\nneat_packing: true\nuse_unsloth: true\n"
                      "optim: paged_adamw_8bit\ndeepspeed: ds.json\noutput_dir: out\n",
        "ds.json": {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "overlap_comm": True,
                                          "stage3_prefetch_bucket_size": "auto",
                                          "offload_optimizer": {"device": "cpu"}},
                    "train_micro_batch_size_per_gpu": "auto"},
        "run.sh": "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                  "FORCE_TORCHRUN=1 NPROC_PER_NODE=2 llamafactory-cli train train.yaml\n",
        "adapter_config.json": {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]},
        "lora.py": "from peft import LoraConfig\nc = LoraConfig(r=4, lora_dropout=0.1)\n"})
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    profile = ROOT / "src" / "zeropilot" / "data" / "hardware" / "nvidia-h200-ws1.json"
    for extra in (["--gpus", "2x24GiB", "--search"], [], ["--hardware", str(profile), "--format", "json"]):
        status, phases, direct = trace_plan(["plan", str(root), *extra])
        assert status == 0, extra
        assert (phases, direct) == (ONE_PASS, []), extra


def test_the_tracer_sees_a_path_that_goes_back():
    """The measure is not blind: a launch value read again after memory has begun is a second crossing."""
    from zeropilot.launch import load_launch
    from zeropilot.launch.planfacts import plan_facts
    from zeropilot.memory.from_launch import launch_inputs

    launch = load_launch([SEED], use_installed=False)
    phases: List[str] = []

    def profile(frame, event, _arg):
        package = _package(frame.f_code) if event == "call" else None
        if package is not None and (not phases or phases[-1] != package):
            phases.append(package)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        launch_inputs(plan_facts(launch), 3584)
        launch.facts()
    finally:
        sys.setprofile(previous)
    assert phases == ONE_PASS + ["zeropilot.launch"]


if __name__ == "__main__":
    code, seen, calls = trace_plan(sys.argv[1:])
    print(f"exit {code}: {len(seen) - 1} crossing(s) between launch/ and memory/, {len(calls)} direct call(s)")
    for call in sorted(set(calls)):
        print(f"  {calls.count(call)} x {call}")
