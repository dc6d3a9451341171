"""`zeropilot calibrate`: measure this machine into a hardware profile for ``plan`` and ``check``.

Parse -> :func:`zeropilot.calibrate.run.calibrate` -> write the profile -> print it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zeropilot import extras
from zeropilot.errors import InputError

GIB = 1024**3


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure memory outside PyTorch, the allocator, the card's speed and the disk into a "
                          "hardware profile",
        description="A 1-2 min run on this machine (CUDA or ROCm/DTK; CPU-only machines get a profile that "
                    "says which GPU fields are unmeasured): memory outside PyTorch per rank at --nproc ranks "
                    "(context, BLAS, NCCL/RCCL, a small DeepSpeed ZeRO-3 run), whether expandable_segments "
                    "takes effect, the card's speed (bf16 matrix products at a layer's shapes, attention, memory "
                    "and pinned host copies, eager launch overhead, DeepSpeed's CPUAdam and torch's AdamW on the "
                    "host) and the disk's write speed where checkpoints go. `plan` and `check` use the profile "
                    "(--hardware FILE, or found by GPU model).")
    p.add_argument("--nproc", type=int, default=1, help="ranks, one per GPU (the world size to measure; default 1)")
    p.add_argument("--out", help="profile file (default ~/.config/zeropilot/hardware/<gpu>-ws<N>.json, where "
                                 "plan finds it)")
    p.add_argument("--checkpoint-dir", default=".", help="where checkpoints go: the disk to time (default .)")
    p.add_argument("--disk-mib", type=int, default=1024, help="MiB written to time the disk (default 1024)")
    p.add_argument("--network-mib", type=int, default=64,
                   help="MiB per all-gather / reduce-scatter when timing the links between ranks (--nproc 2 or "
                        "more, or run as the ranks of a launch across nodes: `torchrun ... -m zeropilot calibrate`; "
                        "default 64)")
    p.add_argument("--adam-elems", type=int, default=None,
                   help="fp32 elements of the partition CPUAdam and torch's AdamW step over (default: 16 bytes an "
                        "element at least 4 times the host's last-level cache, at least 2^26, at most a quarter of "
                        "its available memory: docs/calibrate.md)")
    p.add_argument("--no-cpu-adam", dest="cpu_adam", action="store_false",
                   help="leave DeepSpeed's CPUAdam rate out (its op is compiled on first use: about a minute)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _gib(n) -> str:
    return "unmeasured" if n is None else f"{n / GIB:.2f} GiB"


def render(profile, path: Path) -> str:
    """The profile for people, with what is unmeasured and why."""
    lines = [f"zeropilot calibrate: {profile.gpu_name or 'no GPU'} ({profile.vendor}), world size "
             f"{profile.world_size}, {profile.wall_s} s",
             f"  outside PyTorch per rank: {_gib(profile.outside_torch_bytes)}"
             + "".join(f"; after {k}: {_gib(v)}" for k, v in profile.phases.items() if v is not None),
             f"  expandable_segments takes effect: "
             f"{'unmeasured' if profile.expandable_segments is None else profile.expandable_segments}",
             f"  disk write ({profile.disk_path}): {profile.disk_write_bytes_per_s / 1e9:.2f} GB/s",
             f"  host memory: {_gib(profile.host_mem_bytes)}"]
    if profile.nodes > 1:
        lines.append(f"  nodes: {profile.nodes}, {profile.ranks_per_node or '?'} ranks per node; outside PyTorch per "
                     "node: " + ", ".join(f"{k} {_gib(v)}" for k, v in profile.outside_torch_per_node.items()))
    for kind, entry in profile.network.items():
        lines.append(f"  network, {kind.replace('_', '-')} ({entry.get('ranks')} ranks, "
                     f"{profile.network_backend}): " + ", ".join(
                         f"{op.replace('_', '-')} {m['busbw_bytes_per_s'] / 1e9:.3f} GB/s"
                         for op, m in entry.items() if isinstance(m, dict)))
    lines += speed_lines(profile.speed)
    lines += [f"  unmeasured: {k}: {v}" for k, v in profile.unmeasured.items()]
    lines.append(f"profile written to {path}")
    return "\n".join(lines) + "\n"


def _rate(value, scale: float, unit: str) -> str:
    return "unmeasured" if value is None else f"{value / scale:.4g} {unit}"


def speed_lines(speed) -> list:
    """The profile's speed figures in words (none for a profile without them)."""
    if not speed:
        return []
    large = [p for p in speed["matmul_points"] if p["m"] >= 2048]
    adam = (f"; op built or loaded in {speed['cpu_adam_build_s']:.1f} s" if speed.get("cpu_adam_build_s") else "")
    shapes = f" (median of {len(large)} layer shapes with m >= 2048)" if large else ""
    out = [f"  matmul bf16: {_rate(speed['matmul_flops_per_s'], 1e12, 'TFLOP/s')}{shapes}; attention (sdpa, causal, "
           f"forward + backward): "
           f"{_rate(speed['attention_flops_per_s'], 1e12, 'TFLOP/s')}",
           f"  device memory (copy, read + written): {_rate(speed['mem_bytes_per_s'], 1e12, 'TB/s')}; pinned "
           f"host->device {_rate(speed['h2d_bytes_per_s'], 1e9, 'GB/s')}, device->host "
           f"{_rate(speed['d2h_bytes_per_s'], 1e9, 'GB/s')}",
           f"  host, {speed.get('cpu_adam_threads') or '?'} threads, {speed.get('cpu_adam_elems') or '?'} elements: "
           f"DeepSpeed CPUAdam "
           f"{_rate(speed['cpu_adam_elems_per_s'], 1e9, 'G elements/s')}{adam}; torch AdamW "
           f"{_rate(speed['torch_cpu_adamw_elems_per_s'], 1e9, 'G elements/s')}",
           f"  eager launch ({speed.get('launch_device') or '?'}): {_rate(speed['launch_s'], 1e-6, 'us')} per op "
           f"({_rate(speed['launch_issue_s'], 1e-6, 'us')} to issue); speed measured in "
           f"{_rate(speed['seconds'], 1, 's')}"]
    out += [f"    matmul {p['m']} x {p['k']} x {p['n']}: {p['flops_per_s'] / 1e12:.4g} TFLOP/s"
            for p in speed["matmul_points"]]
    out += [f"    attention b{p['batch']} h{p['heads']} s{p['seq']} d{p['head_dim']}: "
            f"{p['flops_per_s'] / 1e12:.4g} TFLOP/s" for p in speed["attention_points"]]
    return out


