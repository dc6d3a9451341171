"""What the bootstrap does in every Python process of a launch: register the post-import hooks.

Nothing is recorded until the process shows it is a rank (see :mod:`zeropilot.guard.rank`); a
launcher process pays for the hook registration only (microseconds, no imports).
"""

from __future__ import annotations

import sys
from typing import Any

from zeropilot.guard.hooks import when_imported

_done = False


def _on_deepspeed(module: Any) -> None:
    from zeropilot.guard.deepspeed_hooks import patch_deepspeed

    patch_deepspeed(module)


def _on_engine(module: Any) -> None:
    from zeropilot.guard.deepspeed_hooks import patch_engine_class

    cls = getattr(module, "DeepSpeedEngine", None)
    if cls is not None:
        patch_engine_class(cls)


def _on_trainer(module: Any) -> None:
    from zeropilot.guard.trainer_hooks import patch_trainer_module

    patch_trainer_module(module)


def _on_accelerate_optimizer(module: Any) -> None:
    from zeropilot.guard.accelerate_hooks import patch_optimizer_module

    patch_optimizer_module(module)


def _on_accelerator(module: Any) -> None:
    from zeropilot.guard.accelerate_hooks import patch_accelerator_module

    patch_accelerator_module(module)


def _on_cuda(module: Any) -> None:
    """Attach the OOM observer as soon as this process initialises CUDA (any script, not only DeepSpeed's).

    ``torch.cuda._lazy_init`` is what PyTorch's C++ side calls, once, before the first CUDA operation;
    the wrapper only attaches the observer (a callback registration: no memory query, so no context is
    created on a device the rank has not selected yet) and then removes itself. Ranks that go live later
    attach it at ``deepspeed.initialize``, at ``Trainer`` construction or at their first step."""
    import functools

    original = getattr(module, "_lazy_init", None)
    if original is None or getattr(original, "__zeropilot_wrapped__", False):
        return

    @functools.wraps(original)
    def _lazy_init(*args, **kwargs):
        result = original(*args, **kwargs)
        if not module.is_initialized():
            return result
        # torch.cuda's own functions call _lazy_init on every current_device()/current_stream() (thousands
        # of times per ZeRO step): put the original back at once, after one attempt to attach the observer
        module._lazy_init = original
        from zeropilot.guard import oom
        from zeropilot.guard.rank import peek

        guard = peek()
        if guard is not None and not oom.installed():
            oom.install(guard)
        return result

    _lazy_init.__zeropilot_wrapped__ = True
    module._lazy_init = _lazy_init


def _on_dataloader(module: Any) -> None:
    """A rank's own data time: every DataLoader iterator's ``__next__`` (``guard.data_time``)."""
    from zeropilot.guard.data_time import patch_dataloader_module

    patch_dataloader_module(module)


def _on_file_baton(module: Any) -> None:
    """Op-build locks this process takes and gives back, for the supervisor (never leave one behind)."""
    from zeropilot.guard.locks import patch_file_baton

    patch_file_baton(module)


def _on_c10d(module: Any) -> None:
    """A process that joins a process group is a rank: the guard goes live there (before any op build)."""
    import functools

    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "__zeropilot_wrapped__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        from zeropilot.guard.rank import current

        guard = current("torch.distributed")
        if guard is not None:
            guard.set_phase("init")
        return original(*args, **kwargs)

    init_process_group.__zeropilot_wrapped__ = True
    module.init_process_group = init_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "init_process_group", None) is original:
        dist.init_process_group = init_process_group


_PEER = ("connection reset by peer", "connection closed by peer", "remote worker", "broken pipe",
         "communicator was aborted", "nccl communicator", "socket timeout", "read error", "write error",
         "heartbeat monitor", "watchdog caught collective operation timeout")


def peer_failure(kind: str, message: str) -> bool:
    """Whether an exception is this rank noticing that a peer failed (a collective broke under it)."""
    text = message.lower()
    return kind in ("DistBackendError", "DistNetworkError") or any(p in text for p in _PEER)


def _excepthook() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        from zeropilot.guard.rank import peek

        guard = peek()
        if guard is not None and not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            import traceback

            frames = [f for f in traceback.extract_tb(tb) if "zeropilot/guard" not in f.filename.replace("\\", "/")]
            guard.failed = True
            guard.record("error", type=kind.__name__, message=str(value)[:2000], step=guard.step, phase=guard.phase,
                         peer_failure=peer_failure(kind.__name__, str(value)),
                         where=[f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})" for f in frames[-12:]])
        previous(kind, value, tb)

    sys.excepthook = hook


_HELPERS = ("--multiprocessing-fork", "multiprocessing.forkserver", "multiprocessing.resource_tracker",
            "compile_worker", "torch._inductor")


def _is_helper() -> bool:
    """A helper process that inherited a rank's environment (spawned DataLoader worker, compile worker)."""
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    return any(h in argv for h in _HELPERS)


def _claimed_by_other(rank: int) -> bool:
    """Another live process already is this rank (we are its subprocess)."""
    import json
    import os
    from pathlib import Path

    from zeropilot.runlog.layout import RunDir

    try:
        with open(RunDir(Path(os.environ["ZEROPILOT_RUN_DIR"])).heartbeat(rank), encoding="utf-8") as fh:
            pid = json.load(fh).get("pid")
        if not isinstance(pid, int) or pid == os.getpid():
            return False
        os.kill(pid, 0)
        return True
    except (OSError, ValueError, KeyError, AttributeError):
        return False


def _go_live_if_rank() -> None:
    """A process launched as a rank (RANK set by torchrun / the deepspeed launcher) is live from its start,
    so that imports, op builds and process-group setup are watched too."""
    from zeropilot.guard.rank import current, env_rank

    import os

    rank = env_rank()
    if rank is None and os.environ.get("ZEROPILOT_TOP_IS_RANK") == str(os.getppid()):
        rank = 0  # `zeropilot run -- python train.py`: the command itself is the only rank
    if rank is None or _is_helper() or _claimed_by_other(rank):
        return
    guard = current("python")
    if guard is not None:
        guard.set_phase("startup")


def install() -> None:
    """Register the hooks once per process; a launched rank goes live at once."""
    global _done
    if _done:
        return
    _done = True
    when_imported("deepspeed", _on_deepspeed)
    when_imported("deepspeed.runtime.engine", _on_engine)
    when_imported("transformers.trainer", _on_trainer)
    when_imported("accelerate.optimizer", _on_accelerate_optimizer)
    when_imported("accelerate.accelerator", _on_accelerator)
    when_imported("torch.distributed.distributed_c10d", _on_c10d)
    when_imported("torch.cuda", _on_cuda)
    when_imported("torch.utils.file_baton", _on_file_baton)
    when_imported("torch.utils.data.dataloader", _on_dataloader)
    _excepthook()
    _go_live_if_rank()
