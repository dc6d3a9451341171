"""``report`` and ``top`` at 1,024 ranks (128 nodes x 8): one screen (at most 60 lines) whatever the rank count, the
distribution over the ranks and nodes, the outliers by name (the data straggler, the slow GPU, the rank with the most
memory, the hung rank); every rank in the JSON and the HTML page (issue 41). Jobs from ``tests/report/synth.py``,
through the guard's writer."""

from __future__ import annotations

import json
import re

import pytest

from tests.report import synth
from zeropilot.cli import main

SCREEN = 60
ENDED = synth.JobSpec(nodes=128, per_node=8, steps=100, straggler=517, heavy=1000, slow_gpu=300)
HUNG = synth.JobSpec(nodes=128, per_node=8, steps=24, hang_rank=700)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    base = tmp_path_factory.mktemp("many")
    return {"ended": synth.write_job(base / "ended", ENDED, jobs=2),
            "hung": synth.write_job(base / "hung", HUNG, jobs=2)}


def _out(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr().out


def test_the_report_of_1024_ranks_is_one_screen_naming_the_outliers(jobs, capsys):
    code, out = _out(capsys, ["report", str(jobs["ended"])])
    lines = out.splitlines()
    assert code == 0 and len(lines) <= SCREEN, "\n".join(lines)
    assert "ranks: 1024 on 128 nodes" in out
    assert re.search(r"straggler: rank 517 \(node 64, gpu-node-064, GPU 5\).*DataLoader", out)
    assert re.search(r"straggler: rank 300 \(node 37, gpu-node-037, GPU 4\) has a slow GPU", out)
    assert re.search(r"most memory: rank 1000 \(node 125, gpu-node-125\)", out)
    assert re.search(r"GPU probe \(median\) .* rank 300 ", out) and re.search(r"loading data \(median\) .* rank 517 ",
                                                                             out)
    assert re.search(r"^  peak reserved .* node 125$", out, re.M)  # over the nodes: the node at the max


def test_a_hang_at_1024_ranks_names_the_hung_rank_in_one_screen(jobs, capsys):
    code, out = _out(capsys, ["report", str(jobs["hung"])])
    lines = out.splitlines()
    assert code == 0 and len(lines) <= SCREEN, "\n".join(lines)
    assert "HANG" in lines[0] and "rank 700" in lines[0]
    assert re.search(r"^  hung: rank 700 \(node 87, gpu-node-087\)", out, re.M)
    assert re.search(r"^  rank 700: phase forward .*<- stuck$", out, re.M)
    assert re.search(r"^  1023 ranks \(0\.\.1023\): phase collective at step 11, in all_reduce", out, re.M)


@pytest.mark.parametrize("job", ["ended", "hung"])
def test_top_at_1024_ranks_is_one_screen_naming_the_outliers(jobs, capsys, job):
    code, out = _out(capsys, ["top", str(jobs[job]), "--once"])
    lines = out.splitlines()
    assert len(lines) <= SCREEN, "\n".join(lines)
    assert "1024 ranks on 128 nodes" in out
    if job == "ended":
        assert re.search(r"straggler: rank 517 .*DataLoader", out) and re.search(r"straggler: rank 300 .*slow GPU",
                                                                                  out)
        assert "most memory: rank 1000 (node 125, gpu-node-125)" in out
        assert re.search(r"^  GPU probe .* rank 300 ", out, re.M)
    else:
        assert re.search(r"^  HANG: rank 700 \(node 87, gpu-node-087\)", out, re.M) or "HANG (rank 700)" in out


def test_every_rank_stays_in_the_json_and_the_html(jobs, capsys, tmp_path, validate):
    code, out = _out(capsys, ["report", str(jobs["ended"]), "--format", "json"])
    doc = json.loads(out)
    assert validate(doc) == []
    assert [r["rank"] for r in doc["ranks"]] == list(range(1024))
    sp = doc["spread"]
    assert sp["ranks"] == 1024 and sp["nodes"] == 128
    kinds = {(o["kind"], o["evidence"], o["rank"]) for o in sp["outliers"]}
    assert {("straggler", "data", 517), ("straggler", "gpu", 300), ("memory", None, 1000)} <= kinds
    page = tmp_path / "r.html"
    assert main(["report", str(jobs["ended"]), "--format", "html", "--out", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert "of 1024 ranks" in html and 'data-rank="517"' in html and 'data-rank="1000"' in html
