"""A lost node healed by shrinking, on real ranks: two ``torchrun --nnodes 2 --nproc_per_node 2`` launchers on this
machine (CPU, gloo, a raw DeepSpeed ZeRO-3 loop that loads its own checkpoint folder: tests/guard/jobs/ds_shrink.py),
each under its own ``zeropilot run --heal --heal-allow shrink``. Node 1 is frozen (SIGSTOP of every process of it)
once the job's first save is complete; node 0's watchdog names node 1 lost and stops; node 0's heal converts the
newest complete checkpoint (saved on 4 ranks) to a universal one, copies the DeepSpeed config with gradient
accumulation doubled and ``load_universal``, restarts torchrun as one node of 2 ranks, and finishes alone.

The rest of :mod:`zeropilot.heal.shrink` (the command's rewrite, the batch arithmetic, the refusal without
``--heal-allow shrink``) is tested without processes in test_shrink.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Dict, List

import pytest

from tests import runjobs
from tests.guard.test_watch_nodes import _job
from tests.report.conftest import validate  # noqa: F401 - the report schema's validator, a fixture
from zeropilot.cli import main

pytestmark = [pytest.mark.slow]
CONFIG = runjobs.JOBS / "ds_config.json"  # micro batch 4, gradient accumulation 1, ZeRO-3
STEPS = 10


@functools.lru_cache(maxsize=None)
def _shrunk() -> Dict:
    flags = ["--heal", "--heal-allow", "shrink", "--heal-backoff", "0.5", "--hang-timeout", "300"]
    script = [str(runjobs.JOBS / "ds_shrink.py"), "--save-dir", "{base}/ckpt", "--steps", str(STEPS),
              "--step-sleep", "0.5", "--deepspeed_config", str(CONFIG)]
    return _job("heal_shrink", flags, script, freeze=1, freeze_after="ckpt/latest")


def _records(folder: Path, rank: int, event: str) -> List[Dict]:
    lines = (folder / f"rank-{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def test_node_0_finishes_alone_from_the_universal_conversion_with_the_same_samples_per_step(capsys, validate):
    job = _shrunk()
    root = job["dirs"][0]
    doc = json.loads((root / "heal.json").read_text())
    first, second = doc["attempts"][0], doc["attempts"][-1]
    assert (first["failure"]["kind"], first["failure"]["class"]) == ("hang", "node_lost"), job["logs"][0][-4000:]
    assert doc["outcome"]["status"] == "healed" and len(doc["attempts"]) == 2, job["logs"][0][-4000:]
    # the command: one node, its own rendezvous; the launch's config untouched, its copy edited
    cmd = second["command"]
    assert cmd[cmd.index("--nnodes") + 1] == "1" and "--standalone" in cmd
    assert not {"--node_rank", "--master_addr", "--master_port"} & set(cmd)
    copy = Path(cmd[cmd.index("--deepspeed_config") + 1])
    assert copy.parent == root / "attempt-2" / "launch"
    assert json.loads(CONFIG.read_text())["gradient_accumulation_steps"] == 1
    assert json.loads(copy.read_text())["checkpoint"] == {"load_universal": True}
    # the samples per optimizer step, as the engines ran them (the guard's setup records): before = after
    before = _records(root, 0, "setup")[-1]["train"]
    after = _records(root / "attempt-2", 0, "setup")[-1]["train"]
    assert (before["micro_batch"], before["grad_accum"], before["world_size"]) == (4, 1, 4)
    assert (after["micro_batch"], after["grad_accum"], after["world_size"]) == (4, 2, 2)
    s = second["shrink"]
    assert s["samples_per_step"] == [16, 16] and s["world_size"] == [4, 2] and s["nodes_lost"] == [1]
    # the checkpoint: the newest complete one, resumable at 2 ranks only through the universal conversion
    chosen, conv = second["resume"]["chosen"], s["checkpoint"]
    assert "resumable only through a universal conversion at 2 ranks" in conv["verdict"]
    assert conv["from"] == str(job["base"] / "ckpt") and chosen["path"] == str(root / "attempt-2" / "universal")
    assert (root / "attempt-2" / "universal" / "latest_universal").read_text().strip() == conv["tag"]
    assert not (job["base"] / "ckpt" / "latest_universal").exists()  # the job's own folder is never written
    # the resumed ranks loaded it through DeepSpeed's load_universal, at the chosen step, and finished
    for rank in (0, 1):
        load = _records(root / "attempt-2", rank, "load")[-1]
        assert load["universal"] is True and load["path"] == chosen["path"] and load["step"] == chosen["step"]
        assert not load.get("error")
        gave = _records(root / "attempt-2", rank, "resume")[-1]
        assert (gave["given_by"], gave["instead_of"]) == ("zeropilot", str(job["base"] / "ckpt"))
    assert second["resumed"]["really"] is True and second["exit_code"] == 0
    steps = [r["step"] for r in _records(root / "attempt-2", 0, "step")]
    assert steps[0] == chosen["step"] + 1 and steps[-1] == STEPS
    # the report of node 0's heal run: the timeline names the shrink
    assert main(["report", str(root), "--format", "json"]) == 0
    assert validate(json.loads(capsys.readouterr().out)) == []
    assert main(["report", str(root)]) == 0
    assert "    shrunk: node 1 lost: 4 -> 2 ranks, micro batch 4 -> 4, gradient accumulation 1 -> 2 (16 -> 16" in \
        capsys.readouterr().out
