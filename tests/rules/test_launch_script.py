import subprocess
import sys
import uuid

import pytest

from tests.conftest import codes, run_check


def test_sh001_fires_on_seed_cleanup(launch_dir):
    root = launch_dir({"run.sh": "#!/bin/bash\npkill -9 python\npkill -9 torchrun\nkillall -9 python3\n"
                                 "kill -9 -1\nsleep 3\nllamafactory-cli train t.yaml\n"})
    findings = run_check(root, select={"SH001"})
    assert codes(findings) == ["SH001"] * 4
    assert [f.line for f in findings] == [2, 3, 4, 5] and findings[0].key == "pkill"


def test_sh001_fires_on_kill_by_name(launch_dir):
    root = launch_dir({"run.sh": "ps aux | grep train.py | awk '{print $2}' | xargs kill -9\n"
                                 "kill -9 $(pgrep -f llamafactory)\nllamafactory-cli train t.yaml\n"})
    findings = run_check(root, select={"SH001"})
    assert codes(findings) == ["SH001", "SH001"] and [f.line for f in findings] == [1, 2]


def test_sh001_quiet_on_own_pids(launch_dir):
    root = launch_dir({"run.sh": "kill -TERM -- -\"$(cat train.pid)\"\nkill $PID\nllamafactory-cli train t.yaml\n"})
    assert run_check(root, select={"SH001"}) == []


@pytest.mark.witness
def test_sh001_witness(tmp_path):
    """A launch script's `pkill -9 -f PATTERN` kills a process it did not start (another job's)."""
    marker = f"zp-other-job-{uuid.uuid4().hex}"
    victim = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(120)", marker])
    try:
        script = tmp_path / "run.sh"
        script.write_text(f"#!/bin/bash\npkill -9 -f {marker}\n")
        subprocess.run(["bash", str(script)], timeout=30)
        assert victim.wait(timeout=30) == -9
    finally:
        if victim.poll() is None:
            victim.kill()


def test_sh002_fires(launch_dir):
    root = launch_dir({"run.sh": "export ROCR_VISIBLE_DEVICES=0,1,2,3\n"
                                 "NPROC_PER_NODE=8 FORCE_TORCHRUN=1 llamafactory-cli train t.yaml\n"})
    findings = run_check(root, select={"SH002"})
    assert codes(findings) == ["SH002"] and findings[0].key == "ROCR_VISIBLE_DEVICES"
    assert "8 processes" in findings[0].message and "4 device" in findings[0].message


def test_sh002_fires_on_torchrun_flag(launch_dir):
    root = launch_dir({"run.sh": "export CUDA_VISIBLE_DEVICES=0,1\ntorchrun --nproc_per_node 4 train.py\n"})
    assert codes(run_check(root, select={"SH002"})) == ["SH002"]


def test_sh002_quiet(launch_dir):
    root = launch_dir({"run.sh": "export CUDA_VISIBLE_DEVICES=0,1,2,3\ndeepspeed --num_gpus 4 train.py\n"})
    assert run_check(root, select={"SH002"}) == []


def test_sh003_fires(launch_dir):
    root = launch_dir({"run.sh": "llamafactory-cli train configs/missing.yaml\n"
                                 "deepspeed train.py --deepspeed ds_missing.json --output_dir out\n"})
    findings = run_check(root, select={"SH003"})
    assert codes(findings) == ["SH003", "SH003"]
    assert {f.line for f in findings} == {1, 2}


def test_sh003_quiet_when_present(launch_dir):
    root = launch_dir({"run.sh": "deepspeed train.py --deepspeed ds.json --output_dir out\n",
                       "ds.json": {"zero_optimization": {"stage": 2}}})
    assert run_check(root, select={"SH003"}) == []


@pytest.mark.witness
def test_sh003_witness(tmp_path):
    """A --deepspeed path that does not exist is refused when TrainingArguments are built."""
    from transformers import TrainingArguments

    with pytest.raises(ValueError, match="Expected a string path to an existing deepspeed config"):
        TrainingArguments(output_dir=str(tmp_path), deepspeed=str(tmp_path / "ds_missing.json"), report_to=[])


def test_sh002_deepspeed_num_gpus_says_what_happens(launch_dir):
    """deepspeed --num_gpus with CUDA_VISIBLE_DEVICES: the finding says the list is ignored and which GPUs run."""
    root = launch_dir({"run.sh": "export CUDA_VISIBLE_DEVICES=0,1\ndeepspeed --num_gpus 4 train.py\n"})
    [f] = run_check(root, select={"SH002"})
    assert f.key == "num_gpus" and f.line == 2
    assert "deletes the variable" in f.message and "0,1,2,3" in f.message and "did not list" in f.message
    root = launch_dir({"run.sh": "CUDA_VISIBLE_DEVICES=2,3 deepspeed --num_gpus 2 train.py\n"})
    [f] = run_check(root, select={"SH002"})
    assert "instead of 2,3" in f.message and "--include localhost:2,3" in f.message


@pytest.mark.witness
@pytest.mark.slow
def test_sh002_deepspeed_witness(tmp_path):
    """DeepSpeed's real launcher (CPU accelerator, same code path): CUDA_VISIBLE_DEVICES=5 with --num_gpus 2 starts
    2 ranks that each see CUDA_VISIBLE_DEVICES=0,1 — the listed device is ignored."""
    import os
    import signal
    import socket

    probe = tmp_path / "p.py"
    probe.write_text("import os, pathlib\npathlib.Path(f\"rank{os.environ['LOCAL_RANK']}.txt\").write_text("
                     "os.environ['CUDA_VISIBLE_DEVICES'])\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "5"}
    proc = subprocess.Popen([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                             str(port), str(probe)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ranks = {p.name: p.read_text() for p in tmp_path.glob("rank*.txt")}
    assert ranks == {"rank0.txt": "0,1", "rank1.txt": "0,1"}, out[-2000:]
    assert "ignoring it" in out


def test_sh002_deepspeed_include_also_ignores_the_variable(launch_dir):
    root = launch_dir({"run.sh": "export CUDA_VISIBLE_DEVICES=2,3\ndeepspeed --include localhost:0,1 train.py\n"})
    [f] = run_check(root, select={"SH002"})
    assert f.key == "include" and "physical GPUs 0,1" in f.message and "instead of 2,3" in f.message
    root = launch_dir({"run.sh": "export CUDA_VISIBLE_DEVICES=0,1\ndeepspeed --include localhost:0,1 train.py\n"})
    assert run_check(root, select={"SH002"}) == []
