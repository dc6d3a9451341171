"""Real jobs under ``zeropilot run`` (CPU, gloo, 2 ranks): every rank recorded, saves with phases, exit passed.

The jobs themselves are in ``tests/runjobs.py`` (shared with the report and repro tests).
"""

from __future__ import annotations

import json

import pytest

from tests import runjobs
from zeropilot.cli import main
from zeropilot.runlog import read_run, summarize

pytestmark = [pytest.mark.slow]


def _summary(job):
    return summarize(read_run(job.run_dir))


def _events(job, rank, kind):
    path = job.run_dir / f"rank-{rank}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == kind]


@pytest.mark.parametrize("make", [runjobs.hf_trainer, runjobs.raw_deepspeed], ids=["hf_trainer", "raw_deepspeed"])
def test_every_rank_records_steps_and_saves(make):
    job = make()
    assert job.returncode == 0, job.stderr[-3000:]
    s = _summary(job)
    assert s["verdict"]["kind"] == "ok"
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    steps = 8 if make is runjobs.hf_trainer else 6
    assert all(r["steps"] == steps and r["ended"] for r in s["ranks"])
    for rank in (0, 1):
        assert [e["step"] for e in _events(job, rank, "step")] == list(range(1, steps + 1))
        assert _events(job, rank, "init")[0]["zero_stage"] == (2 if make is runjobs.hf_trainer else 3)
    saved_at = [4, 8] if make is runjobs.hf_trainer else [3, 6]
    assert sorted((x["step"], x["rank"]) for x in s["saves"]) == [(st, r) for st in saved_at for r in (0, 1)]
    for save in s["saves"]:
        names = {p["name"] for p in save["phases"]}
        assert {"model_states", "optimizer_states", "write"} <= names
        assert save["bytes"] > 0 and save["seconds"] > 0
    # the summary is printed at the end, with the run directory
    assert "verdict: OK" in job.stdout and str(job.run_dir) in job.stdout


def test_checkpoint_bytes_are_the_files_each_rank_wrote():
    job = runjobs.raw_deepspeed()
    tag = job.ckpt_dir / "global_step6"
    on_disk = {r: sum(p.stat().st_size for p in tag.glob(f"*zero_pp_rank_{r}_*")) for r in (0, 1)}
    saves = {x["rank"]: x["bytes"] for x in _summary(job)["saves"] if x["step"] == 6}
    assert saves == on_disk


def test_run_json_has_command_versions_check_and_exit():
    job = runjobs.raw_deepspeed()
    run = json.loads((job.run_dir / "run.json").read_text())
    assert run["command"][0] == "deepspeed" and run["exit_code"] == 0 and run["signal"] is None
    assert {"torch", "deepspeed", "python"} <= set(run["versions"])
    assert run["check"]["errors"] == 0
    assert run["world_size"] == 2
    assert run["environment"]["DS_ACCELERATOR"] == "cpu"


def test_bootstrap_chain_loads_the_sitecustomize_it_shadows():
    # the jobs' own sitecustomize skips DeepSpeed's CPU shm op build: nothing was compiled
    job = runjobs.raw_deepspeed()
    assert not (job.run_dir.parent / "torch_extensions" / "deepspeed_shm_comm").exists()
    start = _events(job, 0, "start")[0]
    assert start["pid"] != _events(job, 1, "start")[0]["pid"]


def test_plain_trainer_is_watched_through_its_callback():
    job = runjobs.hf_trainer_plain()
    assert job.returncode == 0, job.stderr[-3000:]
    start = _events(job, 0, "start")[0]
    assert start["framework"] == "hf"
    assert [e["step"] for e in _events(job, 0, "step")] == [1, 2, 3]
    assert not _events(job, 0, "init")  # no DeepSpeed engine
    (save,) = _events(job, 0, "save")
    assert save["step"] == 3 and save["tag"] == "checkpoint-3" and save["bytes"] > 0
    assert {p["name"] for p in save["phases"]} == {"write"}
    assert _summary(job)["verdict"]["kind"] == "ok"


