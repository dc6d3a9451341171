"""A run directory from a stranger: wrong types, garbage lines, markup and terminal escapes.

The report keeps one shape (the schema holds), the HTML escapes everything, the terminal text
carries no control characters, and nothing is a traceback.
"""

from __future__ import annotations

import json

from tests.report.synth import Spec, write_json_lines, write_run
from zeropilot.cli import main
from zeropilot.runlog import read_run, summarize
from zeropilot.runlog import columns, read as reader

EVIL = "<script>alert(1)</script><img src=http://x.invalid/a.png onerror=alert(2)>\x1b[2J\x1b]0;pwned\x07"


def _hostile_dir(tmp_path):
    d = write_run(tmp_path / "evil", Spec(ranks=2, steps=6, save_every=3, oom_rank=1, hang_rank=None))
    with open(d / "rank-0.jsonl", "a", encoding="utf-8") as fh:
        fh.write("not json\n[1,2]\n")
        fh.write(json.dumps({"event": "step", "t": "soon", "step": 10 ** 400, "seconds": 1e308 * 10,
                             "mem": {"reserved_bytes": "lots", "allocated_bytes": True}}) + "\n")
        fh.write(json.dumps({"event": "save", "t": None, "step": "x", "tag": EVIL, "phases": [EVIL, {"name": 3}],
                             "mem_before": [1], "bytes": -1}) + "\n")
        fh.write(json.dumps({"event": "error", "t": 1e99, "type": EVIL, "message": {"a": 1}, "where": [{"x": 1}, 5]}) + "\n")
        fh.write('{"event": "step", "t": 1, "mem": ')  # torn last line
    oom = json.loads((d / "oom-rank-1.json").read_text())
    oom.update({"phase": EVIL, "where": EVIL, "fixes": [EVIL, {"fix": EVIL, "why": [1]}, 7],
                "verdict": {"kind": EVIL, "summary": EVIL, "evidence": [EVIL, None]}, "mem": "full"})
    (d / "oom-rank-1.json").write_text(json.dumps(oom))
    (d / "hang.json").write_text(json.dumps({"verdict": "stuck", "ranks": [{"rank": "0"}, 3, {"rank": 1, "phase": EVIL}]}))
    (d / "stacks-rank-1.txt").write_bytes(EVIL.encode() + b"\xff\xfe binary")
    run = json.loads((d / "run.json").read_text())
    run.update({"command": EVIL, "environment": {"PYTORCH_CUDA_ALLOC_CONF": EVIL, "X": {"deep": [1]}},
                "plan": {"peak_bytes_per_rank": "big"}, "exit_code": "one"})
    (d / "run.json").write_text(json.dumps(run))
    return d


