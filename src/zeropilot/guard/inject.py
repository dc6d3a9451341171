"""An OOM injected for tests of ``zeropilot run --heal`` on machines without a GPU: named as injected everywhere.

``ZEROPILOT_INJECT_OOM=TOKENS`` (or ``TOKENS@STEP``: only from optimizer step STEP on, as a long batch arriving
late would) emulates a device on which a micro batch of fewer than TOKENS padded tokens (micro batch x length)
fits. A micro batch reaching the model at or over it makes the rank write ``oom-rank-N.json`` the way PyTorch's
OOM observer does on a GPU (verdict and ranked fixes from :func:`zeropilot.guard.verdicts.classify_oom`, with
``injected`` set, so every fix is judged by this law: :mod:`zeropilot.guard.whatif`) and raise torch's own
``torch.OutOfMemoryError``. A math-neutral fix (a smaller micro batch with more accumulation) genuinely makes the
next attempt pass; a fix that does not change the tokens of a micro batch genuinely does not.

Unset (every real run), :func:`check` is one attribute test per micro batch.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, Optional, Tuple

INJECT_ENV = "ZEROPILOT_INJECT_OOM"
_SPEC = re.compile(r"^\s*(\d{1,9})\s*(?:@\s*(\d{1,9})\s*)?$")


def parse(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``(tokens limit, first step)`` from ``TOKENS`` or ``TOKENS@STEP``; None when unset or unreadable."""
    m = _SPEC.match(text or "")
    if not m or int(m.group(1)) < 1:
        return None
    return int(m.group(1)), int(m.group(2) or 1)


_spec = parse(os.environ.get(INJECT_ENV))
if os.environ.get(INJECT_ENV) and _spec is None:
    print(f"zeropilot guard: {INJECT_ENV}={os.environ[INJECT_ENV]!r} is not TOKENS or TOKENS@STEP: no OOM injected",
          file=sys.stderr)


def check(guard: Any, shape: Optional[tuple]) -> None:
    """Raise an injected ``torch.OutOfMemoryError`` when this micro batch breaks the injected law (see the module)."""
    if _spec is None or guard is None or not shape:
        return
    tokens_limit, first_step = _spec
    size, length = int(shape[0] or 0), int(shape[1] or 0)
    if guard.step + 1 < first_step or size * length < tokens_limit:
        return
    _raise(guard, {"tokens_limit": tokens_limit, "from_step": first_step, "micro_batch_size": size,
                   "seq_len": length, "env": INJECT_ENV})


def _raise(guard: Any, injected: Dict[str, Any]) -> None:
    from zeropilot.guard import oom
    from zeropilot.runlog.layout import write_json_atomic

    torch = sys.modules.get("torch")
    mem = guard.memory()
    record = None
    try:
        record = oom.build_record(guard, 0, None, mem, injected=injected)
        record["snapshot"] = None
        write_json_atomic(guard.dir.oom(guard.rank), record)
        guard.record("oom", step=guard.step, phase=guard.phase, request_bytes=0, file=guard.dir.oom(guard.rank).name,
                     verdict=record["verdict"].get("kind"), injected=True)
        guard.beat(force=True)
    except Exception as exc:  # noqa: BLE001 - the injected error itself must still be raised
        print(f"zeropilot guard: injected OOM record failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
    message = (f"INJECTED out of memory ({INJECT_ENV}={os.environ.get(INJECT_ENV)}): a micro batch of "
               f"{injected['micro_batch_size']} x {injected['seq_len']} tokens is at or over the injected limit of "
               f"{injected['tokens_limit']}")
    error = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    raise (error or MemoryError)(message)
