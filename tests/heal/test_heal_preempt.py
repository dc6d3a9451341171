"""``zeropilot run --heal`` and preemption on real ranks (CPU, gloo): an HF Trainer ZeRO-3 job sent SIGTERM saves at
one step on every rank and stops, the next ``--heal`` resumes from that save exactly, then an OOM whose only fix
cuts the data stops, and heals when allowed; a plain Trainer preempted without ``--heal``. The other faults:
``test_heal_runs.py``.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests import runjobs
from tests.heal.runs import HEAL, JOBS, Z2, bitwise_equal, events, heal_record

pytestmark = [pytest.mark.slow]


# -- HF Trainer, ZeRO-3: preempted (SIGTERM), resumed by the next `--heal`; then an OOM whose only fix cuts the data --

def _sigterm_at(run_dir, flags: list, command: list, env: dict, at_step: int):
    """``zeropilot run FLAGS -- COMMAND`` sent SIGTERM once rank 0 recorded optimizer step ``at_step``: (exit status,
    stdout, stderr, argv)."""
    import subprocess

    argv = [sys.executable, "-m", "zeropilot", "run", "--out", str(run_dir), *flags, "--", *command]
    proc = subprocess.Popen(argv, cwd=str(runjobs.REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + runjobs.JOB_TIMEOUT_S
        while time.time() < deadline and proc.poll() is None:
            steps = [r for r in events(run_dir, "step") if r["rank"] == 0] if run_dir.is_dir() else []
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
    return proc.returncode, out, err, argv


def _preempted_run(name: str, command: list, env: dict, at_step: int) -> runjobs.Job:
    """``zeropilot run --heal`` sent SIGTERM once rank 0 recorded optimizer step ``at_step``."""
    base = runjobs.root() / name
    base.mkdir(parents=True, exist_ok=True)
    rc, out, err, argv = _sigterm_at(base / "run", ["--no-check", *HEAL], command, env, at_step)
    return runjobs.Job(base / "run", rc, out, err, base / "ckpt", argv)


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
    preempted.heal = heal_record(preempted)
    stopped = runjobs.zeropilot_run("heal_hf_z3", cmd, ["--no-check", *HEAL], env=env)  # the requeued job
    stopped.heal = heal_record(stopped)
    allowed = runjobs.zeropilot_run("heal_hf_z3", cmd, ["--no-check", *HEAL, "--heal-allow", "seq_len"], env=env)
    allowed.heal = heal_record(allowed)
    return ref, preempted, stopped, allowed, base


def test_hf_zero3_preemption_saves_at_one_step_on_every_rank_and_stops(hf_z3):
    ref, job, _, _, base = hf_z3
    assert ref.returncode == 0 and job.returncode == 128 + signal.SIGTERM, job.stderr[-3000:]
    run = json.loads((job.run_dir / "run.json").read_text())
    pre = run["preempted"]
    assert pre["signal"] == "SIGTERM" and pre["why"] is None and pre["saved_step"] == pre["stop_step"] >= 3
    took = events(job.run_dir, "preempt")
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
    env = runjobs.job_env("preempt_plain")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(JOBS / "hf_train.py"), str(tmp_path / "out"), "--stage", "0", "--steps", "12",
           "--save-steps", "100", "--step-sleep", "1.0"]
    rc, _, err, _ = _sigterm_at(run_dir, ["--no-check"], cmd, env, at_step=2)
    pre = json.loads((run_dir / "run.json").read_text())["preempted"]
    assert rc == 128 + signal.SIGTERM and pre["saved_step"] == pre["stop_step"] < 12, err[-2000:]
    assert (tmp_path / "out" / f"checkpoint-{pre['stop_step']}" / "trainer_state.json").is_file()
    assert f"every rank saved at step {pre['stop_step']}; resume with `zeropilot run --heal --out {run_dir}" in err
