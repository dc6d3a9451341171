"""``report --compare``: the two runs labelled in the order given, the rows in the words of the report's own table
(text and HTML), and the example docs/report.md quotes, re-run on the committed run directories."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zeropilot.cli import main
from zeropilot.runlog import text as text_render
from zeropilot.runlog.summary import compare

ROOT = Path(__file__).resolve().parents[2]


def _report(capsys, *argv):
    assert main(["report", *map(str, argv)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["text", "json", "html"])
def test_the_runs_are_a_and_b_in_the_order_given(capsys, synth_dirs, fmt):
    ok, oom = synth_dirs["ok"], synth_dirs["oom"]
    after = _report(capsys, ok, "--compare", oom, "--format", fmt)
    assert _report(capsys, "--compare", ok, oom, "--format", fmt) == after
    swapped = _report(capsys, "--compare", oom, ok, "--format", fmt)
    assert swapped == _report(capsys, oom, "--compare", ok, "--format", fmt) != after
    if fmt == "json":
        assert [json.loads(after)[k]["run_dir"] for k in "ab"] == [str(ok), str(oom)]
        assert [json.loads(swapped)[k]["run_dir"] for k in "ab"] == [str(oom), str(ok)]
    elif fmt == "text":
        assert after.splitlines()[:2] == [f"A: {ok}: OK", f"B: {oom}: OOM"]
        assert swapped.splitlines()[:2] == [f"A: {oom}: OOM", f"B: {ok}: OK"]
    else:
        assert after.index(f"A: <code>{ok}</code>") < after.index(f"B: <code>{oom}</code>")


def test_every_row_is_in_words(capsys, synth_dirs):
    """No JSON field name in the text or the page; where a row is a column of the report's rank table, the same
    words (one word for one thing)."""
    metrics = [m["metric"] for m in json.loads(_report(capsys, synth_dirs["ok"], "--compare", synth_dirs["oom"],
                                                       "--format", "json"))["metrics"]]
    assert set(metrics) <= set(text_render.METRIC_LABELS)
    columns = {header for header, _, _ in text_render._RANK_COLUMNS}
    assert {"peak reserved", "peak allocated", "outside torch", "host RSS"} <= \
        columns & set(text_render.METRIC_LABELS.values())
    for fmt in ("text", "html"):
        out = _report(capsys, synth_dirs["ok"], "--compare", synth_dirs["oom"], "--format", fmt)
        raw = [m for m in metrics if text_render.METRIC_LABELS[m] != m and re.search(rf"\b{m}\b", out)]
        assert raw == [], (fmt, raw)
        assert "peak reserved" in out and "rank 1 peak reserved" in out and "save time median" in out


def test_the_docs_example_is_what_the_command_prints(capsys, monkeypatch):
    doc = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ zeropilot report (\S+) --compare (\S+)\n(.*?)```", doc, re.S)
    assert block, "docs/report.md quotes a --compare example"
    a, b, quoted = block.groups()
    assert (ROOT / a).is_dir() and (ROOT / b).is_dir()
    monkeypatch.chdir(ROOT)  # the run directories are printed as given: relative, as the docs write them
    assert _report(capsys, a, "--compare", b) == quoted


def test_compare_is_pure_over_two_summaries(synth_dirs):
    from zeropilot.runlog import read_run, summarize

    a, b = (summarize(read_run(synth_dirs[k])) for k in ("ok", "oom"))
    assert compare(a, b)["a"] is a and compare(b, a)["a"] is b
