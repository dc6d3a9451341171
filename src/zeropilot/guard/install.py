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


def _excepthook() -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):
        from zeropilot.guard.rank import peek

        guard = peek()
        if guard is not None and not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            import traceback

            frames = traceback.extract_tb(tb)
            guard.failed = True
            guard.record("error", type=kind.__name__, message=str(value)[:2000], step=guard.step, phase=guard.phase,
                         where=[f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})" for f in frames[-12:]])
        previous(kind, value, tb)

    sys.excepthook = hook


def install() -> None:
    """Register the hooks once per process."""
    global _done
    if _done:
        return
    _done = True
    when_imported("deepspeed", _on_deepspeed)
    when_imported("deepspeed.runtime.engine", _on_engine)
    when_imported("transformers.trainer", _on_trainer)
    when_imported("torch.distributed.distributed_c10d", _on_c10d)
    _excepthook()
