"""``zeropilot rules`` lists the rules; ``zeropilot explain CODE`` prints one rule's docs."""

from __future__ import annotations

import argparse
import sys

from zeropilot.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rules", help="list the rules of check")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: the versioned zeropilot.rules/1 document (docs/json-schema.md)")
    p.add_argument("--select", metavar="RULES", help="only these rules: codes, names or prefixes (DS, HF)")
    p.set_defaults(func=run)
    e = subparsers.add_parser("explain", help="print one rule's documentation")
    e.add_argument("code", metavar="CODE", help="a rule code (DS001) or name")
    e.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: the versioned zeropilot.explain/1 document (docs/json-schema.md)")
    e.set_defaults(func=run_explain)


def run(args: argparse.Namespace) -> int:
    from zeropilot.rules import all_rules
    from zeropilot.rules.registry import select_rules

    selected = [c.strip() for c in (args.select or "").split(",") if c.strip()]
    rules = select_rules(all_rules(), selected)
    if args.format == "json":
        from zeropilot.envelope import RULES_SCHEMA, dumps, envelope

        sys.stdout.write(dumps(envelope(RULES_SCHEMA, {"rules": [rule_entry(r) for r in rules]})))
        return 0
    for r in rules:
        fix = " (fix)" if r.fixable else ""
        print(f"{r.code:<7} {r.severity.value:<8} {r.name}{fix}")
    return 0


def rule_entry(r) -> dict:
    """One rule as ``rules --format json`` lists it."""
    return {"code": r.code, "name": r.name, "severity": r.severity.value, "summary": r.summary,
            "versions": r.versions, "packages": list(r.packages), "fixable": r.fixable, "status": r.status,
            "witness": r.witness}


def run_explain(args: argparse.Namespace) -> int:
    from zeropilot.rules import get_rule
    from zeropilot.rules.docs import render_rule

    r = get_rule(args.code)
    if r is None:
        raise InputError(f"no rule {args.code!r}: `zeropilot rules` lists them")
    if getattr(args, "format", "text") == "json":
        from zeropilot.envelope import EXPLAIN_SCHEMA, dumps, envelope

        sys.stdout.write(dumps(envelope(EXPLAIN_SCHEMA, {"rule": rule_entry(r), "markdown": render_rule(r)})))
        return 0
    sys.stdout.write(render_rule(r))
    return 0
