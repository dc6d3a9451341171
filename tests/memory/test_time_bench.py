"""bench/plan/time: the timing runner's order, budget, resume, timeouts and op builds (with a stand-in probe), the
spec check, and the autotuner case's config and result reading (no GPU, no DeepSpeed run)."""
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

TIME = Path(__file__).resolve().parents[2] / "bench" / "plan" / "time"
ROOT = TIME.parents[2]


def _load(name):
    sys.path.insert(0, str(TIME))
    try:
        spec = importlib.util.spec_from_file_location(f"zp_time_{name}", TIME / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(TIME))


specs = _load("spec_check")
run_rows = _load("run_rows")
autotune = _load("autotune")

MODEL = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2}
#: a stand-in for zero_mem_probe_plan.py: it logs when it ran, then does what the spec's 'meta' says
FAKE_PROBE = r'''
import json, os, sys, time
spec = json.loads(sys.argv[-1]); meta = spec.get("meta", {})
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"name": spec["row"], "start": time.time(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "ext": os.environ.get("TORCH_EXTENSIONS_DIR")}) + "\n")
time.sleep(meta.get("sleep", 0))
if meta.get("grandchild"):  # as ninja starts compilers: in a process group of their own
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({"grandchild": child.pid}) + "\n")
if meta.get("crash"):
    sys.exit("Traceback: boom " + spec["row"])
if meta.get("hang"):
    time.sleep(60)
print("noise", flush=True)
print("RESULT " + json.dumps({"spec": spec, "status": meta.get("status", "ok"), "step_median_s": 0.5}), flush=True)
if meta.get("hang_at_exit"):
    time.sleep(60)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"name": spec["row"], "end": time.time()}) + "\n")
'''
FAKE_BUILD = r'''
import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write('{"build": "%s"}\n' % sys.argv[-1])
print("Time to load %s op: 1.5 seconds" % sys.argv[-1])
sys.exit(3 if os.environ.get("FAKE_BUILD_FAIL") else 0)
'''


def row(rid, est=0.2, **kw):
    return {"name": "qwen2-tiny", "row": rid, "model": MODEL, "stage": 2, "mb": 1, "seq": 64, "steps": 7, "warmup": 2,
            "est_wall_s": est, **kw}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    probe, build = tmp_path / "probe.py", tmp_path / "build.py"
    probe.write_text(FAKE_PROBE)
    build.write_text(FAKE_BUILD)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)

    def run(rows, *extra, out="out"):
        path = tmp_path / "specs.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        rc = run_rows.main([str(path), str(tmp_path / out), "--probe", f"{sys.executable} {probe}",
                            "--build-cmd", f"{sys.executable} {build}", "--logs", str(tmp_path / "logs"),
                            "--margin-s", "0", *extra])
        out_dir = tmp_path / out
        results = [json.loads(x) for x in (out_dir / "rows.jsonl").read_text().splitlines()] \
            if (out_dir / "rows.jsonl").exists() else []
        log = [json.loads(x) for x in (tmp_path / "fake.log").read_text().splitlines()] \
            if (tmp_path / "fake.log").exists() else []
        return rc, results, log, out_dir
    return run


def test_rows_run_one_at_a_time_in_file_order_on_the_gpu_asked(bench):
    rc, results, log, out = bench([row("a", meta={"sleep": 0.3}), row("b"), row("c")], "--gpu", "1")
    assert rc == 0
    assert [r["row"] for r in results] == ["a", "b", "c"]
    assert all(r["status"] == "ok" and r["runner"]["rc"] == 0 for r in results)
    starts = [e for e in log if "start" in e]
    ends = {e["name"]: e["end"] for e in log if "end" in e}
    assert [e["name"] for e in starts] == ["a", "b", "c"]
    assert all(nxt["start"] >= ends[prev["name"]] for prev, nxt in zip(starts, starts[1:]))  # never two at once
    assert {e["gpu"] for e in starts} == {"1"}
    assert {e["ext"] for e in starts} == {"/tmp/zp_torch_extensions"}  # one extensions folder for every row
    machine = json.loads((out / "machine.json").read_text())
    assert machine["counts"] == {"ok": 3} and "versions" in machine and "after" in machine


