"""The evidence the guard records for stragglers, on real parts: a rank's DataLoader time (``guard.data_time``) and
its GPU's speed (``guard.gpu_probe``: off on a CPU; its code at work on CPU tensors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests import runjobs
from zeropilot.guard import gpu_probe

TIMEOUT = 120

#: a guard in a run directory, a real DataLoader whose dataset sleeps 0.05 s per sample (batch 2: 0.1 s a batch)
DATA_JOB = """
import threading, time, torch
from zeropilot import guard
guard.start({out!r})
from zeropilot.guard.rank import current

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(2)

class Nested(torch.utils.data.Dataset):
    # a dataset that iterates a DataLoader of its own: the outer batch's wait counts once
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return next(iter(torch.utils.data.DataLoader(Slow(), batch_size=2)))

g = current("python")
it = iter(torch.utils.data.DataLoader(Slow(), batch_size=2))
g.step_ended(0)  # before any batch: no data time recorded yet
for step in (1, 2):
    next(it)
    time.sleep(0.2)  # the rest of the step, not the loader's
    g.step_ended(step)
other = threading.Thread(target=lambda: [next(iter(torch.utils.data.DataLoader(Slow(), batch_size=2)))
                                         for _ in range(3)])
other.start(); other.join()  # a prefetching thread's waits are not the training loop's
g.step_ended(3)
next(iter(torch.utils.data.DataLoader(Nested(), batch_size=1)))
g.step_ended(4)
"""


def test_the_dataloader_time_is_the_main_threads_wait_in_next_counted_once(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(DATA_JOB.format(out=str(out)))], capture_output=True,
                       text=True, timeout=TIMEOUT, env=dict(os.environ, PYTHONPATH=str(runjobs.REPO / "src")))
    assert r.returncode == 0, r.stderr
    steps = [json.loads(x) for x in (out / "rank-0.jsonl").read_text().splitlines()]
    steps = {s["step"]: s for s in steps if s["event"] == "step"}
    assert "data_seconds" not in steps[0]  # no DataLoader yet: a loop without one records none
    for step in (1, 2):  # one batch of two 0.05 s samples; the 0.2 s after it is not the loader's
        assert 0.095 < steps[step]["data_seconds"] < 0.18, steps[step]
    assert steps[3]["data_seconds"] == 0.0  # only another thread loaded
    assert 0.095 < steps[4]["data_seconds"] < 0.18  # the nested loader's batch inside the outer one, once
    assert not any("gpu_probe_seconds" in s for s in steps.values())  # no GPU: no probe


def test_the_probe_is_off_without_cuda_and_says_why():
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    schedule = gpu_probe.Schedule(every=2)
    assert [schedule.at_step_end(s, torch) for s in range(1, 7)] == [None] * 6
    assert schedule.off == "no CUDA device" and schedule.probe is None


def test_the_probe_reads_the_previous_one_at_each_probe_step_and_leaves_the_job_untouched():
    """The probe's own code on CPU tensors (the host's clock instead of CUDA events): a reading at every probe step
    from the second on, no random number drawn, nothing of the job's changed."""
    probe = gpu_probe.Probe(torch, torch.device("cpu"))
    rng = torch.get_rng_state()
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    before = (x @ x).clone()
    readings = [probe.at_step_end() for _ in range(3)]
    assert readings[0] is None and all(r is not None and r > 0 for r in readings[1:]), readings
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(x @ x, before)
    assert probe.a.shape == (gpu_probe.SIZE, gpu_probe.SIZE) and probe.a.dtype == torch.bfloat16
    assert float(probe.c[0, 0]) == 0.5  # 2048 x (1/64)^2: no overflow, no denormals


@pytest.mark.parametrize("value, every", [("", gpu_probe.EVERY), ("5", 5), ("0", 0), ("off", 0), ("-3", gpu_probe.EVERY),
                                          ("x", gpu_probe.EVERY)])
def test_the_interval_comes_from_the_environment(monkeypatch, value, every):
    monkeypatch.setenv(gpu_probe.EVERY_ENV, value)
    assert gpu_probe.every_from_env() == every
    schedule = gpu_probe.Schedule()
    assert (schedule.off is not None) == (every == 0)
