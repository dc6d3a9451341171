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


def test_zero12_segment_floor_reads_the_committed_allocator_traces():
    """The ZeRO-1/2 segment floor (memory/gpu.py ``zero12_segments``) against the caching allocator's own history
    of call 7's runs on an H200 (bench/plan/data/traces7, made by ``run_trace_call7.sh``): initialize's segments,
    and the number of new segments of one fp32 partition taken in training."""
    import gzip
    import json

    sys.path.insert(0, str(BENCH))
    from rows import spec_inputs

    from zeropilot.memory.gpu import activation_bytes, logits_bytes, trainable_params, zero12_segments
    from zeropilot.models.params import count_params

    checked = 0
    for line in (BENCH / "data" / "h200x2_call7.jsonl").read_text().splitlines():
        r = json.loads(line)
        spec = r["spec"]
        if spec["stage"] not in (1, 2) or r["rank"] != 0:
            continue
        inputs = spec_inputs(spec, r["total_gpu_gb"])
        counts = count_params(inputs.arch)
        trainable = trainable_params(inputs, counts)
        forward = activation_bytes(inputs)[0] + logits_bytes(inputs)[0]
        floor = zero12_segments(inputs, counts, trainable, forward)
        with gzip.open(BENCH / "data" / "traces7" / f"{spec['trace']}.json.gz", "rt") as f:
            events = json.load(f)
        init = sum(e[2] for e in events if e[0] == "segment_alloc" and e[3] == "init") - \
            sum(e[2] for e in events if e[0] == "segment_free" and e[3] == "init")
        whole = sum(1 for e in events if e[0] == "segment_alloc" and e[3] == "step" and abs(e[2] - floor.block) < 2**21)
        predicted_init = floor.init_allocated + floor.init_cached
        assert abs(predicted_init - init) <= 0.03 * init + 0.25 * 2**30, (spec["trace"], predicted_init, init)
        assert floor.step_blocks == whole or floor.block < 2**27, (spec["trace"], floor.step_blocks, whole)
        checked += 1
    assert checked >= 7
