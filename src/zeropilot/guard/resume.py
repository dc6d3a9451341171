"""Resuming a restarted Trainer: ``resume_from_checkpoint`` passed for the launch when it passes none.

``zeropilot run --heal`` restarts a failed launch unmodified and sets :data:`RESUME_ENV` to the newest complete
checkpoint it chose (``OUTPUT_DIR/checkpoint-N``). In every rank, ``Trainer.train`` then gets that path as its
``resume_from_checkpoint`` when the launch's own call gave none (``None`` or ``False``); a launch that passes its own
(LLaMA-Factory passes the last checkpoint of its output directory unless told to overwrite it) keeps it. Either way
the rank writes one ``resume`` record (``path``, ``given_by``: ``zeropilot`` or ``launch``); the ``load`` record the
engine's hooks write says what was really loaded, at which step.

A raw DeepSpeed loop is not resumed here: it resumes when its own code calls ``load_checkpoint`` (the ``load``
record says it did), and the heal report says when it did not. One exception, a restart on fewer nodes
(:mod:`zeropilot.heal.shrink`): :data:`RESUME_ENV` then names a universal checkpoint that zeropilot converted into
the run directory, and the launch's config copy has ``load_universal``; the loop's own ``load_checkpoint(dir)``
(no tag) is pointed at it (:func:`load_dir`), as a Trainer's ``resume_from_checkpoint`` is, and a ``resume``
record says so.
"""

from __future__ import annotations

import os
from typing import Any

RESUME_ENV = "ZEROPILOT_RESUME_FROM"
#: which attempt of a heal run this is (1, 2, ...) and the steps it redoes: the trackers get both (guard.metrics)
HEAL_ATTEMPT_ENV = "ZEROPILOT_HEAL_ATTEMPT"
STEPS_REDONE_ENV = "ZEROPILOT_HEAL_STEPS_REDONE"


def train_wrapper(original: Any) -> Any:
    """``Trainer.train`` with ``resume_from_checkpoint`` from :data:`RESUME_ENV` when the call gives none."""
    def wrapper(self, resume_from_checkpoint=None, *args, **kwargs):
        from zeropilot.guard.rank import current

        ours = os.environ.get(RESUME_ENV) or None
        given = resume_from_checkpoint not in (None, False)
        guard = current("hf") if (given or ours) else None
        if not given and ours:
            resume_from_checkpoint = ours
        if guard is not None:
            value = resume_from_checkpoint
            guard.record("resume", path=value if isinstance(value, str) else None,
                         given_by="launch" if given else "zeropilot",
                         value=None if isinstance(value, str) else bool(value), ours=ours)
        return original(self, resume_from_checkpoint, *args, **kwargs)
    return wrapper


def load_dir(engine: Any, given: Any, tag: Any) -> Any:
    """The folder ``engine.load_checkpoint(given, tag)`` reads: :data:`RESUME_ENV` when it names a universal
    checkpoint (its ``latest_universal``), the engine loads universal checkpoints and the call names no tag;
    else ``given``. DeepSpeed reads ``DIR/latest_universal`` for the tag when ``load_universal`` is on."""
    from zeropilot.checkpoint.names import LATEST_UNIVERSAL_FILE

    ours = os.environ.get(RESUME_ENV) or None
    universal = getattr(engine, "load_universal_checkpoint", None)
    if (ours is None or tag is not None or not callable(universal) or not universal()
            or not os.path.isfile(os.path.join(ours, LATEST_UNIVERSAL_FILE))):
        return given
    from zeropilot.guard.rank import current

    guard = current("deepspeed")
    if guard is not None:
        guard.record("resume", path=ours, given_by="zeropilot", value=None, ours=ours,
                     instead_of=str(given) if given is not None else None)
    return ours
