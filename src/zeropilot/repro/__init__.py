"""``zeropilot repro``: the smallest train → save → train → stop → resume → train run of a launch.

It answers two questions a user of a DeepSpeed ZeRO launch cannot answer without writing a training loop:
does memory rise around a checkpoint save (and does the first step after it run out of memory, on an emulated
smaller card), and does a resume in a new process group continue *exactly* where the uninterrupted run was
(loss per step, weights, optimizer state, scheduler, step counter, RNG, data order).

Modules, each with one job:

- :mod:`~zeropilot.repro.spec`: the launch's values (the one reader) and the plain-data spec every rank gets.
- :mod:`~zeropilot.repro.prepare`: ``check`` first, then the model's config (random weights, no download).
- :mod:`~zeropilot.repro.launcher`: one process group per leg, killed on every path.
- :mod:`~zeropilot.repro.worker`: one rank (torch, DeepSpeed): train, save, load, capture state.
- :mod:`~zeropilot.repro.state`: the training state as parts, and their comparison.
- :mod:`~zeropilot.repro.recorder`: the run-directory records (``zeropilot report`` reads them).
- :mod:`~zeropilot.repro.verdict` / :mod:`~zeropilot.repro.render`: the verdict and its table.

Only ``worker``, ``state`` and ``recorder`` import torch, and only inside the ranks.
"""

from zeropilot.repro.spec import LEAVE_OUT, PARTS, Options, ReproSpec

__all__ = ["LEAVE_OUT", "PARTS", "Options", "ReproSpec"]
