"""What a command needs beyond the core (PyYAML, packaging), and the one line that says so when it is missing.

The core (``check``, ``plan``, ``report``) imports no torch. ``ckpt`` reads checkpoints without it but needs it to
cast, merge and verify tensors; ``repro`` and ``calibrate`` start processes that train or measure with torch (and
DeepSpeed, transformers, PEFT); ``run`` starts the user's launcher. Each says what is missing, and the extra of
``pyproject.toml`` that brings it, in one line (exit 2) before it starts anything: never a worker's traceback.
``tests/test_extras.py`` holds :data:`EXTRAS` and ``pyproject.toml`` in step.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, List, Optional, Sequence

from zeropilot.errors import InputError

#: extra -> the modules it brings, as ``[project.optional-dependencies]`` of pyproject.toml declares them
EXTRAS = {
    "ckpt": ("torch", "safetensors"),
    "hf": ("torch", "safetensors", "transformers", "peft"),
    "repro": ("torch", "deepspeed", "transformers", "peft"),
    "calibrate": ("torch", "deepspeed"),
}

#: launcher program -> the package that installs it (``zeropilot run`` starts it as the user wrote it)
PROGRAMS = {"deepspeed": "deepspeed", "ds": "deepspeed", "torchrun": "torch", "accelerate": "accelerate",
            "llamafactory-cli": "llamafactory", "lmf": "llamafactory"}


def missing(modules: Sequence[str]) -> List[str]:
    """The modules that cannot be imported here, found without importing them (torch's import takes seconds)."""
    return [name for name in modules if _spec(name) is None]


def _spec(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that fails to import; a module without a spec
        return None


def _line(command: str, why: str, extra: str, gone: Sequence[str]) -> str:
    names = " and ".join(gone) if len(gone) < 3 else ", ".join(gone[:-1]) + f" and {gone[-1]}"
    return (f"`zeropilot {command}` {why}: {names} {'is' if len(gone) == 1 else 'are'} not installed here; "
            f"pip install 'zeropilot[{extra}]', or run zeropilot in the environment your training uses")


def need(command: str, why: str, extra: str, modules: Optional[Sequence[str]] = None) -> None:
    """Refuse, naming ``extra``, when one of ``modules`` (default: the extra's) is missing.

    Raises:
        InputError: one line: what the command does with them, which are missing, what to install.
    """
    gone = missing(EXTRAS[extra] if modules is None else modules)
    if gone:
        raise InputError(_line(command, why, extra, gone))


def load(module: str, command: str, why: str, extra: str) -> Any:
    """``module`` imported, or the same one line as :func:`need` when it cannot be (for commands that use it
    in-process, where a module that is there but fails to import counts as missing too)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(_line(command, why, extra, [exc.name or module])) from None


def program_hint(program: str) -> str:
    """`` (it comes with the deepspeed package ...)`` for a launcher ``zeropilot run`` could not start, or ''."""
    package = PROGRAMS.get(program.rsplit("/", 1)[-1])
    if package is None:
        return ""
    return (f": it comes with the {package} package; run zeropilot in the environment your training uses, or "
            f"pip install {package}")
