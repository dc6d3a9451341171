"""``zeropilot calibrate`` as a rank of the user's own launch across nodes (imports torch).

    torchrun --nnodes 2 --nproc_per_node 8 --node_rank K --master_addr node0 --master_port 29500 \\
        -m zeropilot calibrate --out cluster.json --checkpoint-dir /shared/ckpt

Every rank measures what it holds outside PyTorch after each phase on its own GPU (the worker's phases, now with
inter-node NCCL in the ``comm`` and ``deepspeed`` phases) and the network (:mod:`zeropilot.calibrate.network`);
rank 0 gathers them (``all_gather_object``: this is calibrate's own job, not the guard, so collectives are fine),
times its disk and writes one profile: per node the largest outside-PyTorch figure, the job's largest as the
profile's figure, ``nodes``/``ranks_per_node``, and the network. On a machine without a GPU the group is gloo and
every GPU figure is unmeasured; the network figures are then gloo's on this machine's sockets (``measured_on``).
Rank 0 then measures the speed figures of its GPU and host (:mod:`zeropilot.calibrate.speed`) with the threads the
launch gave it (torchrun sets ``OMP_NUM_THREADS=1`` for several ranks per node unless told otherwise).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.memory.profile import Profile, speed_fields
from zeropilot.runlog.nodes import rank_place


def launched(env: Optional[Dict[str, str]] = None) -> bool:
    """Whether this process is a rank of a launch (``RANK`` and ``WORLD_SIZE`` set by torchrun & co.)."""
    env = os.environ if env is None else env
    return "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env


def _measure_rank(network_bytes: int, iters: int) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from zeropilot.calibrate import network, worker

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    place = rank_place(os.environ, socket.gethostname())
    out: Dict[str, Any] = {"rank": rank, "world_size": world, "phases": {}, "unmeasured": {}, "place": place,
                           "vendor": "rocm" if getattr(torch.version, "hip", None) else
                           ("cuda" if torch.cuda.is_available() else "cpu"),
                           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                        "hip": getattr(torch.version, "hip", None)}}
    if torch.cuda.is_available():
        worker._gpu(torch, dist, rank, world, local, out)
        device = torch.device("cuda", local)
    else:
        dist.init_process_group("gloo")
        out["unmeasured"]["gpu"] = "no GPU visible to PyTorch: GPU fields are unmeasured (CPU run, gloo only)"
        device = torch.device("cpu")
    nodes: List[Any] = [None] * world
    dist.all_gather_object(nodes, (place.get("node_rank"), place.get("hostname")))
    out["network"] = network.measure(torch, dist, rank, nodes, network_bytes, iters, device)
    return out


def calibrate_launched(checkpoint_dir: Path, disk_mib: int, network_mib: int, iters: int = 5,
                       cpu_adam: bool = True, adam_elems: Optional[int] = None) -> Optional[Profile]:
    """Measure this rank; rank 0 returns the job's profile, the other ranks None (``cpu_adam``: rank 0 times
    DeepSpeed's CPUAdam, whose op is built on first use; ``adam_elems``: its partition, None for one past the
    host's last-level cache).

    Raises:
        InputError: an unwritable checkpoint directory (rank 0).
    """
    import torch.distributed as dist

    from zeropilot.calibrate import network
    from zeropilot.calibrate.run import disk_write_speed, host_mem_bytes

    t0 = time.time()
    mine = _measure_rank(max(network_mib, 1) << 20, iters)
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    import torch

    from zeropilot.calibrate import speed

    fast, why = speed.measure(torch, None if cpu_adam else "--no-cpu-adam: DeepSpeed's CPUAdam was not measured",
                              adam_elems)
    profile = _profile(gathered, disk_write_speed(checkpoint_dir, disk_mib), str(checkpoint_dir.resolve()),
                       host_mem_bytes(), network.combine([r["network"] for r in gathered]), round(time.time() - t0, 1))
    return replace(profile, speed=speed_fields(fast, "measured by rank 0"), unmeasured={**profile.unmeasured, **why})


def _node_of(r: Dict[str, Any]) -> str:
    place = r.get("place") or {}
    return f"node {place['node_rank']}" if place.get("node_rank") is not None else f"host {place.get('hostname')}"


def _profile(ranks: List[Dict[str, Any]], speed: float, disk_path: str, host_mem: Optional[int],
             net: Dict[str, Any], wall: float) -> Profile:
    first = ranks[0]
    gpu = first["vendor"] != "cpu"
    per_node: Dict[str, Optional[int]] = {}
    phases: Dict[str, Optional[int]] = {}
    for name in ("context", "blas", "comm", "deepspeed"):
        vals = [r["phases"].get(name) for r in ranks if r["phases"].get(name) is not None]
        phases[name] = max(vals) if vals else None
    for r in ranks:
        key = "deepspeed" if r["phases"].get("deepspeed") is not None else "comm"
        value = r["phases"].get(key)
        node = _node_of(r)
        if value is not None:
            per_node[node] = max(per_node.get(node) or 0, value)
        else:
            per_node.setdefault(node, None)
    outside = phases["deepspeed"] if phases["deepspeed"] is not None else phases["comm"]
    unmeasured = dict(first.get("unmeasured", {}))
    if not gpu:
        unmeasured.update(outside_torch_bytes=unmeasured.get("gpu", "no GPU"),
                          expandable_segments="no GPU: the allocator was not exercised",
                          network="gloo on CPU sockets: not what NCCL reaches between GPU nodes")
    nodes = len(per_node)
    return Profile(gpu_name=first.get("gpu_name"), vendor=first["vendor"], world_size=len(ranks),
                   gpu_total_bytes=first.get("gpu_total_bytes"), outside_torch_bytes=outside, phases=phases,
                   disk_write_bytes_per_s=speed, disk_path=disk_path, host_mem_bytes=host_mem,
                   versions=first.get("versions", {}), wall_s=wall, unmeasured=unmeasured, nodes=nodes,
                   ranks_per_node=len(ranks) // nodes if nodes and len(ranks) % nodes == 0 else None,
                   outside_torch_per_node=per_node, network=net,
                   network_backend="nccl" if gpu else "gloo")
