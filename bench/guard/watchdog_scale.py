"""The cross-node watchdog at scale, simulated: stand-in ranks on simulated nodes, one real c10d store.

    python bench/guard/watchdog_scale.py --nodes 128 --ranks-per-node 8 --out bench/guard/results/watchdog_scale_128x8.json

What runs (issue 41, item 4):

- one ``TCPStore`` server in a process of its own (as torchrun's agent serves it on the master node);
- ``--workers`` processes, each hosting some of the simulated nodes. A node is a run directory of its own, its
  stand-in ranks and the node's watchdog: :class:`zeropilot.runner.watchdog.Watchdog`, the code ``zeropilot run``
  polls every ``supervisor.POLL_S`` on each node, polled from a thread of its own at that rate, with its store
  reader (a thread of the watchdog's own);
- a stand-in rank is a real :class:`zeropilot.guard.rank.RankGuard` (its heartbeat file, its ``rank-N.jsonl``
  records, its :class:`~zeropilot.guard.storebeat.StoreBeat` publisher on a store client of its own) started
  without threads (``threads=False``): one clock thread per worker calls, for every rank, what the guard's two
  threads call (``RankGuard.tick`` every ``rank.BEAT_S``, ``StoreBeat.publish`` every ``storebeat.STORE_BEAT_S``)
  and walks it through a step's phases (``forward`` in the model's code, ``backward`` waiting in an all-reduce,
  ``step``) on a shared clock, one step every ``--period`` seconds, with no torch model or tensor. The guard's own
  code writes and publishes everything. A rank's main thread is one of three parked threads of the worker, one per
  phase (:class:`Poses`): real Python frames of functions compiled under the file names a training job has
  (``train.py``, ``model.py``, ``torch/distributed/distributed_c10d.py``), so the verdict reads them as it reads a
  real rank's. The worker answers the watchdog's stack request (the marker the watchdog appends to
  ``stacks-rank-N.txt``, then its signal) with each rank's main thread in faulthandler's format. A rank costs its
  worker 0.22-0.24 ms of CPU a second at 128 × 8 (the heartbeat file's rename most of it; the run directories go to
  ``/dev/shm`` when there is one, as a node's own disk: a rename on this machine's ext4 cost 3 times more).

Scenarios: every rank steps for ``--learn-steps`` steps (the step's deadline is learned from the records, as in a
real run); then at step K the culprit (``--culprit``, rank 517 on node 64 at full size) stops: ``hang``: it stays in
its model's forward (its heartbeat thread and publisher go on, as a rank's do when its main thread is stuck), and
``die``: its process is gone (its heartbeat names a pid that is not alive, its publisher stops without a last
beat). Every other rank waits in the step's all-reduce, as they would for a missing peer.

Measured: the store's load (client side: every call of every client counted by name, with the keys and bytes it
moved; server side: the server process's CPU time from ``/proc``); the latency of a ``set`` + ``get`` of a probe
client every 50 ms with the store idle, under the steady load and while the nodes judge; the time from the culprit
stopping to each node's verdict (its ``hang.json``) against the learned deadline the verdict states; and the culprit
each of the nodes names.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

TARGET_MARGIN_S = 10.0  # issue 41: a verdict within the learned deadline + 10 s
PROBE_S = 0.05

# -- the stand-in's code, under the file names of a training job -------------------------------------------------

_C10D = '''
def all_reduce(park):
    return park()
'''
_MODEL = '''
def forward(park):
    return park()
'''
_TRAIN = '''
def train_step(pose, forward, all_reduce, park):
    if pose == "forward":
        return forward(park)
    if pose == "backward":
        return all_reduce(park)
    return optimizer_step(park)


def optimizer_step(park):
    return park()
'''


def _compiled(source: str, filename: str, name: str):
    scope: Dict[str, Any] = {}
    exec(compile(source, filename, "exec"), scope)  # noqa: S102 - our own constant source, for its frames' names
    return scope[name]


all_reduce = _compiled(_C10D, "/sim/site-packages/torch/distributed/distributed_c10d.py", "all_reduce")
forward = _compiled(_MODEL, "/sim/job/model.py", "forward")
train_step = _compiled(_TRAIN, "/sim/job/train.py", "train_step")


def _frames_text(ident: int) -> str:
    """The thread's frames as faulthandler writes one thread (most recent call first)."""
    frame = sys._current_frames().get(ident)
    lines = [f"Thread 0x{ident:016x} (most recent call first):"]
    while frame is not None:
        lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
        frame = frame.f_back
    return "\n".join(lines) + "\n\n"


