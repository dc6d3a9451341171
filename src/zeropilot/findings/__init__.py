"""How ``check`` prints its findings (``text`` for people, ``jsondoc`` for machines, ``sarif`` for code
scanning, ``github`` for GitHub Actions annotations) and reads inline suppressions (``suppress``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.model import WorldSize
from zeropilot.launch.versions import Versions
from zeropilot.rules.registry import Finding, Severity


@dataclass
class CheckResult:
    """What one check produced: findings, files that could not be read, and what it assumed.

    ``notices`` are warnings about the run itself (no launch file found, a suppression naming no rule);
    ``suppressed`` counts findings silenced inline or by ``per-file-ignores``; ``skipped`` lists files discovery
    did not read, with why (a tokenizer, a model config, a dataset).
    """

    findings: List[Finding]
    versions: Versions
    world_size: WorldSize
    read_errors: List[InputError] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    fixed: int = 0
    notices: List[str] = field(default_factory=list)
    suppressed: int = 0
    skipped: List[Tuple[str, str]] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def summary(self) -> dict:
        return {"errors": self.count(Severity.ERROR), "warnings": self.count(Severity.WARNING),
                "info": self.count(Severity.INFO), "files": len(self.files), "unreadable": len(self.read_errors),
                "fixed": self.fixed, "suppressed": self.suppressed, "skipped": len(self.skipped)}

    def exit_code(self, fail_on: Optional[Severity]) -> int:
        if self.read_errors:
            return 2
        if fail_on is None:
            return 0
        return 1 if any(f.severity.rank >= fail_on.rank for f in self.findings) else 0
