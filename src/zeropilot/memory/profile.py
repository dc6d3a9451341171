"""Hardware profiles: what ``zeropilot calibrate`` measured on one machine, read by ``plan`` and ``check``.

Torch-free. A profile is a small JSON file (schema 1). ``plan --hardware FILE`` uses it; without the flag
``plan`` looks for one matching the visible GPU model and world size in ``$ZEROPILOT_HARDWARE_DIR``,
``~/.config/zeropilot/hardware`` and the profiles shipped in ``zeropilot/data/hardware``.
What a profile changes in a plan (:func:`apply`): memory outside PyTorch (context, BLAS, NCCL/RCCL at
the profile's world size), whether ``expandable_segments`` counts (only where it took effect), the disk's
write speed, the host's RAM and the card's memory. Its ``speed`` figures (matrix products, attention, memory and
host-link bandwidth, CPU Adam, launch overhead) are read by :func:`zeropilot.memory.speed.speed_for`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError

SCHEMA = 1
GIB = 1024**3
MAX_PROFILE_BYTES = 1 << 20
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "hardware"
# ZeRO-3 with the model built on the GPU (no zero.Init) held this much more outside PyTorch than inside
# zero.Init on the H200 (1.68 vs 1.29 GiB at world size 1, bench/plan); calibrate measures the zero.Init case.
RAW_BUILD_EXTRA = 0.38 * GIB


@dataclass(frozen=True)
class Profile:
    """One machine at one world size.

    Attributes:
        gpu_name: the device name PyTorch reports (``NVIDIA H200``, a DCU's name), None on a CPU run.
        vendor: ``cuda``, ``rocm`` or ``cpu``.
        world_size: processes the outside-PyTorch figure was measured with.
        gpu_total_bytes: one card's memory.
        outside_torch_bytes: per rank after a ZeRO-3 step (context + BLAS + NCCL/RCCL + DeepSpeed);
            None when not measured (``unmeasured`` says why).
        phases: outside-PyTorch bytes after each phase (``context``, ``blas``, ``comm``, ``deepspeed``).
        expandable_segments: whether ``expandable_segments:True`` took effect on this build (None: not
            measured).
        segment_bytes: segment sizes the allocator made for small and large requests.
        disk_write_bytes_per_s / disk_path: write speed (with fsync) where checkpoints go.
        host_mem_bytes: the host's RAM.
        versions: torch, its CUDA/HIP, DeepSpeed.
        wall_s: how long calibrate ran.
        unmeasured: field -> why it is missing.
        nodes: nodes the profile was measured across (1: one machine; more: ``calibrate`` run as the ranks of a
            launch across nodes, :mod:`zeropilot.calibrate.launched`); its outside-PyTorch figure then includes
            NCCL's inter-node buffers.
        ranks_per_node: ranks on each node, where they were as many on every node.
        outside_torch_per_node: node (``node N``) -> the largest outside-PyTorch figure of its ranks.
        network: per group kind (``world``, ``intra_node``, ``inter_node``) and collective (``all_gather``,
            ``reduce_scatter``): ``busbw_bytes_per_s`` (nccl-tests' bus bandwidth), ``bytes``, ``seconds``, and the
            group's ``ranks`` (:mod:`zeropilot.calibrate.network`).
        network_backend: ``nccl`` (GPUs) or ``gloo`` (a CPU run: not a GPU figure).
        speed: what one GPU and its host do per second (:data:`SPEED_FIGURES`, :data:`SPEED_POINTS`,
            :mod:`zeropilot.calibrate.speed`); a figure not measured is null, with its reason in ``unmeasured``
            under ``speed.<field>``. None in profiles written before calibrate measured speed.
        path: the file it was read from (not stored).
    """

    gpu_name: Optional[str]
    vendor: str
    world_size: int
    gpu_total_bytes: Optional[int] = None
    outside_torch_bytes: Optional[int] = None
    phases: Dict[str, Optional[int]] = field(default_factory=dict)
    expandable_segments: Optional[bool] = None
    segment_bytes: Dict[str, int] = field(default_factory=dict)
    disk_write_bytes_per_s: Optional[float] = None
    disk_path: Optional[str] = None
    host_mem_bytes: Optional[int] = None
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    wall_s: Optional[float] = None
    unmeasured: Dict[str, str] = field(default_factory=dict)
    nodes: int = 1
    ranks_per_node: Optional[int] = None
    outside_torch_per_node: Dict[str, Optional[int]] = field(default_factory=dict)
    network: Dict[str, Dict[str, object]] = field(default_factory=dict)
    network_backend: Optional[str] = None
    speed: Optional[Dict[str, object]] = None
    path: Optional[str] = field(default=None, compare=False)

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "path"}
        data["schema"] = SCHEMA
        return data


def _int_or_none(value, name: str, where: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value > 1 << 50:
        raise InputError(f"hardware profile {where}: {name} must be a non-negative number of bytes")
    return int(value)


def from_dict(data: dict, where: str = "profile") -> Profile:
    """Check and convert a profile's JSON.

    Raises:
        InputError: not a schema-1 profile, or a value of the wrong kind.
    """
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError(f"hardware profile {where}: not a zeropilot hardware profile (schema {SCHEMA})")
    ws = data.get("world_size")
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise InputError(f"hardware profile {where}: world_size must be a positive integer")
    vendor = data.get("vendor")
    if vendor not in ("cuda", "rocm", "cpu"):
        raise InputError(f"hardware profile {where}: vendor must be cuda, rocm or cpu")
    expandable = data.get("expandable_segments")
    if expandable is not None and not isinstance(expandable, bool):
        raise InputError(f"hardware profile {where}: expandable_segments must be true, false or null")
    disk = data.get("disk_write_bytes_per_s")
    if disk is not None and (isinstance(disk, bool) or not isinstance(disk, (int, float)) or disk <= 0):
        raise InputError(f"hardware profile {where}: disk_write_bytes_per_s must be positive")
    name = data.get("gpu_name")
    if name is not None and not isinstance(name, str):
        raise InputError(f"hardware profile {where}: gpu_name must be a string")
    phases = data.get("phases") or {}
    segs = data.get("segment_bytes") or {}
    if not isinstance(phases, dict) or not isinstance(segs, dict):
        raise InputError(f"hardware profile {where}: phases and segment_bytes must be objects")
    if not all(isinstance(data.get(k) or {}, dict) for k in ("versions", "unmeasured")):
        raise InputError(f"hardware profile {where}: versions and unmeasured must be objects")
    return Profile(
        gpu_name=name, vendor=vendor, world_size=ws,
        gpu_total_bytes=_int_or_none(data.get("gpu_total_bytes"), "gpu_total_bytes", where),
        outside_torch_bytes=_int_or_none(data.get("outside_torch_bytes"), "outside_torch_bytes", where),
        phases={str(k): _int_or_none(v, f"phases.{k}", where) for k, v in phases.items()},
        expandable_segments=expandable,
        segment_bytes={str(k): _int_or_none(v, f"segment_bytes.{k}", where) or 0 for k, v in segs.items()},
        disk_write_bytes_per_s=None if disk is None else float(disk),
        disk_path=data.get("disk_path") if isinstance(data.get("disk_path"), str) else None,
        host_mem_bytes=_int_or_none(data.get("host_mem_bytes"), "host_mem_bytes", where),
        versions={str(k): (str(v) if v is not None else None) for k, v in (data.get("versions") or {}).items()},
        wall_s=data.get("wall_s") if isinstance(data.get("wall_s"), (int, float)) else None,
        unmeasured={str(k): str(v) for k, v in (data.get("unmeasured") or {}).items()},
        **_nodes_fields(data, where), speed=speed_fields(data.get("speed"), where),
        path=where)


_NET_KINDS = ("world", "intra_node", "inter_node")
_NET_OPS = ("all_gather", "reduce_scatter")


def _nodes_fields(data: dict, where: str) -> dict:
    """The fields of a profile measured across nodes (absent in one-machine profiles: defaults)."""
    nodes = data.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 65536:
        raise InputError(f"hardware profile {where}: nodes must be a positive integer")
    per = data.get("ranks_per_node")
    if per is not None and (isinstance(per, bool) or not isinstance(per, int) or per < 1):
        raise InputError(f"hardware profile {where}: ranks_per_node must be a positive integer or null")
    outside = data.get("outside_torch_per_node")
    net = data.get("network")
    outside, net = {} if outside is None else outside, {} if net is None else net
    if not isinstance(outside, dict) or not isinstance(net, dict) or len(outside) > 65536:
        raise InputError(f"hardware profile {where}: outside_torch_per_node and network must be objects")
    network: Dict[str, Dict[str, object]] = {}
    for kind in _NET_KINDS:
        entry = net.get(kind)
        if not isinstance(entry, dict):
            continue
        clean: Dict[str, object] = {}
        for op in _NET_OPS:
            m = entry.get(op)
            bw = m.get("busbw_bytes_per_s") if isinstance(m, dict) else None
            if m is None:
                continue
            if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < 1e15:
                raise InputError(f"hardware profile {where}: network.{kind}.{op}.busbw_bytes_per_s must be positive")
            clean[op] = {"busbw_bytes_per_s": float(bw), "bytes": _int_or_none(m.get("bytes"), "bytes", where),
                         "seconds": m.get("seconds") if isinstance(m.get("seconds"), (int, float)) else None}
        ranks = entry.get("ranks")
        clean["ranks"] = ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 0 else None
        network[kind] = clean
    backend = data.get("network_backend")
    return {"nodes": nodes, "ranks_per_node": per,
            "outside_torch_per_node": {str(k)[:200]: _int_or_none(v, f"outside_torch_per_node.{k}", where)
                                       for k, v in outside.items()},
            "network": network, "network_backend": backend if backend in ("nccl", "gloo") else None}


#: the profile's ``speed`` numbers: field -> the largest value a card or host can have (a larger one is not a
#: measurement: 100 PFLOP/s, 100 TB/s, 10^13 elements/s, a second per eager op, a day of building)
SPEED_FIGURES = {"matmul_flops_per_s": 1e17, "attention_flops_per_s": 1e17, "mem_bytes_per_s": 1e14,
                 "h2d_bytes_per_s": 1e13, "d2h_bytes_per_s": 1e13, "cpu_adam_elems_per_s": 1e13,
                 "torch_cpu_adamw_elems_per_s": 1e13, "launch_s": 1.0, "launch_issue_s": 1.0,
                 "cpu_adam_build_s": 86400.0, "seconds": 86400.0}
#: the profile's ``speed`` lists of measured shapes: field -> the shape's integer keys (each point adds ``flops_per_s``)
SPEED_POINTS = {"matmul_points": ("m", "k", "n"), "attention_points": ("batch", "heads", "seq", "head_dim")}
_LAUNCH_DEVICES = ("cuda", "cpu")


def _positive(value, bound: float, name: str, where: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= bound:
        raise InputError(f"hardware profile {where}: speed.{name} must be a positive number up to {bound:g} or null")
    return float(value)


def _points(value, keys: Tuple[str, ...], name: str, where: str) -> List[Dict[str, float]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 256 or not all(isinstance(p, dict) for p in value):
        raise InputError(f"hardware profile {where}: speed.{name} must be a list of at most 256 objects")
    out = []
    for p in value:
        dims = [p.get(k) for k in keys]
        if any(isinstance(d, bool) or not isinstance(d, int) or not 0 < d <= 1 << 24 for d in dims):
            raise InputError(f"hardware profile {where}: speed.{name}: {', '.join(keys)} must be positive integers")
        out.append({**dict(zip(keys, dims)), "flops_per_s": _positive(p.get("flops_per_s"), 1e17, name, where)})
    return out


def speed_fields(data, where: str) -> Optional[Dict[str, object]]:
    """Check a profile's ``speed`` object (None when absent): every figure finite, positive and below its bound
    (:data:`SPEED_FIGURES`), the thread count a positive integer, the points well formed; other keys are dropped.

    Raises:
        InputError: one line naming the first bad value.
    """
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InputError(f"hardware profile {where}: speed must be an object or null")
    out: Dict[str, object] = {k: _positive(data.get(k), bound, k, where) for k, bound in SPEED_FIGURES.items()}
    out.update({k: _points(data.get(k), keys, k, where) for k, keys in SPEED_POINTS.items()})
    threads = data.get("cpu_adam_threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 0 < threads <= 1 << 16):
        raise InputError(f"hardware profile {where}: speed.cpu_adam_threads must be a positive integer or null")
    device = data.get("launch_device")
    if device is not None and device not in _LAUNCH_DEVICES:
        raise InputError(f"hardware profile {where}: speed.launch_device must be cuda, cpu or null")
    elems = data.get("cpu_adam_elems")
    if elems is not None and (isinstance(elems, bool) or not isinstance(elems, int) or not 0 < elems <= 1 << 40):
        raise InputError(f"hardware profile {where}: speed.cpu_adam_elems must be a positive integer or null")
    out.update(cpu_adam_threads=threads, cpu_adam_elems=elems, launch_device=device)
    return out


def load(path: str) -> Profile:
    """Read a profile file (at most 1 MiB).

    Raises:
        InputError: missing, too large, not JSON, or not a profile.
    """
    p = Path(path)
    raw = safefile.read_bytes(p, MAX_PROFILE_BYTES, too_large="larger than 1 MiB: not a hardware profile")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InputError(f"hardware profile is not JSON: {str(exc)[:120]}", p) from None
    return from_dict(data, str(p))


def slug(name: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200`` (the file-name stem of a profile)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def file_name(profile: Profile) -> str:
    """``<gpu>-ws<N>.json``; a profile measured across nodes adds ``-nodes<K>`` (never picked by :func:`find`:
    pass it with ``--hardware``)."""
    nodes = f"-nodes{profile.nodes}" if profile.nodes > 1 else ""
    return f"{slug(profile.gpu_name or 'cpu')}-ws{profile.world_size}{nodes}.json"


def search_dirs() -> List[Path]:
    dirs = []
    if os.environ.get("ZEROPILOT_HARDWARE_DIR"):
        dirs.append(Path(os.environ["ZEROPILOT_HARDWARE_DIR"]))
    dirs.append(Path.home() / ".config" / "zeropilot" / "hardware")
    dirs.append(SHIPPED)
    return dirs


def find(gpu_name: str, world_size: int) -> Optional[Profile]:
    """The profile for ``gpu_name`` closest to ``world_size`` (same, else 2 for > 2, else any), or None."""
    stem = slug(gpu_name)
    for d in search_dirs():
        found = {}
        for f in sorted(d.glob(f"{stem}-ws*.json")) if d.is_dir() else []:
            m = re.fullmatch(re.escape(stem) + r"-ws(\d+)\.json", f.name)
            if m:
                found[int(m.group(1))] = f
        if found:
            want = world_size if world_size in found else max((w for w in found if w <= world_size), default=None)
            pick = found[want if want is not None else min(found)]
            try:
                return load(str(pick))
            except InputError:
                continue
    return None


def with_outside_torch(constants, base: float, source: str, raw_build_extra: float = 0.0, nodes: int = 1):
    """Constants whose memory outside PyTorch is one measured per-rank figure (NCCL included, so no extra per
    world size), for ``nodes`` nodes: a hardware profile (one node, measured inside zero.Init: a build without
    it adds ``raw_build_extra``) or the user's own ``--outside-torch``."""
    return replace(constants, non_torch_zero12=base, non_torch_zero3_init=base, non_torch_zero3=base + raw_build_extra,
                   nccl_multi_gpu=0.0, outside_nodes=nodes, source=source)


def apply(profile: Profile, constants, world_size: int, stage: int) -> Tuple[object, List[str]]:
    """Constants with the profile's figures, and notes saying what changed.

    The profile's outside-PyTorch figure was measured at its own world size with ZeRO-3 inside zero.Init;
    it replaces the H200 figures (ZeRO-1/2 and zero.Init alike on the H200: 1.30 / 1.29 GiB); a build
    without zero.Init adds the H200's measured difference.
    """
    notes = []
    c = constants
    if profile.outside_torch_bytes is not None:
        base = profile.outside_torch_bytes
        across = f" on {profile.nodes} nodes" if profile.nodes > 1 else ""
        c = with_outside_torch(c, base, f"hardware profile {Path(profile.path or '').name or 'given'}, measured at "
                                        f"world size {profile.world_size}{across}", raw_build_extra=RAW_BUILD_EXTRA,
                               nodes=profile.nodes)
        notes.append(f"outside PyTorch: {base / GIB:.2f} GiB per rank from the hardware profile "
                     f"({profile.gpu_name}, world size {profile.world_size}{across})")
        if world_size != profile.world_size:
            notes.append(f"the profile was measured at world size {profile.world_size}, the plan is for "
                         f"{world_size}: run `zeropilot calibrate --nproc {min(world_size, 8)}` for this size")
    return c, notes
