"""Every file name of a run directory, in one place."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

RUN_SCHEMA = "zeropilot.run/1"
HEAL_SCHEMA = "zeropilot.heal/1"
#: the line the watchdog writes into ``stacks-rank-N.txt`` before each dump it requests; a dump above the first such
#: line (or in a file without one) was not requested: the launcher's SIGTERM (``runlog.crash.terminated_ranks``)
STACKS_MARKER = "--- zeropilot: stacks requested at"

_NODE_RUN_FILE = re.compile(r"^run-node-[A-Za-z0-9._-]{1,96}\.json$")
_ATTEMPT_DIR = re.compile(r"^attempt-(\d{1,4})$")
_RANK_FILE = re.compile(r"^(rank|heartbeat-rank|oom-rank|stacks-rank)-(\d{1,6})\.(jsonl|json|txt)$")
#: a closed segment of a rank's records: ``rank-N.seg-K.jsonl`` as the writer closed it, ``rank-N.seg-K.col`` once
#: the supervisor compacted it, ``rank-N.seg-K-L.col`` segments K to L compacted into one (``runlog.compact``)
_SEGMENT_FILE = re.compile(r"^rank-(\d{1,6})\.seg-(\d{1,9})(?:-(\d{1,9}))?\.(jsonl|col)$")


def live_rank(name: str) -> Optional[int]:
    """The rank whose live file (``rank-N.jsonl``) this name is, else None."""
    m = _RANK_FILE.match(name)
    return int(m.group(2)) if m and m.group(1) == "rank" and m.group(3) == "jsonl" else None


@dataclass(frozen=True)
class Segment:
    """One closed segment of a rank's records (or several compacted into one file: ``seq`` to ``last``): they are
    read in this order, before the rank's live ``rank-N.jsonl``. Its files: the JSON lines as closed, the compacted
    columns, or both for a moment (a compaction wrote its file and has not removed the lines yet); ``covered``: the
    files of the segments a merged file holds, while they are still there (a merge stopped before removing them)."""

    seq: int
    jsonl: Optional[Path]
    col: Optional[Path]
    last: Optional[int] = None
    covered: Tuple["Segment", ...] = ()

    @property
    def end(self) -> int:
        return self.seq if self.last is None else self.last


@dataclass(frozen=True)
class RunDir:
    """A run directory and the names of the files in it."""

    root: Path

    @property
    def run_file(self) -> Path:
        return self.root / "run.json"

    def node_run_file(self, key: str) -> Path:
        """``run.json`` of one node's supervisor when each node of a job runs its own ``zeropilot run`` (so that
        nodes sharing one directory do not overwrite each other's): ``run-node-<node rank>.json``."""
        return self.root / f"run-node-{key}.json"

    def node_run_files(self, limit: int = 4096) -> List[Path]:
        """The ``run-node-*.json`` files here, by name (at most ``limit``)."""
        try:
            names = sorted(n for n in os.listdir(self.root) if _NODE_RUN_FILE.match(n))
        except OSError:
            return []
        return [self.root / n for n in names[:limit]]

    @property
    def heal_file(self) -> Path:
        """``zeropilot run --heal``'s record of every attempt (schema :data:`HEAL_SCHEMA`), in the first attempt's
        directory: the heal run's root."""
        return self.root / "heal.json"

    def attempt_dir(self, attempt: int) -> Path:
        """The run directory of attempt ``attempt`` of a heal run: the root itself for the first, else
        ``attempt-K`` inside it (each a whole run directory that ``zeropilot report`` reads)."""
        return self.root if attempt <= 1 else self.root / f"attempt-{attempt}"

    @staticmethod
    def attempt_of(name: str) -> Optional[int]:
        """The attempt number of a folder name ``attempt-K``, else None."""
        m = _ATTEMPT_DIR.match(name)
        return int(m.group(1)) if m else None

    @property
    def launch_copies(self) -> Path:
        """Where a heal run writes the copies of the launch's files it changed (a fix): never the user's files."""
        return self.root / "launch"

    @property
    def universal(self) -> Path:
        """Where a heal run that restarts on fewer nodes writes the universal conversion of the checkpoint it
        resumes from (``zeropilot ckpt universal``'s layout): never the job's own checkpoint folder."""
        return self.root / "universal"

    @property
    def preempt_file(self) -> Path:
        """Written by the supervisor on SIGTERM/SIGUSR1: the step at which every rank saves and stops
        (``stop_step``), read by each rank's guard at the end of every optimizer step."""
        return self.root / "preempt.json"

    @property
    def hang_file(self) -> Path:
        return self.root / "hang.json"

    @property
    def timeouts_file(self) -> Path:
        """The sections' measured durations, from which the watchdog learns its deadlines (``runlog.timeouts``);
        kept across attempts in one run directory and read by a later run with ``--timeouts-from``."""
        return self.root / "timeouts.json"

    def events(self, rank: int) -> Path:
        """Rank N's live records: the file its guard appends to (the newest segment)."""
        return self.root / f"rank-{rank}.jsonl"

    def segment_jsonl(self, rank: int, seq: int) -> Path:
        """Closed segment ``seq`` of rank N's records, as the writer closed it (renamed from ``rank-N.jsonl``)."""
        return self.root / f"rank-{rank}.seg-{seq:06d}.jsonl"

    def segment_col(self, rank: int, seq: int, last: Optional[int] = None) -> Path:
        """Closed segment ``seq`` of rank N's records compacted into columns (``runlog.segments``); with ``last``,
        segments ``seq`` to ``last`` in one file."""
        return self.root / (f"rank-{rank}.seg-{seq:06d}.col" if last is None else
                            f"rank-{rank}.seg-{seq:06d}-{last:06d}.col")

    def segments(self, names: Optional[List[str]] = None) -> Dict[int, List[Segment]]:
        """Rank -> its closed segments in order (``names``: the folder's listing, when the caller has it). A file
        holding segments K to L stands for them (their own files, if still there, are its ``covered``)."""
        if names is None:
            try:
                names = os.listdir(self.root)
            except OSError:
                return {}
        single: Dict[int, Dict[int, Dict[str, Path]]] = {}
        merged: Dict[int, List[Tuple[int, int, Path]]] = {}
        for name in names:
            m = _SEGMENT_FILE.match(name)
            if not m:
                continue
            rank, seq = int(m.group(1)), int(m.group(2))
            if m.group(3) is None:
                single.setdefault(rank, {}).setdefault(seq, {})[m.group(4)] = self.root / name
            elif m.group(4) == "col" and int(m.group(3)) >= seq:
                merged.setdefault(rank, []).append((seq, int(m.group(3)), self.root / name))
        out: Dict[int, List[Segment]] = {}
        for rank in sorted(single.keys() | merged.keys()):
            own = {k: Segment(k, f.get("jsonl"), f.get("col")) for k, f in single.get(rank, {}).items()}
            found: List[Segment] = []
            upto = 0
            for a, b, path in sorted(merged.get(rank, []), key=lambda x: (x[0], -x[1])):
                if a > upto:  # the widest file first; one overlapping a file taken already is left out
                    found.append(Segment(a, None, path, b, tuple(own.pop(k) for k in range(a, b + 1) if k in own)))
                    upto = b
            found += own.values()
            out[rank] = sorted(found, key=lambda x: x.seq)
        return out

    def next_segment(self, rank: int, names: Optional[List[str]] = None) -> int:
        """The number the next closed segment of rank N takes."""
        segs = self.segments(names).get(rank, [])
        return max(s.end for s in segs) + 1 if segs else 1

    def heartbeat(self, rank: int) -> Path:
        return self.root / f"heartbeat-rank-{rank}.json"

    def oom(self, rank: int) -> Path:
        return self.root / f"oom-rank-{rank}.json"

    def stacks(self, rank: int) -> Path:
        return self.root / f"stacks-rank-{rank}.txt"

    def memory_snapshot(self, rank: int) -> Path:
        """A ``torch.cuda.memory._dump_snapshot`` pickle that opens in PyTorch's memory_viz."""
        return self.root / f"memory-snapshot-rank-{rank}.pickle"

    def flight_recorder(self, rank: int) -> Path:
        """Where the NCCL flight recorder dumps rank N (``TORCH_FR_DUMP_TEMP_FILE`` prefix + rank)."""
        return self.root / f"nccl-trace-rank-{rank}"

    @property
    def flight_recorder_prefix(self) -> str:
        return str(self.root / "nccl-trace-rank-")

    def gloo_trace(self, rank: int) -> Path:
        """Where a rank's guard writes its own flight recorder (gloo) when the watchdog asks (``fr_request``)."""
        return self.root / f"fr-trace-rank-{rank}"

    @property
    def fr_request(self) -> Path:
        """Touched by the watchdog: each rank's heartbeat thread then dumps its flight recorder (``gloo_trace``)."""
        return self.root / ".fr-request"

    @property
    def build_locks(self) -> Path:
        """Op-build locks taken and given back by the job's processes (``guard.locks.note``), one JSON line each."""
        return self.root / "build-locks.jsonl"

    def ranks(self, kind: str = "rank") -> List[int]:
        """Ranks that have a file of this kind (``rank``, ``heartbeat-rank``, ``oom-rank``, ``stacks-rank``); for
        ``rank``, a live file or a closed segment."""
        found = set()
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        for name in names:
            m = _RANK_FILE.match(name)
            if m and m.group(1) == kind:
                found.add(int(m.group(2)))
            elif kind == "rank" and name.endswith((".jsonl", ".col")):
                m = _SEGMENT_FILE.match(name)
                if m:
                    found.add(int(m.group(1)))
        return sorted(found)


