"""Find a model's config from what a user or a launch names: a file, a directory, a Hub id, a name.

Order: a local ``config.json`` (or a directory holding one), the Hugging Face cache
(``$HF_HOME/hub/models--ORG--NAME/snapshots/*/config.json``), the built-in catalogue, and last the
Hub over the network, only when the caller passes a :class:`HubAccess` (the library never goes online by
itself: ``zeropilot check --hub``, ``zeropilot plan``). :meth:`HubAccess.from_env` honours ``HF_ENDPOINT``,
``HF_TOKEN`` (or the token file ``huggingface-cli login`` writes) and ``HF_HUB_OFFLINE`` /
``ZEROPILOT_OFFLINE``; one request per model id, 5 s timeout. A name found nowhere is one clear
:class:`~zeropilot.errors.InputError`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.models.arch import Architecture, from_config
from zeropilot.models.catalogue import lookup, names


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB; a VLM's with its processor config under 1 MB


def read_config(path: Path) -> Dict[str, Any]:
    """A model's ``config.json`` as a dict (bounded, regular files only).

    Raises:
        InputError: not a regular file, too large, not JSON or not an object.
    """
    data = safefile.read_json(path, MAX_CONFIG_BYTES, what="JSON (a model config)")
    if not isinstance(data, dict):
        raise InputError("model config is not a JSON object", path)
    return data


def _local(spec: str) -> Optional[Path]:
    path = Path(spec).expanduser()
    kind = safefile.kind_of(path)
    if kind == "dir":
        if safefile.kind_of(path / "config.json") not in (None, "symlink-dangling"):
            return path / "config.json"  # reading refuses a FIFO or a device there, without waiting
        raise InputError("directory has no config.json", path)
    return None if kind in (None, "symlink-dangling") else path


def _hf_cache(spec: str) -> Optional[Path]:
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        return None
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / ("models--" + spec.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


_TRUE = ("1", "true", "yes", "on")


@dataclass
class HubAccess:
    """Permission to read model configs from a Hugging Face Hub endpoint, and how.

    Attributes:
        endpoint: base URL (``HF_ENDPOINT``, default ``https://huggingface.co``).
        token: sent as ``Authorization: Bearer`` (``HF_TOKEN``), or None.
        offline: ``HF_HUB_OFFLINE``/``ZEROPILOT_OFFLINE`` set: no request is made.
        timeout_s: per request.
        answers: model id -> (config, why not); each id is asked once.
    """

    endpoint: str = "https://huggingface.co"
    token: Optional[str] = None
    offline: bool = False
    timeout_s: float = 5.0
    answers: Dict[str, Tuple[Optional[Dict[str, Any]], str]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Optional[Dict[str, str]] = None) -> "HubAccess":
        """The Hub as ``huggingface_hub`` would use it from these environment variables."""
        env = os.environ if env is None else env
        offline = any(env.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "ZEROPILOT_OFFLINE"))
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        return cls(endpoint, env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or _token_file(env), offline)

    def describe(self) -> str:
        if self.offline:
            return "offline (HF_HUB_OFFLINE)"
        return f"{self.endpoint}{' with HF_TOKEN' if self.token else ''}"

    def config(self, spec: str) -> Tuple[Optional[Dict[str, Any]], str]:
        """(config, why not) for a Hub id; never raises; asks the endpoint at most once per id."""
        if spec not in self.answers:
            self.answers[spec] = self._fetch(spec)
        return self.answers[spec]

    def _fetch(self, spec: str) -> Tuple[Optional[Dict[str, Any]], str]:
        if spec.count("/") != 1:
            return None, "not a Hub id (ORG/NAME)"
        if self.offline:
            return None, "offline: HF_HUB_OFFLINE/ZEROPILOT_OFFLINE set"
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.endpoint}/{spec}/resolve/main/config.json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310 - user's endpoint
                data = json.loads(resp.read(1024 * 1024).decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return None, f"{self.endpoint} not reachable or no such model ({exc.__class__.__name__})"
        return (data, "") if isinstance(data, dict) else (None, "the Hub's answer is not a config")


def _token_file(env) -> Optional[str]:
    home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    path = Path(env.get("HF_TOKEN_PATH") or home / "token")
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def resolve_model(spec: str, base: Optional[Path] = None, hub: Optional[HubAccess] = None) -> Architecture:
    """The :class:`Architecture` for a config path, model directory, Hub id or catalogue name.

    Args:
        spec: what the user or launch gave (``--model``, ``model_name_or_path``).
        base: directory that relative paths in a launch file are relative to.
        hub: where to ask for a Hub id found nowhere locally; None: no network.

    Raises:
        InputError: nothing found under that name, or the config cannot be sized.
    """
    candidates = [spec] if base is None or Path(spec).is_absolute() else [str(base / spec), spec]
    for cand in candidates:
        local = _local(cand)
        if local is not None:
            return from_config(read_config(local), name=spec, source=str(local))
    cached = _hf_cache(spec)
    if cached is not None:
        return from_config(read_config(cached), name=spec, source=str(cached))
    known = lookup(spec)
    if known is not None:
        return from_config(known, name=spec, source="built-in catalogue")
    data, why = hub.config(spec) if hub is not None else (None, "the Hub was not asked: pass --hub")
    if data is not None:
        return from_config(data, name=spec, source=f"{hub.endpoint}/{spec}")
    raise InputError(f"model {spec!r} is not a config file, a model directory, a cached or reachable Hub id "
                     f"({why}) or a catalogued name; catalogued: {', '.join(names())}")
