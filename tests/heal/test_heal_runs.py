"""``zeropilot run --heal`` on real ranks (CPU, gloo): faults injected into unmodified scripts, healed runs compared
bit for bit with the same run that never failed.

Each scenario is one module-scoped job (a reference run and the heal run), shared by its assertions; the full matrix
(every launch x every fault) is the bench instrument ``bench/heal/matrix.py``. The faults fire once (a marker file),
as a transient fault meets a restart.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests import runjobs
from tests.report.conftest import validate  # noqa: F401 - the report schema's validator, a fixture

pytestmark = [pytest.mark.slow]
JOBS = runjobs.JOBS
Z2 = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
      "gradient_clipping": "auto", "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
HEAL = ["--heal", "--heal-backoff", "0.2"]


def _tensors(folder: Path) -> dict:
    """Every tensor of a DeepSpeed tag folder's files, by file and key path."""
    import torch

    out = {}

    def walk(obj, key):
        if isinstance(obj, torch.Tensor):
            out[key] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{key}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{key}[{i}]")

    for f in sorted(folder.glob("*.pt")):
        walk(torch.load(f, map_location="cpu", weights_only=False), f.name)
    return out


def bitwise_equal(a: Path, b: Path) -> int:
    """The number of tensors compared; fails on the first that differs in shape, dtype or any bit."""
    import torch

    ta, tb = _tensors(a), _tensors(b)
    assert ta and sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k
    return len(ta)


def _heal(job) -> dict:
    return json.loads((job.run_dir / "heal.json").read_text())


def _events(folder: Path, kind: str) -> list:
    out = []
    for f in sorted(folder.glob("rank-*.jsonl")):
        out += [r for r in map(json.loads, f.read_text().splitlines()) if r.get("event") == kind]
    return out


