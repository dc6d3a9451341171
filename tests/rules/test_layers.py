"""Import contracts of the layers (read from the source with ``ast``, and by running a check).

- The core (envelope, launch, fix, models, memory, rules, findings, oracle's parent side) imports no torch, deepspeed,
  transformers, accelerate or peft — not even lazily; only ``zeropilot/oracle/worker.py`` does, in its subprocess.
- Layers import only downwards: errors < safefile, extras < checkpoint (its torch-free file names) < launch < fix,
  models < memory, oracle < rules < findings < check, cli. (``envelope``, the JSON every command prints, is a leaf;
  ``safefile``, the one reader of every input, and ``extras``, the one line naming a missing extra, import only
  ``errors``.) (``checkpoint`` may import torch lazily: it is not core.)
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "zeropilot"
HEAVY = {"torch", "deepspeed", "transformers", "accelerate", "peft"}
CORE = ("envelope", "launch", "fix", "models", "memory", "rules", "findings", "oracle")
LAYER = {"errors": 0, "envelope": 0, "safefile": 0.5, "extras": 0.5, "checkpoint": 1, "launch": 2, "fix": 3,
         "models": 3, "memory": 4, "oracle": 4, "rules": 5,
         "findings": 6}
ALLOWED_HEAVY = {SRC / "oracle" / "worker.py"}


def _imports(path: Path):
    """(line, module) for every import in a file, at any depth (lazy imports count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _files(package: str):
    return sorted((SRC / package).rglob("*.py")) if (SRC / package).is_dir() else [SRC / f"{package}.py"]


@pytest.mark.parametrize("package", CORE)
def test_core_imports_no_heavy_library(package):
    bad = [f"{p.relative_to(SRC)}:{line} {mod}" for p in _files(package) if p not in ALLOWED_HEAVY
           for line, mod in _imports(p) if mod.split(".")[0] in HEAVY]
    assert bad == []


@pytest.mark.parametrize("package", sorted(LAYER))
def test_layers_import_only_downwards(package):
    level = LAYER[package]
    bad = []
    for path in _files(package):
        for line, mod in _imports(path):
            parts = mod.split(".")
            if parts[0] != "zeropilot" or len(parts) < 2:
                continue
            target = LAYER.get(parts[1])
            if target is None or target > level or (target == level and parts[1] != package):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {mod}")
    assert bad == []


def test_check_run_imports_no_heavy_library(tmp_path):
    """A whole check (every rule, facts, fixes, the text report) leaves torch & co. unimported."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3.0}, "train_batch_size": 30}')
    code = ("import sys; from zeropilot.check import check; from zeropilot.findings import text; "
            f"r, _ = check([{str(tmp_path)!r}], use_installed=False); text.render(r, colour=False); "
            "print(sorted(m for m in ('torch', 'deepspeed', 'transformers', 'accelerate', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr[-2000:]
