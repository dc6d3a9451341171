"""Real jobs under ``zeropilot run``, each run once per test session (cached); they return run directories.

Shared by the guard, report and repro tests. Every job is a real multi-process launch on CPU
(``DS_ACCELERATOR=cpu``, gloo, 2 ranks) of an unmodified script:

- :func:`hf_trainer`: HF Trainer + DeepSpeed ZeRO-2 under ``torchrun``, 8 steps, saves at steps 4 and 8,
  then loads the best of them back (``load_best_model_at_end``: ``DeepSpeedEngine.load_checkpoint``); it reports
  to TensorBoard and MLflow and ``zeropilot top`` follows it live (:func:`hf_trainer_watched`: the same job).
- :func:`hf_trainer_plain`: a plain HF Trainer (no DeepSpeed) as ``python script.py``, 3 steps, one save.
- :func:`accelerate_trainer`: the same Trainer script under ``accelerate launch --use_deepspeed``, 2 steps,
  one save.
- :func:`accelerate_loop`: a plain accelerate loop (``python script.py``), 3 steps of 2 accumulated
  micro-batches, ``save_state`` then ``load_state``.
- :func:`raw_deepspeed`: ``examples/raw-deepspeed/train.py`` (ZeRO-3) under the ``deepspeed`` launcher,
  6 steps, saves at steps 3 and 6, the job's own monitors on (TensorBoard, DeepSpeed's CSV monitor).
- :func:`killed_in_save`: rank 1 is SIGKILLed while it writes its model states during a save.
- :func:`hang_save_rank0_only`: the save runs on rank 0 only; ``--hang-timeout 10 --on-hang stop``.
- :func:`hang_sleep_rank1`: rank 1 sleeps before a barrier; ``--hang-timeout 10 --on-hang stop``.
- :func:`hang_stale_lock`: a stale op-build lock blocks every rank before its first step.
- :func:`hang_data_stall_rank1`, :func:`hang_storage_stall_rank1`, :func:`hang_mismatch`: a dataset that never
  returns, a checkpoint file that never takes the bytes, a collective one rank calls alone.
- :func:`op_build_stopped_then_next`: a real JIT op build stopped mid-way, then the next launch.
- :func:`learned_timeouts`: a save slower than ``--hang-timeout`` stopped, then a later run pointed at the first
  (``--timeouts-from``) lets it finish and stops a hung step at its learned deadline; rank 1 loads its data slowly.
- :func:`hf_slow_loader`: HF Trainer + ZeRO-2 under torchrun, rank 1's dataset 0.4 s slower per batch, reporting to
  TensorBoard: the straggler the Trainer's own token-count gather hides from the phase times.

Each returns a :class:`Job` (run directory, exit status, output, checkpoint folder). Jobs get their
own ``TORCH_EXTENSIONS_DIR``, a free port, a timeout, and their process group is killed on every path.
The CPU shm all-reduce build is skipped by the suite's ``tests/site/sitecustomize.py``
(``ZEROPILOT_TESTS_NO_SHM_OP=1``, set by tests/conftest.py), which zeropilot's bootstrap chain-loads (see that file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from tests.once import once, shared_dir
from tests.zp import NO_SHM_OP, pythonpath

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "guard" / "jobs"
EXAMPLE = REPO / "examples" / "raw-deepspeed"
JOB_TIMEOUT_S = 240.0


@dataclass
class Job:
    """One ``zeropilot run`` and what it left."""

    run_dir: Path
    returncode: int
    stdout: str
    stderr: str
    ckpt_dir: Path
    command: List[str]


def root() -> Path:
    """The jobs' folder, one for the whole test run (all pytest-xdist workers: tests/once.py)."""
    return shared_dir("runjobs")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_env(name: str) -> dict:
    env = dict(os.environ)
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TORCH_EXTENSIONS_DIR=str(root() / name / "torch_extensions"), HF_HUB_OFFLINE="1",
               PYTHONPATH=pythonpath(REPO / "src", *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return env


def zeropilot_run(name: str, command: List[str], flags: List[str] = (), env: Optional[dict] = None,
                  timeout: float = JOB_TIMEOUT_S) -> Job:
    """``python -m zeropilot run --out ROOT/name/run FLAGS -- COMMAND`` in its own process group."""
    base = root() / name
    base.mkdir(parents=True, exist_ok=True)
    run_dir = base / "run"
    argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(run_dir), *flags, "--", *command]
    proc = subprocess.Popen(argv, cwd=str(REPO), env=env or job_env(name), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{name}: zeropilot run did not end within {timeout:.0f} s\n{err[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    (base / "stdout.txt").write_text(out)
    (base / "stderr.txt").write_text(err)
    return Job(run_dir, proc.returncode, out, err, base / "ckpt", argv)


def _deepspeed(script: Path, *args: str) -> List[str]:
    return ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), str(script), *args]


def hf_trainer() -> Job:
    """(a) HF Trainer, ZeRO-2, torchrun, 2 ranks, saves at steps 4 and 8, then loads the best one back: the job of
    :func:`hf_trainer_watched`."""
    return hf_trainer_watched().job


@once
def hf_slow_loader() -> Job:
    """HF Trainer + ZeRO-2, torchrun, 2 ranks, 10 steps, one save at the end; rank 1's dataset takes 0.4 s more to
    hand over each batch (``--data-sleep 1:0.4``); ``report_to=["tensorboard"]`` logging every step (event files
    under ``ckpt/runs``)."""
    ckpt = root() / "hf_slow_loader" / "ckpt"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "hf_train.py"),
           str(ckpt), "--stage", "2", "--steps", "10", "--save-steps", "10", "--data-sleep", "1:0.4",
           "--report-to", "tensorboard", "--logging-steps", "1"]
    return zeropilot_run("hf_slow_loader", cmd, ["--no-check"])


