"""The OOM classifier (a pure function) on real OOM records taken on an H200 (see fixtures/oom/README.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zeropilot.guard.verdicts import KINDS, classify_oom, expandable_segments_support

FIXTURES = Path(__file__).parent / "fixtures" / "oom"
CASES = {"capacity": "capacity", "fragmentation": "fragmentation", "save-spike": "save_spike",
         "outside-torch": "outside_torch"}


def _record(name):
    rec = json.loads((FIXTURES / f"{name}.json").read_text())
    for key in ("verdict", "fixes"):  # what the guard concluded on the GPU is not an input
        rec.pop(key)
    return rec


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_real_oom_is_told_apart(name):
    verdict, fixes = classify_oom(_record(name))
    assert verdict["kind"] == CASES[name]
    assert verdict["evidence"] and fixes
    assert len({f["fix"] for f in fixes}) == len(fixes)


def test_the_four_records_give_the_four_classes():
    assert sorted(classify_oom(_record(n))[0]["kind"] for n in CASES) == sorted(KINDS)


def test_guard_on_the_gpu_wrote_the_same_verdict():
    for name, kind in CASES.items():
        assert json.loads((FIXTURES / f"{name}.json").read_text())["verdict"]["kind"] == kind


def test_fragmentation_fix_first_is_expandable_segments_with_the_stranded_bytes():
    rec = _record("fragmentation")
    verdict, fixes = classify_oom(rec)
    assert fixes[0]["fix"].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert fixes[0]["expected_bytes"] == rec["mem"]["unallocated_reserved_bytes"]


@pytest.mark.parametrize("hip, dtk, offered", [("6.2.41133", False, False), ("7.0.2", False, True),
                                                ("6.2", True, None)])
def test_expandable_segments_only_where_the_build_honours_it(hip, dtk, offered):
    rec = _record("fragmentation")
    rec["build"] = {"torch": "2.5.0", "hip": hip, "cuda": None, "dtk": dtk}
    _, fixes = classify_oom(rec)
    es = [f for f in fixes if "expandable_segments:True" in f["fix"]]
    assert expandable_segments_support(rec["build"])[0] is offered
    if offered is False:
        assert not es
    elif offered is None:
        assert es and es[0]["fix"].startswith("try ")
    else:
        assert es[0]["fix"].startswith("PYTORCH_CUDA_ALLOC_CONF")


def test_without_the_models_setup_the_fixes_are_the_records_own_and_marked_unranked():
    rec = _record("capacity")  # taken before the guard recorded the setup: the plan cannot size this run
    plan = {"gpu_peak_bytes": 20 << 30}
    verdict, fixes = classify_oom(rec, plan)
    assert any("not ranked" in e for e in verdict["evidence"])
    assert any("20.00 GiB per GPU at peak" in e for e in verdict["evidence"])
    assert fixes and all(f["ranked"] is False and f["fits"] is None for f in fixes)


def test_same_record_inside_a_save_is_a_save_spike():
    rec = copy.deepcopy(_record("capacity"))
    rec["phase"] = "save:optimizer_states"
    assert classify_oom(rec)[0]["kind"] == "save_spike"


def test_missing_fields_do_not_break_the_classifier():
    verdict, fixes = classify_oom({"request_bytes": 1 << 20, "mem": {}})
    assert verdict["kind"] == "capacity" and fixes


X2 = FIXTURES / "x2"
X2_CASES = {"capacity": ("capacity", [0, 1]), "fragmentation": ("fragmentation", [0, 1]),
            "save-spike": ("save_spike", [0, 1]), "outside-torch": ("outside_torch", [0])}


@pytest.mark.parametrize("name", sorted(X2_CASES))
def test_each_real_oom_over_nccl_is_told_apart_on_every_rank(name):
    kind, ranks = X2_CASES[name]
    files = sorted((X2 / name).glob("oom-rank-*.json"))
    assert [int(f.stem.rsplit("-", 1)[1]) for f in files] == ranks
    for f in files:
        rec = json.loads(f.read_text())
        assert rec["verdict"]["kind"] == kind  # what the guard said on the GPU
        for key in ("verdict", "fixes"):
            rec.pop(key)
        assert classify_oom(rec)[0]["kind"] == kind  # and the classifier again, here


@pytest.mark.parametrize("name", sorted(X2_CASES))
def test_report_on_the_two_rank_run_names_the_class_and_the_ranks(name):
    from zeropilot.runlog import read_run, summarize

    kind, ranks = X2_CASES[name]
    verdict = summarize(read_run(X2 / name))["verdict"]
    assert (verdict["kind"], verdict["class"], verdict["ranks"]) == ("oom", kind, ranks)
    assert verdict["first_rank"] in ranks


def test_under_the_allocators_own_cap_grown_outside_memory_is_not_the_cause():
    """The H200 heal run (bench/heal/gpu_oom.sh, 2026-12-03): a cap from ``set_per_process_memory_fraction``,
    memory outside PyTorch grown by 0.53 GiB since start (NCCL, cuBLAS), a 3.48 GiB request on 21.43 GiB
    allocated against a 24.76 GiB cap: the working set exceeds the cap whatever lies outside PyTorch."""
    rec = _record("capacity-under-cap-outside-grew")
    grown = rec["mem"]["outside_torch_bytes"] - rec["baseline"]["outside_torch_bytes"]
    assert grown > 256 << 20
    assert classify_oom(rec)[0]["kind"] == "capacity"
    uncapped = copy.deepcopy(rec)  # the same record on a card with no cap: the outside growth is what changed
    uncapped["allocator_limit_bytes"] = None
    assert classify_oom(uncapped)[0]["kind"] == "outside_torch"
