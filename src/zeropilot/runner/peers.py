"""The watchdog's view of the ranks on other nodes, read from the job's c10d store (imports torch lazily).

The ranks publish their heartbeats there (:mod:`zeropilot.guard.storebeat`); a daemon thread of ``zeropilot run``
reads every rank's key every :data:`~zeropilot.guard.storebeat.STORE_BEAT_S` seconds through a client connection of
its own (``check`` then ``get``: key-value only, never a collective) and keeps the latest of each with the local
time its sequence number last moved. A rank whose sequence number stands still for :data:`SILENT_S` is silent: its
process, or its whole node, is gone or frozen. The store not answering for :data:`STORE_GONE_S` after it answered
once is the store gone: the master node (its launcher serves the store) died or was cut off. (A store whose
machine froze does not refuse: a call to it never returns. So the age of the last answer counts, not errors; the
reader is a daemon thread, and the verdict is published from a thread joined with a timeout.)
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.guard import storebeat

SILENT_S = 10.0
FIRST_ANSWER_S = 60.0  # the watchdog waits this long for the store's first answer before judging without it
STORE_GONE_S = 15.0
READER_CONNECT_S = 3.0
RECONNECT_S = 5.0  # after a failure: the job is often ending then, and a connect in progress delays the end
LINGER_S = 3 * storebeat.STORE_BEAT_S + READER_CONNECT_S + 2  # a stopping node waits this long for the others
STATUS_FILE = "store-peers.json"
MAX_VALUE = 256 * 1024  # a heartbeat larger than this is not one of ours


class Peers:
    """Every rank's latest store heartbeat, refreshed by a daemon thread."""

    def __init__(self, addr: Tuple[str, int], world_size: int, status_path: Optional[str] = None) -> None:
        self.addr = addr
        self.status_path = status_path  # ``store-peers.json``: what this node's watchdog sees, when it changes
        self.world_size = world_size
        self.beats: Dict[int, Dict[str, Any]] = {}
        self.moved: Dict[int, float] = {}  # rank -> local time its sequence number last changed
        self.verdict: Optional[Dict[str, Any]] = None
        self.stop: Optional[Dict[str, Any]] = None  # the job's stop request (a preemption on some node), once set
        self.answered: Optional[float] = None  # local time of the last answer
        self.first_failure: Optional[float] = None
        self.error: Optional[str] = None
        self.started = time.time()
        self.adopted = False  # the store's verdict replaced one this node could not publish
        self.confirmed = True  # False after a verdict this node could not publish: the store's, once read, wins
        self.seen_by: set = set()  # node ranks whose watchdog has taken the job's verdict (their key is set)
        self._status_seen: List[int] = []
        self._store = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="zeropilot-peers", daemon=True)
        self._thread.start()

    @property
    def where(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def _read(self, store, key: str) -> Optional[Dict[str, Any]]:
        if not store.check([key]):
            return None
        raw = store.get(key)
        if len(raw) > MAX_VALUE:
            return None
        try:
            value = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def refresh(self) -> bool:
        """One read of every rank's heartbeat and of the verdict; False when the store did not answer."""
        now = time.time()  # a store that does not answer fails at the timeout: count from the asking
        try:
            if self._store is None:
                self._store = storebeat.connect(self.addr, READER_CONNECT_S)
            store = self._store
            got = {r: self._read(store, f"{storebeat.PREFIX}{r}") for r in range(self.world_size)}
            verdict = self._read(store, storebeat.VERDICT_KEY)
            stop = self._read(store, storebeat.STOP_KEY) if self.stop is None else self.stop
            nodes = {hb.get("node_rank") for hb in got.values() if hb is not None}
            seen_by = {n for n in nodes if isinstance(n, int) and store.check([f"{storebeat.SEEN_PREFIX}{n}"])} \
                if verdict is not None else set()
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/DistStoreError/TimeoutError
            self._store = None
            with self._lock:
                self.first_failure = self.first_failure or now
                self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            return False
        now = time.time()  # answered now (the first call includes torch's import: seconds)
        with self._lock:
            self.answered, self.first_failure, self.error = now, None, None
            for r, hb in got.items():
                if hb is None:
                    continue
                if hb.get("seq") != (self.beats.get(r) or {}).get("seq"):
                    self.moved[r] = now
                self.beats[r] = hb
            if verdict is not None:
                if self.verdict != verdict and not self.confirmed:
                    self.adopted = True
                self.verdict = verdict
            self.seen_by |= seen_by
            if self.stop is None and stop is not None:
                self.stop = stop
            seen = sorted(self.beats)
        if self.status_path and seen != self._status_seen:
            self._status_seen = seen
            from pathlib import Path

            from zeropilot.runlog.layout import write_json_atomic

            try:
                write_json_atomic(Path(self.status_path), {"t": now, **self.summary()})
            except OSError:
                pass
        return True

    def waiting(self, now: float) -> bool:
        """Whether the store has not answered yet while it still may (the reader starting: torch's import)."""
        return self.answered is None and now - self.started < FIRST_ANSWER_S

    def _loop(self) -> None:
        import os

        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # c10d's retry warnings: the verdict says it once
        while not self._stop.is_set():
            ok = self.refresh()
            if not ok:
                self._stop.wait(RECONNECT_S)
            self._stop.wait(storebeat.STORE_BEAT_S)

    def snapshot(self) -> Tuple[Dict[int, Dict[str, Any]], Dict[int, float]]:
        with self._lock:
            return dict(self.beats), dict(self.moved)

    def silent(self, now: Optional[float] = None, after_s: float = SILENT_S) -> List[int]:
        """Ranks seen once whose heartbeat stopped moving ``after_s`` ago without a clean end (phase ``exit``)."""
        beats, moved = self.snapshot()
        seen = self.answered  # measured against the last answer: a slow reader makes no rank silent
        if seen is None or (now if now is not None else time.time()) - seen > 3 * storebeat.STORE_BEAT_S + 3:
            return []
        return sorted(r for r, hb in beats.items() if hb.get("phase") != "exit" and seen - moved[r] >= after_s)

    def gone_for(self, now: Optional[float] = None) -> float:
        """Seconds the store has not answered, after it answered once (0 while it answers or never did)."""
        now = time.time() if now is None else now
        with self._lock:
            if self.answered is None:
                return 0.0
            return max(0.0, now - self.answered - storebeat.STORE_BEAT_S)

    def publish_verdict(self, record: Dict[str, Any], node: Optional[int] = None) -> Dict[str, Any]:
        """Write ``record`` as the job's verdict unless another node did first, and mark node ``node`` as having
        taken it; returns the one that holds. A verdict the reader has already seen in the store holds as it is
        (its node may stop, and its store with it, before this one could ask again). ``record`` itself holds when
        the store does not answer within :data:`READER_CONNECT_S` and the reader has seen none. Only a store judged
        gone (:data:`STORE_GONE_S`) is not tried: a reader a few beats late on a loaded machine is no reason to keep
        this node's own verdict (both nodes did, and wrote two)."""
        with self._lock:
            known = self.verdict
        if known is not None:
            self.acknowledge(node)
            return known
        if self.gone_for() >= STORE_GONE_S:
            return record
        self.confirmed = False
        held: List[Any] = []

        def run(store) -> None:
            value = json.dumps(record, separators=(",", ":"), default=str)
            held.append(store.compare_set(storebeat.VERDICT_KEY, "", value))
            if node is not None:
                store.set(f"{storebeat.SEEN_PREFIX}{node}", "1")

        self._in_thread(run, 3 * READER_CONNECT_S + 5)  # once per job; a loaded machine answers slowly
        try:
            got = json.loads(held[0].decode("utf-8", "replace")) if held and held[0] else None
        except ValueError:
            got = None
        with self._lock:
            if not isinstance(got, dict):  # not published: the store's, if the reader saw it meanwhile
                got = self.verdict if self.verdict is not None else record
            self.confirmed = bool(held) or self.verdict is not None
            self.verdict = got
            return got

    def publish_stop(self, request: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Write ``request`` (a preemption's ``stop_step``) as the job's stop request unless another node did first;
        returns the one that holds, or None when the store did not answer (this node then stops alone)."""
        with self._lock:
            known = self.stop
        if known is not None:
            return known
        if self.gone_for() >= STORE_GONE_S:
            return None
        held: List[Any] = []

        def run(store) -> None:
            value = json.dumps(request, separators=(",", ":"), default=str)
            held.append(store.compare_set(storebeat.STOP_KEY, "", value))

        self._in_thread(run, 2 * READER_CONNECT_S + 2)
        try:
            got = json.loads(held[0].decode("utf-8", "replace")) if held and held[0] else None
        except ValueError:
            got = None
        if not isinstance(got, dict):
            return None
        with self._lock:
            self.stop = self.stop or got
            return self.stop

    def acknowledge(self, node: Optional[int]) -> None:
        """Mark node ``node`` as having taken the job's verdict (a key in the store; waits at most a few seconds)."""
        if node is None or self.gone_for() >= STORE_GONE_S:
            return
        self._in_thread(lambda store: store.set(f"{storebeat.SEEN_PREFIX}{node}", "1"), READER_CONNECT_S + 2)

    def _in_thread(self, fn, timeout_s: float) -> None:
        """``fn(store)`` on a connection of its own, in a daemon thread joined with ``timeout_s`` (a frozen store's
        call never returns)."""
        def run() -> None:
            fn(storebeat.connect(self.addr, READER_CONNECT_S))

        thread = threading.Thread(target=_quiet(run), name="zeropilot-verdict", daemon=True)
        thread.start()
        thread.join(timeout_s)

    def summary(self) -> Dict[str, Any]:
        """What ``run.json`` keeps of it: the store's address, whether it answered, the last error."""
        with self._lock:
            return {"address": self.where, "answered": self.answered is not None, "error": self.error,
                    "ranks_seen": sorted(self.beats)}

    def close(self) -> None:
        """Stop the reader and wait for it (a thread inside a store call at the interpreter's exit aborts it)."""
        self._stop.set()
        self._thread.join(timeout=2 * READER_CONNECT_S + 2)  # a connect in progress ends (torch retries once)


def _quiet(fn):
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the store did not answer: the caller goes on without it
            pass
    return run


def from_heartbeats(beats: Dict[int, Dict[str, Any]], world_size: Optional[int],
                    status_path: Optional[str] = None) -> Optional[Peers]:
    """A :class:`Peers` for the store the local ranks' heartbeats name (``store``: ``HOST:PORT``), or None."""
    for hb in beats.values():
        text = hb.get("store")
        if isinstance(text, str):
            addr = storebeat.address({storebeat.STORE_ENV: text})
            size = hb.get("world_size") if isinstance(hb.get("world_size"), int) else world_size
            if addr is not None and isinstance(size, int) and 0 < size <= 65536:
                return Peers(addr, size, status_path)
    return None