class Poses:
    """One parked thread per place a rank's main thread is in a step: ``forward`` (the model's code), ``backward``
    (waiting in an all-reduce), ``step`` (the optimizer): real Python frames under a training job's file names. A
    stand-in rank's main thread is the pose of its phase (its guard's ``main_ident``), so the guard samples, publishes
    and dumps the frames a rank in that phase has, without a thread of its own."""

    NAMES = ("forward", "backward", "step")

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.idents: Dict[str, int] = {}
        for name in self.NAMES:
            t = threading.Thread(target=train_step, args=(name, forward, all_reduce, self.stop.wait),
                                 name=f"pose-{name}", daemon=True)
            t.start()
            self.idents[name] = t.ident
        time.sleep(0.1)  # parked


# -- counting every store call of this process ---------------------------------------------------------------------

class Counts:
    """Calls, keys and bytes per store operation, for every client this process opens."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter = Counter()
        self.keys: Counter = Counter()
        self.bytes: Counter = Counter()

    def add(self, op: str, keys: int, size: int) -> None:
        with self.lock:
            self.calls[op] += 1
            self.keys[op] += keys
            self.bytes[op] += size

    def snapshot(self) -> Dict[str, Dict[str, int]]:
        with self.lock:
            return {"calls": dict(self.calls), "keys": dict(self.keys), "bytes": dict(self.bytes)}


def _size(value: Any) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 0


class CountingStore:
    """A TCPStore client that counts what it is asked (keys, and bytes sent and received)."""

    def __init__(self, store: Any, counts: Counts) -> None:
        self._store, self._counts = store, counts

    def __getattr__(self, op: str):
        fn = getattr(self._store, op)

        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            keys = len(args[0]) if args and isinstance(args[0], list) else 1
            self._counts.add(op, keys, _size(args[1:]) + _size(out))
            return out
        return call


def count_connections(counts: Counts) -> None:
    """Every store client of the guard and the watchdog (``storebeat.connect``) counts its calls in ``counts``."""
    from zeropilot.guard import storebeat

    real = storebeat.connect

    def connect(addr, timeout_s: float = storebeat.CONNECT_TIMEOUT_S):
        return CountingStore(real(addr, timeout_s), counts)

    storebeat.connect = connect


# -- a stand-in rank ------------------------------------------------------------------------------------------------

def _guard_class():
    from zeropilot.guard.rank import RankGuard

    class Guard(RankGuard):
        """The guard as it is, but for faulthandler: one process holds many ranks, each answers for itself."""

        def _install_stack_dump(self) -> None:
            pass

    return Guard


class StandIn:
    """One rank, without a thread: the worker's :class:`Clock` walks it through a step's phases on the shared clock
    and calls its guard's own beats (``RankGuard.tick`` every ``rank.BEAT_S``, ``StoreBeat.publish`` every
    ``storebeat.STORE_BEAT_S``), as the guard's two threads would."""

    def __init__(self, node: "SimNode", rank: int, local: int, cfg: Dict[str, Any], poses: Poses) -> None:
        self.node, self.rank, self.cfg, self.poses = node, rank, cfg, poses
        env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(cfg["world"]),
               "LOCAL_WORLD_SIZE": str(cfg["ranks_per_node"]), "GROUP_RANK": str(node.index),
               "GROUP_WORLD_SIZE": str(cfg["nodes"]), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(cfg["port"])}
        self.guard = _Guard(node.dir, rank, "sim", host=node.host, env=env, threads=False)
        self.guard.main_ident = poses.idents["step"]
        self.guard.record("init")
        self.step_no = 0
        self.stacks_size = 0
        self.stopped_at: Optional[float] = None
        self.dead = False

    def _pose(self, phase: str) -> None:
        self.guard.set_phase(phase)
        self.guard.main_ident = self.poses.idents[phase]

    def walk(self, now: float) -> Optional[float]:
        """The step's next phase (forward 0.3, backward in the all-reduce 0.3, optimizer step 0.2 of the period, then
        the step's end); returns when the one after is due, None when the rank is stuck or gone."""
        cfg, g = self.cfg, self.guard
        period, stop = cfg["period"], cfg["stop_step"]
        start = cfg["t0"] + self.step_no * period
        if g.phase == "forward":
            self._pose("backward")
            return None if self.step_no >= stop else start + 0.6 * period  # the culprit never arrives: it waits
        if g.phase == "backward":
            self._pose("step")
            return start + 0.8 * period
        if g.phase == "step":
            g.step_ended(self.step_no)
            return start + period
        self.step_no += 1
        if self.rank == cfg["culprit"] and self.step_no >= stop:
            self._pose("forward")
            self.stopped_at = time.time()
            if cfg["scenario"] == "die":  # its process is gone in the forward: the pid its heartbeat names is dead
                g.pid = cfg["dead_pid"]
                g.beat(force=True)  # (the guard's threads see the pid is not theirs and stop: no last beat)
                self.dead = True
                return None
            return None  # stuck in the model's code; its heartbeat thread and publisher go on
        self._pose("forward")
        return start + period + 0.3 * period

    def tick(self, now: float) -> Optional[float]:
        """The guard's heartbeat thread: the same loop, the same stop (a pid not its own)."""
        if os.getpid() != self.guard.pid:
            return None
        self.guard.tick()
        return now + self.cfg["beat_s"]

    def publish(self, now: float) -> Optional[float]:
        """The guard's store publisher: the same loop, the same stop."""
        beat = self.guard.store_beat
        if beat is None or os.getpid() != self.guard.pid or beat._stop.is_set():
            return None
        beat.publish()
        return now + self.cfg["store_beat_s"]

    def answer_stacks(self) -> None:
        """The watchdog asked for this rank's stacks (a marker appended to its file): its main thread's frames."""
        if self.dead:
            return  # a dead rank answers nothing
        path = self.guard.dir.stacks(self.rank)
        try:
            size = path.stat().st_size
        except OSError:
            return
        if size == self.stacks_size:
            return
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(_frames_text(self.guard.main_ident))
        self.stacks_size = path.stat().st_size


