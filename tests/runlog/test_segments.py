"""The compacted segment format (``runlog.segments``): every record back as written, the bytes it costs, damage.

Records come from the real writer's lines (``runlog.events.line``) and from the synthetic job's guard-like records
(``tests/report/synth.py``); a segment's file is decoded by the reader's own functions (``runlog.segread``)."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest

from tests.report import synth
from zeropilot.runlog import segments as seg
from zeropilot.runlog.events import line
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.segread import decode_segment, read_records


def _same(a, b) -> bool:
    """Equal as JSON text: keys in the same order, NaN equal to NaN."""
    return json.dumps(a) == json.dumps(b)


def _odd_records():
    """Step records of every kind of value a stranger's guard could write, with other records among them."""
    rnd = random.Random(7)
    out = [{"v": 1, "event": "start", "t": 1.5, "rank": 0, "host": "h\u00e9", "device": {}}]
    for i in range(1, 3000):
        rec = {"v": 1, "event": "step", "t": 1_780_000_000.0 + i * 0.5 + rnd.random() * 1e-6, "rank": 0, "step": i,
               "seconds": None if i == 1 else rnd.random(), "mem": {"allocated_bytes": rnd.randrange(1 << 40)}}
        if i % 7 == 0:
            rec["phase_seconds"] = {"idle": round(rnd.random(), 6), "new_phase": rnd.choice([1, 2.5, None, "x"])}
        if i % 11 == 0:
            rec["odd"] = rnd.choice([True, False, [1, {"a": None}], {}, {"deep": {"er": {"still": {"x": 1}}}},
                                     float("nan"), float("inf"), 2 ** 70, -3, 1e-300, "\x1b[2J", ""])
        if i % 13 == 0:
            del rec["mem"]
        if i % 500 == 0:
            out.append({"v": 1, "event": "save", "t": rec["t"] + 0.1, "rank": 0, "step": i, "phases": []})
        out.append(rec)
    out.append({"v": 1, "event": "step", "t": 2e9, "rank": 0, "step": 3000,
                **{f"k{j}": j for j in range(seg.MAX_COLUMNS + 1)}})  # too many columns: kept as its line
    out.append({"v": 1, "event": "end", "t": 2e9 + 1, "rank": 0, "steps": 3000})
    return out


def _roundtrip(tmp_path, recs, name="rank-0.seg-000001.col"):
    lines = [line(r)[:-1] for r in recs] + [b'{"torn": ']
    s = seg.from_lines(0, 1, lines, 1 << 20)
    assert s.source["skipped"] == 1  # the torn last line, as every reader drops it
    path = tmp_path / name
    path.write_bytes(seg.encode(s))
    return path, read_records(path)


def test_every_record_comes_back_as_written(tmp_path):
    recs = _odd_records()
    _, back = _roundtrip(tmp_path, recs)
    assert len(back) == len(recs)
    assert all(_same(a, b) for a, b in zip(recs, back))


def test_a_column_of_any_values_decodes_to_the_same_values():
    rnd = random.Random(3)
    pools = [lambda: rnd.randrange(-5, 5), lambda: rnd.randrange(1 << 62), lambda: round(rnd.random() * 100, 3),
             lambda: 1_780_000_000.0 + rnd.random(), lambda: rnd.random() * 10 ** rnd.randrange(-300, 300),
             lambda: rnd.choice([None, True, False, "a", "b", [1], {"x": 1}]), lambda: float("nan"),
             lambda: seg.ABSENT, lambda: 2 ** 64 + rnd.randrange(9)]
    for trial in range(200):
        kinds = rnd.sample(pools, rnd.randrange(1, 4))
        values = [rnd.choice(kinds)() for _ in range(rnd.randrange(0, 300))]
        meta, chunk = seg.encode_column(values)
        back = seg.decode_column(json.loads(json.dumps(meta)), chunk, len(values))
        assert len(back) == len(values)
        for a, b in zip(values, back):
            assert (a is seg.ABSENT and b is seg.ABSENT) or _same(a, b), (trial, a, b)
            assert type(a) is type(b)  # 1 stays an int, 1.0 a float, True a bool


def test_a_long_run_costs_under_64_bytes_a_rank_step(tmp_path):
    """Guard-like records of a GPU job (``synth.job_records``): the compacted file against the writer's lines."""
    spec = synth.JobSpec(nodes=1, per_node=2, steps=6000, save_every=1000, straggler=1)
    for rank in range(2):
        recs = list(synth.job_records(spec, rank))
        lines = sum(len(line(r)) for r in recs)
        data = seg.encode(seg.from_records(rank, 1, recs))
        assert len(data) / spec.steps < 64 and lines / len(data) > 10, (len(data) / spec.steps, lines / len(data))


