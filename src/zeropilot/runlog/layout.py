"""Every file name of a run directory, in one place."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

RUN_SCHEMA = "zeropilot.run/1"
HEAL_SCHEMA = "zeropilot.heal/1"
#: the line the watchdog writes into ``stacks-rank-N.txt`` before each dump it requests; a dump above the first such
#: line (or in a file without one) was not requested: the launcher's SIGTERM (``runlog.crash.terminated_ranks``)
STACKS_MARKER = "--- zeropilot: stacks requested at"

_NODE_RUN_FILE = re.compile(r"^run-node-[A-Za-z0-9._-]{1,96}\.json$")
_ATTEMPT_DIR = re.compile(r"^attempt-(\d{1,4})$")
_RANK_FILE = re.compile(r"^(rank|heartbeat-rank|oom-rank|stacks-rank)-(\d{1,6})\.(jsonl|json|txt)$")


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
        return self.root / f"rank-{rank}.jsonl"

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
        """Ranks that have a file of this kind (``rank``, ``heartbeat-rank``, ``oom-rank``, ``stacks-rank``)."""
        found = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        for name in names:
            m = _RANK_FILE.match(name)
            if m and m.group(1) == kind:
                found.append(int(m.group(2)))
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, _file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: Path, payload: Dict[str, Any]) -> None:
    """Write JSON to ``path`` atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=1, sort_keys=False, default=str) + "\n")
