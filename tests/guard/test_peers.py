"""The cross-node watchdog's pure parts and its store reader on a real TCPStore (no job): which store a rank
publishes in, the verdict naming nodes, silent ranks, a store that stops answering, hostile heartbeats, and the
first verdict holding for every node (compare_set)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from zeropilot.guard import storebeat
from zeropilot.runner import peers
from zeropilot.runner.watchdog import _frames, name_nodes, store_gone


def test_the_store_is_the_launchers_unless_named_or_off():
    env = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert storebeat.address(env) == ("node0", 29500)
    assert storebeat.address({**env, "ZEROPILOT_STORE": "10.0.0.1:1234"}) == ("10.0.0.1", 1234)
    assert storebeat.address({**env, "ZEROPILOT_STORE": "off"}) is None
    assert storebeat.address({"MASTER_ADDR": "x", "MASTER_PORT": "99999"}) is None
    assert storebeat.address({}) is None
    one_node = {"world_size": 8, "local_world_size": 8, "nnodes": 1}
    assert not storebeat.across_nodes(one_node, env)
    assert storebeat.across_nodes({"world_size": 16, "local_world_size": 8}, env)
    assert storebeat.across_nodes(one_node, {"ZEROPILOT_STORE": "h:1"})


def _beats(now):
    frames = [{"file": "/job/train.py", "line": 22, "func": "loop"}]
    return {r: {"seq": 1, "t": now - 20, "rank": r, "node_rank": r // 2, "host": f"h{r // 2}", "phase": "forward",
                "frames": frames} for r in range(4)}


def test_a_node_whose_every_rank_is_silent_is_named_lost():
    beats = _beats(time.time())
    gone = {"class": "rank_gone", "ranks": [2, 3], "cause": "rank(s) 2, 3 are gone", "fixes": []}
    v = name_nodes(gone, beats, {2, 3})
    assert v["class"] == "node_lost" and v["nodes_lost"] == [1]
    assert v["cause"].startswith("node 1 (h1) lost: all its ranks (2, 3)")
    assert [(c["rank"], c["node_rank"], c["host"]) for c in v["culprits"]] == [(2, 1, "h1"), (3, 1, "h1")]
    one = name_nodes({**gone, "ranks": [3]}, beats, {3})  # one rank of the node: a rank gone, named with its node
    assert one["class"] == "rank_gone" and one["cause"].endswith("rank 3 on node 1 (h1)")
    straggler = name_nodes({"class": "straggler", "ranks": [3], "cause": "rank(s) 3 run their own code"}, beats,
                           set())
    assert "train.py:22" in " ".join(straggler["culprits"][0]["where"])


def test_hostile_frames_from_the_store_are_dropped():
    bad = [{"file": 1, "line": 2, "func": "f"}, "x", {"file": "a.py", "line": "3", "func": "g"},
           {"file": "b.py" * 1000, "line": 4, "func": "h"}]
    got = _frames(bad)
    assert len(got) == 1 and len(got[0]["file"]) == 500
    assert _frames("not a list") == [] and _frames(None) == []


def test_store_gone_says_what_and_what_to_do():
    p = peers.Peers.__new__(peers.Peers)
    p.addr, p.error = ("node0", 29500), None
    v = store_gone(p, 17.0)
    assert v["class"] == "store_gone" and "node0:29500" in v["cause"] and "17 s" in v["reason"] and v["fixes"]


@pytest.fixture()
def store():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield server


def _wait(cond, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end and not cond():
        time.sleep(0.1)
    return cond()


def _publish(store, rank, value):
    """What a rank's publisher writes: its key, and the first time its rank in the list of keys."""
    store.set(f"{storebeat.PREFIX}{rank}", value)
    store.append(storebeat.RANKS_KEY, f"{rank},")