def test_merged_segments_are_the_segment_of_all_their_records(tmp_path):
    recs = _odd_records()
    parts = [seg.from_records(0, k + 1, recs[k * 700:(k + 1) * 700]) for k in range((len(recs) + 699) // 700)]
    merged = seg.concat(parts)
    whole = seg.from_records(0, 1, recs)
    whole.last, whole.source = merged.last, merged.source
    assert seg.encode(merged) == seg.encode(whole)


def test_the_head_tells_exact_aggregates_and_the_sample_holds_the_chosen_rows(tmp_path):
    recs = list(synth.job_records(synth.JobSpec(nodes=1, per_node=1, steps=700, save_every=300), 0))
    s = seg.from_records(0, 1, recs)
    head, body = seg.parse_head(seg.encode(s))
    stats = {tuple(p): v for p, v in head["stats"]}
    alloc = [r["mem"]["allocated_bytes"] for r in recs if r["event"] == "step"]
    assert stats[("mem", "allocated_bytes")]["max"] == max(alloc) and stats[("mem", "allocated_bytes")]["n"] == 700
    first = alloc.index(max(alloc)) + 1
    assert stats[("mem", "allocated_bytes")]["max_at"][0] == first  # the step that first held it
    steps = s.rows.cols[("step",)]
    chosen = [steps[i] for i in seg.sample_rows(s.rows, s.others)]
    assert {128, 256, 384, 512, 640} <= set(chosen) and {1, 2, 3, 4, 300, 301, 600, 601} <= set(chosen)


@pytest.mark.parametrize("cut", ["truncated", "corrupt-rows", "corrupt-head"])
def test_a_damaged_file_is_read_up_to_the_damage_and_says_where(tmp_path, cut):
    recs = list(synth.job_records(synth.JobSpec(nodes=1, per_node=1, steps=9000, save_every=2000), 0))
    s = seg.from_records(0, 1, recs)
    data = bytearray(seg.encode(s))
    head, body = seg.parse_head(bytes(data))
    groups = [f for f in head["frames"] if f["kind"] == "rows"]
    assert len(groups) == 3
    if cut == "truncated":  # a disk that filled up, a copy stopped half-way
        data = data[:body + groups[-1]["at"] + 10]
    elif cut == "corrupt-rows":  # a bit flipped in the second row group
        data[body + groups[1]["at"] + 50] ^= 0xFF
    else:
        data[seg.PREAMBLE + 5] ^= 0xFF
    path = tmp_path / "rank-0.seg-000001.col"
    path.write_bytes(bytes(data))
    problems = []
    got = decode_segment(path, problems)
    if cut == "corrupt-head":
        assert got is None and problems == [f"{path.name}: damaged at byte {seg.PREAMBLE} (its head does not match "
                                            "its checksum): nothing in it could be read"]
        return
    kept = 2 * seg.GROUP_ROWS if cut == "truncated" else seg.GROUP_ROWS
    part = f"rows {kept}-{min(kept + seg.GROUP_ROWS, 9000) - 1}"
    where = body + groups[2 if cut == "truncated" else 1]["at"] + (len(data) - body - groups[2]["at"]
                                                                     if cut == "truncated" else 0)
    verb = "truncated in its" if cut == "truncated" else "its"
    assert problems == [f"{path.name}: damaged at byte {where} ({verb} {part}" +
                        (")" if cut == "truncated" else " does not match its checksum)") + ": read up to it"]
    steps = [r for r in recs if r["event"] == "step"]
    back = list(seg.records(got.rows, []))
    assert len(back) == kept and all(_same(a, b) for a, b in zip(steps, back))
    assert len(got.others) == len(s.others)  # the other records come first in the file: every one is there


# -- sample levels (schema 2) and the files of schema 1 -----------------------------------------------------------

V1 = Path(__file__).parent / "fixtures" / "segment-v1"


def _reading(root, monkeypatch, stride=None):
    """The report's JSON and the ranks' columns of a directory, read whole (``stride`` None) or sampled at ``stride``
    (the stride a long run's size would give: ``runlog.read.plan_stride``)."""
    from zeropilot.runlog import read as readmod
    from zeropilot.runlog.read import read_run
    from zeropilot.runlog.summary import summarize

    monkeypatch.setattr(readmod, "plan_stride", lambda rows: stride)
    records = read_run(root)
    report = json.loads(json.dumps(summarize(records), default=str).replace(str(root), "DIR"))
    cols = {r: {k: v.tobytes() for k, v in rec.steps.items()} for r, rec in records.ranks.items()}
    return report, cols


@pytest.mark.parametrize("job", ["ended", "hung"])
@pytest.mark.parametrize("stride", [None, 128, 256, 512])
def test_a_directory_of_schema_1_reads_as_its_records_written_again(tmp_path, monkeypatch, stride, job):
    """The fixture's files, of the first format, against the same records as JSON lines and compacted in today's
    format: the same report and the same columns, whole and sampled (``hung``: each rank's newest step from the
    tail, which schema 1's sample lacks)."""
    import shutil

    from zeropilot.runlog.compact import write_segment

    src = V1 / job
    heads = [seg.parse_head(p.read_bytes())[0] for p in sorted(src.glob("rank-*.col"))]
    assert [h["schema"] for h in heads] == ["zeropilot.segment/1"] * 2
    lines, now = tmp_path / "lines", tmp_path / "now"
    for root in (lines, now):
        shutil.copytree(src, root, ignore=shutil.ignore_patterns("*.col"))
    for path in sorted(src.glob("rank-*.col")):
        got = decode_segment(path, whole=True)
        rank = got.rank
        synth.write_json_lines(lines / f"rank-{rank}.jsonl", list(seg.records(got.rows, got.others)))
        write_segment(RunDir(now), got)
    assert [seg.parse_head(p.read_bytes())[0]["schema"] for p in sorted(now.glob("rank-*.col"))] == [seg.SCHEMA] * 2
    want = _reading(lines, monkeypatch, stride)
    for root in (src, now):
        got = _reading(root, monkeypatch, stride)
        assert got[0]["problems"] == []
        for key in want[0]:
            assert got[0][key] == want[0][key], (root, key)
        assert got[1] == want[1]
    assert want[0]["reading"]["sample_every"] == stride
    assert want[0]["verdict"]["kind"] == {"ended": "ok", "hung": "hang"}[job]
    assert want[0]["steps"] == {"ended": 1500, "hung": 749}[job]
    newest = [max(r["step"] for r in read_records(p) if r["event"] == "step") for p in sorted(src.glob("*.col"))]
    assert [r["steps"] for r in want[0]["ranks"]] == newest


def test_the_samples_come_in_levels_and_a_coarse_reading_decodes_only_its_own(tmp_path, monkeypatch):
    """20,000 steps: levels of 128 and 256 (512 would hold 39 steps, under ``MIN_LEVEL_ROWS``); read at 256 the
    segment decodes the 256 level alone, the tail not at all (the level holds the last row), to the columns and
    the report its JSON lines give."""
    from zeropilot.runlog import segread

    spec = synth.JobSpec(nodes=1, per_node=1, steps=20_000, save_every=7000)
    recs = list(synth.job_records(spec, 0))
    s = seg.from_records(0, 1, recs)
    root, lines = tmp_path / "col", tmp_path / "lines"
    for d in (root, lines):
        d.mkdir()
    (root / "rank-0.seg-000001.col").write_bytes(seg.encode(s))
    synth.write_json_lines(lines / "rank-0.jsonl", recs)
    head, _ = seg.parse_head((root / "rank-0.seg-000001.col").read_bytes())
    samples = [f for f in head["frames"] if f["kind"] == "sample"]
    assert [f["every"] for f in samples] == [128, 256]
    steps = s.rows.cols[("step",)]
    for f in samples:
        chosen = [steps[i] for i in seg.sample_rows(s.rows, s.others, f["every"])]
        assert f["rows"] == len(chosen)
        assert {k * f["every"] for k in range(1, 20_000 // f["every"] + 1)} <= set(chosen)
        assert {1, 2, 3, 4, 7000, 7001, 14000, 14001, 20_000} <= set(chosen)
    assert [segread.sample_frame(head, k)["every"] for k in (128, 256, 512, 4096)] == [128, 256, 256, 256]
    decoded = []
    real = seg.decode_group

    def spy(data, skip=frozenset()):
        got = real(data, skip)
        decoded.append(got[0].n)
        return got

    monkeypatch.setattr(seg, "decode_group", spy)
    got = _reading(root, monkeypatch, 256)
    assert decoded == [samples[1]["rows"]] and got[0]["reading"]["sample_every"] == 256
    want = _reading(lines, monkeypatch, 256)
    assert got[1] == want[1]
    assert {k: v for k, v in got[0].items() if k != "problems"} == {k: v for k, v in want[0].items()
                                                                    if k != "problems"}


def test_a_head_of_a_schema_it_does_not_know_says_so():
    s = seg.from_records(0, 1, list(synth.job_records(synth.JobSpec(nodes=1, per_node=1, steps=50), 0)))
    head, body = seg.parse_head(seg.encode(s))
    head["schema"] = "zeropilot.segment/9"
    text = zlib.compress(json.dumps(head).encode("utf-8"))
    data = seg.MAGIC + len(text).to_bytes(4, "little") + zlib.crc32(text).to_bytes(4, "little") + text
    with pytest.raises(seg.Damaged, match=r"schema 'zeropilot.segment/9', not one this zeropilot reads"):
        seg.parse_head(data)