def test_load_checkpoint_is_recorded_on_every_rank(capsys):
    # load_best_model_at_end: the Trainer loads its best checkpoint back through DeepSpeedEngine.load_checkpoint
    job = runjobs.hf_trainer()
    assert job.returncode == 0, job.stderr[-3000:]
    best = json.loads((job.ckpt_dir / "checkpoint-8" / "trainer_state.json").read_text())["best_model_checkpoint"]
    step = int(best.rsplit("-", 1)[1])
    tag = f"global_step{step}"
    model_states = (job.ckpt_dir / f"checkpoint-{step}" / tag / "mp_rank_00_model_states.pt").stat().st_size
    for rank in (0, 1):
        (load,) = _events(job, rank, "load")
        assert (load["step"], load["tag"], load["path"]) == (step, tag, best)
        assert load["seconds"] > 0 and "error" not in load
        names = [p["name"] for p in load["phases"]]
        assert {"model_states", "optimizer_states", "read"} <= set(names)
        own = (job.ckpt_dir / f"checkpoint-{step}" / tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        assert load["files"] >= 2 and load["bytes"] >= model_states + own.stat().st_size
        assert load["mem_before"]["host_rss_bytes"] > 0 and load["mem_after"]["host_rss_bytes"] > 0
        # the load is the last checkpoint operation: after the save at step 8
        assert load["t"] > max(s["t"] for s in _events(job, rank, "save"))
    assert main(["report", str(job.run_dir), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted((x["rank"], x["step"], x["tag"], x["path"]) for x in rep["loads"]) == [
        (r, step, tag, best) for r in (0, 1)]
    assert all(x["seconds"] > 0 and x["bytes"] > 0 and x["phases"] and x["error"] is None for x in rep["loads"])
    assert f"load at step {step} (2 ranks)" in job.stdout


def test_accelerate_launch_is_watched_on_every_rank():
    job = runjobs.accelerate_trainer()
    assert job.returncode == 0, job.stderr[-3000:]
    run = json.loads((job.run_dir / "run.json").read_text())
    assert run["command"][:2] == ["accelerate", "launch"] and run["exit_code"] == 0 and run["signal"] is None
    assert run["world_size"] == 2
    s = _summary(job)
    assert s["verdict"]["kind"] == "ok" and [r["rank"] for r in s["ranks"]] == [0, 1]
    assert all(r["steps"] == 2 and r["ended"] for r in s["ranks"])
    for rank in (0, 1):
        assert [e["step"] for e in _events(job, rank, "step")] == [1, 2]
        assert _events(job, rank, "init")[0]["zero_stage"] == 2
        (save,) = _events(job, rank, "save")
        assert save["step"] == 2 and save["tag"] == "checkpoint-2" and save["bytes"] > 0 and "error" not in save
        assert {"model_states", "optimizer_states", "write"} <= {p["name"] for p in save["phases"]}
    tag = job.ckpt_dir / "checkpoint-2" / "global_step2"
    assert sorted(p.name for p in tag.glob("zero_pp_rank_*")) == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert "verdict: OK" in job.stdout and str(job.run_dir) in job.stdout


def test_plain_accelerate_loop_steps_saves_and_loads():
    job = runjobs.accelerate_loop()
    assert job.returncode == 0, job.stderr[-3000:]
    # 6 micro-batches, 2 accumulated per optimizer step: accelerate stepped 3 times
    assert [e["step"] for e in _events(job, 0, "step")] == [1, 2, 3]
    assert not _events(job, 0, "init")  # no DeepSpeed engine
    (save,) = _events(job, 0, "save")
    (load,) = _events(job, 0, "load")
    on_disk = sorted(job.ckpt_dir.iterdir())
    assert (save["step"], save["tag"], save["path"]) == (3, "ckpt", str(job.ckpt_dir))
    assert save["files"] == len(on_disk) and save["bytes"] == sum(p.stat().st_size for p in on_disk) > 0
    assert (load["step"], load["tag"], load["path"]) == (3, "ckpt", str(job.ckpt_dir))
    assert [p["name"] for p in load["phases"]] == ["read"] and load["seconds"] > 0 and "error" not in load
    assert _summary(job)["verdict"]["kind"] == "ok"
