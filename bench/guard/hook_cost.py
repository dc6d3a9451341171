"""What the guard costs per optimizer step, measured in the rank (run it under ``zeropilot run``).

Times the guard's per-step work on a CUDA rank: the batch shape read at the forward (``batch_shape`` +
``note_batch``, as the DeepSpeed and Trainer hooks do), three phase changes (forward, backward, step), one
``step`` record (allocator counters, ``mem_get_info``, host RSS, one JSON line appended) and the
return to idle. The heartbeat thread works beside it (every 0.5 s) and is included by running it.
Prints ``RESULT {json}``.
"""

import json
import statistics
import time

import torch

from zeropilot.guard.rank import peek
from zeropilot.guard.setup import batch_shape

torch.cuda.set_device(0)
keep = [torch.empty(1 << 20, device="cuda") for _ in range(64)]  # some allocator state to read
ids = torch.zeros(4, 1024, dtype=torch.long, device="cuda")
mask = torch.ones(4, 1024, dtype=torch.long, device="cuda")
guard = peek()
assert guard is not None, "run under zeropilot run"
rounds = []
for _ in range(5):
    n = 2000
    t = time.perf_counter()
    for i in range(n):
        guard.note_batch(batch_shape((), {"input_ids": ids, "attention_mask": mask}))
        guard.set_phase("forward")
        guard.set_phase("backward")
        guard.set_phase("step")
        guard.step_ended(i + 1)
        guard.set_phase("idle")
    rounds.append((time.perf_counter() - t) / n)
print("RESULT " + json.dumps({"per_step_us": [r * 1e6 for r in rounds],
                              "median_us": statistics.median(rounds) * 1e6}), flush=True)
