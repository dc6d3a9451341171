"""The guard inside one rank: its records, its heartbeat, its phase.

One :class:`RankGuard` per training process, created by :func:`current` when the process shows it
is a rank (it joins a process group, calls ``deepspeed.initialize`` or builds a ``Trainer``), not
when it merely starts: launchers (``deepspeed``, ``torchrun``, ``accelerate launch``) run the same
bootstrap and must not pose as rank 0.

The heartbeat is written by a daemon thread, at most every :data:`BEAT_S` seconds and only when
the phase or progress changed: a phase change in the training loop is one attribute store, so the
hooks stay far below 1% of a step. The thread needs the GIL; a rank stuck in a collective or in a
file write releases it, so its heartbeat still says where it is.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from zeropilot.runlog.events import EventWriter, event
from zeropilot.runlog.layout import RunDir, write_json_atomic
from zeropilot.runlog.nodes import rank_place
from zeropilot.guard import gpu_probe, telemetry

RUN_DIR_ENV = "ZEROPILOT_RUN_DIR"
STACK_SIGNAL_ENV = "ZEROPILOT_STACK_SIGNAL"  # which signal makes a rank dump its stacks (default SIGUSR2)
BEAT_S = 0.5
SEQ_HISTORY = 1024  # padded lengths of the last optimizer steps kept for the OOM diagnosis (outlier batch)

_lock = threading.Lock()
_guard: Optional["RankGuard"] = None
# Called with the guard at the end of every optimizer step. Layers above this module register here (the OOM
# observer attaches at the first step of a rank that went live after CUDA started), so this module imports none
# of them.
_step_listeners: List[Callable[["RankGuard"], None]] = []


def on_step(listener: Callable[["RankGuard"], None]) -> None:
    """Call ``listener(guard)`` after each optimizer step's record (once per listener, however often added)."""
    if listener not in _step_listeners:
        _step_listeners.append(listener)


def _torch() -> Any:
    """torch if this process already imported it: the guard never imports torch for the job."""
    return sys.modules.get("torch")


def env_rank() -> Optional[int]:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def _dist_rank() -> Optional[int]:
    torch = _torch()
    try:
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return int(torch.distributed.get_rank())
    except Exception:  # noqa: BLE001
        return None
    return None


def _env_int(name: str, env: Optional[Dict[str, str]] = None) -> Optional[int]:
    value = (os.environ if env is None else env).get(name, "")
    return int(value) if value.strip().isdigit() else None