def test_a_row_whose_estimate_exceeds_the_budget_left_is_skipped_and_later_rows_still_run(bench):
    rc, results, log, _ = bench([row("big", est=50), row("small")], "--budget-s", "20")
    assert [(r["row"], r["status"], r.get("skipped")) for r in results] == [
        ("big", "skipped", "budget"), ("small", "ok", None)]
    assert [e["name"] for e in log if "start" in e] == ["small"]


def test_a_second_call_resumes_runs_only_what_has_no_result(bench):
    bench([row("a"), row("big", est=50), row("b")], "--budget-s", "20")
    rc, results, log, _ = bench([row("a"), row("big", est=1), row("b")], "--budget-s", "20")
    assert [e["name"] for e in log if "start" in e] == ["a", "b", "big"]  # a and b once each; big when it fits
    assert [(r["row"], r["status"]) for r in results] == [("a", "ok"), ("big", "skipped"), ("b", "ok"),
                                                           ("big", "ok")]


def _alive(pid):
    for _ in range(50):  # reaped by its new parent soon after the kill
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.1)
    return True


def test_hung_rows_are_killed_in_time_and_a_crash_leaves_its_stderr_in_fail_log(bench):
    """A row hung in its work is killed at its timeout, one hung in its exit soon after its RESULT (kept)."""
    rows = [row("hang", timeout_s=1, meta={"hang": True, "grandchild": True}), row("crash", meta={"crash": True}),
            row("oom", meta={"status": "oom"}), row("exit", meta={"hang_at_exit": True}), row("after")]
    rc, results, log, out = bench(rows, "--grace-s", "0.5")
    by = {r["row"]: r for r in results}
    assert by["hang"]["status"] == "timeout" and by["hang"]["runner"]["rc"] is None
    assert by["hang"]["runner"]["wall_s"] < 10
    grandchild = next(e["grandchild"] for e in log if "grandchild" in e)
    assert not _alive(grandchild)  # killed by id, though in a process group of its own
    assert by["crash"]["status"] == "failed" and by["crash"]["runner"]["rc"] == 1
    assert by["oom"]["status"] == "oom" and by["after"]["status"] == "ok"
    assert by["exit"]["status"] == "ok" and by["exit"]["runner"]["killed_after_result"]  # its result kept
    assert by["exit"]["runner"]["wall_s"] < 10
    fail = (out / "fail.log").read_text()
    assert "TIMEOUT hang" in fail and "FAILED crash" in fail and "boom crash" in fail and "OOM oom" in fail
    assert "after" not in fail


def test_each_op_is_built_once_before_the_rows_and_a_failed_build_skips_the_rows_that_need_it(bench, monkeypatch):
    rows = [row("f1", adam="fused"), row("c1", adam="cpu", offload=True), row("f2", adam="fused"), row("t")]
    rc, results, log, out = bench(rows)
    assert sorted(e["build"] for e in log if "build" in e) == ["cpu_adam", "fused_adam"]  # once each
    assert max(i for i, e in enumerate(log) if "build" in e) < min(i for i, e in enumerate(log) if "start" in e)
    assert [e["name"] for e in log if "start" in e] == ["f1", "c1", "f2", "t"]
    builds = json.loads((out / "machine.json").read_text())["op_builds"]
    assert builds["fused_adam"]["ok"] and builds["fused_adam"]["load_s"] == 1.5
    monkeypatch.setenv("FAKE_BUILD_FAIL", "1")
    rc, results, log, out = bench(rows, out="out2")
    assert [(r["row"], r["status"], r.get("skipped")) for r in results] == [
        ("f1", "skipped", "build"), ("c1", "skipped", "build"), ("f2", "skipped", "build"), ("t", "ok", None)]
    assert "BUILD fused_adam failed" in (out / "fail.log").read_text()