def document(profile, path: Path) -> dict:
    """``zeropilot.calibrate/1``: the profile's fields, its file format version as ``profile_schema``, and
    ``path``, where it was written (the file itself keeps ``"schema": 1``: it is what ``plan`` loads)."""
    from zeropilot.envelope import CALIBRATE_SCHEMA, envelope

    fields = profile.to_dict()
    fields["profile_schema"] = fields.pop("schema")
    return envelope(CALIBRATE_SCHEMA, {**fields, "path": str(path)})


def run(args: argparse.Namespace) -> int:
    from zeropilot.memory.profile import file_name, search_dirs
    from zeropilot.calibrate.run import calibrate, write_profile
    from zeropilot.envelope import dumps

    from zeropilot.calibrate.launched import calibrate_launched, launched
    from zeropilot.safefile import check_output, kind_of

    extras.need("calibrate", "measures this machine with torch in worker processes", "calibrate", ["torch"])
    if args.out:
        check_output(Path(args.out))  # before a minute of measuring, not after
    if kind_of(args.checkpoint_dir) != "dir":
        raise InputError("--checkpoint-dir: not a folder" if kind_of(args.checkpoint_dir) else
                         "--checkpoint-dir: no such folder", args.checkpoint_dir)
    if not 1 <= args.network_mib <= 4096:
        raise InputError(f"--network-mib {args.network_mib}: 1 to 4096")
    if args.adam_elems is not None and not 1 <= args.adam_elems <= 1 << 34:
        raise InputError(f"--adam-elems {args.adam_elems}: 1 to 2^34")
    if launched():  # a rank of the user's own launch (across nodes): measure here, rank 0 writes the profile
        profile = calibrate_launched(Path(args.checkpoint_dir), args.disk_mib, args.network_mib,
                                     cpu_adam=args.cpu_adam, adam_elems=args.adam_elems)
        if profile is None:
            return 0
    else:
        profile = calibrate(args.nproc, Path(args.checkpoint_dir), args.disk_mib, cpu_adam=args.cpu_adam,
                            network_mib=args.network_mib, adam_elems=args.adam_elems)
    path = Path(args.out) if args.out else search_dirs()[0] / file_name(profile)
    write_profile(profile, path)
    if args.format == "json":
        sys.stdout.write(dumps(document(profile, path)))
    else:
        print(render(profile, path), end="")
    return 0
