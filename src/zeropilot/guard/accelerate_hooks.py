"""accelerate's own training loop: ``AcceleratedOptimizer.step`` as the step, ``Accelerator.save_state`` /
``load_state`` as one save / load.

Only where nothing else counts the steps: a DeepSpeed engine records its own (accelerate's
``DeepSpeedOptimizerWrapper`` overrides ``step`` with a no-op and the engine's ``step`` is wrapped), and
a Trainer's callback records the Trainer's (the guard's framework is ``hf`` then). A step counts when
accelerate actually stepped: gradients were synchronised (not an accumulation micro-step) and the
scaler did not skip it. Each wrapper calls the original with the same arguments and returns its result.
"""

from __future__ import annotations

import os
from typing import Any

from zeropilot.guard import checkpoint, oom  # noqa: F401  (oom attaches its observer at the first step: rank.on_step)
from zeropilot.guard.rank import peek




def _counts_steps(guard: Any) -> bool:
    return guard is not None and not guard.engine_steps and guard.framework != "hf"


def _step(original):
    def wrapper(self, *args, **kwargs):
        guard = peek()
        if not _counts_steps(guard):
            return original(self, *args, **kwargs)
        synced = bool(getattr(getattr(self, "gradient_state", None), "sync_gradients", True))
        guard.set_phase("step")
        result = original(self, *args, **kwargs)
        if synced and not getattr(self, "_is_overflow", False):
            guard.step_ended(guard.step + 1)
        guard.set_phase("idle")
        return result
    return wrapper


def _save_state(original):
    def wrapper(self, output_dir=None, *args, **kwargs):
        guard = peek()
        with checkpoint.operation("save", output_dir, _tag(output_dir), guard.step if guard else None) as op:
            with checkpoint.phase("write"):
                where = original(self, output_dir, *args, **kwargs)
            if op is not None and op.kind == "save" and isinstance(where, (str, os.PathLike)):
                op.path, op.tag = str(where), _tag(where)
                if getattr(self, "is_main_process", False) and op.bytes == 0:
                    checkpoint.count_new_files(op, str(where))
            return where
    return wrapper


def _load_state(original):
    def wrapper(self, input_dir=None, *args, **kwargs):
        with checkpoint.operation("load", input_dir, _tag(input_dir)):
            with checkpoint.phase("read"):
                return original(self, input_dir, *args, **kwargs)
    return wrapper


def _tag(path: Any) -> Any:
    return os.path.basename(os.path.normpath(str(path))) if path is not None else None



def patch_optimizer_module(module: Any) -> None:
    """Wrap ``AcceleratedOptimizer.step`` (once)."""
    cls = getattr(module, "AcceleratedOptimizer", None)
    if cls is not None:
        checkpoint.wrap_method(cls, "step", _step)


def patch_accelerator_module(module: Any) -> None:
    """Wrap ``Accelerator.save_state`` / ``load_state`` (once)."""
    cls = getattr(module, "Accelerator", None)
    if cls is not None:
        checkpoint.wrap_method(cls, "save_state", _save_state)
        checkpoint.wrap_method(cls, "load_state", _load_state)