class Clock:
    """The worker's one thread that drives all its stand-in ranks: a heap of (time, what), each call returning when
    it is due again. How late each call ran is kept: a clock that falls behind is a machine that cannot keep up."""

    def __init__(self) -> None:
        self.heap: List[tuple] = []
        self.lock = threading.Lock()
        self.n = 0
        self.late: List[float] = []
        self.stop = threading.Event()
        self.cpu_s = 0.0
        self.thread = threading.Thread(target=self.run, name="clock", daemon=True)

    def add(self, t: float, fn) -> None:
        with self.lock:
            self.n += 1
            heapq.heappush(self.heap, (t, self.n, fn))

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                t, _, fn = self.heap[0] if self.heap else (float("inf"), 0, None)
                now = time.time()
                if t <= now:
                    heapq.heappop(self.heap)
            if t > now:
                self.stop.wait(min(t - now, 0.05))
                continue
            self.late.append(now - t)
            due = fn(now)
            if due is not None:
                self.add(due, fn)
            self.cpu_s = time.thread_time()

    def lateness(self) -> Dict[str, Any]:
        xs = sorted(self.late)
        if not xs:
            return {}
        return {"calls": len(xs), "p50_ms": round(1e3 * xs[len(xs) // 2], 1),
                "p99_ms": round(1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))], 1), "max_ms": round(1e3 * xs[-1], 1)}


