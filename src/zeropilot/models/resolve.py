"""Find a model's config from what a user or a launch names: a file, a directory, a Hub id, a name.

Order: a local ``config.json`` (or a directory holding one), the Hugging Face cache
(``$HF_HOME/hub/models--ORG--NAME/snapshots/*/config.json``), the built-in catalogue, and last the
Hub over the network (skipped when ``HF_HUB_OFFLINE``/``ZEROPILOT_OFFLINE`` is set, 5 s timeout). A
name found nowhere is one clear :class:`~zeropilot.errors.InputError`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.models.arch import Architecture, from_config
from zeropilot.models.catalogue import lookup, names


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read model config: {exc}", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"model config is not JSON: {exc.msg}", path, exc.lineno, exc.colno) from None
    if not isinstance(data, dict):
        raise InputError("model config is not a JSON object", path)
    return data


def _local(spec: str) -> Optional[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path / "config.json"
        raise InputError("directory has no config.json", path)
    if path.is_file():
        return path
    return None


def _hf_cache(spec: str) -> Optional[Path]:
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / ("models--" + spec.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def _hub(spec: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """(config, why not) from huggingface.co; never raises."""
    if spec.count("/") != 1:
        return None, "not a Hub id (ORG/NAME)"
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("ZEROPILOT_OFFLINE"):
        return None, "offline (HF_HUB_OFFLINE/ZEROPILOT_OFFLINE set)"
    import urllib.error
    import urllib.request

    url = f"https://huggingface.co/{spec}/resolve/main/config.json"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - fixed https host
            data = json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"Hub not reachable ({exc.__class__.__name__})"
    return (data, "") if isinstance(data, dict) else (None, "Hub answer is not a config")


def resolve_model(spec: str, base: Optional[Path] = None) -> Architecture:
    """The :class:`Architecture` for a config path, model directory, Hub id or catalogue name.

    Args:
        spec: what the user or launch gave (``--model``, ``model_name_or_path``).
        base: directory that relative paths in a launch file are relative to.

    Raises:
        InputError: nothing found under that name, or the config cannot be sized.
    """
    candidates = [spec] if base is None or Path(spec).is_absolute() else [str(base / spec), spec]
    for cand in candidates:
        local = _local(cand)
        if local is not None:
            return from_config(_read_json(local), name=spec, source=str(local))
    cached = _hf_cache(spec)
    if cached is not None:
        return from_config(_read_json(cached), name=spec, source=str(cached))
    known = lookup(spec)
    if known is not None:
        return from_config(known, name=spec, source="built-in catalogue")
    data, why = _hub(spec)
    if data is not None:
        return from_config(data, name=spec, source=f"huggingface.co/{spec}")
    raise InputError(f"model {spec!r} is not a config file, a model directory, a cached or reachable Hub id "
                     f"({why}) or a catalogued name; catalogued: {', '.join(names())}")
