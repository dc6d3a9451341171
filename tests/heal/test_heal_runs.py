"""``zeropilot run --heal`` on real ranks (CPU, gloo): faults injected into unmodified scripts, healed runs compared
bit for bit with the same run that never failed: a killed rank then an OOM (HF Trainer, ZeRO-2), a hung rank (a raw
ZeRO-3 loop), a loop that never resumes. Preemption: ``test_heal_preempt.py``.

Each scenario is one module-scoped job (a reference run and the heal run), shared by its assertions; the full matrix
(every launch x every fault) is the bench instrument ``bench/heal/matrix.py``. The faults fire once (a marker file),
as a transient fault meets a restart.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests import runjobs
from tests.heal.runs import HEAL, JOBS, Z2, bitwise_equal, events, heal_record, losses
from tests.report.conftest import validate  # noqa: F401 - the report schema's validator, a fixture

pytestmark = [pytest.mark.slow]


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
    heal = heal_record(job)
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
    want, got = losses(base / "ref" / "checkpoint-6"), losses(base / "healed" / "checkpoint-6")
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
    resumes = events(job.run_dir / "attempt-2", "resume")
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
    heal = heal_record(job)
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
    heal = heal_record(job)
    assert heal["outcome"]["status"] == "restarted_from_scratch" and job.returncode == 0
    assert heal["attempts"][1]["resume"]["chosen"]["step"] == 2
    assert heal["attempts"][1]["resumed"]["really"] is False
    assert "did NOT resume: the script never called load_checkpoint" in heal["outcome"]["why"]
    assert "heal: RESTARTED FROM SCRATCH: finished, but attempt 2 did NOT resume" in job.stdout