def test_the_reader_sees_ranks_names_silent_ones_and_one_verdict_holds(store, tmp_path):
    _publish(store, 0, json.dumps({"seq": 1, "phase": "forward", "rank": 0}))
    _publish(store, 1, b"\xff not json")  # hostile: ignored
    store.append(storebeat.RANKS_KEY, "x,99,-1,")  # hostile: ignored (99 is past the world size)
    p = peers.from_heartbeats({0: {"store": f"127.0.0.1:{store.port}", "world_size": 2}}, None,
                              str(tmp_path / peers.STATUS_FILE))
    try:
        assert _wait(lambda: sorted(p.snapshot()[0]) == [0])  # no node relays it: read from its key after a grace
        assert p.gone_for() == 0.0
        assert json.loads((tmp_path / peers.STATUS_FILE).read_text())["ranks_seen"] == [0]
        assert _wait(lambda: p.silent(after_s=0.5) == [0])  # its sequence number stands still
        assert p.silent(after_s=3600) == []
        first = p.publish_verdict({"verdict": {"class": "straggler"}, "named_by": {"node_rank": 0}})
        second = p.publish_verdict({"verdict": {"class": "collective"}, "named_by": {"node_rank": 1}})
        assert first == second and second["verdict"]["class"] == "straggler"  # the first holds
        store.set(f"{storebeat.PREFIX}0", json.dumps({"seq": 2, "phase": "exit", "rank": 0}))
        assert _wait(lambda: p.snapshot()[0][0]["phase"] == "exit")
        assert p.silent(after_s=0) == []  # a clean end is not silence
    finally:
        p.close()
    assert peers.from_heartbeats({0: {"store": "nohost"}}, 4) is None
    assert peers.from_heartbeats({0: {"store": "h:1", "world_size": 10**9}}, None) is None


def _relay(store, node, beats):
    """What node ``node``'s watchdog writes: its ranks' beats in its key, and the first time its node in the list."""
    store.set(f"{storebeat.NODE_PREFIX}{node}", json.dumps({"node": node, "seq": 1, "beats": beats}))
    store.append(storebeat.NODES_KEY, f"{node},")


