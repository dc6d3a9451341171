"""The rules of ``zeropilot check``: one module per topic, each rule one function (see ``registry``).

Topic modules are imported on first use so that ``zeropilot --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Dict, List, Optional

from zeropilot.rules.registry import (REDIRECTS, Applicability, Edit, Finding, Fix, Hit, Rule, Severity,
                                      registered, rule, run_rules)

TOPICS = (
    "deepspeed_config",
    "ds_values",
    "batch",
    "hf_integration",
    "accelerate_config",
    "checkpointing",
    "timeouts",
    "allocator",
    "launch_script",
    "python_scripts",
    "engine_scripts",
    "versions",
    "machine",
    "oracle",
    "memory",
    "tuning",
    "multinode",
)

__all__ = ["Applicability", "Edit", "Finding", "Fix", "Hit", "Rule", "Severity", "all_rules", "get_rule", "rule",
           "run_rules", "TOPICS"]

_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        for topic in TOPICS:
            importlib.import_module(f"zeropilot.rules.{topic}")
        _loaded = True


def all_rules() -> List[Rule]:
    """Every registered rule, ordered by code."""
    _load()
    return [registered()[c] for c in sorted(registered())]


def get_rule(code: str) -> Optional[Rule]:
    """The rule for a code or its name, following redirects of renamed codes."""
    _load()
    rules: Dict[str, Rule] = registered()
    code = REDIRECTS.get(code.upper(), code.upper())
    if code in rules:
        return rules[code]
    for r in rules.values():
        if r.name == code.lower():
            return r
    return None
