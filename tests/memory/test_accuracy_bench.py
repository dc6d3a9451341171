"""The committed accuracy figures (bench/plan/results) are what the estimator gives today."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan"


def test_committed_accuracy_results_match_a_fresh_computation():
    proc = subprocess.run([sys.executable, str(BENCH / "accuracy.py"), "--check"], capture_output=True, text=True,
                          timeout=120, cwd=BENCH)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_not_tuned_rows_meet_the_accuracy_goal():
    sys.path.insert(0, str(BENCH))
    from accuracy import compute

    summary = compute()["summary"]
    unseen = summary["not tuned (holdout + new-arch + x2-holdout)"]
    assert unseen["median_abs_error_pct"] <= 10 and unseen["max_abs_error_pct"] <= 25
    assert summary["new-arch"]["rows"] >= 10 and summary["new-arch"]["max_abs_error_pct"] <= 25
