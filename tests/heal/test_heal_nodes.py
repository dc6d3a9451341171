"""Healing across nodes on real ranks (CPU, gloo): two ``torchrun --nnodes 2 --nproc_per_node 1`` launchers on this
machine, each under its own ``zeropilot run --heal`` (tests/heal/nodes.py), an HF Trainer + DeepSpeed job
(tests/guard/jobs/hf_train.py) or a raw ZeRO-3 loop that loads its own folder (tests/guard/jobs/ds_shrink.py).

- preemption of ONE node: SIGTERM to node 1's ``zeropilot run`` only; its stop step is published in the job's c10d
  store, node 0's supervisor takes it from there, and both nodes' ranks save at the same step (one complete
  checkpoint) and stop; the same two ``zeropilot run --heal`` again resume both nodes from it;
- an HF Trainer job shrunk to one node (node 1 frozen after a save, then gone): node 0 restarts alone from the
  universal conversion with gradient accumulation doubled, and its losses are those of a run that never failed;
- the wait for a replacement node (shrinking not allowed): node 0 restarts the same launch, its rendezvous waits,
  a new node 1 launcher comes later, the job goes on from the last save together.
"""

from __future__ import annotations

import functools
import json
import signal
import time
from pathlib import Path

import pytest

from tests import runjobs
from tests.heal.nodes import records, run_nodes, torchrun, until

pytestmark = [pytest.mark.slow]
JOBS = runjobs.JOBS
HEAL = ["--no-check", "--heal", "--heal-backoff", "0.5"]


def _hf(out: Path, steps: int, *extra: str) -> list:
    return [str(JOBS / "hf_train.py"), str(out), "--stage", "2", "--steps", str(steps), "--logging-steps", "1",
            "--per_device_train_batch_size", "1", *extra]


# -- one node preempted: one stop step for the job, through the store ----------------------------------------------

@functools.lru_cache(maxsize=None)
def _preempted() -> dict:
    base = runjobs.root() / "nodes_preempt"
    base.mkdir(parents=True, exist_ok=True)
    port = runjobs.free_port()
    script = _hf(base / "ckpt", 16, "--save-steps", "100", "--step-sleep", "1.0")
    commands = [torchrun(2, k, port, 1, script) for k in (0, 1)]
    outs = [base / "node0", base / "node1"]
    sent = {}

    def sigterm_node_1(nodes, deadline):
        until(lambda: any(r["step"] >= 2 for r in records(outs[1], "step")), deadline, "rank 1 at step 2", nodes)
        sent["t"] = time.time()
        nodes[1].proc.send_signal(signal.SIGTERM)

    first = run_nodes("nodes_preempt", commands, HEAL, outs, sigterm_node_1)
    again = run_nodes("nodes_preempt", commands, HEAL, outs)
    return {"first": first, "again": again, "base": base, "outs": outs, "sent": sent}


def test_sigterm_to_one_node_stops_every_node_at_one_step_with_one_complete_checkpoint():
    job = _preempted()
    first, outs = job["first"], job["outs"]
    assert [n.proc.returncode for n in first] == [128 + signal.SIGTERM] * 2, first[1].log[-3000:]
    pre = [json.loads((o / f"run-node-{k}.json").read_text())["preempted"] for k, o in enumerate(outs)]
    stop = pre[1]["stop_step"]
    assert pre[1]["shared"]["own"] is True and pre[1]["signalled"] is True
    assert pre[0]["shared"] == {"store": pre[1]["shared"]["store"], "by_node": 1, "own": False}
    assert pre[0]["signalled"] is False and pre[0]["signal"] == "SIGTERM"  # node 0 was never signalled
    assert pre[0]["stop_step"] == pre[0]["saved_step"] == pre[1]["saved_step"] == stop
    took = records(outs[0], "preempt") + records(outs[1], "preempt")
    assert sorted(r["rank"] for r in took) == [0, 1] and {r["step"] for r in took} == {stop}
    assert not any(r["late"] for r in took)
    saves = [r for r in records(outs[0], "save") + records(outs[1], "save") if not r.get("error")]
    assert sorted(r["rank"] for r in saves if r["step"] == stop) == [0, 1]
    ckpt = job["base"] / "ckpt" / f"checkpoint-{stop}"
    assert len(list((ckpt / f"global_step{stop}").glob("*optim_states.pt"))) == 2  # both ranks' partitions
    assert "node 1 was preempted (SIGTERM): every rank saves at the end of step" in first[0].log
    for n in first:  # heal.json as the second runs left it: attempt 1 preempted
        assert n.heal()["attempts"][0]["failure"]["kind"] == "preempted"
    assert "node 1's zeropilot run" in first[0].heal()["attempts"][0]["failure"]["reason"]


def test_the_same_two_heal_runs_again_resume_both_nodes_from_the_shared_stop_step():
    job = _preempted()
    again, outs = job["again"], job["outs"]
    stop = json.loads((outs[1] / "run-node-1.json").read_text())["preempted"]["saved_step"]
    assert [n.proc.returncode for n in again] == [0, 0], again[0].log[-3000:]
    for n in again:
        doc = n.heal()
        second = doc["attempts"][-1]
        assert doc["outcome"]["status"] == "healed" and second["resume"]["chosen"]["step"] == stop
        assert second["resumed"]["really"] is True and second["steps_redone"] == 0
        steps = [r["step"] for r in records(n.out / second["dir"], "step")]
        assert steps[0] == stop + 1 and steps[-1] == 16
