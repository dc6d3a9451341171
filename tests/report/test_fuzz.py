"""Any JSON in any field of a run directory: the report keeps its schema and every renderer finishes.

20 examples in CI, the same ones every run; a longer, fresh search:
``HYPOTHESIS_PROFILE=explore ZP_FUZZ_EXAMPLES=2000 pytest tests/report/test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeropilot.runlog import read_run, summarize
from zeropilot.runlog import text as text_render
from zeropilot.runlog.report_html import render
from zeropilot.runlog.summary import compare

FIELDS = ("v", "event", "t", "rank", "step", "seconds", "mem", "mem_before", "mem_peak", "mem_after", "phases", "bytes",
          "tag", "type", "message", "where", "peer_failure", "device", "allocator_settings", "allocator_limit_bytes",
          "verdict", "fixes", "ranks", "request_bytes", "phase", "environment", "plan", "exit_code", "ended_at")
EVENTS = st.sampled_from(["start", "init", "step", "save", "load", "oom", "error", "end", "other"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20))
#: keys of the nested records (memory, phases, fixes, verdicts) the summary reads, so that partial ones are tried
NESTED = ("reserved_bytes", "allocated_bytes", "unallocated_reserved_bytes", "device_total_bytes", "device_free_bytes",
          "device_used_bytes", "outside_torch_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "host_rss_bytes",
          "expected_bytes", "name", "fix", "why", "kind", "summary", "evidence", "reason", "cause", "alive", "pid",
          "zero_stage", "error", "age_s", "path")
VALUES = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.sampled_from(FIELDS + NESTED), kids,
                                                                      max_size=4)), max_leaves=12)
RECORD = st.fixed_dictionaries({"event": EVENTS}, optional={f: VALUES for f in FIELDS if f != "event"})


@settings(max_examples=int(os.environ.get("ZP_FUZZ_EXAMPLES", "20")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranks=st.lists(st.lists(RECORD, max_size=6), min_size=1, max_size=3), run=st.dictionaries(
    st.sampled_from(FIELDS), VALUES, max_size=6), oom=st.one_of(st.none(), RECORD), hang=st.one_of(st.none(), RECORD))
def test_any_json_gives_a_valid_report(validate, ranks, run, oom, hang):
    root = Path(tempfile.mkdtemp(prefix="zp-fuzz-"))
    try:
        for i, records in enumerate(ranks):
            (root / f"rank-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (root / "run.json").write_text(json.dumps(run))
        if oom is not None:
            (root / "oom-rank-0.json").write_text(json.dumps(oom))
        if hang is not None:
            (root / "hang.json").write_text(json.dumps(hang))
        records = read_run(root)
        rep = summarize(records)
        assert validate(rep) == []
        json.dumps(rep, allow_nan=False)
        assert text_render.render(rep).startswith("verdict: ")
        assert "<script" not in render(records, rep)
        assert validate(compare(rep, rep)) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
