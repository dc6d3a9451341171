"""The rule registry: one record per rule, its docs taken from the check function's docstring.

How to add a rule (one function in the topic module under ``zeropilot/rules/``)::

    from zeropilot.rules.registry import Gate, Hit, rule, Severity

    @rule("DS001", "unknown-key-in-strict-section", Severity.ERROR, gates=(Gate("deepspeed", ">=0.7.0"),),
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

Version ranges are data (``gates``), enforced by the engine: the check function does not test them again.
Launch values (ZeRO stage, precision, batch values, PEFT, offload) come from :mod:`zeropilot.launch.facts`.

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

from zeropilot.fix.model import Applicability, Edit, Fix  # noqa: F401 - re-exported: rules build fixes from here
from zeropilot.launch.document import Document, Node


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 3, "warning": 2, "info": 1}[self.value]


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


@dataclass(frozen=True)
class Gate:
    """A version range a rule applies to, declared once and enforced by :meth:`Rule.run`.

    Attributes:
        package: distribution name (``deepspeed``).
        spec: PEP 440 specifier (``>=0.19.3``).
        when_unknown: whether the rule runs when the package's version is unknown (True: an unknown version
            counts as in range, as for checks of the newest DeepSpeed; False: only known versions).
    """

    package: str
    spec: str
    when_unknown: bool = True

    def admits(self, versions) -> bool:
        verdict = versions.satisfies(self.package, self.spec)
        return self.when_unknown if verdict is None else verdict

    def __str__(self) -> str:
        return f"{self.package} {self.spec}" + ("" if self.when_unknown else " (when the version is known)")


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
        gates: version ranges the rule applies to; the engine runs it only where every gate admits the launch's
            versions (so the check function does not test them again).
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
    gates: Tuple[Gate, ...] = ()

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

    def applies(self, versions) -> bool:
        """Whether every version gate admits these versions."""
        return all(g.admits(versions) for g in self.gates)

    def run(self, launch) -> List[Finding]:
        if not self.applies(launch.versions):
            return []
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
         witness: str = "", fixable: bool = False, status: str = "stable", gates: Sequence[Gate] = ()):
    """Register a check function as a rule (see the module docstring).

    ``gates`` are enforced by the engine; ``versions`` only explains them (and any finer, per-finding ranges)
    in words for the docs.
    """

    def register(fn: Callable) -> Callable:
        if code in _RULES:
            raise ValueError(f"rule code {code} registered twice")
        pkgs = tuple(dict.fromkeys(tuple(packages) + tuple(g.package for g in gates)))
        _RULES[code] = Rule(code, name, severity, fn, pkgs, versions, witness, fixable, status, tuple(gates))
        return fn

    return register


def registered() -> Dict[str, Rule]:
    return _RULES


# --- selection (``--select`` / ``--ignore``, ``[tool.zeropilot]``, inline suppressions) -------------------

_PREFIX = re.compile(r"^[A-Z]+[0-9]*$")
_EXACT = 100  # specificity of a full code or a rule name; a prefix's is its length


def match_selector(selector: str, rules: Sequence[Rule]) -> Tuple[List[Rule], int]:
    """(rules, specificity) a selector names: ``ALL``, a code (``DS001``, redirects followed), a rule name
    (``fp16-and-bf16-both-enabled``) or a code prefix (``DS``, ``DS0``).

    Raises:
        InputError: nothing matches; the message suggests the closest codes, names or prefixes.
    """
    from zeropilot.errors import InputError

    token = selector.strip()
    up = REDIRECTS.get(token.upper(), token.upper())
    if up == "ALL":
        return list(rules), 0
    for r in rules:
        if r.code == up or r.name == token.lower():
            return [r], _EXACT
    if _PREFIX.match(up):
        hits = [r for r in rules if r.code.startswith(up)]
        if hits:
            return hits, len(up)
    raise InputError(f"unknown rule selector {token!r}{_did_you_mean(token, rules)}: `zeropilot rules` lists "
                     "the codes; a prefix such as DS selects a group")


def _did_you_mean(token: str, rules: Sequence[Rule]) -> str:
    import difflib

    prefixes = {r.code.rstrip("0123456789") for r in rules}
    words = {w.lower(): w for w in [r.code for r in rules] + [r.name for r in rules] + sorted(prefixes)}
    close = difflib.get_close_matches(token.lower(), list(words), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(words[c] for c in close)}?)" if close else ""


def select_rules(rules: Sequence[Rule], select: Iterable[str] = (), ignore: Iterable[str] = ()) -> List[Rule]:
    """The rules that run, chosen as ruff chooses them.

    An empty ``select`` means every rule. A rule runs when the most specific selector naming it comes from
    ``select``: ``--select DS001 --ignore DS`` runs DS001 only; on equal specificity ``ignore`` wins.

    Raises:
        InputError: a selector names no rule (never "ran nothing, exit 0").
    """
    best: Dict[str, Tuple[int, bool]] = {}
    chosen = list(select) or ["ALL"]
    for selectors, keep in ((chosen, True), (list(ignore), False)):
        for selector in selectors:
            hits, weight = match_selector(selector, rules)
            for r in hits:
                if r.code not in best or weight >= best[r.code][0]:
                    best[r.code] = (weight, keep)
    return [r for r in rules if best.get(r.code, (0, False))[1]]


def run_rules(launch, rules: Iterable[Rule]) -> List[Finding]:
    findings: List[Finding] = []
    for r in rules:
        findings.extend(r.run(launch))
    return findings
