"""Export a ZeRO checkpoint as a Hugging Face model or PEFT adapter, streaming tensor by tensor.

Three products:

* a full model (``model.safetensors`` or shards + ``model.safetensors.index.json``), with the
  ``config.json``, generation config and tokenizer files found beside the checkpoint;
* a PEFT adapter (``--adapter-only``): ``adapter_model.safetensors`` + ``adapter_config.json``;
* a merged model (``--merge-into BASE``, or a LoRA checkpoint that kept its frozen base):
  ``W + scaling * B @ A`` per LoRA-wrapped weight, the base weights read from BASE one at a time.

Tied weights: DeepSpeed records them in ``shared_params`` (``lm_head.weight`` ->
``model.embed_tokens.weight``). When the config ties them (``tie_word_embeddings``, true unless set
false) only the target is written, as ``save_pretrained`` does; transformers re-ties on load.

Everything is written into a temporary sibling of OUT and renamed into place when complete
(:mod:`zeropilot.checkpoint.outdir`); each safetensors file is read back (header, dtypes, shapes, sizes,
``safe_open``) before that.

Hostile input: export starts only after the proofs of :mod:`consistency` pass; side files are copied
through :mod:`fsguard` (regular files inside the checkpoint, bounded); the bytes written can never
exceed twice what the checkpoint's files hold.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from zeropilot.checkpoint import fsguard, outdir, progress
from zeropilot.checkpoint import safetensors_writer as stw
from zeropilot.checkpoint.layout import CheckpointLayout, read_layout
from zeropilot.checkpoint.names import HF_MODEL_FILES
from zeropilot.checkpoint import consistency
from zeropilot.checkpoint.reconstruct import DamagedCheckpoint, TensorEntry, ZeroState, open_checkpoint
from zeropilot.checkpoint.safe_load import require_torch
from zeropilot.checkpoint.terminal import clean
from zeropilot.errors import InputError

PEFT_PREFIX = "base_model.model."
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_FLOATS = ("float32", "float16", "bfloat16")
_CAST_BLOCK = 1 << 24  # elements cast at a time when the output dtype differs from the stored one


@dataclass
class ExportOptions:
    """What `export` should write (the CLI flags)."""

    tag: Optional[str] = None
    dtype: Optional[str] = None  # "bf16" | "fp16" | "fp32"; None: the dtype of the saved module
    max_shard_size: str = "5GB"
    adapter_only: bool = False
    merge_into: Optional[Path] = None
    force: bool = False
    trust_pickle: bool = False
    progress: Optional[bool] = None  # None: when stderr is a terminal
    follow_symlinks: bool = False  # open files whose symlinks leave the checkpoint folder


@dataclass
class ExportResult:
    """What was written."""

    out: Path
    product: str  # "model", "adapter" or "merged-model"
    files: List[str]
    tensors: int
    bytes: int
    dtype: str
    dropped_tied: List[str] = field(default_factory=list)
    copied: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def export_checkpoint(path, out, options: ExportOptions) -> ExportResult:
    """Export the checkpoint at `path` into the new folder `out`.

    Raises:
        InputError: bad arguments, OUT exists without ``force``, OUT inside the checkpoint.
        DamagedCheckpoint: the checkpoint is incomplete or inconsistent.
    """
    layout = read_layout(path, options.tag, follow_symlinks=options.follow_symlinks)
    if layout.problems:
        raise DamagedCheckpoint("the checkpoint is damaged or incomplete", layout.problems)
    out = Path(out)
    outdir.check_out(out, layout, options.force)
    leftovers = outdir.remove_leftovers(out)
    state = open_checkpoint(layout, trust_pickle=options.trust_pickle)
    dtype = _output_dtype(options.dtype, state)
    with outdir.staging(out) as tmp:
        result = _write(state, layout, tmp, dtype, options)
    result.out = out
    result.notes = leftovers + result.notes
    return result


def _output_dtype(flag: Optional[str], state: ZeroState) -> str:
    if flag:
        if flag not in DTYPE_NAMES:
            raise InputError(f"--dtype {flag}: expected one of {', '.join(DTYPE_NAMES)}")
        return DTYPE_NAMES[flag]
    if state.module_dtype in ("bfloat16", "float16", "float32"):
        return state.module_dtype  # the dtype the engine's module held: what it trained with
    return {"bf16": "bfloat16", "fp16": "float16"}.get(state.layout.optim_dtype or "", "float32")


def _write(state: ZeroState, layout: CheckpointLayout, tmp: Path, dtype: str, options: ExportOptions) -> ExportResult:
    is_peft = layout.is_peft or any(e.name.startswith(PEFT_PREFIX) for e in state.entries)
    if options.adapter_only:
        if not is_peft:
            raise InputError("--adapter-only: this checkpoint has no PEFT adapter (no lora_ weights, no "
                             "adapter_config.json beside it)", layout.path)
        return _write_adapter(state, layout, tmp, dtype)
    if options.merge_into is not None or is_peft:
        return _write_merged(state, layout, tmp, dtype, options)
    return _write_model(state, layout, tmp, dtype, options, _model_plan(state, layout, dtype))


def _model_plan(state: ZeroState, layout: CheckpointLayout, dtype: str) -> Tuple[List[stw.PlannedTensor], List[str]]:
    if state.absent:
        raise InputError(
            f"{len(state.absent)} weights of the model are not in the checkpoint (saved with "
            f"exclude_frozen_parameters?), e.g. {state.absent[0]}: a full model cannot be written", layout.tag_dir)
    config_path = _beside(layout, "config.json")
    config = fsguard.read_json(config_path, layout.confinement) if config_path else {}
    tied = config.get("tie_word_embeddings", True) is not False
    plan = [_planned(state, e, e.name, dtype) for e in state.entries]
    dropped = []
    for alias, target in state.aliases.items():
        if target not in state._by_name:
            raise DamagedCheckpoint(f"shared_params: {clean(alias)!r} shares {clean(target)!r}, which is not a "
                                    "saved tensor", [str(layout.tag_dir)])
        if tied:
            dropped.append(alias)
        else:
            plan.append(_planned(state, state.entry(target), alias, dtype))
    return plan, dropped


def _planned(state: ZeroState, entry: TensorEntry, name: str, dtype: str) -> stw.PlannedTensor:
    out_dtype = dtype if entry.dtype in _FLOATS else entry.dtype
    return stw.PlannedTensor(name, entry.shape, out_dtype, lambda: _stream(state, entry, out_dtype))


def _stream(state: ZeroState, entry: TensorEntry, dtype: str) -> Iterator[memoryview]:
    """The bytes of `entry` in `dtype`: stored bytes copied file to file when no cast is needed (no torch)."""
    for piece in state.pieces(entry):
        if piece.dtype == dtype:
            span = piece.span()
            if span is not None:
                yield stw.FileSpan(span[0], span[1], piece.nbytes)
            else:
                yield from piece.blocks()
        else:
            torch = require_torch()
            target = getattr(torch, dtype)
            for start in range(0, piece.numel, _CAST_BLOCK):
                part = piece.narrow(start, min(_CAST_BLOCK, piece.numel - start))
                yield _bytes(part.to_torch().to(target))


def _bytes(tensor) -> memoryview:
    torch = require_torch()
    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def _write_model(state, layout, tmp: Path, dtype: str, options: ExportOptions, planned, product="model",
                 hf_source: Optional[Path] = None) -> ExportResult:
    plan, dropped = planned
    max_bytes = stw.parse_size(options.max_shard_size)
    planned_bytes = sum(t.nbytes for t in plan)
    held = layout.model_bytes + layout.optim_bytes
    if hf_source is None and planned_bytes > 2 * held + (1 << 20):
        raise DamagedCheckpoint(f"the tensors to write need {planned_bytes} bytes, more than twice what the "
                                f"checkpoint's files hold ({held}): shapes or views that do not fit the files",
                                [str(layout.tag_dir)])
    consistency.check_names([(t.name, str(layout.tag_dir)) for t in plan])
    shards = stw.plan_shards(plan, max_bytes)
    names = stw.shard_names(len(shards))
    progress = _progress(planned_bytes, options.progress)
    total = 0
    for name, shard in zip(names, shards):
        total += stw.write_file(tmp / name, shard, on_tensor=lambda t: progress(t.nbytes))
        stw.check_written(tmp / name, shard)
    progress(None)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {t.name: n for n, s in zip(names, shards) for t in s}}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    copied = _copy_hf_files(layout, tmp, dtype, hf_source)
    notes = [] if "config.json" in copied else [
        "no config.json found beside the checkpoint: copy the model's config.json into OUT to load it"]
    return ExportResult(out=tmp, product=product, files=names + (["model.safetensors.index.json"] if len(shards) > 1
                        else []), tensors=len(plan), bytes=total, dtype=dtype, dropped_tied=dropped,
                        copied=copied, notes=notes)


def _beside(layout: CheckpointLayout, name: str) -> Optional[Path]:
    """`name` in the checkpoint's folder or the folder above it (HF output dir), if there."""
    for folder in _hf_folders(layout):
        if (folder / name).is_file():
            return folder / name
    return None


