"""Every unmodified public config of tests/data/corpus is read, and check runs on it without a crash.

The errors the rules raise there are reviewed: `tests/data/corpus_errors.json` lists each (file, code) with
the reason it is right, and this test fails when a rule starts or stops raising an error there.
"""

import json
from pathlib import Path

import pytest

from tests.conftest import CORPUS, corpus_files
from zeropilot.check import check
from zeropilot.rules.registry import Severity

REVIEW = Path(__file__).parent / "data" / "corpus_errors.json"
FILES = corpus_files()
# Two templates with shell placeholders in place of values: not JSON, and saying so is right.
NOT_JSON = {"compression__bert__config__ds_config_TEMPLATE.json", "training__tensor_parallel__hf_integration__"
            "configs__ds_config_temp.json"}


def _check_each():
    out = {}
    for path in FILES:
        result, _ = check([path], versions="deepspeed=0.19.8,transformers=5.24.0,accelerate=1.15.0,"
                                           "torch=2.13.0,peft=0.21.2", use_installed=False)
        out[path] = result
    return out


@pytest.fixture(scope="module")
def results():
    return _check_each()


def test_corpus_has_all_files():
    assert len(FILES) == 102


def test_every_file_read_or_rightly_refused(results):
    for path, result in results.items():
        if path.name in NOT_JSON:
            assert len(result.read_errors) == 1 and "not valid JSON" in result.read_errors[0].render()
        else:
            assert result.read_errors == [], (path, [e.render() for e in result.read_errors])


def test_errors_raised_on_corpus_are_the_reviewed_ones(results):
    found = sorted({(str(p.relative_to(CORPUS)), f.code) for p, r in results.items() for f in r.findings
                    if f.severity == Severity.ERROR})
    reviewed = json.loads(REVIEW.read_text()) if REVIEW.exists() else []
    assert found == sorted((e["file"], e["code"]) for e in reviewed), \
        "errors on the corpus changed: review them and update tests/data/corpus_errors.json"
    assert all(e.get("why") for e in reviewed)


def test_llamafactory_yaml_quiet_under_its_own_pins():
    """LLaMA-Factory at the corpus commit pins transformers <= 5.8.0, where warmup_ratio still exists."""
    lf = [p for p in FILES if p.parent.name == "hiyouga__LlamaFactory" and p.suffix == ".yaml"]
    assert lf
    for path in lf:
        result, _ = check([path], versions="transformers=5.8.0,accelerate=1.11.0,deepspeed=0.19.8",
                          use_installed=False)
        assert [f.code for f in result.findings if f.severity == Severity.ERROR] == [], path
