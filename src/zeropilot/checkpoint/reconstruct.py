"""Reassemble full tensors from ZeRO rank files, one tensor at a time.

The rank files are opened by :mod:`torchzip`, which unpickles their structure without torch and
without running pickled code: every tensor is a :class:`~torchzip.StoredTensor`, a byte range of its
file. A tensor's pieces are then copied file to file or read in bounded blocks, so resident memory
stays about one block, whatever the model size; the full fp32 state is never held, and torch is not
imported unless values must be cast or computed. A file torchzip does not understand (the legacy
non-zip format, a global outside the DeepSpeed set) falls back to ``torch.load(weights_only=True)``
through :mod:`safe_load`, its tensors wrapped as :class:`LoadedTensor`.

The layout of the flat partitions is DeepSpeed's (0.19.8, the same rules as its
``zero_to_fp32.py``):

* ZeRO-1/2: per parameter group, rank ``r`` holds elements ``[r*L, (r+1)*L)`` of the group's flat
  vector; parameters follow one another in ``param_shapes`` order, each followed by its alignment
  padding (``param_alignment_paddings``). Frozen parameters are whole in ``frozen_param_fragments``.
* ZeRO-3: every parameter is cut into ``ceil(numel/world)`` elements per rank, laid one after
  another in each rank's flat groups; frozen parameters are cut the same way, in each rank's
  ``frozen_param_fragments``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Protocol, Tuple

from zeropilot.checkpoint import consistency, fsguard, safe_load, torchzip
from zeropilot.checkpoint.consistency import DamagedCheckpoint
from zeropilot.checkpoint.fsguard import Confinement
from zeropilot.checkpoint.layout import CheckpointLayout
from zeropilot.checkpoint.terminal import clean

TRAINABLE, FROZEN, BUFFER = "trainable", "frozen", "buffer"
__all__ = ["DamagedCheckpoint", "ZeroState", "TensorEntry", "open_checkpoint", "load_file"]


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the saved module, where it lives and in which dtype it is stored."""

    name: str
    shape: Tuple[int, ...]
    source: str  # TRAINABLE (fp32 master in the optimizer files), FROZEN or BUFFER
    dtype: str  # torch dtype name of the stored values, e.g. "float32", "bfloat16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Piece(Protocol):
    """Stored values of a tensor: a :class:`torchzip.StoredTensor` or, from the fallback, a :class:`LoadedTensor`."""

    dtype: str
    numel: int
    nbytes: int

    def narrow(self, start: int, length: int) -> "Piece": ...

    def span(self) -> Optional[Tuple[str, int]]: ...

    def blocks(self, block_bytes: int = ...) -> Iterator[memoryview]: ...

    def to_torch(self): ...


