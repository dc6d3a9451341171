"""Preemption inside a rank: stop at the step the supervisor names, after a save, with no collective.

On SIGTERM or SIGUSR1 ``zeropilot run`` writes ``preempt.json`` in the run directory (``stop_step``: beyond every
rank's last recorded step, with a margin for the steps that may end before the ranks read it). Each rank's guard
looks for the file at the end of every optimizer step (one ``stat``; the file is read once, when it appears): a
Trainer rank at ``stop_step`` or past it sets ``control.should_save`` and ``control.should_training_stop``, so the
Trainer saves ``checkpoint-<step>`` and leaves its loop at the same step on every rank, each deciding alone from the
same file. The rank records one ``preempt`` event (``step``, ``stop_step``, ``late``: the file came after the
rank had passed the stop step, which the margin is there to prevent).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional


class StopRequest:
    """The supervisor's stop request as this rank last read it."""

    def __init__(self, path: Any) -> None:
        self.path = str(path)
        self._mtime: Optional[float] = None
        self.stop_step: Optional[int] = None

    def poll(self) -> Optional[int]:
        """The stop step, or None while no request is there (one ``stat`` when nothing changed)."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return self.stop_step
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                with open(self.path, encoding="utf-8") as fh:
                    data = json.load(fh)
                value = data.get("stop_step") if isinstance(data, dict) else None
                self.stop_step = value if type(value) is int and value >= 0 else self.stop_step
            except (OSError, ValueError):
                self._mtime = None  # a torn read: try again at the next step
        return self.stop_step


def at_step_end(guard: Any, step: int, control: Any) -> bool:
    """At the end of optimizer step ``step``: save and stop when a stop request says so; True when it did."""
    request = getattr(guard, "stop_request", None)
    if request is None:
        request = guard.stop_request = StopRequest(guard.dir.preempt_file)
    stop = request.poll()
    if stop is None or step < stop:
        return False
    if not getattr(guard, "stopping", False):
        guard.stopping = True
        guard.record("preempt", step=int(step), stop_step=int(stop), late=step > stop)
    control.should_save = True
    control.should_training_stop = True
    return True
