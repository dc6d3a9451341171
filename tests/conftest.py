"""Shared test helpers: writing launch fixtures and running check on them."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Union

import pytest

from tests.once import make_shared_dir
from tests.zp import NO_SHM_OP, REPO, pythonpath

# The suite tests the checkout it is in, in this process and in every process it starts, whatever checkout the
# environment's editable install points at (a second worktree sharing one virtual environment tested the first's code)
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Every process the suite starts loads its sitecustomize (tests/site): MLflow kept out of DeepSpeed's import, and no
# build of DeepSpeed's CPU shm all-reduce op (a speed path that only inference_all_reduce uses; a minute of gcc).
os.environ["PYTHONPATH"] = pythonpath(REPO / "src", *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p])
os.environ[NO_SHM_OP] = "1"
# The jobs start the launchers by name (torchrun, deepspeed, accelerate): those of the environment running the suite,
# also when it runs as ``.venv/bin/python -m pytest`` without the environment activated.
_BIN = os.path.dirname(sys.executable)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_BIN] + [p for p in [os.environ.get("PATH")] if p])
# A TORCH_EXTENSIONS_DIR of the suite's own for every process a test starts without one (never the machine's: a lock
# left there cannot hang the suite). Tests that run DeepSpeed give theirs a folder of their own
# (``tests.zp.extensions_dir``).
_EXTENSIONS = tempfile.mkdtemp(prefix="zeropilot-tests-extensions-")
atexit.register(shutil.rmtree, _EXTENSIONS, True)
os.environ["TORCH_EXTENSIONS_DIR"] = _EXTENSIONS
# One folder for the whole run, the pytest-xdist workers' too: the jobs several test files share run once in it
# (tests/once.py)
make_shared_dir()

# The suite is the gate a change must pass: its property tests draw the same examples on every run, so a red run
# means the change broke something, not that a search got lucky (CI once failed on a fuzz example no earlier run had
# drawn). Searching for new failures is its own job: ``HYPOTHESIS_PROFILE=explore`` draws fresh examples, and the
# report fuzzer takes ``ZP_FUZZ_EXAMPLES=2000``.
try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass
else:
    _hypothesis_settings.register_profile("gate", derandomize=True, database=None)
    _hypothesis_settings.register_profile("explore", derandomize=False)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

# Public configs kept as test input, unmodified; MANIFEST.tsv says where each comes from (README.md: licences).
CORPUS = Path(__file__).resolve().parent / "data" / "corpus"


def corpus_files() -> list:
    """The corpus's files, as MANIFEST.tsv lists them (its README and licence texts are not configs)."""
    rows = (CORPUS / "MANIFEST.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return sorted(CORPUS / row.split("\t", 1)[0] for row in rows if row.strip())


def write_files(root: Path, files: Dict[str, Union[str, dict]]) -> Path:
    """Write ``name -> text`` (dicts become JSON) under root; returns root."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, (dict, list)):
            content = json.dumps(content, indent=2)
        path.write_text(content, encoding="utf-8")
    return root


def run_check(root: Path, versions: Optional[str] = None, world_size: Optional[int] = None, select=()):
    """Check a folder with pinned versions (installed ones are not read) and return the findings."""
    from zeropilot.check import check

    result, _ = check([root], versions=versions, world_size=world_size, select=select, use_installed=False)
    return result.findings


def codes(findings) -> list:
    return sorted(f.code for f in findings)


@pytest.fixture
def launch_dir(tmp_path):
    def make(files: Dict[str, Union[str, dict]]) -> Path:
        return write_files(tmp_path / "launch", files)
    return make


def pytest_collection_modifyitems(config, items):
    """Files with slow tests (multi-rank jobs, real builds) first, each file's tests in their order: ci/test.sh hands
    whole files to two workers in this order (``--no-loadscope-reorder``; pytest-xdist's default puts files with the
    most tests first, and the one-test files holding the longest jobs came last), whichever worker is free taking the
    next, so the run ends on short files instead of one worker finishing a long job alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