def test_a_stopped_nodes_ranks_are_named_together_when_its_relay_was_a_beat_behind(store, monkeypatch):
    """The node-lost shrink that timed out on a loaded machine: node 1 frozen, its relay's last beat of rank 2 one
    behind rank 2's own key, of rank 3 current. Taking rank 2's later own beat for life named rank 3 alone (a rank
    gone, restarted on both nodes: a wait for the frozen one). A later own beat is pending until a second reading:
    moved, the rank lives; stood still for ``CONFIRM_S``, it is gone with its node's others."""
    monkeypatch.setattr(peers, "CONFIRM_S", 0.6)

    def beat(r, seq, phase="forward"):
        return {"seq": seq, "pid": 100 + r, "rank": r, "node_rank": r // 2, "phase": phase}

    for r, seq in ((2, 5), (3, 4)):
        _publish(store, r, json.dumps(beat(r, seq, "backward")))
    _relay(store, 1, {"2": beat(2, 4), "3": beat(3, 4)})
    p = peers.from_heartbeats({0: {"store": f"127.0.0.1:{store.port}", "world_size": 4}}, None)
    try:
        assert _wait(lambda: sorted(p.snapshot()[0]) == [2, 3])
        assert p.confirm_silent([2, 3]) == ([3], [2])  # rank 2's own key is a beat ahead: not yet life
        assert p.confirm_silent([2, 3]) == ([3], [2])
        time.sleep(0.7)
        assert p.confirm_silent([2, 3]) == ([2, 3], [])  # it stood still: both gone, node 1 lost
        assert p.snapshot()[0][2]["phase"] == "backward"  # the verdict reads its last own beat
        # a node whose watchdog is slow (its relay still) but whose rank beats on: pending, then alive
        store.set(f"{storebeat.PREFIX}3", json.dumps(beat(3, 9)))
        assert p.confirm_silent([3]) == ([], [3])
        store.set(f"{storebeat.PREFIX}3", json.dumps(beat(3, 10)))
        assert p.confirm_silent([3]) == ([], []) and p.snapshot()[0][3]["seq"] == 10
        assert 3 not in p.silent(after_s=5)
    finally:
        p.close()


def test_a_verdict_the_reader_saw_holds_after_its_store_is_gone_and_nodes_that_took_it_are_known():
    """The race the two-node straggler job met on a loaded machine: node 0 published, took its verdict and stopped its
    job, its launcher's store with it, while node 1 was still judging; node 1's reader had seen node 0's verdict, but
    node 1 could no longer publish and kept its own: two verdicts. The verdict seen holds; a node that takes it marks
    so, and a node about to stop waits for those marks (``Watchdog.linger``)."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    for r in range(4):
        _publish(server, r, json.dumps({"seq": 1, "phase": "forward", "rank": r, "node_rank": r // 2}))
    first = {"verdict": {"class": "straggler", "ranks": [3]}, "named_by": {"node_rank": 0}}
    p0 = peers.from_heartbeats({0: {"store": f"127.0.0.1:{server.port}", "world_size": 4}}, None)
    p1 = peers.from_heartbeats({2: {"store": f"127.0.0.1:{server.port}", "world_size": 4}}, None)
    try:
        assert p0.publish_verdict(first, 0) == first and p0.confirmed
        assert _wait(lambda: p1.verdict == first) and _wait(lambda: p0.seen_by == {0})
        p1.acknowledge(1)
        assert _wait(lambda: p0.seen_by == {0, 1})  # node 0 may stop now: node 1 has it
        del server  # node 0's launcher ended: its store with it
        assert _wait(lambda: p1.gone_for() > 0, 10)
        own = {"verdict": {"class": "straggler", "ranks": [3], "reason": "node 1's flight records"},
               "named_by": {"node_rank": 1}}
        assert p1.publish_verdict(own, 1) == first and p1.confirmed  # the verdict seen holds, not node 1's own
    finally:
        p0.close()
        p1.close()


def test_a_frozen_store_never_holds_the_watchdog():
    """The store's machine frozen (SIGSTOP: a power loss or a cut network looks the same): its calls never return.
    ``list_keys`` held Python's lock meanwhile and froze the whole ``zeropilot run``; the reader's calls must leave
    the watchdog's own thread running, which then counts the store gone."""
    import faulthandler
    import os
    import signal
    import subprocess
    import sys

    serve = ("import time, torch.distributed as d\n"
             "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
             "print(s.port, flush=True)\ntime.sleep(300)\n")
    server = subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = storebeat.connect(("127.0.0.1", port), 5)
        for r in range(4):
            _publish(client, r, json.dumps({"seq": 1, "phase": "forward", "rank": r, "node_rank": r // 2}))
        p = peers.from_heartbeats({0: {"store": f"127.0.0.1:{port}", "world_size": 4}}, None)
        p.local = {0, 1}
        try:
            assert _wait(lambda: sorted(p.snapshot()[0]) == [0, 1, 2, 3] and p.node == 0)
            os.kill(server.pid, signal.SIGSTOP)
            faulthandler.dump_traceback_later(120, exit=True)  # a frozen process ends the run, never hangs it
            gaps, last, end = [], time.time(), time.time() + 3 * storebeat.STORE_BEAT_S + peers.READER_CONNECT_S + 3
            while last < end:  # this thread runs on while the reader waits on the store
                time.sleep(0.1)
                gaps.append(time.time() - last)
                last = time.time()
            assert max(gaps) < 2.0, max(gaps)
            assert p.gone_for() > 0
            started = time.time()
            assert p.claim(0) and time.time() - started < peers.READER_CONNECT_S + 4  # no answer: this node judges
        finally:
            p.close()
            faulthandler.cancel_dump_traceback_later()
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.parametrize("call, holds", [("connect", False), ("multi_get", False), ("list_keys", True)])
def test_which_store_calls_hold_pythons_lock_on_a_frozen_store(call, holds):
    """Why the reader never calls ``list_keys`` (the lists kept by ``append`` instead) and may connect or read from a
    thread: on a frozen store (its process stopped) ``list_keys`` holds Python's lock while it waits, so no other
    thread of the process runs; a connect (with its retries) and a ``multi_get`` wait without it."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("jobs") / "frozen_store_call.py"
    proc = subprocess.Popen([sys.executable, str(script), call], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        out = ""
    finally:  # the process and its frozen server, one group: never left behind, stopped or not
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    if not out:
        out = proc.communicate()[0]
    ticks = [float(line.split()[1]) for line in out.splitlines() if line.startswith("tick ")]
    if holds:
        assert "done" not in out and len(ticks) <= 2, out  # the main thread stopped once the call began
    else:
        assert "done" in out and ticks and max(ticks) < 1.0, out
