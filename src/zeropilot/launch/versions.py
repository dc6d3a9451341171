"""Which versions of the training stack a verdict assumes.

By default the installed versions, read from package metadata without importing anything; then a
requirements or ``pip freeze`` file found with the launch when nothing is installed; ``--versions``
overrides both. Vendor builds such as ``0.14.2+das.opt1.dtk25041`` (Hygon DTK) are kept with their local
part; ``0.14.2das.opt1.dtk25041`` as ``pip show`` output is sometimes copied is read the same way.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Optional

from packaging.version import InvalidVersion, Version

from zeropilot import safefile
from zeropilot.errors import InputError

MAX_REQUIREMENTS_BYTES = 8 << 20  # a pip freeze of a large environment is under 100 KB
PACKAGES = ("deepspeed", "transformers", "accelerate", "torch", "peft", "llamafactory")
_DIST_NAMES = {"llamafactory": ("llamafactory", "llamafactory-cli", "llmtuner")}
_LEADING = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:[.+-]?)(.*)$")
_REQ_LINE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*===?\s*([^\s;#]+)")


def parse_version(raw: str) -> Optional[Version]:
    """A PEP 440 version, forgiving vendor strings; None when there is no leading number."""
    raw = raw.strip()
    try:
        return Version(raw)
    except InvalidVersion:
        pass
    m = _LEADING.match(raw)
    if not m:
        return None
    base, rest = m.group(1), m.group(2)
    local = re.sub(r"[^A-Za-z0-9]+", ".", rest).strip(".")
    try:
        return Version(f"{base}+{local}" if local else base)
    except InvalidVersion:
        return Version(base)


_CLAUSE = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.\-]*)(\.\*)?\s*$")
_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<=": lambda a, b: a <= b,
        ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, ">": lambda a, b: a > b}


def matches(version: Version, spec: str) -> bool:
    """Whether a version is in a comma-separated specifier such as ``>=4.46,<4.47.1`` or ``==4.46.*``.

    The PEP 440 comparisons rules here need, without ``packaging.specifiers`` (whose import and regex
    cost a fifth of check's start-up). Pre-releases count as in range, as ``prereleases=True`` does.

    Raises:
        ValueError: for a clause that is not an operator and a version.
    """
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if not m:
            raise ValueError(f"not a version specifier: {clause!r}")
        op, text, wildcard = m.groups()
        bound = Version(text)
        if wildcard:
            prefix = bound.release
            same = version.release[:len(prefix)] == prefix
            ok = same if op == "==" else not same
        elif op == "~=":
            upper = bound.release[:-1]
            ok = version >= bound and version.release[:len(upper)] == upper
        else:
            ok = _OPS[op](version, bound)
        if not ok:
            return False
    return True


@dataclass
class PackageVersion:
    """One package's version and where it was read (``installed``, ``--versions``, a file and line)."""

    name: str
    raw: Optional[str]
    source: str

    @property
    def version(self) -> Optional[Version]:
        return parse_version(self.raw) if self.raw else None


@dataclass
class Versions:
    """The versions a check assumes, one per package of :data:`PACKAGES` (unknown ones have raw None)."""

    packages: Dict[str, PackageVersion] = field(default_factory=dict)

    def get(self, name: str) -> Optional[Version]:
        pv = self.packages.get(name)
        return pv.version if pv else None

    def raw(self, name: str) -> Optional[str]:
        pv = self.packages.get(name)
        return pv.raw if pv else None

    def satisfies(self, name: str, spec: str) -> Optional[bool]:
        """Whether the package's version is in ``spec``; None when the version is unknown.

        Local version labels (``+das.opt1``) are ignored for the comparison, as pip does.
        """
        version = self.get(name)
        if version is None:
            return None
        return matches(Version(version.public), spec)

    def assumed(self, names: Iterable[str]) -> Dict[str, str]:
        """name -> version string (or ``unknown``) for the packages a verdict depended on."""
        return {n: (self.raw(n) or "unknown") for n in names}

    def as_dict(self) -> Dict[str, Dict[str, Optional[str]]]:
        return {n: {"version": pv.raw, "source": pv.source} for n, pv in self.packages.items()}

    @property
    def is_rocm(self) -> Optional[bool]:
        """True for ROCm / Hygon DTK builds of torch or DeepSpeed, False for other known builds."""
        raws = [self.raw("torch"), self.raw("deepspeed")]
        if not any(raws):
            return None
        return any(r and re.search(r"rocm|dtk|das|hip", r, re.I) for r in raws)


_DIST_INFO = re.compile(r"^([A-Za-z0-9_.\-]+?)-([^-]+?)\.(?:dist-info|egg-info)$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> Dict[str, str]:
    """Installed distributions' versions, read from the ``*.dist-info`` folder names on ``sys.path``.

    The same metadata ``importlib.metadata`` reads, without its import cost; the first entry on the path
    wins, as for imports.
    """
    found: Dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for fname in names:
            m = _DIST_INFO.match(fname)
            if m:
                found.setdefault(_normalise(m.group(1)), m.group(2))
    return found


def _installed(name: str, found: Dict[str, str]) -> Optional[str]:
    for dist in _DIST_NAMES.get(name, (name,)):
        raw = found.get(_normalise(dist))
        if raw:
            return raw
    return None


def read_requirements(path: Path) -> Dict[str, PackageVersion]:
    """Pinned versions (``name==ver``) of the known packages in a requirements / pip freeze file."""
    found: Dict[str, PackageVersion] = {}
    text = safefile.read_bytes(path, MAX_REQUIREMENTS_BYTES).decode("utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _REQ_LINE.match(line)
        if not m:
            continue
        name = m.group(1).lower().replace("_", "-")
        for pkg in PACKAGES:
            if name == pkg or name in _DIST_NAMES.get(pkg, ()):
                found[pkg] = PackageVersion(pkg, m.group(2), f"{path}:{lineno}")
    return found


def parse_overrides(text: str) -> Dict[str, PackageVersion]:
    """``--versions deepspeed=0.14.2+das,transformers=4.46.1`` into package versions.

    Raises:
        InputError: for an entry that is not NAME=VERSION or names an unknown package.
    """
    out: Dict[str, PackageVersion] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, ver = item.partition("=")
        name = name.strip().lower()
        if not sep or not ver.strip():
            raise InputError(f"--versions: expected NAME=VERSION, got {item!r}")
        if name not in PACKAGES:
            raise InputError(f"--versions: unknown package {name!r} (known: {', '.join(PACKAGES)})")
        if parse_version(ver) is None:
            raise InputError(f"--versions: {ver.strip()!r} is not a version for {name}")
        out[name] = PackageVersion(name, ver.strip(), "--versions")
    return out


def resolve_versions(
    overrides: Optional[str] = None,
    requirement_files: Iterable[Path] = (),
    use_installed: bool = True,
) -> Versions:
    """The versions to assume: ``--versions`` over installed over requirement files."""
    packages: Dict[str, PackageVersion] = {n: PackageVersion(n, None, "unknown") for n in PACKAGES}
    for path in requirement_files:
        packages.update(read_requirements(path))
    if use_installed:
        found = installed_versions()
        for name in PACKAGES:
            raw = _installed(name, found)
            if raw:
                packages[name] = PackageVersion(name, raw, "installed")
    if overrides:
        packages.update(parse_overrides(overrides))
    return Versions(packages)
