"""Wrappers around ``deepspeed.initialize`` and the ``DeepSpeedEngine`` methods a rank passes through.

Each wrapper calls the original with the same arguments and returns its result unchanged; around
the call it only moves the rank's phase and appends records. No wrapper issues a collective or
touches a tensor. ``attach(engine)`` is the same for an engine built before the guard was live.
"""

from __future__ import annotations

import os
import time
from typing import Any

from zeropilot.guard import checkpoint, inject, metrics, oom, resume, setup
from zeropilot.guard.rank import current, peek

setup.listen()



def _backward(original):
    """The backward phase; ``idle`` once it returned, so that what the loop does before the next micro batch's
    forward (loading it) is counted as such in the step record's ``phase_seconds``, not as backward."""
    def wrapper(self, *args, **kwargs):
        guard = peek()
        if guard is None or guard.op_stack:
            return original(self, *args, **kwargs)
        guard.set_phase("backward")
        result = original(self, *args, **kwargs)
        guard.set_phase("idle")
        return result
    return wrapper


def _forward(original):
    """The forward phase; the micro batch's shape is noted unless a Trainer notes it (its ``training_step``)."""
    def wrapper(self, *args, **kwargs):
        guard = peek()
        if guard is None or guard.op_stack:
            return original(self, *args, **kwargs)
        guard.set_phase("forward")
        if not guard.trainer_batches:
            guard.note_batch(setup.batch_shape(args, kwargs))
            inject.check(guard, guard.last_batch)
        return original(self, *args, **kwargs)
    return wrapper


def _step(original):
    def wrapper(self, *args, **kwargs):
        guard = peek()
        if guard is None:
            return original(self, *args, **kwargs)
        before = getattr(self, "global_steps", None)
        guard.set_phase("step")
        result = original(self, *args, **kwargs)
        after = getattr(self, "global_steps", None)
        if after is not None and after != before:
            guard.engine_steps = True
            guard.step_ended(after)
        guard.set_phase("idle")
        return result
    return wrapper


def _save(original):
    def wrapper(self, save_dir, tag=None, *args, **kwargs):
        tag_name = tag if tag is not None else f"global_step{getattr(self, 'global_steps', '?')}"
        with checkpoint.operation("save", save_dir, tag_name, getattr(self, "global_steps", None)):
            with _count_files(self, "save", "write"):
                return original(self, save_dir, tag, *args, **kwargs)
    return wrapper


def _save16(original):
    def wrapper(self, save_dir, *args, **kwargs):
        with checkpoint.operation("save", save_dir, "16bit_model", getattr(self, "global_steps", None)):
            with _count_files(self, "save", "write"):
                return original(self, save_dir, *args, **kwargs)
    return wrapper


def _load(original):
    def wrapper(self, load_dir, tag=None, *args, **kwargs):
        load_dir = resume.load_dir(self, load_dir, tag)
        with checkpoint.operation("load", load_dir, tag) as op:
            with _count_files(self, "load", "read"):
                result = original(self, load_dir, tag, *args, **kwargs)
            _loaded(op, self, result)
        guard = peek()
        if guard is not None and getattr(self, "global_steps", None) is not None:
            guard.step = int(self.global_steps)
        return result
    return wrapper


def _loaded(op: Any, engine: Any, result: Any) -> None:
    """A load returned: its record names the step the engine resumed at and the tag DeepSpeed chose.

    With ``tag=None`` DeepSpeed reads the tag from ``latest``; the path it returns (``DIR/TAG/FILE``,
    ``None`` when nothing was loaded) names it, so the guard reads no file of its own."""
    if op is None or op.kind != "load":
        return
    steps = getattr(engine, "global_steps", None)
    if steps is not None:
        op.step = int(steps)
    universal = getattr(engine, "load_universal_checkpoint", None)
    op.universal = bool(universal()) if callable(universal) else None
    path = result[0] if isinstance(result, tuple) and result else None
    if op.tag is None and isinstance(path, str):
        op.tag = os.path.basename(os.path.dirname(path)) or None
    if path is None:
        op.error = "DeepSpeed loaded nothing (load_checkpoint returned no path)"


def _phase(name: str):
    def make(original):
        def wrapper(self, *args, **kwargs):
            with checkpoint.phase(name):
                return original(self, *args, **kwargs)
        return wrapper
    return make