@once
def accelerate_trainer() -> Job:
    """HF Trainer + DeepSpeed ZeRO-2 under ``accelerate launch`` (its DeepSpeed launcher: torchrun), 2 ranks.

    Not ``--cpu`` and not accelerate's own DeepSpeed plugin loop: with accelerate 1.15, ``--cpu`` and
    ``--use_deepspeed`` are refused together ("You can only use one of `--cpu`, ..., `--use_deepspeed`"),
    ``--cpu --num_processes 2`` starts ONE process (``simple_launcher``: RANK unset, DistributedType.NO),
    and a plain ``Accelerator()`` + DeepSpeed loop on a CPU-only host sees ``num_processes == 1`` on
    every rank, so ``deepspeed.initialize`` fails its batch check ("train_batch_size is not equal to
    micro_batch_per_gpu * gradient_acc_step * world_size 4 != 4 * 1 * 2"). The Trainer's ``use_cpu=True``
    puts accelerate on MULTI_CPU/gloo, which is how a Trainer script runs under ``accelerate launch`` on CPU.
    """
    ckpt = root() / "accelerate_trainer" / "ckpt"
    cmd = ["accelerate", "launch", "--use_deepspeed", "--zero_stage", "2", "--num_processes", "2",
           "--main_process_port", str(free_port()), str(JOBS / "hf_train.py"), str(ckpt), "--stage", "2",
           "--steps", "2", "--save-steps", "2"]
    return zeropilot_run("accelerate_trainer", cmd)


@once
def accelerate_loop() -> Job:
    """accelerate's own loop, no Trainer, no DeepSpeed: steps from ``AcceleratedOptimizer.step``."""
    ckpt = root() / "accelerate_loop" / "ckpt"
    cmd = [sys.executable, str(JOBS / "accel_loop.py"), str(ckpt), "--steps", "3", "--accum", "2"]
    return zeropilot_run("accelerate_loop", cmd)


