"""MC001 (stale op-build lock): the finder on fixture folders, and a witness that really leaves a lock behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_files
from tests.zp import NO_SHM_OP
from zeropilot.check import check
from zeropilot.launch.machine import STALE_AFTER_S, extensions_roots, find_build_locks, inspect_machine
from zeropilot.runner.procs import kill_session, scan

RUN = ("import faulthandler, os, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=False)\n"
       "os.environ.update(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', LOCAL_WORLD_SIZE='1', "
       "MASTER_ADDR='127.0.0.1')\nimport deepspeed\nprint('IMPORTED', flush=True)\n"
       "deepspeed.init_distributed(dist_backend='gloo')\nprint('READY', flush=True)\n")


def _lock(root: Path, rel: str, age_s: float) -> Path:
    path = root / rel / "lock"
    path.parent.mkdir(parents=True)
    path.touch()
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_roots_follow_torch():
    assert extensions_roots({"TORCH_EXTENSIONS_DIR": "/x/ext", "HOME": "/h"}) == [Path("/x/ext")]
    assert extensions_roots({"HOME": "/h"}) == [Path("/h/.cache/torch_extensions")]
    assert extensions_roots({"HOME": "/h", "XDG_CACHE_HOME": "/c"}) == [Path("/c/torch_extensions")]


def test_finds_both_layouts(tmp_path):
    old = _lock(tmp_path, "py311_cpu/deepspeed_shm_comm", 2 * STALE_AFTER_S)
    young = _lock(tmp_path, "fused_adam", 10)
    locks = find_build_locks([tmp_path])
    assert [(b.path, b.stale) for b in locks] == [(old, True), (young, False)]
    assert find_build_locks([tmp_path / "missing"]) == []


def _mc001(tmp_path, ext: Path):
    launch = write_files(tmp_path / "launch", {"ds.json": {"zero_optimization": {"stage": 2}}})
    result, _ = check([launch], versions="deepspeed=0.19.8", select={"MC001"}, use_installed=False,
                      machine=inspect_machine({"TORCH_EXTENSIONS_DIR": str(ext)}))
    return result.findings


def test_mc001_severity_by_age(tmp_path):
    ext = tmp_path / "ext"
    _lock(ext, "deepspeed_shm_comm", 2 * STALE_AFTER_S)
    _lock(ext, "cpu_adam", 5)
    by_op = {f.key: f.severity.value for f in _mc001(tmp_path, ext)}
    assert by_op == {"deepspeed_shm_comm": "error", "cpu_adam": "warning"}
    assert _mc001(tmp_path, tmp_path / "empty") == []


def _start(env, out: Path):
    return subprocess.Popen([sys.executable, "-c", RUN], env=env, stdout=out.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill(proc) -> None:
    kill_session(proc.pid)  # the shm build's compilers too: they run in process groups of their own
    proc.wait()


def _gone(session: int) -> bool:
    """Whether nothing of a SIGKILLed session runs any more (a killed process shows in /proc until it has exited)."""
    deadline = time.time() + 10
    while scan(session=session) and time.time() < deadline:
        time.sleep(0.1)
    return not scan(session=session)


def _waits_on_the_baton(proc, log: Path) -> bool:
    """Whether ``proc``'s main thread, asked for its stack (faulthandler on SIGUSR1), is in torch's
    ``FileBaton.wait``: the op build's lock wait, seen directly instead of inferred from a long sleep."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if "IMPORTED" in log.read_text():
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
            if re.search(r'file_baton\.py", line \d+ in wait', log.read_text()):
                return True
        time.sleep(0.2)
    return False


@pytest.mark.witness
@pytest.mark.slow
def test_mc001_witness(tmp_path):
    """A DeepSpeed launch killed while it builds its CPU shm op leaves the lock; the next launch then waits on it
    (alive, no compiler running, never READY), and MC001 reports that lock."""
    ext = tmp_path / "ext"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ext), "MASTER_PORT": "0"}
    env.pop(NO_SHM_OP, None)  # the build the suite skips elsewhere is the subject here
    first = _start(env, tmp_path / "first.txt")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list(ext.glob("*/lock")) and first.poll() is None:
            time.sleep(0.2)
    finally:
        _kill(first)
    assert _gone(first.pid), [p.comm for p in scan(session=first.pid)]  # its compilers included
    [lock] = list(ext.glob("*/lock"))
    second = _start(env, tmp_path / "second.txt")
    try:
        waiting = _waits_on_the_baton(second, tmp_path / "second.txt")
        time.sleep(1.0)  # several of FileBaton's 0.1 s polls later: still there, still not built
        alive = second.poll() is None
        group = subprocess.run(["ps", "-o", "pid=", "-g", str(second.pid)], capture_output=True, text=True,
                               timeout=10).stdout.split()
    finally:
        _kill(second)
    log = (tmp_path / "second.txt").read_text()
    assert waiting and alive and "IMPORTED" in log and "READY" not in log, log[-2000:]
    assert group == [str(second.pid)], group  # waiting on the lock, not compiling
    assert lock.exists()
    [finding] = _mc001(tmp_path, ext)
    assert finding.file == str(lock) and finding.key == lock.parent.name == "deepspeed_shm_comm"
