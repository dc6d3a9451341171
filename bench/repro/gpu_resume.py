"""Two resumes of the seed launch on GPU in one pair of process groups: the exact one and one that leaves the
scheduler out (as a checkpoint without it would), to show the GPU tolerance and the verdict naming the cause.

    python bench/repro/gpu_resume.py OUT_JSON RUN_ROOT [--cpu]   (--cpu: the dry run of this script on CPU)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zeropilot.repro.prepare import prepare
from zeropilot.repro.render import render
from zeropilot.repro.run import run_cases
from zeropilot.repro.spec import Options

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed"


def main(out: str, root: str, cpu: bool) -> None:
    cases = []
    for name, leave in (("exact", ()), ("no-scheduler", ("scheduler",))):
        opts = Options(cpu=cpu, nproc=2, steps=4, save_every=2, seq_len=256, grad_accum=1, leave_out=leave)
        spec, _ = prepare([str(SEED)], "qwen2.5-0.5b", opts)
        spec.name = name
        cases.append((spec, Path(root) / name))
    verdicts = run_cases(cases, timeout=240, keep_checkpoints=False)
    Path(out).write_text(json.dumps(verdicts, indent=1, default=str))
    for v in verdicts:
        print(f"== {v['case']}")
        print(render(v))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--cpu" in sys.argv)
