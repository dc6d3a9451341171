"""Which rank failed first, from a run's records (pure, torch-free; for the report's crash verdict).

Part of the run-directory contract (``runlog``), below the in-rank ``guard`` and the supervisor: ``report`` reads
it without importing the code that runs inside the ranks.

A rank that dies (SIGKILL, segfault, the OOM killer) writes nothing more; its peers then fail in
their next collective with errors such as gloo's "Connection reset by peer" or an aborted NCCL
communicator, which the guard marks ``peer_failure``. Those errors come later but are consequences:
the first failure is the earliest error that is not a peer failure, else the rank that stopped
recording (no ``error``, no ``end``) and was not terminated by its launcher, else the earliest error of
any kind. :func:`terminated_ranks` reads who was terminated from the faulthandler files.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

from zeropilot.runlog.layout import STACKS_MARKER


def _t(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.inf


def first_failure(events_by_rank: Dict[int, List[Dict[str, Any]]],
                  last_t_by_rank: Dict[int, Optional[float]],
                  terminated: Iterable[int] = ()) -> Optional[Tuple[int, str]]:
    """``(rank, why)`` of the rank that failed first, or None when every rank ended.

    Args:
        events_by_rank: each rank's non-step records (``error``, ``end``, ...), in file order.
        last_t_by_rank: time of each rank's last record of any kind (steps included).
        terminated: ranks that were sent SIGTERM (their ``stacks-rank-N.txt`` holds a dump the watchdog did
            not ask for: the launcher ending the survivors after a rank died) - consequences, not causes.
    """
    terminated = set(terminated)
    errors = [(_t(e.get("t")), r, e) for r, evs in events_by_rank.items() for e in evs if e.get("event") == "error"]
    own = [x for x in errors if not x[2].get("peer_failure")]
    if own:
        t, rank, e = min(own, key=lambda x: (x[0], x[1]))
        return rank, f"{e.get('type', 'error')}: {e.get('message', '')}".strip()
    silent = [r for r, evs in events_by_rank.items()
              if not any(e.get("event") in ("error", "end") for e in evs)]
    if any(r not in terminated for r in silent):
        silent = [r for r in silent if r not in terminated]
    if silent:
        rank = min(silent, key=lambda r: (_t(last_t_by_rank.get(r)), r))
        return rank, "stopped recording without an error (killed: SIGKILL, segfault or the OOM killer)"
    if errors:
        t, rank, e = min(errors, key=lambda x: (x[0], x[1]))
        return rank, f"{e.get('type', 'error')}: {e.get('message', '')}".strip()
    return None


def terminated_ranks(stacks_by_rank: Dict[int, str]) -> List[int]:
    """Ranks whose faulthandler file holds a dump the watchdog did not request (SIGTERM from the launcher)."""
    out = []
    for rank, text in stacks_by_rank.items():
        head = text.split(STACKS_MARKER, 1)[0]
        if "most recent call first" in head:
            out.append(rank)
    return sorted(out)
