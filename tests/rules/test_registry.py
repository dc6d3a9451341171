"""The registry's promises: docs complete and in sync, every rule has a witness that exists."""

import re
from pathlib import Path

import pytest

from zeropilot.rules import all_rules
from zeropilot.rules.docs import generate, missing_sections

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("r", all_rules(), ids=lambda r: r.code)
def test_rule_docs_complete(r):
    assert missing_sections(r) == []
    assert re.fullmatch(r"[A-Z]{2,3}\d{3}", r.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", r.name)


@pytest.mark.parametrize("r", all_rules(), ids=lambda r: r.code)
def test_rule_has_witness(r):
    """A witness is a test on the real library, or a fixture test citing its source for version gates."""
    assert r.witness, f"{r.code} names no witness"
    witness = r.witness
    if witness.startswith("fixture:"):
        witness, _, source = witness[len("fixture:"):].partition(";")
        assert source.strip(), f"{r.code}: a fixture-only witness must cite its upstream source"
    path, _, func = witness.strip().partition("::")
    text = (ROOT / path).read_text()
    assert f"def {func}(" in text, f"{r.code}: witness {r.witness} not found"


def test_docs_in_sync():
    pages = generate()
    docs = ROOT / "docs" / "rules"
    on_disk = {p.name: p.read_text() for p in docs.glob("*.md")}
    stale = sorted(n for n in pages if on_disk.get(n) != pages[n]) + sorted(set(on_disk) - set(pages))
    assert not stale, f"docs/rules out of date ({stale[:5]}): run `python -m zeropilot.rules.docs`"


def test_codes_unique_names_unique():
    rules = all_rules()
    assert len({r.name for r in rules}) == len(rules)


def test_readme_rule_summary_in_sync():
    """The README carries the registry's one-line summary and links the generated table; the table itself lives only
    in docs/rules/index.md (kept in sync by test_docs_in_sync)."""
    from zeropilot.rules.docs import readme_with_summary, render_summary

    readme = (ROOT / "README.md").read_text()
    assert readme == readme_with_summary(readme, render_summary(all_rules())), \
        "README rule summary out of date: run `python -m zeropilot.rules.docs`"
    assert "(docs/rules/index.md)" in readme
    assert "| code | name |" not in readme, "the rule table lives in docs/rules/index.md only"
