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


# -- jobs of many ranks and long runs: what `zeropilot run` leaves after compaction --------------------------------


@dataclass
class JobSpec:
    """A data-parallel job of ``nodes`` x ``per_node`` ranks on H100s: GPU memory fields, phase times, batches, a save
    every ``save_every`` steps, every rank ending each step at the job's time (its collectives); ``straggler`` loads its
    batches ``straggle_s`` slower from a third of the run on (every other rank waits for it in its backward), ``heavy``
    holds ``heavy_gib`` more memory, ``hang_rank`` stops in its forward at half the run and every other rank waits
    for it (the watchdog's verdict names it), ``slow_gpu``'s card is slower (its GPU probe readings)."""

    nodes: int = 2
    per_node: int = 8
    steps: int = 200
    save_every: int = 5000
    straggler: Optional[int] = None
    straggle_s: float = 0.25
    heavy: Optional[int] = None
    heavy_gib: float = 3.0
    hang_rank: Optional[int] = None
    slow_gpu: Optional[int] = None  # this rank's GPU probe reads ``slow_gpu_ratio`` x its peers' (guard.gpu_probe)
    slow_gpu_ratio: float = 1.6
    probe_every: int = 10  # steps between two GPU probes (guard.gpu_probe.EVERY)
    seed: int = 0

    @property
    def world(self) -> int:
        return self.nodes * self.per_node