class RankGuard:
    """Records and heartbeat of one rank in a run directory."""

    def __init__(self, root: Path, rank: int, framework: str, host: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, threads: bool = True) -> None:
        """``host`` and ``env`` default to this machine's name and ``os.environ``: a simulation names its own
        (``bench/guard/watchdog_scale.py`` runs many stand-in ranks of many simulated nodes in one process). With
        ``threads=False`` the guard starts no thread: the caller calls :meth:`tick` every :data:`BEAT_S` and its
        store publisher's ``publish`` every ``storebeat.STORE_BEAT_S`` (the simulation's one clock for all)."""
        self.env = os.environ if env is None else env
        self.dir = RunDir(Path(root))
        self.rank = rank
        self.framework = framework
        self.pid = os.getpid()
        self.host = host or socket.gethostname()  # the heartbeat says where its pid lives (a shared run directory)
        self.live_since = time.time()
        self.writer = EventWriter(self.dir.events(rank))
        self.step = 0
        self.phase = "init"
        self.phase_since = time.time()
        self._phase_seconds: Dict[str, float] = {}  # seconds per phase since the last step ended (step record)
        self._counted_to = self.phase_since  # when the phase in progress was last counted into _phase_seconds
        # seconds the main thread waited in a DataLoader iterator's __next__ since the last step ended (guard.data_time):
        # the rank's own data time, whatever the framework does after it; recorded once a DataLoader handed a batch
        self.data_seconds = 0.0
        self.data_seen = False
        self.in_data = False  # inside a timed __next__ (a DataLoader iterated inside a dataset is not counted twice)
        self.probe = gpu_probe.Schedule()  # the GPU's own speed, every few steps (guard.gpu_probe); off on a CPU
        self.progress = 0
        self.last_step_end: Optional[float] = None
        self.last_save: Optional[Dict[str, Any]] = None  # {step, t} of the last save that ended
        self.steps_since_save = 0
        self.op_stack: List[Any] = []  # nested checkpoint operations (see guard.checkpoint)
        self.engine_steps = False  # steps come from DeepSpeedEngine.step, not the Trainer callback
        self.baseline_mem: Optional[Dict[str, Any]] = None  # memory when the OOM observer was attached
        self.failed = False
        self.stoppable = False  # a Trainer with the guard's callback: a stop request can make it save and stop
        self.stop_request: Any = None  # guard.preempt.StopRequest, made at the first step end that asks
        self.stopping = False  # a stop request was taken (the preempt record is written once)
        self.oom_observer = False  # PyTorch's OOM observer attached (see guard.oom)
        self.allocator_settings: Optional[Dict[str, Any]] = None  # as last read (start, init): for OOM records
        self.setup: Dict[str, Any] = {}  # what this rank trains: model, zero, train (guard.setup; a `setup` record)
        self._setup_written: Any = None
        self.model_ref: Any = None  # weak reference to the model, to read gradient checkpointing again later
        self.trainer_batches = False  # a Trainer's training_step notes the batches, not the engine's forward
        self.last_batch: Optional[tuple] = None  # (micro batch size, padded length, tokens or None), last seen
        self._step_batch: Optional[list] = None  # [micro batches, largest size, longest, tokens] since the last step
        self.seq_history: deque = deque(maxlen=SEQ_HISTORY)  # longest padded length of each optimizer step
        self.steps_seen = 0  # optimizer steps whose batches were seen (the history keeps the last SEQ_HISTORY)
        self._beat_written = (None, -1, -1)
        self.activity = 0  # grows when the main thread's call stack changed since the last beat
        self.main_ident = threading.main_thread().ident
        self._fingerprint: Any = None
        self._fr_done = time.time()  # flight-recorder requests older than this were answered (or predate us)
        self._stop = threading.Event()
        self._stacks_fh = None
        self._install_stack_dump()
        self.announced = False
        self.beat(force=True)
        self._thread = threading.Thread(target=self._beat_loop, name="zeropilot-heartbeat", daemon=True)
        if threads:
            self._thread.start()
        from zeropilot.guard import storebeat

        self.place = rank_place(self.env, self.host)
        # across nodes: heartbeats in the job's c10d store
        self.store_beat = storebeat.start(self, self.place, self.env, thread=threads)
        if self.store_beat is not None:
            self.beat(force=True)  # the node's watchdog finds the store's address here

    def announce(self, framework: Optional[str] = None) -> None:
        """The ``start`` record, once, when the rank shows what it runs (after its device is set up)."""
        if self.announced or os.getpid() != self.pid:
            return
        self.announced = True
        if framework:
            self.framework = framework
        torch = _torch()
        self.allocator_settings = telemetry.allocator_settings(torch)
        host = self.host
        self.writer.write(event("start", self.rank, pid=self.pid, host=host,
                                local_rank=_env_int("LOCAL_RANK", self.env),
                                world_size=_env_int("WORLD_SIZE", self.env),
                                device=telemetry.device_info(torch), framework=self.framework,
                                allocator_settings=self.allocator_settings, argv=list(sys.argv),
                                live_since=self.live_since, node=rank_place(self.env, host)))

    # -- stacks -------------------------------------------------------------------------------
    def _install_stack_dump(self) -> None:
        """faulthandler dumps every thread's stack on the watchdog's signal and on SIGTERM (then the
        previous SIGTERM behaviour runs: ``chain=True``)."""
        try:
            self._stacks_fh = open(self.dir.stacks(self.rank), "a", encoding="utf-8")
            sig = getattr(signal, self.env.get(STACK_SIGNAL_ENV, "SIGUSR2"), signal.SIGUSR2)
            faulthandler.register(sig, file=self._stacks_fh, all_threads=True, chain=False)
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                faulthandler.register(signal.SIGTERM, file=self._stacks_fh, all_threads=True, chain=True)
        except (OSError, ValueError, RuntimeError):
            self._stacks_fh = None  # not the main thread, or no such signal: stacks unavailable

    # -- heartbeat ----------------------------------------------------------------------------
    def set_phase(self, phase: str) -> str:
        """Enter ``phase``; returns the phase left, to restore it."""
        previous = self.phase
        now = time.time()
        self._count_phase(now)
        self.phase = phase
        self.phase_since = now
        self.progress += 1
        return previous

    def _count_phase(self, now: float) -> None:
        """Add the time since the last count to the phase in progress (``save:write`` counts as ``save``)."""
        name = self.phase.partition(":")[0]
        self._phase_seconds[name] = self._phase_seconds.get(name, 0.0) + (now - self._counted_to)
        self._counted_to = now

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        previous = self.set_phase(phase)
        try:
            yield
        finally:
            self.set_phase(previous if previous not in ("forward", "backward", "step") else "idle")

    def beat(self, force: bool = False) -> None:
        key = (self.phase, self.progress, self.activity)
        if not force and key == self._beat_written:
            return
        self._beat_written = key
        try:
            write_json_atomic(self.dir.heartbeat(self.rank), {
                "t": time.time(), "rank": self.rank, "pid": self.pid, "host": self.host, "phase": self.phase,
                "phase_since": self.phase_since, "step": self.step, "progress": self.progress,
                "activity": self.activity, "world_size": _env_int("WORLD_SIZE", self.env), "stoppable": self.stoppable,
                "store": _store_text(getattr(self, "store_beat", None))})
        except OSError:
            pass

    def _sample(self) -> None:
        """Count a change of the main thread's call stack (code objects, not line numbers) as activity.

        A rank busy in Python (DeepSpeed's ZeRO-3 init, data loading) changes its stack between samples;
        a rank blocked in a collective, a sleep or a lock-polling loop keeps the same one."""
        frame = sys._current_frames().get(self.main_ident)
        codes = []
        while frame is not None and len(codes) < 64:
            codes.append(id(frame.f_code))
            frame = frame.f_back
        fingerprint = tuple(codes)
        if fingerprint != self._fingerprint:
            self._fingerprint = fingerprint
            self.activity += 1

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_S):
            if os.getpid() != self.pid:  # a forked child (DataLoader worker) is not this rank
                return
            self.tick()

    def tick(self) -> None:
        """One beat of the heartbeat thread: the main thread's activity, the heartbeat file, a flight-recorder
        request."""
        self._sample()
        self.beat()
        self._dump_flight_recorder_if_asked()

    def _dump_flight_recorder_if_asked(self) -> None:
        """The watchdog touched ``.fr-request``: write this rank's flight recorder (gloo has no dump pipe).

        One ``stat`` per beat when nothing is asked. The dump is PyTorch's own
        (``torch._C._distributed_c10d._dump_fr_trace``), read by ``guard.flight`` without unpickling code."""
        try:
            asked = os.stat(self.dir.fr_request).st_mtime
        except OSError:
            return
        if asked <= self._fr_done:
            return
        self._fr_done = asked
        torch = _torch()
        try:
            c10d = torch._C._distributed_c10d if torch is not None else None
            dump = getattr(c10d, "_dump_fr_trace", None)
            if dump is None or not torch.distributed.is_initialized():
                return
            data = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
            tmp = str(self.dir.gloo_trace(self.rank)) + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.dir.gloo_trace(self.rank))
        except Exception:  # noqa: BLE001 - a dump that fails leaves the stacks to tell
            pass

    # -- records ------------------------------------------------------------------------------
    def record(self, kind: str, **fields: Any) -> None:
        if os.getpid() == self.pid:
            self.announce()
            self.writer.write(event(kind, self.rank, **fields))

    def memory(self) -> Dict[str, Any]:
        """This rank's memory now; the first read with a GPU is the baseline for OOM forensics."""
        mem = telemetry.read_memory(_torch())
        if self.baseline_mem is None and mem.get("device_total_bytes") is not None:
            self.baseline_mem = mem
        return mem

    def note_batch(self, shape: Optional[tuple]) -> None:
        """A micro batch reaches the model: ``(size, padded length, tokens or None)`` (``guard.setup.batch_shape``)."""
        if shape is None:
            return
        self.last_batch = shape
        b = self._step_batch
        if b is None:
            self._step_batch = [1, shape[0], shape[1], shape[2]]
        else:
            b[0] += 1
            b[1], b[2] = max(b[1], shape[0]), max(b[2], shape[1])
            b[3] = None if b[3] is None or shape[2] is None else b[3] + shape[2]

    def update_setup(self, **parts: Dict[str, Any]) -> None:
        """Merge what is known of the run's setup (``model``, ``zero``, ``train``); a ``setup`` record when it changed."""
        for key, value in parts.items():
            if value:
                merged = dict(self.setup.get(key) or {})
                merged.update({k: v for k, v in value.items() if v is not None})
                self.setup[key] = merged
        if self.setup and self.setup != self._setup_written:
            self._setup_written = {k: dict(v) for k, v in self.setup.items()}
            self.record("setup", **self._setup_written)

    def step_ended(self, global_step: int) -> None:
        """An optimizer step ended: one ``step`` record (with the batches the model saw in it)."""
        now = time.time()
        seconds = None if self.last_step_end is None else now - self.last_step_end
        self.last_step_end = now
        self.step = int(global_step)
        self.steps_since_save += 1
        self.progress += 1
        batch, self._step_batch = self._step_batch, None
        self._count_phase(now)
        fields: Dict[str, Any] = {"phase_seconds": {k: round(v, 6) for k, v in self._phase_seconds.items()}}
        self._phase_seconds = {}
        if self.data_seen:
            fields["data_seconds"] = round(self.data_seconds, 6)
            self.data_seconds = 0.0
        probe = self.probe.at_step_end(self.step, _torch())
        if probe is not None:
            fields["gpu_probe_seconds"] = round(probe, 7)
        if batch is not None:
            self.seq_history.append(batch[2])
            self.steps_seen += 1
            fields["batch"] = {"micro_batches": batch[0], "micro_batch_size": batch[1], "seq_len": batch[2],
                               "tokens": batch[3]}
        self.record("step", step=self.step, seconds=seconds, mem=self.memory(), **fields)
        if self.phase in ("forward", "backward", "step"):
            self.set_phase("idle")  # between steps (a Trainer's callback leaves its forward phase on otherwise)
        for listener in _step_listeners:
            listener(self)

    def batch_history(self) -> Optional[Dict[str, Any]]:
        """The padded lengths of the steps so far (the last :data:`SEQ_HISTORY`), for the OOM record."""
        if not self.seq_history:
            return None
        lengths = sorted(self.seq_history)
        return {"steps": self.steps_seen, "kept": len(lengths), "median_seq_len": lengths[len(lengths) // 2],
                "max_seq_len": lengths[-1], "last_seq_lens": list(self.seq_history)[-16:]}

    def save_context(self) -> Optional[Dict[str, Any]]:
        """The last save that ended, with the memory it held before, at its peak and after (OOM forensics)."""
        if self.last_save is None:
            return None
        return dict(self.last_save, steps_since=self.steps_since_save)

    def close(self) -> None:
        if os.getpid() != self.pid:
            return
        self._stop.set()
        self.phase = "exit"
        self.progress += 1
        self.beat()
        if self.store_beat is not None:
            self.store_beat.close()
        if not self.failed:
            self.record("end", steps=self.step)
        self.writer.close()
        if self._stacks_fh is not None:
            try:
                empty = self._stacks_fh.tell() == 0 and os.path.getsize(self.dir.stacks(self.rank)) == 0
                self._stacks_fh.close()
                if empty:
                    os.unlink(self.dir.stacks(self.rank))
            except OSError:
                pass


def _store_text(beat: Any) -> Optional[str]:
    """``HOST:PORT`` of the store this rank publishes its heartbeat in (the node's watchdog reads it there)."""
    return f"{beat.addr[0]}:{beat.addr[1]}" if beat is not None else None


def current(framework: str = "python") -> Optional[RankGuard]:
    """This process's guard, created on first call when a run directory is set; None otherwise."""
    global _guard
    if _guard is not None:
        return _guard if _guard.pid == os.getpid() else None
    root = os.environ.get(RUN_DIR_ENV)
    if not root:
        return None
    with _lock:
        if _guard is None:
            rank = env_rank()
            if rank is None:
                rank = _dist_rank() or 0
            _guard = RankGuard(Path(root), rank, framework)
            import atexit

            atexit.register(_guard.close)
    return _guard


def peek() -> Optional[RankGuard]:
    """The guard if it is live in this process, without creating it."""
    return _guard if _guard is not None and _guard.pid == os.getpid() else None
