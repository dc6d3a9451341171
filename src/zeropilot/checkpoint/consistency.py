"""Proofs that the rank files of one tag fit together and describe valid tensors, before any export.

Two kinds of failure, two exits:

* **Shape of one file** (:func:`model_states`, :func:`optimizer_states`): a field missing or of the wrong
  type (model states that are a list, a string where DeepSpeed writes an int, no ``param_shapes``).
  The file is not a DeepSpeed checkpoint file: :class:`~zeropilot.checkpoint.safe_load.DamagedFileError`,
  one line, exit 2.
* **Agreement between files** (:func:`check_ranks`): every rank from the same run and step — equal
  ``ds_config``, ``ds_version``, ``global_steps`` (and the tag ``global_stepN``), ``param_shapes``,
  ``partition_count``, Adam's ``step``, equal partition sizes (DeepSpeed pads ZeRO-1/2 groups to a
  multiple of the world size, ZeRO-3 cuts every parameter in equal parts), valid shapes, names a
  safetensors file can hold. A :class:`DamagedCheckpoint` names the rank, the field and the file:
  exit 1, nothing exported.

DeepSpeed 0.19.8's field names (FACTS.md C): model states ``module``, ``param_shapes``,
``frozen_param_shapes``, ``frozen_param_fragments``, ``buffer_names``, ``shared_params``,
``global_steps``, ``ds_config``, ``ds_version``; optimizer states ``optimizer_state_dict`` with
``partition_count``, ``zero_stage``, ``single_partition_of_fp32_groups`` (ZeRO-1/2) or
``fp32_flat_groups`` (ZeRO-3), and the base optimizer's state under ``base_optimizer_state`` (ZeRO-1/2)
or ``optimizer_state_dict`` (ZeRO-3).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.checkpoint.names import GLOBAL_STEP_RE
from zeropilot.checkpoint.safe_load import DamagedFileError
from zeropilot.checkpoint.terminal import clean
from zeropilot.errors import InputError

MAX_DIMS = 64
MAX_INT = 1 << 62
MAX_NAME = 4096
_BAD_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class DamagedCheckpoint(Exception):
    """The rank files disagree with each other or with the saved shapes; ``files`` names them."""

    def __init__(self, message: str, files: List[str]) -> None:
        super().__init__(message)
        self.files = files


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "numel") and hasattr(v, "dtype") and hasattr(v, "narrow")


def _field_error(path, field: str, expected: str, value: Any) -> DamagedFileError:
    found = type(value).__name__ if value is not None else "nothing"
    return DamagedFileError(f"field {field}: expected {expected}, found {found}: not a DeepSpeed checkpoint file",
                            path)


def _dict(obj: Any, field: str, path, required: bool = True) -> Optional[dict]:
    if obj is None and not required:
        return None
    if not isinstance(obj, dict):
        raise _field_error(path, field, "a dict", obj)
    for k in obj:
        if not isinstance(k, (str, int)):
            raise _field_error(path, f"{field} key", "a string", k)
    return obj


def shape_of(value: Any, field: str, path) -> Tuple[int, ...]:
    """`value` as a shape: a tuple/list of at most MAX_DIMS ints in [0, 2**62), product < 2**62."""
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS:
        raise _field_error(path, field, f"a shape (a sequence of at most {MAX_DIMS} ints)", value)
    for d in value:
        if type(d) is not int:
            raise _field_error(path, field, "a shape of ints", d)
        if not 0 <= d < MAX_INT:
            raise DamagedFileError(f"field {field}: dimension {d if abs(d) < MAX_INT else 'out of range'} "
                                   "is not a size (negative or huge)", path)
    shape = tuple(value)
    if math.prod(shape) >= MAX_INT:
        raise DamagedFileError(f"field {field}: {shape} holds more than 2**62 elements", path)
    return shape


def name_problem(name: Any) -> Optional[str]:
    """Why `name` cannot be a tensor name in a safetensors file (None when it can)."""
    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if not name:
        return "empty"
    if name == "__metadata__":
        return "`__metadata__`, which safetensors reserves for the file's metadata"
    if len(name) > MAX_NAME:
        return f"{len(name)} characters long"
    if any(unicodedata.category(c) in _BAD_NAME_CATEGORIES for c in name if not c.isascii() or not c.isprintable()):
        return "holding control, format or unpaired surrogate characters"
    return None


@dataclass
class ModelStates:
    """The fields of one model-states file that reconstruction uses, checked."""

    path: str
    raw: dict
    module: dict
    param_shapes: List[Dict[str, Tuple[int, ...]]]
    frozen_shapes: Dict[str, Tuple[int, ...]]
    frozen_fragments: dict
    buffer_names: List[str]
    shared: Dict[str, str]


def model_states(obj: Any, path) -> ModelStates:
    """Check the shape of one ``*_model_states.pt`` object. Raises DamagedFileError naming the field."""
    top = _dict(obj, "(top level)", path)
    module = _dict(top.get("module"), "module", path)
    for k, v in module.items():
        if not (_is_tensor(v) or v is None):
            raise _field_error(path, f"module[{clean(k)!r}]", "a tensor", v)
    groups = top.get("param_shapes")
    if isinstance(groups, dict):
        groups = [groups]
    if not isinstance(groups, list):
        raise _field_error(path, "param_shapes", "a list of {name: shape} dicts", groups)
    shapes = []
    for i, g in enumerate(groups):
        g = _dict(g, f"param_shapes[{i}]", path)
        shapes.append({n: shape_of(s, f"param_shapes[{i}][{clean(n)!r}]", path) for n, s in g.items()})
    frozen = _dict(top.get("frozen_param_shapes"), "frozen_param_shapes", path, required=False) or {}
    frozen_shapes = {n: shape_of(s, f"frozen_param_shapes[{clean(n)!r}]", path) for n, s in frozen.items()}
    fragments = _dict(top.get("frozen_param_fragments"), "frozen_param_fragments", path, required=False) or {}
    for n, v in fragments.items():
        if not _is_tensor(v):
            raise _field_error(path, f"frozen_param_fragments[{clean(n)!r}]", "a tensor", v)
    buffers = top.get("buffer_names") or []
    if not isinstance(buffers, (list, tuple, set)) or not all(isinstance(b, str) for b in buffers):
        raise _field_error(path, "buffer_names", "a list of strings", buffers)
    shared = _dict(top.get("shared_params"), "shared_params", path, required=False) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in shared.items()):
        raise _field_error(path, "shared_params", "a {name: name} dict of strings", shared)
    for field in ("global_steps", "global_samples", "skipped_steps", "dp_world_size"):
        if top.get(field) is not None and type(top[field]) is not int:
            raise _field_error(path, field, "an int", top[field])
    if top.get("ds_version") is not None and not isinstance(top["ds_version"], str):
        raise _field_error(path, "ds_version", "a string", top["ds_version"])
    return ModelStates(str(path), top, module, shapes, frozen_shapes, fragments, list(buffers), dict(shared))


@dataclass
class OptimizerStates:
    """The fields of one ``*_optim_states.pt`` object that reconstruction and the proofs use, checked."""

    path: str
    raw: dict
    flat: list  # the fp32 partition of each parameter group (1-D)
    partition_count: Optional[int]
    paddings: Optional[List[List[int]]]
    steps: List[Optional[float]]  # the base optimizer's `step` per state entry
    group_paddings: Optional[List[int]] = None  # ZeRO-1/2: padding cut from this rank's partition at save
    group_states: Optional[List[dict]] = None  # per group: the base optimizer's state entry (exp_avg, step...)
    group_states_missing: Optional[str] = None  # why `group_states` is None
    param_groups: Optional[list] = None  # the base optimizer's param_groups (lr, betas, ...)


def optimizer_states(obj: Any, path, stage: int) -> OptimizerStates:
    """Check the shape of one ``*_optim_states.pt`` object for ZeRO `stage`. Raises DamagedFileError."""
    top = _dict(obj, "(top level)", path)
    osd = _dict(top.get("optimizer_state_dict"), "optimizer_state_dict", path)
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    flat = osd.get(key)
    if not isinstance(flat, list) or not all(_is_tensor(t) for t in flat):
        raise _field_error(path, f"optimizer_state_dict.{key}", f"a list of tensors (ZeRO-{stage})", flat)
    count = osd.get("partition_count")
    counts = count if isinstance(count, list) else [count]
    if count is not None and not all(type(c) is int and 0 < c < MAX_INT for c in counts):
        raise _field_error(path, "optimizer_state_dict.partition_count", "a positive int or a list of them", count)
    paddings = osd.get("param_alignment_paddings")
    if paddings is not None and not (isinstance(paddings, list) and all(
            isinstance(g, list) and all(type(p) is int and 0 <= p < MAX_INT for p in g) for g in paddings)):
        raise _field_error(path, "optimizer_state_dict.param_alignment_paddings", "lists of ints", paddings)
    group_paddings = osd.get("group_paddings")
    if group_paddings is not None and not (isinstance(group_paddings, list) and len(group_paddings) == len(flat)
                                           and all(type(p) is int and 0 <= p < MAX_INT for p in group_paddings)):
        raise _field_error(path, "optimizer_state_dict.group_paddings", "one int per parameter group", group_paddings)
    base = osd.get("base_optimizer_state" if stage <= 2 else "optimizer_state_dict")
    states, missing = _group_states(base, len(flat), stage)
    groups = base.get("param_groups") if isinstance(base, dict) else None
    return OptimizerStates(str(path), top, flat, None if count is None else max(counts), paddings, _steps(base),
                           group_paddings, states, missing, groups if isinstance(groups, list) else None)


def _group_states(base: Any, groups: int, stage: int) -> Tuple[Optional[List[dict]], Optional[str]]:
    """The base optimizer's state entry of each flat group (keyed 0..groups-1, as DeepSpeed's flat groups
    are its parameters), or None and why: read only by the universal conversion, which needs them."""
    where = "base_optimizer_state" if stage <= 2 else "optimizer_state_dict.optimizer_state_dict"
    if isinstance(base, list):
        return None, f"{where} is a list (saved with elastic_checkpoint): not supported"
    state = base.get("state") if isinstance(base, dict) else None
    if not isinstance(state, dict):
        return None, f"{where}.state is missing"
    if set(state) - set(range(groups)):
        return None, f"{where}.state has entries for other than its {groups} parameter groups"
    out = []
    for g in range(groups):
        entry = state.get(g, {})
        if not isinstance(entry, dict) or not all(isinstance(k, str) for k in entry):
            return None, f"{where}.state[{g}] is not a {{name: value}} dict"
        out.append(entry)
    return out, None


def _steps(base: Any) -> List[Optional[float]]:
    state = base.get("state") if isinstance(base, dict) else None
    if not isinstance(state, dict):
        return []
    steps = []
    for entry in state.values():
        step = entry.get("step") if isinstance(entry, dict) else None
        steps.append(_number(step))
    return steps


def _number(value: Any) -> Optional[float]:
    if type(value) in (int, float):
        return float(value)
    if hasattr(value, "scalar"):
        return value.scalar()
    if hasattr(value, "tensor") and getattr(value, "numel", 0) == 1:
        return float(value.tensor.item())
    return None


# ---- agreement between ranks ------------------------------------------------------------------------

_RUN_FIELDS = ("ds_config", "ds_version")
_MODEL_FIELDS = ("global_steps", "global_samples", "skipped_steps", "dp_world_size", "param_shapes",
                 "frozen_param_shapes", "buffer_names")  # shared_params: ZeRO-3 writes it on rank 0 only


def check_ranks(tag: str, world: int, models: List[ModelStates], optims: List[OptimizerStates]) -> None:
    """Prove the rank files belong to one run and one step. Raises DamagedCheckpoint naming rank and field."""
    first = models[0]
    for field in _RUN_FIELDS:
        want = first.raw.get(field)
        for rank, other in _all_files(models, optims):
            got = other.raw.get(field)
            if want is not None and got is not None and got != want:
                raise _disagree(rank, other.path, field, first.path)
    for rank, other in enumerate(models[1:], start=1):
        for field in _MODEL_FIELDS:
            if other.raw.get(field) != first.raw.get(field):
                raise _disagree(rank, other.path, field, first.path)
    _check_tag_step(tag, first)
    dp = first.raw.get("dp_world_size")
    if type(dp) is int and dp != world:
        raise DamagedCheckpoint(f"model states field dp_world_size is {dp}, but the tag folder holds {world} "
                                "ranks of optimizer files", [first.path])
    _check_optimizers(world, optims)


def _all_files(models, optims):
    for rank, m in enumerate(models):
        yield rank, m
    for rank, o in enumerate(optims):
        yield rank, o


def _disagree(rank: int, path: str, field: str, reference: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(f"rank {rank}: field {field} differs from rank 0's ({Path(reference).name}): "
                             "files of different runs or steps are mixed in one tag folder", [path])


def _check_tag_step(tag: str, first: ModelStates) -> None:
    m = GLOBAL_STEP_RE.match(tag)
    steps = first.raw.get("global_steps")
    if m and type(steps) is int and int(m.group(1)) != steps:
        raise DamagedCheckpoint(f"the tag {clean(tag)} names step {m.group(1)}, but the model states field "
                                f"global_steps is {steps}: files of another step", [first.path])


def _check_optimizers(world: int, optims: List[OptimizerStates]) -> None:
    ref = optims[0]
    for rank, o in enumerate(optims):
        if o.partition_count is not None and o.partition_count != world:
            raise DamagedCheckpoint(f"rank {rank}: field optimizer_state_dict.partition_count is "
                                    f"{o.partition_count}, not {world}: written by a run of another size "
                                    "(files of two runs mixed in one tag folder?)", [o.path])
        if len(o.steps) != len(ref.steps):
            raise DamagedCheckpoint(f"rank {rank}: the optimizer keeps state for {len(o.steps)} parameter group(s), "
                                    f"rank 0's for {len(ref.steps)}: optimizer files of different runs", [o.path])
        if o.steps != ref.steps:
            raise DamagedCheckpoint(f"rank {rank}: the optimizer's step is {_fmt(o.steps)}, rank 0's is "
                                    f"{_fmt(ref.steps)}: optimizer files of different steps", [o.path])
        if len(o.flat) != len(ref.flat):
            raise DamagedCheckpoint(f"rank {rank}: {len(o.flat)} parameter groups, rank 0 has {len(ref.flat)}",
                                    [o.path])
        for g, (mine, theirs) in enumerate(zip(o.flat, ref.flat)):
            if mine.dtype != "float32":
                raise DamagedCheckpoint(f"rank {rank}: fp32 partition of group {g} is {mine.dtype}, not float32",
                                        [o.path])
            if _padded(o, g, mine) != _padded(ref, g, theirs):
                raise DamagedCheckpoint(
                    f"rank {rank}: the fp32 partition of group {g} holds {mine.numel} values (padding "
                    f"{_pad(o, g)}), rank 0's {theirs.numel} (padding {_pad(ref, g)}): DeepSpeed cuts every group "
                    "in equal parts (ZeRO-1/2 drop the last rank's padding, recorded in group_paddings)", [o.path])


def _pad(o: OptimizerStates, g: int) -> int:
    return o.group_paddings[g] if o.group_paddings else 0


def _padded(o: OptimizerStates, g: int, t) -> int:
    return t.numel + _pad(o, g)


def _fmt(steps: List[Optional[float]]) -> str:
    values = sorted({s for s in steps if s is not None})
    return ", ".join(f"{v:g}" for v in values[:4]) or "unknown"


def check_names(names: List[Tuple[str, str]]) -> None:
    """Every (name, file) a valid, unique safetensors tensor name. Raises DamagedCheckpoint."""
    seen = set()
    for name, path in names:
        why = name_problem(name)
        if why:
            raise DamagedCheckpoint(f"tensor name {clean(name)[:80]!r} is {why}: it cannot be written to "
                                    "safetensors", [path])
        if name in seen:
            raise DamagedCheckpoint(f"tensor name {clean(name)[:80]!r} appears twice (trainable, frozen or "
                                    "buffer)", [path])
        seen.add(name)


def check_group_states(world: int, optims: List[OptimizerStates], stage: int) -> List[str]:
    """Prove the base optimizer's per-parameter state (Adam's ``exp_avg``, ``exp_avg_sq``...) lies like the fp32
    partitions: the same names in every group on every rank, each a float tensor of the partition's size
    (ZeRO-1/2: the last rank's may keep its ``group_paddings``). Returns those names, in rank 0's order.

    Raises:
        InputError: the optimizer's state is in a layout the universal conversion does not read.
        DamagedCheckpoint: a rank's state disagrees with its partitions or with rank 0's.
    """
    for o in optims:
        if o.group_states is None:
            raise InputError(f"the optimizer state cannot be converted: {o.group_states_missing}", o.path)
    names = [k for k, v in optims[0].group_states[0].items() if _is_tensor(v) and len(getattr(v, "shape", ())) >= 1]
    for rank, o in enumerate(optims):
        for g, (entry, flat) in enumerate(zip(o.group_states, o.flat)):
            have = [k for k, v in entry.items() if _is_tensor(v) and len(getattr(v, "shape", ())) >= 1]
            if set(have) != set(names):  # the order may differ: DeepSpeed's universal loader fills them from a set
                raise DamagedCheckpoint(f"rank {rank}, group {g}: the optimizer keeps {', '.join(have) or 'nothing'} "
                                        f"per element, rank 0's group 0 {', '.join(names) or 'nothing'}", [o.path])
            sizes = {flat.numel, flat.numel + _pad(o, g)}
            for key in names:
                t = entry[key]
                if t.dtype not in ("float32", "float16", "bfloat16", "float64") or len(t.shape) != 1:
                    raise DamagedCheckpoint(f"rank {rank}: optimizer state {clean(key)!r} of group {g} is a "
                                            f"{t.dtype} tensor of shape {tuple(t.shape)}, not a flat float one",
                                            [o.path])
                if t.numel not in sizes:
                    raise DamagedCheckpoint(f"rank {rank}: optimizer state {clean(key)!r} of group {g} holds "
                                            f"{t.numel} values, its fp32 partition {flat.numel}", [o.path])
    return names
