"""zeropilot's bootstrap: put on PYTHONPATH by ``zeropilot run``, imported by every Python process of the launch.

It first runs the ``sitecustomize`` it shadows (the next one on ``sys.path``), then registers the
guard's post-import hooks. It must never break the job: any failure is one line on stderr.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_zeropilot_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def _restore() -> None:
    """On a node reached through DeepSpeed's runner (pdsh/ssh), which passes on only PYTHON* variables: put
    back the guard's variables from PYTHON_ZEROPILOT_ENV (``runner.supervisor.carrier``) where they are unset."""
    packed = os.environ.get("PYTHON_ZEROPILOT_ENV")
    if not packed or os.environ.get("ZEROPILOT_RUN_DIR") or len(packed) > 65536:
        return
    import base64
    import json

    values = json.loads(base64.urlsafe_b64decode(packed.encode()))
    for name, value in values.items() if isinstance(values, dict) else ():
        if isinstance(name, str) and isinstance(value, str) and name.startswith(("ZEROPILOT_", "TORCH_")):
            os.environ.setdefault(name, value)


def _guard() -> None:
    if not os.environ.get("ZEROPILOT_RUN_DIR"):
        return
    from zeropilot.guard.install import install

    install()


for _step in (_chain, _restore, _guard):
    try:
        _step()
    except Exception as _exc:  # noqa: BLE001
        sys.stderr.write(f"zeropilot bootstrap: {_step.__name__[1:]} failed: {_exc.__class__.__name__}: {_exc}\n")
