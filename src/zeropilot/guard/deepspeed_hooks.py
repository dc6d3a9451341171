"""Wrappers around ``deepspeed.initialize`` and the ``DeepSpeedEngine`` methods a rank passes through.

Each wrapper calls the original with the same arguments and returns its result unchanged; around
the call it only moves the rank's phase and appends records. No wrapper issues a collective or
touches a tensor. ``attach(engine)`` is the same for an engine built before the guard was live.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from zeropilot.guard import checkpoint
from zeropilot.guard.rank import current, peek

_MARK = "__zeropilot_wrapped__"


def _wrap(cls: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    original = getattr(cls, name, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def _in_phase(phase: str):
    def make(original):
        def wrapper(self, *args, **kwargs):
            guard = peek()
            if guard is None or guard.op_stack:
                return original(self, *args, **kwargs)
            guard.set_phase(phase)
            return original(self, *args, **kwargs)
        return wrapper
    return make


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
            with _count_writes(self):
                return original(self, save_dir, tag, *args, **kwargs)
    return wrapper


def _save16(original):
    def wrapper(self, save_dir, *args, **kwargs):
        with checkpoint.operation("save", save_dir, "16bit_model", getattr(self, "global_steps", None)):
            with _count_writes(self):
                return original(self, save_dir, *args, **kwargs)
    return wrapper


def _load(original):
    def wrapper(self, load_dir, tag=None, *args, **kwargs):
        with checkpoint.operation("load", load_dir, tag):
            result = original(self, load_dir, tag, *args, **kwargs)
        guard = peek()
        if guard is not None and getattr(self, "global_steps", None) is not None:
            guard.step = int(self.global_steps)
        return result
    return wrapper


def _phase(name: str):
    def make(original):
        def wrapper(self, *args, **kwargs):
            with checkpoint.phase(name):
                return original(self, *args, **kwargs)
        return wrapper
    return make


class _count_writes:
    """Count the files DeepSpeed's checkpoint engine writes during a save (a ``write`` phase each)."""

    def __init__(self, engine: Any) -> None:
        self.ce = getattr(engine, "checkpoint_engine", None)
        self.original = None

    def __enter__(self) -> None:
        if self.ce is None or "save" in vars(self.ce):
            return
        original = self.ce.save

        def save(state_dict, path, *args, **kwargs):
            with checkpoint.phase("write"):
                result = original(state_dict, path, *args, **kwargs)
            checkpoint.wrote(path)
            return result

        self.original = original
        self.ce.save = save

    def __exit__(self, *exc: object) -> None:
        if self.original is not None:
            try:
                del self.ce.save
            except AttributeError:
                pass


def patch_engine_class(cls: Any) -> None:
    """Wrap the methods of ``DeepSpeedEngine`` (once)."""
    _wrap(cls, "forward", _in_phase("forward"))
    _wrap(cls, "backward", _in_phase("backward"))
    _wrap(cls, "step", _step)
    _wrap(cls, "save_checkpoint", _save)
    _wrap(cls, "load_checkpoint", _load)
    _wrap(cls, "save_16bit_model", _save16)
    _wrap(cls, "_save_checkpoint", _phase("model_states"))
    _wrap(cls, "_save_zero_checkpoint", _phase("optimizer_states"))
    _wrap(cls, "_zero3_consolidated_16bit_state_dict", _phase("gather_16bit"))
    _wrap(cls, "_load_checkpoint", _phase("model_states"))
    _wrap(cls, "_load_zero_checkpoint", _phase("optimizer_states"))


def _initialize(original):
    def wrapper(*args, **kwargs):
        guard = current("deepspeed")
        t0 = time.time()
        if guard is not None:
            guard.set_phase("init")
        result = original(*args, **kwargs)
        engine = result[0] if isinstance(result, tuple) and result else result
        attach(engine, seconds=time.time() - t0)
        return result
    return wrapper


def patch_deepspeed(module: Any) -> None:
    """Wrap ``deepspeed.initialize`` (the module attribute every caller looks up)."""
    original = getattr(module, "initialize", None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(_initialize(original))
    setattr(wrapper, _MARK, True)
    module.initialize = wrapper


def attach(engine: Any, seconds: Any = None) -> None:
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
    guard.record("init", zero_stage=stage, seconds=seconds, mem=guard.memory(), framework=guard.framework,
                 device=telemetry.device_info(sys.modules.get("torch")),
                 allocator_settings=telemetry.allocator_settings(sys.modules.get("torch")),
                 allocator_limit_bytes=telemetry.allocator_limit(sys.modules.get("torch")))
    guard.step = int(getattr(engine, "global_steps", 0) or 0)
    guard.set_phase("idle")
    from zeropilot.guard import oom

    oom.install(guard)