# -- a simulated node: its run directory, its ranks, its watchdog ----------------------------------------------------

class SimNode:
    def __init__(self, index: int, cfg: Dict[str, Any], out: Path, poses: Poses) -> None:
        self.index, self.cfg = index, cfg
        self.host = f"sim-node-{index:03d}"
        self.dir = out / f"node-{index:03d}"
        self.dir.mkdir(parents=True, exist_ok=True)
        per = cfg["ranks_per_node"]
        self.ranks = [StandIn(self, index * per + i, i, cfg, poses) for i in range(per)]
        self.verdict: Optional[Dict[str, Any]] = None
        self.verdict_t: Optional[float] = None
        self.dog = None
        self.thread = threading.Thread(target=self.watch, name=f"watchdog-{index}", daemon=True)

    def boot(self) -> None:
        """The node's watchdog, polled once: its store reader starts (and connects) before the steps do."""
        from zeropilot.runner.watchdog import Watchdog

        self.dog = Watchdog(self.dir, self.cfg["hang_timeout"], "report", None, {})
        self.dog.host = self.host
        self.dog.poll()

    def connected(self) -> bool:
        p = self.dog.peers if self.dog is not None else None
        return p is not None and p.answered is not None and p._spare is not None

    def watch(self) -> None:
        """What ``zeropilot run``'s loop does with its watchdog on each node: ``poll`` every ``POLL_S``."""
        from zeropilot.runner.supervisor import POLL_S

        while self.verdict is None and time.time() < self.cfg["end_by"]:
            time.sleep(POLL_S)
            fired = self.dog.poll()
            if fired is not None:
                self.verdict_t, self.verdict = time.time(), fired
                self.dog.settle()

    def result(self) -> Dict[str, Any]:
        v = self.verdict or {}
        inner = v.get("verdict") or {}
        return {"node": self.index, "verdict_t": self.verdict_t, "class": inner.get("class"),
                "culprits": inner.get("ranks"), "timeout_s": v.get("timeout_s"),
                "deadline": v.get("deadline"), "named_by": (v.get("named_by") or {}).get("node_rank"),
                "stopped_at": max((r.stopped_at or 0) for r in self.ranks) or None}


def thread_cpu() -> Dict[str, float]:
    """CPU seconds of this process's threads by role (``clock``: the stand-in ranks; ``watchdog``: the nodes'
    ``poll``; ``reader``: the watchdogs' store readers; ``other``), from ``/proc/self/task/*/schedstat``
    (nanoseconds: ``stat``'s ticks of 10 ms round a reader's few milliseconds to nothing)."""
    out: Counter = Counter()
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as fh:
                ns = int(fh.read().split()[0])
        except (OSError, TypeError, ValueError, IndexError):
            continue
        role = ("clock" if t.name == "clock" else "watchdog" if t.name.startswith("watchdog-")
                else "reader" if t.name == "zeropilot-peers" else "other")
        out[role] += ns / 1e9
    out["process"] = cpu_seconds(os.getpid())
    return {k: round(v, 4) for k, v in out.items()}


def _store_beat_period(seconds: float) -> None:
    """The store heartbeat's period, and the readers' periods and delays derived from it (``--store-beat-s``)."""
    from zeropilot.guard import storebeat
    from zeropilot.runner import peers

    if seconds == storebeat.STORE_BEAT_S:
        return
    scale = seconds / storebeat.STORE_BEAT_S
    storebeat.STORE_BEAT_S = seconds
    for name in ("SILENT_JUDGED_S", "RELAY_GRACE_S"):
        setattr(peers, name, getattr(peers, name) * scale)


