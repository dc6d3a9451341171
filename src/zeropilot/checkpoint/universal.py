"""Convert a ZeRO checkpoint into DeepSpeed's universal checkpoint, parameter by parameter (``ckpt universal``).

A ZeRO checkpoint resumes only on the world size that wrote it: each rank's optimizer file holds that
rank's slice of every flat group. DeepSpeed's universal layout holds every parameter whole, so a run can
resume on any number of ranks (``"checkpoint": {"load_universal": true}``; the loader cuts the slices
anew). What DeepSpeed 0.19.8's loader reads, and so what is written (the same files and objects as its
``ds_to_universal.py``):

* ``OUT/latest_universal``: the tag (``engine.load_checkpoint(OUT)`` reads it when ``load_universal`` is on);
* ``OUT/<tag>/`` the model-states files, copied (the loader reads rank 0's for the step counters, the
  learning-rate schedule and the client state; ZeRO-3's files of every rank, as DeepSpeed copies them);
* ``OUT/<tag>/zero/<param>/fp32.pt`` (fp32 master weights), ``exp_avg.pt``, ``exp_avg_sq.pt`` (or whatever
  per-element state the optimizer keeps), and for ZeRO-1/2 ``step.pt``. ZeRO-1/2 files hold
  ``{"cat_dim": 0, "param": tensor of the parameter's shape}`` and ``step.pt`` the step as saved; ZeRO-3's hold
  the flat tensor itself (that loader reshapes nothing);
* ZeRO-1/2 also write ``fp32.pt`` (``{"param": ...}``, cast to fp32) for every tensor of the saved module that
  has no optimizer state: frozen weights, tied aliases and buffers, as DeepSpeed's converter does (its loader
  reads only trainable parameters: frozen ones keep the values the model was built with); ZeRO-3 writes
  nothing for them, as DeepSpeed does;
* ``OUT/<tag>/zero/optimizer_state.pt``: rank 0's optimizer fields without the partitions (loss scaler,
  clipping, ZeRO stage, ``ds_version``...) plus ``param_groups``. For ZeRO-3 only the Adam ``step`` of each
  group is kept from the base optimizer's state: DeepSpeed copies rank 0's whole partition there too, which
  its loader never reads;
* the Hugging Face files beside the checkpoint (``trainer_state.json``, config, tokenizer, adapter config,
  ``rng_state_N.pth``...) at OUT's top, so ``Trainer.train(resume_from_checkpoint=OUT)`` finds them. No
  ``latest`` is written: a load without ``load_universal`` fails at once instead of finding no optimizer files
  and silently restarting the optimizer.

Every ``.pt`` file is a ``torch.save`` archive written by :mod:`torchzip_writer` without torch: values are
copied from the byte ranges of the rank files that hold them, so memory stays bounded whatever the model
size, and each archive is read back (:mod:`torchzip`) before OUT is renamed into place. Torch is imported
only to cast a frozen fp16 tensor to fp32 (bf16 is widened by moving bytes).

Hostile input: the same reading rules as ``export`` (:mod:`torchzip`, :mod:`fsguard`, the proofs of
:mod:`consistency`, plus the optimizer's state lying like the fp32 partitions); parameter names become
folder names only when they are one plain path component; OUT is written atomically (:mod:`outdir`); the
bytes written never exceed twice what the checkpoint's files hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

from zeropilot.checkpoint import consistency, fsguard, outdir, progress, torchzip, torchzip_writer
from zeropilot.checkpoint.layout import CheckpointLayout, read_layout
from zeropilot.checkpoint.names import (HF_MODEL_FILES, LATEST_UNIVERSAL_FILE, PEFT_FILES, RNG_STATE_RE,
                                       TRAINER_FILES, UNIVERSAL_FP32, UNIVERSAL_OPTIMIZER_FILE,
                                       UNIVERSAL_STATE_SUFFIX, UNIVERSAL_STEP, UNIVERSAL_ZERO_DIR)
from zeropilot.checkpoint.reconstruct import TRAINABLE, DamagedCheckpoint, TensorEntry, ZeroState, open_checkpoint
from zeropilot.checkpoint.safetensors_writer import FileSpan
from zeropilot.checkpoint.terminal import clean
from zeropilot.checkpoint.torchzip_writer import TensorOut
from zeropilot.errors import InputError

PARAM, CAT_DIM = "param", "cat_dim"  # DeepSpeed's checkpoint.constants PARAM and CAT_DIM
# Rank-file fields holding the partitions: not carried into optimizer_state.pt (ds_to_universal drops the same).
_SHARDED = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")
_CAST_BLOCK = 1 << 22  # elements widened at a time
_FLOATS = ("float32", "float16", "bfloat16", "float64")


@dataclass
class UniversalOptions:
    """What ``ckpt universal`` should do (the CLI flags)."""

    tag: Optional[str] = None
    force: bool = False
    trust_pickle: bool = False
    progress: Optional[bool] = None  # None: when stderr is a terminal
    follow_symlinks: bool = False


@dataclass
class UniversalResult:
    """What was written."""

    out: Path
    tag: str
    stage: int
    world_size: int  # of the run that saved the checkpoint
    parameters: int  # trainable parameters written with their optimizer state
    from_module: List[str]  # ZeRO-1/2: module tensors written as fp32 only (frozen, tied, buffers)
    states: List[str]  # the files of each trainable parameter, e.g. ["fp32", "exp_avg", "exp_avg_sq", "step"]
    files: int  # .pt files written
    bytes: int  # tensor bytes written
    model_files: List[str]  # model-states files copied
    copied: List[str] = field(default_factory=list)  # Hugging Face files copied beside
    notes: List[str] = field(default_factory=list)


@dataclass
class _File:
    """One ``.pt`` file to write: its path under the tag folder and the object it holds."""

    relpath: Tuple[str, ...]
    obj: Any
    nbytes: int


def convert(path, out, options: Optional[UniversalOptions] = None) -> UniversalResult:
    """Write the universal checkpoint of the ZeRO checkpoint at `path` into the new folder `out`.

    Raises:
        InputError: bad arguments, OUT exists without ``force``, OUT inside the checkpoint, a checkpoint
            without optimizer state or already universal.
        DamagedCheckpoint: the checkpoint is incomplete or inconsistent.
    """
    options = options or UniversalOptions()
    layout = read_layout(path, options.tag, follow_symlinks=options.follow_symlinks)
    if layout.universal:
        raise InputError(f"tag {clean(layout.tag)} is already a universal checkpoint: resume from it with "
                         '"checkpoint": {"load_universal": true}', layout.tag_dir)
    if layout.problems:
        raise DamagedCheckpoint("the checkpoint is damaged or incomplete", layout.problems)
    if not layout.optim_files:
        raise InputError("no optimizer files (a weights-only save): a universal checkpoint holds the fp32 master "
                         "weights and the optimizer's state; `zeropilot ckpt export` writes the weights",
                         layout.tag_dir)
    out = Path(out)
    outdir.check_out(out, layout, options.force, "universal")
    leftovers = outdir.remove_leftovers(out, "universal")
    state = open_checkpoint(layout, trust_pickle=options.trust_pickle, need_states=True)
    files, from_module = _plan(state)
    _check_size(files, layout)
    model_files = [f.path for f in layout.model_files]
    side = _side_files(layout)
    total = sum(f.nbytes for f in files) + sum(f.size for f in layout.model_files)
    bar = progress.bar(total, options.progress, "universal")
    written = 0
    with outdir.staging(out, "universal") as tmp:
        tag_dir = tmp / layout.tag
        (tag_dir / UNIVERSAL_ZERO_DIR).mkdir(parents=True)
        for f in files:
            written += _write_file(tag_dir, f)
            bar(f.nbytes)
        for src in layout.model_files:
            _copy_verified(src.path, tag_dir / src.name, src.size, layout)
            bar(src.size)
        copied = [_copy_side(src, tmp, layout) for src in side]
        (tmp / LATEST_UNIVERSAL_FILE).write_text(layout.tag)
        bar(None)
    states = [UNIVERSAL_FP32] + state.state_names + ([UNIVERSAL_STEP] if state.stage <= 2 and _has_step(state)
                                                     else [])
    notes = leftovers + [f"load it with \"checkpoint\": {{\"load_universal\": true}} in the DeepSpeed config: "
                         f"engine.load_checkpoint(OUT) reads {LATEST_UNIVERSAL_FILE}"]
    return UniversalResult(out=out, tag=layout.tag, stage=state.stage, world_size=state.world_size,
                           parameters=sum(1 for e in state.entries if e.source == TRAINABLE),
                           from_module=from_module, states=states, files=len(files), bytes=written,
                           model_files=[p.name for p in model_files], copied=copied, notes=notes)


# ---- what to write ----------------------------------------------------------------------------------


def _plan(state: ZeroState) -> Tuple[List[_File], List[str]]:
    """Every ``.pt`` file of the tag folder (parameters in param_shapes order), and the module tensors written
    from the module (ZeRO-1/2)."""
    trainable = [e for e in state.entries if e.source == TRAINABLE]
    files: List[_File] = []
    for e in trainable:
        folder = _folder(e.name, state)
        for key in [UNIVERSAL_FP32] + state.state_names:
            tensor = _tensor(state, e, None if key == UNIVERSAL_FP32 else key)
            obj = {CAT_DIM: 0, PARAM: tensor} if state.stage <= 2 else tensor
            files.append(_File((UNIVERSAL_ZERO_DIR, folder, key + UNIVERSAL_STATE_SUFFIX), obj, tensor.nbytes))
        if state.stage <= 2 and _has_step(state):
            step = _carry(state.optimizer["base_optimizer_state"]["state"][state.group_of(e)][UNIVERSAL_STEP])
            files.append(_File((UNIVERSAL_ZERO_DIR, folder, UNIVERSAL_STEP + UNIVERSAL_STATE_SUFFIX), step, 8))
    from_module: List[str] = []
    if state.stage <= 2:
        done = {e.name for e in trainable}
        for name in state.module_names():
            if name in done:
                continue
            tensor = _from_module(state, name)
            if tensor is None:
                continue
            from_module.append(name)
            files.append(_File((UNIVERSAL_ZERO_DIR, _folder(name, state), UNIVERSAL_FP32 + UNIVERSAL_STATE_SUFFIX),
                               {PARAM: tensor}, tensor.nbytes))
    files.append(_File((UNIVERSAL_ZERO_DIR, UNIVERSAL_OPTIMIZER_FILE), _optimizer_state(state), 0))
    _check_unique(files, state)
    return files, from_module


def _has_step(state: ZeroState) -> bool:
    groups = (state.optimizer or {}).get("base_optimizer_state", {}).get("state", {})
    return bool(groups) and all(UNIVERSAL_STEP in g for g in groups.values())


def _folder(name: str, state: ZeroState) -> str:
    """`name` as one folder of ``zero/``: a plain path component, or DamagedCheckpoint."""
    why = consistency.name_problem(name)
    if why is None:
        if "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
            why = "not one plain folder name (a '/', '\\\\' or a leading '.')"
        elif name == UNIVERSAL_OPTIMIZER_FILE:
            why = f"the name of the file {UNIVERSAL_OPTIMIZER_FILE} beside the parameter folders"
        elif len(name.encode("utf-8", "surrogatepass")) > 255:
            why = "longer than a folder name may be (255 bytes)"
    if why:
        raise DamagedCheckpoint(f"parameter name {clean(name)[:80]!r} is {why}: a universal checkpoint stores each "
                                "parameter in a folder of that name", [str(state.layout.model_file(0))])
    return name


def _check_unique(files: List[_File], state: ZeroState) -> None:
    seen = set()
    for f in files:
        if f.relpath in seen:
            raise DamagedCheckpoint(f"two tensors would be written to {'/'.join(f.relpath)}",
                                    [str(state.layout.model_file(0))])
        seen.add(f.relpath)


def _tensor(state: ZeroState, entry: TensorEntry, key: Optional[str]) -> TensorOut:
    """The fp32 master weights (`key` None) or an optimizer state of a trainable parameter, as stored."""
    pieces = list(state.pieces(entry, key))
    dtype = pieces[0].dtype if pieces else "float32"
    shape = entry.shape if state.stage <= 2 else (entry.numel,)
    return TensorOut(dtype, shape, lambda: _stream(pieces, dtype))


def _from_module(state: ZeroState, name: str) -> Optional[TensorOut]:
    piece = state.module_tensor(name)
    if piece is None:
        return None
    shape = tuple(state._model_states[0]["module"][name].shape)
    dtype = "float32" if piece.dtype in _FLOATS else piece.dtype  # tensor.float() in DeepSpeed's converter
    if math.prod(shape) != piece.numel:
        raise DamagedCheckpoint(f"module tensor {clean(name)!r}: {piece.numel} values for shape {shape}",
                                [str(state.layout.model_file(0))])
    return TensorOut(dtype, shape, lambda: _stream([piece], dtype))


def _stream(pieces: List[Any], dtype: str) -> Iterator[Any]:
    """The bytes of `pieces` in `dtype`: copied file to file when stored so, widened block by block otherwise."""
    for piece in pieces:
        if piece.dtype == dtype:
            span = piece.span()
            if span is not None:
                yield FileSpan(span[0], span[1], piece.nbytes)
            else:
                yield from piece.blocks()
        elif piece.dtype == "bfloat16" and dtype == "float32":
            for block in piece.blocks(2 * _CAST_BLOCK):
                yield _widen_bf16(block)
        else:
            from zeropilot.checkpoint.safe_load import require_torch

            torch = require_torch()
            for start in range(0, piece.numel, _CAST_BLOCK):
                part = piece.narrow(start, min(_CAST_BLOCK, piece.numel - start)).to_torch()
                yield memoryview(part.to(getattr(torch, dtype)).contiguous().view(torch.uint8).numpy())


def _widen_bf16(block) -> bytearray:
    """bf16 bytes as fp32 bytes (little-endian): a bf16 value is the upper half of the fp32 one, exactly."""
    raw = bytes(block)
    out = bytearray(2 * len(raw))
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return out


def _carry(value: Any) -> Any:
    """A value read from a rank file, ready to be written again: tensors become :class:`TensorOut` of their
    stored bytes; containers and DeepSpeed's objects are walked (bounded: the reader checked the depth)."""
    if hasattr(value, "span") and hasattr(value, "blocks") and hasattr(value, "dtype"):
        flat = value.flat() if hasattr(value, "flat") else value
        return TensorOut(value.dtype, tuple(value.shape), lambda: _stream([flat], value.dtype))
    if isinstance(value, dict):
        return type(value)((k, _carry(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_carry(v) for v in value)
    from zeropilot.checkpoint.safe_load import DeepSpeedObject

    if isinstance(value, DeepSpeedObject):
        copy = type(value).__new__(type(value))
        copy.__dict__.update({k: _carry(v) for k, v in vars(value).items()})
        return copy
    return value


def _optimizer_state(state: ZeroState) -> dict:
    """``zero/optimizer_state.pt``: rank 0's optimizer fields without the partitions, plus ``param_groups``."""
    osd = state.optimizer or {}
    if state.stage <= 2:
        out = {k: v for k, v in osd.items() if k not in _SHARDED}
        out["param_groups"] = osd["base_optimizer_state"]["param_groups"]
        return _carry(out)
    inner = osd.get("optimizer_state_dict") or {}
    steps = {g: {k: v for k, v in entry.items() if k == UNIVERSAL_STEP} for g, entry in inner.get("state", {}).items()}
    out = {}
    for k, v in osd.items():
        if k == "fp32_flat_groups":
            continue
        out[k] = {"state": steps, "param_groups": inner.get("param_groups")} if k == "optimizer_state_dict" else v
    out["param_groups"] = inner.get("param_groups")
    return _carry(out)


def _check_size(files: List[_File], layout: CheckpointLayout) -> None:
    planned = sum(f.nbytes for f in files)
    held = layout.model_bytes + layout.optim_bytes
    if planned > 2 * held + (1 << 20):
        raise DamagedCheckpoint(f"the tensors to write need {planned} bytes, more than twice what the checkpoint's "
                                f"files hold ({held}): shapes or views that do not fit the files", [str(layout.tag_dir)])


# ---- writing ----------------------------------------------------------------------------------------


def _write_file(tag_dir: Path, f: _File) -> int:
    path = tag_dir.joinpath(*f.relpath)
    if not path.parent.is_dir():
        path.parent.mkdir()  # one new folder per parameter, under zero/ (the name was checked)
    try:
        written = torchzip_writer.write(path, f.obj)
    except torchzip_writer.Unwritable as exc:
        raise DamagedCheckpoint(f"{'/'.join(f.relpath)}: the checkpoint holds {exc}, which DeepSpeed never saves",
                                [str(tag_dir)]) from None
    _check_written(path, f.obj)
    return written


def _check_written(path: Path, planned: Any) -> None:
    """Read `path` back with :mod:`torchzip`: the same structure, each tensor's dtype and shape as planned."""
    got = torchzip_writer.read_back(path)

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, TensorOut):
            return (isinstance(b, torchzip.StoredTensor) and b.dtype == a.dtype and tuple(b.shape) == a.shape
                    and b.record is not None and b.record.size == a.nbytes)
        if isinstance(a, dict):
            return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return True  # scalars and DeepSpeed's objects: pickled by the standard pickler

    if not same(planned, got):
        raise RuntimeError(f"read-back of {path}: it does not hold what was planned")


def _copy_verified(src: Path, dest: Path, size: int, layout: CheckpointLayout) -> None:
    """Copy a model-states file whose every record's CRC-32 holds (torch.load does not check them)."""
    archive = torchzip.read_archive(src, layout.confinement)
    for record in archive.records.values():
        torchzip.verify_record(record)
    from zeropilot.checkpoint.safetensors_writer import copy_span

    with open(dest, "xb", buffering=0) as out:
        copy_span(out, FileSpan(str(archive.path), 0, size))


def _side_files(layout: CheckpointLayout) -> List[Path]:
    """The Hugging Face files beside the checkpoint that a resume reads (config, tokenizer, PEFT adapter files,
    trainer state, per-rank RNG states); the model's weights are not copied (the universal checkpoint holds them)."""
    folder = layout.save_dir or layout.tag_dir.parent
    names = [n for n in HF_MODEL_FILES + PEFT_FILES + TRAINER_FILES if n in layout.hf_files]
    try:
        names += sorted(p.name for p in folder.iterdir() if RNG_STATE_RE.match(p.name))
    except OSError:
        pass
    return [folder / n for n in names if fsguard.kind_of(folder / n) == "file"]


def _copy_side(src: Path, tmp: Path, layout: CheckpointLayout) -> str:
    fsguard.copy_regular(src, tmp / src.name, layout.confinement)
    return src.name


def to_json(result: UniversalResult) -> dict:
    """The JSON report of a conversion (paths as strings)."""
    return {"out": str(result.out), "tag": result.tag, "stage": result.stage, "saved_world_size": result.world_size,
            "parameters": result.parameters, "states": result.states, "from_module": result.from_module,
            "files": result.files, "tensor_bytes": result.bytes, "model_files": result.model_files,
            "copied": result.copied, "notes": result.notes}


__all__ = ["UniversalOptions", "UniversalResult", "convert", "to_json"]
