"""What a checkpoint holds: layout facts first (no torch), tensor facts when its files load safely, and the
world sizes it can resume on as it is and after ``zeropilot ckpt universal``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from zeropilot.checkpoint.layout import CheckpointLayout, read_json, read_layout
from zeropilot.checkpoint.terminal import clean
from zeropilot.errors import InputError

_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1,
                  "uint8": 1, "int8": 1}


@dataclass
class TensorFacts:
    """Facts that need the rank files unpickled (safely)."""

    parameters: int
    trainable: int
    frozen: int
    buffers: int
    tensors: int
    absent: List[str]  # module weights not saved (exclude_frozen_parameters)
    tied: Dict[str, str]
    module_dtype: Optional[str]
    frozen_bytes: int  # bytes of frozen weights stored in the rank files
    shapes: Dict[str, List[int]]
    sources: Dict[str, str]  # name -> trainable | frozen | buffer


@dataclass
class ResumeOn:
    """The data-parallel world sizes a checkpoint resumes on.

    ``as_is``: ``[W]`` for a ZeRO checkpoint (DeepSpeed refuses its optimizer partitions on another world size),
    ``"any"`` for a universal one, ``[]`` without optimizer state. ``after_universal``: ``"any"`` when a
    conversion opens every world size. ``same_global_batch``: the world sizes on which the saved global batch
    (``global_batch`` samples, ``micro_batch`` per rank) stays the same with a whole number of accumulation
    steps, ``gradient_accumulation_steps = global_batch / (micro_batch x ranks)``; None when the saved
    DeepSpeed config does not say.
    """

    as_is: object
    after_universal: Optional[str]
    global_batch: Optional[int] = None
    micro_batch: Optional[int] = None
    same_global_batch: Optional[List[int]] = None


@dataclass
class Report:
    """Everything `zeropilot ckpt inspect` prints."""

    layout: CheckpointLayout
    tensors: Optional[TensorFacts]
    tensor_error: Optional[str]  # why tensor facts are missing
    resume: str
    global_step: Optional[int]
    resume_on: Optional[ResumeOn] = None
    universal_params: Optional[int] = None  # parameter folders of a universal checkpoint

    @property
    def verdict(self) -> str:
        if self.layout.problems:
            return "damaged"
        if self.tensor_error:
            return "unverified"
        return "ok"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "ok" else 1


def inspect_checkpoint(path, tag: Optional[str] = None, trust_pickle: bool = False,
                       follow_symlinks: bool = False) -> Report:
    """Inspect the checkpoint at `path` (any of the folders `read_layout` accepts)."""
    layout = read_layout(path, tag, follow_symlinks=follow_symlinks)
    facts, error, folders = None, None, None
    if layout.problems:
        error = "not read: the checkpoint is damaged (see problems)"
    elif layout.universal:
        folders = _universal_folders(layout)
    else:
        facts, error = _tensor_facts(layout, trust_pickle)
    state_file = layout.hf_files.get("trainer_state.json")
    trainer_state = read_json(state_file, layout.confinement) if state_file else None
    step = trainer_state.get("global_step") if trainer_state else None
    step = step if type(step) is int else None
    resume_on = _resume_on(layout, trust_pickle) if not layout.problems else None
    return Report(layout=layout, tensors=facts, tensor_error=error, resume=_resume(layout, resume_on),
                  global_step=step, resume_on=resume_on, universal_params=folders)


def _universal_folders(layout: CheckpointLayout) -> int:
    """Parameter folders under ``zero/`` (each must hold ``fp32.pt``: a problem names those that do not)."""
    from zeropilot.checkpoint import fsguard
    from zeropilot.checkpoint.names import UNIVERSAL_FP32, UNIVERSAL_STATE_SUFFIX, UNIVERSAL_ZERO_DIR

    zero = layout.tag_dir / UNIVERSAL_ZERO_DIR
    folders = [p for p in zero.iterdir() if fsguard.kind_of(p) == "dir"]
    for p in folders:
        if fsguard.kind_of(p / (UNIVERSAL_FP32 + UNIVERSAL_STATE_SUFFIX)) != "file":
            layout.problems.append(f"{p}: no {UNIVERSAL_FP32}{UNIVERSAL_STATE_SUFFIX} (the parameter's weights)")
    return len(folders)


def _resume_on(layout: CheckpointLayout, trust_pickle: bool) -> ResumeOn:
    if layout.universal:
        out = ResumeOn(as_is="any", after_universal=None)
    elif layout.optim_files and layout.world_size:
        out = ResumeOn(as_is=[layout.world_size], after_universal="any")
    else:
        return ResumeOn(as_is=[], after_universal=None)
    batch, micro = _saved_batch(layout, trust_pickle)
    if batch and micro and batch % micro == 0:
        per_rank = batch // micro
        out.global_batch, out.micro_batch = batch, micro
        out.same_global_batch = [n for n in range(1, min(per_rank, 1 << 20) + 1) if per_rank % n == 0][:64]
    return out


def _saved_batch(layout: CheckpointLayout, trust_pickle: bool):
    """(global batch, micro batch per rank) from the DeepSpeed config saved in rank 0's model-states file."""
    from zeropilot.checkpoint.reconstruct import load_file

    try:
        states = load_file(layout.model_file(0), trust_pickle=trust_pickle, confinement=layout.confinement)
    except (InputError, OSError):
        return None, None
    config = states.get("ds_config") if isinstance(states, dict) else None
    if not isinstance(config, dict):
        return None, None
    micro, accum = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
    batch = config.get("train_batch_size")
    ints = [v for v in (micro, accum, batch) if type(v) is int and v > 0]
    if type(batch) is not int and type(micro) is int and type(accum) is int and len(ints) == 2 and layout.world_size:
        batch = micro * accum * layout.world_size
    if type(batch) is not int or type(micro) is not int or batch <= 0 or micro <= 0:
        return None, None
    return batch, micro