@dataclass
class ZeroState:
    """An opened ZeRO checkpoint: what tensors it holds and how to read each one."""

    layout: CheckpointLayout
    stage: int
    world_size: int
    ds_version: Optional[str]
    entries: List[TensorEntry]
    aliases: Dict[str, str]  # shared (tied) parameter name -> the name whose values it shares
    absent: List[str]  # module keys with no values in the checkpoint (frozen, excluded at save)
    module_dtype: Optional[str]  # dtype of the saved 16-bit module (training dtype)
    state_names: List[str] = field(default_factory=list)  # per-element optimizer state (open with need_states)
    optimizer: Optional[dict] = field(repr=False, default=None)  # rank 0's optimizer_state_dict (need_states)
    _model_states: List[dict] = field(repr=False, default_factory=list)
    _flat: List[List[Piece]] = field(repr=False, default_factory=list)  # [rank][group] flat fp32
    _states: List[List[Dict[str, Piece]]] = field(repr=False, default_factory=list)  # [rank][group] name -> flat
    _groups: Dict[str, int] = field(repr=False, default_factory=dict)  # trainable name -> its parameter group
    _chunks: Dict[str, List[Tuple[int, int, int, int]]] = field(repr=False, default_factory=dict)

    def entry(self, name: str) -> TensorEntry:
        return self._by_name[name]

    @property
    def _by_name(self) -> Dict[str, TensorEntry]:
        return {e.name: e for e in self.entries}

    def read(self, entry: TensorEntry, dtype=None):
        """The full tensor of `entry` as a torch tensor, cast to `dtype` (floating tensors only) if given."""
        torch = safe_load.require_torch()
        target = dtype if (dtype is not None and _is_float(entry.dtype)) else getattr(torch, entry.dtype)
        out = torch.empty(entry.numel, dtype=target)
        pos = 0
        for piece in self.pieces(entry):
            out[pos:pos + piece.numel].copy_(piece.to_torch())
            pos += piece.numel
        return out.view(entry.shape)

    def pieces(self, entry: TensorEntry, state: Optional[str] = None) -> Iterator[Piece]:
        """1-D pieces of the stored values of `entry`, in order (where they lie; nothing read yet).

        `state` names an optimizer state of a trainable entry (``exp_avg``...; open with ``need_states``)
        instead of its fp32 master weights.
        """
        if entry.source == TRAINABLE:
            for rank, group, start, length in self._chunks[entry.name]:
                flat = self._flat[rank][group] if state is None else self._states[rank][group][state]
                yield flat.narrow(start, length)
        elif entry.source == FROZEN:
            yield from self._frozen_pieces(entry)
        else:
            yield self._model_states[0]["module"][entry.name].flat()

    def group_of(self, entry: TensorEntry) -> int:
        """The optimizer's parameter group holding the trainable `entry`."""
        return self._groups[entry.name]

    def module_tensor(self, name: str) -> Optional[Piece]:
        """The saved module's tensor `name` (ZeRO-1/2: the 16-bit weights, tied ones included) as one flat piece."""
        value = (self._model_states[0].get("module") or {}).get(name)
        return value.flat() if value is not None else None

    def module_names(self) -> List[str]:
        return [k for k, v in (self._model_states[0].get("module") or {}).items() if v is not None]

    def _frozen_pieces(self, entry: TensorEntry) -> Iterator[Piece]:
        if self.stage <= 2:
            yield self._model_states[0]["frozen_param_fragments"][entry.name].flat()
            return
        left = entry.numel
        for states in self._model_states:
            frag = states["frozen_param_fragments"][entry.name].flat()
            take = min(left, frag.numel)
            if take:
                yield frag.narrow(0, take)
            left -= take


def _is_float(dtype_name: str) -> bool:
    return dtype_name in ("float32", "float16", "bfloat16", "float64")


