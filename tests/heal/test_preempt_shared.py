"""The stop step a preempted node shares with the others through the job's c10d store (runner.preempt, runner.peers),
on a real ``TCPStore`` in this process: the first node's request holds, a later one takes it, a node that was not
signalled writes the same ``preempt.json``; the stop step counts the other nodes' ranks' steps."""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pytest

from tests import runjobs
from zeropilot.runlog.layout import RunDir
from zeropilot.runner import peers as peers_mod, preempt

torch_dist = pytest.importorskip("torch.distributed")


def test_the_stop_step_counts_the_other_nodes_ranks_and_a_longer_lead():
    local = {0: [{"step": 3, "t": 10.0}, {"step": 4, "t": 11.0}]}
    assert preempt.stop_step(local) == 4 + 1 + 2  # 2 s at 1 s per step
    assert preempt.stop_step(local, preempt.SHARED_LEAD_S, {2: 6, 3: 5}) == 6 + 1 + 5
    assert preempt.stop_step({}, preempt.SHARED_LEAD_S, {2: 6}) == 6 + 1 + 1  # no step time known: one step more


def _node_dir(tmp_path, name, rank, steps):
    d = RunDir(tmp_path / name)
    d.root.mkdir()
    d.heartbeat(rank).write_text(json.dumps({"phase": "train", "stoppable": True}))
    d.events(rank).write_text("".join(json.dumps({"event": "step", "step": s, "t": float(s)}) + "\n" for s in steps))
    return d


def test_the_first_nodes_stop_request_holds_and_every_node_writes_it(tmp_path):
    port = runjobs.free_port()
    server = torch_dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                                 wait_for_workers=False)
    readers = [peers_mod.Peers(("127.0.0.1", port), 4) for _ in range(3)]
    try:
        # rank 3 (node 1) publishes as the guard's StoreBeat does, and node 1's watchdog relays it to the others
        server.set("zeropilot/hb/3", json.dumps({"seq": 1, "step": 9, "node_rank": 1}))
        server.append("zeropilot/ranks", "3,")
        relay = peers_mod.Peers(("127.0.0.1", port), 4)
        relay.local = {3}
        assert relay.refresh()
        relay.close()
        for p in readers:
            assert p.refresh()
        one = _node_dir(tmp_path, "node1", 2, [5, 6, 7])
        rec = preempt.request(one.root, signal.SIGTERM, 60.0, readers[1], node=1)
        stop = rec["stop_step"]
        assert stop == 9 + 1 + 5 and rec["shared"]["own"] is True and rec["shared"]["by_node"] == 1
        assert json.loads(one.preempt_file.read_text())["stop_step"] == stop
        # node 2 signalled later: it takes node 1's request, not its own
        two = _node_dir(tmp_path, "node2", 3, [20, 21])
        rec2 = preempt.request(two.root, signal.SIGUSR1, 60.0, readers[2], node=2)
        assert rec2["stop_step"] == stop and rec2["shared"] == {"store": readers[2].where, "by_node": 1, "own": False}
        # node 0, never signalled, reads it with the heartbeats and writes the same file
        zero = _node_dir(tmp_path, "node0", 0, [6, 7])
        assert readers[0].refresh() and readers[0].stop["stop_step"] == stop
        got = preempt.adopt(zero.root, readers[0].stop, 60.0, readers[0], node=0)
        assert got["stop_step"] == stop and got["signal"] == "SIGTERM" and got["shared"]["by_node"] == 1
        assert json.loads(zero.preempt_file.read_text())["stop_step"] == stop
    finally:
        for p in readers:
            p.close()


def test_a_node_whose_ranks_cannot_save_does_not_write_the_request(tmp_path):
    d = RunDir(tmp_path / "raw")
    d.root.mkdir()
    d.heartbeat(0).write_text(json.dumps({"phase": "train"}))  # a raw loop: not stoppable

    class Store:
        where = "127.0.0.1:1"

    got = preempt.adopt(d.root, {"stop_step": 7, "signal": "SIGTERM", "node": 1}, 60.0, Store(), node=0)
    assert got["stop_step"] is None and "cannot be asked to save" in got["why"]
    assert not d.preempt_file.exists()
