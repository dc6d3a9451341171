"""The training state of one rank as comparable parts, and the comparison of two runs' states.

A rank's state is flattened into ``{part: {path: value}}``: ``weights`` (the 16-bit/fp32 parameters this rank
holds and the optimizer's fp32 master partitions), ``optimizer`` (Adam moments, its step counts, param-group
values but the learning rate), ``scheduler`` (its state and the learning rate in force), ``step`` (the engine's
step and sample counters), ``rng`` (torch, CUDA, Python and NumPy generator states) and ``data`` (the sampler's
position and the digest of the sample order so far). Tensors up to ``keep_whole`` elements are kept; larger ones
(a 7B model's frozen base) are replaced by digests computed in chunks on their device: a position-weighted
integer checksum of their bits (bitwise comparison) and float64 sums (size of a difference).
Imports torch lazily.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

CHUNK = 1 << 24
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _bits(t):
    import torch

    flat = t.detach().reshape(-1)
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return flat.view(by_size[flat.element_size()])


def digest(t) -> Dict[str, Any]:
    """Checksums of a large tensor, chunk by chunk on its own device (bounded extra memory)."""
    import torch

    bits = _bits(t)
    check = 0
    total = 0.0
    sq = 0.0
    for start in range(0, bits.numel(), CHUNK):
        chunk = bits[start:start + CHUNK].to(torch.int64)
        weights = torch.arange(start + 1, start + 1 + chunk.numel(), device=chunk.device, dtype=torch.int64) % 65521
        check = (check + int((chunk * weights).sum().item())) % (1 << 61)
        vals = t.detach().reshape(-1)[start:start + CHUNK].double()
        total += float(vals.sum().item())
        sq += float((vals * vals).sum().item())
    return {"digest": True, "shape": list(t.shape), "dtype": str(t.dtype), "check": check, "sum": total,
            "sumsq": sq}


def _leaf(value: Any, keep_whole: int) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() <= keep_whole:
            return value.detach().to("cpu", copy=True)
        return digest(value)
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):  # plain types only: an IntEnum (ZeroStageEnum) would not load weights_only
        if isinstance(value, kind):
            return kind(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a NumPy scalar
        return value.item()
    return _ADDRESS.sub("", repr(value))


def flatten(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """(path, leaf) pairs of nested dicts, lists, tuples and plain objects (a loss scaler: its attributes)."""
    import torch

    if depth > 8:
        yield prefix, _ADDRESS.sub("", repr(obj))
    elif isinstance(obj, dict):
        for key in obj:
            yield from flatten(obj[key], f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from flatten(item, f"{prefix}[{i}]", depth + 1)
    elif not isinstance(obj, (torch.Tensor, bool, int, float, str, type(None))) and hasattr(obj, "__dict__"):
        yield from flatten(dict(vars(obj)), prefix, depth + 1)
    else:
        yield prefix, obj


def _optimizer_part(path: str) -> str:
    low = path.lower()
    if "fp32" in low or "single_partition" in low:
        return "weights"
    if low.endswith(".lr") or low.endswith("initial_lr"):
        return "scheduler"
    return "optimizer"


def _rng_states() -> Dict[str, Any]:
    import random

    import numpy as np
    import torch

    out: Dict[str, Any] = {"torch": torch.get_rng_state(),
                           "python": hashlib.sha256(repr(random.getstate()).encode()).hexdigest(),
                           "numpy": hashlib.sha256(repr(np.random.get_state()).encode()).hexdigest()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def capture(engine, data_state: Dict[str, Any], keep_whole: int) -> Dict[str, Dict[str, Any]]:
    """This rank's state as parts (see the module docstring)."""
    parts: Dict[str, Dict[str, Any]] = {p: {} for p in ("weights", "optimizer", "scheduler", "step", "rng", "data")}
    for name, p in engine.module.named_parameters():
        local = getattr(p, "ds_tensor", None)  # ZeRO-3: this rank's partition; the parameter itself is empty
        parts["weights"][f"module.{name}"] = _leaf(local if local is not None else p.data, keep_whole)
    for path, value in flatten(engine.optimizer.state_dict(), "optimizer"):
        parts[_optimizer_part(path)][path] = _leaf(value, keep_whole)
    sched = engine.lr_scheduler
    if sched is not None:
        for path, value in flatten({k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}, "scheduler"):
            parts["scheduler"][path] = _leaf(value, keep_whole)
        parts["scheduler"]["lr_in_force"] = [float(g["lr"]) for g in engine.optimizer.param_groups]
    for attr in ("global_steps", "global_samples", "skipped_steps"):
        parts["step"][attr] = getattr(engine, attr, None)
    # DeepSpeed does not save micro_steps (a loaded engine counts from 0); only its phase within the
    # accumulation window decides the next boundary, and saves happen on a boundary.
    parts["step"]["micro_steps % gradient_accumulation_steps"] = (
        engine.micro_steps % engine.gradient_accumulation_steps())
    for path, value in flatten(_rng_states(), "rng"):
        parts["rng"][path] = _leaf(value, keep_whole)
    for path, value in flatten(data_state, "data"):
        parts["data"][path] = value
    return parts


