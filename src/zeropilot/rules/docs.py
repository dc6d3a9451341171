"""Generate ``docs/rules/`` from the registry: ``python -m zeropilot.rules.docs [OUT_DIR]``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

from zeropilot.rules.registry import REQUIRED_SECTIONS, Rule


def missing_sections(r: Rule) -> List[str]:
    sections = r.sections()
    need = list(REQUIRED_SECTIONS) + (["Fix safety"] if r.fixable else [])
    missing = [s for s in need if not sections.get(s)]
    if not sections.get(""):
        missing.insert(0, "summary")
    return missing


def render_rule(r: Rule) -> str:
    sections = r.sections()
    out = [f"# {r.code} {r.name}", "",
           f"Severity: **{r.severity.value}** · Status: {r.status} · Fix: {'yes' if r.fixable else 'no'}", "",
           f"Applies to: {r.versions}", "",
           f"Version gates (enforced by the engine): {', '.join(str(g) for g in r.gates) or 'none'}", "",
           f"Witness: {r.witness or 'none'}", "",
           "## What it does", "", sections.get("", ""), ""]
    for heading, body in sections.items():
        if heading:
            out.extend([f"## {heading}", "", body, ""])
    return "\n".join(out).rstrip() + "\n"


def render_index(rules: List[Rule]) -> str:
    out = ["# Rules of `zeropilot check`", "",
           "Generated from the registry by `python -m zeropilot.rules.docs`; do not edit by hand.", "",
           "| code | name | severity | applies to | fix |", "|---|---|---|---|---|"]
    for r in rules:
        out.append(f"| [{r.code}]({r.code}.md) | {r.name} | {r.severity.value} | {r.versions} | "
                   f"{'yes' if r.fixable else ''} |")
    return "\n".join(out) + "\n"


def render_table(rules: List[Rule]) -> str:
    """The compact rule table for the project README (code, name, severity, what it finds)."""
    out = ["| code | name | severity | what it finds |", "|---|---|---|---|"]
    for r in rules:
        summary = r.summary.replace("|", "\\|")
        out.append(f"| [{r.code}](docs/rules/{r.code}.md) | `{r.name}` | {r.severity.value} | {summary} |")
    return "\n".join(out) + "\n"


def generate() -> Dict[str, str]:
    """file name -> content of every page of docs/rules/."""
    from zeropilot.rules import all_rules

    rules = all_rules()
    pages = {f"{r.code}.md": render_rule(r) for r in rules}
    pages["README.md"] = render_index(rules)
    pages["index.md"] = render_table(rules)
    return pages


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(__file__).resolve().parents[3] / "docs" / "rules"
    out.mkdir(parents=True, exist_ok=True)
    pages = generate()
    for old in out.glob("*.md"):
        if old.name not in pages:
            old.unlink()
    for name, text in pages.items():
        (out / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(pages)} pages to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