class _count_files:
    """Count the files DeepSpeed's checkpoint engine writes in a save or reads in a load (a phase each).

    ``kind`` is the checkpoint engine's method (``save`` or ``load``), ``name`` the phase. The wrapper
    is an attribute of this engine's checkpoint engine for the duration of the operation only."""

    def __init__(self, engine: Any, kind: str, name: str) -> None:
        self.ce = getattr(engine, "checkpoint_engine", None)
        self.kind, self.name = kind, name
        self.installed = False

    def __enter__(self) -> None:
        if self.ce is None or self.kind in vars(self.ce) or not callable(getattr(self.ce, self.kind, None)):
            return
        original, name = getattr(self.ce, self.kind), self.name

        def counted(state_dict, path, *args, **kwargs):  # DeepSpeed's own parameter names: callers use them
            with checkpoint.phase(name):
                result = original(state_dict, path, *args, **kwargs)
            checkpoint.wrote(path)
            return result

        def counted_load(path, *args, **kwargs):
            with checkpoint.phase(name):
                result = original(path, *args, **kwargs)
            checkpoint.wrote(path)
            return result

        setattr(self.ce, self.kind, counted if self.kind == "save" else counted_load)
        self.installed = True

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            try:
                delattr(self.ce, self.kind)
            except AttributeError:
                pass


def patch_engine_class(cls: Any) -> None:
    """Wrap the methods of ``DeepSpeedEngine`` (once)."""
    checkpoint.wrap_method(cls, "forward", _forward)
    checkpoint.wrap_method(cls, "backward", _backward)
    checkpoint.wrap_method(cls, "step", _step)
    checkpoint.wrap_method(cls, "save_checkpoint", _save)
    checkpoint.wrap_method(cls, "load_checkpoint", _load)
    checkpoint.wrap_method(cls, "save_16bit_model", _save16)
    checkpoint.wrap_method(cls, "_save_checkpoint", _phase("model_states"))
    checkpoint.wrap_method(cls, "_save_zero_checkpoint", _phase("optimizer_states"))
    checkpoint.wrap_method(cls, "_zero3_consolidated_16bit_state_dict", _phase("gather_16bit"))
    checkpoint.wrap_method(cls, "_load_checkpoint", _phase("model_states"))
    checkpoint.wrap_method(cls, "_load_zero_checkpoint", _phase("optimizer_states"))


def _initialize(original):
    def wrapper(*args, **kwargs):
        guard = current("deepspeed")
        t0 = time.time()
        zero_init = None
        if guard is not None:
            guard.set_phase("init")
            model = kwargs.get("model", args[1] if len(args) > 1 else None)
            zero_init = setup.zero_init_built(model) if model is not None else None
        result = original(*args, **kwargs)
        engine = result[0] if isinstance(result, tuple) and result else result
        attach(engine, seconds=time.time() - t0, zero_init=zero_init)
        return result
    return wrapper


def patch_deepspeed(module: Any) -> None:
    """Wrap ``deepspeed.initialize`` (the module attribute every caller looks up)."""
    checkpoint.wrap_method(module, "initialize", _initialize)


def attach(engine: Any, seconds: Any = None, zero_init: Any = None) -> None:
    """Watch a ``DeepSpeedEngine``: its class's methods are wrapped and an ``init`` record written.

    For raw DeepSpeed loops started without ``zeropilot run``: set ``ZEROPILOT_RUN_DIR`` (or call
    ``zeropilot.guard.start(DIR)``) and call ``attach(engine)`` after ``deepspeed.initialize``."""
    patch_engine_class(type(engine))
    guard = current("deepspeed")
    if guard is None:
        return
    stage = None
    try:
        stage = int(engine.zero_optimization_stage())
    except Exception:  # noqa: BLE001
        pass
    from zeropilot.guard import telemetry
    import sys

    guard.announce("deepspeed")
    guard.allocator_settings = telemetry.allocator_settings(sys.modules.get("torch"))
    guard.record("init", zero_stage=stage, seconds=seconds, mem=guard.memory(), framework=guard.framework,
                 device=telemetry.device_info(sys.modules.get("torch")),
                 allocator_settings=guard.allocator_settings,
                 allocator_limit_bytes=telemetry.allocator_limit(sys.modules.get("torch")))
    guard.step = int(getattr(engine, "global_steps", 0) or 0)
    record_setup(guard, engine, zero_init)
    guard.set_phase("idle")
    oom.install(guard)
    metrics.watch_engine(engine)  # the guard's figures in the engine's monitor (monitor_config)


def record_setup(guard: Any, engine: Any, zero_init: Any = None) -> None:
    """The ``setup`` record: the engine's ZeRO and batch settings and its model's sizes (read once, here)."""
    import weakref

    module = getattr(engine, "module", None)
    facts = setup.engine_facts(engine)
    if zero_init is not None:
        facts["zero"]["zero_init"] = bool(zero_init)
    model = setup.model_facts(module) if module is not None else None
    try:
        guard.model_ref = weakref.ref(module) if module is not None else None
    except TypeError:
        guard.model_ref = None
    guard.update_setup(model=model, **facts)