def test_hostile_directory_keeps_the_schema_and_escapes_everything(tmp_path, capsys, validate):
    d = _hostile_dir(tmp_path)
    assert main(["report", str(d), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert validate(rep) == []
    assert rep["verdict"]["kind"] == "hang" and rep["verdict"]["ranks"] == []
    assert any("unreadable line" in p for p in rep["problems"])
    assert rep["ooms"][0]["fixes"][0]["fix"] == EVIL and rep["hang"]["ranks"][0]["rank"] == 1

    assert main(["report", str(d)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text and "?[2J" in text

    out = tmp_path / "r.html"
    assert main(["report", str(d), "--format", "html", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'" in page


def test_not_a_run_directory_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a run directory" in err


def test_reader_budgets_bound_memory_and_say_so(tmp_path, monkeypatch):
    d = tmp_path / "big"
    d.mkdir()
    write_json_lines(d / "rank-0.jsonl", [{"event": "step", "t": i, "step": i, "mem": {}} for i in range(50)]
                     + [{"event": "save", "t": 100 + i} for i in range(20)])
    monkeypatch.setattr(reader, "MAX_STEP_ROWS", 30)
    monkeypatch.setattr(reader, "MAX_EVENTS", 5)
    monkeypatch.setattr(columns, "MAX_LINE", 200)  # read where the lines are read
    with open(d / "rank-0.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "end", "pad": "x" * 1000}) + "\n")
    records = read_run(d)
    assert records.ranks[0].n_steps == 30 and len(records.ranks[0].events) == 5
    notes = " ".join(summarize(records)["problems"])
    assert "20 step record(s) and 15 other record(s) not read" in notes and "1 unreadable line(s)" in notes


def test_fifos_devices_and_links_are_not_read(tmp_path, capsys, validate):
    """A FIFO would block the reader forever and a link could read outside the directory: both are notes."""
    import os

    d = write_run(tmp_path / "odd", Spec(ranks=1, steps=3, save_every=0))
    secret = tmp_path / "secret.txt"
    secret.write_text('{"event": "error", "type": "LEAK", "message": "outside"}\n')
    os.mkfifo(d / "rank-1.jsonl")
    os.symlink(secret, d / "rank-2.jsonl")
    os.symlink("/dev/zero", d / "stacks-rank-0.txt")
    os.mkfifo(d / "hang.json")
    assert main(["report", str(d), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert validate(rep) == [] and rep["verdict"]["kind"] == "ok" and rep["hang"] is None
    assert "LEAK" not in json.dumps(rep)
    assert sorted(rep["problems"]) == ["hang.json: not a regular file, not read",
                                       "rank-1.jsonl: not a regular file, not read",
                                       "rank-2.jsonl: a symbolic link, not read",
                                       "stacks-rank-0.txt: a symbolic link, not read"]


def test_deeply_nested_json_is_a_note_not_a_traceback(tmp_path, capsys, validate):
    d = write_run(tmp_path / "deep", Spec(ranks=1, steps=3, save_every=0))
    with open(d / "rank-0.jsonl", "a") as fh:
        fh.write('{"event": "save", "x": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    (d / "hang.json").write_text("[" * 200_000 + "]" * 200_000)
    run = json.loads((d / "run.json").read_text())
    run["environment"]["DEEP"] = json.loads("[" * 500 + "]" * 500)
    run["environment"]["NESTED"] = {"A": {"B": 1}, "C": 2}
    (d / "run.json").write_text(json.dumps(run))
    assert main(["report", str(d), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert validate(rep) == [] and rep["environment"]["DEEP"] == "<list>"
    assert rep["environment"]["NESTED.A"] == "<dict>" and rep["environment"]["NESTED.C"] == "2"
    assert "hang.json: unreadable (RecursionError)" in rep["problems"]
    assert "rank-0.jsonl: 1 unreadable line(s) skipped" in rep["problems"]


def test_numbers_at_the_edge_of_a_float_give_nulls_not_errors(tmp_path, capsys, validate):
    d = tmp_path / "edge"
    d.mkdir()
    big = {"reserved_bytes": 1.7e308, "peak_reserved_bytes": 1.7e308, "outside_torch_bytes": 1.7e308,
           "host_rss_bytes": 1.7e308}
    write_json_lines(d / "rank-0.jsonl", [{"event": "step", "t": 1.0 + i, "step": i + 1, "seconds": 1.7e308,
                                           "mem": big} for i in range(3)])
    (d / "run.json").write_text(json.dumps({"plan": {"peak_bytes_per_rank": 1}, "exit_code": 0, "ended_at": 9}))
    for fmt in ("json", "text", "html"):
        assert main(["report", str(d), "--format", fmt, "--compare", str(d)]) == 0
        out = capsys.readouterr().out
        if fmt == "json":
            rep = json.loads(out)
            assert validate(rep) == [] and rep["a"]["step_seconds"]["count"] == 0
            assert rep["a"]["ranks"][0]["peak_reserved_bytes"] is None and rep["a"]["ranks"][0]["plan_ratio"] is None
    assert main(["report", str(d), "--format", "html", "--out", str(tmp_path / "p.html")]) == 0


def test_an_oom_under_an_allocator_limit_without_its_memory_still_renders(tmp_path, capsys):
    """Found by test_fuzz in CI: an OOM record with an allocator limit but no reserved bytes."""
    d = tmp_path / "limit"
    d.mkdir()
    write_json_lines(d / "rank-0.jsonl", [{"event": "start", "t": 1.0}])
    (d / "oom-rank-0.json").write_text(json.dumps({"event": "oom", "allocator_limit_bytes": 3692384, "mem": {},
                                                   "request_bytes": 2 ** 20}))
    (d / "run.json").write_text("{}")
    assert main(["report", str(d), "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert "the card at the failure" in page and "left under the allocator limit" not in page
    assert "of the allocator limit" in page
