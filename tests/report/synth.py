"""Synthetic run directories written with the real writer (``runlog.EventWriter``).

They exercise what CPU test runs cannot produce: GPU memory fields, an OOM classified by the guard,
a watchdog's hang verdict, and 100k steps x 8 ranks for the benchmark. Reports about real runs are
tested on directories written by ``zeropilot run`` (``test_real_runs.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from zeropilot.runlog import EVENT_VERSION, EventWriter, RunDir
from zeropilot.runlog.layout import write_json_atomic

GiB = 1 << 30
T0 = 1_780_000_000.0


@dataclass
class Spec:
    ranks: int = 2
    steps: int = 40
    save_every: int = 20
    oom_rank: Optional[int] = None  # this rank runs out of memory at the first step after the first save
    hang_rank: Optional[int] = None  # this rank stops in a collective at steps // 2
    capacity: int = 80 * GiB
    base: int = 30 * GiB
    plan_bytes: Optional[int] = 48 * GiB


def _mem(alloc: float, reserved: float, peak_a: float, peak_r: float, cap: int, rank: int) -> Dict[str, Any]:
    outside = int(1.3 * GiB + rank * 0.05 * GiB)
    return {"allocated_bytes": int(alloc), "reserved_bytes": int(reserved), "peak_allocated_bytes": int(peak_a),
            "peak_reserved_bytes": int(peak_r), "unallocated_reserved_bytes": int(reserved - alloc),
            "alloc_retries": 0, "num_ooms": 0, "device_free_bytes": int(cap - reserved - outside),
            "device_total_bytes": cap, "outside_torch_bytes": outside, "host_rss_bytes": int(6 * GiB)}


class _Rank:
    """One rank's memory as the synthetic job goes: a saw-tooth per step, a spike per save."""

    def __init__(self, spec: Spec, rank: int) -> None:
        self.spec, self.rank = spec, rank
        self.peak_a = self.peak_r = 0.0
        self.reserved = float(spec.base)

    def step_mem(self, step: int) -> Dict[str, Any]:
        s = self.spec
        wobble = 0.5 + 0.5 * math.sin(step * 0.37 + self.rank)
        alloc = s.base + (4 + 2 * wobble + 0.3 * self.rank) * GiB
        self.reserved = max(self.reserved, alloc + 1.5 * GiB)
        self.peak_a = max(self.peak_a, alloc + 6 * GiB)
        self.peak_r = max(self.peak_r, self.reserved + 4 * GiB)
        return _mem(alloc, self.reserved, self.peak_a, self.peak_r, s.capacity, self.rank)

    def save_mem(self, stage: str) -> Dict[str, Any]:
        s = self.spec
        extra = {"before": 0, "peak": 14 * GiB, "after": 3 * GiB}[stage]
        alloc = s.base + 4 * GiB + extra
        self.reserved = max(self.reserved, alloc + 1 * GiB)
        self.peak_a = max(self.peak_a, alloc)
        self.peak_r = max(self.peak_r, self.reserved)
        return _mem(alloc, self.reserved, self.peak_a, self.peak_r, s.capacity, self.rank)


def write_run(root: Path, spec: Spec = Spec()) -> Path:
    """Write a whole synthetic run directory under ``root``; returns it."""
    d = RunDir(Path(root))
    d.root.mkdir(parents=True, exist_ok=True)
    end_t = T0
    crashed = False
    for rank in range(spec.ranks):
        t, stopped = _write_rank(d, spec, rank)
        end_t = max(end_t, t)
        crashed = crashed or stopped
    if spec.hang_rank is not None:
        _write_hang(d, spec, end_t)
    exit_code = 1 if crashed or spec.hang_rank is not None else 0
    write_json_atomic(d.run_file, {
        "schema": "zeropilot.run/1", "command": ["deepspeed", "train.py", "--deepspeed", "ds.json"], "cwd": "/job",
        "started_at": T0 - 5, "ended_at": end_t + 1, "exit_code": exit_code, "signal": None,
        "world_size": spec.ranks, "versions": {"torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.24.0"},
        "environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_TIMEOUT": "600",
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "0,1"},
        "check": {"errors": 0, "warnings": 1, "codes": ["TO001"]},
        "plan": {"peak_bytes_per_rank": spec.plan_bytes, "verdict": "fits"} if spec.plan_bytes else None,
        "hang_timeout_s": 300, "on_hang": "stop"})
    return d.root