class LoadedTensor:
    """A tensor loaded by torch (the fallback reader), with :class:`torchzip.StoredTensor`'s interface."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor

    @property
    def dtype(self) -> str:
        return str(self.tensor.dtype).replace("torch.", "")

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def numel(self) -> int:
        return self.tensor.numel()

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def is_floating_point(self) -> bool:
        return self.tensor.is_floating_point()

    def flat(self) -> "LoadedTensor":
        return LoadedTensor(self.tensor.reshape(-1))

    def narrow(self, start: int, length: int) -> "LoadedTensor":
        return LoadedTensor(self.tensor.narrow(0, start, length))

    def span(self) -> None:
        return None

    def blocks(self, block_bytes: int = 64 << 20) -> Iterator[memoryview]:
        import torch

        raw = self.tensor.contiguous().reshape(-1).view(torch.uint8)
        for start in range(0, raw.numel(), block_bytes):
            yield memoryview(raw[start:start + block_bytes].numpy())

    def to_torch(self):
        return self.tensor


def _wrap(obj, path, budget: List[int], depth: int = 0):
    """`obj` as loaded by torch, its tensors wrapped as :class:`LoadedTensor` and checked.

    The walk spends one unit of `budget` per node visited and stops at torchzip.MAX_DEPTH, so a DAG of
    shared references cannot make it (or anything after it) run for ever.
    """
    budget[0] -= 1
    if budget[0] < 0 or depth > torchzip.MAX_DEPTH:
        raise safe_load.DamagedFileError("the pickle's object graph is too large or too deep for its size: "
                                         "refused", path)
    if hasattr(obj, "data_ptr") and hasattr(obj, "dtype"):
        return LoadedTensor(_checked_tensor(obj, path))
    if isinstance(obj, dict):
        return type(obj)((k, _wrap(v, path, budget, depth + 1)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_wrap(v, path, budget, depth + 1) for v in obj)
    return obj


def _checked_tensor(tensor, path):
    """A tensor torch loaded: dense, on CPU, no more elements than its storage holds."""
    import torch

    if tensor.layout != torch.strided or tensor.device.type != "cpu":
        where = "meta" if tensor.device.type == "meta" else f"{tensor.layout}, {tensor.device}"
        raise safe_load.DamagedFileError(f"holds a tensor without values on CPU ({where}): cannot be exported",
                                         path)
    if tensor.numel() * tensor.element_size() > tensor.untyped_storage().nbytes():
        raise safe_load.DamagedFileError(f"a view of shape {tuple(tensor.shape)} has more elements than its "
                                         "storage (an expanding view): refused", path)
    return tensor


def load_file(path, *, trust_pickle: bool = False, confinement: Optional[Confinement] = None):
    """A checkpoint file's object, tensors as pieces: torch-free where possible, else through torch.

    Without `trust_pickle`, torch's ``weights_only`` loader is used only after :mod:`torchzip` validated
    the archive and asked for it (a global in torch's own allowlist, a strided tensor).

    Raises:
        safe_load.UnsafePickleError: (fallback) the file needs a global outside the allowlist.
        safe_load.DamagedFileError: the file cannot be read, or breaks the format's rules.
    """
    budget = [8 * max(Path(path).stat().st_size if fsguard.kind_of(path) == "file" else 0, 0) + 10_000]
    if trust_pickle:
        os_close(fsguard.open_regular(path, confinement))
        return _wrap(safe_load.load(path, trust_pickle=True), path, budget)
    try:
        loaded = torchzip.load(path, confinement)
    except torchzip.Unsupported as exc:
        if not exc.fallback:
            raise safe_load.DamagedFileError(f"not read: {clean(exc)}", path) from None
        loaded = None
    except OSError as exc:
        raise safe_load.DamagedFileError(f"cannot read this file ({exc})", path) from None
    if loaded is not None and _all_contiguous(loaded):  # pieces are byte ranges: contiguous tensors only
        return loaded
    return _wrap(safe_load.load(path), path, budget)


def os_close(fd: int) -> None:
    import os

    os.close(fd)


def _all_contiguous(obj) -> bool:
    if isinstance(obj, torchzip.StoredTensor):
        return obj.is_contiguous()
    if isinstance(obj, dict):
        return all(_all_contiguous(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_all_contiguous(v) for v in obj)
    return True


def open_checkpoint(layout: CheckpointLayout, *, trust_pickle: bool = False,
                    need_optimizer: bool = True, need_states: bool = False) -> ZeroState:
    """Open the rank files of `layout` (mapped, not read) and work out where every tensor lives.

    `need_states` also locates the optimizer's per-element state (Adam's moments), for the universal
    conversion.

    Raises:
        DamagedCheckpoint: the files are incomplete or inconsistent.
        safe_load.UnsafePickleError: a file needs a global outside the allowlist.
        InputError: (`need_states`) the optimizer's state is in a layout that cannot be converted.
    """
    if layout.stage is None or layout.world_size is None:
        raise DamagedCheckpoint(
            "cannot tell the ZeRO stage and world size: " + "; ".join(layout.unknown.values()),
            [str(f.path) for f in layout.rank_files])
    stage, world = layout.stage, layout.world_size
    model_files = [layout.model_file(0)] if stage <= 2 else [layout.model_file(r) for r in range(world)]
    conf = layout.confinement
    models = [consistency.model_states(load_file(f, trust_pickle=trust_pickle, confinement=conf), f)
              for f in model_files]
    first = models[0]
    state = ZeroState(layout=layout, stage=stage, world_size=world, ds_version=first.raw.get("ds_version"),
                      entries=[], aliases=first.shared, absent=[], module_dtype=_module_dtype(first.raw),
                      _model_states=[m.raw for m in models])
    shapes = first.param_shapes
    _build_entries(state, first)
    optims = []
    if need_optimizer:
        optims = [consistency.optimizer_states(load_file(layout.optim_file(r), trust_pickle=trust_pickle,
                                                         confinement=conf), layout.optim_file(r), stage)
                  for r in range(world)]
    consistency.check_ranks(layout.tag, world, models, optims)
    _check_entries(state, models)
    if need_optimizer:
        state._flat = [[t.flat() for t in o.flat] for o in optims]
        _locate_trainable(state, shapes, optims[0].paddings)
        state._groups = _group_index(state, shapes)
    if need_states:
        state.state_names = consistency.check_group_states(world, optims, stage)
        state._states = [[{k: g[k].flat() for k in state.state_names} for g in o.group_states] for o in optims]
        state.optimizer = optims[0].raw.get("optimizer_state_dict")
    return state


def _group_index(state: ZeroState, shapes: List[dict]) -> Dict[str, int]:
    """name -> parameter group: ZeRO-1/2's param_shapes has one dict per group; ZeRO-3's sub-groups are where
    the parameter's first chunk lies."""
    if state.stage <= 2:
        return {n: g for g, group in enumerate(shapes) for n in group}
    return {n: chunks[0][1] if chunks else 0 for n, chunks in state._chunks.items()}


