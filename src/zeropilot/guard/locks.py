"""Build locks that make a launch hang before its first step (torch-free, no imports of torch).

PyTorch's C++ extension builder (used by DeepSpeed's op builder) takes ``<extensions dir>/<op>/lock``
with ``O_EXCL`` and every other process polls until it disappears (``torch.utils.file_baton``). A
build killed half-way leaves the file and every later launch waits forever, silently. The rules
engineer's machine finder (``zeropilot.launch.machine``) is used when present; this is the small
fallback: list lock files under the extensions folders with their age.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, List, Optional


def extension_dirs(env: Optional[Dict[str, str]] = None) -> List[Path]:
    """Where torch builds extensions: ``TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return [Path(env["TORCH_EXTENSIONS_DIR"])]
    cache = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME", "~")).expanduser() / ".cache")
    return [cache / "torch_extensions"]


def find_locks(env: Optional[Dict[str, str]] = None, max_entries: int = 2000) -> List[Dict[str, object]]:
    """Every ``lock`` file two or three levels under the extension folders: path and age in seconds."""
    try:
        from zeropilot.launch import machine  # type: ignore[attr-defined]

        finder = getattr(machine, "stale_extension_locks", None)
    except ImportError:
        finder = None
    if finder is not None:
        try:
            return [dict(x) if isinstance(x, dict) else {"path": str(x), "age_s": None} for x in finder()]
        except Exception:  # noqa: BLE001 - fall back to ours
            pass
    found: List[Dict[str, object]] = []
    seen = 0
    now = time.time()
    for root in extension_dirs(env):
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            seen += 1
            if seen > max_entries or dirpath.count(os.sep) - str(root).count(os.sep) > 2:
                dirnames[:] = []
                continue
            if "lock" in filenames:
                path = Path(dirpath) / "lock"
                try:
                    found.append({"path": str(path), "age_s": round(now - path.stat().st_mtime, 1)})
                except OSError:
                    pass
    return found
