"""The hang verdict as a pure function: faulthandler text in, which rank is where out."""

from __future__ import annotations

from zeropilot.guard.hangs import RankState, collective, hang_verdict, parse_stacks
from zeropilot.runlog import frames
from zeropilot.runlog.layout import STACKS_MARKER

DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/x/zeropilot/guard/rank.py", line 170 in _beat_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "/sp/torch/distributed/distributed_c10d.py", line 5356 in barrier
  File "/sp/deepspeed/comm/torch.py", line 519 in barrier
  File "/sp/deepspeed/runtime/engine.py", line 4900 in save_checkpoint
  File "/work/train.py", line 57 in main
  File "/work/train.py", line 67 in <module>
"""


def test_parse_takes_the_main_thread_of_the_last_dump_innermost_last():
    text = "old garbage\n" + STACKS_MARKER + " 1 ---\n" + DUMP
    frames = parse_stacks("Thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f\n" + text)
    assert [f["func"] for f in frames] == ["<module>", "main", "save_checkpoint", "barrier", "barrier"]
    assert collective(frames) == "barrier"


def test_rank_outside_collective_is_the_odd_one():
    waiting = RankState(0, phase="save", step=2, alive=True, frames=parse_stacks(DUMP))
    sleeping = RankState(1, phase="idle", step=2, alive=True, frames=[
        {"file": "/work/train.py", "line": 67, "func": "<module>"},
        {"file": "/work/train.py", "line": 60, "func": "main"}])
    v = hang_verdict([waiting, sleeping], 2, 8.0)
    assert v["ranks"] == [1] and v["where"][-1].startswith("main")


def test_dead_and_missing_ranks_come_first():
    waiting = RankState(0, phase="step", step=5, alive=True, frames=parse_stacks(DUMP))
    dead = RankState(1, phase="save:write", step=5, alive=False, frames=[])
    v = hang_verdict([waiting, dead], 3, 60.0)
    assert v["ranks"] == [1, 2] and "gone or never started" in v["cause"]


def test_no_rank_and_a_lock_blames_the_lock():
    v = hang_verdict([], 2, 30.0, [{"path": "/c/torch_extensions/py311/op/lock", "age_s": 900.0}])
    assert "lock" in v["cause"] and v["fixes"][0].startswith("if no build is running, delete /c/")


def _waits_on_lock(rank):
    return RankState(rank, phase="init", step=0, alive=True, frames=[
        {"file": "/work/train.py", "line": 9, "func": "main"},
        {"file": "/sp/torch/utils/cpp_extension.py", "line": 2400, "func": "_jit_compile"},
        {"file": "/sp/torch/utils/file_baton.py", "line": 50, "func": "wait"}])


def test_a_lock_our_live_holder_sits_on_is_a_stalled_build_naming_the_holder_not_a_stale_lock():
    lock = {"path": "/e/op/lock", "age_s": 40.0, "state": "live", "holder_rank": "0", "holder_pid": 7}
    holder = RankState(0, phase="init", step=0, alive=True, frames=[
        {"file": "/work/train.py", "line": 9, "func": "main"},
        {"file": "/sp/torch/utils/cpp_extension.py", "line": 2893, "func": "_run_ninja_build"},
        {"file": "/usr/lib/python3.11/subprocess.py", "line": 1196, "func": "communicate"}])
    v = hang_verdict([holder, _waits_on_lock(1)], 2, 30.0, [lock])
    assert v["class"] == "build_stalled" and v["ranks"] == [0] and "taken by rank(s) 0" in v["cause"]
    v = hang_verdict([_waits_on_lock(0), _waits_on_lock(1)], 2, 30.0, [dict(lock, state="stale", holder_rank=None)])
    assert v["class"] == "stale_lock" and v["ranks"] == [0, 1] and v["fixes"][0].endswith("/e/op/lock")


def test_zero3s_own_gather_is_a_collective():
    frames = [{"file": "/work/train.py", "line": 82, "func": "main"},
              {"file": "/sp/deepspeed/runtime/engine.py", "line": 4954, "func": "save_checkpoint"},
              {"file": "/sp/deepspeed/runtime/zero/partition_parameters.py", "line": 2112,
               "func": "_allgather_params_coalesced"}]
    assert collective(frames) == "_allgather_params_coalesced"



def _clone_dump(collective_call: str, line: int, ds_call: str) -> str:
    """Stacks of a rank of tests/guard/jobs/ds_faults.py run from a clone, with its virtual environment inside."""
    clone = "/tmp/x/zeropilot"
    sp = f"{clone}/.venv/lib/python3.11/site-packages"
    return f"""Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "{clone}/src/zeropilot/guard/rank.py", line 170 in _beat_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "{sp}/torch/distributed/distributed_c10d.py", line {line} in {collective_call}
  File "{sp}/deepspeed/comm/torch.py", line 519 in {collective_call}
  File "{sp}/deepspeed/runtime/engine.py", line 4900 in {ds_call}
  File "{clone}/src/zeropilot/guard/deepspeed_hooks.py", line 80 in wrapped
  File "{clone}/tests/guard/jobs/ds_faults.py", line 76 in main
  File "{clone}/tests/guard/jobs/ds_faults.py", line 95 in <module>
