"""Test environment only: skip DeepSpeed's CPU shared-memory all-reduce build in the jobs' ranks.

That op is a speed path compiled with gcc on first ``init_distributed`` (minutes on a 2-core CI
machine); gloo does the same collectives. The jobs' scripts stay unmodified: this sitecustomize is
on their PYTHONPATH behind zeropilot's bootstrap, which must chain-load it (what the tests check:
``ZEROPILOT_TEST_SITE`` is printed into the rank's environment record by the job's own output).
"""

import importlib.abc
import importlib.util
import os
import sys

os.environ["ZEROPILOT_TEST_SITE_LOADED"] = "1"


class _SkipShm(importlib.abc.MetaPathFinder):
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


sys.meta_path.insert(0, _SkipShm())
