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


# -- node 1 lost: an HF Trainer job shrunk to node 0, or waiting for a replacement -------------------------------

def _lose_node_1(outs, after: Path, rejoin=None):
    """Freeze every process of node 1 once ``after`` exists (a machine gone without closing its connections), end
    them once node 0 named it lost; with ``rejoin(nodes)``: once node 0's next attempt waits for it, start a new
    node 1 (a replacement machine) after 3 s."""
    def during(nodes, deadline):
        from tests.guard.test_watch_nodes import _signal_all, _tree

        until(after.exists, deadline, f"{after} written", nodes)
        frozen = _tree(nodes[1].proc.pid)
        _signal_all(frozen, signal.SIGSTOP)
        until((outs[0] / "hang.json").exists, deadline, "node 0 names node 1 lost", nodes[:1])
        _signal_all(frozen, signal.SIGKILL)
        nodes[1].proc.wait()
        if rejoin is not None:
            until(lambda: (outs[0] / "attempt-2" / "launch.sh").exists(), deadline, "node 0 restarts", nodes[:1])
            time.sleep(3.0)
            rejoin(nodes)
    return during


@functools.lru_cache(maxsize=None)
def _shrunk() -> dict:
    base = runjobs.root() / "nodes_shrink_hf"
    base.mkdir(parents=True, exist_ok=True)
    (base / "z2.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                                              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                                              "zero_optimization": {"stage": 2},
                                              "zero_allow_untested_optimizer": True}))
    port = runjobs.free_port()

    def script(out, ga):
        return _hf(out, 10, "--save-steps", "2", "--step-sleep", "0.5", "--gradient_accumulation_steps", str(ga),
                   "--deepspeed", str(base / "z2.json"))

    # the reference: one node, one rank, 1 x 2 accumulated = the 2-node job's 1 x 1 x 2 samples per step
    ref = runjobs.zeropilot_run("nodes_shrink_hf_ref", ["torchrun", "--nproc_per_node", "1", "--master_port",
                                                        str(runjobs.free_port()), *script(base / "ref", 2)],
                                ["--no-check"])
    outs = [base / "node0", base / "node1"]
    commands = [torchrun(2, k, port, 1, script(base / "ckpt", 1)) for k in (0, 1)]
    flags = [*HEAL, "--heal-allow", "shrink", "--hang-timeout", "300"]
    nodes = run_nodes("nodes_shrink_hf", commands, flags, outs,
                      _lose_node_1(outs, base / "ckpt" / "checkpoint-2" / "trainer_state.json"))
    return {"ref": ref, "nodes": nodes, "base": base, "outs": outs}


def _losses(folder: Path) -> dict:
    state = json.loads((folder / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def test_an_hf_trainer_job_shrunk_to_one_node_keeps_the_samples_per_step_and_its_losses():
    job = _shrunk()
    node0, base = job["nodes"][0], job["base"]
    assert job["ref"].returncode == 0 and node0.proc.returncode == 0, node0.log[-4000:]
    doc = node0.heal()
    first, second = doc["attempts"][0], doc["attempts"][-1]
    assert (first["failure"]["kind"], first["failure"]["class"]) == ("hang", "node_lost")
    assert doc["outcome"]["status"] == "healed" and len(doc["attempts"]) == 2
    s = second["shrink"]
    assert s["world_size"] == [2, 1] and s["grad_accum"] == [1, 2] and s["samples_per_step"] == [2, 2]
    cmd = second["command"]
    assert cmd[cmd.index("--nnodes") + 1] == "1" and "--standalone" in cmd
    assert cmd[cmd.index("--gradient_accumulation_steps") + 1] == "2"
    copy = Path(cmd[cmd.index("--deepspeed") + 1])
    assert json.loads(copy.read_text())["checkpoint"] == {"load_universal": True}
    chosen = second["resume"]["chosen"]
    assert chosen["path"] == str(node0.out / "attempt-2" / "universal") and chosen["step"] >= 2
    load = records(node0.out / "attempt-2", "load")[-1]
    assert load["universal"] is True and load["step"] == chosen["step"] and not load.get("error")
    after = records(node0.out / "attempt-2", "setup")[-1]["train"]
    assert (after["micro_batch"], after["grad_accum"], after["world_size"]) == (1, 2, 1)
    assert second["resumed"]["really"] is True
    # the losses: 2 nodes x 1 rank up to the save, 1 rank x 2 accumulated after, against one rank x 2 throughout
    ref, got = _losses(base / "ref" / "checkpoint-10"), _losses(base / "ckpt" / "checkpoint-10")
    assert sorted(got) == sorted(ref) == list(range(1, 11))
    worst = max(abs(got[k] - ref[k]) / abs(ref[k]) for k in ref)
    assert worst < 1e-5, (got, ref)  # measured: 0 (equal to the last bit, steps 1-10)


@functools.lru_cache(maxsize=None)
def _waited() -> dict:
    base = runjobs.root() / "nodes_wait_hf"
    base.mkdir(parents=True, exist_ok=True)
    port = runjobs.free_port()
    script = _hf(base / "ckpt", 8, "--save-steps", "2", "--step-sleep", "0.5")
    outs = [base / "node0", base / "node1"]
    commands = [torchrun(2, k, port, 1, script) for k in (0, 1)]
    flags = [*HEAL, "--hang-timeout", "300"]  # no --heal-allow shrink: the survivors wait for the node
    came = {}

    def rejoin(nodes):
        from tests.heal.nodes import Node

        came["t"] = time.time()
        nodes[1] = Node("nodes_wait_hf", outs[1], flags, commands[1])  # the replacement: the same heal run again

    nodes = run_nodes("nodes_wait_hf", commands, flags, outs,
                      _lose_node_1(outs, base / "ckpt" / "checkpoint-2" / "trainer_state.json", rejoin))
    return {"nodes": nodes, "base": base, "outs": outs, "came": came}


def test_without_shrink_node_0_waits_for_a_replacement_node_and_both_go_on_from_the_last_save():
    job = _waited()
    node0, node1 = job["nodes"]
    assert node0.proc.returncode == 0 and node1.proc.returncode == 0, node0.log[-3000:] + node1.log[-3000:]
    doc = node0.heal()
    first, second = doc["attempts"][0], doc["attempts"][-1]
    assert (first["failure"]["kind"], first["failure"]["class"]) == ("hang", "node_lost")
    wait = second["node_wait"]
    assert wait["nodes"] == [1] and wait["timeout_s"] == 300 and "not allowed" in wait["why"]
    assert doc["outcome"]["status"] == "healed"
    step = second["resume"]["chosen"]["step"]
    again = node1.heal()["attempts"][-1]  # the replacement's heal run chose the same save
    assert again["resume"]["chosen"]["step"] == step and again["resumed"]["really"] is True
    for n in (node0, node1):
        steps = [r["step"] for r in records(n.out / n.heal()["attempts"][-1]["dir"], "step")]
        assert steps[0] == step + 1 and steps[-1] == 8
    # node 0's ranks started only once the replacement came: its torchrun waited for it at the rendezvous
    began = records(node0.out / second["dir"], "start")
    assert began and min(r["t"] for r in began) > job["came"]["t"] - 0.5
