"""Run a launch unmodified with the guard in every rank; pass its exit status and signals through.

The command starts in its own process group (``start_new_session``) with the bootstrap first on
``PYTHONPATH`` and ``ZEROPILOT_RUN_DIR`` set; SIGINT / SIGHUP sent to ``zeropilot run`` go to the whole
group. SIGTERM and SIGUSR1 are a preemption (:mod:`zeropilot.runner.preempt`): ranks that can save at a step
are asked to, within a grace period; otherwise the signal goes to the group at once. The exit status is the
command's, or 128 + N when a signal N ended it.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from zeropilot.runlog.compact import Compactor, finish_quietly as compact_finish
from zeropilot.runlog.layout import RunDir, write_json_atomic
from zeropilot.runner import preempt
from zeropilot.runner.procs import kill_session
from zeropilot.runner.watchdog import PIPE_ENV, Watchdog

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "guard" / "bootstrap"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent
STOP_GRACE_S = 10.0
POLL_S = 0.5
_FORWARDED = (signal.SIGINT, signal.SIGHUP)


@dataclass
class RunOptions:
    """What ``zeropilot run`` was asked to do."""

    command: List[str]
    out: Path
    hang_timeout_s: float
    on_hang: str = "report"  # report | stop
    memory_history: bool = False
    world_size: Optional[int] = None
    torch_version: Optional[str] = None  # of the environment the launch runs in (run.json versions)
    run_file: Optional[Path] = None  # run.json's path, when not DIR/run.json (one node's file: run-node-K.json)
    timeouts_file: Optional[Path] = None  # learned timeouts read at start and kept (DIR/timeouts.json when None;
    # `run` names its own: a heal run's later attempts, copies of these options, share the first one's file)
    env: Dict[str, Optional[str]] = field(default_factory=dict)  # set for the launch (None: unset): --heal's
    preempt_grace_s: float = preempt.DEFAULT_GRACE_S  # after a preemption signal, the job's time to save and stop


def child_env(opts: RunOptions, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The launch's environment: the bootstrap on PYTHONPATH, the run directory, flight-recorder paths."""
    env = dict(os.environ if base is None else base)
    for key, value in opts.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    paths = [str(BOOTSTRAP_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(PACKAGE_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    d = RunDir(opts.out)
    env["ZEROPILOT_RUN_DIR"] = str(d.root)
    env["ZEROPILOT_PLAN_FILE"] = str(opts.run_file or d.run_file)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # fatal signals (SIGSEGV, SIGABRT) print stacks too
    # NCCL flight recorder: keep a trace, dump it into the run directory on timeout or on the pipe.
    # torch >= 2.8 reads TORCH_FR_* and warns on the older TORCH_NCCL_* names; older builds read only those.
    new = _torch_at_least(opts.torch_version, (2, 8))
    if not any(k in env for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")):
        env["TORCH_FR_BUFFER_SIZE" if new else "TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    if not any(k in env for k in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")):
        env["TORCH_FR_DUMP_TEMP_FILE" if new else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = d.flight_recorder_prefix
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    env.setdefault(PIPE_ENV, str(d.root / ".nccl-pipe-rank-"))
    if opts.memory_history:
        env["ZEROPILOT_MEMORY_HISTORY"] = "100000"
    if _top_is_rank(opts.command):
        env["ZEROPILOT_TOP_IS_RANK"] = str(os.getpid())  # the bootstrap checks its parent is us
    env[CARRIER_ENV] = carrier(env)
    return env


#: DeepSpeed's runner passes to other nodes (pdsh/ssh, MPI, Slurm) only variables named PYTHON*, MLFLOW*, MV2*,
#: UCX* and the accelerator's (NCCL* on CUDA): ``deepspeed/launcher/runner.py`` EXPORT_ENVS. This one carries the
#: guard's own variables there, base64 so that its unquoted ``export NAME=VALUE;`` keeps it whole; the bootstrap
#: restores them where they are unset (:mod:`zeropilot.guard.bootstrap`).
CARRIER_ENV = "PYTHON_ZEROPILOT_ENV"
_CARRIED = ("ZEROPILOT_RUN_DIR", "ZEROPILOT_PLAN_FILE", "ZEROPILOT_MEMORY_HISTORY", "ZEROPILOT_STACK_SIGNAL",
            "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT", PIPE_ENV)


def carrier(env: Dict[str, str]) -> str:
    """The value of :data:`CARRIER_ENV`: the guard's variables of ``env`` as urlsafe base64 JSON."""
    import base64
    import json

    payload = {k: env[k] for k in _CARRIED if k in env}
    return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()


def _top_is_rank(command: List[str]) -> bool:
    """``python train.py`` (no launcher): the process we start is the only rank."""
    name = os.path.basename(command[0]) if command else ""
    if not name.startswith("python"):
        return False
    rest = command[1:]
    return not (len(rest) >= 2 and rest[0] == "-m" and rest[1].split(".")[0] in ("torch", "deepspeed", "accelerate"))


def _torch_at_least(version: Optional[str], wanted: tuple) -> bool:
    """Whether a torch version string (``2.11.0+cu128``) is at least ``wanted``; unknown counts as new."""
    import re

    m = re.match(r"(\d+)\.(\d+)", version or "")
    return True if m is None else (int(m.group(1)), int(m.group(2))) >= wanted


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen) -> None:
    """End the job cleanly: SIGTERM to the group (ranks dump stacks, launchers forward), then SIGKILL."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.time() + STOP_GRACE_S
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_session(proc.pid)  # stragglers that left the launcher behind, and compilers in groups of their own


def _remove_pipes(prefix: str, root: Path) -> None:
    """The flight recorder's dump pipes (FIFOs PyTorch made at our prefix in the run directory): the job is over."""
    base = Path(prefix)
    if not prefix or base.parent != root:
        return  # a prefix the user set elsewhere: not ours to remove
    for path in root.glob(base.name + "*.pipe"):
        try:
            if stat.S_ISFIFO(path.lstat().st_mode):
                path.unlink()
        except OSError:
            pass


def _remove_left_locks(d: RunDir, env: Dict[str, str]) -> List[Dict]:
    """Op-build locks this job took and did not give back (its build was stopped): removed, and said so."""
    from zeropilot.guard.locks import remove_left
    from zeropilot.runner.watchdog import _alive

    deadline = time.time() + 2.0
    while time.time() < deadline and _session_alive(d, env):
        time.sleep(0.1)  # the group was SIGKILLed: let the kernel reap it before judging who is gone
    removed = remove_left(d.root, env, _alive)
    for lock in removed:
        print(f"zeropilot run: removed op-build lock {lock['path']} (age {lock['age_s']:.0f} s): this job's build of "
              f"{lock['op']} took it and was stopped before it gave it back", file=sys.stderr)
    return removed


def _session_alive(d: RunDir, env: Dict[str, str]) -> bool:
    from zeropilot.guard.locks import taken
    from zeropilot.runner.watchdog import _alive

    return any(_alive(rec.get("pid")) for rec in taken(d.root).values())


class _Preemption:
    """SIGTERM/SIGUSR1 while the job runs: a stop request to the ranks, or the signal at once (runner.preempt);
    across nodes, the stop request another node's supervisor published in the store, taken without a signal."""

    def __init__(self, d: RunDir, proc: subprocess.Popen, grace_s: float, dog: Optional[Watchdog] = None) -> None:
        self.d, self.proc, self.grace_s, self.dog = d, proc, grace_s, dog
        self.record: Optional[Dict] = None
        self.deadline: Optional[float] = None

    def _node(self) -> Optional[int]:
        return self.dog._me()["node_rank"] if self.dog is not None and self.dog.peers is not None else None

    def __call__(self, signum, _frame) -> None:
        if self.record is not None and self.record.get("signalled", True):  # a second signal: no more waiting
            _signal_group(self.proc.pid, signum)
            return
        peers = self.dog.peers if self.dog is not None else None
        self.record = dict(preempt.request(self.d.root, signum, self.grace_s, peers, self._node()), signalled=True)
        name = signal.Signals(signum).name
        if self.record["stop_step"] is None:
            print(f"zeropilot run: {name}: {self.record['why']}", file=sys.stderr, flush=True)
            _signal_group(self.proc.pid, signum)
            return
        self.deadline = time.time() + self.grace_s
        shared = self.record.get("shared")
        where = "" if not shared else (" on every node (published in the job's store)" if shared["own"] else
                                       f" on every node (node {shared['by_node']}'s stop request, in the store)")
        print(f"zeropilot run: {name}: every rank saves at the end of step {self.record['stop_step']}{where} and "
              f"stops (within {self.grace_s:g} s; the same signal again stops it now)", file=sys.stderr, flush=True)

    def poll(self) -> None:
        peers = self.dog.peers if self.dog is not None else None
        if self.record is None and peers is not None and peers.stop is not None:
            self.record = dict(preempt.adopt(self.d.root, peers.stop, self.grace_s, peers, self._node()),
                               signalled=False)
            if self.record["stop_step"] is not None:
                self.deadline = time.time() + self.grace_s
                print(f"zeropilot run: node {self.record['shared']['by_node']} was preempted "
                      f"({self.record['signal']}): every rank saves at the end of step {self.record['stop_step']} "
                      f"and stops (within {self.grace_s:g} s)", file=sys.stderr, flush=True)
            else:
                print(f"zeropilot run: {self.record['why']}", file=sys.stderr, flush=True)
        if self.deadline is not None and time.time() > self.deadline and self.proc.poll() is None:
            self.deadline = None
            self.record["why"] = f"the job did not save and stop within {self.grace_s:g} s: stopped"
            print(f"zeropilot run: {self.record['why']}", file=sys.stderr, flush=True)
            _stop(self.proc)

    def outcome(self) -> Optional[Dict]:
        if self.record is None:
            return None
        from zeropilot.runlog import read_run

        try:
            records = read_run(self.d.root)
        except Exception:  # noqa: BLE001 - the record stands without the ranks' side
            return self.record
        return preempt.outcome(self.d.root, self.record, {r: rec.events for r, rec in records.ranks.items()})


def supervise(opts: RunOptions, run_record: Dict) -> Dict:
    """Run the command to its end; returns run.json as written at the end."""
    d = RunDir(opts.out)
    run_file = opts.run_file or d.run_file
    write_json_atomic(run_file, run_record)
    env = child_env(opts)
    proc = subprocess.Popen(opts.command, env=env, start_new_session=True)
    previous = {}

    def forward(signum, _frame):
        _signal_group(proc.pid, signum)

    dog = Watchdog(d.root, opts.hang_timeout_s, opts.on_hang, opts.world_size, env, session=proc.pid,
                   plan=run_record.get("plan"), timeouts_file=opts.timeouts_file)
    preemption = _Preemption(d, proc, opts.preempt_grace_s, dog)
    for sig in _FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    for sig in preempt.SIGNALS:
        previous[sig] = signal.signal(sig, preemption)
    compactor = Compactor(d.root)  # closed segments of the ranks' records into columns (runlog.compact)
    told: set = set()
    hang = None
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            preemption.poll()
            fired = dog.poll()
            for folder, b in dog.builds.items():
                if folder not in told:
                    told.add(folder)
                    print(f"zeropilot run: op build in progress ({b['op']}: {', '.join(b['compilers'][:3])}): "
                          "progress, not a hang; the watchdog waits for it", file=sys.stderr)
            if fired is not None:
                hang = fired
                print(f"zeropilot run: hang: {fired['verdict']['cause']} (see {d.hang_file})", file=sys.stderr)
                if opts.on_hang == "stop":
                    dog.linger()  # the other nodes take the verdict before this node's store may end
                    _stop(proc)
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            _stop(proc)
        if dog.peers is not None:
            dog.settle()  # one verdict on every node, also when this node's could not be published
            dog.peers.close()
        dog.close()
    kill_session(proc.pid)  # nothing of the job outlives zeropilot run
    compactor.stop()
    compact_finish(d.root)  # this machine's ranks are gone: their last segments compacted too
    _remove_pipes(env.get(PIPE_ENV, ""), d.root)
    removed = _remove_left_locks(d, env)
    record = dict(run_record)
    record["locks_removed"] = removed
    record["builds"] = [dict(b, seconds=round(b["last_t"] - b["first_t"], 1)) for b in dog.builds.values()]
    record["ended_at"] = time.time()
    record["exit_code"] = code if code >= 0 else 128 - code
    record["signal"] = signal.Signals(-code).name if code < 0 else None
    record["stopped_on_hang"] = bool(hang and opts.on_hang == "stop")
    record["store"] = dog.peers.summary() if dog.peers is not None else None
    record["preempted"] = preemption.outcome()
    write_json_atomic(run_file, record)
    return record