def job_records(spec: JobSpec, rank: int):
    """Rank ``rank``'s records in order, as the guard writes them (``guard.rank``: phase seconds rounded to the
    microsecond, ``seconds`` the difference of two clock readings, the peak counters cumulative)."""
    import random

    from zeropilot.runlog.nodes import rank_place

    rnd = random.Random(spec.seed * 1_000_003 + rank)
    node, local = divmod(rank, spec.per_node)
    host = f"gpu-node-{node:03d}"
    env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(spec.world),
           "LOCAL_WORLD_SIZE": str(spec.per_node), "GROUP_RANK": str(node), "TORCHELASTIC_RUN_ID": "job",
           "GROUP_WORLD_SIZE": str(spec.nodes), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    cap = 80 * GiB
    t = T0 + 0.003 * local + 0.02 * node  # the launcher starts the nodes one after the other
    base = {"v": EVENT_VERSION, "rank": rank}
    yield dict(base, event="start", t=t, pid=4000 + local, host=host, local_rank=local, world_size=spec.world,
               device={"name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "total_bytes": cap},
               framework="deepspeed", allocator_settings={"expandable_segments": True},
               node=rank_place(env, host))
    extra = int(spec.heavy_gib * GiB) if rank == spec.heavy else 0
    alloc0 = 31 * GiB + extra + rnd.randrange(0, 4096) * 4096
    reserved = alloc0 + 6 * GiB
    peak_a, peak_r = alloc0 + 5 * GiB, reserved
    outside = int(2.1 * GiB) + rnd.randrange(0, 64) * (1 << 20)
    rss = 9 * GiB + rnd.randrange(0, 1 << 16) * 4096
    mem = {"allocated_bytes": alloc0, "reserved_bytes": reserved, "peak_allocated_bytes": peak_a,
           "peak_reserved_bytes": peak_r, "unallocated_reserved_bytes": reserved - alloc0, "alloc_retries": 0,
           "num_ooms": 0, "device_free_bytes": cap - reserved - outside, "device_total_bytes": cap,
           "outside_torch_bytes": outside, "host_rss_bytes": rss}
    t += 40.0
    yield dict(base, event="init", t=t, zero_stage=2, seconds=40.0, mem=dict(mem), framework="deepspeed",
               device={"name": "NVIDIA H100 80GB HBM3", "backend": "cuda", "total_bytes": cap, "index": local},
               allocator_settings={"expandable_segments": True}, allocator_limit_bytes=None)
    yield dict(base, event="setup", t=t + 0.01, model={"class": "Qwen2ForCausalLM", "params": 7_615_616_512},
               zero={"stage": 2}, train={"micro_batch": 4, "grad_accum": 2, "world_size": spec.world})
    job = random.Random(spec.seed)  # the step's end is the job's: every rank leaves it in the same collectives
    last_end = T0 + 40.0 + 0.02 * spec.nodes
    save_s = 0.0
    stop = spec.steps // 2 if spec.hang_rank is not None else None  # a hang stops every rank: they wait for it
    for step in range(1, spec.steps + 1):
        if stop is not None and step == stop:
            return
        slow = spec.straggle_s if (spec.straggler is not None and step > spec.steps // 3) else 0.0
        end = last_end + 0.492 + job.random() * 0.01 + slow + save_s + (3.0 if step == 1 else 0.0)
        seconds = end - last_end
        idle = round(0.004 + rnd.random() * 0.002 + (slow if rank == spec.straggler else 0.0), 6)
        forward = round(0.118 + rnd.random() * 0.004 + (3.0 if step == 1 else 0.0), 6)
        opt = round(0.052 + rnd.random() * 0.002, 6)
        backward = round(seconds - save_s - idle - forward - opt - rnd.random() * 1e-5, 6)
        phases = {"idle": idle}
        if save_s:
            phases["save"] = save_s
        phases.update(forward=forward, backward=backward, step=opt)
        own = {"data_seconds": round(idle - 0.0008 - rnd.random() * 2e-4, 6)}  # its DataLoader's part of idle
        if spec.probe_every and step % spec.probe_every == 0:
            probe = 4.2e-4 * (1 + rnd.random() * 0.02) * (spec.slow_gpu_ratio if rank == spec.slow_gpu else 1.0)
            own["gpu_probe_seconds"] = round(probe, 7)
        last_end, save_s = end, 0.0
        alloc = alloc0 + rnd.randrange(0, 256) * 4096
        peak_a = max(peak_a, alloc + 5 * GiB + rnd.randrange(0, 64) * (1 << 20))
        rss += rnd.randrange(-8, 9) * 4096
        mem = dict(mem, allocated_bytes=alloc, peak_allocated_bytes=peak_a, unallocated_reserved_bytes=reserved - alloc,
                   host_rss_bytes=rss)
        yield dict(base, event="step", t=end + rnd.random() * 4e-4, step=step, seconds=seconds if step > 1 else None,
                   mem=mem, phase_seconds=phases, **own,
                   batch={"micro_batches": 2, "micro_batch_size": 4, "seq_len": 4096,
                          "tokens": 2 * 4 * 4096 - rnd.randrange(0, 2048)})
        if spec.save_every and step % spec.save_every == 0:
            save_s = round(7.5 + job.random(), 6)
            peak_r = max(peak_r, reserved + 3 * GiB)
            at = dict(mem, peak_reserved_bytes=peak_r)
            yield dict(base, event="save", t=end + save_s, step=step, tag=f"global_step{step}",
                       path=f"/ckpt/job/global_step{step}", bytes=15_231_234_048 // spec.world, seconds=save_s,
                       phases=[{"name": "model_states", "seconds": round(save_s * 0.3, 6)},
                               {"name": "optimizer_states", "seconds": round(save_s * 0.7, 6)}],
                       mem_before=mem, mem_peak=at, mem_after=at)
            mem = at
    yield dict(base, event="end", t=last_end + 1.0, steps=spec.steps)


def write_job(root: Path, spec: JobSpec, jobs: int = 1, segment_bytes: Optional[int] = None,
              writer: bool = True, compact: bool = True) -> Path:
    """A whole job's run directory as ``zeropilot run`` leaves it on a shared folder: each node's ``run-node-K.json``,
    each rank's last heartbeat and its records in closed segments, compacted (``runlog.compact.write_segment``, the
    supervisor's own path) where the writer would have closed them (``runlog.events.SEGMENT_BYTES`` of JSON lines),
    and the watchdog's verdict when a rank hangs. ``jobs`` processes write the ranks. ``writer``: every record goes
    through the guard's writer (``EventWriter``, which closes the segments) and the supervisor's end
    (``runlog.compact.finish_rank``); else the records go to the compaction as records, not as lines: the same
    columns, faster (segments closed where the writer would close them, to within a step). ``compact`` False: the
    writer's files as they are before the supervisor's end (closed segments and live files of JSON lines)."""
    from zeropilot.runlog.events import SEGMENT_BYTES

    d = RunDir(Path(root))
    d.root.mkdir(parents=True, exist_ok=True)
    size = segment_bytes or SEGMENT_BYTES
    ranks = range(spec.world)
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            args = [(str(d.root), spec, r, size, writer, compact) for r in ranks]
            ends = pool.starmap(_write_job_rank, args, chunksize=4)
    else:
        ends = [_write_job_rank(str(d.root), spec, r, size, writer, compact) for r in ranks]
    end_t = max(ends)
    hang = spec.hang_rank is not None
    for node in range(spec.nodes):
        write_json_atomic(d.node_run_file(str(node)), {
            "schema": "zeropilot.run/1", "command": ["torchrun", "--nnodes", str(spec.nodes), "--nproc-per-node",
                                                     str(spec.per_node), "train.py", "--deepspeed", "ds.json"],
            "cwd": "/job", "started_at": T0 - 5, "ended_at": end_t + 2, "exit_code": 1 if hang else 0,
            "signal": None, "world_size": spec.world, "versions": {"torch": "2.13.0", "deepspeed": "0.19.8"},
            "environment": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_TIMEOUT": "1800"},
            "plan": {"peak_bytes_per_rank": 46 * GiB, "verdict": "fits"}, "hang_timeout_s": 600,
            "on_hang": "stop", "node": {"node_rank": node, "nnodes": spec.nodes, "file_key": str(node)}})
    if hang:
        _write_job_hang(d, spec, end_t)
    return d.root


def _write_job_rank(root: str, spec: JobSpec, rank: int, segment_bytes: int, writer: bool = True,
                    compact: bool = True) -> float:
    """One rank's records as ``zeropilot run`` leaves them: segments closed where the writer closes them (when the
    next line would pass ``segment_bytes``; steps counted at the average size of the rank's first ones, every other
    record at its own), each compacted, then merged into one file (``runlog.compact.finish``'s ``merge_rank``); a
    rank that never closed one keeps its live file, written by the real writer."""
    from zeropilot.runlog import segments
    from zeropilot.runlog.compact import write_segment
    from zeropilot.runlog.events import line

    d = RunDir(Path(root))
    if writer:
        from zeropilot.runlog.compact import finish_rank

        with EventWriter(d.events(rank), segment_bytes) as w:
            for rec in job_records(spec, rank):
                w.write(rec)
        if compact:
            finish_rank(d, rank)
        return _job_heartbeat(d, spec, rank, rec)
    parts, size, chunk, step_size, sized = [], 0, [], 0.0, []
    last_t = T0
    for rec in job_records(spec, rank):
        if rec["event"] != "step" or len(sized) < 64:
            n = len(line(rec))
            if rec["event"] == "step":
                sized.append(n)
                step_size = sum(sized) / len(sized)
        else:
            n = step_size
        if chunk and size + n > segment_bytes:
            parts.append(segments.from_records(rank, len(parts) + 1, chunk))
            size, chunk = 0, []
        chunk.append(rec)
        size += n
        last_t = rec["t"]
    if not parts:  # never closed a segment: the run leaves the live file as the writer wrote it
        with EventWriter(d.events(rank), segment_bytes) as w:
            for rec in chunk:
                w.write(rec)
    elif chunk:
        parts.append(segments.from_records(rank, len(parts) + 1, chunk))
    if parts:
        write_segment(d, segments.concat(parts) if len(parts) > 1 else parts[0])
    return _job_heartbeat(d, spec, rank, chunk[-1] if chunk else {"t": last_t})


def _job_heartbeat(d: RunDir, spec: JobSpec, rank: int, last: Dict[str, Any]) -> float:
    """The rank's last heartbeat (at its last record); that record's time."""
    last_t, step = last["t"], last.get("step") or 0
    write_json_atomic(d.heartbeat(rank), {
        "t": last_t, "rank": rank, "pid": 4000 + rank % spec.per_node, "host": f"gpu-node-{rank // spec.per_node:03d}",
        "phase": "collective" if spec.hang_rank is not None and rank != spec.hang_rank else "idle",
        "phase_since": last_t, "step": step, "progress": 4 * spec.steps, "activity": 2 * spec.steps,
        "world_size": spec.world, "stoppable": False, "store": None})
    return last_t


def _write_job_hang(d: RunDir, spec: JobSpec, t: float) -> None:
    stuck = spec.hang_rank
    ranks = [{"rank": r, "phase": "forward" if r == stuck else "collective", "phase_since": t - 600,
              "step": spec.steps // 2 - 1, "alive": True,
              "where": ["main (train.py:80)", "forward (model.py:210)" if r == stuck
                        else "all_reduce (distributed_c10d.py:2800)"], "stack_file": None}
             for r in range(spec.world)]
    write_json_atomic(d.hang_file, {
        "t": t + 600, "timeout_s": 600, "action": "stop", "ranks": ranks, "locks": [], "flight_recorder": [],
        "flight_recorder_summary": None,
        "verdict": {"ranks": [stuck], "where": ["forward"], "reason": f"rank {stuck} stopped in its forward while "
                    f"the other {spec.world - 1} wait in all_reduce", "cause": "one rank stuck outside the "
                    "collectives", "fixes": [{"fix": "look at rank's stacks", "why": "it never reached all_reduce"}]}})
