"""Build locks that make a launch hang before its first step, for the hang watchdog (torch-free).

PyTorch's C++ extension builder (used by DeepSpeed's op builder) takes ``<extensions dir>/<op>/lock``
with ``O_EXCL`` and every other process polls until it disappears (``torch.utils.file_baton``). A
build killed half-way leaves the file and every later launch waits forever, silently. Where the locks
are and how old they are is :mod:`zeropilot.launch.machine`'s (also behind rule MC001); this module only
shapes its answer for ``hang.json``.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional

from zeropilot.launch.machine import extensions_roots, find_build_locks


def find_locks(env: Optional[Mapping[str, str]] = None) -> List[Dict[str, object]]:
    """Every op-build lock of the launch's environment, oldest first: path, op, age in seconds, stale."""
    roots = extensions_roots(os.environ if env is None else env)
    return [{"path": str(b.path), "op": b.op, "age_s": round(b.age_s, 1), "stale": b.stale}
            for b in find_build_locks(roots)]
