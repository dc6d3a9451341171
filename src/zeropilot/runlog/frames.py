"""Stack frames as people read them: the user's code and the model's first, library plumbing folded.

A frame is ``user`` (the training script and anything not installed as a package), ``model`` (a model's own
code: ``transformers/models/``, ``peft/tuners/``, remote-code ``modeling_*.py``), ``library`` (torch,
DeepSpeed, accelerate, the rest of transformers: the plumbing between them) or ``stdlib``. The OOM record and
the hang verdict keep every frame with its kind; the reports show the user's and the model's frames and the
innermost frame (where the memory was asked for), and fold the rest into one line. Pure, no torch.
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

KINDS = ("user", "model", "library", "stdlib")
_PACKAGE_DIRS = ("site-packages/", "dist-packages/")
#: zeropilot's own subpackages (guard, runner, ...) and modules: a file under ``zeropilot/<one of them>`` is ours
#: wherever zeropilot is installed, while any other file in a folder that is merely named zeropilot is the user's
#: (``git clone`` names a checkout so: its training scripts, tests/guard/jobs/ here, are user code)
_OWN = [(m.name, m.ispkg) for m in pkgutil.iter_modules([str(Path(__file__).resolve().parents[1])])]
_OWN_PACKAGES = frozenset(name for name, ispkg in _OWN if ispkg)
_OWN_MODULES = frozenset(name + ".py" for name, ispkg in _OWN if not ispkg)
_MODEL_PARTS = ("transformers/models/", "peft/tuners/", "diffusers/models/", "transformers_modules/")
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?/")
#: file names of library plumbing, for frames recorded as ``func (file:line)`` with no folder (older records)
_LIBRARY_NAMES = {"module.py", "functional.py", "engine.py", "hooks.py", "operations.py", "generic.py",
                  "modeling_layers.py", "checkpoint.py", "nvtx.py", "stage3.py", "stage_1_and_2.py", "parameter_offload.py",
                  "partition_parameters.py", "activations.py", "trainer.py", "accelerator.py", "_tensor.py", "__init__.py",
                  "graph.py", "function.py", "utils.py", "torch.py", "comm.py", "distributed_c10d.py", "c10d_logger.py",
                  "serialization.py", "dataloader.py", "fetch.py", "threading.py", "runpy.py", "run.py", "api.py",
                  "data_collator.py", "layer.py", "peft_model.py", "tuners_utils.py", "model.py", "linear.py",
                  "sparse.py", "normalization.py", "loss.py", "loss_utils.py", "integrations.py", "sdpa_attention.py",
                  "masking_utils.py", "file_baton.py", "cpp_extension.py", "subprocess.py", "selectors.py",
                  "modeling_layers.py", "modeling_utils.py", "output_capturing.py", "modeling_outputs.py",
                  "modeling_rope_utils.py", "modeling_flash_attention_utils.py", "import_utils.py", "deprecation.py"}
_STRING = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")


def _is_own(path: str) -> bool:
    """Whether a file is zeropilot's own: ``zeropilot/`` then one of its subpackages or modules."""
    parts = path.split("/")
    return any(parts[i] == "zeropilot" and (parts[i + 1] in _OWN_PACKAGES and i + 2 < len(parts)
                                            or parts[i + 1] in _OWN_MODULES and i + 2 == len(parts))
               for i in range(len(parts) - 1))


def kind_of(path: str) -> str:
    """``user``, ``model``, ``library`` or ``stdlib`` for a frame's file path (a bare file name: a guess)."""
    p = path.replace("\\", "/")
    name = p.rsplit("/", 1)[-1]
    if any(m in p for m in _MODEL_PARTS):
        return "model"
    if any(d in p for d in _PACKAGE_DIRS) or _is_own(p):
        return "library"
    if _STDLIB.search(p) or p.startswith("<frozen"):
        return "stdlib"
    if name in _LIBRARY_NAMES and "/" not in p:
        return "library"
    return "model" if name.startswith("modeling_") else "user"


def short_path(path: str) -> str:
    """A frame's file as shown: relative to ``site-packages`` for installed code, the file name otherwise."""
    p = path.replace("\\", "/")
    for d in _PACKAGE_DIRS:
        if d in p:
            return p.split(d, 1)[1]
    return p.rsplit("/", 1)[-1]


def frame(func: str, path: str, line: Optional[int]) -> Dict[str, Any]:
    """One frame as recorded: function, file (full path), line and kind."""
    return {"func": func, "file": path, "line": line, "kind": kind_of(path)}


def text(f: Dict[str, Any]) -> str:
    return f"{f.get('func')} ({short_path(str(f.get('file') or '?'))}:{f.get('line')})"


def _parse(s: str) -> Dict[str, Any]:
    m = _STRING.match(s)
    if not m:
        return {"func": s, "file": "?", "line": None, "kind": "library"}
    return {"func": m.group("func"), "file": m.group("file"), "line": int(m.group("line")),
            "kind": kind_of(m.group("file"))}


def display(where: Sequence[str], frames: Optional[Sequence[Dict[str, Any]]] = None,
            limit: int = 8) -> Tuple[List[str], List[str]]:
    """(shown, folded): the frames to show, innermost last, and the library frames folded away.

    Shown: the user's and the model's frames (the innermost ``limit``), the library call the innermost of them made
    (the API the user called: ``save_checkpoint``, ``backward``), then the innermost frame of all when it is
    library code (where the allocation or the wait happened). Folded: every other frame, as text. ``frames`` are
    the recorded objects (with full paths); without them the ``where`` strings are classified by file name.
    """
    parsed = [dict(f, kind=f.get("kind") or kind_of(str(f.get("file") or ""))) for f in frames or []
              if isinstance(f, dict)] or [_parse(s) for s in where if isinstance(s, str)]
    if not parsed:
        return [], []
    own = [i for i, f in enumerate(parsed) if f["kind"] in ("user", "model")][-limit:]
    keep = set(own)
    if own and own[-1] + 1 < len(parsed):
        keep.add(own[-1] + 1)
    keep.add(len(parsed) - 1)
    shown = [text(parsed[i]) if frames else where[i] for i in sorted(keep)]
    folded = [text(f) if frames else where[i] for i, f in enumerate(parsed) if i not in keep]
    return shown, folded


def folded_line(folded: Sequence[str]) -> str:
    """``12 library frames folded (module.py x6, ...)``: the folded frames counted by file."""
    counts: Dict[str, int] = {}
    for s in folded:
        m = _STRING.match(s)
        name = (m.group("file") if m else s).rsplit("/", 1)[-1]
        counts[name] = counts.get(name, 0) + 1
    parts = [f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items(), key=lambda x: -x[1])[:4]]
    return f"{len(folded)} library frame(s) folded ({', '.join(parts)}{', ...' if len(counts) > 4 else ''})"
