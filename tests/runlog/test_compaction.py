"""Compaction loses nothing the report, the verdicts and ``top`` use; a killed writer, damage and a compaction stopped
half-way leave a directory that reads (``runlog.compact``, ``runlog.segread``, issue 41).

Jobs come from ``tests/report/synth.py``: every record through the guard's writer (which closes a segment past
``segment_bytes``), then the supervisor's end (``runlog.compact.finish_rank``) or not; the reports of both are
compared field by field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.report import synth
from zeropilot.runlog import read as readmod
from zeropilot.runlog import segments as seg
from zeropilot.runlog.compact import compact_closed, compact_segment, finish_rank, merge_rank
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.read import read_run
from zeropilot.runlog.segread import decode_segment
from zeropilot.runlog.summary import summarize

SPEC = synth.JobSpec(nodes=2, per_node=8, steps=2000, save_every=700, straggler=3, heavy=12, slow_gpu=9)
SEGMENT = 256 << 10  # segments of 256 KiB: about 400 steps each, 5 per rank


def _report(root):
    """The report's JSON, with the directory's name as ``DIR`` (two copies of a run compare equal)."""
    return json.loads(json.dumps(summarize(read_run(root)), default=str).replace(str(root), "DIR"))


@pytest.fixture(scope="module")
def lines_dir(tmp_path_factory):
    """The job as the writers left it: closed segments and live files, JSON lines."""
    return synth.write_job(tmp_path_factory.mktemp("job") / "lines", SPEC, segment_bytes=SEGMENT, compact=False)


@pytest.fixture(scope="module")
def compacted_dir(lines_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("job") / "compacted"
    shutil.copytree(lines_dir, root)
    for rank in range(SPEC.world):
        finish_rank(RunDir(root), rank)
    return root


def test_the_writer_closed_segments_and_the_end_merged_them(lines_dir, compacted_dir):
    names = set(os.listdir(compacted_dir))
    assert len([n for n in os.listdir(lines_dir) if ".seg-" in n]) >= 4 * SPEC.world
    assert {f"rank-{r}.seg-000001-00000{len(RunDir(lines_dir).segments()[r]) + 1}.col"
            for r in range(SPEC.world)} <= names
    assert not [n for n in names if n.endswith(".jsonl")]
    size = sum((compacted_dir / n).stat().st_size for n in names if n.endswith(".col"))
    assert size / (SPEC.world * SPEC.steps) < 64


@pytest.mark.parametrize("sampled", [False, True])
def test_the_report_of_a_compacted_run_is_the_report_of_its_lines(lines_dir, compacted_dir, sampled, monkeypatch):
    """Every field: verdict, steps, memory peaks and where, saves, stragglers (data, GPU), time, timeouts, spread,
    nodes; whole, and sampled at the same steps (a long run's reading)."""
    if sampled:
        monkeypatch.setattr(readmod, "FULL_ROWS", 1000)
        monkeypatch.setattr(readmod, "SAMPLE_ROWS", 10 ** 9)
    a, b = _report(lines_dir), _report(compacted_dir)
    assert a["problems"] == b["problems"] == []
    for key in a:
        assert a[key] == b[key], key
    assert {s["rank"] for s in b["stragglers"]} == {3}
    # a probe every 10 steps: the sample (multiples of 128) holds too few of this short run's to name a slow GPU
    assert {s["rank"] for s in b["gpu_stragglers"]} == (set() if sampled else {9})
    assert b["reading"]["sample_every"] == (128 if sampled else None)
    assert b["reading"]["step_records"] == SPEC.world * SPEC.steps


def test_top_sees_the_same_run_in_lines_and_compacted(lines_dir, compacted_dir):
    from zeropilot.cli.top import document
    from zeropilot.runlog.live import LiveRun

    docs = []
    for root in (lines_dir, compacted_dir):
        live = LiveRun.open(root)
        live.refresh()
        doc = document(live, synth.T0 + 4000)
        docs.append({k: doc[k] for k in ("verdict_so_far", "stragglers", "gpu_stragglers", "spread")})
        docs[-1]["ranks"] = [{k: v for k, v in r.items() if k != "steps_seen"} for r in doc["ranks"]]
    assert docs[0] == docs[1]
    assert [s["rank"] for s in docs[1]["gpu_stragglers"]] == [9]


def test_a_killed_writer_loses_only_the_line_it_was_writing(lines_dir, tmp_path):
    """The guard writes each record with one ``write`` as it happens: a rank killed mid-line leaves a torn last
    line, which the reader drops and the compaction drops, every whole record before it read."""
    root = tmp_path / "killed"
    shutil.copytree(lines_dir, root)
    live = RunDir(root).events(5)
    whole = _report(root)
    with open(live, "ab") as fh:
        fh.write(b'{"v":1,"event":"step","t":1780001000.5,"rank":5,"step":2001,"mem":{"allocated')
    torn = _report(root)
    assert torn["ranks"][5]["steps"] == whole["ranks"][5]["steps"] == SPEC.steps
    finish_rank(RunDir(root), 5)
    after = _report(root)
    assert after["ranks"][5] == whole["ranks"][5]
    assert not live.exists()


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "zeropilot", *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.fixture(scope="module")
def long_ranks(tmp_path_factory):
    """Two ranks of 9,000 steps: three row groups each (``runlog.segments.GROUP_ROWS``)."""
    spec = synth.JobSpec(nodes=1, per_node=2, steps=9000, save_every=4000)
    return synth.write_job(tmp_path_factory.mktemp("long") / "run", spec), spec


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "head"])
def test_a_damaged_segment_is_read_up_to_the_damage_in_one_line(long_ranks, tmp_path, damage):
    """A disk that filled up, a copy stopped half-way, a flipped bit: ``report`` and ``top`` read the rows before the
    damage, name the file and the byte in one line, and go on with every other rank."""
    src, spec = long_ranks
    root = tmp_path / "damaged"
    shutil.copytree(src, root)
    path = next(root.glob("rank-1.seg-*.col"))
    data = bytearray(path.read_bytes())
    head, body = seg.parse_head(bytes(data))
    rows = [f for f in head["frames"] if f["kind"] == "rows"]
    assert len(rows) == 3
    if damage == "truncated":
        data = data[:body + rows[1]["at"] + rows[1]["len"] // 2]
    elif damage == "corrupt":
        data[body + rows[1]["at"] + 40] ^= 0xFF
    else:
        data[seg.PREAMBLE + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    for cmd in (["report", str(root)], ["top", str(root), "--once"]):
        out = _cli(*cmd)
        assert "Traceback" not in out.stderr + out.stdout and out.returncode == 0, out.stderr
        notes = [ln for ln in out.stdout.splitlines() if path.name in ln]
        if cmd[0] == "top" and damage != "head":  # top reads a file's front (head, sample, tail): undamaged here
            assert notes == []
            continue
        assert len(notes) == 1, (cmd, out.stdout[-3000:])
        assert "damaged at byte" in notes[0]
        assert ("nothing in it could be read" if damage == "head" else "read up to it") in notes[0]
    ranks = {r["rank"]: r["steps"] for r in _report(root)["ranks"]}
    assert ranks.get(1, 0) == (0 if damage == "head" else seg.GROUP_ROWS) and ranks[0] == spec.steps


def test_a_compaction_stopped_at_any_point_leaves_a_directory_that_reads(lines_dir, tmp_path):
    """Stopped after writing the columns and before removing the lines; with its temporary file half-written; a merge
    stopped before removing what it merged: each reads as the lines did, and the next compaction finishes."""
    want = _report(lines_dir)
    root = tmp_path / "stopped"
    shutil.copytree(lines_dir, root)
    d = RunDir(root)
    compact_segment(d, 0, d.segments()[0][0])  # rank 0's first segment compacted: its lines gone
    s1 = d.segments()[1][0]
    (root / d.segment_col(1, s1.seq).name).write_bytes(seg.encode(seg.from_lines(
        1, s1.seq, s1.jsonl.read_bytes().split(b"\n"), 1 << 20)))  # columns written, lines not yet removed
    (root / f".{d.segment_col(2, 1).name}.x1y2.tmp").write_bytes(b"ZPSEG1\r\n\x00\x01")  # a temporary file cut short
    for s in d.segments()[3]:
        compact_segment(d, 3, s)
    cols = d.segments()[3]
    merged = seg.concat([decode_segment(s.col, whole=True) for s in cols])
    (root / d.segment_col(3, merged.seq, merged.last).name).write_bytes(seg.encode(merged))  # merged, not cleaned up
    assert _report(root) == want
    compact_closed(root, min_age_s=0.0)  # the supervisor's next pass
    assert _report(root) == want
    for rank in range(SPEC.world):
        finish_rank(d, rank)
    assert _report(root) == want
    assert all(len(v) == 1 for v in d.segments().values())


def test_merge_rank_leaves_segments_that_are_still_lines(lines_dir, tmp_path):
    root = tmp_path / "half"
    shutil.copytree(lines_dir, root)
    d = RunDir(root)
    compact_segment(d, 0, d.segments()[0][0])
    assert merge_rank(d, 0, d.segments()[0]) is None  # its second segment is still JSON lines


def test_the_supervisors_thread_compacts_closed_segments_and_leaves_live_files(lines_dir, tmp_path):
    """``runlog.compact.Compactor`` (what ``zeropilot run`` starts): every closed segment compacted, the live files
    left to their writers, the report unchanged."""
    import time

    from zeropilot.runlog.compact import Compactor

    want = _report(lines_dir)
    root = tmp_path / "running"
    shutil.copytree(lines_dir, root)
    d = RunDir(root)
    worker = Compactor(root, every_s=0.05, min_age_s=0.0)
    deadline = time.time() + 30
    while time.time() < deadline and any(s.jsonl is not None for segs in d.segments().values() for s in segs):
        time.sleep(0.05)
    worker.stop()
    assert all(s.jsonl is None and s.col is not None for segs in d.segments().values() for s in segs)
    assert all(d.events(r).exists() for r in range(SPEC.world))
    assert _report(root) == want
