"""Load DeepSpeed checkpoint files without running pickled code.

``torch.load(weights_only=True)`` refuses every global outside torch's own allowlist. DeepSpeed's
files need a handful more; we allow exactly those, each mapped to an inert stand-in class defined
here, so no DeepSpeed code runs (and DeepSpeed need not be installed). Found by walking the pickle
opcodes of every file of real checkpoints written by DeepSpeed 0.19.8 (ZeRO-1/2/3, bf16 and fp32,
raw engine and HF Trainer, full and LoRA); see ``tests/checkpoint/test_safe_load.py``.

A file that needs any other global is refused with :class:`UnsafePickleError`, which names the
global; ``trust_pickle=True`` (CLI ``--trust-pickle``) loads it with ``weights_only=False``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

from zeropilot import extras
from zeropilot.errors import InputError


_RESERVED = frozenset({"args", "value"})


class DeepSpeedObject:
    """Inert stand-in for a plain DeepSpeed object in a checkpoint: keeps its fields, runs nothing."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        """Keep the pickled fields as plain attributes: names of fields only, never ``args``/``value``."""
        if not isinstance(state, dict):
            raise ValueError(f"{type(self).__name__}: a pickled state that is not a dict")
        for key in state:
            if not isinstance(key, str) or not key.isidentifier() or key.startswith("_") or key in _RESERVED:
                raise ValueError(f"{type(self).__name__}: a pickled field named {str(key)[:40]!r}")
        self.__dict__.update(state)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "args")
        return f"{type(self).__name__}({fields or ', '.join(map(repr, getattr(self, 'args', ())))})"


class ZeroStageEnum(DeepSpeedObject):
    """Stand-in for ``deepspeed.runtime.zero.config.ZeroStageEnum`` (an int enum, pickled as a call)."""

    def __init__(self, value: int = 0) -> None:
        super().__init__(value)
        self.value = int(value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return int(self) == other if isinstance(other, int) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)


class LossScaler(DeepSpeedObject):
    """Stand-in for ``deepspeed.runtime.fp16.loss_scaler.LossScaler`` (bf16 and fp32 runs)."""


class DynamicLossScaler(DeepSpeedObject):
    """Stand-in for ``deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler`` (fp16 runs)."""


class FragmentAddress(DeepSpeedObject):
    """Stand-in for ``deepspeed.utils.tensor_fragment.fragment_address`` (ZeRO-1/2 optimizer files)."""


# Globals DeepSpeed checkpoints need beyond torch's own allowlist, by the DeepSpeed versions they
# were seen in. DynamicLossScaler is what fp16 runs pickle instead of LossScaler (same module);
# fp16 training does not run on the CPU accelerator, so it is taken from DeepSpeed's source.
DEEPSPEED_GLOBALS: Dict[str, Tuple[type, str]] = {
    "deepspeed.runtime.zero.config.ZeroStageEnum": (ZeroStageEnum, "0.14.4, 0.19.8: every optimizer file"),
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": (LossScaler, "0.14.4, 0.19.8: bf16/fp32 optimizer files"),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": (DynamicLossScaler, "fp16 optimizer files"),
    "deepspeed.utils.tensor_fragment.fragment_address": (FragmentAddress, "0.14.4, 0.19.8: ZeRO-1/2 optimizer files"),
}


class UnsafePickleError(InputError):
    """A file whose pickle needs a global outside the allowlist."""

    def __init__(self, path: Path, global_name: str) -> None:
        self.global_name = global_name
        super().__init__(
            f"refused to unpickle: it needs the global `{global_name}`, which is not among the ones "
            "DeepSpeed checkpoints use, and loading it could run code from the file. If you trust "
            "whoever wrote it, pass --trust-pickle", path)


class DamagedFileError(InputError):
    """A file torch cannot read: truncated, empty or not written by torch.save."""


def require_torch():
    """The torch module, or an InputError naming the extra to install."""
    return extras.load("torch", "ckpt", "casts, merges or compares these tensors with torch", "ckpt")


#: ``ZeroStageEnum``'s members by name (``deepspeed/runtime/zero/config.py``, 0.14.4 to 0.19.8)
ZERO_STAGE_MEMBERS = {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3, "max_stage": 3}


def enum_member(cls: Any, name: Any) -> ZeroStageEnum:
    """Stand-in for ``builtins.getattr`` in a pickle: only a ``ZeroStageEnum`` member by its name.

    Some Python builds pickle an enum member as ``getattr(ZeroStageEnum, 'optimizer_states')`` instead of
    ``ZeroStageEnum(1)``: seen with Debian 12's Python 3.11.2, whose DeepSpeed optimizer files all need it (3.11.7
    writes the call). Any other use of ``getattr`` could reach any attribute of an allowed class: refused.
    """
    if cls is ZeroStageEnum and isinstance(name, str) and name in ZERO_STAGE_MEMBERS:
        return ZeroStageEnum(ZERO_STAGE_MEMBERS[name])
    raise pickle.UnpicklingError("unrecognized function builtins.getattr: allowed only for a ZeroStageEnum member")


def allowlist() -> List[Tuple[Any, str]]:
    """The (stand-in, global name) pairs passed to ``torch.serialization.safe_globals``."""
    return [(cls, name) for name, (cls, _why) in DEEPSPEED_GLOBALS.items()] + [(enum_member, "builtins.getattr")]


_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)|unrecognized function ([\w.<> ]+)|got <class '([\w.]+)'>")


def load(path, *, trust_pickle: bool = False, mmap: bool = True) -> Any:
    """``torch.load`` of one checkpoint file, on CPU, never executing code unless `trust_pickle`.

    Args:
        path: the ``*_states.pt`` file.
        trust_pickle: load with ``weights_only=False`` (runs whatever the pickle says).
        mmap: map tensor storages from the file instead of reading them (torch zip format only).

    Raises:
        UnsafePickleError: the file needs a global outside :data:`DEEPSPEED_GLOBALS`.
        DamagedFileError: torch cannot read the file.
    """
    torch = require_torch()
    path = Path(path)
    try:
        if trust_pickle:
            return torch.load(str(path), map_location="cpu", mmap=mmap, weights_only=False)
        with torch.serialization.safe_globals(allowlist()):
            return torch.load(str(path), map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafePickleError(path, _global_name(str(exc))) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        if mmap and "mmap" in str(exc):
            return load(path, trust_pickle=trust_pickle, mmap=False)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DamagedFileError(f"cannot read this file ({first}): truncated or damaged", path) from None


def _global_name(message: str) -> str:
    m = _GLOBAL_RE.search(message)
    if not m:
        return message.strip().splitlines()[0]
    return next(g for g in m.groups() if g)