def worker(cfg: Dict[str, Any]) -> None:
    """One process hosting nodes ``cfg['first']`` to ``cfg['last']``: runs them to their verdicts, writes results."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    import torch.distributed as dist

    counts = Counts()
    count_connections(counts)
    _store_beat_period(cfg["store_beat_s"])
    # the guard publishes once the rank's process group is up: a group of one stands for it
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    out = Path(cfg["out"])
    global _Guard
    _Guard = _guard_class()
    poses = Poses()
    nodes = [SimNode(i, cfg, out, poses) for i in range(cfg["first"], cfg["last"])]
    ranks = [r for n in nodes for r in n.ranks]
    # the guard's beats run from here on; each watchdog's reader starts and connects before the step clock does: a
    # c10d connect holds its process's Python lock while it waits, 5 s at times on a loaded machine
    for r in ranks:
        r.guard.store_beat.publish()  # its first beat, and its connection
    clock = Clock()
    for i, r in enumerate(ranks):  # the beats spread over their period, as independent processes' are
        offset = i / len(ranks)
        clock.add(time.time() + offset * cfg["beat_s"], r.tick)
        clock.add(time.time() + offset * cfg["store_beat_s"], r.publish)
    clock.thread.start()
    for n in nodes:
        n.boot()
    end = time.time() + 300
    while time.time() < end and not all(n.connected() for n in nodes):
        time.sleep(0.2)
    Path(cfg["out"], f"ready-{cfg['first']}").touch()
    while not os.path.exists(cfg["go"]):  # the steps start once every worker is ready
        time.sleep(0.05)
    cfg.update(json.loads(Path(cfg["go"]).read_text()))
    clock.late.clear()
    for r in ranks:
        clock.add(cfg["t0"] + cfg["period"], r.walk)
    asked = threading.Event()
    signal.signal(signal.SIGUSR2, lambda *_: asked.set())  # the watchdog's stack signal reaches this process
    for n in nodes:
        n.thread.start()
    samples = []
    next_sample = time.time()
    steady = (cfg["t0"] + 3 * cfg["period"], cfg["t0"] + cfg["stop_step"] * cfg["period"] - 0.1)
    cpu: Dict[str, Any] = {}
    while time.time() < cfg["end_by"] and any(n.verdict is None for n in nodes):
        if asked.wait(0.1):
            asked.clear()
            for r in ranks:
                r.answer_stacks()
        now = time.time()
        if now >= next_sample:
            samples.append({"t": now, **counts.snapshot()})
            next_sample += 1.0
        for mark, t in (("from", steady[0]), ("to", steady[1])):
            if mark not in cpu and now >= t:
                cpu[mark] = {"t": now, **thread_cpu()}
    time.sleep(cfg.get("linger_s", 5.0))  # the others take the verdict while this one still answers
    samples.append({"t": time.time(), **counts.snapshot()})
    clock.stop.set()
    result = {"nodes": [n.result() for n in nodes], "samples": samples, "ranks": len(ranks),
              "culprit_stopped_at": next((r.stopped_at for r in ranks if r.stopped_at), None),
              "clock_late": clock.lateness(), "cpu": cpu}
    Path(cfg["result"]).write_text(json.dumps(result), encoding="utf-8")
    os._exit(0)  # daemon threads blocked in store calls: no interpreter teardown


# -- the store, the probe, the controller ------------------------------------------------------------------------------

def serve(port_file: str) -> None:
    """The job's store: a TCPStore server (libuv, as torchrun's agent serves it) until killed."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    Path(port_file + ".tmp").write_text(str(store.port))
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Probe:
    """A client of its own: a ``set`` and a ``get`` every :data:`PROBE_S`, each round timed."""

    def __init__(self, port: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        self.samples: List[tuple] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(PROBE_S):
            t0 = time.perf_counter()
            self.store.set("probe", "x" * 200)
            self.store.get("probe")
            self.samples.append((time.time(), time.perf_counter() - t0))

    def between(self, a: float, b: float) -> Optional[Dict[str, float]]:
        xs = sorted(d for t, d in self.samples if a <= t < b)
        if not xs:
            return None
        return {"n": len(xs), "p50_ms": round(xs[len(xs) // 2] * 1e3, 3),
                "p99_ms": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3, 3),
                "max_ms": round(xs[-1] * 1e3, 3)}


def _rates(samples: List[Dict[str, Any]], a: float, b: float) -> Dict[str, Any]:
    """Calls, keys and bytes per second between times ``a`` and ``b`` (summed over the workers' samples)."""
    inside = [s for s in samples if a <= s["t"] <= b]
    out: Dict[str, Any] = {"calls_per_s": Counter(), "keys_per_s": Counter(), "bytes_per_s": Counter()}
    by_worker: Dict[int, List[Dict[str, Any]]] = {}
    for s in inside:
        by_worker.setdefault(s["worker"], []).append(s)
    for ws in by_worker.values():
        first, last = ws[0], ws[-1]
        span = last["t"] - first["t"]
        if span <= 0:
            continue
        for what, name in (("calls", "calls_per_s"), ("keys", "keys_per_s"), ("bytes", "bytes_per_s")):
            for op, n in last[what].items():
                out[name][op] += (n - first[what].get(op, 0)) / span
    return {k: {op: round(v, 1) for op, v in sorted(c.items())} | {"total": round(sum(c.values()), 1)}
            for k, c in out.items()}


def scenario(args: argparse.Namespace, name: str) -> Dict[str, Any]:
    """One run of the simulation: a fresh store, the workers, the culprit stopping at step K; what was measured."""
    work = Path(tempfile.mkdtemp(prefix=f"zp-wd-{name}-", dir=args.tmp))
    port_file = str(work / "port")
    server = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        port = int(Path(port_file).read_text())
        dead = subprocess.Popen(["true"])
        dead.wait()
        probe = Probe(port)
        idle_from, cpu_from = time.time(), cpu_seconds(server.pid)
        time.sleep(args.idle_s)
        idle_to, cpu_idle = time.time(), cpu_seconds(server.pid) - cpu_from
        load = os.getloadavg()[0]
        world = args.nodes * args.ranks_per_node
        cfg = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "world": world, "port": port,
               "period": args.period, "beat_s": args.beat_s, "store_beat_s": args.store_beat_s,
               "stop_step": args.learn_steps + 1, "culprit": args.culprit, "scenario": name, "dead_pid": dead.pid,
               "hang_timeout": args.hang_timeout, "out": str(work), "go": str(work / "go"), "linger_s": args.linger_s}
        per = -(-args.nodes // args.workers)
        procs = []
        for w in range(args.workers):
            first, last = w * per, min(args.nodes, (w + 1) * per)
            if first >= last:
                break
            wcfg = dict(cfg, first=first, last=last, result=str(work / f"worker-{w}.json"))
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(wcfg)]))
        cfg.update(_go(work, len(procs), args))
        cpu_marks = []
        while any(p.poll() is None for p in procs):
            cpu_marks.append((time.time(), cpu_seconds(server.pid)))
            time.sleep(0.5)
        probe.stop.set()
        results = [json.loads(Path(work, f"worker-{w}.json").read_text()) for w in range(len(procs))
                   if Path(work, f"worker-{w}.json").exists()]
    finally:
        server.kill()
        server.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return summarize(name, args, cfg, results, probe, cpu_marks, (idle_from, idle_to, cpu_idle, load))


