"""bench/plan/run_x2.py, the GPU-machine runner: what it reads back from a run's log."""
import importlib.util
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "bench" / "plan" / "run_x2.py"


def _runner(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("NGPU", "1")  # no nvidia-smi here
    spec = importlib.util.spec_from_file_location("run_x2", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_ranks_results_on_one_log_line_are_both_read(monkeypatch, tmp_path):
    """Both ranks of a world-size-2 run write to one log; call 28's second attempt stopped when two RESULT lines
    landed on one line (json: "Extra data")."""
    runner = _runner(monkeypatch, tmp_path)
    log = ('[rank1] step 3\nRESULT {"rank": 1, "status": "ok"}RESULT {"rank": 0, "status": "ok"}\n'
           'RESULT {"rank": 2, "status": "oom"}{"rank": 3, "status": "ok"}\nnoise RESULT {"rank": 4}\n')
    assert [r["rank"] for r in runner.results_in(log)] == [1, 0, 2, 3, 4]
    assert runner.results_in("no result here\n") == []
