"""``[tool.zeropilot]`` in ``pyproject.toml``: the check's settings, kept next to the project they describe.

Found like ruff finds ``[tool.ruff]``: from the first checked path upward, the first ``pyproject.toml`` that
has a ``[tool.zeropilot]`` table header (one without it is passed over, unparsed). Flags on the command line win.

```toml
[tool.zeropilot]
select = ["DS", "HF"]            # codes, rule names or prefixes (default: every rule)
extend-select = ["TO001"]        # added to select
ignore = ["DS012"]               # never run these
per-file-ignores = { "configs/legacy_*.json" = ["DS001"] }   # globs relative to this pyproject.toml
versions = "deepspeed=0.19.8,transformers=5.24.0"            # or a table: { deepspeed = "0.19.8" }
world-size = 8
gpus = "8x80GiB"
fail-on = "warning"
hub = false                      # read unknown model configs from the Hub (HF_ENDPOINT, HF_TOKEN)
```
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from zeropilot import safefile
from zeropilot.errors import InputError

KEYS = ("select", "extend-select", "ignore", "per-file-ignores", "versions", "world-size", "gpus", "fail-on",
        "hub")
_SEVERITIES = ("error", "warning", "info")
MAX_PYPROJECT_BYTES = 16 << 20  # the largest pyproject.toml on PyPI is a few hundred KB


@dataclass
class Settings:
    """Settings from one ``[tool.zeropilot]`` table (all empty when none was found)."""

    source: Optional[Path] = None
    select: List[str] = field(default_factory=list)
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    versions: Optional[str] = None
    world_size: Optional[int] = None
    gpus: Optional[str] = None
    fail_on: Optional[str] = None
    hub: Optional[bool] = None


def _toml(path: Path) -> Dict[str, Any]:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.9/3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise InputError("[tool.zeropilot] needs Python 3.11 or the tomli package to be read", path) from None
    text = safefile.read_text(path, MAX_PYPROJECT_BYTES)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", path) from None


_HEADER = re.compile(rb"^[ \t]*\[[ \t]*tool[ \t]*\.[ \t]*zeropilot(?![\w-])", re.M)


def _mentions_zeropilot(path: Path) -> bool:
    """A cheap look before parsing (``tomllib`` costs check's start-up): is there a ``[tool.zeropilot]`` header?"""
    try:
        fd = safefile.open_regular(path)
    except InputError:
        return False
    try:
        return _HEADER.search(os.read(fd, 1024 * 1024)) is not None
    except OSError:
        return False
    finally:
        os.close(fd)


def find_pyproject(paths: Sequence) -> Optional[Path]:
    """The first ``pyproject.toml`` with a ``[tool.zeropilot]`` table, from the first path upward."""
    start = Path(paths[0] if paths else ".").absolute()
    folder = start if start.is_dir() else start.parent
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file() and _mentions_zeropilot(path) and "zeropilot" in _toml(path).get("tool", {}):
            return path
    return None


def _strings(value: Any, key: str, path: Path) -> List[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"[tool.zeropilot] {key}: expected a list of rule codes, names or prefixes", path)
    return value


def _versions(value: Any, path: Path) -> str:
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, str):
        return value
    raise InputError('[tool.zeropilot] versions: expected "NAME=VER,..." or a table { NAME = "VER" }', path)


def load_settings(path: Path) -> Settings:
    """Read and validate the ``[tool.zeropilot]`` table of a ``pyproject.toml``.

    Raises:
        InputError: an unknown key (with the closest known one) or a value of the wrong type.
    """
    table = _toml(path).get("tool", {}).get("zeropilot", {})
    out = Settings(source=path)
    for raw, value in table.items():
        key = raw.replace("_", "-")
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f"; known: {', '.join(KEYS)}"
            raise InputError(f"[tool.zeropilot] unknown setting {raw!r}{hint}", path)
        _apply(out, key, value, path)
    return out


def _apply(out: Settings, key: str, value: Any, path: Path) -> None:
    if key in ("select", "extend-select", "ignore"):
        setattr(out, key.replace("-", "_"), _strings(value, key, path))
    elif key == "per-file-ignores":
        if not isinstance(value, dict):
            raise InputError("[tool.zeropilot] per-file-ignores: expected a table { GLOB = [CODES] }", path)
        out.per_file_ignores = {str(g): _strings(v, f"per-file-ignores {g!r}", path) for g, v in value.items()}
    elif key == "versions":
        out.versions = _versions(value, path)
    elif key == "world-size":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError("[tool.zeropilot] world-size: expected a positive integer", path)
        out.world_size = value
    elif key == "gpus":
        if not isinstance(value, str):
            raise InputError('[tool.zeropilot] gpus: expected "COUNTxMEM" such as "8x80GiB"', path)
        out.gpus = value
    elif key == "fail-on":
        if value not in _SEVERITIES:
            raise InputError(f"[tool.zeropilot] fail-on: expected one of {', '.join(_SEVERITIES)}", path)
        out.fail_on = value
    elif key == "hub":
        if not isinstance(value, bool):
            raise InputError("[tool.zeropilot] hub: expected true or false", path)
        out.hub = value