def _hf_folders(layout: CheckpointLayout) -> List[Path]:
    """The save dir, and the folder above it when that is still inside the checkpoint (HF output dir)."""
    folders = [layout.save_dir or layout.tag_dir.parent]
    conf = layout.confinement
    if conf is None or conf.contains(folders[0].parent):
        folders.append(folders[0].parent)
    return folders


def _copy_hf_files(layout: CheckpointLayout, tmp: Path, dtype: str, source: Optional[Path]) -> List[str]:
    copied = []
    for name in HF_MODEL_FILES:
        src = (source / name) if source else _beside(layout, name)
        if src is None or fsguard.kind_of(src) != "file":
            continue
        conf = None if source else layout.confinement
        if name == "config.json":
            config = fsguard.read_json(src, conf)
            for key in ("torch_dtype", "dtype"):
                if key in config:
                    config[key] = dtype
            (tmp / name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            fsguard.copy_regular(src, tmp / name, conf)
        copied.append(name)
    return copied


def _progress(total: int, enabled: Optional[bool]) -> Callable[[Optional[int]], None]:
    return progress.bar(total, enabled, "export")


# ---- PEFT: adapters and merging -----------------------------------------------------------------

_LORA_RE = re.compile(r"\.(lora_(?:A|B|embedding_A|embedding_B|magnitude_vector))\.([^.]+)(\.|$)")


def _adapter_key(name: str) -> str:
    """PEFT's saved name: the adapter name segment removed (``lora_A.default.weight`` -> ``lora_A.weight``)."""
    return _LORA_RE.sub(lambda m: f".{m.group(1)}{m.group(3)}", name)


def _adapter_config(layout: CheckpointLayout) -> Tuple[Path, dict]:
    path = _beside(layout, "adapter_config.json")
    config = fsguard.read_json(path, layout.confinement) if path else None
    if config is None:
        raise InputError("no adapter_config.json beside the checkpoint: PEFT needs it to load the adapter",
                         layout.save_dir or layout.tag_dir)
    return path, config


def _write_adapter(state: ZeroState, layout: CheckpointLayout, tmp: Path, dtype: str) -> ExportResult:
    config_path, _config = _adapter_config(layout)
    lora = [e for e in state.entries if _LORA_RE.search(e.name)]
    other = [e.name for e in state.entries if e.source == "trainable" and not _LORA_RE.search(e.name)]
    if other:
        raise InputError(f"trainable weights outside LoRA layers (e.g. {other[0]}, modules_to_save?) are not "
                         "supported by --adapter-only yet", layout.tag_dir)
    plan = [_planned(state, e, _adapter_key(e.name), dtype) for e in lora]
    consistency.check_names([(t.name, str(layout.tag_dir)) for t in plan])
    total = stw.write_file(tmp / "adapter_model.safetensors", plan)
    stw.check_written(tmp / "adapter_model.safetensors", plan)
    fsguard.copy_regular(config_path, tmp / "adapter_config.json", layout.confinement)
    return ExportResult(out=tmp, product="adapter", files=["adapter_model.safetensors", "adapter_config.json"],
                        tensors=len(plan), bytes=total, dtype=dtype)


def _write_merged(state, layout, tmp: Path, dtype: str, options: ExportOptions) -> ExportResult:
    _path, config = _adapter_config(layout)
    scaling = _lora_scaling(config, layout)
    lora = {e.name: e for e in state.entries if _LORA_RE.search(e.name)}
    if options.merge_into is not None:
        base = _BaseFromDir(Path(options.merge_into))
        source = Path(options.merge_into)
    else:
        if state.absent or not any(e.source == "frozen" for e in state.entries):
            raise InputError("this LoRA checkpoint holds no base weights (saved with exclude_frozen_parameters): "
                             "use --adapter-only, or --merge-into BASE_MODEL_DIR", layout.tag_dir)
        base = _BaseFromCheckpoint(state)
        source = None
    plan = [_merged_tensor(base, name, lora, state, scaling, dtype) for name in base.names()]
    result = _write_model(state, layout, tmp, dtype, options, (plan, base.dropped), "merged-model", source)
    return result


def _lora_scaling(config: dict, layout: CheckpointLayout) -> float:
    unsupported = [k for k in ("use_dora", "fan_in_fan_out") if config.get(k)]
    unsupported += [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)]
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        raise InputError(f"merging supports plain LoRA only (found peft_type={config.get('peft_type')}, "
                         f"{', '.join(unsupported) or 'no other option'}): use --adapter-only", layout.tag_dir)
    r, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if type(r) is not int or r <= 0 or type(alpha) not in (int, float) or not 0 < abs(alpha) < 1e6:
        raise InputError(f"adapter_config.json: r must be a positive int and lora_alpha a number (found "
                         f"{type(r).__name__}, {type(alpha).__name__})", layout.save_dir or layout.tag_dir)
    return alpha / (r ** 0.5) if config.get("use_rslora") else alpha / r


