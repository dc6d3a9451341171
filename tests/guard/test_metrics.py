"""The guard's figures in the job's own trackers (``zeropilot.guard.metrics``).

Real jobs, real writers, read back with the trackers' own readers (TensorBoard's event reader, MLflow's client):
- HF Trainer + ZeRO-2, 2 ranks under ``zeropilot run``, ``report_to=["tensorboard", "mlflow"]`` (MLflow's file
  store, offline), logging every step (the job ``zeropilot top`` follows in tests/cli/test_top.py: one live job);
- the raw DeepSpeed example, 2 ranks, 6 steps, with the job's ``monitor_config`` on: TensorBoard and DeepSpeed's CSV
  monitor (the job tests/guard/test_jobs.py reads the guard's records of).
Then the folding itself on run directories written here: max over ranks, every rank, off, a custom prefix.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

import pytest

from tests.runjobs import hf_trainer_watched, raw_deepspeed
from zeropilot.guard import metrics

GIB = float(1 << 30)


def _scalars(log_dir: Path) -> dict:
    """``{tag: {step: value}}`` of every event file under ``log_dir``, as TensorBoard reads them."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(log_dir.rglob("events.out.tfevents.*"))
    assert files, f"no event files under {log_dir}"
    out: dict = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def _records(run_dir: Path, rank: int) -> list:
    return [json.loads(ln) for ln in (run_dir / f"rank-{rank}.jsonl").read_text().splitlines() if ln.strip()]