def _module_dtype(model_states: dict) -> Optional[str]:
    for v in (model_states.get("module") or {}).values():
        if hasattr(v, "is_floating_point") and v.is_floating_point():
            return v.dtype
    return None


def _build_entries(state: ZeroState, first: "consistency.ModelStates") -> None:
    trainable = {n: s for g in first.param_shapes for n, s in g.items()}
    frozen = first.frozen_shapes
    buffers = set(first.buffer_names)
    module = first.module
    names = list(module.keys()) + [n for n in list(trainable) + list(frozen) if n not in module]
    for name in names:
        if name in state.aliases and state.aliases[name] != name:
            continue
        if name in trainable:
            state.entries.append(TensorEntry(name, trainable[name], TRAINABLE, "float32"))
        elif name in frozen:
            frag = first.frozen_fragments.get(name)
            if frag is None:
                raise DamagedCheckpoint(f"frozen parameter {clean(name)!r} has a shape but no values in "
                                        "frozen_param_fragments", [first.path])
            state.entries.append(TensorEntry(name, frozen[name], FROZEN, frag.dtype))
        elif name in buffers and module.get(name) is not None:
            t = module[name]
            state.entries.append(TensorEntry(name, tuple(t.shape), BUFFER, t.dtype))
        else:
            state.absent.append(name)


def _check_entries(state: ZeroState, models: List["consistency.ModelStates"]) -> None:
    """Names writable to safetensors, aliases pointing at saved tensors, frozen fragments of the right
    size on every rank, and no more stored bytes claimed than the model files hold."""
    first = models[0]
    names = [(e.name, first.path) for e in state.entries]
    names += [(a, first.path) for a in state.aliases if a not in state._by_name]
    consistency.check_names(names)
    for e in state.entries:
        if e.source == FROZEN:
            _check_fragments(state, e, models)
    claimed = sum(e.numel * torchzip.ITEMSIZE.get(e.dtype, 8) for e in state.entries if e.source != TRAINABLE)
    held = sum(Path(m.path).stat().st_size for m in models)
    if claimed > held:
        raise DamagedCheckpoint(f"the module's buffers and frozen weights claim {claimed} bytes, more than the "
                                f"model files hold ({held}): views sharing one storage", [first.path])