def _losses(ckpt: Path) -> dict:
    state = json.loads((ckpt / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


# -- HF Trainer, ZeRO-2: a rank killed, then an injected OOM healed by a math-neutral fix ------------------------

@pytest.fixture(scope="module")
def hf_z2(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_z2")
    (base / "z2.json").write_text(json.dumps(Z2))

    def command(out, *extra):
        return ["torchrun", "--nproc_per_node", "2", "--master_port", str(runjobs.free_port()),
                str(JOBS / "hf_train.py"), str(out), "--stage", "2", "--steps", "6", "--save-steps", "2",
                "--logging-steps", "1",
                "--deepspeed", str(base / "z2.json"), "--per_device_train_batch_size", "4",
                "--gradient_accumulation_steps", "1", *extra]

    ref = runjobs.zeropilot_run("heal_hf_z2_ref", command(base / "ref"), ["--no-check"])
    env = runjobs.job_env("heal_hf_z2")
    env["ZEROPILOT_INJECT_OOM"] = "64@5"  # micro batch 4 x 16 tokens from step 5 on: micro batch 2 passes
    healed = runjobs.zeropilot_run("heal_hf_z2", command(base / "healed", "--fault", "kill-rank1", "--fault-step", "3",
                                                         "--fault-once", str(base / "killed"), "--report-to",
                                                         "tensorboard"), HEAL, env=env)
    return ref, healed, base


def test_hf_zero2_killed_rank_then_oom_heal_in_three_attempts(hf_z2):
    ref, job, base = hf_z2
    assert ref.returncode == 0 and job.returncode == 0, job.stderr[-3000:]
    heal = _heal(job)
    assert heal["outcome"]["status"] == "healed" and len(heal["attempts"]) == 3
    first, second, third = heal["attempts"]
    assert (first["failure"]["kind"], first["failure"]["class"], first["failure"]["step"]) == ("crash", "killed", 3)
    assert second["resume"]["chosen"]["tag"] == "checkpoint-2" and second["steps_redone"] == 1
    assert second["resumed"]["really"] is True and second["resumed"]["given_by"] == "zeropilot"
    assert (second["failure"]["kind"], second["failure"]["step"]) == ("oom", 4)
    assert third["fix"]["key"] == "micro_batch" and third["fix"]["allowed_by"] == [] and third["fix"]["neutral"]
    flags = third["command"][third["command"].index("--per_device_train_batch_size"):][:4]
    assert flags == ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2"]
    assert "+torchrun" in third["fix"]["diff"] and third["resume"]["chosen"]["step"] == 4
    assert first["command"] == heal["command"] and third["resumed"]["loaded_step"] == 4


def test_hf_zero2_resume_after_the_kill_is_exact(hf_z2):
    ref, job, base = hf_z2
    # the checkpoint the second attempt wrote at step 4, after resuming from step 2: the same bits as the run
    # that never failed
    assert bitwise_equal(base / "ref" / "checkpoint-4" / "global_step4",
                         base / "healed" / "checkpoint-4" / "global_step4") > 10
    # after the fix (micro batch 2 x 2 instead of 4 x 1: the same samples per step), the loss of the same step
    # agrees with the reference's to float32 rounding
    want, got = _losses(base / "ref" / "checkpoint-6"), _losses(base / "healed" / "checkpoint-6")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert all(abs(got[s] - want[s]) <= 1e-5 * abs(want[s]) for s in (5, 6)), (got, want)


def test_hf_zero2_report_shows_the_attempts(hf_z2, validate):
    _, job, _ = hf_z2
    out = job.stdout
    assert "\nheal: HEALED: finished in attempt 3 after 2 restart(s)\n" in out
    assert "attempt 1 (.): CRASH (killed) after step 3" in out and "resumed from " in out
    assert "fix applied: micro batch 2, gradient accumulation 2" in out
    report = runjobs.subprocess.run([sys.executable, "-m", "zeropilot", "report", str(job.run_dir), "--format",
                                     "json"], capture_output=True, text=True, timeout=120)
    doc = json.loads(report.stdout)
    assert validate(doc) == []
    heal = doc["heal"]
    assert heal["status"] == "healed" and [a["attempt"] for a in heal["attempts"]] == [1, 2, 3]
    # the trackers (report_to) got the attempt and the steps it redid with every logged step
    assert "'zeropilot/heal_attempt': '3'" in out and "'zeropilot/heal_attempt': '2'" in out
    assert "'zeropilot/steps_redone': '1'" in out
    resumes = _events(job.run_dir / "attempt-2", "resume")
    assert {r["given_by"] for r in resumes} == {"zeropilot"} and len(resumes) == 2


# -- a raw DeepSpeed ZeRO-3 loop that loads its own `latest`: a hung rank, stopped and healed --------------------

@pytest.fixture(scope="module")
def raw_hang(tmp_path_factory):
    base = tmp_path_factory.mktemp("raw_hang")

    def command(save, *extra):
        return ["deepspeed", "--num_gpus", "2", "--master_port", str(runjobs.free_port()), str(JOBS / "ds_resume.py"),
                "--save-dir", str(save), "--deepspeed_config", str(JOBS / "ds_config.json"), "--steps", "6",
                "--save-every", "2", *extra]

    ref = runjobs.zeropilot_run("heal_raw_ref", command(base / "ref"), ["--no-check"])
    healed = runjobs.zeropilot_run("heal_raw_hang", command(base / "healed", "--fault", "hang", "--fault-step", "3",
                                                            "--fault-once", str(base / "hung")),
                                   HEAL + ["--hang-timeout", "8"])
    return ref, healed, base


def test_raw_zero3_hang_is_stopped_and_the_loop_resumes_from_its_latest(raw_hang):
    ref, job, base = raw_hang
    assert ref.returncode == 0 and job.returncode == 0, job.stderr[-3000:]
    heal = _heal(job)
    first, second = heal["attempts"]
    assert first["failure"]["kind"] == "hang" and first["failure"]["restart"] is True
    assert json.loads((job.run_dir / "run.json").read_text())["stopped_on_hang"] is True
    assert second["resume"]["chosen"]["tag"] == "global_step2" and "own load_checkpoint" in second["resume"]["how"]
    assert second["resumed"] == {"wanted_step": 2, "loaded_step": 2, "first_step": 3, "given_by": None,
                                 "really": True, "note": "resumed at step 2 (the launch's own load_checkpoint)"}
    assert second["steps_redone"] == 1 and heal["outcome"]["status"] == "healed"
    assert bitwise_equal(base / "ref" / "global_step6", base / "healed" / "global_step6") > 10


# -- a raw loop that never loads a checkpoint: restarted, and reported as not resumed -----------------------------

def test_a_raw_loop_that_does_not_resume_is_reported_not_healed_silently(tmp_path):
    env = runjobs.job_env("heal_raw_cold")
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(runjobs.free_port()))
    cmd = [sys.executable, str(JOBS / "ds_resume.py"), "--save-dir", str(tmp_path / "ckpt"), "--deepspeed_config",
           str(JOBS / "ds_config.json"), "--steps", "4", "--save-every", "2", "--no-resume", "--fault", "kill",
           "--fault-rank", "0", "--fault-step", "3", "--fault-once", str(tmp_path / "killed")]
    job = runjobs.zeropilot_run("heal_raw_cold", cmd, ["--no-check", *HEAL], env=env)
    heal = _heal(job)
    assert heal["outcome"]["status"] == "restarted_from_scratch" and job.returncode == 0
    assert heal["attempts"][1]["resume"]["chosen"]["step"] == 2
    assert heal["attempts"][1]["resumed"]["really"] is False
    assert "did NOT resume: the script never called load_checkpoint" in heal["outcome"]["why"]
    assert "heal: RESTARTED FROM SCRATCH: finished, but attempt 2 did NOT resume" in job.stdout


# -- HF Trainer, ZeRO-3: preempted (SIGTERM), resumed by the next `--heal`; then an OOM whose only fix cuts the data --

def _preempted_run(name: str, command: list, env: dict, at_step: int) -> runjobs.Job:
    """``zeropilot run --heal`` sent SIGTERM once rank 0 recorded optimizer step ``at_step``."""
    import subprocess

    base = runjobs.root() / name
    base.mkdir(parents=True, exist_ok=True)
    run_dir = base / "run"
    argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(run_dir), "--no-check", *HEAL, "--", *command]
    proc = subprocess.Popen(argv, cwd=str(runjobs.REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + runjobs.JOB_TIMEOUT_S
        while time.time() < deadline and proc.poll() is None:
            steps = [r for r in _events(run_dir, "step") if r["rank"] == 0] if run_dir.is_dir() else []
            if any(r["step"] >= at_step for r in steps):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=runjobs.JOB_TIMEOUT_S)
    finally:
        try:
            runjobs.os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return runjobs.Job(run_dir, proc.returncode, out, err, base / "ckpt", argv)


@pytest.fixture(scope="module")
def hf_z3(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_z3")
    (base / "z3.json").write_text(json.dumps(dict(Z2, zero_optimization={"stage": 3})))

    def command(out, *extra):
        return ["torchrun", "--nproc_per_node", "2", "--master_port", str(runjobs.free_port()),
                str(JOBS / "hf_train.py"), str(out), "--stage", "3", "--steps", "8", "--save-steps", "2",
                "--logging-steps", "1",
                "--deepspeed", str(base / "z3.json"), "--per_device_train_batch_size", "1", "--seq", "256",
                "--max_length", "256", *extra]

    ref = runjobs.zeropilot_run("heal_hf_z3_ref", command(base / "ref"), ["--no-check"])
    env = runjobs.job_env("heal_hf_z3")
    env["ZEROPILOT_INJECT_OOM"] = "256@7"  # from step 7 on, a micro batch of 256 tokens does not fit: only a cap does
    cmd = command(base / "healed", "--step-sleep", "1.0")
    preempted = _preempted_run("heal_hf_z3", cmd, env, at_step=2)
    preempted.heal = _heal(preempted)
    stopped = runjobs.zeropilot_run("heal_hf_z3", cmd, ["--no-check", *HEAL], env=env)  # the requeued job
    stopped.heal = _heal(stopped)
    allowed = runjobs.zeropilot_run("heal_hf_z3", cmd, ["--no-check", *HEAL, "--heal-allow", "seq_len"], env=env)
    allowed.heal = _heal(allowed)
    return ref, preempted, stopped, allowed, base


def test_hf_zero3_preemption_saves_at_one_step_on_every_rank_and_stops(hf_z3):
    ref, job, _, _, base = hf_z3
    assert ref.returncode == 0 and job.returncode == 128 + signal.SIGTERM, job.stderr[-3000:]
    run = json.loads((job.run_dir / "run.json").read_text())
    pre = run["preempted"]
    assert pre["signal"] == "SIGTERM" and pre["why"] is None and pre["saved_step"] == pre["stop_step"] >= 3
    took = _events(job.run_dir, "preempt")
    assert sorted(r["rank"] for r in took) == [0, 1] and {r["step"] for r in took} == {pre["stop_step"]}
    assert not any(r["late"] for r in took)
    assert (base / "healed" / f"checkpoint-{pre['stop_step']}" / "trainer_state.json").is_file()
    assert f"every rank saves at the end of step {pre['stop_step']} and stops" in job.stderr
    assert job.heal["attempts"][0]["failure"]["kind"] == "preempted" and job.heal["outcome"]["status"] == "preempted"


def test_hf_zero3_the_next_heal_resumes_from_the_preemption_save_exactly(hf_z3):
    ref, job, stopped, _, base = hf_z3
    second = stopped.heal["attempts"][1]
    saved = json.loads((job.run_dir / "run.json").read_text())["preempted"]["saved_step"]
    assert second["resume"]["chosen"]["step"] == saved and second["resumed"]["really"] is True
    assert bitwise_equal(base / "ref" / "checkpoint-6" / "global_step6",
                         base / "healed" / "checkpoint-6" / "global_step6") > 10


def test_an_oom_whose_only_fix_cuts_the_data_stops_then_heals_when_allowed(hf_z3):
    _, _, stopped, allowed, base = hf_z3
    assert stopped.returncode != 0
    heal = stopped.heal
    assert heal["outcome"]["status"] == "stopped" and heal["attempts"][1]["failure"]["kind"] == "oom"
    why = heal["outcome"]["why"]
    assert "the first ranked fix, 'cap sequences at 128 tokens', is not applied" in why
    assert "--heal-allow seq_len" in why and "INJECTED" in stopped.stdout
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    heal = allowed.heal
    third = heal["attempts"][2]
    assert heal["outcome"]["status"] == "healed" and third["fix"]["key"] == "seq_len"
    assert third["fix"]["allowed_by"] == ["seq_len"] and third["fix"]["settings"] == ["max_length: 256 -> 128 (flag)"]
    assert third["resume"]["chosen"]["step"] == 6 and third["steps_redone"] == 0
    assert (base / "healed" / "checkpoint-8" / "trainer_state.json").is_file()


def test_without_heal_a_preempted_trainer_saves_stops_and_says_how_to_resume(tmp_path):
    """A plain Trainer (no DeepSpeed, one process) under ``zeropilot run``: SIGTERM at step 2."""
    import subprocess

    env = runjobs.job_env("preempt_plain")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(JOBS / "hf_train.py"), str(tmp_path / "out"), "--stage", "0", "--steps", "12",
           "--save-steps", "100", "--step-sleep", "1.0"]
    argv = [sys.executable, "-m", "zeropilot", "run", "--no-check", "--out", str(run_dir), "--", *cmd]
    proc = subprocess.Popen(argv, cwd=str(runjobs.REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + runjobs.JOB_TIMEOUT_S
        while time.time() < deadline and proc.poll() is None and not any(
                r["step"] >= 2 for r in (_events(run_dir, "step") if run_dir.is_dir() else [])):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=runjobs.JOB_TIMEOUT_S)
    finally:
        try:
            runjobs.os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    pre = json.loads((run_dir / "run.json").read_text())["preempted"]
    assert proc.returncode == 128 + signal.SIGTERM and pre["saved_step"] == pre["stop_step"] < 12, err[-2000:]
    assert (tmp_path / "out" / f"checkpoint-{pre['stop_step']}" / "trainer_state.json").is_file()
    assert f"every rank saved at step {pre['stop_step']}; resume with `zeropilot run --heal --out {run_dir}" in err
