"""``zeropilot top``: driven against a real live 2-rank CPU job (HF Trainer + ZeRO-2 under torchrun, gloo), then on
its finished directory in a pseudo-terminal (the ANSI redraw), and on hostile directories."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runjobs import hf_trainer_watched
from zeropilot.cli import main

REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^\d\d:\d\d:\d\d rank (\d+) step (\d+) ")


@pytest.mark.slow
def test_top_follows_both_ranks_of_a_live_job_to_its_verdict():
    watched = hf_trainer_watched()
    assert watched.job.returncode == 0, watched.job.stderr[-3000:]
    steps = {0: [], 1: []}
    for line in watched.top_lines:
        m = STEP.match(line)
        if m:
            steps[int(m.group(1))].append(int(m.group(2)))
    assert steps == {0: list(range(1, 9)), 1: list(range(1, 9))}, watched.top_lines
    live = {r: [int(m.group(2)) for m in map(STEP.match, watched.live_lines) if m and int(m.group(1)) == r]
            for r in (0, 1)}
    # both ranks seen advancing while the job ran (lines read before `zeropilot run` exited)
    assert all(len(set(s)) >= 2 for s in live.values()), watched.live_lines
    verdicts = [ln for ln in watched.top_lines if ln.startswith("verdict so far: ")]
    assert verdicts[0].startswith("verdict so far: RUNNING") and "ENDED" in verdicts[-1]
    assert "verdict: OK (" in "\n".join(watched.top_lines) or "verdict: OK:" in "\n".join(watched.top_lines)
    assert watched.top_rc == 0


@pytest.mark.slow
def test_top_json_follows_the_same_live_job():
    """``top --format json`` ran beside the plain one: a valid zeropilot.top/1 document per refresh, both ranks
    advancing, the final verdict on the last line only."""
    from tests.cli.test_json_schemas import schema_errors

    watched = hf_trainer_watched()
    assert watched.json_rc == 0, watched.json_lines[-5:]
    docs = [json.loads(line) for line in watched.json_lines]
    assert len(docs) >= 3 and all(schema_errors(d, "top.schema.json") == [] for d in docs)
    assert docs[-1]["final"]["kind"] == "ok" and all(d["final"] is None for d in docs[:-1])
    seen = {0: set(), 1: set()}
    for d in docs[:-1]:
        for r in d["ranks"]:
            if r["step"] is not None:
                seen[r["rank"]].add(r["step"])
    assert all(len(steps) >= 2 for steps in seen.values()), seen
    assert [(r["rank"], r["step"], r["ended"]) for r in docs[-1]["ranks"]] == [(0, 8, True), (1, 8, True)]


def _in_pty(argv, timeout=60.0) -> bytes:
    """Run ``argv`` with its stdout on a pseudo-terminal; what it wrote there."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), COLUMNS="120", LINES="30")
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, out[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return out


@pytest.mark.slow
def test_top_redraws_with_ansi_on_a_terminal():
    run_dir = hf_trainer_watched().job.run_dir
    out = _in_pty([sys.executable, "-m", "zeropilot", "top", str(run_dir)]).decode("utf-8", "replace")
    assert "\x1b[H" in out and "\x1b[K" in out and "\x1b[J" in out  # home, clear line, clear below: no curses
    table = out.split("\x1b[H")[-1]
    rows = [ln for ln in table.replace("\x1b[K", "").splitlines() if re.match(r"^\s+[01]\s+8\s+ended", ln)]
    assert len(rows) == 2, table
    assert "verdict: OK" in out


def _run_dir(root: Path, records) -> Path:
    root.mkdir()
    (root / "run.json").write_text(json.dumps({"schema": "zeropilot.run/1", "command": ["python", "t.py"],
                                               "started_at": 1.0}))
    with open(root / "rank-0.jsonl", "w") as f:
        for rec in records:
            f.write(rec if isinstance(rec, str) else json.dumps(rec) + "\n")
    return root


def test_top_once_on_hostile_records(tmp_path, capsys):
    """Torn lines, escapes, nonsense numbers and a FIFO rank file: one screen, no traceback, nothing raw."""
    mem = {"allocated_bytes": 2 << 30, "reserved_bytes": 3 << 30, "peak_reserved_bytes": 4 << 30,
           "device_total_bytes": 8 << 30, "host_rss_bytes": "big", "outside_torch_bytes": float("nan")}
    d = _run_dir(tmp_path / "run", [
        {"event": "start", "t": 2.0, "device": {"total_bytes": 16 << 30}, "allocator_limit_bytes": 8 << 30},
        {"event": "step", "t": 3.0, "step": 1, "seconds": 0.5, "mem": mem},
        "{not json\n", "[1, 2]\n",
        {"event": "error", "t": 4.0, "type": "\x1b[2JRuntimeError", "message": "boom\x07"},
        '{"event": "step", "t": 5'])  # torn last line
    os.mkfifo(d / "rank-1.jsonl")
    (d / "heartbeat-rank-0.json").write_text(json.dumps({"t": 4.5, "phase": "\x1b]0;x\x07forward"}))
    assert main(["top", str(d), "--once"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    row = next(ln for ln in out.splitlines() if re.match(r"^\s+0\s+1\s", ln))
    assert "ERROR" in row and "2.0G" in row and "3.0G" in row and "4.0G/8.0G 50%" in row
    assert "verdict so far: CRASH (rank 0): ?[2JRuntimeError: boom?" in out
    from tests.cli.test_json_schemas import schema_errors

    assert main(["top", str(d), "--once", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert schema_errors(doc, "top.schema.json") == []
    rank = doc["ranks"][0]
    assert rank["step"] == 1 and rank["reserved_bytes"] == 3 << 30 and rank["host_rss_bytes"] is None
    assert doc["verdict_so_far"]["kind"] == "crash" and doc["final"] is None


def test_top_reads_only_the_tail_of_a_large_file(tmp_path, capsys, monkeypatch):
    from zeropilot.runlog import live

    monkeypatch.setattr(live, "FIRST_LOOK", 1000)  # top's first look at a live file: its last bytes
    recs = [{"event": "step", "t": 1.0 + i, "step": i + 1, "seconds": 0.1, "mem": {"host_rss_bytes": 1 << 20}}
            for i in range(200)]
    d = _run_dir(tmp_path / "run", recs)
    state = live.LiveRun.open(d)
    new = state.refresh()
    assert new and new[-1]["step"] == 200 and len(new) < 20  # read from the last 1000 bytes on, whole lines only
    with open(d / "rank-0.jsonl", "a") as f:
        f.write(json.dumps({"event": "step", "t": 300.0, "step": 201, "seconds": 0.1, "mem": {}}))
    assert state.refresh() == []  # a line without its newline waits
    with open(d / "rank-0.jsonl", "a") as f:
        f.write("\n")
    assert [s["step"] for s in state.refresh()] == [201]


def test_top_refuses_what_is_not_a_run_directory(tmp_path, capsys):
    assert main(["top", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["top", str(tmp_path), "--interval", "0"]) == 2


def test_top_names_a_straggler_with_its_ratio_in_text_and_json(capsys):
    """The recorded run of a slow data loader on rank 1 (tests/runlog/fixtures/straggler-z3)."""
    from tests.cli.test_json_schemas import schema_errors

    fixture = REPO / "tests" / "runlog" / "fixtures" / "straggler-z3"
    assert main(["top", str(fixture), "--once"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("straggler: "))
    assert "rank 1 (node 0" in line and "4.0×" in line and "loading its data" in line
    row = next(ln for ln in out.splitlines() if re.match(r"^\s+1\s+14\s", ln))
    assert "0.40s" in row  # OWN-T: rank 1's own seconds at its newest step
    assert main(["top", str(fixture), "--once", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert schema_errors(doc, "top.schema.json") == []
    [s] = doc["stragglers"]
    assert s["rank"] == 1 and 3.0 < s["ratio"] < 5.0 and s["place"]["local_rank"] == 1
    assert 0.35 < doc["ranks"][1]["own_seconds"] < 0.45 and doc["ranks"][0]["own_seconds"] < 0.15
