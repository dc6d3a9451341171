"""Time a ZeRO optimizer step spends in its collectives, at the network speed a hardware profile measured.

Pure: the traffic follows from the plan's inputs, the speed from ``calibrate`` run across nodes
(:mod:`zeropilot.calibrate.network`, bus bandwidth as nccl-tests defines it). What is measured and what is assumed is
said in the result's ``measured`` and ``assumed`` lists.

Traffic per optimizer step, the 16-bit parameters ``P`` and trainable parameters ``T`` at 2 bytes each, ``ga`` micro
batches (the assumed model of DeepSpeed 0.19.8's collectives, not measured here):

- ZeRO-3: per micro batch the partitioned parameters each use gathers, as :mod:`zeropilot.memory.schedule` walks
  them (forward, backward and recomputation; a tensor kept between two uses, by the reuse distance or because the
  prefetcher passed its next use, is not gathered again; small persistent ones never), about ``2 * 2P``, and one
  reduce-scatter of the gradients: ``ga * gathered`` and ``ga * 2T`` bytes;
- ZeRO-2: per micro batch one reduce-scatter of the gradients, then one all-gather of the updated 16-bit
  partitions: ``ga * 2T`` and ``2T``;
- ZeRO-1: the gradients reduce-scattered once at the accumulation boundary, then the all-gather: ``2T`` and ``2T``;
- ZeRO-0: one all-reduce (a reduce-scatter and an all-gather) of ``2T``.

Seconds = bytes x (n - 1) / n / busbw per collective: the time a ring moves them at that bus bandwidth. Across nodes
the ``world`` figure (every rank, as ZeRO's groups are) measured across the profile's nodes is used; on one node the
``intra_node`` one. This is the bound without overlap: the step takes at least this long only where nothing
overlaps; the step time (:mod:`zeropilot.memory.schedule`) lays the same collectives over the compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from zeropilot.memory.gpu import trainable_params
from zeropilot.memory.inputs import PlanInputs
from zeropilot.models.params import count_params


@dataclass(frozen=True)
class StepComm:
    """One optimizer step's collectives: bytes per collective, seconds where a speed is known.

    Attributes:
        gathered_bytes / reduced_bytes: the whole tensors all-gathered and reduce-scattered per step.
        seconds: time at the profile's bus bandwidth, None without a figure (``reason`` says why).
        link: which figure was used (``world across 2 nodes``, ``intra_node``).
        busbw: collective -> bytes per second used.
        measured / assumed: what of this came from a measurement and what from the model.
    """

    gathered_bytes: int
    reduced_bytes: int
    seconds: Optional[float]
    link: Optional[str]
    busbw: Dict[str, float] = field(default_factory=dict)
    measured: List[str] = field(default_factory=list)
    assumed: List[str] = field(default_factory=list)
    reason: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"gathered_bytes": self.gathered_bytes, "reduced_bytes": self.reduced_bytes, "seconds": self.seconds,
                "link": self.link, "busbw_bytes_per_s": dict(self.busbw), "measured": list(self.measured),
                "assumed": list(self.assumed), "reason": self.reason}


def traffic(inputs: PlanInputs) -> Dict[str, int]:
    """Bytes all-gathered and reduce-scattered per optimizer step (module docstring)."""
    counts = count_params(inputs.arch)
    p, t, ga = 2 * counts.total, 2 * trainable_params(inputs, counts), inputs.grad_accum
    if inputs.stage == 3:
        from zeropilot.memory.schedule import BYTES, gathered

        return {"all_gather": int(ga * BYTES * gathered(inputs)), "reduce_scatter": ga * t}
    if inputs.stage == 2:
        return {"all_gather": t, "reduce_scatter": ga * t}
    return {"all_gather": t, "reduce_scatter": t}


def _pick(network: Dict[str, Any], nodes: int, profile_nodes: int) -> Optional[tuple]:
    if nodes > 1:
        entry = network.get("world") if profile_nodes > 1 else None
        return (entry, f"every rank, measured across {profile_nodes} nodes") if entry else None
    entry = network.get("intra_node") or (network.get("world") if profile_nodes == 1 else None)
    return (entry, "ranks of one node") if entry else None


def step_comm(inputs: PlanInputs, profile=None) -> StepComm:
    """The step's collectives for ``inputs`` at the network speed of ``profile`` (a hardware profile or None)."""
    n = inputs.world_size
    nodes = inputs.hardware.nodes if inputs.hardware else 1
    bytes_ = traffic(inputs)
    assumed = [f"traffic per optimizer step: the ZeRO-{inputs.stage} model of memory/comm.py (16-bit parameters and "
               f"gradients, {inputs.grad_accum} micro batch(es) per step)",
               "no overlap with the compute here (the step takes at least this long only where nothing overlaps); "
               "the step time's collectives (time.collectives) lay them over the compute"]
    base = dict(gathered_bytes=bytes_["all_gather"], reduced_bytes=bytes_["reduce_scatter"], assumed=assumed)
    if n < 2:
        return StepComm(seconds=0.0, link=None, reason="one rank: no collective", **base)
    network = getattr(profile, "network", None) or {}
    picked = _pick(network, nodes, getattr(profile, "nodes", 1)) if network else None
    if picked is None:
        why = ("no hardware profile with network figures: run `zeropilot calibrate` as the ranks of your launch "
               "across nodes (docs/calibrate.md)" if not network else
               f"the profile was measured on {getattr(profile, 'nodes', 1)} node(s), the plan is for {nodes}: no "
               "figure for the link between nodes")
        return StepComm(seconds=None, link=None, reason=why, **base)
    entry, link = picked
    seconds, busbw, measured = 0.0, {}, []
    for op in ("all_gather", "reduce_scatter"):
        m = entry.get(op)
        if not m:
            return StepComm(seconds=None, link=link, reason=f"the profile has no {op} figure", **base)
        bw = float(m["busbw_bytes_per_s"])
        busbw[op] = bw
        seconds += bytes_[op] * (n - 1) / n / bw
        measured.append(f"{op}: {bw / 1e9:.3f} GB/s bus bandwidth ({link}, {entry.get('ranks') or '?'} ranks, "
                        f"{(m.get('bytes') or 0) / 2**20:.0f} MiB, {getattr(profile, 'network_backend', None) or '?'})")
    if getattr(profile, "network_backend", None) == "gloo":
        measured.append("gloo on CPU sockets: a CPU figure, not what NCCL reaches between GPU nodes")
    if nodes > 1 and getattr(profile, "nodes", 1) < nodes:
        assumed.append(f"the bus bandwidth measured on {profile.nodes} nodes holds for {nodes} (a ring's bus "
                       "bandwidth does not depend on its size)")
    return StepComm(seconds=seconds, link=link, busbw=busbw, measured=measured, **base)


def render_lines(comm: StepComm) -> List[str]:
    """The plan's text lines for it."""
    gb = 1e9
    head = (f"Collectives per optimizer step: {comm.gathered_bytes / gb:.2f} GB all-gathered, "
            f"{comm.reduced_bytes / gb:.2f} GB reduce-scattered")
    if comm.seconds is None:
        lines = [head + f"; time unknown: {comm.reason}"]
    else:
        lines = [head + f": at least {comm.seconds:.2f} s per step at the measured speed ({comm.link})"]
    lines += [f"  measured: {m}" for m in comm.measured]
    lines += [f"  assumed: {a}" for a in comm.assumed]
    return lines