def _write_rank(d: RunDir, spec: Spec, rank: int):
    state = _Rank(spec, rank)
    t = T0 + 0.01 * rank
    with EventWriter(d.events(rank)) as w:
        w.write({"v": EVENT_VERSION, "event": "start", "t": t, "rank": rank, "pid": 1000 + rank, "host": "node0",
                 "local_rank": rank, "world_size": spec.ranks, "framework": "deepspeed",
                 "device": {"name": "NVIDIA H200", "backend": "cuda", "total_bytes": spec.capacity},
                 "allocator_settings": {"expandable_segments": True}})
        t += 8.0
        w.write({"v": EVENT_VERSION, "event": "init", "t": t, "rank": rank, "zero_stage": 3, "seconds": 8.0,
                 "mem": state.step_mem(0)})
        saved = False
        for step in range(1, spec.steps + 1):
            if spec.hang_rank is not None and step == spec.steps // 2:
                return t, True
            if spec.oom_rank == rank and saved:
                _write_oom(d, w, spec, rank, step, t + 0.2, state)
                return t, True
            secs = 0.5 + 0.02 * math.sin(step) + (3.0 if step == 1 else 0.0)
            t += secs
            w.write({"v": EVENT_VERSION, "event": "step", "t": t, "rank": rank, "step": step, "seconds": secs,
                     "mem": state.step_mem(step)})
            if spec.save_every and step % spec.save_every == 0:
                t = _write_save(w, state, rank, step, t)
                saved = True
        w.write({"v": EVENT_VERSION, "event": "end", "t": t + 0.1, "rank": rank, "steps": spec.steps})
    return t, False


def _write_save(w: EventWriter, state: _Rank, rank: int, step: int, t: float) -> float:
    before = state.save_mem("before")
    peak = state.save_mem("peak")
    after = state.save_mem("after")
    phases = [{"name": "gather_16bit", "seconds": 1.5}, {"name": "model_states", "seconds": 2.0},
              {"name": "optimizer_states", "seconds": 4.0}, {"name": "write", "seconds": 0.5}]
    t += 8.0
    w.write({"v": EVENT_VERSION, "event": "save", "t": t, "rank": rank, "step": step, "tag": f"global_step{step}",
             "path": f"/job/out/checkpoint-{step}", "bytes": 15_200_000_000 // 2, "seconds": 8.0, "phases": phases,
             "mem_before": before, "mem_peak": peak, "mem_after": after})
    return t


def _write_oom(d: RunDir, w: EventWriter, spec: Spec, rank: int, step: int, t: float, state: _Rank) -> None:
    mem = state.step_mem(step)
    w.write({"v": EVENT_VERSION, "event": "oom", "t": t, "rank": rank, "step": step, "phase": "backward",
             "request_bytes": 2 * GiB, "file": d.oom(rank).name})
    write_json_atomic(d.oom(rank), {
        "t": t, "rank": rank, "step": step, "phase": "backward", "request_bytes": 2 * GiB, "mem": mem,
        "just_before": f"first step after the save at step {step - 1}",
        "where": ["train.py:88 in train", "deepspeed/runtime/engine.py:2200 in backward",
                  "torch/autograd/graph.py:829 in _engine_run_backward"],
        "verdict": {"kind": "save_spike", "summary": "the save's gathered 16-bit weights stayed reserved; the next "
                    "backward did not fit",
                    "evidence": ["reserved rose 14.0 GiB during the save and fell 0 after it",
                                 "<script>alert('evidence')</script> from a stranger's file"]},
        "fixes": [{"fix": "stage3_gather_16bit_weights_on_model_save: false", "why": "the save gathers the whole "
                   "16-bit model on rank 0", "expected_bytes": 14 * GiB},
                  {"fix": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "why": "reserved but unallocated "
                   "memory can be reused", "expected_bytes": 2 * GiB}],
        "snapshot": None})


def _write_hang(d: RunDir, spec: Spec, t: float) -> None:
    ranks = []
    for rank in range(spec.ranks):
        stuck = rank == spec.hang_rank
        phase = "collective" if not stuck else "save:write"
        d.stacks(rank).write_text(
            "Thread 0x00007f (most recent call first):\n"
            f'  File "train.py", line {90 + rank} in train\n'
            + ('  File "deepspeed/runtime/engine.py", line 3300 in save_checkpoint\n' if stuck else
               '  File "torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'),
            encoding="utf-8")
        ranks.append({"rank": rank, "phase": phase, "phase_since": t - 310, "step": spec.steps // 2 - 1,
                      "alive": True, "where": ["main (train.py:90)", "save_checkpoint (engine.py:3300)" if stuck
                                               else "all_reduce (distributed_c10d.py:2800)"],
                      "stack_file": d.stacks(rank).name})
    write_json_atomic(d.hang_file, {
        "t": t + 300, "timeout_s": 300, "action": "stop", "ranks": ranks, "locks": [],
        "flight_recorder": [f"nccl-trace-rank-{r}" for r in range(spec.ranks)],
        "flight_recorder_summary": {"desync": 41, "text": "process group 0: ranks 0-1 wait in all_reduce #41; "
                                    f"rank {spec.hang_rank} never called it"},
        "verdict": {"ranks": [spec.hang_rank], "where": ["save_checkpoint"], "reason":
                    f"rank {spec.hang_rank} is writing a checkpoint while the others wait in all_reduce",
                    "cause": "a save called on one rank only", "fixes": [
                        {"fix": "call save_checkpoint on every rank", "why": "it is a collective"}]}})


def write_json_lines(path: Path, records) -> None:
    """Write raw lines (tests of hostile input)."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(r if isinstance(r, str) else json.dumps(r))
            fh.write("\n")