def test_a_spec_file_with_a_problem_stops_the_call_before_anything_runs(bench, capsys):
    rc, results, log, out = bench([row("a"), row("a", warm_up=2), row("c", steps=4)])
    assert rc == 2 and results == [] and log == [] and not out.exists()
    err = capsys.readouterr().err
    assert "line 2: a: unknown key(s) warm_up" in err and "line 2: a: the same id ('row', else 'name') as line 1" in err
    assert "line 3: c: issue 40's protocol" in err


def test_check_mode_needs_no_out_and_says_what_will_be_built(tmp_path, capsys):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(row("a", est=30, adam="fused")) + "\n\n" + json.dumps(row("b", est=12)) + "\n")
    assert run_rows.main([str(path), "--check"]) == 0
    assert "2 rows, est_wall_s 42 s" in capsys.readouterr().out


@pytest.mark.parametrize("change, problem", [
    ({"adam": "cpu"}, "needs 'offload'"),
    ({"adam": "fused", "offload": True}, "runs on the GPU"),
    ({"adam": "client", "offload": True}, "refuse the client optimizer"),
    ({"adam": "lamb"}, "'adam' must be one of"),
    ({"cpu_adam": True, "adam": "torch"}, "contradict"),
    ({"steps": 2, "warmup": 2}, "must exceed 'warmup'"),
    ({"ga": 0}, "'ga' must be an integer >= 1"),
    ({"liger": True, "model": {"model_type": "gemma"}}, "'liger' is applied to"),
    ({"stage": 4}, "'stage' must be"),
])
def test_spec_values_the_probe_cannot_honour_are_named(change, problem):
    found = specs.problems(row("x", **change))
    assert any(problem in p for p in found), found


@pytest.mark.parametrize("change, problem", [
    ({"ws": 2}, "one GPU"),
    ({"mlp": 10**8}, "'mlp' acts under ZeRO-3 only"),
    ({"est_wall_s": None}, "'est_wall_s' must be a number"),
    ({"row": "a b"}, "'row' must be"),
    ({"row": None, "name": None}, "needs an id"),
    ({"quant": 4}, "memory settings"),
])
def test_timing_rows_need_one_gpu_an_estimate_a_name_and_timed_settings(change, problem):
    spec = {**row("x"), **change}
    assert specs.problems(spec) == []  # the probe itself accepts them (the memory rows use them)
    assert any(problem in p for p in specs.problems(spec, timing=True))


def test_free_form_fields_and_predictions_are_accepted_in_timing_rows():
    assert specs.problems(row("x", split="heldout", pred_step_s=1.2, meta={"why": "z"}, note="n"), timing=True) == []


def test_every_committed_memory_spec_still_passes_the_probes_own_check():
    """The probe now refuses a bad spec before touching the GPU: the rows measured before must still pass."""
    seen = 0
    settings = sorted((ROOT / "bench/plan/settings/data").glob("*/specs.jsonl"))
    for path in [ROOT / "bench/plan/data/rows.jsonl", *settings]:
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                spec = record.get("spec", record)
                assert specs.problems(spec) == [], (path.name, spec.get("name"))
                seen += 1
    assert seen > 500


def test_op_builds_follow_the_optimizers():
    assert specs.op_builds([row("a", adam="fused"), row("b", cpu_adam=True, offload=True), row("c", cpu_adam=True),
                            row("d")]) == ["cpu_adam", "fused_adam"]


