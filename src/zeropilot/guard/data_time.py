"""A rank's own data time: the seconds its main thread waits in a DataLoader iterator's ``__next__``.

The phase times cannot separate a slow loader under the HF Trainer: it gathers the batch's token count across
ranks (``num_items_in_batch``) after loading and before the forward, so every rank's time before the forward holds
the slowest rank's loading. The batch a rank's own iterator hands over is timed where it is handed over, whatever
the framework does after it: ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``, the class every
DataLoader iterator of PyTorch is (single- and multi-process), under the HF Trainer (accelerate's
``DataLoaderShard`` iterates the DataLoader it wraps, one batch ahead), accelerate's prepared loaders, DeepSpeed's
``deepspeed_io`` and a raw ``for batch in loader`` alike. With workers it is the time the rank waited for them.

The wrapper is on the class, so the job's iterator objects, their types and their attributes stay as they are; it
calls the original with the same arguments and returns its result. Counted only on the rank's main thread (a
prefetching thread's waits are not the training loop's), and a DataLoader iterated inside another's ``__next__``
once. The step record carries the sum since the previous step as ``data_seconds`` (``guard.rank``), from the first
batch a DataLoader handed over on: a loop that loads without a torch DataLoader records none, and its stragglers are
judged from its phase times as before (``runlog.stragglers``). Cost: ``bench/guard/straggler_cost.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from zeropilot.guard.checkpoint import wrap_method
from zeropilot.guard.rank import peek

_clock = time.perf_counter
_ident = threading.get_ident


def _timed(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def __next__(self):
        guard = peek()
        if guard is None or guard.in_data or _ident() != guard.main_ident:
            return original(self)
        guard.in_data = True
        t0 = _clock()
        try:
            return original(self)
        finally:
            guard.data_seconds += _clock() - t0
            guard.data_seen = True
            guard.in_data = False
    return __next__


def patch_dataloader_module(module: Any) -> None:
    """Time ``_BaseDataLoaderIter.__next__`` (once)."""
    cls = getattr(module, "_BaseDataLoaderIter", None)
    if cls is not None:
        wrap_method(cls, "__next__", _timed)
