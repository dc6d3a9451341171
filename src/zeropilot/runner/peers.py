"""The watchdog's view of the ranks on other nodes, read from the job's c10d store (imports torch lazily).

The ranks publish their heartbeats there (:mod:`zeropilot.guard.storebeat`); a daemon thread of ``zeropilot run``
reads them every :data:`~zeropilot.guard.storebeat.STORE_BEAT_S` seconds through a client connection of its own
(key-value only, never a collective) and keeps the latest of each with the local time its sequence number last
moved. Its own node's ranks it reads directly and relays, without their frames, in one key of its node
(``NODE_PREFIX``); the other nodes' ranks it reads from their nodes' relays: six round trips a beat whatever the
number of ranks (the list of relays, a ``multi_get`` of them, a ``multi_get`` of its own ranks, the ``set`` of its
relay, the verdict, the job's stop step); with 128 nodes of 8 ranks, every rank's key read by every node was
2 × 1,024 round trips per node and beat (``bench/guard/watchdog_scale.py``). A rank no node relays (a node
without ``zeropilot run``: DeepSpeed's pdsh runner) is read from its own key after :data:`RELAY_GRACE_S`; every
rank's frames are read once, when this node judges (:meth:`Peers.fetch_frames`). Keys are found in lists kept by
``append`` (``storebeat.NODES_KEY``, ``RANKS_KEY``) and read with a ``compare_set`` that never waits (:func:`_peek`),
never with ``list_keys``: it holds Python's lock while it waits, and a frozen store froze the whole ``zeropilot run``
(``tests/guard/test_watch_nodes.py``, the store's node frozen). A torch without ``multi_get``/``append`` gets the
per-rank ``check`` and ``get`` of every rank. A rank whose sequence number stands still for :data:`SILENT_S` is
silent (in its own key too, :meth:`Peers.confirm_silent`: a relay stands still when its node's watchdog stalls): its
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
#: when judging a stall (no rank progressed for the deadline, at least ``timeouts.STEP_FLOOR_S``), a rank whose
#: publisher, a thread that beats whatever its main thread does, missed this many seconds of beats is gone: the
#: ranks stalled waiting for it (a dead rank's last beat often shows it in a collective, like the others)
SILENT_JUDGED_S = 4 * storebeat.STORE_BEAT_S
FIRST_ANSWER_S = 60.0  # the watchdog waits this long for the store's first answer before judging without it
STORE_GONE_S = 15.0
READER_CONNECT_S = 3.0
RECONNECT_S = 5.0  # after a failure: the job is often ending then, and a connect in progress delays the end
LINGER_S = 3 * storebeat.STORE_BEAT_S + READER_CONNECT_S + 2  # a stopping node waits this long for the others
STATUS_FILE = "store-peers.json"
MAX_VALUE = 256 * 1024  # a heartbeat larger than this is not one of ours
MAX_RELAY = 4 * 1024 * 1024  # a node's relay: its ranks' heartbeats without frames
RELAY_GRACE_S = 3 * storebeat.STORE_BEAT_S  # a rank's key no node relays after this is read on its own
FETCH_CHUNK = 256  # rank keys per ``multi_get`` when reading the frames
#: a rank silent in its node's relay whose own key held a later beat is gone when that key then stands still this long
CONFIRM_S = 3 * storebeat.STORE_BEAT_S
JUDGE_WAIT_S = 10.0  # a node that lost the claim to judge waits this long for the judge's verdict


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
        self.local: set = set()  # this node's ranks (the watchdog's own heartbeat files): read and relayed
        self.node: Optional[int] = None  # this node's rank, from its ranks' heartbeats
        self.relay_seq = 0
        self.frames: Dict[int, List[Dict[str, Any]]] = {}  # rank -> frames read when judging
        self._confirming: Dict[int, Tuple[Any, float]] = {}  # rank -> ((pid, seq) of its own key, when first read)
        self._uncovered: Dict[int, float] = {}  # rank -> when its key was first seen that no node relays
        self.registered: set = set()  # ranks whose key exists (:data:`storebeat.RANKS_KEY`, as last read)
        self.listed: Optional[int] = None  # the node this reader listed in :data:`storebeat.NODES_KEY`
        self._store = None
        # a second connection the reader makes once it is up, for the verdict's calls (claim, publish, the frames):
        # a c10d connect can take seconds on a loaded machine (its retries), and a verdict is no time to make one
        # (it waits without Python's lock, unlike ``list_keys``: tests/guard/test_peers.py)
        self._spare = None
        self._spare_busy = threading.Lock()
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
        return _parse(store.get(key))

    def _read_each(self, store) -> Tuple[Dict[int, Optional[Dict[str, Any]]], Optional[Dict[str, Any]], set]:
        """Every rank's own key (``check`` then ``get``): a torch without ``multi_get``/``append``."""
        got = {r: self._read(store, f"{storebeat.PREFIX}{r}") for r in range(self.world_size)}
        verdict = self._read(store, storebeat.VERDICT_KEY)
        nodes = {hb.get("node_rank") for hb in got.values() if hb is not None}
        seen_by = {n for n in nodes if isinstance(n, int) and store.check([f"{storebeat.SEEN_PREFIX}{n}"])} \
            if verdict is not None else set()
        return got, verdict, seen_by

    def _read_relayed(self, store, now: float
                      ) -> Tuple[Dict[int, Optional[Dict[str, Any]]], Optional[Dict[str, Any]], set]:
        """This node's ranks from their keys (relayed under its node's key), the others from their nodes' relays.

        Every key read exists (a ``multi_get`` of a missing key waits for it): the relays from :data:`NODES_KEY`, the
        ranks' keys from :data:`RANKS_KEY`, read only while some rank is neither relayed nor known."""
        got: Dict[int, Optional[Dict[str, Any]]] = {}
        own = self.node
        relays = [n for n in _listed(_peek(store, storebeat.NODES_KEY), 1 << 20) if n != own]
        for raw in store.multi_get([f"{storebeat.NODE_PREFIX}{n}" for n in relays]) if relays else []:
            relay = _parse(raw, MAX_RELAY)
            for r, hb in (relay.get("beats") if relay and isinstance(relay.get("beats"), dict) else {}).items():
                if str(r).isdigit() and int(r) < self.world_size and isinstance(hb, dict):
                    got[int(r)] = hb
        if (self.local | (set(range(self.world_size)) - set(got))) - self.registered:
            self.registered |= {r for r in _listed(_peek(store, storebeat.RANKS_KEY), self.world_size)}
        local = sorted(self.local & self.registered)
        if local:
            got.update(zip(local, (_parse(raw) for raw in store.multi_get([f"{storebeat.PREFIX}{r}" for r in local]))))
            self._relay(store, {r: got[r] for r in local})
        for r in [r for r in self._uncovered if r in got]:
            del self._uncovered[r]
        alone = [r for r in sorted(self.registered) if r not in got
                 and now - self._uncovered.setdefault(r, now) >= RELAY_GRACE_S]
        if alone:
            got.update(zip(alone, (_parse(raw) for raw in store.multi_get([f"{storebeat.PREFIX}{r}" for r in alone]))))
        verdict = _parse(_peek(store, storebeat.VERDICT_KEY))
        seen_by = set(_listed(_peek(store, storebeat.SEEN_KEY), 1 << 20)) if verdict is not None else set()
        return got, verdict, seen_by

    def _relay(self, store, local: Dict[int, Optional[Dict[str, Any]]]) -> None:
        """This node's ranks' heartbeats, without their frames, in its node's key (listed once in the nodes')."""
        nodes = {hb.get("node_rank") for hb in local.values() if hb is not None}
        node = nodes.pop() if len(nodes) == 1 else None
        if not isinstance(node, int) or isinstance(node, bool) or node < 0:
            return
        self.node, self.relay_seq = node, self.relay_seq + 1
        beats = {str(r): {k: v for k, v in hb.items() if k != "frames"} for r, hb in local.items() if hb}
        store.set(f"{storebeat.NODE_PREFIX}{node}", json.dumps(
            {"node": node, "seq": self.relay_seq, "t": time.time(), "beats": beats}, separators=(",", ":")))
        if self.listed != node:
            store.append(storebeat.NODES_KEY, f"{node},")
            self.listed = node

    def fetch_frames(self, timeout_s: float = 3 * READER_CONNECT_S) -> None:
        """Every rank's frames from its own key, once (the relays carry none): for the verdict of this node."""
        ranks = sorted(self.snapshot()[0])
        found: Dict[int, List[Dict[str, Any]]] = {}

        own: Dict[int, Dict[str, Any]] = {}

        def run(store) -> None:  # the frames, and the beats a stale relay left behind
            if not _fast(store):
                return
            for i in range(0, len(ranks), FETCH_CHUNK):
                part = ranks[i:i + FETCH_CHUNK]
                for r, raw in zip(part, store.multi_get([f"{storebeat.PREFIX}{r}" for r in part])):
                    hb = _parse(raw)
                    if hb is not None:
                        own[r] = hb
                        if isinstance(hb.get("frames"), list):
                            found[r] = hb["frames"]

        if ranks:
            self._in_thread(run, timeout_s)
        with self._lock:
            self.frames.update(found)
        self._moved_since(own)

    def confirm_silent(self, ranks: List[int], timeout_s: float = READER_CONNECT_S + 2) -> Tuple[List[int], List[int]]:
        """Of ``ranks`` (silent in their nodes' relays), ``(gone, pending)``: gone, those whose own key stood still
        too; pending, those whose own key holds a later beat than the relay gave, until a second reading tells.

        A node's relay stands still when its watchdog is slow (its process held for seconds), not its ranks; and when
        a whole node stops, its relay's last beats are often a beat behind its ranks' own keys. So a later beat in a
        rank's own key is not yet life: the rank lives when its own key moves between two readings, and is gone when
        it stood still for :data:`CONFIRM_S` (its publisher beats every second). The watchdog judges once none is
        pending: a lost node's ranks are then named together, not the one whose relayed beat happened to be current."""
        own: Dict[int, Dict[str, Any]] = {}

        def run(store) -> None:
            raws = store.multi_get([f"{storebeat.PREFIX}{r}" for r in ranks]) if _fast(store) else \
                [store.get(f"{storebeat.PREFIX}{r}") for r in ranks]
            own.update((r, hb) for r, hb in zip(ranks, map(_parse, raws)) if hb is not None)

        if ranks:
            self._in_thread(run, timeout_s)
        now = time.time()
        gone: List[int] = []
        pending: List[int] = []
        with self._lock:
            for r in ranks:
                hb = own.get(r)
                first = self._confirming.get(r)
                if hb is None or not _newer(hb, self.beats.get(r)):
                    self._confirming.pop(r, None)
                    gone.append(r)  # its own key says no more than its relay did
                    continue
                mark = (hb.get("pid"), hb.get("seq"))
                if first is not None and first[0] != mark:  # its own key moved: it lives, its node's relay is slow
                    del self._confirming[r]
                    self.beats[r] = {k: v for k, v in hb.items() if k != "frames"}
                    self.moved[r] = now
                elif first is None:
                    self._confirming[r] = (mark, now)
                    pending.append(r)
                elif now - first[1] >= CONFIRM_S:
                    del self._confirming[r]
                    self.beats[r] = {k: v for k, v in hb.items() if k != "frames"}  # its last beat, for the verdict
                    gone.append(r)
                else:
                    pending.append(r)
        return gone, pending

    def _moved_since(self, own: Dict[int, Dict[str, Any]]) -> set:
        """Take the ranks' beats read from their own keys where their sequence number moved; those ranks."""
        now = time.time()
        moved = set()
        with self._lock:
            for r, hb in own.items():
                if _newer(hb, self.beats.get(r)):
                    self.beats[r] = {k: v for k, v in hb.items() if k != "frames"}
                    self.moved[r] = now
                    moved.add(r)
        return moved

    def claim(self, node: Optional[int]) -> bool:
        """Whether this node judges: the first to claim the job's judgment (``compare_set``), or no store answer."""
        if node is None or self.gone_for() >= STORE_GONE_S:
            return True
        held: List[Any] = []
        self._in_thread(lambda store: held.append(store.compare_set(storebeat.JUDGE_KEY, "", str(node))),
                        READER_CONNECT_S + 2)
        return not held or held[0] in (str(node).encode(), str(node))

    def wait_verdict(self, wait_s: float = JUDGE_WAIT_S) -> Optional[Dict[str, Any]]:
        """The judge's verdict once the reader sees it (waiting up to ``wait_s``); None when none came."""
        end = time.time() + wait_s
        while time.time() < end:
            with self._lock:
                if self.verdict is not None:
                    return self.verdict
            time.sleep(0.2)
        return None

    def refresh(self) -> bool:
        """One read of every rank's heartbeat and of the verdict; False when the store did not answer."""
        now = time.time()  # a store that does not answer fails at the timeout: count from the asking
        try:
            if self._store is None:
                self._store = storebeat.connect(self.addr, READER_CONNECT_S)
            store = self._store
            got, verdict, seen_by = self._read_relayed(store, now) if _fast(store) else self._read_each(store)
            stop = self.stop if self.stop is not None else _parse(_peek(store, storebeat.STOP_KEY)) if _fast(store) \
                else self._read(store, storebeat.STOP_KEY)
            if self._spare is None:
                self._spare = storebeat.connect(self.addr, READER_CONNECT_S)
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/DistStoreError/TimeoutError
            self._store, self.registered, self.listed = None, set(), None  # a new store (a restart) lists anew
            self._spare = None
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
                if _newer(hb, self.beats.get(r)):
                    self.moved[r] = now
                    self._confirming.pop(r, None)
                elif r in self.beats:
                    continue  # not older than what a rank's own key said (a relay a beat behind it)
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
        """Every rank's latest heartbeat (with the frames :meth:`fetch_frames` read, where the beat has none)."""
        with self._lock:
            beats = {r: hb if "frames" in hb or r not in self.frames else dict(hb, frames=self.frames[r])
                     for r, hb in self.beats.items()}
            return beats, dict(self.moved)

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
                _mark_seen(store, node)

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
        self._in_thread(lambda store: _mark_seen(store, node), READER_CONNECT_S + 2)

    def _in_thread(self, fn, timeout_s: float) -> None:
        """``fn(store)`` on the reader's spare connection (a new one when it is busy or broken), in a daemon thread
        joined with ``timeout_s`` (a frozen store's call never returns)."""
        def run() -> None:
            spare = self._spare
            if spare is not None and self._spare_busy.acquire(blocking=False):
                try:  # (a call that never returns keeps it busy: the next ones connect anew)
                    fn(spare)
                    return
                except Exception:  # noqa: BLE001 - the connection broke: a new one
                    self._spare = None
                finally:
                    self._spare_busy.release()
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


