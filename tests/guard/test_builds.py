"""Op builds under ``zeropilot run`` (CPU, gloo, 2 ranks): a real JIT build is progress, not a hang, and a job
stopped in the middle of one leaves no lock behind (the next launch builds and runs). A lock that was there before
the job is named and left alone (``test_faults.py::test_stale_build_lock_before_the_first_step``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import runjobs

pytestmark = [pytest.mark.slow]


def test_a_job_stopped_mid_build_leaves_no_lock_and_the_next_launch_builds_past_the_hang_timeout():
    stopped, nxt, left = runjobs.op_build_stopped_then_next()
    assert left == []  # ninja runs each compiler in a process group of its own: the stop ends them too
    run = json.loads((stopped.run_dir / "run.json").read_text())
    taken = [json.loads(line) for line in (stopped.run_dir / "build-locks.jsonl").read_text().splitlines()]
    lock = next(t["path"] for t in taken if t["action"] == "acquired")
    assert lock.endswith("zp_slow_op/lock") and stopped.returncode != 0
    assert [r["path"] for r in run["locks_removed"]] == [lock]  # ours, left by the stopped build: removed
    assert run["locks_removed"][0]["age_s"] >= 0 and "removed op-build lock" in stopped.stderr
    assert not Path(lock).exists()
    # the next launch on the same TORCH_EXTENSIONS_DIR builds (longer than its 3 s hang timeout) and runs
    assert nxt.returncode == 0, nxt.stderr[-3000:]
    assert not (nxt.run_dir / "hang.json").exists()
    run = json.loads((nxt.run_dir / "run.json").read_text())
    assert run["builds"] and run["builds"][0]["op"] == "zp_slow_op"
    assert any(c.startswith(("cc1plus", "c++", "ninja")) for c in run["builds"][0]["compilers"])
    assert run["locks_removed"] == [] and not Path(lock).exists()
    assert "built" in nxt.stdout
