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


def test_the_plans_known_under_predictions_are_the_measured_ones():
    """`memory.plan.KNOWN_UNDER` states the worst under-prediction per kind of run: it must be what the committed
    never-fitted rows give (one fact: the bench results; the plan only quotes them)."""
    sys.path.insert(0, str(BENCH))
    from accuracy import NOT_TUNED
    from rows import load_rows

    from zeropilot.memory.gpu import estimate_gpu
    from zeropilot.memory.plan import KNOWN_UNDER, known_under

    worst = {}
    for r in load_rows():
        if r.split in NOT_TUNED and r.measured_bytes:
            kind = known_under(r.inputs)
            if kind is not None:
                err = round(100 * (estimate_gpu(r.inputs).peak_bytes / r.measured_bytes - 1), 1)
                worst[kind] = min(worst.get(kind, 0.0), err)
    assert worst == {k: v[0] for k, v in KNOWN_UNDER.items()}
