"""tests/once.py: work several pytest-xdist workers ask for runs once in the whole test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = """
import os, sys, time
from pathlib import Path
from tests.once import once

@once
def job(n):
    with open(Path(os.environ["ZEROPILOT_TESTS_SHARED"]) / "ran.txt", "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # long enough for the other process to reach the lock while this one holds it
    return {"n": n, "by": os.getpid()}

print(job(7)["by"], job(7)["by"], flush=True)
"""


def test_two_processes_asking_at_once_share_one_run(tmp_path):
    env = {**os.environ, "ZEROPILOT_TESTS_SHARED": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    ran = (tmp_path / "ran.txt").read_text().split()
    assert len(ran) == 1  # the body ran in one process only
    assert all(p.returncode == 0 for p in procs) and outs == [ran * 2, ran * 2]


def test_the_folder_is_made_by_the_first_process_and_inherited(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ZEROPILOT_TESTS_SHARED"}
    code = ("import os; from tests.once import shared_dir; p = shared_dir('x'); "
            "import subprocess, sys; print(p); print(subprocess.run([sys.executable, '-c', "
            "'from tests.once import shared_dir; print(shared_dir(\"x\"))'], capture_output=True, text=True, "
            "env=os.environ).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)}, cwd=str(REPO),
                         capture_output=True, text=True, timeout=60).stdout.split()
    assert len(out) == 2 and out[0] == out[1]
    assert not Path(out[0]).exists()  # removed when the process that made it exited
