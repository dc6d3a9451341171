"""``zeropilot run`` itself: input errors, exit status and signals passed through, check first, library use.

Real subprocesses, no DeepSpeed: each test takes a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


from tests import runjobs

TIMEOUT = 120


def _zp(*args, cwd=None, env=None):
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(runjobs.REPO / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "zeropilot", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd or runjobs.REPO, env=env, start_new_session=True)


def test_no_command_is_an_input_error(tmp_path):
    r = _zp("run", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "no command" in r.stderr and "Traceback" not in r.stderr


def test_non_empty_run_directory_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("keep me")
    r = _zp("run", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "not empty" in r.stderr
    assert (tmp_path / "d" / "x").read_text() == "keep me"


def test_unknown_program_is_an_input_error(tmp_path):
    r = _zp("run", "--out", str(tmp_path / "d"), "--", "no-such-program-zp")
    assert r.returncode == 2 and "no such program" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()  # said before the run directory is made


def test_a_missing_launcher_names_its_package(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    r = _zp("run", "--out", str(tmp_path / "d"), "--", "deepspeed", "--num_gpus", "2", "train.py", env=env)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and not (tmp_path / "d").exists()
    assert "cannot start 'deepspeed': no such program: it comes with the deepspeed package" in r.stderr


def test_bad_hang_timeout_is_an_input_error(tmp_path):
    r = _zp("run", "--hang-timeout", "0", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "--hang-timeout" in r.stderr


def test_exit_status_passes_through(tmp_path):
    r = _zp("run", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert r.returncode == 3
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    assert run["exit_code"] == 3 and run["signal"] is None
    assert "verdict: CRASH" in r.stdout and str(tmp_path / "d") in r.stdout


def test_signal_passes_through(tmp_path):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    r = _zp("run", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", code)
    assert r.returncode == 128 + 15
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    assert run["signal"] == "SIGTERM" and run["exit_code"] == 143
    # the python command was the rank: faulthandler dumped its stack on SIGTERM
    assert "most recent call first" in (tmp_path / "d" / "stacks-rank-0.txt").read_text()


def test_check_errors_stop_the_launch_unless_no_check(tmp_path):
    cmd = ["torchrun", "--nproc_per_node", "2", str(runjobs.JOBS / "ds_faults.py"), "--fault", "save-rank0-only",
           "--save-dir", str(tmp_path / "ck"), "--deepspeed_config", str(runjobs.JOBS / "ds_config.json")]
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])  # torchrun, as a venv has it
    r = _zp("run", "--out", str(tmp_path / "d"), "--", *cmd, env=dict(os.environ, PATH=path))
    assert r.returncode == 1 and "PY001" in r.stderr and "--no-check" in r.stderr
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["launch.sh"]


def test_bootstrap_keeps_the_users_sitecustomize(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    code = "import os, sys; sys.exit(0 if os.environ.get('USER_SITE_RAN') == 'yes' else 5)"
    r = _zp("run", "--out", str(tmp_path / "d"), "--", sys.executable, "-c", code, env=env)
    assert r.returncode == 0, r.stderr


def test_library_use_callback_and_start(tmp_path):
    code = f"""
from zeropilot import guard
guard.start({str(tmp_path / 'lib')!r})
from zeropilot.guard import ZeroPilotCallback
from transformers import TrainerCallback
assert issubclass(ZeroPilotCallback, TrainerCallback)
from zeropilot.guard.rank import current
g = current("hf")
g.step_ended(1)
g.step_ended(2)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, PYTHONPATH=str(runjobs.REPO / "src")))
    assert r.returncode == 0, r.stderr
    events = [json.loads(x)["event"] for x in (tmp_path / "lib" / "rank-0.jsonl").read_text().splitlines()]
    assert events == ["start", "step", "step", "end"]


def test_run_json_has_the_plan_when_the_launch_names_a_known_model(tmp_path):
    (tmp_path / "train.py").write_text("import os\nprint('offline=' + str(os.environ.get('HF_HUB_OFFLINE')))\n")
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto",
                                                  "gradient_accumulation_steps": "auto",
                                                  "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}))
    r = _zp("run", "--out", str(tmp_path / "d"), "--", sys.executable, "train.py", "--deepspeed", "ds.json",
            "--model_name_or_path", "Qwen/Qwen2-7B", "--per_device_train_batch_size", "1", "--bf16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "d" / "run.json").read_text())
    assert run["check"]["errors"] == 0 and run["check"]["files"]
    assert run["plan"]["peak_bytes_per_rank"] == run["plan"]["gpu_peak_bytes"] > 0
    assert run["plan"]["model"]["name"] == "Qwen/Qwen2-7B"
    # sizing the model did not change the job's environment
    assert f"offline={os.environ.get('HF_HUB_OFFLINE')}" in r.stdout


def test_flight_recorder_pipes_are_removed_at_the_end_only_under_our_prefix(tmp_path):
    import os

    from zeropilot.runner.supervisor import _remove_pipes

    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    for d in (run, other):
        for r in (0, 1):
            os.mkfifo(d / f".nccl-pipe-rank-{r}.pipe")
    (run / ".nccl-pipe-rank-9.pipe.txt").write_text("a file, not a pipe")
    _remove_pipes(str(run / ".nccl-pipe-rank-"), run)
    _remove_pipes(str(other / ".nccl-pipe-rank-"), run)  # the user's own prefix elsewhere: left alone
    assert sorted(p.name for p in run.iterdir()) == [".nccl-pipe-rank-9.pipe.txt"]
    assert len(list(other.iterdir())) == 2


def test_the_launch_script_carries_the_environment_that_decides_the_launch(tmp_path):
    """`FORCE_TORCHRUN=1 NPROC_PER_NODE=2 zeropilot run -- llamafactory-cli train x.yaml`: the world size comes from
    the environment, so check and plan must see it (and nothing outside the curated names: no secrets)."""
    from zeropilot.check import check
    from zeropilot.runner.runinfo import write_launch_script

    script = write_launch_script(["llamafactory-cli", "train", "x.yaml"], tmp_path / "launch.sh",
                                 env={"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2", "HF_TOKEN": "secret",
                                      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"})
    text = script.read_text()
    assert "secret" not in text and "export NPROC_PER_NODE=2" in text
    _, launch = check([script])
    assert launch.world_size.value == 2 and launch.world_size.reason == "NPROC_PER_NODE"
    assert "PYTORCH_CUDA_ALLOC_CONF" in launch.env()


def test_nothing_of_the_job_outlives_it_not_even_a_compiler_in_its_own_process_group(tmp_path):
    """ninja runs each command in a process group of its own (same session): when the job ends with its ninja still
    building, a kill of the job's group leaves the command running; ``zeropilot run`` ends the whole session."""
    import shutil
    import time

    from zeropilot.runner.procs import cwd, scan

    ninja = shutil.which("ninja")
    assert ninja, "ninja is a dependency of the op builds (torch.utils.cpp_extension)"
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text("rule slow\n  command = sleep 97\nbuild out: slow\n")
    job = f"cd {build} && {ninja} >/dev/null 2>&1 & sleep 2; exit 0"  # the job ends while ninja still builds
    r = _zp("run", "--out", str(tmp_path / "d"), "--no-check", "--", "/bin/sh", "-c", job)
    assert r.returncode == 0, r.stderr[-2000:]
    time.sleep(0.5)
    left = [p for p in scan() if cwd(p.pid) == str(build)]
    for p in left:
        os.kill(p.pid, 9)
    assert left == []
