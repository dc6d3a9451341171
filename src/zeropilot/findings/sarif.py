"""SARIF 2.1.0 output for code-scanning tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from zeropilot import __version__
from zeropilot.findings import CheckResult

_LEVELS = {"error": "error", "warning": "warning", "info": "note"}
SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def relative_uri(file: str) -> str:
    """A finding's file relative to the current directory (the repository root in CI), ``/``-separated."""
    path = Path(file)
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()


def render(result: CheckResult) -> str:
    from zeropilot.rules import get_rule

    rules: List[dict] = []
    index: Dict[str, int] = {}
    results = []
    for f in result.findings:
        if f.code not in index:
            index[f.code] = len(rules)
            r = get_rule(f.code)
            rules.append({
                "id": f.code, "name": f.name,
                "shortDescription": {"text": r.summary if r else f.name},
                "fullDescription": {"text": r.summary if r else f.name},
                "help": {"text": r.doc if r else "", "markdown": r.doc if r else ""},
                "defaultConfiguration": {"level": _LEVELS[(r.severity if r else f.severity).value]},
                # no helpUri: SARIF requires an absolute URI there ("format": "uri"), which upload-sarif checks;
                # `help` above holds the rule's whole page
            })
        res = {"ruleId": f.code, "ruleIndex": index[f.code], "level": _LEVELS[f.severity.value],
               "message": {"text": f.message}, "properties": {"key": f.key, "versions": f.versions}}
        if f.file:
            region = {"startLine": f.line} if f.line else {}
            if f.line and f.col:
                region["startColumn"] = f.col
            loc = {"physicalLocation": {"artifactLocation": {"uri": relative_uri(f.file)}}}
            if region:
                loc["physicalLocation"]["region"] = region
            res["locations"] = [loc]
        results.append(res)
    notifications = [{"level": "error", "message": {"text": e.render()}} for e in result.read_errors]
    notifications += [{"level": "warning", "message": {"text": notice}} for notice in result.notices]
    run = {
        "tool": {"driver": {"name": "zeropilot", "version": __version__, "semanticVersion": __version__,
                            "rules": rules}},
        "results": results,
        "invocations": [{"executionSuccessful": not result.read_errors,
                         "toolExecutionNotifications": notifications}],
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"