@once
def hf_trainer_plain() -> Job:
    """A plain HF Trainer (no DeepSpeed) as ``python script.py``: steps come from the guard's TrainerCallback."""
    ckpt = root() / "hf_trainer_plain" / "ckpt"
    cmd = [sys.executable, str(JOBS / "hf_train.py"), str(ckpt), "--stage", "0", "--steps", "3", "--save-steps", "3"]
    return zeropilot_run("hf_trainer_plain", cmd)


@once
def raw_deepspeed() -> Job:
    """(b) The raw DeepSpeed example, ZeRO-3, ``deepspeed`` launcher, 2 ranks, saves at steps 3 and 6; its config is
    the example's with the job's own monitors on: TensorBoard in ``ckpt/../monitor/tb`` and DeepSpeed's CSV monitor
    in ``.../csv`` (one job for the guard's records and for its figures in the job's monitors)."""
    import json

    base = root() / "raw_deepspeed"
    base.mkdir(parents=True, exist_ok=True)
    config = json.loads((EXAMPLE / "ds_config.json").read_text())
    config["tensorboard"] = {"enabled": True, "output_path": str(base / "monitor"), "job_name": "tb"}
    config["csv_monitor"] = {"enabled": True, "output_path": str(base / "monitor"), "job_name": "csv"}
    (base / "ds_config.json").write_text(json.dumps(config))
    cmd = _deepspeed(EXAMPLE / "train.py", "--deepspeed_config", str(base / "ds_config.json"),
                     "--steps", "6", "--save-every", "3", "--save-dir", str(base / "ckpt"))
    # on 2 shared cores under load the ranks' imports alone took 137 s of a 172 s run (the steps: 2 s)
    return zeropilot_run("raw_deepspeed", cmd, timeout=1.5 * JOB_TIMEOUT_S)


def _faults(name: str, fault: str, flags: List[str]) -> Job:
    ckpt = root() / name / "ckpt"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "ds_faults.py"),
           "--fault", fault, "--save-dir", str(ckpt), "--deepspeed_config", str(JOBS / "ds_config.json")]
    return zeropilot_run(name, cmd, ["--no-check", *flags])


@once
def killed_in_save() -> Job:
    """(c) Rank 1 SIGKILLed in the middle of its model-states write at step 2."""
    return _faults("killed_in_save", "kill-in-save", [])


HANG_FLAGS = ["--hang-timeout", "10", "--on-hang", "stop"]