def _go(work: Path, workers: int, args: argparse.Namespace) -> Dict[str, float]:
    """Once every worker has made its nodes (or ``--boot-s`` passed): step 1 at ``t0``, a second later."""
    end = time.time() + args.boot_s
    while time.time() < end and len(list(work.glob("ready-*"))) < workers:
        time.sleep(0.1)
    t0 = time.time() + 1.0
    go = {"t0": t0, "end_by": t0 + (args.learn_steps + 1) * args.period + args.max_verdict_s}
    (work / "go.tmp").write_text(json.dumps(go))
    os.replace(work / "go.tmp", work / "go")
    return go


def _costs(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """CPU per stand-in rank and per simulated node's watchdog in the steady steps (each worker's threads by role),
    and how late the workers' clocks ran."""
    cpu: Counter = Counter()
    seconds = ranks = 0.0
    for r in results:
        a, b = r["cpu"].get("from"), r["cpu"].get("to")
        if not a or not b:
            continue
        for role in ("clock", "watchdog", "reader", "other", "process"):
            cpu[role] += b.get(role, 0.0) - a.get(role, 0.0)
        seconds = max(seconds, b["t"] - a["t"])
        ranks += r["ranks"]
    nodes = sum(len(r["nodes"]) for r in results)
    late = [r["clock_late"] for r in results if r.get("clock_late")]
    if not seconds or not ranks:
        return {}
    return {
        "steady_s": round(seconds, 1),
        "workers_cpu_pct": round(100 * cpu["process"] / seconds, 1),
        "ms_cpu_per_s": {"per_rank": round(1e3 * cpu["clock"] / seconds / ranks, 3),
                         "per_node_watchdog": round(1e3 * cpu["watchdog"] / seconds / nodes, 2),
                         "per_node_reader": round(1e3 * cpu["reader"] / seconds / nodes, 2)},
        "clock_late_ms": {"p50_max": max(x["p50_ms"] for x in late), "p99_max": max(x["p99_ms"] for x in late),
                          "max": max(x["max_ms"] for x in late)} if late else None,
    }


def summarize(name: str, args: argparse.Namespace, cfg: Dict[str, Any], results: List[Dict[str, Any]],
              probe: Probe, cpu_marks: List[tuple], idle: tuple) -> Dict[str, Any]:
    nodes = sorted((n for r in results for n in r["nodes"]), key=lambda n: n["node"])
    stopped = next((r["culprit_stopped_at"] for r in results if r.get("culprit_stopped_at")), None)
    samples = [dict(s, worker=i) for i, r in enumerate(results) for s in r["samples"]]
    steady = (cfg["t0"] + 3 * cfg["period"], stopped or cfg["t0"])
    verdicts = [n["verdict_t"] for n in nodes if n["verdict_t"]]
    judging = (stopped or 0.0, max(verdicts) if verdicts else (stopped or 0.0))

    def cpu_between(a: float, b: float) -> Optional[float]:
        inside = [(t, c) for t, c in cpu_marks if a <= t <= b]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        return round(100 * (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), 1)

    delays = sorted(n["verdict_t"] - stopped for n in nodes if n["verdict_t"] and stopped)
    deadlines = sorted({n["timeout_s"] for n in nodes if n["timeout_s"] is not None})
    culprits = Counter(json.dumps(n["culprits"]) for n in nodes)
    classes = Counter(str(n["class"]) for n in nodes)
    # the deadline the verdict was judged by: the judging node's (the others take its verdict, and state the
    # deadline of whatever section their own ranks were in when it came)
    judges = Counter(n["named_by"] for n in nodes if n["named_by"] is not None)
    judge = judges.most_common(1)[0][0] if judges else None
    learned = next((n["timeout_s"] for n in nodes if n["node"] == judge), None)
    limit = (learned if learned is not None else max(deadlines, default=0.0)) + TARGET_MARGIN_S
    return {
        "load_average": {"before": idle[3], "after": os.getloadavg()[0]},
        "cost": _costs(results),
        "scenario": name, "nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
        "world_size": cfg["world"], "culprit": args.culprit, "period_s": args.period, "workers": args.workers,
        "beat_s": cfg["beat_s"], "store_beat_s": cfg["store_beat_s"],
        "stopped_at_step": cfg["stop_step"],
        "verdicts": len(verdicts),
        "seconds_to_verdict": {"min": round(delays[0], 2), "median": round(statistics.median(delays), 2),
                               "max": round(delays[-1], 2)} if delays else None,
        "learned_deadline_s": learned,
        "deadline_source": next((n["deadline"] for n in nodes if n["node"] == judge), None),
        "deadlines_stated_by_nodes_s": deadlines,
        "target_s": round(limit, 2),
        "within_target": bool(delays) and len(delays) == len(nodes) == args.nodes and delays[-1] <= limit,
        "culprits_named": {k: v for k, v in culprits.items()},
        "same_culprit_on_every_node": len(culprits) == 1 and json.loads(next(iter(culprits))) == [args.culprit]
        and len(nodes) == args.nodes,
        "classes": dict(classes),
        "judged_by_nodes": sorted({n["named_by"] for n in nodes if n["named_by"] is not None}),
        "store": {
            "steady": _rates(samples, *steady),
            "judging": _rates(samples, *judging),
            "server_cpu_pct": {"idle": round(100 * idle[2] / max(idle[1] - idle[0], 1e-9), 1)
                               if idle[2] is not None else None,
                               "steady": cpu_between(*steady), "judging": cpu_between(judging[0], judging[1] + 1)},
            "probe_set_get": {"idle": probe.between(idle[0], idle[1]), "steady": probe.between(*steady),
                              "judging": probe.between(judging[0], judging[1] + 1)},
        },
        "per_node": nodes,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--culprit", type=int, default=None, help="the rank that stops (default: rank 517 at full size, "
                    "else the second rank of the middle node)")
    ap.add_argument("--scenario", choices=("hang", "die", "both"), default="both")
    ap.add_argument("--workers", type=int, default=8, help="processes hosting the simulated nodes")
    ap.add_argument("--period", type=float, default=1.0, help="seconds per step")
    ap.add_argument("--beat-s", type=float, default=None, help="heartbeat file period (default: the guard's, "
                    "rank.BEAT_S)")
    ap.add_argument("--store-beat-s", type=float, default=None, help="store heartbeat period of the ranks and the "
                    "watchdogs' readers (default: the guard's, storebeat.STORE_BEAT_S)")
    ap.add_argument("--learn-steps", type=int, default=12, help="steps before the culprit stops")
    ap.add_argument("--boot-s", type=float, default=600.0, help="the most time the workers have to make their nodes")
    ap.add_argument("--idle-s", type=float, default=2.0, help="probe time with the store idle")
    ap.add_argument("--hang-timeout", type=float, default=120.0, help="--hang-timeout (unseen sections)")
    ap.add_argument("--linger-s", type=float, default=5.0, help="a worker whose nodes all have their verdict "
                    "answers this long more (stacks, the store) for the others")
    ap.add_argument("--max-verdict-s", type=float, default=60.0, help="give up on verdicts this long after the stop")
    ap.add_argument("--tmp", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="folder for the nodes' run directories (removed after; default: /dev/shm when there is one)")
    ap.add_argument("--keep", action="store_true", help="keep the nodes' run directories")
    ap.add_argument("--out", type=Path, default=None, help="results JSON")
    args = ap.parse_args(argv)
    from zeropilot.guard import rank as rank_mod, storebeat

    args.beat_s = args.beat_s or rank_mod.BEAT_S
    args.store_beat_s = args.store_beat_s or storebeat.STORE_BEAT_S
    if args.serve:
        serve(args.serve)
        return 0
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.culprit is None:
        args.culprit = 517 if args.nodes * args.ranks_per_node > 517 else \
            (args.nodes // 2) * args.ranks_per_node + min(1, args.ranks_per_node - 1)
    names = ("hang", "die") if args.scenario == "both" else (args.scenario,)
    out = {"command": "python bench/guard/watchdog_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "cpus": os.cpu_count(), "scenarios": [scenario(args, n) for n in names]}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    brief = [{k: v for k, v in s.items() if k != "per_node"} for s in out["scenarios"]]
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
