"""The HTML report in a real headless Chromium: it loads with no console error and no request but
its own file, draws one series per rank, and shows the OOM and hang sections when the run had one.

Chromium is Debian's (ci/test.sh installs it); without it the test skips locally and fails in CI.
Screenshots go to the test's temp folder (docs/report-*.png are made by bench/report/screenshot.py).
"""

from __future__ import annotations

import os

import pytest

from tests.report import browser
from tests.report.test_hostile import _hostile_dir
from zeropilot.cli import main

FACTS = """JSON.stringify({
  sections: [...document.querySelectorAll('section[id]')].map(s => s.id),
  scripts: document.scripts.length,
  overview: [...document.querySelectorAll('#overview polyline.series')].map(p => p.dataset.rank),
  steps: [...document.querySelectorAll('#steptime polyline.series')].map(p => p.dataset.rank),
  memCharts: [...document.querySelectorAll('svg[id^="mem-rank-"]')].map(s => [s.id,
      [...s.querySelectorAll('polyline.series')].map(p => p.dataset.field)]),
  spans: document.querySelectorAll('svg[id^="mem-rank-"] rect.op').length,
  overviewSpans: document.querySelectorAll('#overview rect.op').length,
  ooms: [...document.querySelectorAll('#oom .oom')].map(d => d.dataset.rank),
  stacks: [...document.querySelectorAll('#hang details.stack')].map(d => [d.dataset.rank, d.open]),
  overviewHeight: (document.querySelector('#overview') || {getBoundingClientRect: () => ({height: 0})})
      .getBoundingClientRect().height,
  compare: [...document.querySelectorAll('[id^="overview-"]')].map(s => s.id),
  text: document.body.innerText.length,
})"""


@pytest.fixture(scope="module")
def chromium_browser():
    if browser.chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: ci/test.sh installs it with apt-get")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with browser.Browser(timeout=90) as b:
        yield b


def _page(tmp_path, *argv):
    out = tmp_path / f"{len(list(tmp_path.iterdir()))}.html"
    assert main(["report", *map(str, argv), "--format", "html", "--out", str(out)]) == 0
    return out


def _open(b, page):
    import json

    seen = b.visit(page, FACTS)
    assert seen.console_errors == []
    assert set(seen.requests) <= {page.resolve().as_uri()}  # nothing but the page itself
    assert seen.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(seen.screenshot) > 10_000
    (page.with_suffix(".png")).write_bytes(seen.screenshot)
    facts = json.loads(seen.facts)
    assert facts["scripts"] == 0 and facts["text"] > 500
    return facts


def test_oom_page_in_chromium(chromium_browser, synth_dirs, tmp_path):
    f = _open(chromium_browser, _page(tmp_path, synth_dirs["oom"]))
    assert f["overview"] == ["0", "1"] and f["steps"] == ["0", "1"] and f["overviewHeight"] > 100
    assert [c[0] for c in f["memCharts"]] == ["mem-rank-0", "mem-rank-1"]
    assert f["memCharts"][0][1] == ["allocated_bytes", "reserved_bytes", "peak_reserved_bytes", "outside_torch_bytes",
                                   "device_used_bytes", "host_rss_bytes"]
    assert f["spans"] == 3  # saves at 20 and 40 on rank 0, at 20 on rank 1 (which then ran out of memory)
    assert f["overviewSpans"] == 2  # each save once across the ranks
    assert f["ooms"] == ["1"] and "oom" in f["sections"] and "hang" not in f["sections"]


def test_hang_page_in_chromium(chromium_browser, synth_dirs, tmp_path):
    f = _open(chromium_browser, _page(tmp_path, synth_dirs["hang"]))
    assert f["overview"] == ["0", "1", "2"] and "hang" in f["sections"] and "oom" not in f["sections"]
    assert f["stacks"] == [["0", False], ["1", False], ["2", True]]  # the stuck rank's stacks open


def test_healthy_compare_and_hostile_pages_in_chromium(chromium_browser, synth_dirs, tmp_path):
    f = _open(chromium_browser, _page(tmp_path, synth_dirs["ok"]))
    assert "oom" not in f["sections"] and "hang" not in f["sections"] and f["overview"] == ["0", "1"]
    f = _open(chromium_browser, _page(tmp_path, synth_dirs["ok"], "--compare", synth_dirs["oom"]))
    assert f["compare"] == ["overview-a", "overview-b"] and f["overview"] == []
    f = _open(chromium_browser, _page(tmp_path, _hostile_dir(tmp_path)))  # markup from the directory stays text
    assert "oom" in f["sections"] and "hang" in f["sections"]
