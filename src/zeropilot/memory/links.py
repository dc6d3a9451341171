"""What one collective over the job's ranks costs: the bus bandwidth of the ring within a node or across nodes, and
NCCL's latency per collective, each with where it came from.

Pure: the figures come from :class:`~zeropilot.memory.speed.Speed` (``calibrate``'s measurements or the card table's
estimate) and, across nodes, from a profile measured across nodes, the user's ``--inter-node-gbps``, or the stated
assumption :data:`ASSUMED_NODE_GBPS`; never a silent one: :class:`Ring` says which it used and whether it was
measured.

A ring all-gather (or reduce-scatter) of a whole tensor of ``S`` bytes over ``n`` ranks moves ``S (n - 1) / n`` bytes
through each rank's slowest link, so it takes ``S (n - 1) / n / busbw`` (nccl-tests' bus bandwidth, which does not
depend on ``n`` for a ring). Across nodes NCCL builds one ring per channel, each leaving every node through one of
its network ports, so the bytes of all the rings cross each node's network once: the ring's bus bandwidth is the
node's network bandwidth (all its ports, one direction), or the link within the node where that is slower. Plus a
latency per collective, NCCL's own model (:data:`NCCL_TUNING`): ``baseLat + (n - 1 - (nodes - 1)) * intraLat +
(nodes - 1) * interLat`` for the Simple protocol of the ring, which large messages use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from zeropilot.memory.cards import CARDS
from zeropilot.memory.speed import Figure, Speed

#: NCCL's tuning model, the ring algorithm's Simple protocol, microseconds: ``baseLat`` once per collective and
#: ``hwLat`` per ring step within a node (NVLink or PCIe) and between nodes (NVIDIA/nccl ``src/graph/tuning.cc`` at
#: commit b6475625: ``baseLat`` Ring/Simple 8.4; ``hwLat`` Ring/Simple NVLink 3.4, PCI 5.7, NET 14.0; latency
#: ``baseLat + (nsteps - nInterSteps) * intraLat + nInterSteps * interLat`` with ``nsteps = nRanks - 1`` and
#: ``nInterSteps = nNodes - 1`` for all-gather and reduce-scatter)
NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (commit b6475625), ring algorithm, Simple protocol"
BASE_LATENCY_S = 8.4e-6
STEP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "net": 14.0e-6}
#: the network of one node (all its ports, one direction) assumed where nothing measured it and the user gave none:
#: one 400 Gb/s port (InfiniBand NDR, a ConnectX-7's rate) per node, at line rate (an upper bound: NCCL reaches less)
ASSUMED_NODE_GBPS = 400.0
ASSUMED_WHY = (f"assumed: one {ASSUMED_NODE_GBPS:.0f} Gb/s network port per node (InfiniBand NDR, a ConnectX-7's "
               "line rate; NCCL reaches less); give yours with --inter-node-gbps (all of a node's ports: a DGX H100's "
               "eight NDR ports are 3200), or run `zeropilot calibrate` as the ranks of a launch across your nodes")


@dataclass(frozen=True)
class Ring:
    """One collective over a group of ranks.

    Attributes:
        ranks: ranks in the group.
        nodes: nodes they span.
        busbw: bus bandwidth of the ring, bytes per second (nccl-tests' definition).
        latency_s: NCCL's latency of one all-gather or reduce-scatter over the group (:data:`NCCL_TUNING`).
        link: ``within the node`` or ``across N nodes``.
        source: where ``busbw`` came from, in words.
        measured: ``busbw`` was measured (``calibrate``), not estimated or assumed.
    """

    ranks: int
    nodes: int
    busbw: float
    latency_s: float
    link: str
    source: str
    measured: bool

    @property
    def basis(self) -> str:
        """``measured``, ``given`` (``--inter-node-gbps``), ``assumed`` (:data:`ASSUMED_WHY`) or ``estimated`` (the
        card table)."""
        if self.measured:
            return "measured"
        return next((word for start, word in (("flag", "given"), ("assumed", "assumed")) if start in self.source[:60]),
                    "estimated")

    def seconds(self, nbytes: float, collectives: int = 1) -> float:
        """Seconds to all-gather (or reduce-scatter) whole tensors of ``nbytes`` in ``collectives`` calls."""
        if self.ranks < 2:
            return 0.0
        return collectives * self.latency_s + nbytes * (self.ranks - 1) / self.ranks / self.busbw


def intra_kind(speed: Speed) -> str:
    """``nvlink`` or ``pcie``: the card's link to the other GPUs of its node (the card table's), PCIe where unknown."""
    card = CARDS.get(speed.card_key or "")
    return "nvlink" if card is not None and card.intra_link.startswith(("NVLink", "xGMI", "Infinity")) else "pcie"


def latency_s(ranks: int, nodes: int, intra: str) -> float:
    """NCCL's modelled latency of one ring all-gather or reduce-scatter (:data:`NCCL_TUNING`)."""
    if ranks < 2:
        return 0.0
    inter_steps = nodes - 1
    return BASE_LATENCY_S + (ranks - 1 - inter_steps) * STEP_LATENCY_S[intra] + inter_steps * STEP_LATENCY_S["net"]


def ring(speed: Speed, ranks: int, nodes: int = 1) -> Optional[Ring]:
    """The ring over ``ranks`` ranks on ``nodes`` nodes at the card's figures; None without the figure it needs
    (within a node: ``intra_busbw_bytes_per_s``; across nodes also ``inter_busbw_bytes_per_s``:
    :func:`with_inter_node` sets it)."""
    intra = speed.intra_busbw_bytes_per_s
    lat = latency_s(ranks, nodes, intra_kind(speed))
    if ranks < 2:
        return Ring(ranks, nodes, float("inf"), 0.0, "one rank", "no collective", True)
    if intra is None:
        return None
    if nodes <= 1:
        return Ring(ranks, 1, intra.value, lat, "within the node", intra.source, intra.measured)
    inter = speed.inter_busbw_bytes_per_s
    if inter is None:
        return None
    if inter.value <= intra.value:
        return Ring(ranks, nodes, inter.value, lat, f"across {nodes} nodes", inter.source, inter.measured)
    return Ring(ranks, nodes, intra.value, lat, f"across {nodes} nodes",
                f"the link within the node, slower than the network ({inter.value / 1e9:.0f} GB/s: {inter.source}): "
                + intra.source, intra.measured)


def with_inter_node(speed: Speed, gbps: Optional[float] = None) -> Speed:
    """``speed`` with its bus bandwidth across nodes: the user's ``gbps`` (a node's network, all ports, one
    direction, Gb/s) where given, else the measured one where a profile across nodes gave it, else
    :data:`ASSUMED_NODE_GBPS` with :data:`ASSUMED_WHY`."""
    if gbps is not None:
        fig = Figure(gbps * 1e9 / 8, f"flag --inter-node-gbps {gbps:g}: a node's network, {gbps:g} Gb/s each way at "
                                     "line rate, taken as the ring's bus bandwidth across nodes (NCCL reaches less)")
    elif speed.inter_busbw_bytes_per_s is not None:
        return speed
    else:
        fig = Figure(ASSUMED_NODE_GBPS * 1e9 / 8, ASSUMED_WHY)
    return replace(speed, inter_busbw_bytes_per_s=fig)
