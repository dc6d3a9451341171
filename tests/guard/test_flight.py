"""Reading NCCL flight-recorder dumps without torch and without running pickled code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from zeropilot.guard.flight import read_dump, summarize

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def test_real_dumps_show_the_desync_of_a_save_on_rank_0_only():
    dumps = {r: read_dump(FIXTURES / f"nccl-trace-rank-{r}") for r in (0, 1)}
    s = summarize(dumps)
    assert s["desync"] == {"group": "default_pg", "seq": 36,
                           "ops": {"0": "all_reduce_barrier", "1": "_reduce_scatter_base"}}
    assert s["ranks"]["1"]["default_pg"]["pending"]["op"] == "_reduce_scatter_base"
    assert s["ranks"]["0"]["default_pg"]["last_completed"]["seq"] == 36
    assert "different collectives" in s["text"][0]


def test_a_pickle_that_names_a_global_is_refused(tmp_path):
    evil = tmp_path / "nccl-trace-rank-0"
    evil.write_bytes(pickle.dumps({"entries": [os.getcwd]}))  # would need builtins/posix.getcwd
    assert read_dump(evil) is None


def test_garbage_and_missing_files_are_none(tmp_path):
    (tmp_path / "x").write_bytes(b"\x80\x04not a pickle")
    assert read_dump(tmp_path / "x") is None
    assert read_dump(tmp_path / "missing") is None
    (tmp_path / "y").write_bytes(pickle.dumps([1, 2, 3]))
    assert read_dump(tmp_path / "y") is None


def test_a_gloo_dump_names_its_group_and_says_nothing_completed():
    """gloo's recorder leaves the group's description ``undefined`` and marks no entry completed: the text names the
    default group by its name and says no completion was recorded (not ``of undefined ... #None``)."""
    entry = {"process_group": ("0", "undefined"), "collective_seq_id": 4, "profiling_name": "gloo:broadcast",
             "state": "scheduled", "input_sizes": [[8]], "is_p2p": False}
    older = dict(entry, collective_seq_id=3, profiling_name="gloo:all_reduce")
    s = summarize({0: {"entries": [older, entry]}})
    assert s["text"] == ["rank 0 waits in broadcast #4 of default_pg (scheduled; no completion recorded)"]
    other = dict(entry, process_group=("3", "undefined"))
    assert "of group 3 " in summarize({1: {"entries": [other]}})["text"][0]
