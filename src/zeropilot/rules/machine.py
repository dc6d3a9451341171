"""Rules about this machine (read only when check is given its state: ``Launch.machine``)."""

from __future__ import annotations

from typing import Iterator

from zeropilot.launch import Launch
from zeropilot.launch.machine import STALE_AFTER_S
from zeropilot.rules.registry import Hit, Severity, rule


@rule("MC001", "stale-op-build-lock", Severity.ERROR, packages=("torch", "deepspeed"),
      versions="all torch versions with torch.utils.cpp_extension (FileBaton without a time limit)",
      witness="tests/rules/test_machine.py::test_mc001_witness")
def stale_op_build_lock(launch: Launch) -> Iterator[Hit]:
    """An op-build `lock` left under `~/.cache/torch_extensions/` (or `$TORCH_EXTENSIONS_DIR`).

    A lock older than 15 minutes is an error (no build takes that long; the process that made it was killed); a
    younger one is a warning (a build may be running now).

    ## Why is this bad?
    A DeepSpeed (or any JIT-built PyTorch extension) run killed while it compiled an op leaves `<op>/lock`
    behind. Every later run that needs the op waits for the file to disappear: the launch hangs before its first
    step, with no message, on every rank.

    ## Example
    ```text
    ~/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock   (2 hours old)
    ```

    ## Use instead
    Make sure no build is running (`pgrep -f ninja`), then delete the lock file (or the op's whole folder, which
    forces a clean rebuild).

    ## References
    - `torch/utils/cpp_extension.py` `_jit_compile` (`FileBaton(os.path.join(build_directory, 'lock'))`)
    - `torch/utils/file_baton.py` `FileBaton.wait` (waits while the file exists)
    """
    if launch.machine is None:
        return
    for lock in launch.machine.locks:
        minutes = lock.age_s / 60
        if lock.stale:
            yield Hit(None, None, f"op-build lock of `{lock.op}` left {minutes:.0f} min ago: every run that builds "
                                  f"{lock.op} waits for it forever, silently, before its first step — delete "
                                  f"{lock.path} (no build of that op is running after {STALE_AFTER_S // 60} min)",
                      file=lock.path, key=lock.op)
        else:
            yield Hit(None, None, f"op-build lock of `{lock.op}` ({minutes:.0f} min old): a build may be running; "
                                  f"if none is (pgrep -f ninja), delete {lock.path} or the launch will hang",
                      file=lock.path, key=lock.op, severity=Severity.WARNING)