@pytest.mark.slow
def test_trainer_report_to_tensorboard_holds_the_figures_of_every_step():
    job = hf_trainer_watched().job
    assert job.returncode == 0, job.stderr[-3000:]
    tb = _scalars(job.ckpt_dir / "runs")
    ours = {tag for tag in tb if "zeropilot/" in tag}
    # HF's TensorBoardCallback names training keys train/KEY (rewrite_logs): train/zeropilot/...
    assert all(tag.startswith("train/zeropilot/") for tag in ours), ours
    steps = list(range(1, 9))
    for name in ("host_rss_gib", "ranks_reporting"):
        assert sorted(tb[f"train/zeropilot/{name}"]) == steps, (name, tb.get(f"train/zeropilot/{name}"))
    # the first step has no step time (nothing ended before it); every later one has
    assert sorted(tb["train/zeropilot/step_seconds"]) == steps[1:]
    assert all(v > 0 for v in tb["train/zeropilot/step_seconds"].values())
    assert max(tb["train/zeropilot/ranks_reporting"].values()) == 2  # rank 1's records reached rank 0's logs
    # the max over ranks: never below what rank 0 itself recorded for that step
    own = {r["step"]: r["mem"]["host_rss_bytes"] / GIB for r in _records(job.run_dir, 0) if r["event"] == "step"}
    for step, value in tb["train/zeropilot/host_rss_gib"].items():
        assert value >= own[step] * (1 - 1e-6), (step, value, own[step])
    # the save at step 4 is logged with the next log call (the Trainer logs a step before it saves it)
    saves = tb["train/zeropilot/save_seconds"]
    assert sorted(saves) == [5] and saves[5] > 0 and tb["train/zeropilot/save_gib"][5] > 0
    # the Trainer's own record of its logs is untouched: log_history is copied before the callbacks run
    state = json.loads((job.ckpt_dir / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["log_history"] and not any("zeropilot/" in k for e in state["log_history"] for k in e)


@pytest.mark.slow
def test_trainer_report_to_mlflow_offline_holds_the_same_figures(monkeypatch):
    """The same job reported to MLflow too (its file store, offline): no code of ours for MLflow, the same keys
    (MLflow's integration keeps them as logged: ``zeropilot/...``) and values as in TensorBoard."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    job = hf_trainer_watched().job
    assert job.returncode == 0, job.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((job.ckpt_dir.parent / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("zeropilot-watched")
    (run,) = client.search_runs([experiment.experiment_id])
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "zeropilot/host_rss_gib")}
    assert sorted(history) == list(range(1, 9))
    tb = _scalars(job.ckpt_dir / "runs")["train/zeropilot/host_rss_gib"]
    assert all(abs(history[s] - tb[s]) <= 1e-6 * tb[s] for s in tb)  # TensorBoard stores float32
    assert "zeropilot/step_seconds" in run.data.metrics and "loss" in run.data.metrics


@pytest.mark.slow
def test_deepspeed_monitor_receives_the_figures_of_every_step():
    job = raw_deepspeed()
    assert job.returncode == 0, job.stderr[-3000:]
    monitor = job.ckpt_dir.parent / "monitor"
    tb = _scalars(monitor / "tb")
    steps = list(range(1, 7))
    assert sorted(tb["zeropilot/host_rss_gib"]) == steps
    assert sorted(tb["zeropilot/step_seconds"]) == steps[1:]
    assert "Train/Samples/lr" in tb  # DeepSpeed's own scalars sit beside ours, in the same files
    # DeepSpeed's CSV monitor: one file per figure, written by DeepSpeed's own writer
    with open(monitor / "csv" / "zeropilot_host_rss_gib.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "host_rss_gib"] and [int(r[0]) for r in rows[1:]] == steps
    assert all(float(r[1]) > 0 for r in rows[1:])


def _write_ranks(root: Path, per_rank: dict) -> Path:
    root.mkdir()
    for rank, records in per_rank.items():
        with open(root / f"rank-{rank}.jsonl", "w") as f:
            for rec in records:
                f.write(rec if isinstance(rec, str) else json.dumps(rec) + "\n")
    return root


def _step(step: int, seconds, rss: int, peak: Optional[int] = None) -> dict:
    return {"event": "step", "step": step, "seconds": seconds,
            "mem": {"host_rss_bytes": rss, "peak_reserved_bytes": peak, "allocated_bytes": None}}


def test_figures_are_the_max_over_ranks_window_by_window(tmp_path):
    d = _write_ranks(tmp_path / "run", {
        0: [_step(1, None, 1 << 30, 2 << 30), _step(2, 0.5, 1 << 30, 2 << 30),
            {"event": "save", "step": 2, "seconds": 3.0, "bytes": 1 << 30}],
        1: [_step(1, None, 3 << 30, 1 << 30), _step(2, 1.5, 2 << 30, 5 << 30), "{torn", '{"event": "step", "st'],
    })
    figures = metrics.Figures(d)
    out = figures.take(False, "zeropilot/")
    assert out == {"zeropilot/ranks_reporting": 2.0, "zeropilot/host_rss_gib": 2.0, "zeropilot/peak_reserved_gib": 5.0,
                   "zeropilot/step_seconds": 1.5, "zeropilot/slowest_rank": 1.0, "zeropilot/save_seconds": 3.0,
                   "zeropilot/save_gib": 1.0}
    # the next window: rank 0 stepped again, rank 1 not yet (its torn line is still unfinished)
    with open(d / "rank-0.jsonl", "a") as f:
        f.write(json.dumps(_step(3, 0.25, 1 << 30, 2 << 30)) + "\n")
    out = figures.take(True, "zp.")
    assert out["zp.ranks_reporting"] == 1.0 and out["zp.step_seconds"] == 0.25 and "zp.save_seconds" not in out
    assert out["zp.host_rss_gib"] == 2.0  # levels stay: rank 1's newest figure still counts
    assert out["zp.rank0/step_seconds"] == 0.25 and "zp.rank1/step_seconds" not in out
    assert out["zp.rank1/peak_reserved_gib"] == 5.0


def test_off_switch_and_prefix(monkeypatch):
    monkeypatch.setenv(metrics.MODE_ENV, "off")
    assert metrics.mode() == "off" and metrics._Sink().take("trainer") == {}
    monkeypatch.setenv(metrics.MODE_ENV, "RANKS")
    assert metrics.mode() == "ranks"
    monkeypatch.setenv(metrics.MODE_ENV, "nonsense")
    assert metrics.mode() == "max"
    monkeypatch.setenv(metrics.PREFIX_ENV, "guard/")
    assert metrics.prefix() == "guard/"


def test_tokens_per_step_from_the_trainers_own_count():
    from types import SimpleNamespace

    sink = metrics._Sink()
    old, metrics._sink = metrics._sink, sink
    try:
        assert metrics._tokens_per_step(SimpleNamespace(global_step=2, num_input_tokens_seen=0)) is None  # not counted
        assert metrics._tokens_per_step(SimpleNamespace(global_step=2, num_input_tokens_seen=256)) is None  # first log
        assert metrics._tokens_per_step(SimpleNamespace(global_step=6, num_input_tokens_seen=1280)) == 256.0
    finally:
        metrics._sink = old


def test_the_figures_touch_no_tensor_and_no_collective():
    """The module reads files only: no torch, no torch.distributed, no deepspeed.comm, not even lazily."""
    import ast

    tree = ast.parse(Path(metrics.__file__).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in names if m.split(".")[0] in ("torch", "deepspeed")}, names


def test_run_metrics_flag_reaches_the_launch(tmp_path):
    import sys

    from tests.zp import run_zeropilot

    r = run_zeropilot(["run", "--metrics", "off", "--out", str(tmp_path / "run"), "--", sys.executable, "-c",
                       f"import os; print('mode', os.environ['{metrics.MODE_ENV}'])"], timeout=120,
                      env={"DS_ACCELERATOR": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mode off" in r.stdout


def test_callback_adds_figures_once_per_step_on_rank_0_with_a_tracker(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(metrics._sink, "take", lambda consumer: {"zeropilot/host_rss_gib": 1.5})
    cb = metrics.make_callback_class()()

    def log(report_to, step=3, zero=True, logs=None):
        logs = {"loss": 1.0} if logs is None else logs
        cb.on_log(SimpleNamespace(report_to=report_to), SimpleNamespace(global_step=step, is_world_process_zero=zero,
                                                                        num_input_tokens_seen=0), None, logs=logs)
        return logs

    assert log([]) == {"loss": 1.0}  # no tracker: nothing added to the console's lines
    assert log(["tensorboard"], zero=False) == {"loss": 1.0}  # not rank 0
    assert log(["tensorboard"]) == {"loss": 1.0, "zeropilot/host_rss_gib": 1.5}
    assert log(["tensorboard"]) == {"loss": 1.0}  # step 3 again (the end-of-training summary): once per step
    assert log(["tensorboard"], step=4, logs={"eval_loss": 2.0}) == {"eval_loss": 2.0}  # evaluations untouched


def test_a_straggler_reaches_the_figures(tmp_path):
    """The recorded run of a slow data loader on rank 1 (tests/runlog/fixtures/straggler-z3): rank 0's figures name
    rank 1 with its ratio, from the run directory only (no collective)."""
    import shutil

    fixture = Path(__file__).resolve().parents[1] / "runlog" / "fixtures" / "straggler-z3"
    run = tmp_path / "run"
    run.mkdir()
    for name in ("rank-0.jsonl", "rank-1.jsonl"):
        shutil.copy(fixture / name, run / name)
    out = metrics.Figures(run).take(False, "zeropilot/")
    assert out["zeropilot/stragglers"] == 1.0 and out["zeropilot/straggler_rank"] == 1.0
    assert 3.0 < out["zeropilot/straggler_ratio"] < 5.0


def test_a_slow_gpu_and_each_ranks_data_time_reach_the_figures(tmp_path):
    """Step records with the guard's probe every 10 steps (rank 2's card at 2x its peers') and each rank's
    DataLoader time: the figures name rank 2's GPU and carry the largest data time and probe reading."""
    def steps(rank):
        out = []
        for s in range(1, 101):
            rec = dict(_step(s, 0.3, 1 << 30, 2 << 30), data_seconds=0.01 * (rank + 1),
                       phase_seconds={"idle": 0.02, "forward": 0.1, "backward": 0.15, "step": 0.03})
            if s % 10 == 0 and s >= 20:
                rec["gpu_probe_seconds"] = 0.001 if rank == 2 else 0.0005
            out.append(rec)
        return out

    d = _write_ranks(tmp_path / "run", {r: steps(r) for r in range(3)})
    out = metrics.Figures(d).take(True, "zeropilot/")
    assert out["zeropilot/gpu_stragglers"] == 1.0 and out["zeropilot/gpu_straggler_rank"] == 2.0
    assert out["zeropilot/gpu_straggler_ratio"] == 2.0 and out["zeropilot/stragglers"] == 0.0
    assert out["zeropilot/gpu_probe_ms"] == 1.0 and out["zeropilot/rank0/gpu_probe_ms"] == 0.5
    assert abs(out["zeropilot/data_seconds"] - 0.03) < 1e-9 and abs(out["zeropilot/rank0/data_seconds"] - 0.01) < 1e-9
