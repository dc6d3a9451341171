import datetime
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import codes, run_check

LF = {"model_name_or_path": "Qwen/Qwen2-7B", "stage": "sft", "do_train": True, "finetuning_type": "lora",
      "template": "qwen", "dataset": "alpaca", "output_dir": "out", "deepspeed": "ds.json"}
DS = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}


def launch(launch_dir, script=None, **train):
    files = {"ds.json": DS, "train.yaml": yaml.safe_dump({**LF, **train})}
    if script is not None:
        files["run.sh"] = script
    return launch_dir(files)


def test_to001_fires_on_seed_value(launch_dir):
    findings = run_check(launch(launch_dir, ddp_timeout=18000000), select={"TO001"})
    assert codes(findings) == ["TO001"] and findings[0].key == "ddp_timeout"
    assert "208 days" in findings[0].message


def test_to001_quiet_on_hours(launch_dir):
    assert run_check(launch(launch_dir, ddp_timeout=7200), select={"TO001"}) == []


@pytest.mark.witness
def test_to001_witness():
    """ddp_timeout is seconds: 18000000 becomes a 208-day timedelta, and torch accepts it as a group timeout."""
    import torch.distributed as dist
    from transformers import TrainingArguments

    delta = TrainingArguments(output_dir="/tmp/zp-to001", ddp_timeout=18000000, report_to=[]).ddp_timeout_delta
    assert delta == datetime.timedelta(seconds=18000000) and int(delta.days) == 208
    store = dist.HashStore()
    pg = dist.ProcessGroupGloo(store, 0, 1, delta)
    assert pg.options._timeout == delta


def test_to002_fires_under_deepspeed(launch_dir):
    findings = run_check(launch(launch_dir, ddp_timeout=7200), select={"TO002"})
    assert codes(findings) == ["TO002"]