def _file_mode() -> int:
    """0o666 less this process's umask, read from ``/proc`` (``os.umask`` can only be read by setting it, a race
    in the ranks' threads); 0o644 where ``/proc`` does not say."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def write_text_atomic(path: Path, text: str, mode: Optional[int] = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: never half a file.

    Args:
        path: the file; its folder is created when missing.
        text: written as UTF-8.
        mode: permission bits for the file (``None``: what ``open`` would give, 0o666 less the umask; ``mkstemp``
            alone would make every run file private (0o600) beside the 0o644 of the files appended in place).

    Raises:
        OSError: the folder, the temporary file or the rename failed; no temporary file is left behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, text.encode("utf-8"), _file_mode() if mode is None else mode, durable=False)


def _replace(path: Path, data: bytes, mode: int, durable: bool) -> None:
    """``data`` into a temporary file beside ``path`` (synced to disk when ``durable``), then renamed over it; on any
    failure the temporary file is removed and the old state stands."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_bytes_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, ``fsync`` and a rename, then ``fsync`` the folder: once
    this returns the file is whole on disk, and until it does the old state stands (a compacted segment is written
    so before the lines it replaces are removed).

    Raises:
        OSError: the write, the sync or the rename failed; no temporary file is left behind.
    """
    _replace(path, data, _file_mode(), durable=True)
    try:
        dir_fd = os.open(str(path.parent), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_json_atomic(path: Path, payload: Dict[str, Any]) -> None:
    """Write JSON to ``path`` atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=1, sort_keys=False, default=str) + "\n")