def test_autotuning_config_tunes_exactly_the_micro_batches_asked_at_one_global_batch():
    cfg = autotune.autotuning_config(16, ["8", "2", "4"], ["3", "1", "2"], 2, 3, "/r", "/e")
    assert cfg["train_micro_batch_size_per_gpu"] == [2, 4, 8]  # a list: no search for the largest that fits
    assert cfg["gradient_accumulation_steps"] == 2  # 16 / 8: accumulation 8, 4, 2 for micro batches 2, 4, 8
    assert cfg["zero_optimization"] == {"stage": [1, 2, 3]}
    at = cfg["autotuning"]
    assert at["enabled"] and at["fast"] and (at["start_profile_step"], at["end_profile_step"]) == (2, 3)
    assert (at["results_dir"], at["exps_dir"], at["metric"]) == ("/r", "/e", "throughput")
    with pytest.raises(ValueError, match="must divide the global batch"):
        autotune.autotuning_config(12, [8], [1], 2, 3, "/r", "/e")
    with pytest.raises(ValueError, match="below end_step"):
        autotune.autotuning_config(16, [2], [1], 3, 3, "/r", "/e")


def _experiment(results, name, stage, mb, ga, latency=None, error=None):
    d = results / name
    d.mkdir(parents=True)
    (d / "exp.json").write_text("{}")
    (d / "ds_config.json").write_text(json.dumps({"zero_optimization": {"stage": stage},
                                                  "train_micro_batch_size_per_gpu": mb,
                                                  "gradient_accumulation_steps": ga, "train_batch_size": mb * ga}))
    (d / "cmd.txt").write_text(f"deepspeed x {name}\n")
    (d / "stderr.log").write_text(f"warning: fine\nError: CUDA out of memory {name}\n" if error else "warning\n")
    if latency:
        (d / "metrics.json").write_text(json.dumps({"latency": latency, "throughput": 16e6 / latency}))


def test_what_the_autotuner_chose_is_read_from_its_results_and_log(tmp_path):
    results = tmp_path / "results"
    _experiment(results, "z1_gas8_tmbspg2", 1, 2, 8, latency=800000.0)
    _experiment(results, "z2_gas2_tmbspg8", 2, 8, 2, latency=500000.0)
    _experiment(results, "z3_gas2_tmbspg8", 3, 8, 2, error=True)
    (results / "ds_config_optimal.json").write_text((results / "z2_gas2_tmbspg8" / "ds_config.json").read_text())
    (results / "cmd_optimal.txt").write_text("deepspeed x z2_gas2_tmbspg8\n")
    log = "noise\n[INFO] No need to tune Zero stage 3. End tuning for space z3\n[INFO] z2 is the optimal setup\n"
    got = autotune.collect(str(results), log)
    chosen = got["chosen"]
    assert (chosen["stage"], chosen["mb"], chosen["ga"], chosen["experiment"]) == (2, 8, 2, "z2_gas2_tmbspg8")
    assert chosen["step_s"] == 0.5 and chosen["samples_per_s"] == 32.0
    by = {e["name"]: e for e in got["experiments"]}
    assert by["z3_gas2_tmbspg8"]["error"].startswith("CUDA out of memory") and by["z1_gas8_tmbspg2"]["error"] is None
    assert got["log_lines"] == ["[INFO] No need to tune Zero stage 3. End tuning for space z3",
                                "[INFO] z2 is the optimal setup"]
    assert autotune.collect(str(tmp_path / "none"), "")["chosen"] is None


def test_a_bad_autotune_case_is_refused_in_one_line_with_a_report(tmp_path, capsys):
    assert autotune.main([str(tmp_path / "out"), '{"hidden_size": 8}', "--global-batch", "16", "--seq", "8",
                          "--workdir", str(tmp_path / "w")]) == 2
    assert "model_type" in capsys.readouterr().err
    assert "model_type" in json.loads((tmp_path / "out" / "autotune.json").read_text())["error"]


def test_the_autotuners_stand_ins_launch_deepspeed_and_clean_up_nothing(tmp_path):
    autotune.write_shims(str(tmp_path), "/usr/bin/python3")
    assert os.access(tmp_path / "pdsh", os.X_OK) and os.system(f"{tmp_path / 'pdsh'} -w x pkill -f y") == 0
    assert "deepspeed.launcher.runner import main" in (tmp_path / "deepspeed").read_text()
