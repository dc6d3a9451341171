"""Two runs of different world sizes compared through their final checkpoints, parameter by parameter.

A rank's state (:mod:`zeropilot.repro.state`) is its slice of the flat groups, which depends on the world size;
a resume on another number of ranks is compared through what does not: each parameter whole, as
:mod:`zeropilot.checkpoint.reconstruct` reassembles it from any ZeRO checkpoint. Parts, as ``state.compare``
names them: ``weights`` (fp32 master weights), ``optimizer`` (each per-element state such as Adam's ``exp_avg``
and ``exp_avg_sq``, Adam's step, the param-group values but the learning rate), ``scheduler`` (the saved
scheduler state and the learning rate), ``step`` (the engine's step and sample counters). One parameter is held
at a time. Imports torch (inside a rank).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

from zeropilot.repro.state import compare_leaf

PARTS = ("weights", "optimizer", "scheduler", "step")


def _open(root: Path, tag: str):
    from zeropilot.checkpoint.layout import read_layout
    from zeropilot.checkpoint.reconstruct import open_checkpoint

    return open_checkpoint(read_layout(root, tag), need_states=True)


def _tensor(state, entry, key):
    import torch

    pieces = [p.to_torch().reshape(-1) for p in state.pieces(entry, key)]
    flat = torch.cat(pieces) if pieces else torch.empty(0)
    return flat.view(entry.shape)


def _plain(value: Any) -> Any:
    """A pickled value as plain Python (0-dim tensors as floats, DeepSpeed's objects as their fields)."""
    if hasattr(value, "to_torch") and getattr(value, "numel", 2) == 1:
        return float(value.to_torch().reshape(-1)[0].item())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "params"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: _plain(v) for k, v in vars(value).items() if k != "args"}
    return value


def _flat(obj: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}.{k}")
    elif isinstance(obj, list) and not all(isinstance(v, (int, float)) for v in obj):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _base(state) -> dict:
    osd = state.optimizer or {}
    return (osd.get("base_optimizer_state") if state.stage <= 2 else osd.get("optimizer_state_dict")) or {}


def _small_parts(state) -> Dict[str, Dict[str, Any]]:
    """Step counters, scheduler, Adam's step and param-group values: everything but the tensors."""
    model = state._model_states[0]
    base = _base(state)
    groups = [_plain(g) for g in base.get("param_groups") or []]
    parts: Dict[str, Dict[str, Any]] = {p: {} for p in PARTS}
    for key in ("global_steps", "global_samples", "skipped_steps"):
        parts["step"][key] = model.get(key)
    sched = model.get("lr_scheduler")
    if isinstance(sched, dict):
        parts["scheduler"].update(_flat({k: _plain(v) for k, v in sched.items() if k != "lr_lambdas"},
                                        "lr_scheduler"))
    for i, g in enumerate(groups[:1]):  # every group shares its values; the group count follows the world size
        for k, v in g.items():
            parts["scheduler" if k in ("lr", "initial_lr") else "optimizer"][f"param_groups[{i}].{k}"] = v
    steps = sorted({_plain(e.get("step")) for e in (base.get("state") or {}).values() if isinstance(e, dict)},
                   key=repr)
    parts["optimizer"]["step"] = steps
    return parts


def compare_checkpoints(reference: Path, resumed: Path, tag: str, start_tag: str,
                        tolerance: float) -> Dict[str, Dict[str, Any]]:
    """Per part, the resumed run's final checkpoint against the uninterrupted run's (both under `tag`).

    Tensors (``weights``, ``optimizer``) are measured against what training changed after the resume, read from
    the uninterrupted run's save at `start_tag`: ``max_rel_diff`` is |resumed - uninterrupted| / |uninterrupted -
    at the save|, L2 norms over every tensor of the part. A resume that restored everything differs by rounding
    only; one that lost a part changes its values by as much as training does (about 1). Other values (step
    counters, the schedule, Adam's step, hyper-parameters) must be equal. ``within_tolerance``: no other value
    differs and the tensors' measure is at most `tolerance`.
    """
    from zeropilot.checkpoint.reconstruct import TRAINABLE

    ref, got, start = _open(reference, tag), _open(resumed, tag), _open(reference, start_tag)
    out = {p: {"bitwise": True, "max_rel_diff": 0.0, "differing": [], "n_differing": 0, "n_compared": 0}
           for p in PARTS}
    norms = {p: [0.0, 0.0] for p in PARTS}  # part -> [|resumed - uninterrupted|^2, |uninterrupted - at save|^2]
    exact_fail = {p: False for p in PARTS}

    def record(part: str, path: str, a: Any, b: Any, before: Any = None) -> None:
        summary = out[part]
        summary["n_compared"] += 1
        equal, _rel = compare_leaf(a, b)
        if before is not None:
            norms[part][0] += float(((a.double() - b.double()) ** 2).sum().item()) if not equal else 0.0
            norms[part][1] += float(((b.double() - before.double()) ** 2).sum().item())
        elif not equal:
            exact_fail[part] = True
        if not equal:
            summary["bitwise"] = False
            summary["n_differing"] += 1
            if len(summary["differing"]) < 8:
                summary["differing"].append(path)

    small_ref, small_got = _small_parts(ref), _small_parts(got)
    for part in PARTS:
        for path in sorted(set(small_ref[part]) | set(small_got[part])):
            record(part, path, small_got[part].get(path, "(missing)"), small_ref[part].get(path, "(missing)"))
    mine = {e.name: e for e in got.entries if e.source == TRAINABLE}
    before = {e.name: e for e in start.entries if e.source == TRAINABLE}
    for entry in (e for e in ref.entries if e.source == TRAINABLE):
        other, first = mine.pop(entry.name, None), before.get(entry.name)
        if other is None or other.shape != entry.shape or first is None:
            record("weights", f"fp32 {entry.name} (not in both runs)", "missing", "present")
            continue
        record("weights", f"fp32 {entry.name}", _tensor(got, other, None), _tensor(ref, entry, None),
               _tensor(start, first, None))
        for key in ref.state_names:
            if key not in got.state_names or key not in start.state_names:
                record("optimizer", f"{key} {entry.name} (not in both runs)", "missing", "present")
                continue
            record("optimizer", f"{key} {entry.name}", _tensor(got, other, key), _tensor(ref, entry, key),
                   _tensor(start, first, key))
    for name in mine:
        record("weights", f"fp32 {name} (only in the resumed run)", "present", "missing")
    for part, summary in out.items():
        diff, moved = norms[part]
        measure = 0.0 if diff == 0.0 else (math.sqrt(diff / moved) if moved > 0.0 else math.inf)
        summary["max_rel_diff"] = math.inf if exact_fail[part] else measure
        summary["within_tolerance"] = not exact_fail[part] and measure <= tolerance
    return out


__all__: List[str] = ["PARTS", "compare_checkpoints"]
