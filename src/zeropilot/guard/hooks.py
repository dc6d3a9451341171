"""Post-import hooks: run a function right after a module is first imported (or now, if it was).

The import system's own hook (a ``sys.meta_path`` finder that wraps the found loader's
``exec_module``) rather than wrapt's ``when_imported``: the bootstrap loads into every Python
process of a launch, launchers included, and must not depend on a package the job may not have.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Callable, Dict, List

Hook = Callable[[object], None]

_hooks: Dict[str, List[Hook]] = {}
_local = threading.local()


def _run(name: str, module: object) -> None:
    for hook in _hooks.pop(name, []):
        try:
            hook(module)
        except Exception as exc:  # noqa: BLE001 - a guard failure must never stop the job
            print(f"zeropilot guard: hook for {name} failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec):  # noqa: D401 - importlib protocol
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _run(self.name, module)

    def __getattr__(self, item):  # get_resource_reader, is_package, get_code ... go to the real loader
        return getattr(self.inner, item)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _hooks or getattr(_local, "busy", False):
            return None
        _local.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            _local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_finder = _Finder()


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported; at once if it already is."""
    module = sys.modules.get(name)
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        hook(module)
        return
    _hooks.setdefault(name, []).append(hook)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
