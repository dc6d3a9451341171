"""Heartbeats across nodes through the job's own c10d store (imports torch lazily).

Every rank of a job that spans several nodes publishes its heartbeat (phase, step, progress, where its main thread
is, a sequence number) under ``zeropilot/hb/<global rank>`` in the ``TCPStore`` its launcher already serves at
``MASTER_ADDR:MASTER_PORT`` (torchrun's agent store, DeepSpeed's and accelerate's launchers alike), from a daemon
thread of its own, through a client connection of its own: one ``set`` every :data:`STORE_BEAT_S` seconds, never a
collective, nothing the training loop waits for. The watchdog of every node (:mod:`zeropilot.runner.peers`) reads
its own node's ranks and relays them, without their frames, under :data:`NODE_PREFIX` ``<node rank>``; it reads the
other nodes' relays (the list of relays, :data:`NODES_KEY`, and one ``multi_get`` a beat, whatever the number of
ranks), a rank's own key only where no node relays it (the list of ranks' keys: :data:`RANKS_KEY`), and every
rank's frames once, when it judges. The lists are appended to, never found with ``list_keys``: that call holds
Python's lock while it waits, and on a store whose machine froze it never returns, freezing the whole watchdog.
One node judges (:data:`JUDGE_KEY`) and writes the verdict under :data:`VERDICT_KEY` (``compare_set``: one verdict
for the job). A preempted node's supervisor writes the job's stop step under
:data:`STOP_KEY` the same way (:mod:`zeropilot.runner.preempt`).

``ZEROPILOT_STORE=HOST:PORT`` names another store; ``ZEROPILOT_STORE=off`` turns it off (then only a shared run
directory gives a node's watchdog the other nodes' heartbeats). On one node the store is not used.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

STORE_ENV = "ZEROPILOT_STORE"
PREFIX = "zeropilot/hb/"
NODE_PREFIX = "zeropilot/node/"  # + node rank: that node's watchdog relays its ranks' heartbeats (no frames)
VERDICT_KEY = "zeropilot/verdict"
JUDGE_KEY = "zeropilot/judge"  # the node whose watchdog judges (``compare_set``): the others wait for its verdict
SEEN_PREFIX = "zeropilot/verdict-seen/"  # + node rank: that node's watchdog has taken the verdict (torch < 2.6)
SEEN_KEY = "zeropilot/verdict-seen"  # "<node rank>," appended by each node's watchdog that has taken the verdict
RANKS_KEY = "zeropilot/ranks"  # "<rank>," appended by each rank's publisher once its key exists
NODES_KEY = "zeropilot/nodes"  # "<node rank>," appended by each node's watchdog once its relay exists
STOP_KEY = "zeropilot/stop"  # a preemption's stop step, one for the job (runner.preempt: compare_set)
STORE_BEAT_S = 1.0  # one set per rank per second: the rate limit (bench/guard/store_beat.py measures its cost)
CONNECT_TIMEOUT_S = 10.0
RETRY_S = 5.0
MAX_FRAMES = 40
MAX_CONNECT_ERRORS = 3


def address(env: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """The store to publish in: ``ZEROPILOT_STORE``, else ``MASTER_ADDR:MASTER_PORT``; None when off or unknown."""
    given = env.get(STORE_ENV)
    if given is not None:
        if given.strip().lower() in ("", "off", "0", "no"):
            return None
        host, _, port = given.rpartition(":")
        return (host, int(port)) if host and port.isdigit() and 0 < int(port) < 65536 else None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    return (host, int(port)) if host and port.isdigit() and 0 < int(port) < 65536 else None


def across_nodes(place: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether this rank's job spans several nodes (or the user named a store)."""
    if env.get(STORE_ENV):
        return True
    nodes, world, local = place.get("nnodes"), place.get("world_size"), place.get("local_world_size")
    return bool((isinstance(nodes, int) and nodes > 1)
                or (isinstance(world, int) and isinstance(local, int) and world > local))


