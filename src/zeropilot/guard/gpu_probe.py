"""The GPU's own speed, per rank: a fixed matrix product timed with CUDA events every few optimizer steps.

A slow GPU (thermal or power throttling, a lower clock, another process sharing the card) runs its kernels behind
asynchronous launches: the CPU's phase times do not show it, and in a data-parallel job every rank's step grows
alike, since the others wait for it in the collectives. What differs is the card's own speed. Every
:data:`EVERY` optimizer steps (``ZEROPILOT_GPU_PROBE_EVERY``; ``0`` turns it off) the guard queues, on the job's
current stream after the step's own kernels, :data:`REPS` products of a fixed :data:`SIZE` x :data:`SIZE` bf16
matrix (fp16 where the card has no bf16) between two timing events, and reads the events' elapsed time at the next
probe step, when the end event has completed (``Event.query``: the guard never waits for the GPU). The reading is
the step record's ``gpu_probe_seconds``; :func:`zeropilot.runlog.stragglers.find_gpu` compares the ranks' readings.

What it never does: synchronise the device or the stream, issue a collective, draw from a random generator (the
matrix is a constant), or touch a tensor of the job. It holds two matrices of ``SIZE**2`` elements (16 MiB in
bf16) from its first reading on, allocated only when the device has at least :data:`MIN_FREE_BYTES` free. It runs
only where the job itself started CUDA (``torch.cuda.is_initialized``): on a CPU job the probe is off and no
``gpu_probe_seconds`` is recorded. It measures the card's matrix units and clocks, not its memory bandwidth (the
matrices fit in the L2 cache of a datacenter GPU).

Cost (the GPU's time is the reading itself): on an H100 the shipped speed profile gives 2048^3 bf16 products at
659 TFLOP/s, 26 us each, so a probe holds the GPU for about 0.42 ms every 10 steps, 0.042 ms a step, and its
16 launches plus two events take about 0.2 ms of host time (10.3 us a launch). The GPU run
(``bench/guard/device_straggler.sh``) measures both on the card.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

EVERY_ENV = "ZEROPILOT_GPU_PROBE_EVERY"
EVERY = 10  # optimizer steps between two probes
SIZE = 2048
REPS = 16
MIN_FREE_BYTES = 1 << 30


def every_from_env() -> int:
    """The probe's interval in steps from ``ZEROPILOT_GPU_PROBE_EVERY`` (``0`` or ``off``: no probe)."""
    value = os.environ.get(EVERY_ENV, "").strip().lower()
    if value in ("0", "off", "no", "false"):
        return 0
    return int(value) if value.isdigit() and 0 < int(value) <= 1_000_000 else EVERY


class Probe:
    """The fixed product on one device: :meth:`at_step_end` reads the previous probe if done, then queues the next.

    On a CUDA (or HIP) device the time is the GPU's, from two events; on a CPU tensor (tests: the same code at
    work) the host's clock around the products, which CPU tensors compute before they return."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.gpu = device.type == "cuda"
        self.a: Any = None
        self.c: Any = None
        self.pending: Any = None  # (start, end) events of the probe in flight; a float on a CPU

    def _matrices(self) -> None:
        t = self.torch
        dtype = t.bfloat16 if not self.gpu or t.cuda.is_bf16_supported() else t.float16
        self.a = t.full((SIZE, SIZE), 1.0 / 64, device=self.device, dtype=dtype)  # products of 0.5: no overflow
        self.c = t.empty_like(self.a)

    def launch(self) -> None:
        t = self.torch
        if self.a is None:
            self._matrices()
        if not self.gpu:
            t0 = time.perf_counter()
            for _ in range(REPS):
                t.matmul(self.a, self.a, out=self.c)
            self.pending = time.perf_counter() - t0
            return
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPS):
            t.matmul(self.a, self.a, out=self.c)
        end.record()
        self.pending = (start, end)

    def read(self) -> Optional[float]:
        """The seconds of the probe in flight once it completed (None while it runs, or when none is)."""
        p = self.pending
        if p is None:
            return None
        if isinstance(p, float):
            self.pending = None
            return p
        start, end = p
        if not end.query():
            return None
        self.pending = None
        return start.elapsed_time(end) / 1000.0

    def at_step_end(self) -> Optional[float]:
        reading = self.read()
        if self.pending is None:
            self.launch()
        return reading


class Schedule:
    """One rank's probe: every :data:`EVERY` steps, created at the first probe step where the job's CUDA is up."""

    def __init__(self, every: Optional[int] = None) -> None:
        self.every = every_from_env() if every is None else every
        self.probe: Optional[Probe] = None
        self.off: Optional[str] = None if self.every > 0 else f"turned off ({EVERY_ENV}=0)"

    def at_step_end(self, step: int, torch: Any) -> Optional[float]:
        """The reading to record at the end of optimizer step ``step`` (None on most steps)."""
        if self.off is not None or step % self.every:
            return None
        try:
            if self.probe is None:
                device = self._device(torch)
                if device is None:
                    return None
                self.probe = Probe(torch, device)
            if self.probe.gpu and torch.cuda.is_current_stream_capturing():
                return None  # a CUDA graph being captured: no kernel of ours in it
            return self.probe.at_step_end()
        except Exception as exc:  # noqa: BLE001 - the job never pays for a probe
            self.off = f"{exc.__class__.__name__}: {exc}"
            print(f"zeropilot guard: GPU probe turned off: {self.off}", file=sys.stderr)
            return None

    def _device(self, torch: Any) -> Any:
        """The job's current CUDA device once it started CUDA; None before; off for good without CUDA."""
        if torch is None:
            return None
        if not torch.cuda.is_available():
            self.off = "no CUDA device"
            return None
        if not torch.cuda.is_initialized():
            return None  # the job has not touched its GPU (yet), or runs on the CPU of a GPU host
        device = torch.device("cuda", torch.cuda.current_device())
        free, _ = torch.cuda.mem_get_info(device)
        if free < MIN_FREE_BYTES:
            self.off = f"less than {MIN_FREE_BYTES >> 30} GiB free on the device"
            return None
        return device
