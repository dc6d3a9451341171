"""A lost node without processes: the torchrun command rewritten for the survivors, the batch arithmetic that keeps
the samples per optimizer step, the refusal (and the bounded wait) without ``--heal-allow shrink``, the config copy.
The real two-node run is test_shrink_run.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from tests.conftest import write_files
from tests.heal.test_patch import _launch, here  # noqa: F401  (a fixture)
from tests.report.conftest import validate  # noqa: F401 - the report schema's validator, a fixture
from zeropilot.heal import shrink

NODE1 = ["torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
         "--master_port", "29500", "train.py", "--deepspeed_config", "ds.json", "--nnodes", "7"]


def test_one_survivor_gets_its_own_rendezvous_and_the_scripts_arguments_are_kept():
    out = shrink.rewrite_torchrun(NODE1, 1, 0)
    assert out == ["torchrun", "--nnodes", "1", "--standalone", "--nproc_per_node", "2", "train.py",
                   "--deepspeed_config", "ds.json", "--nnodes", "7"]


def test_dashed_and_equals_spellings_and_python_m_are_rewritten():
    cmd = ["python", "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=2", "--node-rank=0",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "job", "--rdzv-conf", "timeout=30",
           "t.py"]
    assert shrink.rewrite_torchrun(cmd, 1, 0) == ["python", "-m", "torch.distributed.run", "--nnodes", "1",
                                                  "--standalone", "--nproc-per-node=2", "--rdzv-conf", "timeout=30",
                                                  "t.py"]


def test_several_survivors_keep_the_rendezvous_and_are_renumbered():
    cmd = ["torchrun", "--nnodes", "3", "--nproc_per_node", "2", "--node_rank", "2", "--master_addr", "h",
           "--master_port", "1", "t.py"]
    lost = shrink.Lost(nodes=[1], ranks=[2, 3], world=6, nnodes=3, node_rank=2)
    assert (lost.new_nnodes, lost.new_node_rank, lost.new_world) == (2, 1, 4)
    assert shrink.rewrite_torchrun(cmd, lost.new_nnodes, lost.new_node_rank) == \
        ["torchrun", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "h",
         "--master_port", "1", "t.py"]


def test_a_launch_that_is_not_torchrun_is_not_rewritten():
    why = shrink.rewrite_torchrun(["deepspeed", "--hostfile", "h", "t.py"], 1, 0)
    assert isinstance(why, str) and "torchrun" in why


@pytest.mark.parametrize("micro, ga, world, new, kept", [
    (4, 1, 4, 2, (4, 2)), (2, 3, 8, 6, (2, 4)), (3, 1, 4, 3, (2, 2)), (1, 1, 3, 2, None), (4, 4, 16, 8, (4, 8))])
def test_gradient_accumulation_keeps_the_samples_per_step(micro, ga, world, new, kept):
    got = shrink.keep_samples(micro, ga, world, new)
    if kept is None:
        assert isinstance(got, str) and "do not split over 2 ranks" in got
    else:
        assert got == kept


@given(st.integers(1, 16), st.integers(1, 16), st.integers(2, 64), st.integers(1, 64))
def test_the_samples_per_step_are_kept_or_the_shrink_is_refused(micro, ga, world, new):
    got = shrink.keep_samples(micro, ga, world, min(new, world - 1))
    n = min(new, world - 1)
    if isinstance(got, str):
        assert (micro * ga * world) % n != 0
    else:
        assert got[0] * got[1] * n == micro * ga * world and 1 <= got[0] <= micro


VERDICT = {"kind": "hang", "class": "node_lost", "ranks": [2, 3], "nodes_lost": [1]}


def test_without_heal_allow_shrink_the_survivors_wait_for_the_node_and_say_for_how_long():
    lost = shrink.lost_of(VERDICT, NODE1[:6] + ["0"] + NODE1[7:], 4)
    assert lost == shrink.Lost([1], [2, 3], 4, 2, 0)
    why = shrink.refusal([], lost)
    assert "--heal-allow shrink" in why and shrink.refusal(["seq_len"], lost) == why
    assert shrink.refusal(["shrink"], lost) is None
    wait = shrink.waiting(lost, NODE1, why)
    assert (wait["nodes"], wait["timeout_s"]) == ([1], shrink.TORCHRUN_RDZV_TIMEOUT_S)
    assert "waits for node 1 at most 600 s (torchrun's rendezvous timeout 600 s)" in wait["what"]
    with_conf = NODE1[:1] + ["--rdzv-conf", "join_timeout=120"] + NODE1[1:]
    assert shrink.waiting(lost, with_conf, why)["timeout_s"] == 120
    # the watchdog's limit for a job with no rank yet (at least its start-up grace of 120 s) may end it first
    assert shrink.waiting(lost, NODE1, why, 300.0)["timeout_s"] == 300
    assert shrink.waiting(lost, NODE1, why, 30.0)["timeout_s"] == 120
    assert "the watchdog's start-up limit 120 s" in shrink.waiting(lost, NODE1, why, 30.0)["what"]


def test_a_lost_node_the_command_cannot_place_is_refused_even_when_allowed():
    assert "not a torchrun launch" in shrink.refusal(["shrink"], shrink.lost_of(VERDICT, ["python", "t.py"], 4))
    assert "no node is left" in shrink.lost_of(dict(VERDICT, nodes_lost=[0, 1]), NODE1, 4)


def test_the_shrunk_launch_is_a_copy_with_more_accumulation_and_load_universal(here):  # noqa: F811
    write_files(here, {"train.py": "import deepspeed\n", "ds.json": '{"train_micro_batch_size_per_gpu": 4,\n'
                       ' "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3}}\n'})
    cmd = NODE1[:-2]
    lost = shrink.Lost([1], [2, 3], 4, 2, 1)
    s = shrink.plan(lost, (4, 1, 4), cmd, {}, _launch(here, cmd), here / "attempt-2" / "launch")
    assert isinstance(s, shrink.Shrink), s
    s.patch.write()
    copy = here / "attempt-2" / "launch" / "ds.json"
    assert json.loads(copy.read_text()) == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                            "zero_optimization": {"stage": 3}, "checkpoint": {"load_universal": True}}
    assert json.loads((here / "ds.json").read_text())["gradient_accumulation_steps"] == 1
    assert s.command == ["torchrun", "--nnodes", "1", "--standalone", "--nproc_per_node", "2", "train.py",
                         "--deepspeed_config", str(copy)]
    d = s.to_dict()
    assert (d["samples_per_step"], d["grad_accum"], d["world_size"]) == ([16, 16], [1, 2], [4, 2])
    assert "gradient accumulation 1 -> 2" in shrink.says(s)
    assert "not plain data parallel" in shrink.plan(lost, (4, 1, 2), cmd, {}, None, here)


SETUP = [{"event": "setup", "train": {"micro_batch": 4, "grad_accum": 1, "world_size": 4}}]


def test_decide_without_heal_allow_shrink_waits_and_writes_nothing(tmp_path):
    def never():
        raise AssertionError("nothing is read when shrinking is not allowed")

    last = {"command": NODE1, "env": {}, "world_size": 4}
    plan, wait = shrink.decide([], VERDICT, SETUP, last, tmp_path / "attempt-2", never, never)
    assert plan is None and "--heal-allow shrink" in wait["why"] and wait["nodes"] == [1]
    assert not (tmp_path / "attempt-2").exists()


def test_decide_with_nothing_to_convert_waits_and_says_why(here):  # noqa: F811
    write_files(here, {"train.py": "import deepspeed\n",
                       "ds.json": '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}\n'})
    cmd = NODE1[:6] + ["0"] + NODE1[7:-2]
    last = {"command": cmd, "env": {}, "world_size": 4}
    plan, wait = shrink.decide(["shrink"], VERDICT, SETUP, last, here / "attempt-2", lambda: _launch(here, cmd),
                               lambda: [])
    assert plan is None and wait["why"].endswith("the job saved none") and wait["timeout_s"] == 600
    assert not (here / "attempt-2" / "launch").exists()  # the copies are written only for a shrink that happens


def test_the_report_shows_the_shrink_and_the_wait_and_keeps_a_hostile_one_in_shape(tmp_path, capsys, validate):
    from tests.heal.test_report_heal import GOOD, _attempt
    from tests.report.synth import Spec, write_run
    from zeropilot.cli import main

    lost = {"kind": "hang", "class": "node_lost", "step": 3, "ranks": [2, 3], "reason": "node 1 lost",
            "restart": True, "why": "restart"}
    shrunk = {"nodes_lost": [1], "ranks_lost": [2, 3], "nnodes": [2, 1], "world_size": [4, 2], "micro_batch": [4, 4],
              "grad_accum": [1, 2], "samples_per_step": [16, 16], "settings": ["gradient_accumulation_steps: 1 -> 2"],
              "checkpoint": {"from": "/c", "tag": "global_step2", "to": "/r/attempt-2/universal",
                             "verdict": "resumable only through a universal conversion at 2 ranks"}}
    wait = {"nodes": [1], "timeout_s": 600, "why": "shrinking is not allowed", "what": "waits for node 1 at most 600 s"}
    d = write_run(tmp_path / "run", Spec(ranks=2, steps=3))
    doc = dict(GOOD, attempts=[_attempt(1, failure=lost), _attempt(2, shrink=shrunk), _attempt(3, node_wait=wait),
                               _attempt(4, shrink={"world_size": "x", "checkpoint": [1]}, node_wait=[2])])
    (d / "heal.json").write_text(json.dumps(doc))
    assert main(["report", str(d), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert validate(out) == []
    got = out["heal"]["attempts"]
    assert got[1]["shrink"]["samples_per_step"] == [16, 16] and got[2]["node_wait"]["timeout_s"] == 600
    assert got[3]["shrink"]["world_size"] == [] and got[3]["node_wait"] is None
    assert main(["report", str(d)]) == 0
    text = capsys.readouterr().out
    assert ("    shrunk: node 1 lost: 4 -> 2 ranks, micro batch 4 -> 4, gradient accumulation 1 -> 2 (16 -> 16 samples "
            "per step); resumable only through a universal conversion at 2 ranks\n") in text
    assert "    waits for the lost node: waits for node 1 at most 600 s (shrinking is not allowed)\n" in text


def test_a_restart_after_a_shrink_resumes_from_the_conversion_or_a_newer_save(here):  # noqa: F811
    from zeropilot.heal.checkpoints import Candidate, Choice

    write_files(here, {"train.py": "import deepspeed\n", "ds.json": '{"train_micro_batch_size_per_gpu": 4,\n'
                       ' "gradient_accumulation_steps": 2, "checkpoint": {"load_universal": true}}\n'})
    cmd = ["torchrun", "--nnodes", "1", "--standalone", "--nproc_per_node", "2", "train.py", "--deepspeed_config",
           "ds.json"]
    conv = {"path": str(here / "attempt-2" / "universal"), "tag": "global_step2", "step": 2, "universal": True}
    attempts = [{"attempt": 1}, {"attempt": 2, "shrink": {"nodes_lost": [1]}, "resume": {"chosen": conv}}]
    assert shrink.shrunk([{"key": "shrink"}]) and not shrink.shrunk([{"key": "micro_batch"}])
    copies = here / "attempt-3" / "launch"
    # no save since the conversion: the conversion again, handed over by the guard
    old = Choice(Candidate(here / "ckpt", "global_step2", 2, "deepspeed", world_size=4), [])
    c, e, r = shrink.resume_after(attempts, old, {"chosen": None, "give": None}, cmd, {}, copies, lambda: None)
    assert (c, r["chosen"], r["give"]) == (cmd, conv, conv["path"])
    # a ZeRO save at the smaller world after it: load_universal off on a new copy, that save resumed
    newer = Choice(Candidate(here / "ckpt", "global_step6", 6, "deepspeed", world_size=2), [])
    given = {"chosen": newer.chosen.to_dict(), "give": None, "how": "the script's own load_checkpoint"}
    c, e, r = shrink.resume_after(attempts, newer, given, cmd, {}, copies, lambda: _launch(here, cmd))
    assert r["chosen"]["step"] == 6 and c[-1] == str(copies / "ds.json") and "load_universal turned off" in r["how"]
    assert json.loads((copies / "ds.json").read_text())["checkpoint"] == {"load_universal": False}