def _tensor_diff(a, b) -> Tuple[bool, Optional[float]]:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False, math.inf
    if torch.equal(_bits(a), _bits(b)):
        return True, 0.0
    if not (a.is_floating_point()):
        return False, math.inf
    diff = (a.double() - b.double()).abs()
    diff = torch.nan_to_num(diff, nan=math.inf)
    scale = max(float(b.double().abs().max().item()) if b.numel() else 0.0, 1e-12)
    return False, float(diff.max().item()) / scale


def compare_leaf(a: Any, b: Any) -> Tuple[bool, Optional[float]]:
    """(bitwise equal, relative size of the difference: max |a-b| / max |b|; inf when not comparable)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _tensor_diff(a, b)
    if isinstance(a, dict) and a.get("digest") and isinstance(b, dict) and b.get("digest"):
        same = all(a[k] == b[k] for k in ("shape", "dtype", "check"))
        if same:
            return True, 0.0
        n = max(1, math.prod(b["shape"]))
        rms = math.sqrt(max(b["sumsq"], 0.0) / n) or 1e-12
        return False, abs(a["sum"] - b["sum"]) / n / rms if a["shape"] == b["shape"] else math.inf
    if isinstance(a, float) and isinstance(b, float):
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True, 0.0
        return False, abs(a - b) / max(abs(b), 1e-12)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        results = [compare_leaf(x, y) for x, y in zip(a, b)]
        return all(r[0] for r in results), max((r[1] or 0.0) for r in results) if results else 0.0
    return a == b, 0.0 if a == b else math.inf


def compare(resumed: Dict[str, Dict[str, Any]], reference: Dict[str, Dict[str, Any]],
            tolerance: float) -> Dict[str, Dict[str, Any]]:
    """Per part: bitwise equal?, within tolerance?, the worst relative difference and the first paths that differ."""
    out: Dict[str, Dict[str, Any]] = {}
    for part in reference:
        ref, got = reference[part], resumed.get(part, {})
        differing: List[str] = []
        worst = 0.0
        for path in sorted(set(ref) | set(got)):
            if path not in ref or path not in got:
                differing.append(f"{path} (only in the {'resumed' if path in got else 'uninterrupted'} run)")
                worst = math.inf
                continue
            equal, rel = compare_leaf(got[path], ref[path])
            if not equal:
                differing.append(path)
                worst = max(worst, rel if rel is not None else math.inf)
        out[part] = {"bitwise": not differing, "max_rel_diff": worst,
                     "within_tolerance": not differing or worst <= tolerance,
                     "differing": differing[:8], "n_differing": len(differing), "n_compared": len(ref)}
    return out