def _tensor_facts(layout: CheckpointLayout, trust_pickle: bool):
    from zeropilot.checkpoint.reconstruct import FROZEN, TRAINABLE, DamagedCheckpoint, open_checkpoint
    from zeropilot.checkpoint.safe_load import DamagedFileError

    try:
        state = open_checkpoint(layout, trust_pickle=trust_pickle)
    except (InputError, DamagedCheckpoint) as exc:
        if isinstance(exc, DamagedCheckpoint):
            layout.problems.extend(f"{f}: {exc}" for f in exc.files)
        elif isinstance(exc, DamagedFileError) or type(exc).__name__ == "UnsafePathError":
            layout.problems.append(exc.render())  # a file that breaks the format's rules: DAMAGED, not unknown
        return None, str(exc)
    count = lambda src: sum(e.numel for e in state.entries if e.source == src)  # noqa: E731
    frozen_bytes = sum(e.numel * _ELEMENT_BYTES.get(e.dtype, 4) for e in state.entries if e.source == FROZEN)
    return TensorFacts(
        parameters=count(TRAINABLE) + count(FROZEN), trainable=count(TRAINABLE), frozen=count(FROZEN),
        buffers=count("buffer"), tensors=len(state.entries), absent=state.absent, tied=dict(state.aliases),
        module_dtype=state.module_dtype, frozen_bytes=frozen_bytes,
        shapes={e.name: list(e.shape) for e in state.entries}, sources={e.name: e.source for e in state.entries},
    ), None


def _resume(layout: CheckpointLayout, on: Optional[ResumeOn]) -> str:
    if layout.problems:
        return "no: rank files missing or damaged"
    batch = _batch_words(on)
    if layout.universal:
        return ('yes, on any number of data-parallel ranks with "checkpoint": {"load_universal": true} '
                f"(a universal checkpoint of a run on {layout.world_size} ranks)" + batch)
    if not layout.optim_files:
        return "no: no optimizer state (weights only)"
    return (f"yes, on {layout.world_size} data-parallel ranks as it is; on any number after `zeropilot ckpt "
            'universal` (then "checkpoint": {"load_universal": true})' + batch)