"""


def test_a_script_in_a_checkout_named_zeropilot_is_the_users_code():
    """``git clone`` names the checkout ``zeropilot``: its scripts are still the user's code, so the save-partial
    verdict shows the save the script called (from such a clone it once showed only the barrier)."""
    saving = RankState(0, phase="save", step=2, alive=True, frames=parse_stacks(_clone_dump("barrier", 5356,
                                                                                            "save_checkpoint")))
    training = RankState(1, phase="step", step=3, alive=True, frames=parse_stacks(_clone_dump("all_reduce", 2800,
                                                                                              "step")))
    v = hang_verdict([saving, training], 2, 10.0)
    assert v["class"] == "save_partial" and v["ranks"] == [0]
    assert v["where"] == ["<module> (ds_faults.py:95)", "main (ds_faults.py:76)",
                          "save_checkpoint (deepspeed/runtime/engine.py:4900)",
                          "barrier (torch/distributed/distributed_c10d.py:5356)"]
    assert frames.kind_of("/tmp/x/zeropilot/src/zeropilot/guard/rank.py") == "library"
    assert frames.kind_of("/tmp/x/zeropilot/src/zeropilot/check.py") == "library"


def _slow_gpu(rank):
    """A finding of ``runlog.stragglers.find_gpu``: the rank's card ran the probe at 2.1x its peers' median."""
    return {"rank": rank, "evidence": "gpu", "ratio": 2.1, "windows": 3, "probes": 12, "first_step": 20,
            "last_step": 130, "own_seconds": 0.00105, "peers_seconds": 0.0005, "place": {"gpu": rank}}


def test_every_rank_in_one_collective_after_a_gpu_straggled_blames_that_rank():
    states = [RankState(r, phase="backward", step=140, alive=True, frames=parse_stacks(DUMP)) for r in range(4)]
    plain = hang_verdict(states, 4, 60.0)
    assert plain["class"] == "collective" and plain["ranks"] == [0, 1, 2, 3] and "stragglers_before" not in plain
    v = hang_verdict(states, 4, 60.0, slow=[_slow_gpu(2)])
    assert v["class"] == "collective" and v["ranks"] == [2]
    assert "the likely cause, straggling before the stall: rank 2 (GPU 2) has a slow GPU" in v["cause"]
    assert v["stragglers_before"] == [_slow_gpu(2)]
    # the flight recorder's word comes first: it saw rank 3 behind
    fr = {"ranks": {str(r): {"pg0": {"newest": 40 if r == 3 else 41}} for r in range(4)}}
    v = hang_verdict(states, 4, 60.0, fr=fr, slow=[_slow_gpu(2)])
    assert v["ranks"] == [3] and "Before the stall, rank 2 (GPU 2) has a slow GPU" in v["cause"]


def test_another_class_keeps_its_culprit_and_names_the_straggler_beside_it():
    waiting = RankState(0, phase="save", step=2, alive=True, frames=parse_stacks(DUMP))
    sleeping = RankState(1, phase="idle", step=2, alive=True, frames=[
        {"file": "/work/train.py", "line": 67, "func": "<module>"},
        {"file": "/work/train.py", "line": 60, "func": "main"}])
    v = hang_verdict([waiting, sleeping], 2, 8.0, slow=[_slow_gpu(0)])
    assert v["class"] == "straggler" and v["ranks"] == [1] and "Before the stall, rank 0" in v["cause"]
