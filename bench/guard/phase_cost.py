"""What the phase accounting of the step records (``phase_seconds``: stragglers, learned timeouts) costs per step.

Times five phase changes per optimizer step (forward, backward, idle, step, idle: a DeepSpeed engine's step) on a
guard in a temporary run directory, with ``RankGuard._count_phase`` as it is and replaced by a no-op; the
difference is the accounting's cost. CPU only, no job: ``python bench/guard/phase_cost.py``. Prints ``RESULT {json}``.
"""

import json
import statistics
import tempfile
import timeit
from pathlib import Path

from zeropilot.guard.rank import RankGuard

N, ROUNDS = 20000, 7


def per_step_us(guard: RankGuard) -> float:
    def step() -> None:
        for phase in ("forward", "backward", "idle", "step", "idle"):
            guard.set_phase(phase)
    return statistics.median(timeit.timeit(step, number=N) / N * 1e6 for _ in range(ROUNDS))


guard = RankGuard(Path(tempfile.mkdtemp(prefix="phase-cost-")), 0, "python")
guard._stop.set()  # no heartbeat thread beside the timing
with_accounting = per_step_us(guard)
guard._count_phase = lambda now: None
without = per_step_us(guard)
print("RESULT " + json.dumps({"with_us": round(with_accounting, 2), "without_us": round(without, 2),
                              "accounting_us": round(with_accounting - without, 2)}), flush=True)