def _batch_words(on: Optional[ResumeOn]) -> str:
    if on is None or not on.same_global_batch:
        return ""
    sizes = on.same_global_batch
    shown = ", ".join(str(n) for n in sizes[:-1]) + (" or " if len(sizes) > 1 else "") + str(sizes[-1])
    accum = ", ".join(str(on.global_batch // (on.micro_batch * n)) for n in sizes)
    return (f"; the global batch of {on.global_batch} samples (micro batch {on.micro_batch}) stays the same on "
            f"{shown} ranks (gradient_accumulation_steps {accum})")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else (f"{n / 1e6:.2f} M" if n >= 1e6 else str(n))


def render_text(report: Report, max_shapes: int = 12) -> str:
    """The human-readable report."""
    lay = report.layout
    kind = f"  kind: {lay.kind}"
    if lay.hf_checkpoints:
        kind += f" ({len(lay.hf_checkpoints)} checkpoint-N folders, took {lay.save_dir.name})"
    lines = [f"checkpoint: {lay.path}", kind]
    lines.append(f"  tag: {lay.tag}   latest: {lay.latest if lay.latest is not None else '(no latest file)'}"
                 + (f"   tags: {', '.join(lay.tags)}" if len(lay.tags) > 1 else ""))
    stage = f"ZeRO-{lay.stage}" if lay.stage else f"unknown ({lay.unknown.get('stage', '')})"
    lines.append(f"  stage: {stage}   world size: {lay.world_size}   optimizer dtype: {lay.optim_dtype}"
                 f"   written by DeepSpeed {lay.ds_version or 'unknown'}")
    if report.global_step is not None:
        lines.append(f"  trainer global_step: {report.global_step}")
    lines.append("  rank files:")
    for f in lay.rank_files:
        state = "EMPTY" if f.empty else ("TRUNCATED" if f.truncated else "ok")
        lines.append(f"    {f.name:55s} {_size(f.size):>10s}  {state}")
    for name in lay.missing:
        lines.append(f"    {name:55s} {'':>10s}  MISSING")
    lines.append(f"  sizes: model states {_size(lay.model_bytes)}, optimizer states {_size(lay.optim_bytes)}")
    if report.universal_params is not None:
        lines.append(f"  universal checkpoint: {report.universal_params} parameter folders in "
                     f"{lay.tag}/zero/ (read by DeepSpeed's loader; inspect does not read their tensors)")
    else:
        lines += _tensor_lines(report, max_shapes)
    lines.append(f"  resumable: {report.resume}")
    if lay.hf_files:
        lines.append(f"  beside it: {', '.join(sorted(lay.hf_files))}")
    lines += _verdict_lines(report)
    return "\n".join(clean(line) for line in lines)  # tags, names and versions come from the checkpoint


def _tensor_lines(report: Report, max_shapes: int) -> List[str]:
    t = report.tensors
    if t is None:
        return [f"  tensors: not read: {report.tensor_error}"]
    lines = [f"  parameters: {_count(t.parameters)} ({t.parameters:,}) — trainable {_count(t.trainable)}, "
             f"frozen {_count(t.frozen)}; module dtype {t.module_dtype}"]
    if t.frozen:
        lines.append(f"  frozen weights stored: {_size(t.frozen_bytes)} (not needed to resume a LoRA run; "
                     "exclude_frozen_parameters=True skips them)")
    if report.layout.is_peft and not t.frozen and not t.absent:
        lines.append("  frozen base weights: not saved (exclude_frozen_parameters); export --adapter-only or "
                     "--merge-into BASE")
    if t.absent:
        lines.append(f"  not saved: {len(t.absent)} module weights (exclude_frozen_parameters), e.g. {t.absent[0]}")
    for alias, target in t.tied.items():
        lines.append(f"  tied: {alias} -> {target}")
    shown = list(t.shapes.items())[:max_shapes]
    lines.append(f"  tensors ({t.tensors}):")
    lines += [f"    {n} {tuple(s)} {t.sources[n]}" for n, s in shown]
    if t.tensors > len(shown):
        lines.append(f"    ... {t.tensors - len(shown)} more (--format json lists all)")
    return lines


def _verdict_lines(report: Report) -> List[str]:
    if report.verdict == "ok":
        return ["verdict: OK — complete"]
    if report.verdict == "damaged":
        return ["verdict: DAMAGED — " + str(len(report.layout.problems)) + " problem(s):"] + [
            f"  - {p}" for p in report.layout.problems]
    return [f"verdict: UNVERIFIED — file layout is complete but tensors were not read: {report.tensor_error}"]


def to_json(report: Report) -> dict:
    """The JSON report (paths as strings)."""
    lay = report.layout
    files = [{"name": f.name, "kind": f.kind, "rank": f.rank, "size": f.size, "empty": f.empty,
              "truncated": f.truncated} for f in lay.rank_files]
    t = report.tensors
    return {
        "verdict": report.verdict, "path": str(lay.path), "kind": lay.kind,
        "save_dir": str(lay.save_dir) if lay.save_dir else None, "tag": lay.tag, "latest": lay.latest,
        "tags": lay.tags, "stage": lay.stage, "world_size": lay.world_size, "optim_dtype": lay.optim_dtype,
        "ds_version": lay.ds_version, "rank_files": files, "missing": lay.missing,
        "model_states_bytes": lay.model_bytes, "optim_states_bytes": lay.optim_bytes,
        "hf_files": sorted(lay.hf_files), "global_step": report.global_step, "resumable": report.resume,
        "universal": lay.universal, "resume_world_sizes": None if report.resume_on is None else {
            "as_is": report.resume_on.as_is, "after_universal": report.resume_on.after_universal,
            "global_batch": report.resume_on.global_batch, "micro_batch": report.resume_on.micro_batch,
            "same_global_batch": report.resume_on.same_global_batch},
        "problems": lay.problems, "unknown": lay.unknown, "tensor_error": report.tensor_error,
        "tensors": None if t is None else {
            "parameters": t.parameters, "trainable": t.trainable, "frozen": t.frozen, "buffers": t.buffers,
            "count": t.tensors, "not_saved": t.absent, "tied": t.tied, "module_dtype": t.module_dtype,
            "frozen_bytes": t.frozen_bytes, "shapes": t.shapes, "sources": t.sources},
    }


__all__ = ["Report", "ResumeOn", "TensorFacts", "inspect_checkpoint", "render_text", "to_json"]
