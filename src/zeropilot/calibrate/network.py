"""The network's speed for the collectives ZeRO issues (all-gather and reduce-scatter), measured inside the ranks
of a launch (imports torch; started by :mod:`zeropilot.calibrate.launched`, never by the core).

Each collective runs on three kinds of group, every rank creating every group in the same order (``new_group``
is collective): ``world`` (all ranks: what ZeRO-3's gathers and gradient reduce-scatters span), ``intra_node`` (the
ranks of one node; all nodes at once) and ``inter_node`` (one rank per node, local rank 0: the link between nodes
alone). Figures are bus bandwidth as nccl-tests defines it for these two collectives: ``algbw = bytes / time``,
``busbw = algbw * (n - 1) / n`` with ``bytes`` the whole gathered (or reduced) tensor, so a figure does not depend
on the group's size for a ring; the median of ``iters`` timed runs after one warm-up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List


def node_groups(nodes_of_ranks: List[Any]) -> Dict[str, List[List[int]]]:
    """Rank lists per group kind, from each global rank's node (any hashable, in rank order)."""
    by_node: Dict[Any, List[int]] = {}
    for rank, node in enumerate(nodes_of_ranks):
        by_node.setdefault(node, []).append(rank)
    firsts = [ranks[0] for ranks in by_node.values()]
    return {"world": [list(range(len(nodes_of_ranks)))], "intra_node": list(by_node.values()),
            "inter_node": [firsts]}


def _time(fn, sync, iters: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(torch, dist, rank: int, nodes_of_ranks: List[Any], nbytes: int, iters: int, device) -> Dict[str, Any]:
    """This rank's timings of all-gather and reduce-scatter per group kind (``None`` where it is not a member or the
    group has one rank). Every rank must call it (it creates the groups and barriers between the runs)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: Dict[str, Any] = {}
    for kind, lists in node_groups(nodes_of_ranks).items():
        mine = None
        for ranks in lists:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                mine = (group, len(ranks))
        result: Dict[str, Any] = {"all_gather": None, "reduce_scatter": None, "ranks": None}
        if mine is not None and mine[0] is not None:
            group, n = mine
            shard = max(nbytes // n // 4, 1)
            whole = torch.zeros(shard * n, dtype=torch.float32, device=device)
            part = torch.ones(shard, dtype=torch.float32, device=device)
            size = whole.numel() * 4
            for op, fn in (("all_gather", lambda: dist.all_gather_into_tensor(whole, part, group=group)),
                           ("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, whole, group=group))):
                t = _time(fn, sync, iters)
                result[op] = {"bytes": size, "seconds": t, "busbw_bytes_per_s": size / t * (n - 1) / n}
            result["ranks"] = n
        out[kind] = result
        dist.barrier()
    return out


def combine(per_rank: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The profile's ``network``: per group kind and collective, the slowest member's bus bandwidth (a collective
    ends when its slowest rank does), with the bytes and group size it was measured at."""
    out: Dict[str, Any] = {}
    for kind in ("world", "intra_node", "inter_node"):
        entry: Dict[str, Any] = {}
        for op in ("all_gather", "reduce_scatter"):
            got = [r[kind][op] for r in per_rank if r.get(kind) and r[kind].get(op)]
            if got:
                slow = min(got, key=lambda x: x["busbw_bytes_per_s"])
                entry[op] = {"busbw_bytes_per_s": slow["busbw_bytes_per_s"], "bytes": slow["bytes"],
                             "seconds": slow["seconds"]}
        sizes = [r[kind]["ranks"] for r in per_rank if r.get(kind) and r[kind].get("ranks")]
        if entry:
            entry["ranks"] = max(sizes)
            out[kind] = entry
    return out