def _stale_lock_job() -> Job:
    """The shm op build is not skipped here: the ranks build it as DeepSpeed does on CPU, and find the lock."""
    env = job_env("hang_stale_lock")
    env.pop(NO_SHM_OP, None)
    lock = Path(env["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    ckpt = root() / "hang_stale_lock" / "ckpt"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "ds_faults.py"),
           "--save-dir", str(ckpt), "--deepspeed_config", str(JOBS / "ds_config.json")]
    return zeropilot_run("hang_stale_lock", cmd, ["--no-check", *HANG_FLAGS], env=env)


@once
def _hangs() -> dict:
    """The hang jobs at once: each spends most of its time waiting for the watchdog."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = {"save_rank0_only": lambda: _faults("hang_save_rank0_only", "save-rank0-only", HANG_FLAGS),
            "sleep_rank1": lambda: _faults("hang_sleep_rank1", "sleep-rank1", HANG_FLAGS),
            "stale_lock": _stale_lock_job,
            "data_stall_rank1": lambda: _faults("hang_data_stall_rank1", "data-stall-rank1", HANG_FLAGS),
            "storage_stall_rank1": lambda: _faults("hang_storage_stall_rank1", "storage-stall-rank1", HANG_FLAGS),
            "mismatch": lambda: _faults("hang_mismatch", "mismatch", HANG_FLAGS)}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(fn) for name, fn in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def hang_save_rank0_only() -> Job:
    """(d) save_checkpoint under ``if rank == 0``: rank 0 waits in the save's barrier, rank 1 trains on."""
    return _hangs()["save_rank0_only"]


def hang_sleep_rank1() -> Job:
    """(d) Rank 1 sleeps while rank 0 waits in a barrier."""
    return _hangs()["sleep_rank1"]


def hang_stale_lock() -> Job:
    """A lock left by a killed op build: every rank waits for it before its first step."""
    return _hangs()["stale_lock"]


@dataclass
class Watched:
    """A job followed live by ``zeropilot top`` (plain output: stdout is a pipe)."""

    job: Job
    top_lines: List[str]  # everything top printed
    live_lines: List[str]  # the lines top printed while ``zeropilot run`` was still running
    top_rc: Optional[int]
    json_lines: List[str]  # what ``zeropilot top --format json`` printed, following the same job at the same time
    json_rc: Optional[int]


def _reader(stream, lines: "queue.Queue") -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def has_mlflow() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


@once
def hf_trainer_watched() -> Watched:
    """HF Trainer + ZeRO-2 under torchrun, 2 ranks, 8 steps, saves at steps 4 and 8 with an evaluation at each, the
    best checkpoint loaded back at the end (``--load-best``), ``report_to=["tensorboard", "mlflow"]`` (MLflow where
    installed) logging every step (event files under ``ckpt/runs``, MLflow's file store in ``mlruns`` beside
    ``ckpt``), followed live by ``zeropilot top --interval 0.2`` and, at the same time, by ``zeropilot top --format
    json``."""
    import queue
    import threading
    import time

    name = "hf_trainer_watched"
    base = root() / name
    base.mkdir(parents=True, exist_ok=True)
    run_dir, ckpt = base / "run", base / "ckpt"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "hf_train.py"),
           str(ckpt), "--stage", "2", "--steps", "8", "--save-steps", "4", "--load-best", "--report-to",
           "tensorboard,mlflow" if has_mlflow() else "tensorboard", "--logging-steps", "1"]
    argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(run_dir), "--", *cmd]
    env = job_env(name)
    # MLflow offline: its file store in the job's folder (mlflow >= 3 asks for the opt-in)
    env.update(MLFLOW_TRACKING_URI=(base / "mlruns").as_uri(), MLFLOW_ALLOW_FILE_STORE="true",
               MLFLOW_EXPERIMENT_NAME="zeropilot-watched")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    with open(base / "stdout.txt", "w") as out, open(base / "stderr.txt", "w") as err:
        job = subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=out, stderr=err, start_new_session=True)
        top = top_json = None
        try:
            while not run_dir.is_dir() and job.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            top = subprocess.Popen([sys.executable, "-m", "zeropilot", "top", str(run_dir), "--interval", "0.2"],
                                   cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
            with open(base / "top.jsonl", "w") as json_out:
                top_json = subprocess.Popen(
                    [sys.executable, "-m", "zeropilot", "top", str(run_dir), "--interval", "0.2", "--format", "json"],
                    cwd=str(REPO), env=env, stdout=json_out, stderr=subprocess.STDOUT, start_new_session=True)
            lines: "queue.Queue" = queue.Queue()
            threading.Thread(target=_reader, args=(top.stdout, lines), daemon=True).start()
            seen, live = [], []
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    continue
                if line is None:
                    break
                seen.append(line)
                if job.poll() is None:
                    live.append(line)
            top_rc = top.wait(timeout=max(deadline - time.monotonic(), 1))
            job.wait(timeout=max(deadline - time.monotonic(), 1))
            json_rc = top_json.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            for proc in (top, top_json, job):
                if proc is not None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    proc.wait()
    result = Job(run_dir, job.returncode, (base / "stdout.txt").read_text(), (base / "stderr.txt").read_text(), ckpt,
                 argv)
    return Watched(result, seen, live, top_rc, (base / "top.jsonl").read_text().splitlines(), json_rc)


def hang_data_stall_rank1() -> Job:
    """Rank 1's dataset never returns its third batch; rank 0 waits in ZeRO-3's all-gather."""
    return _hangs()["data_stall_rank1"]


def hang_storage_stall_rank1() -> Job:
    """The save at step 2: rank 1's model-states file never takes the bytes (a FIFO); rank 0 waits for it."""
    return _hangs()["storage_stall_rank1"]


def hang_mismatch() -> Job:
    """Rank 0 calls an all_reduce the other rank never calls; rank 1 goes on to the next all-gather."""
    return _hangs()["mismatch"]


BUILD_FLAGS = ["--no-check", "--hang-timeout", "3", "--on-hang", "stop"]


@once
def op_build_stopped_then_next() -> tuple:
    """A real JIT op build (``jobs/build_op.py``, 2 ranks) stopped by SIGTERM to ``zeropilot run`` while it
    holds its lock, then the next launch on the same ``TORCH_EXTENSIONS_DIR``, whose build outlasts its 3 s hang
    timeout. Returns (stopped Job, next Job, the stopped build's compilers still running once its ``zeropilot run``
    ended)."""
    import time

    env = job_env("op_build")
    base = root() / "op_build_stopped"
    base.mkdir(parents=True, exist_ok=True)
    run_dir = base / "run"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "build_op.py")]
    argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(run_dir), *BUILD_FLAGS, "--", *cmd]
    proc = subprocess.Popen(argv, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + JOB_TIMEOUT_S
        locks = run_dir / "build-locks.jsonl"
        while time.time() < deadline and proc.poll() is None:
            if locks.exists() and "acquired" in locks.read_text():
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # as `timeout`, a scheduler or a user's kill would
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    stopped = Job(run_dir, proc.returncode, out, err, base / "ckpt", argv)
    from zeropilot.runner.procs import COMPILERS, cwd, scan

    ext = os.path.realpath(env["TORCH_EXTENSIONS_DIR"])
    left = [f"{p.comm} (pid {p.pid})" for p in scan() if p.comm in COMPILERS
            and (cwd(p.pid) or "").startswith(ext + os.sep)]  # compilers of the stopped build still running
    cmd[4] = str(free_port())
    # three times the default constexpr loop: the build must outlast the 3 s hang timeout on an idle machine too, and
    # its other flags make ninja compile again whatever the stopped build had finished
    nxt = zeropilot_run("op_build_next", [*cmd, "3000000"], BUILD_FLAGS, env=env)
    return stopped, nxt, left


TIMEOUT_FLAGS = ["--no-check", "--hang-timeout", "8", "--on-hang", "stop"]


def _timeouts_run(name: str, extra: List[str], flags: List[str]) -> Job:
    """ds_faults.py with rank 0 loading a batch in 0.5 s and rank 1 in 1.1 s (the straggler), a save at step 7 that
    rank 0 takes 16 s more to write (twice --hang-timeout 8: the watchdog's stop comes before it ends), DeepSpeed's
    CSV monitor on (the trackers)."""
    import json

    base = root() / name
    base.mkdir(parents=True, exist_ok=True)
    config = json.loads((JOBS / "ds_config.json").read_text())
    config["csv_monitor"] = {"enabled": True, "output_path": str(base / "monitor"), "job_name": "csv"}
    (base / "ds_config.json").write_text(json.dumps(config))
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), str(JOBS / "ds_faults.py"),
           "--save-dir", str(base / "ckpt"), "--deepspeed_config", str(base / "ds_config.json"),
           "--data-sleep", "0:0.5,1:1.1", "--save-every", "7", "--slow-save", "16", *extra]
    return zeropilot_run(name, cmd, flags)


@once
def learned_timeouts() -> tuple:
    """(first, second): the first run's save outlasts its fixed 8 s deadline and is stopped; the second, pointed at
    the first (``--timeouts-from``), lets the same save finish, then stops rank 1's hung step 9 at the step deadline
    learned from the first run's steps (5 x their median, under the fixed 8 s)."""
    first = _timeouts_run("timeouts_first", ["--steps", "8"], TIMEOUT_FLAGS)
    second = _timeouts_run("timeouts_second", ["--steps", "12", "--stall-at", "9"],
                           [*TIMEOUT_FLAGS, "--timeouts-from", str(first.run_dir)])
    return first, second
