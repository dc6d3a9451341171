"""The compacted segment format (``runlog.segments``): every record back as written, the bytes it costs, damage.

Records come from the real writer's lines (``runlog.events.line``) and from the synthetic job's guard-like records
(``tests/report/synth.py``); a segment's file is decoded by the reader's own functions (``runlog.segread``)."""

from __future__ import annotations

import json
import random

import pytest

from tests.report import synth
from zeropilot.runlog import segments as seg
from zeropilot.runlog.events import line
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
