"""What the straggler evidence costs a rank: the DataLoader's timed ``__next__`` and the GPU probe.

In one process, no job: a guard in a temporary run directory (its heartbeat thread stopped beside the timing).

- ``wrapper_us``: ``guard.data_time``'s wrapper around a method that returns at once, less that method called
  alone: what the wrapper adds to every batch (the guard found, the main thread checked, two clock reads).
- ``next_*_us``: one ``__next__`` of a real DataLoader iterator (a ``TensorDataset``, batch 1, no workers: the
  cheapest batch there is, so the wrapper's share is the largest it gets), wrapped and not, in alternating rounds;
  the minimum over rounds of each (a shared machine's load only adds).
- ``schedule_us``: ``guard.gpu_probe.Schedule.at_step_end`` on a step that is no probe step (what every other step
  pays).
- On a GPU (``torch.cuda.is_available()``): the probe itself on the current device, ``launch_ms`` (host time to
  queue it: 16 products and two events) and ``probe_ms`` (the GPU's time, the reading), medians of 50 after 10
  warm-up probes. On a CPU the probe is off in the guard; these are not measured.

``python bench/guard/straggler_cost.py`` prints ``RESULT {json}``.
"""

import json
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import torch
import torch.utils.data.dataloader as dl

from zeropilot.guard import data_time, gpu_probe, rank
from zeropilot.guard.rank import RankGuard

N, ROUNDS = 20000, 9


def next_us(loader) -> float:
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(N):
        next(it)
    return (time.perf_counter() - t0) / N * 1e6


class _Returns:
    def __next__(self):
        return None


def wrapper_us() -> float:
    """The wrapper's own cost per call, against the bare method (minimum over rounds of paired timings)."""
    bare, timed = _Returns(), type("_Timed", (), {"__next__": data_time._timed(_Returns.__next__)})()
    diffs = []
    for _ in range(ROUNDS):
        a = timeit.timeit(timed.__next__, number=N)
        b = timeit.timeit(bare.__next__, number=N)
        diffs.append((a - b) / N * 1e6)
    return min(diffs)


def main() -> None:
    guard = RankGuard(Path(tempfile.mkdtemp(prefix="straggler-cost-")), 0, "python")
    guard._stop.set()
    rank._guard = guard
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(N, 4)), batch_size=1)
    original = dl._BaseDataLoaderIter.__next__
    data_time.patch_dataloader_module(dl)
    timed = dl._BaseDataLoaderIter.__next__
    wrapped, plain = [], []
    for _ in range(ROUNDS):
        dl._BaseDataLoaderIter.__next__ = timed
        wrapped.append(next_us(loader))
        dl._BaseDataLoaderIter.__next__ = original
        plain.append(next_us(loader))
    assert guard.data_seen and guard.data_seconds > 0
    schedule = gpu_probe.Schedule()
    step = [1]

    def not_a_probe_step() -> None:
        step[0] += 1 if (step[0] + 1) % schedule.every else 2
        schedule.at_step_end(step[0], torch)
    sched_us = statistics.median(timeit.timeit(not_a_probe_step, number=N) / N * 1e6 for _ in range(ROUNDS))
    out = {"wrapper_us": round(wrapper_us(), 3), "next_wrapped_us": round(min(wrapped), 3),
           "next_plain_us": round(min(plain), 3), "schedule_us": round(sched_us, 3), "probe": None}
    if torch.cuda.is_available():
        probe = gpu_probe.Probe(torch, torch.device("cuda", torch.cuda.current_device()))
        launches, readings = [], []
        for i in range(60):
            t0 = time.perf_counter()
            probe.launch()
            launches.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            reading = probe.read()
            if i >= 10:
                readings.append(reading)
        out["probe"] = {"device": torch.cuda.get_device_name(), "launch_ms": round(1e3 * statistics.median(launches[10:]), 4),
                        "probe_ms": round(1e3 * statistics.median(readings), 4), "every": gpu_probe.EVERY,
                        "size": gpu_probe.SIZE, "reps": gpu_probe.REPS}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
