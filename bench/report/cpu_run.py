"""A longer real CPU run for the report's screenshot: the HF Trainer job of tests/runjobs.py, 2 ranks, gloo.

    python bench/report/cpu_run.py OUT_RUN_DIR [--steps 96] [--save-steps 32]

Runs ``zeropilot run -- torchrun ... tests/guard/jobs/hf_train.py`` (ZeRO-2, a tiny Qwen2) and copies
the run directory to OUT_RUN_DIR.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests import runjobs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--save-steps", type=int, default=32)
    args = ap.parse_args()
    ckpt = runjobs.root() / "cpu_run" / "ckpt"
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(runjobs.free_port()),
           str(runjobs.JOBS / "hf_train.py"), str(ckpt), "--stage", "2", "--steps", str(args.steps),
           "--save-steps", str(args.save_steps)]
    job = runjobs.zeropilot_run("cpu_run", cmd, timeout=600)
    print(job.stdout[-3000:])
    shutil.copytree(job.run_dir, args.out, dirs_exist_ok=True)
    return job.returncode


if __name__ == "__main__":
    sys.exit(main())
