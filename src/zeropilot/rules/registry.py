"""The rule registry: one record per rule, its docs taken from the check function's docstring.

How to add a rule (one function in the topic module under ``zeropilot/rules/``)::

    from zeropilot.rules.registry import Hit, rule, Severity

    @rule("DS001", "unknown-key-in-strict-section", Severity.ERROR, packages=("deepspeed",),
          versions="deepspeed >= 0.7.0", witness="tests/rules/test_deepspeed_config.py::test_ds001_witness")
    def unknown_key_in_strict_section(launch):
        \"\"\"A key DeepSpeed does not know, in a section it validates strictly.

        ## Why is this bad?
        DeepSpeed raises a pydantic ValidationError at ``deepspeed.initialize``, after the model loaded.

        ## Example
        ```json
        {"zero_optimization": {"stage": 3, "stage3_offload_optimizer": true}}
        ```

        ## Use instead
        ```json
        {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
        ```

        ## References
        - `deepspeed/runtime/config_utils.py` (DeepSpeedConfigModel, extra="forbid")
        \"\"\"
        for doc in launch.ds_configs:
            ...
            yield Hit(doc, node, "message: what is wrong — why it matters — what to do", fix=None)

Docstring sections: the first paragraph says what the rule finds; ``## Why is this bad?``, ``## Example``,
``## Use instead`` and ``## References`` are required; ``## Fix safety`` is required for rules with fixes.
``docs/rules/`` is generated from these (``python -m zeropilot.rules.docs``) and a test keeps it in sync.

A check function takes the :class:`~zeropilot.launch.Launch` and yields :class:`Hit` objects; the
registry turns them into :class:`Finding` records with the rule's code, severity and the versions assumed.
Checks must not raise on odd input: a value of the wrong type is something to skip (or to report).
"""

from __future__ import annotations

import enum
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from zeropilot.launch.document import Document, Node


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 3, "warning": 2, "info": 1}[self.value]


class Applicability(str, enum.Enum):
    """How far a fix can be trusted: ``--fix`` applies only safe ones."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    DISPLAY = "display"


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` of ``file`` with ``replacement``."""

    file: Path
    start: int
    end: int
    replacement: str


@dataclass
class Fix:
    description: str
    applicability: Applicability
    edits: Tuple[Edit, ...] = ()


@dataclass
class Hit:
    """What a check yields: where, what, and optionally a fix or a different severity.

    ``doc``/``node`` locate it in a config; for scripts and env vars pass ``file``/``line``/``key``.
    """

    doc: Optional[Document]
    node: Optional[Node]
    message: str
    fix: Optional[Fix] = None
    severity: Optional[Severity] = None
    file: Optional[Path] = None
    line: Optional[int] = None
    key: Optional[str] = None
    col: Optional[int] = None


@dataclass
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    file: Optional[str]
    key: Optional[str]
    line: Optional[int]
    col: Optional[int] = None
    fix: Optional[Fix] = None
    versions: Dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        fix = None
        if self.fix is not None:
            fix = {"description": self.fix.description, "applicability": self.fix.applicability.value}
        return {"code": self.code, "name": self.name, "severity": self.severity.value, "message": self.message,
                "file": self.file, "key": self.key, "line": self.line, "col": self.col, "fix": fix,
                "versions": self.versions}


REQUIRED_SECTIONS = ("Why is this bad?", "Example", "Use instead", "References")


@dataclass
class Rule:
    """A registered rule.

    Attributes:
        code: stable code (``DS001``); never reused once published.
        name: kebab-case name of the problem it finds.
        severity: default severity (a hit may raise or lower it with a reason).
        check: the function that finds it.
        packages: packages whose versions the verdict depends on (reported with each finding).
        versions: the versions it applies to, in words (``deepspeed >= 0.15.0``, ``all``).
        witness: the test that shows the behaviour on the real library (``tests/x.py::test_y``), or for
            version-gated rules CI cannot install ``fixture:tests/x.py::test_y; <upstream source>``.
        fixable: whether it may offer a fix.
        status: ``stable`` or ``preview``.
    """

    code: str
    name: str
    severity: Severity
    check: Callable
    packages: Tuple[str, ...] = ()
    versions: str = "all"
    witness: str = ""
    fixable: bool = False
    status: str = "stable"

    @property
    def doc(self) -> str:
        doc = self.check.__doc__ or ""
        first, _, rest = doc.partition("\n")
        return (first.strip() + "\n" + textwrap.dedent(rest)).strip()

    @property
    def summary(self) -> str:
        return self.doc.split("\n\n", 1)[0].replace("\n", " ").strip()

    def sections(self) -> Dict[str, str]:
        """Docstring sections by heading (``## Why is this bad?`` -> text)."""
        parts = re.split(r"^## +(.+?)\s*$", self.doc, flags=re.M)
        out = {"": parts[0].strip()}
        for heading, body in zip(parts[1::2], parts[2::2]):
            out[heading.strip()] = body.strip()
        return out

    def run(self, launch) -> List[Finding]:
        out = []
        for hit in self.check(launch) or ():
            out.append(self._finding(hit, launch))
        return out

    def _finding(self, hit: Hit, launch) -> Finding:
        file = hit.file if hit.file is not None else (hit.doc.path if hit.doc is not None else None)
        line = hit.line if hit.line is not None else (hit.node.key_line or hit.node.line if hit.node else None)
        key = hit.key if hit.key is not None else (hit.node.path if hit.node is not None else None)
        col = hit.col if hit.col is not None else None
        return Finding(self.code, self.name, hit.severity or self.severity, hit.message,
                       str(file) if file is not None else None, key, line, col, hit.fix,
                       launch.versions.assumed(self.packages))


_RULES: Dict[str, Rule] = {}
# Renamed codes: old -> new. A code is never reused for another problem.
REDIRECTS: Dict[str, str] = {}


def rule(code: str, name: str, severity: Severity, *, packages: Sequence[str] = (), versions: str = "all",
         witness: str = "", fixable: bool = False, status: str = "stable"):
    """Register a check function as a rule (see the module docstring)."""

    def register(fn: Callable) -> Callable:
        if code in _RULES:
            raise ValueError(f"rule code {code} registered twice")
        _RULES[code] = Rule(code, name, severity, fn, tuple(packages), versions, witness, fixable, status)
        return fn

    return register


def registered() -> Dict[str, Rule]:
    return _RULES


def run_rules(launch, rules: Iterable[Rule]) -> List[Finding]:
    findings: List[Finding] = []
    for r in rules:
        findings.extend(r.run(launch))
    return findings