def connect(addr: Tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S):
    """A client of the store at ``addr`` (raises what torch raises when it does not answer)."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(addr[0], addr[1], is_master=False, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def main_frames(ident: Optional[int]) -> List[Dict[str, Any]]:
    """The main thread's Python frames now, innermost last (at most :data:`MAX_FRAMES`, the innermost)."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    out: List[Dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        out.append({"file": frame.f_code.co_filename, "line": frame.f_lineno, "func": frame.f_code.co_name})
        frame = frame.f_back
    out.reverse()
    return out


def _group_ready() -> bool:
    """Whether this rank's process group is up: the store surely serves then, and torch is fully imported (the
    thread never imports torch itself: the main thread may be in the middle of importing it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported module
        return False


class StoreBeat:
    """The rank's publisher: a daemon thread that sets this rank's key every :data:`STORE_BEAT_S` seconds."""

    def __init__(self, guard: Any, addr: Tuple[str, int], place: Mapping[str, Any], thread: bool = True) -> None:
        """``thread=False``: no thread; the caller calls :meth:`publish` every :data:`STORE_BEAT_S`."""
        self.guard = guard
        self.addr = addr
        self.place = dict(place)
        self.key = f"{PREFIX}{guard.rank}"
        self.seq = 0
        self.store = None
        self.next_try = 0.0
        self.errors = 0
        self.sent = 0
        self.connecting = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="zeropilot-store-beat", daemon=True)
        if thread:
            self._thread.start()

    def payload(self) -> Dict[str, Any]:
        g = self.guard
        self.seq += 1
        return {"seq": self.seq, "t": time.time(), "rank": g.rank, "pid": g.pid, "host": g.host,
                "node_rank": self.place.get("node_rank"), "local_rank": self.place.get("local_rank"),
                "world_size": self.place.get("world_size"), "phase": g.phase, "phase_since": g.phase_since,
                "step": g.step, "progress": g.progress, "activity": g.activity,
                "frames": main_frames(g.main_ident)}

    def publish(self) -> bool:
        """One heartbeat into the store; False when the store did not answer (retried every :data:`RETRY_S`)."""
        with self._lock:
            now = time.time()
            if self.store is None:
                if now < self.next_try or not _group_ready():
                    return False
                self.connecting = True
                try:
                    self.store = connect(self.addr)
                except Exception:  # noqa: BLE001 - not there: try again later, three times at most
                    self.next_try = now + RETRY_S
                    self.errors += 1
                    if self.errors >= MAX_CONNECT_ERRORS:
                        self._stop.set()
                    return False
                finally:
                    self.connecting = False
            try:
                self.store.set(self.key, json.dumps(self.payload(), separators=(",", ":")))
                if not self.sent and hasattr(self.store, "append"):
                    self.store.append(RANKS_KEY, f"{self.guard.rank},")  # the readers find the key here
                self.sent += 1
                return True
            except Exception:  # noqa: BLE001 - the store went away (the job ends, or the master node died)
                self.store, self.next_try = None, now + RETRY_S
                self.errors += 1
                if self.sent:
                    self._stop.set()  # it served once and is gone: the watchdogs say so; no retries (and logs)
                return False

    def _loop(self) -> None:
        while not self._stop.wait(STORE_BEAT_S):
            if os.getpid() != self.guard.pid:
                return
            self.publish()
        if self.store is not None and os.getpid() == self.guard.pid:
            self.publish()  # the last one: phase ``exit``, a clean end and not a lost rank

    def close(self) -> None:
        """Publish the last heartbeat from the thread, waiting for it at most a second: a store whose machine froze
        never answers, and the rank's exit must not wait on it."""
        self._stop.set()
        if not self._thread.is_alive():
            return
        # a connect in progress must end before the interpreter does (torch's error then would abort the exit)
        self._thread.join(timeout=2 * CONNECT_TIMEOUT_S + 2 if self.connecting else 1.0)


def start(guard: Any, place: Mapping[str, Any], env: Optional[Mapping[str, str]] = None,
          thread: bool = True) -> Optional[StoreBeat]:
    """A publisher for ``guard`` when its job spans nodes and a store is known; None otherwise."""
    env = os.environ if env is None else env
    addr = address(env)
    if addr is None or not across_nodes(place, env):
        return None
    return StoreBeat(guard, addr, place, thread)
