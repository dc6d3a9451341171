"""The guard inside every rank of a ``zeropilot run``: records, heartbeat, OOM forensics.

Torch, DeepSpeed and transformers are imported lazily (only when the job imported them). Library use:

- ``from zeropilot.guard import ZeroPilotCallback``: ``Trainer(..., callbacks=[ZeroPilotCallback()])``.
- ``from zeropilot import guard; guard.attach(engine)``: a raw DeepSpeed loop.

Both need a run directory: ``zeropilot run`` sets ``ZEROPILOT_RUN_DIR``; without it call
:func:`start` first. Layout of the records: ``docs/run-dir.md``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ZeroPilotCallback", "attach", "start"]


def start(run_dir: Any) -> None:
    """Record into ``run_dir`` from this process (what ``zeropilot run`` does through the environment)."""
    os.environ["ZEROPILOT_RUN_DIR"] = os.fspath(run_dir)
    from zeropilot.guard.install import install

    install()


def attach(engine: Any) -> None:
    """Watch a DeepSpeed engine built before the guard was live (raw ``deepspeed.initialize`` loops)."""
    from zeropilot.guard.deepspeed_hooks import attach as _attach

    _attach(engine)


def __getattr__(name: str) -> Any:
    if name == "ZeroPilotCallback":
        from zeropilot.guard.trainer_hooks import callback_class

        return callback_class()
    raise AttributeError(name)
