"""The records a rank appends to ``rank-N.jsonl``, and the writer that appends them.

Every line is one JSON object with ``v`` (:data:`EVENT_VERSION`), ``event`` (one of :data:`EVENTS`),
``t`` (Unix time, seconds) and ``rank``. Memory is a flat object of :data:`MEMORY_FIELDS`, every value
in bytes (counts for ``alloc_retries`` / ``num_ooms``) or ``null`` where the device cannot tell
(a CPU run has only ``host_rss_bytes``).

The ``peak_*`` fields are the allocator's own peak counters as read, cumulative since whoever last
reset them: the guard never resets them (DeepSpeed's ``see_memory_usage`` does), so a reader takes
a window's peak from the counters' increase, see :func:`zeropilot.runlog.summary.window_peak`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

from zeropilot.runlog.layout import RunDir, live_rank

EVENT_VERSION = 1

#: start: the guard is live in this rank (pid, host, local_rank, world_size, device, framework,
#:        allocator_settings in force).
#: init: ``deepspeed.initialize`` returned (zero_stage, seconds, mem).
#: setup: what the rank trains, when first known and when it changed (model: config sizes, lora, params,
#:        gradient_checkpointing; zero: stage, offloads, buckets; train: micro_batch, grad_accum, world_size).
#: step: an optimizer step ended (step, seconds since the previous step ended, mem, and batch: the micro
#:        batches the model saw in it: micro_batches, micro_batch_size, seq_len (padded), tokens or null).
#: save / load: a checkpoint save or load ended (step, tag, path, bytes, seconds, phases[], mem_before,
#:        mem_peak, mem_after).
#: oom: an out-of-memory error on this rank (step, phase, request_bytes, file: the oom-rank-N.json; injected: true
#:        for an OOM injected by ``ZEROPILOT_INJECT_OOM``, :mod:`zeropilot.guard.inject`).
#: error: an exception left the training code (type, message, where: innermost frames last,
#:        peer_failure: true when the exception is this rank noticing a failed peer, e.g. gloo's
#:        "Connection reset by peer" or an aborted NCCL communicator: a consequence, not the first failure).
#: resume: a Trainer's ``train`` was given a checkpoint to resume from (path, given_by: ``zeropilot`` when the guard
#:        passed the one ``zeropilot run --heal`` chose, ``launch`` when the launch passed its own; value: a boolean
#:        ``resume_from_checkpoint`` as given; ours: the path zeropilot offered).
#: preempt: the rank took a stop request (``preempt.json``) at the end of optimizer step ``step``: it saves and stops
#:        (stop_step: the step asked for; late: the rank had passed it when it read the request).
#: end: the rank's interpreter is exiting normally (steps).
EVENTS = ("start", "init", "setup", "step", "save", "load", "oom", "error", "resume", "preempt", "end")

MEMORY_FIELDS = (
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "unallocated_reserved_bytes",  # reserved - allocated: free space inside segments PyTorch holds
    "alloc_retries",  # memory_stats num_alloc_retries: cache flushes under pressure
    "num_ooms",
    "device_free_bytes",  # mem_get_info
    "device_total_bytes",
    "outside_torch_bytes",  # total - free - reserved: context, BLAS workspaces, NCCL, other processes
    "host_rss_bytes",
)

#: a rank's live file is closed as a segment (``rank-N.seg-K.jsonl``) once it would grow past this; the supervisor
#: compacts closed segments (``runlog.compact``): a live file stays small for every reader that follows it
SEGMENT_BYTES = 4 << 20

#: Save and load phases, in the order they happen; a guard records the ones it can see.
PHASES = ("gather_16bit", "model_states", "optimizer_states", "write", "wait")


def event(kind: str, rank: int, **fields: Any) -> Dict[str, Any]:
    """A record of ``kind`` for ``rank``, stamped now."""
    if kind not in EVENTS:
        raise ValueError(f"unknown event {kind!r}")
    record: Dict[str, Any] = {"v": EVENT_VERSION, "event": kind, "t": time.time(), "rank": rank}
    record.update(fields)
    return record


def line(record: Dict[str, Any]) -> bytes:
    """A record as the writer appends it: one JSON line (compact separators; what JSON cannot hold as text)."""
    return (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")


class EventWriter:
    """Appends records to one rank's file; each record is one ``write`` of one whole line.

    ``O_APPEND`` and one write per line keep lines whole even when the process is killed between
    records; a reader drops at most a torn last line. A rank's live file (``rank-N.jsonl``) that would grow past
    ``segment_bytes`` is closed first: renamed to the rank's next segment (``rank-N.seg-K.jsonl``, a rename: readers
    that hold it read on to its end) and a new live file begun, so that what follows a run, and what the supervisor
    compacts, comes in pieces of bounded size. A file of another name is never renamed.
    """

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._rank = live_rank(self.path.name)
        self._fd: Optional[int] = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._fd = os.open(str(self.path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def write(self, record: Dict[str, Any]) -> None:
        if self._fd is None:
            return
        data = line(record)
        if self._rank is not None and self._size and self._size + len(data) > self.segment_bytes:
            self._close_segment()
        os.write(self._fd, data)
        self._size += len(data)

    def _close_segment(self) -> None:
        """Rename the live file to the rank's next segment and open a new one (a file another process moved or
        replaced meanwhile is left alone: writing goes on into a new live file)."""
        d = RunDir(self.path.parent)
        try:
            same = os.path.samestat(os.fstat(self._fd), os.stat(self.path))
        except OSError:
            same = False
        if same:
            try:
                os.rename(self.path, d.segment_jsonl(self._rank, d.next_segment(self._rank)))
            except OSError:
                return  # keep appending where we are: never lose a record over a rename
        os.close(self._fd)
        self._fd = None
        self._open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

