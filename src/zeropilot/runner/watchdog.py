"""The hang watchdog: no rank progressed for its section's deadline -> stacks, flight recorder, ``hang.json``.

It reads heartbeats (``heartbeat-rank-N.json``) and the size of every ``rank-N.jsonl``; progress is any change of
either. How long no progress is a hang depends on the section the ranks are in (start-up, first step, step, save,
load): :mod:`zeropilot.runlog.sections` follows them and learns each section's durations into ``timeouts.json``,
:mod:`zeropilot.runlog.timeouts` turns those into deadlines (``--hang-timeout`` before a section was seen). An op
build is progress too: when the deadline comes while a compiler of this job (``/proc``: the job's session and the
descendants of its first process, :mod:`zeropilot.runner.procs`) is alive and using CPU, or the build folder
changed, the deadline moves on by another timeout and the build is recorded (``builds`` in run.json) instead of a
hang. On a hang it asks every live rank for its stacks (faulthandler's signal, see :mod:`zeropilot.guard.rank`) and
its flight recorder (NCCL: its dump pipe; gloo: the guard's heartbeat thread, on ``.fr-request``), waits a moment
for them, and writes the verdict of :mod:`zeropilot.guard.hangs`, with the ranks that straggled before the stall
(:func:`stragglers_before`).

Across nodes (the ranks publish their heartbeats in the job's c10d store, :mod:`zeropilot.guard.storebeat`) it
reads every rank's from there too (:mod:`zeropilot.runner.peers`, through the nodes' relays): progress anywhere in
the job is progress; a rank (or a whole node) whose store heartbeat stops is named at once (``rank_gone``,
``node_lost``); a store that stops answering is ``store_gone``. The first node to reach a verdict claims the
judgment (``compare_set``), reads every rank's frames and writes its verdict in the store; every other node's
watchdog takes that one: one verdict, written on every node, each node stopping its own ranks.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot.guard.flight import read_dump, summarize as fr_summary
from zeropilot.guard.hangs import RankState, hang_verdict, parse_stacks, where
from zeropilot.guard import storebeat
from zeropilot.guard.locks import find_locks
from zeropilot.launch.machine import extensions_roots
from zeropilot.runlog.layout import STACKS_MARKER, RunDir, write_json_atomic
from zeropilot.runlog.read import read_side_json
from zeropilot.runlog.sections import SectionWatch
from zeropilot.runner import peers as peers_mod, procs

STACK_SIGNAL = signal.SIGUSR2
PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_WAIT_S = 2.0
FR_WAIT_S = 5.0  # more, only while a rank with a flight-recorder pipe has not dumped yet
#: before any rank exists (the launcher starting, a rendezvous waiting for nodes) the watchdog waits this
#: long at least: a rank is live from its interpreter's start, so this only covers the launcher itself
STARTUP_GRACE_S = 120.0


def _alive(pid: Optional[int]) -> Optional[bool]:
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


class Watchdog:
    """Polled by the supervisor; :meth:`poll` returns the hang record once, when it fires."""

    def __init__(self, run_dir: Path, timeout_s: float, action: str, world_size: Optional[int],
                 env: Dict[str, str], session: Optional[int] = None, plan: Optional[Dict] = None,
                 timeouts_file: Optional[Path] = None) -> None:
        self.dir = RunDir(run_dir)
        self.timeout_s = timeout_s  # --hang-timeout: the deadline of a section not seen yet
        self.sections = SectionWatch(run_dir, timeout_s, plan, timeouts_file)
        self.deadline = self.sections.deadline()
        self.action = action
        self.world_size = world_size
        self.env = env
        self.session = session  # the job's first process (and session): its compilers are ours
        self.last_key: Tuple = ()
        self.last_change = time.time()
        self.fired = False
        self.builds: Dict[str, Dict] = {}  # op folder -> {op, path, first_t, last_t, compilers}: deadlines moved
        self._ticks: Dict[int, int] = {}
        self._build_mtime: Dict[str, float] = {}
        self.peers: Optional[peers_mod.Peers] = None  # the other nodes' ranks, through the job's c10d store
        self.host = socket.gethostname()

    def _key(self) -> Tuple:
        parts = []
        problems: List[str] = []
        for r in self.dir.ranks("heartbeat-rank"):
            hb = read_side_json(self.dir.heartbeat(r), problems) or {}
            parts.append((r, hb.get("progress"), hb.get("phase"), hb.get("activity")))
        for r in self.dir.ranks("rank"):
            try:
                parts.append((r, os.path.getsize(self.dir.events(r))))
            except OSError:
                pass
        try:  # an op-build lock taken or given back by the job is progress too
            parts.append(("build-locks", os.path.getsize(self.dir.build_locks)))
        except OSError:
            pass
        if self.peers is not None:
            beats, _ = self.peers.snapshot()
            parts.extend(("store", r, hb.get("progress"), hb.get("phase"), hb.get("activity"))
                         for r, hb in sorted(beats.items()))
        return tuple(parts)

    def poll(self) -> Optional[Dict]:
        if self.fired:
            self.settle(0.0)
            return None
        if self.peers is None:
            self.peers = peers_mod.from_heartbeats(self._beats(), self.world_size,
                                                   str(self.dir.root / peers_mod.STATUS_FILE))
        now = time.time()
        if self.peers is not None:
            self.peers.local = {r for r, hb in self._beats().items() if hb.get("host") in (None, self.host)}
            record = self._across_nodes(now)
            if record is not None:
                self.fired = True
                return record
        self.sections.poll(self._beats(), now)
        self.deadline = self.sections.deadline()
        key = self._key()
        if key != self.last_key:
            self.last_key, self.last_change = key, now
            return None
        limit = self.deadline.seconds if key else max(self.deadline.seconds, STARTUP_GRACE_S)
        if now - self.last_change < limit:
            return None
        if self.building(now) or self.finished():
            self.last_change = now  # an op build is progress; ranks that all ended wait for their launcher
            return None
        if self.peers is not None and self.peers.waiting(now):
            return None  # the other nodes' heartbeats are on their way: judge with them
        self.fired = True
        return self.fire()

    def finished(self) -> bool:
        """Every rank (all ``world_size`` of them, where known) ended its work (phase ``exit``): the launcher is
        ending the job, which is not a hang (a slow interpreter teardown on a loaded machine takes seconds)."""
        beats = self._beats()
        if not beats or (self.world_size and len(beats) < self.world_size):
            return False
        return all(hb.get("phase") == "exit" for hb in beats.values())

    def _op_folder(self, cwd: Optional[str]) -> Optional[str]:
        """The op build folder a compiler works in: PyTorch runs ninja (and so the compiler) in it; None when the
        folder is not under the job's extension folders."""
        if not cwd:
            return None
        for root in extensions_roots(self.env):
            r = os.path.realpath(str(root))
            if cwd.startswith(r + os.sep):
                return cwd
        return None

    def _held_folders(self) -> List[str]:
        """Build folders whose lock a live process of this job took and has not given back (``build-locks.jsonl``)."""
        from zeropilot.guard.locks import taken

        return [os.path.dirname(p) for p, rec in taken(self.dir.root).items() if _alive(rec.get("pid"))]

    def _folder_changed(self, folder: str) -> bool:
        try:
            mtime = max((e.stat().st_mtime for e in os.scandir(folder)), default=0.0)
        except OSError:
            mtime = 0.0
        changed = mtime > self._build_mtime.get(folder, -1.0)
        self._build_mtime[folder] = mtime
        return changed

    def building(self, now: Optional[float] = None) -> bool:
        """Whether an op build of this job made progress since the last look: a compiler of the job used CPU (or
        appeared), or a build folder changed (one a compiler of the job works in, or whose lock a live process of
        the job holds: it writes ``build.ninja`` before the compiler starts). Records it in :attr:`builds`."""
        if self.session is None:
            return False
        now = time.time() if now is None else now
        comps = procs.compilers(self.session)
        progressed = False
        ticks = {}
        for c in comps:
            pid, t = int(c["pid"]), int(c["ticks"])
            ticks[pid] = t
            progressed = progressed or t > self._ticks.get(pid, -1)
        self._ticks = ticks
        folders = {f for f in (self._op_folder(c.get("cwd")) for c in comps) if f} | set(self._held_folders())
        for folder in sorted(folders):
            progressed = self._folder_changed(folder) or progressed
        if not progressed:
            return False
        for folder in sorted(folders) or [str(c.get("cwd")) for c in comps[:1]]:
            b = self.builds.setdefault(folder, {"op": os.path.basename(folder), "folder": folder, "first_t": now,
                                                "last_t": now, "compilers": []})
            b["last_t"] = now
            for c in comps:
                name = f"{c['comm']} (pid {c['pid']})"
                if self._op_folder(c.get("cwd")) in (folder, None) and name not in b["compilers"] \
                        and len(b["compilers"]) < 20:
                    b["compilers"].append(name)
        return True

    def live_dirs(self) -> List[str]:
        return [os.path.realpath(str(c.get("cwd"))) for c in procs.compilers(self.session)
                if c.get("cwd")] if self.session is not None else []

    def _beats(self) -> Dict[int, Dict]:
        problems: List[str] = []
        return {r: read_side_json(self.dir.heartbeat(r), problems) or {} for r in self.dir.ranks("heartbeat-rank")}

    def request_dumps(self, beats: Dict[int, Dict]) -> None:
        """Stacks from every live rank; their flight recorders (NCCL: its pipe; gloo: ``.fr-request``, answered by
        the guard's heartbeat thread). Waits a moment for the files."""
        try:
            self.dir.fr_request.write_text(f"{time.time()}\n", encoding="utf-8")
        except OSError:
            pass
        for rank, hb in beats.items():
            if hb.get("host") not in (None, self.host):
                continue  # a rank of another node in a shared run directory: its pid means nothing here
            pid = hb.get("pid")  # the signal faulthandler listens on (guard.rank: ZEROPILOT_STACK_SIGNAL)
            if _alive(pid):
                try:
                    with open(self.dir.stacks(rank), "a", encoding="utf-8") as fh:
                        fh.write(f"\n{STACKS_MARKER} {time.time():.3f} ---\n")
                    os.kill(pid, STACK_SIGNAL)
                except OSError:
                    pass
            pipe = self.env.get(PIPE_ENV)
            if pipe:
                self._poke_pipe(Path(f"{pipe}{rank}.pipe"))
        time.sleep(DUMP_WAIT_S)
        prefix = self.env.get(PIPE_ENV)
        pipes = [r for r in beats if Path(f"{prefix}{r}.pipe").exists()] if prefix else []
        deadline = time.time() + FR_WAIT_S
        while pipes and time.time() < deadline and not all(self.dir.flight_recorder(r).exists() for r in pipes):
            time.sleep(0.5)
        try:
            self.dir.fr_request.unlink()
        except OSError:
            pass

    @staticmethod
    def _poke_pipe(path: Path) -> None:
        try:
            fd = os.open(str(path), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no pipe (not NCCL) or nobody reading
        try:
            os.write(fd, b"1\n")
        except OSError:
            pass
        finally:
            os.close(fd)

    def _flight_recorder(self) -> Optional[Dict]:
        """What the flight-recorder dumps say (NCCL's, else the ranks' own; torch-free reader), or None."""
        dumps = {}
        for r in self.dir.ranks("rank"):
            dump = read_dump(self.dir.flight_recorder(r)) or read_dump(self.dir.gloo_trace(r))
            if dump is not None:
                dumps[r] = dump
        return fr_summary(dumps) if dumps else None

    def _across_nodes(self, now: float) -> Optional[Dict]:
        """A verdict another node wrote in the store, the store gone, or ranks gone silent; None otherwise."""
        p = self.peers
        if p.verdict is not None:
            return self._adopt(p.verdict)
        gone_s = p.gone_for(now)
        if gone_s >= peers_mod.STORE_GONE_S and not self._ended(p):
            return self._write(self._record(store_gone(p, gone_s), self._local_states(self._beats(), set()),
                                            []))
        silent = [r for r in p.silent(now) if not self._local_and_alive(r)]
        if not silent or not p.silent(now, peers_mod.SILENT_S + 3 * storebeat.STORE_BEAT_S):
            return None  # the ranks of a lost node fall silent within a beat of each other: wait for all of them
        gone, pending = p.confirm_silent(silent)  # in their own keys: a node's relay stands still when its watchdog
        return self.fire(gone) if gone and not pending else None  # is slow, or a beat behind when its node stopped

    def settle(self, wait_s: float = 2 * storebeat.STORE_BEAT_S + 1) -> None:
        """After a verdict this node could not publish: take the store's once the reader has it (waiting up to
        ``wait_s``), so that every node writes the one verdict."""
        p = self.peers
        if p is None or not self.fired or p.confirmed:
            return
        end = time.time() + wait_s
        while not p.adopted and time.time() < end:
            time.sleep(0.2)
        if p.adopted and p.verdict is not None:
            p.adopted, p.confirmed = False, True
            self._adopt(p.verdict)

    def linger(self, wait_s: float = peers_mod.LINGER_S) -> None:
        """Before this node stops its job (and, on the master node, the store with it): wait up to ``wait_s`` until
        every other node whose ranks still beat has taken the verdict, so that none is left to judge alone."""
        p = self.peers
        if p is None or not self.fired:
            return
        me = self._me()["node_rank"]
        beats, _ = p.snapshot()
        silent = set(p.silent())
        others = {hb.get("node_rank") for r, hb in beats.items()
                  if r not in silent and hb.get("phase") != "exit"} - {me, None}
        end = time.time() + wait_s
        while not others <= p.seen_by and time.time() < end and p.gone_for() < 2 * storebeat.STORE_BEAT_S:
            time.sleep(0.2)  # a store that stopped answering takes no marks: no use waiting for them

    def _ended(self, p: "peers_mod.Peers") -> bool:
        """Whether the job ended here (every rank seen said ``exit``, or no local rank lives): a store gone then is
        the master's launcher that ended with it, not a lost master."""
        beats, _ = p.snapshot()
        if beats and all(hb.get("phase") == "exit" for hb in beats.values()):
            return True
        return not any(self._local_and_alive(r) for r in self._beats())

    def _local_and_alive(self, rank: int) -> bool:
        hb = read_side_json(self.dir.heartbeat(rank), []) or {}
        return hb.get("host") == self.host and _alive(hb.get("pid")) is True

    def _local_states(self, beats: Dict[int, Dict], silent: set) -> List[RankState]:
        states = []
        for rank, hb in sorted(beats.items()):
            here = hb.get("host") in (None, self.host)
            try:
                text = self.dir.stacks(rank).read_text(encoding="utf-8", errors="replace")[-1_000_000:] if here else ""
            except OSError:
                text = ""
            pid = hb.get("pid") if isinstance(hb.get("pid"), int) else None
            alive = _alive(pid) if here else (False if rank in silent else None)
            states.append(RankState(rank=rank, phase=hb.get("phase"), step=hb.get("step"),
                                    phase_since=hb.get("phase_since"), alive=alive,
                                    frames=parse_stacks(text), pid=pid,
                                    workers=procs.children(pid) if pid and here else []))
        return states

    def _states(self, beats: Dict[int, Dict], silent: set) -> List[RankState]:
        """Every rank's state: the local ones from their files and stacks, the others from the store."""
        states = {s.rank: s for s in self._local_states(beats, silent)}
        remote = self.peers.snapshot()[0] if self.peers is not None else {}
        for rank, hb in remote.items():
            mine = states.get(rank)
            if mine is not None and (mine.frames or mine.alive is not None):
                continue
            states[rank] = RankState(rank=rank, phase=_str(hb.get("phase")), step=_int(hb.get("step")),
                                     phase_since=_num(hb.get("phase_since")),
                                     alive=False if rank in silent else True, frames=_frames(hb.get("frames")))
        return [states[r] for r in sorted(states)]

    def _adopt(self, held: Dict) -> Dict:
        """The verdict another node's watchdog wrote in the store, as this node's ``hang.json``."""
        record = self._record(held.get("verdict") if isinstance(held.get("verdict"), dict) else {},
                              self._local_states(self._beats(), set()), [])
        record["named_by"] = held.get("named_by")
        if self.peers is not None:
            self.peers.acknowledge(self._me()["node_rank"])
        return self._write(record)

    def _record(self, verdict: Dict, states: List[RankState], locks: List[Dict]) -> Dict:
        return {"t": time.time(), "timeout_s": self.deadline.seconds, "deadline": self.deadline.to_json(),
                "action": self.action,
                "ranks": [{"rank": s.rank, "phase": s.phase, "phase_since": s.phase_since, "step": s.step,
                           "alive": s.alive, "where": where(s.frames, limit=10),
                           "stack_file": self.dir.stacks(s.rank).name if s.frames and self.dir.stacks(s.rank).exists()
                           else None} for s in states],
                "locks": locks, "verdict": verdict,
                "flight_recorder": sorted(p.name for p in self.dir.root.glob("nccl-trace-rank-*"))
                + sorted(p.name for p in self.dir.root.glob("fr-trace-rank-*")),
                "builds": list(self.builds.values()), "flight_recorder_summary": None,
                "named_by": self._me() if self.peers is not None else None}

    def _me(self) -> Dict:
        beats = self._beats()
        nodes = {hb.get("node_rank") for hb in (self.peers.snapshot()[0] if self.peers else {}).values()
                 if hb.get("host") == self.host and hb.get("rank") in beats}
        return {"host": self.host, "node_rank": min((n for n in nodes if isinstance(n, int)), default=None),
                "run_dir": str(self.dir.root)}

    def _write(self, record: Dict) -> Dict:
        write_json_atomic(self.dir.hang_file, record)
        return record

    def fire(self, silent: Optional[List[int]] = None) -> Dict:
        judged_at = time.time()  # before the dumps: how long the section had run when it was judged
        beats = self._beats()
        self.request_dumps(beats)
        if self.peers is not None:  # one node judges; the others take its verdict (the same, and no 128 readings)
            node = self.peers.node if self.peers.node is not None else self._me()["node_rank"]
            if not self.peers.claim(node):
                held = self.peers.wait_verdict()
                if held is not None:
                    return self._adopt(held)
            self.peers.fetch_frames()
        if self.peers is not None and silent is None:
            silent = [r for r in self.peers.silent(after_s=peers_mod.SILENT_JUDGED_S) if not self._local_and_alive(r)]
        states = self._states(beats, set(silent or ()))
        early = not states or any(s.phase in ("startup", "init") or s.step in (0, None) for s in states)
        waits_on_lock = any("file_baton" in f.get("file", "") for s in states for f in s.frames[-12:])
        locks = find_locks(self.env, self.dir.root, self.live_dirs(), _alive) if early or waits_on_lock else []
        fr = self._flight_recorder()
        world = self.peers.world_size if self.peers is not None else self.world_size
        d = self.deadline
        verdict = hang_verdict(states, world, d.seconds, locks, fr, stragglers_before(self.dir.root))
        verdict["reason"] += f" (the {d.section.replace('_', ' ')} deadline: {d.basis})"
        if fr is not None and fr["text"]:
            verdict["reason"] += "; " + "; ".join(fr["text"])
        if self.peers is not None:
            verdict = name_nodes(verdict, self.peers.snapshot()[0], set(silent or ()))
        record = self._record(verdict, states, locks)
        record["flight_recorder_summary"] = fr
        if self.peers is not None:  # the first node's verdict holds on every node
            held = self.peers.publish_verdict({"verdict": verdict, "named_by": record["named_by"]},
                                              record["named_by"]["node_rank"])
            if isinstance(held.get("verdict"), dict):
                record["verdict"], record["named_by"] = held["verdict"], held.get("named_by")
        self.sections.cut(d, record["verdict"].get("class"), judged_at)  # a slow one-off section: longer next time
        return self._write(record)

    def close(self) -> None:
        """The job ended: what the sections took is written once more (``timeouts.json``)."""
        self.sections.poll(self._beats())
        self.sections.flush()


def stragglers_before(root: Path) -> List[Dict]:
    """The ranks of this run directory that straggled over their newest steps before the stall: their own data time
    or their GPU probe far above their peers' (``runlog.stragglers``, read from each rank file's tail)."""
    from zeropilot.errors import InputError
    from zeropilot.runlog.live import LiveRun

    try:
        live = LiveRun.open(root)
        live.refresh()
        return live.stragglers() + live.gpu_stragglers()
    except (InputError, OSError):
        return []


def _str(value) -> Optional[str]:
    return str(value)[:200] if isinstance(value, str) else None


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _frames(value) -> List[Dict]:
    """Frames from a store heartbeat (another rank's own report: checked, never trusted)."""
    out = []
    for f in value if isinstance(value, list) else []:
        if isinstance(f, dict) and isinstance(f.get("file"), str) and isinstance(f.get("line"), int) \
                and isinstance(f.get("func"), str):
            out.append({"file": f["file"][:500], "line": f["line"], "func": f["func"][:200]})
    return out[-64:]


def _node_text(hb: Dict) -> str:
    node = hb.get("node_rank")
    host = hb.get("host")
    return (f"node {node}" if isinstance(node, int) else "node ?") + (f" ({host})" if isinstance(host, str) else "")


def name_nodes(verdict: Dict, beats: Dict[int, Dict], silent: set) -> Dict:
    """The verdict with each culprit's node (``culprits``: rank, node, host, where), a lost node named as such."""
    verdict = dict(verdict)
    culprits = [r for r in verdict.get("ranks", []) if isinstance(r, int)]
    verdict["culprits"] = [{"rank": r, "node_rank": (beats.get(r) or {}).get("node_rank"),
                            "host": (beats.get(r) or {}).get("host"),
                            "where": where(_frames((beats.get(r) or {}).get("frames")), limit=4)} for r in culprits]
    by_node: Dict = {}
    for r, hb in beats.items():
        by_node.setdefault(hb.get("node_rank"), set()).add(r)
    lost = [n for n, ranks in by_node.items() if n is not None and ranks and ranks <= silent]
    if lost and verdict.get("class") == "rank_gone":
        ranks = sorted(r for n in lost for r in by_node[n])
        now = time.time()
        ages = [now - t for t in [(beats[r].get("t")) for r in ranks] if isinstance(t, (int, float))]
        verdict["class"] = "node_lost"
        verdict["nodes_lost"] = sorted(lost)
        verdict["cause"] = (", ".join(_node_text(beats[min(by_node[n])]) for n in sorted(lost))
                            + f" lost: all its ranks ({', '.join(map(str, ranks))}) stopped publishing heartbeats"
                            + (f" {max(ages):.0f} s ago" if ages else "") + " while the other nodes' ranks wait for"
                            " them (the machine died, froze or was cut off from the network)")
        verdict["fixes"] = ["look at that node: its launcher's output, the machine's log (dmesg: OOM killer, "
                            "hardware), the network to it",
                            "resume on the nodes left from the last complete checkpoint (zeropilot report DIR... "
                            "--checkpoint CKPT says which world size it can resume on)"]
    elif culprits:
        verdict["cause"] = verdict.get("cause", "") + "; " + "; ".join(
            f"rank {c['rank']} on {_node_text(beats.get(c['rank']) or {})}" for c in verdict["culprits"])
    return verdict


def store_gone(p: "peers_mod.Peers", seconds: float) -> Dict:
    """The verdict when the job's c10d store stopped answering."""
    return {"class": "store_gone", "ranks": [], "where": [], "culprits": [],
            "reason": f"the job's c10d store at {p.where} has not answered for {seconds:.0f} s ({p.error})",
            "cause": f"the job's c10d store at {p.where} is gone: the master node (its launcher serves the store) "
                     "died, froze or was cut off from this node; no rank can rendezvous or go on without it",
            "fixes": ["look at the master node (MASTER_ADDR): its launcher's output, the machine, the network",
                      "restart the job from the last complete checkpoint (zeropilot report DIR... --checkpoint CKPT "
                      "says which world size it can resume on)"],
            "ranks_detail": []}
