"""The HF Trainer side: a ``TrainerCallback`` on every Trainer, and ``Trainer._save_checkpoint`` as one save.

``ZeroPilotCallback`` is also the library entry for people who build their own Trainer:
``Trainer(..., callbacks=[ZeroPilotCallback()])``. Where a DeepSpeed engine drives the steps, the
engine's hooks record them and the callback only marks phases.
"""

from __future__ import annotations

import os
from typing import Any

from zeropilot.guard import checkpoint, inject, metrics, oom, preempt, resume, setup
from zeropilot.guard.rank import current, peek

setup.listen()


def _callback_base() -> Any:
    from transformers import TrainerCallback

    return TrainerCallback


def make_callback_class() -> type:
    """``ZeroPilotCallback``, built on transformers' ``TrainerCallback`` when first asked for."""
    base = _callback_base()

    class ZeroPilotCallback(base):  # type: ignore[misc, valid-type]
        """Records steps (unless a DeepSpeed engine does) and phases of a Trainer in the run directory."""

        def on_train_begin(self, args, state, control, **kwargs):
            guard = current("hf")
            if guard is not None:
                guard.announce("hf")
                guard.step = int(state.global_step or 0)
                guard.stoppable = True  # a stop request (preemption) can make this rank save and stop at a step
                _record_setup(guard, args, kwargs.get("model"))
                guard.set_phase("idle")
                guard.beat(force=True)

        def on_step_begin(self, args, state, control, **kwargs):
            guard = peek()
            if guard is not None and not guard.engine_steps:
                guard.set_phase("forward")

        def on_step_end(self, args, state, control, **kwargs):
            guard = peek()
            if guard is None:
                return control
            if not guard.engine_steps:
                guard.step_ended(state.global_step)
            preempt.at_step_end(guard, int(state.global_step), control)
            return control

        def on_evaluate(self, args, state, control, **kwargs):
            guard = peek()
            if guard is not None:
                guard.set_phase("idle")

    return ZeroPilotCallback


def _record_setup(guard: Any, args: Any, model: Any) -> None:
    """The Trainer's batch settings; its model's sizes unless a DeepSpeed engine recorded them already."""
    import weakref

    facts = setup.trainer_facts(args)  # under DeepSpeed the engine's own settings (deepspeed_hooks) are in force
    model_facts = setup.model_facts(model) if model is not None and "model" not in guard.setup else None
    if model is not None and guard.model_ref is None:
        try:
            guard.model_ref = weakref.ref(model)
        except TypeError:
            pass
    guard.update_setup(model=model_facts, **facts)


def _training_step(original):
    """One micro batch of the Trainer: its shape as the model sees it (inputs before the forward)."""
    def wrapper(self, model, inputs, *args, **kwargs):
        guard = peek()
        if guard is not None and isinstance(inputs, dict):
            guard.trainer_batches = True
            guard.note_batch(setup.batch_shape((), inputs))
            inject.check(guard, guard.last_batch)
        return original(self, model, inputs, *args, **kwargs)
    return wrapper


_cls = None


def callback_class() -> type:
    global _cls
    if _cls is None:
        _cls = make_callback_class()
    return _cls


def _init(original):
    def wrapper(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            cls = callback_class()
            handler = getattr(self, "callback_handler", None)
            if handler is not None and not any(isinstance(cb, cls) for cb in handler.callbacks):
                self.add_callback(cls())
            metrics.add_to_trainer(self)  # the guard's figures in the Trainer's report_to trackers
            guard = current("hf")
            if guard is not None:
                oom.install(guard)
        except Exception as exc:  # noqa: BLE001
            import sys

            print(f"zeropilot guard: could not watch this Trainer: {exc}", file=sys.stderr)
        return result
    return wrapper


def _save_checkpoint(original):
    def wrapper(self, *args, **kwargs):
        state = getattr(self, "state", None)
        step = getattr(state, "global_step", None)
        out = getattr(getattr(self, "args", None), "output_dir", None)
        with checkpoint.operation("save", out, f"checkpoint-{step}", step) as op:
            result = original(self, *args, **kwargs)
            if op is not None and getattr(getattr(self, "args", None), "should_save", False) and out:
                checkpoint.count_new_files(op, os.path.join(str(out), f"checkpoint-{step}"))
            return result
    return wrapper



def _save_model(original):
    def wrapper(self, *args, **kwargs):
        with checkpoint.phase("write"):
            return original(self, *args, **kwargs)
    return wrapper


def patch_trainer_module(module: Any) -> None:
    """Wrap ``Trainer.__init__``, ``_save_checkpoint``, ``save_model``, ``training_step`` and ``train`` (once)."""
    cls = getattr(module, "Trainer", None)
    if cls is None:
        return
    for name, make in (("__init__", _init), ("_save_checkpoint", _save_checkpoint), ("save_model", _save_model),
                       ("training_step", _training_step), ("train", resume.train_wrapper)):
        checkpoint.wrap_method(cls, name, make)
