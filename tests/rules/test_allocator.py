import os
import subprocess
import sys

import pytest

from tests.conftest import codes, run_check

SEED = ("#!/bin/bash\nexport PYTORCH_HIP_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128\n"
        "export ROCR_VISIBLE_DEVICES=0,1,2,3\nFORCE_TORCHRUN=1 llamafactory-cli train train.yaml\n")


def script(launch_dir, text):
    return launch_dir({"run.sh": text})


def _settings(env):
    """The allocator settings a fresh torch process took from `env` (torch._C accelerator-wide parser)."""
    clean = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch._C._accelerator_getAllocatorSettings())"],
                         env={**clean, **env}, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]


def test_al001_fires_on_seed(launch_dir):
    findings = run_check(script(launch_dir, SEED), select={"AL001"})
    assert codes(findings) == ["AL001"] and findings[0].key == "PYTORCH_HIP_ALLOC_CONF" and findings[0].line == 2
    assert "LLaMA-Factory" in findings[0].message


def test_al001_fires_when_cuda_var_also_set(launch_dir):
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                              "export PYTORCH_ALLOC_CONF=max_split_size_mb:256\ntorchrun --nproc_per_node 2 t.py\n")
    findings = run_check(root, select={"AL001"})
    assert codes(findings) == ["AL001"] and findings[0].key == "PYTORCH_ALLOC_CONF"


def test_al001_quiet(launch_dir):
    root = script(launch_dir, "export OPTIM_TORCH=0\nexport PYTORCH_HIP_ALLOC_CONF=expandable_segments:True\n"
                              "FORCE_TORCHRUN=1 llamafactory-cli train train.yaml\n")
    assert run_check(root, select={"AL001"}) == []
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\ntorchrun t.py\n")
    assert run_check(root, select={"AL001"}) == []


def test_al001_quiet_before_llamafactory_0_9_3(launch_dir):
    """LLaMA-Factory's launcher sets PYTORCH_CUDA_ALLOC_CONF since 0.9.3 (commit 7c61b35)."""
    root = script(launch_dir, SEED)
    assert run_check(root, versions="llamafactory=0.9.2", select={"AL001"}) == []
    assert codes(run_check(root, versions="llamafactory=0.9.3", select={"AL001"})) == ["AL001"]


@pytest.mark.witness
def test_al001_witness():
    """torch 2.13: with PYTORCH_CUDA_ALLOC_CONF set the HIP and generic variables are not even parsed
    (an invalid value in them raises nothing); without it the HIP one beats the generic one."""
    bad = "max_split_size_mb:1"  # torch rejects this value whenever it parses it
    assert _settings({"PYTORCH_HIP_ALLOC_CONF": bad})[0] != 0
    assert _settings({"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
                      "PYTORCH_HIP_ALLOC_CONF": bad, "PYTORCH_ALLOC_CONF": bad}) == \
        (0, "garbage_collection_threshold:0.6")
    assert _settings({"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.5",
                      "PYTORCH_ALLOC_CONF": bad}) == (0, "garbage_collection_threshold:0.5")


def test_al002_fires_on_old_cuda_torch(launch_dir):
    root = script(launch_dir, "export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True\ntorchrun t.py\n")
    assert codes(run_check(root, versions="torch=2.4.1+cu121", select={"AL002"})) == ["AL002"]
    assert run_check(root, versions="torch=2.13.0", select={"AL002"}) == []
    assert run_check(root, versions="torch=2.4.1+rocm6.1", select={"AL002"}) == []


def test_al003_fires_without_fraction(launch_dir):
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6\ntorchrun t.py\n")
    assert codes(run_check(root, select={"AL003"})) == ["AL003"]
    (root / "t.py").write_text("import torch\ntorch.cuda.set_per_process_memory_fraction(0.9)\n")
    assert run_check(root, select={"AL003"}) == []


def test_al004_fires_on_dtk(launch_dir):
    root = script(launch_dir, "export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True\ntorchrun t.py\n")
    findings = run_check(root, versions="torch=2.1.0+das.opt1.dtk24042,deepspeed=0.14.2+das.opt1.dtk25041",
                         select={"AL004"})
    assert codes(findings) == ["AL004"]
    assert run_check(root, versions="torch=2.4.1+cu121", select={"AL004"}) == []


def test_al005_fires(launch_dir):
    findings = run_check(script(launch_dir, SEED), select={"AL005"})
    assert codes(findings) == ["AL005"]
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\ntorchrun t.py\n")
    assert run_check(root, select={"AL005"}) == []


def test_al006_fires_on_typo(launch_dir):
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segment:True\ntorchrun t.py\n")
    findings = run_check(root, select={"AL006"})
    assert codes(findings) == ["AL006"] and "did you mean expandable_segments" in findings[0].message
    assert findings[0].severity.value == "error"
    root = script(launch_dir, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,"
                              "roundup_power2_divisions:[256:1,512:2]\ntorchrun t.py\n")
    assert run_check(root, select={"AL006"}) == []


@pytest.mark.witness
def test_al006_witness():
    """The CPU-callable parser of torch 2.13 takes a misspelt key silently (the option the user meant stays
    off), while it checks the values of keys it knows."""
    code, out = _settings({"PYTORCH_ALLOC_CONF": "expandable_segment:True"})
    assert code == 0 and out == "expandable_segment:True"
    assert _settings({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:2"})[0] != 0


def test_al007_fires_on_2_9(launch_dir):
    root = script(launch_dir, "export PYTORCH_ALLOC_CONF=expandable_segments:True\ntorchrun t.py\n")
    assert codes(run_check(root, versions="torch=2.9.1", select={"AL007"})) == ["AL007"]
    assert run_check(root, versions="torch=2.11.0", select={"AL007"}) == []
