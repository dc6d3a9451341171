"""The speed figures the time model reads: one GPU, its host and its links, each figure with where it came from.

A figure is either measured (``zeropilot calibrate`` on this card: a hardware profile's ``speed`` object) or an
estimate (the built-in card table, :mod:`zeropilot.memory.cards`, from the vendor's datasheet times a stated
efficiency), never a silent guess: :meth:`Speed.estimated` names every figure that was not measured, and the plan
prints them.

Pure data; :func:`speed_for` builds one from a card name and/or a profile. How each estimate is made, in its
``source``: a datasheet figure of the card table times a ratio, the ratio of what was measured on a table card to
that card's datasheet figure: a ``reference`` profile's measurements where one is given (:func:`reference_profile`,
the shipped profile that carries calibrate's speed figures), else what this project's GPU machines measured (the
device tool's notes, :data:`NOTES_MATMUL` and its neighbours) and two public measurements (:data:`FA2_ON_H100`,
:data:`NVBANDWIDTH_H2D`). A card the table does not know takes :data:`STAND_IN`'s datasheet figures, and a card
without a public figure takes the stand-in's for that figure, each said in its source and in ``notes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.memory.cards import CARDS, Card, Spec, lookup, match_device, pcie_peer
from zeropilot.memory.profile import SHIPPED, Profile, load


@dataclass(frozen=True)
class Figure:
    """One speed figure.

    Attributes:
        value: the figure in its unit (the field's name says which).
        source: where it came from, in words (``measured by zeropilot calibrate, profile nvidia-h100-ws1.json``,
            ``card table: H100 SXM datasheet 989 TFLOP/s x 0.80 (the ratio calibrate measured on an H100)``).
        measured: measured on this card and host (a profile), not estimated.
    """

    value: float
    source: str
    measured: bool = False


@dataclass(frozen=True)
class MatmulPoint:
    """A bf16 matrix product ``(m x k) @ (k x n)`` measured by ``calibrate``: FLOP/s = 2mkn / seconds."""

    m: int
    k: int
    n: int
    flops_per_s: float


@dataclass(frozen=True)
class Speed:
    """What one GPU and its host do per second.

    Attributes:
        card: the card's name as the table or the profile names it (``NVIDIA H100 80GB HBM3``).
        peak_flops_per_s: the card's dense bf16 peak by its datasheet (the denominator of MFU; never measured).
        matmul_flops_per_s: achievable dense bf16 matrix-product rate at a transformer layer's large shapes.
        matmul_points: the rates ``calibrate`` measured at several layer shapes (empty for an estimate); the time
            model reads the rate at a shape from them where they cover it.
        attention_flops_per_s: achievable rate of ``scaled_dot_product_attention`` (causal, bf16, forward and
            backward together), counted as the model counts attention FLOPs.
        mem_bytes_per_s: device memory bandwidth, bytes read plus written per second (a large device copy).
        h2d_bytes_per_s / d2h_bytes_per_s: pinned host-to-device and device-to-host copies.
        cpu_adam_elems_per_s: DeepSpeed's CPUAdam, fp32 elements updated per second by one process using
            ``cpu_adam_threads`` threads.
        torch_cpu_adamw_elems_per_s: torch's AdamW on the host (an offloaded optimizer with ``torch_adam``), the
            same unit, with the same threads.
        cpu_adam_threads: the threads the two CPU rates were measured with (None: unknown).
        launch_s: host time per eager kernel launch (PyTorch's dispatch and the launch), seconds.
        intra_busbw_bytes_per_s / inter_busbw_bytes_per_s: collective bus bandwidth (nccl-tests' definition)
            between the GPUs of one node and across nodes; None where neither measured nor in the table.
        notes: what the reader should know (a stand-in card, a profile of another card left out).
        card_key: the card table's key (``H100-SXM``), None for a card the table does not know.
    """

    card: str
    peak_flops_per_s: Figure
    matmul_flops_per_s: Figure
    attention_flops_per_s: Figure
    mem_bytes_per_s: Figure
    h2d_bytes_per_s: Figure
    d2h_bytes_per_s: Figure
    cpu_adam_elems_per_s: Figure
    torch_cpu_adamw_elems_per_s: Figure
    launch_s: Figure
    cpu_adam_threads: Optional[int] = None
    matmul_points: Tuple[MatmulPoint, ...] = ()
    intra_busbw_bytes_per_s: Optional[Figure] = None
    inter_busbw_bytes_per_s: Optional[Figure] = None
    notes: Tuple[str, ...] = field(default=())
    card_key: Optional[str] = None

    def figures(self) -> List[Tuple[str, Figure]]:
        """Every figure with its field name."""
        out = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Figure):
                out.append((name, value))
        return out

    def estimated(self) -> List[str]:
        """The names of the figures that were not measured on this card."""
        return [name for name, fig in self.figures() if not fig.measured and name != "peak_flops_per_s"]


#: the card whose datasheet figures stand in for a card the table does not know (the most common training card of
#: the table, and its 40 GB variant: the safe side for memory)
STAND_IN = "A100-40GB"
_NOTES = "the notes of this project's GPU machines, the device tool's KINDS.md, 2026-11"
#: an 8192 x 8192 x 8192 bf16 matrix product through PyTorch on an H100 80GB HBM3, random data (``_NOTES``)
NOTES_MATMUL = 798e12
#: a device-to-device copy on the same H100, bytes read plus written (``_NOTES``)
NOTES_COPY = 3.0e12
#: an all-reduce of 1 GiB over 8 H100s (NVLink, NVLink multicast off), bus bandwidth (``_NOTES``)
NOTES_ALLREDUCE = 361e9
#: FlashAttention-2's share of the H100's bf16 peak, forward and backward (FlashAttention-3 paper's abstract, arXiv
#: 2407.08608: "FlashAttention-2 achieving only 35% utilization on the H100 GPU")
FA2_ON_H100 = 0.35
#: nvbandwidth's pinned host-to-device copy on an A100-SXM4-40GB (github.com/NVIDIA/nvbandwidth issue 42, 1 GiB)
NVBANDWIDTH_H2D = 25.13e9
#: host figures for a card estimate with no profile that measured them: the median of four `zeropilot calibrate` runs
#: on this project's 2-core development host (DS_ACCELERATOR=cpu, OMP_NUM_THREADS=2, shared with other jobs;
#: bench/plan/time/calibrate_cpu/README.md), a low figure for a training host's CPU
DEFAULT_HOST_THREADS = 2
_DEV_HOST = ("median of 4 runs of zeropilot calibrate on the 2-core development host with 2 threads, not this one "
             "(bench/plan/time/calibrate_cpu/): a low figure for a training host")
DEFAULT_HOST = {"cpu_adam_elems_per_s": (6.99e8, _DEV_HOST), "torch_cpu_adamw_elems_per_s": (1.14e8, _DEV_HOST)}
DEFAULT_LAUNCH_S = 10e-6
DEFAULT_LAUNCH_WHY = ("assumed 10 us per eager op (PyTorch's dispatch and a kernel launch): `zeropilot calibrate` "
                      "measures it")


@dataclass(frozen=True)
class Ratio:
    """An achievable rate over its datasheet figure, and where the two came from."""

    value: float
    source: str


def _fmt(value: float, unit: str) -> str:
    scale = {"FLOP/s": 1e12, "B/s": 1e9, "elements/s": 1e9, "s": 1e-6}[unit]
    name = {"FLOP/s": "TFLOP/s", "B/s": "GB/s", "elements/s": "G elements/s", "s": "us"}[unit]
    return f"{value / scale:.4g} {name}"


def default_ratios() -> Dict[str, Ratio]:
    """The estimate ratios from what was measured on table cards before any profile carried speed figures."""
    h100, a100 = CARDS["H100-SXM"], CARDS["A100-40GB"]
    pcie = a100.host_bytes_per_s().value or 1.0
    h2d = Ratio(NVBANDWIDTH_H2D / pcie, "nvbandwidth's pinned host-to-device copy on an A100-SXM4-40GB, 25.13 GB/s "
                                        "(github.com/NVIDIA/nvbandwidth issue 42), over PCIe Gen4 x16's 31.5 GB/s")
    return {
        "matmul": Ratio(NOTES_MATMUL / (h100.bf16_flops_per_s.value or 1.0),
                        f"an 8192^3 bf16 matmul through PyTorch on an H100, 798 TFLOP/s ({_NOTES}), over its "
                        "datasheet 989.5"),
        "attention": Ratio(FA2_ON_H100, "FlashAttention-2's 35% of the H100's peak (FlashAttention-3 paper, "
                                        "arXiv 2407.08608)"),
        "mem": Ratio(NOTES_COPY / (h100.mem_bytes_per_s.value or 1.0),
                     f"a device-to-device copy on an H100, 3.0 TB/s counting bytes read and written ({_NOTES}), "
                     "over its datasheet 3.35 TB/s"),
        "h2d": h2d, "d2h": Ratio(h2d.value, h2d.source + "; device-to-host assumed the same"),
        "intra": Ratio(NOTES_ALLREDUCE / (h100.intra_bytes_per_s.value or 1.0),
                       f"an all-reduce of 1 GiB over 8 H100s at 361 GB/s bus bandwidth ({_NOTES}), over NVLink's "
                       "450 GB/s each way"),
    }


#: ratio name -> (the profile's speed field, the card's datasheet attribute, the unit)
_RATIO_FIELDS = {"matmul": ("matmul_flops_per_s", "bf16_flops_per_s", "FLOP/s"),
                 "attention": ("attention_flops_per_s", "bf16_flops_per_s", "FLOP/s"),
                 "mem": ("mem_bytes_per_s", "mem_bytes_per_s", "B/s"),
                 "h2d": ("h2d_bytes_per_s", "host", "B/s"), "d2h": ("d2h_bytes_per_s", "host", "B/s")}


def _spec_of(card: Card, attr: str) -> Spec:
    return card.host_bytes_per_s() if attr == "host" else getattr(card, attr)


def _name(profile: Profile) -> str:
    return Path(profile.path).name if profile.path else "given"


def ratios_from(reference: Optional[Profile]) -> Dict[str, Ratio]:
    """:func:`default_ratios` with each ratio the ``reference`` profile measured (on a table card) in its place."""
    out = default_ratios()
    card = match_device(reference.gpu_name) if reference is not None and reference.gpu_name else None
    if card is None or not reference.speed:
        return out
    where = f"zeropilot calibrate on {reference.gpu_name} (profile {_name(reference)})"
    for key, (fld, attr, unit) in _RATIO_FIELDS.items():
        got, sheet = reference.speed.get(fld), _spec_of(card, attr).value
        if got and sheet:
            out[key] = Ratio(got / sheet, f"the rate {where} measured, {_fmt(got, unit)}, over its datasheet "
                                          f"{_fmt(sheet, unit)}")
    busbw = _busbw(reference, "intra_node")
    if busbw is not None and card.intra_bytes_per_s.value:
        out["intra"] = Ratio(busbw / card.intra_bytes_per_s.value, f"the intra-node bus bandwidth {where} measured, "
                                                                   f"{_fmt(busbw, 'B/s')}, over its link's "
                                                                   f"{_fmt(card.intra_bytes_per_s.value, 'B/s')}")
    return out


def _busbw(profile: Optional[Profile], kind: str) -> Optional[float]:
    """The slower collective's bus bandwidth of a profile's ``kind`` group, measured with NCCL/RCCL (not gloo)."""
    if profile is None or profile.network_backend != "nccl":
        return None
    entry = profile.network.get(kind) or (profile.network.get("world") if kind == "intra_node" and profile.nodes == 1
                                          else None)
    got = [m["busbw_bytes_per_s"] for m in (entry or {}).values() if isinstance(m, dict)]
    return min(got) if got else None


def reference_profile() -> Optional[Profile]:
    """The first shipped profile (by file name) that measured the matrix-product rate on a card of the table: the
    ``reference`` the CLI passes to :func:`speed_for`; None while no shipped profile carries speed figures."""
    for path in sorted(SHIPPED.glob("*.json")):
        try:
            p = load(str(path))
        except InputError:
            continue
        if p.speed and p.speed.get("matmul_flops_per_s") and p.gpu_name and match_device(p.gpu_name):
            return p
    return None


@dataclass(frozen=True)
class _Estimate:
    """Datasheet figures times ratios for one card (``base``: the card, or the stand-in with ``why``)."""

    base: Card
    ratios: Dict[str, Ratio]
    why: str = ""

    def sheet(self, attr: str) -> Tuple[float, str]:
        spec, src = _spec_of(self.base, attr), f"card table, {self.base.key}{self.why}"
        if attr == "intra_bytes_per_s" and (spec.value is None or self.why):  # links not public, or another card's
            peer = pcie_peer(4, "assumed: the card's links are not in the table")
            return peer.value or 0.0, f"{peer.source}" if self.why else f"{src}: {spec.source}; {peer.source}"
        if spec.value is not None:
            return spec.value, f"{src}: {spec.source}"
        stand = _spec_of(CARDS[STAND_IN], attr)
        return stand.value or 0.0, f"{src}: {spec.source}; the {STAND_IN}'s figure stands in: {stand.source}"

    def rate(self, attr: str, ratio: str, unit: str) -> Figure:
        value, src = self.sheet(attr)
        r = self.ratios[ratio]
        return Figure(value * r.value, f"{src} ({_fmt(value, unit)}) x {r.value:.2f}, the ratio of {r.source}")


def _card_of(card: Optional[str], profile: Optional[Profile]) -> Optional[Card]:
    if card:
        return lookup(card)
    return match_device(profile.gpu_name) if profile is not None and profile.gpu_name else None


def _own(entry: Optional[Card], card: Optional[str], profile: Optional[Profile], notes: List[str]) -> dict:
    """The profile's speed figures where the profile is of the card asked about (or no card was named)."""
    if profile is None or not profile.speed:
        return {}
    if card and (profile.gpu_name is None or match_device(profile.gpu_name) is not entry):
        notes.append(f"hardware profile {_name(profile)} is of {profile.gpu_name or 'no GPU'}, not {entry.key}: its "
                     "GPU figures are left out (its host figures are used)")
        return {}
    return profile.speed


def _measured(own: dict, fld: str, where: str, estimate: Figure) -> Figure:
    value = own.get(fld)
    return Figure(float(value), f"measured by zeropilot calibrate on {where}", True) if value else estimate


def _gpu_figures(own: dict, where: str, est: _Estimate) -> dict:
    """The card's own figures: measured where the profile of this card has them, else datasheet x ratio."""
    return {"peak_flops_per_s": Figure(*est.sheet("bf16_flops_per_s")),
            "matmul_flops_per_s": _measured(own, "matmul_flops_per_s", where,
                                            est.rate("bf16_flops_per_s", "matmul", "FLOP/s")),
            "attention_flops_per_s": _measured(own, "attention_flops_per_s", where,
                                               est.rate("bf16_flops_per_s", "attention", "FLOP/s")),
            "mem_bytes_per_s": _measured(own, "mem_bytes_per_s", where, est.rate("mem_bytes_per_s", "mem", "B/s")),
            "h2d_bytes_per_s": _measured(own, "h2d_bytes_per_s", where, est.rate("host", "h2d", "B/s")),
            "d2h_bytes_per_s": _measured(own, "d2h_bytes_per_s", where, est.rate("host", "d2h", "B/s")),
            "matmul_points": tuple(MatmulPoint(p["m"], p["k"], p["n"], p["flops_per_s"])
                                   for p in own.get("matmul_points") or ())}


def _host_figures(profile: Optional[Profile], reference: Optional[Profile]) -> dict:
    """CPU Adam and AdamW: the profile's (measured on its host, whatever its GPU), else the reference's (another
    host: an estimate), else :data:`DEFAULT_HOST`; the threads of the one used."""
    for p, mine in ((profile, True), (reference, False)):
        figs = p.speed if p is not None and p.speed else {}
        if figs.get("cpu_adam_elems_per_s") or figs.get("torch_cpu_adamw_elems_per_s"):
            host = "this host" if mine else "the reference machine, not this host"
            out = {f: (Figure(float(figs[f]), f"measured by zeropilot calibrate on {host} (profile {_name(p)}, "
                                              f"{figs.get('cpu_adam_threads') or '?'} threads)", mine)
                       if figs.get(f) else Figure(*DEFAULT_HOST[f])) for f in DEFAULT_HOST}
            return {**out, "cpu_adam_threads": figs.get("cpu_adam_threads")}
    return {**{f: Figure(*DEFAULT_HOST[f]) for f in DEFAULT_HOST}, "cpu_adam_threads": DEFAULT_HOST_THREADS}


def _launch(own: dict, where: str, reference: Optional[Profile]) -> Figure:
    if own.get("launch_s"):
        return Figure(float(own["launch_s"]), f"measured by zeropilot calibrate on {where} "
                                              f"({own.get('launch_device') or '?'} tensors)", True)
    ref = reference.speed if reference is not None and reference.speed else {}
    if ref.get("launch_s") and ref.get("launch_device") == "cuda":
        return Figure(float(ref["launch_s"]), f"measured by zeropilot calibrate on {reference.gpu_name} (profile "
                                              f"{_name(reference)}), not this card")
    return Figure(DEFAULT_LAUNCH_S, DEFAULT_LAUNCH_WHY)


def _links(profile: Optional[Profile], est: _Estimate) -> dict:
    """Bus bandwidths: the profile's NCCL/RCCL measurements, else (within a node) the card's link x ratio. Across
    nodes the ``world`` group's (every rank, the ring ZeRO's collectives run over) where the profile spans nodes, else
    its ``inter_node`` one (one rank per node: one network port, a lower bound where a node has several)."""
    intra = _busbw(profile, "intra_node")
    many = profile is not None and profile.nodes > 1
    world = _busbw(profile, "world") if many else None
    inter = world or (_busbw(profile, "inter_node") if many else None)
    where = f"zeropilot calibrate (profile {_name(profile)})" if profile is not None else ""
    what = ("over every rank" if world else "one rank per node") + f" across {profile.nodes if many else 1} nodes"
    return {"intra_busbw_bytes_per_s": Figure(intra, f"measured by {where}: bus bandwidth within a node", True)
            if intra else est.rate("intra_bytes_per_s", "intra", "B/s"),
            "inter_busbw_bytes_per_s": Figure(inter, f"measured by {where}: bus bandwidth {what}", True)
            if inter else None}


def _unknown(profile: Optional[Profile]) -> str:
    name = profile.gpu_name if profile is not None and profile.gpu_name else None
    return (f"the card table does not know {name or 'the card'}: the {STAND_IN}'s datasheet figures stand in "
            "(--gpus COUNTxCARD names a card of the table; `zeropilot calibrate` measures yours)")


def speed_for(card: Optional[str] = None, profile: Optional[Profile] = None,
              reference: Optional[Profile] = None) -> Speed:
    """The speed figures of one GPU and its host, measured where a profile has them, estimated otherwise.

    Args:
        card: a card's name as a user types it (``H100``, ``A100-40GB``; :func:`~zeropilot.memory.cards.lookup`);
            None: the profile's GPU.
        profile: a hardware profile (``calibrate``): its ``speed`` figures count as measured when it is of ``card``
            (or no card is named), its host figures (CPU Adam, AdamW) in any case, its NCCL bus bandwidths for the
            links.
        reference: a profile measured on a table card whose rates over its datasheet give the estimate ratios
            (:func:`reference_profile`); None: :func:`default_ratios`.

    Returns:
        Every figure with its source; :meth:`Speed.estimated` names those not measured, ``notes`` what stood in.

    Raises:
        InputError: ``card`` is not in the table (the message lists the names it knows).
    """
    entry, notes = _card_of(card, profile), []
    own = _own(entry, card, profile, notes)
    if entry is None:
        notes.append(_unknown(profile))
    est = _Estimate(entry or CARDS[STAND_IN], ratios_from(reference), "" if entry else " (standing in)")
    where = f"{profile.gpu_name or 'this host'} (profile {_name(profile)})" if profile is not None else ""
    name = entry.title if entry else (profile.gpu_name if profile is not None and profile.gpu_name else "unknown card")
    return Speed(card=name, **_gpu_figures(own, where, est), **_host_figures(profile, reference),
                 launch_s=_launch(own, where, reference), **_links(profile, est), notes=tuple(notes),
                 card_key=entry.key if entry else None)


def speed_of(card: Optional[str], profile: Optional[Profile], world_size: int = 1) -> Speed:
    """The speed figures ``plan`` and ``report`` use: ``card`` is a name of the card table or a device's name as torch
    reports it; without ``profile``, the hardware profile found for that card (``calibrate``'s, in the places
    :func:`zeropilot.memory.profile.find` looks, the shipped ones last) measures it where one exists; the estimate
    ratios come from :func:`reference_profile`.

    Raises:
        InputError: ``card`` is neither in the table nor a device the table knows and no profile names it.
    """
    from zeropilot.memory.cards import is_card, match_device
    from zeropilot.memory.profile import find

    entry = match_device(card) if card and not is_card(card) else None
    key = entry.key if entry is not None else card
    if profile is None and key is not None and is_card(key):
        names = CARDS[lookup(key).key].device_names
        profile = find(names[0], world_size) if names else None
    if profile is not None and key is not None and not is_card(key):
        key = None
    return speed_for(key, profile, reference_profile())
