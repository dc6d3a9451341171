"""The suite's sitecustomize (tests/site), which every process the suite starts loads: it keeps MLflow out of
DeepSpeed's import, and nothing else's."""

import importlib.util
import os
import sys

from tests.zp import SITE, run_group


def test_a_child_imports_deepspeed_without_mlflow_and_mlflow_still_imports():
    assert str(SITE) in os.environ["PYTHONPATH"].split(os.pathsep)
    code = ("import sys, importlib.util, deepspeed, deepspeed.autotuning.autotuner as a\n"
            "print('mlflow' in sys.modules, a.has_mlflow, importlib.util.find_spec('mlflow') is not None)\n")
    done = run_group([sys.executable, "-c", code], env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    installed = importlib.util.find_spec("mlflow") is not None  # mlflow-skinny is a test dependency
    assert done.stdout.split() == ["False", "False", str(installed)]