def _check_fragments(state: ZeroState, entry: TensorEntry, models) -> None:
    want = entry.numel if state.stage <= 2 else math.ceil(entry.numel / state.world_size)
    for rank, m in enumerate(models):
        frag = m.frozen_fragments.get(entry.name)
        if frag is None or frag.numel != want:
            have = "none" if frag is None else f"{frag.numel} values"
            raise DamagedCheckpoint(f"rank {rank}: frozen_param_fragments[{clean(entry.name)!r}] holds {have}, "
                                    f"its shape {entry.shape} needs {want} on this rank", [m.path])


def _locate_trainable(state: ZeroState, shapes: List[dict], paddings) -> None:
    files = [str(state.layout.optim_file(0))]
    if state.stage <= 2 and len(shapes) != len(state._flat[0]):
        raise DamagedCheckpoint(f"param_shapes has {len(shapes)} groups, the optimizer partitions "
                                f"{len(state._flat[0])}", files)
    if state.stage <= 2 and paddings is not None and [len(p) for p in paddings] != [len(g) for g in shapes]:
        raise DamagedCheckpoint("optimizer_state_dict.param_alignment_paddings does not have one entry per "
                                "parameter of param_shapes", files)
    if state.stage <= 2:
        _locate_zero12(state, shapes, paddings)
    else:
        _locate_zero3(state, shapes)


def _locate_zero12(state: ZeroState, shapes: List[dict], paddings) -> None:
    world = state.world_size
    for g, group in enumerate(shapes):
        starts = [0]
        for r in range(world):
            starts.append(starts[-1] + state._flat[r][g].numel)
        offset = 0
        for i, (name, shape) in enumerate(group.items()):
            n = math.prod(shape)
            chunks = []
            for r in range(world):
                lo, hi = max(offset, starts[r]), min(offset + n, starts[r + 1])
                if lo < hi:
                    chunks.append((r, g, lo - starts[r], hi - lo))
            if sum(c[3] for c in chunks) != n:
                raise _overrun(state, name)
            state._chunks[name] = chunks
            offset += n + (paddings[g][i] if paddings else 0)
        align = 2 * world
        if math.ceil(offset / align) * align != math.ceil(starts[-1] / align) * align:
            raise _overrun(state, None, offset, starts[-1])


def _locate_zero3(state: ZeroState, shapes: List[dict]) -> None:
    world = state.world_size
    bounds = [0]
    for t in state._flat[0]:
        bounds.append(bounds[-1] + t.numel)
    offset = 0
    for name, shape in ((n, s) for g in shapes for n, s in g.items()):
        n = math.prod(shape)
        per_rank = math.ceil(n / world)
        if offset + per_rank > bounds[-1]:
            raise _overrun(state, name)
        chunks, left = [], n
        for r in range(world):
            for g, start, length in _spans(bounds, offset, min(per_rank, left)):
                chunks.append((r, g, start, length))
            left -= min(per_rank, left)
        state._chunks[name] = chunks
        offset += per_rank
    if offset != bounds[-1]:
        raise _overrun(state, None, offset * world, bounds[-1] * world)


def _spans(bounds: List[int], start: int, length: int) -> Iterator[Tuple[int, int, int]]:
    """(group, start in group, length) pieces of [start, start+length) over groups ending at `bounds`."""
    end = start + length
    for g in range(len(bounds) - 1):
        lo, hi = max(start, bounds[g]), min(end, bounds[g + 1])
        if lo < hi:
            yield g, lo - bounds[g], hi - lo


def _overrun(state: ZeroState, name: Optional[str], used: int = 0, avail: int = 0) -> DamagedCheckpoint:
    files = [str(state.layout.optim_file(r)) for r in range(state.world_size)]
    if name:
        return DamagedCheckpoint(f"the optimizer partitions end before parameter {name}: they hold fewer "
                                 "values than param_shapes needs", files)
    return DamagedCheckpoint(f"the saved shapes use {used} values but the partitions hold {avail}", files)