def test_to002_quiet_on_default_or_without_zero(launch_dir):
    assert run_check(launch(launch_dir, ddp_timeout=600), select={"TO002"}) == []
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 0}},
                       "train.yaml": yaml.safe_dump({**LF, "ddp_timeout": 7200})})
    assert run_check(root, select={"TO002"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_to002_witness():
    """Real HF Trainer + ZeRO-2 on 2 gloo ranks, ddp_timeout=5000: the world group has 5000 s, the group
    ZeRO reduces over keeps torch's default (30 min on gloo)."""
    from tests.witness.sessions import trainer_timeouts

    case = trainer_timeouts()["timeouts"]
    assert case["error"] is None
    assert case["timeouts"]["world"] == 5000
    assert case["timeouts"]["zero_dp"] == 1800


def test_to003_fires_under_hf(launch_dir):
    root = launch(launch_dir, "export DEEPSPEED_TIMEOUT=1800\nllamafactory-cli train train.yaml\n")
    findings = run_check(root, select={"TO003"})
    assert codes(findings) == ["TO003"] and findings[0].key == "DEEPSPEED_TIMEOUT" and findings[0].line == 1


def test_to003_quiet_without_hf(launch_dir):
    root = launch_dir({"run.sh": "export DEEPSPEED_TIMEOUT=60\ndeepspeed train.py\n",
                       "train.py": "import deepspeed\ndeepspeed.initialize()\n"})
    assert run_check(root, select={"TO003"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_to003_witness():
    """DEEPSPEED_TIMEOUT=1 (one minute) in the environment of a real Trainer run: no group gets 60 s."""
    from tests.witness.sessions import trainer_timeouts

    timeouts = trainer_timeouts()["timeouts"]["timeouts"]
    assert 60 not in timeouts.values()
    # ... while DeepSpeed did read it, as minutes, for its own init_distributed default.
    out = subprocess.run([sys.executable, "-c", "import deepspeed.constants as c; print(c.default_pg_timeout)"],
                         env={"DEEPSPEED_TIMEOUT": "1", "DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "0:01:00"


def test_to004_fires_on_nccl_timeout(launch_dir):
    root = launch(launch_dir, "export NCCL_TIMEOUT=1800\nllamafactory-cli train train.yaml\n")
    findings = run_check(root, select={"TO004"})
    assert codes(findings) == ["TO004"] and findings[0].key == "NCCL_TIMEOUT"


def test_to004_quiet_on_read_variables(launch_dir):
    root = launch(launch_dir, "export NCCL_IB_TIMEOUT=22\nexport TORCH_NCCL_BLOCKING_WAIT=1\n"
                              "llamafactory-cli train train.yaml\n")
    assert run_check(root, select={"TO004"}) == []


def _mentions(names):
    """name -> files of the installed stack whose text (Python) or bytes (shared libraries) name it exactly."""
    import importlib

    word = re.compile(rb"(?<![A-Z0-9_])(" + b"|".join(n.encode() for n in names) + rb")(?![A-Z0-9_])")
    hits = {n: [] for n in names}
    for pkg in ("torch", "deepspeed", "transformers", "accelerate", "peft"):
        root = Path(importlib.import_module(pkg).__file__).parent
        for path in root.rglob("*"):
            if path.suffix in (".py", ".so") or ".so." in path.name:
                try:
                    found = set(word.findall(path.read_bytes()))
                except OSError:
                    continue
                for name in found:
                    hits[name.decode()].append(path)
    return hits


@pytest.mark.witness
@pytest.mark.slow
def test_to004_witness():
    """No installed layer mentions the variables TO004 flags; the grep does find variables that are read.
    NCCL itself is not in a CPU build: its libnccl.so.2 (2.x shipped with torch 2.11+cu130) was searched on an
    H200 the same way (tests/witness/cuda_probe.py, result in tests/witness/cuda_probe_h200.json): no
    NCCL_TIMEOUT, while NCCL_IB_TIMEOUT and NCCL_DEBUG are there."""
    from zeropilot.rules.timeouts import UNREAD_TIMEOUT_VARS

    hits = _mentions(UNREAD_TIMEOUT_VARS + ("DEEPSPEED_TIMEOUT", "TORCH_NCCL_BLOCKING_WAIT"))
    for name in UNREAD_TIMEOUT_VARS:
        assert hits[name] == [], name
    assert hits["DEEPSPEED_TIMEOUT"] and hits["TORCH_NCCL_BLOCKING_WAIT"]


GROUP_TIMEOUTS = r'''
import datetime, os, torch, torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from tests.witness.common import free_port
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5000))
t = lambda g: int(g._get_backend(torch.device("cpu")).options._timeout.total_seconds())
clone = dist.new_group(ranks=range(dist.get_world_size()))  # deepspeed.utils.groups._clone_world_group
c10d.default_pg_timeout = datetime.timedelta(hours=2)
print(t(dist.group.WORLD), t(clone), t(dist.new_group(ranks=[0])))
'''


@pytest.mark.witness
def test_to002_workaround_witness():
    """A group made like DeepSpeed's clone ignores the world group's timeout; raising torch's default
    before the clone is made (the documented workaround) reaches it."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", GROUP_TIMEOUTS], cwd=str(repo), capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["5000", "1800", "7200"], out.stderr[-500:]


def test_to005_fires_on_seconds(launch_dir):
    root = launch_dir({"run.sh": "export DEEPSPEED_TIMEOUT=1800\ndeepspeed train.py\n"})
    findings = run_check(root, select={"TO005"})
    assert codes(findings) == ["TO005"] and "30 hours" in findings[0].message
    root = launch_dir({"run.sh": "export DEEPSPEED_TIMEOUT=30\ndeepspeed train.py\n"})
    assert run_check(root, select={"TO005"}) == []


@pytest.mark.witness
def test_to005_witness():
    """DeepSpeed turns DEEPSPEED_TIMEOUT=1800 into 30 hours."""
    out = subprocess.run([sys.executable, "-c", "import deepspeed.constants as c; print(c.default_pg_timeout)"],
                         env={"DEEPSPEED_TIMEOUT": "1800", "DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "1 day, 6:00:00"