def _newer(hb: Dict[str, Any], known: Optional[Dict[str, Any]]) -> bool:
    """Whether heartbeat ``hb`` is a later one of its rank than ``known``: another process (a restart), or a larger
    sequence number (a node's relay may be a beat or more behind the rank's own key)."""
    if known is None:
        return True
    seq, old = hb.get("seq"), known.get("seq")
    if hb.get("pid") != known.get("pid") or not isinstance(seq, int) or not isinstance(old, int):
        return seq != old or hb.get("pid") != known.get("pid")
    return seq > old


def _fast(store) -> bool:
    """Whether the store client reads many keys in one round trip and keeps lists (``multi_get``, ``append``)."""
    return hasattr(store, "multi_get") and hasattr(store, "append")


ABSENT = "\x00zeropilot:absent"


def _peek(store, key: str) -> Optional[bytes]:
    """``key``'s value, or None when it does not exist, in one round trip that never waits for the key (``get``
    does): a ``compare_set`` to the value it expects, which writes nothing (a missing key answers the expected)."""
    raw = store.compare_set(key, ABSENT, ABSENT)
    return None if raw in (ABSENT, ABSENT.encode()) else raw


def _listed(raw: Optional[bytes], below: int) -> List[int]:
    """The numbers of a list kept by ``append`` (``"3,17,"``) that are under ``below``, in order, once each."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) > 8 * 1024 * 1024:
        return []
    out = dict.fromkeys(int(t) for t in bytes(raw).split(b",") if t.isdigit() and len(t) < 10 and int(t) < below)
    return list(out)


def _mark_seen(store, node: int) -> None:
    """Node ``node``'s watchdog has taken the verdict: in the list the readers read, or its own key (torch < 2.6)."""
    if _fast(store):
        store.append(storebeat.SEEN_KEY, f"{node},")
    else:
        store.set(f"{storebeat.SEEN_PREFIX}{node}", "1")


def _parse(raw: Any, limit: int = MAX_VALUE) -> Optional[Dict[str, Any]]:
    """A JSON object from the store (another process's report: checked, never trusted); None otherwise."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) > limit:
        return None
    try:
        value = json.loads(bytes(raw).decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _suffix(key: str, prefix: str) -> Optional[int]:
    tail = key[len(prefix):]
    return int(tail) if tail.isdigit() and len(tail) < 10 else None


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
