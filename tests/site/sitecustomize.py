"""Test environment only: on the PYTHONPATH of every Python process the suite starts (``tests/zp.py``: ``SITE``).

It runs the ``sitecustomize`` it shadows (the next one on ``sys.path``, as zeropilot's bootstrap does), then:

- keeps MLflow out of DeepSpeed. DeepSpeed 0.19.8 imports ``deepspeed.autotuning`` from ``deepspeed.runtime.config``
  (so in every process that imports deepspeed, the ``deepspeed`` launcher's included), and its ``autotuner`` module
  runs ``try: import mlflow`` at import time, for its autotuning experiments only. With mlflow-skinny installed (the
  MLflow tracker test needs it) that import costs about 0.9 s of CPU in each such process, a third of
  ``import deepspeed``. Only that import is refused, as if MLflow were not installed (DeepSpeed then sets
  ``has_mlflow = False``); other code, transformers' MLflow callback among it, imports MLflow as usual.
- with ``ZEROPILOT_TESTS_NO_SHM_OP=1`` (tests/conftest.py sets it for the whole suite; the tests of that build
  remove it), skips DeepSpeed's CPU shared-memory all-reduce build: a speed path compiled with gcc on the first
  ``init_distributed`` (a minute of CPU, minutes on a 2-core CI machine) that only DeepSpeed's
  ``inference_all_reduce`` uses (deepspeed/comm/torch.py, 0.19.8); training's collectives go through gloo either
  way. The jobs' scripts stay unmodified: in a job this file sits behind zeropilot's bootstrap, which must
  chain-load it (what ``tests/guard/test_jobs.py`` checks: no op was built).
- with ``ZEROPILOT_TESTS_PROCLOG=FILE``, appends JSON lines to FILE: ``refused`` when it refuses DeepSpeed its MLflow
  (a process a killed job's end does not let exit is counted too), ``exit`` when a process exits, with its own CPU
  seconds and which of the heavy libraries it imported (how the suite's processes were counted).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after this one's folder, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    after = sys.path[folders.index(here) + 1:] if here in folders else sys.path
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in after
                                                                      if os.path.abspath(p or os.getcwd()) != here])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_zeropilot_tests_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


class _NoMlflowInDeepSpeed(importlib.abc.MetaPathFinder):
    """Refuses ``import mlflow`` when DeepSpeed's autotuner asks for it; finds nothing otherwise."""

    importer = "deepspeed.autotuning.autotuner"

    def find_spec(self, name, path, target=None):
        if name != "mlflow":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__") == self.importer:
                _log("refused")
                raise ModuleNotFoundError(f"mlflow is kept out of {self.importer} by the test suite", name=name)
            frame = frame.f_back
        return None


class _SkipShm(importlib.abc.MetaPathFinder):
    """Loads ``deepspeed.comm.torch`` with its ``build_shm_op`` replaced by a no-op."""

    def find_spec(self, name, path, target=None):
        if name != "deepspeed.comm.torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        inner = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, s):
                return inner.create_module(s)

            def exec_module(self, module):
                inner.exec_module(module)
                module.build_shm_op = lambda: None

        spec.loader = Loader()
        return spec


def _log(event: str, **fields) -> None:
    path = os.environ.get("ZEROPILOT_TESTS_PROCLOG")
    if path:
        import json

        with open(path, "a") as f:
            f.write(json.dumps(dict(event=event, pid=os.getpid(), argv=sys.argv[:4],
                                    test=os.environ.get("PYTEST_CURRENT_TEST"), **fields)) + "\n")


def _log_at_exit() -> None:
    import atexit
    import time

    started = time.time()

    def write() -> None:
        t = os.times()
        heavy = [m for m in ("torch", "deepspeed", "transformers", "accelerate", "peft", "mlflow") if m in sys.modules]
        _log("exit", cpu_s=round(t.user + t.system, 2), wall_s=round(time.time() - started, 2), imported=heavy)

    atexit.register(write)


_chain()
sys.meta_path.insert(0, _NoMlflowInDeepSpeed())
if os.environ.get("ZEROPILOT_TESTS_PROCLOG"):
    _log_at_exit()
if os.environ.get("ZEROPILOT_TESTS_NO_SHM_OP") == "1":
    sys.meta_path.insert(0, _SkipShm())