class _BaseFromCheckpoint:
    """Base weights kept (frozen) in the checkpoint, named as in the plain model."""

    def __init__(self, state: ZeroState) -> None:
        self.state = state
        self.by_out: Dict[str, TensorEntry] = {}
        for e in state.entries:
            if not _LORA_RE.search(e.name):
                self.by_out[_plain_name(e.name)] = e
        self.dropped = [_plain_name(a) for a in state.aliases]

    def names(self) -> List[str]:
        return list(self.by_out)

    def shape(self, name: str) -> Tuple[int, ...]:
        return self.by_out[name].shape

    def dtype(self, name: str) -> str:
        return self.by_out[name].dtype

    def read(self, name: str):
        torch = require_torch()
        entry = self.by_out[name]
        return self.state.read(entry, torch.float32 if entry.dtype in _FLOATS else None)


class _BaseFromDir:
    """Base weights from a Hugging Face model folder's safetensors, read one at a time."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise InputError("no *.safetensors in the base model folder", folder)
        for f in files:
            stw.read_header(f)  # a FIFO, device or garbage file is one line, before safetensors opens it
        self.handles = [safe_open(str(f), framework="pt") for f in files]
        self.where = {k: h for h in self.handles for k in h.keys()}
        self.dropped: List[str] = []

    def names(self) -> List[str]:
        return list(self.where)

    def shape(self, name: str) -> Tuple[int, ...]:
        return tuple(self.where[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        code = self.where[name].get_slice(name).get_dtype()
        return next((k for k, (c, _n) in stw.DTYPES.items() if c == code), "float32")

    def read(self, name: str):
        torch = require_torch()
        tensor = self.where[name].get_tensor(name)
        return tensor.to(torch.float32) if tensor.is_floating_point() else tensor


def _plain_name(name: str) -> str:
    name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
    return name.replace(".base_layer.", ".")


def _merged_tensor(base, name: str, lora: Dict[str, TensorEntry], state: ZeroState, scaling: float,
                   dtype: str) -> stw.PlannedTensor:
    module = name.rsplit(".", 1)[0]
    a = next((e for n, e in lora.items() if _plain_name(n).startswith(module + ".lora_A.")), None)
    b = next((e for n, e in lora.items() if _plain_name(n).startswith(module + ".lora_B.")), None)
    shape = base.shape(name)

    def produce() -> Iterator[memoryview]:
        torch = require_torch()
        weight = base.read(name)
        if a is not None and b is not None and name.endswith(".weight"):
            delta = state.read(b, torch.float32) @ state.read(a, torch.float32)
            weight = weight + delta.view(weight.shape) * scaling
        yield _bytes(weight.to(getattr(torch, dtype)) if weight.is_floating_point() else weight)

    out_dtype = dtype if base.dtype(name) in _FLOATS else base.dtype(name)
    return stw.PlannedTensor(name, shape, out_dtype, produce)
