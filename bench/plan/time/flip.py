"""Where `plan --search`'s first choice flips as the link between the GPUs gets faster: on paper, from the time model.

For each launch (8 ranks per node; the per-GPU batch of a step fixed, the search free to split it into micro batches),
runs the search (``memory.search.search``, as ``zeropilot plan --search`` does, without Liger) with the card's speed
figures (the card table's H100 and L40S, each with the shipped H100 profile's measured ratios), the bus bandwidth
within the node replaced by each value of a sweep from PCIe Gen4 (16 GB/s) to NVLink (361 GB/s, the H100's); then
with 2, 4 and 8 nodes of 8 H100s over networks of 25 to 3200 Gb/s per node (``--inter-node-gbps``). Where the first
choice differs between two neighbouring points, bisects the bandwidth where it changes (to 1%). Memory outside
PyTorch across nodes is not measured: the sweep across nodes uses ``OUTSIDE_GIB`` per rank, as ``--outside-torch``
would.

Usage: python bench/plan/time/flip.py [--out bench/plan/time/results/flip.md] [--quick]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))

from zeropilot.memory import PlanInputs, parse_gpus  # noqa: E402
from zeropilot.memory.constants import DEFAULT  # noqa: E402
from zeropilot.memory.links import with_inter_node  # noqa: E402
from zeropilot.memory.profile import with_outside_torch  # noqa: E402
from zeropilot.memory.search import search  # noqa: E402
from zeropilot.memory.speed import Figure, speed_of  # noqa: E402
from zeropilot.memory.steptime import estimate_time  # noqa: E402
from zeropilot.models import CATALOGUE, from_config  # noqa: E402

#: intra-node bus bandwidths swept, GB/s: PCIe Gen4 x16 as NCCL runs it (about 20-25) to the H100's NVLink (361 measured
#: over 8 H100s, KINDS.md)
INTRA_GBS = (16, 20, 25, 32, 40, 50, 64, 80, 100, 130, 160, 200, 250, 300, 361)
#: a node's network, Gb/s each way (25 GbE to a DGX H100's eight 400 Gb/s ports)
NODE_GBPS = (25, 50, 100, 200, 400, 800, 1600, 3200)
NODES = (2, 4, 8)
OUTSIDE_GIB = 3.0
GPUS_PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class Launch:
    name: str
    model: str
    lora: Optional[int]
    card: str

    def inputs(self, nodes: int = 1) -> PlanInputs:
        arch = from_config(CATALOGUE[self.model], self.model)
        return PlanInputs(arch=arch, hardware=parse_gpus(f"{GPUS_PER_NODE}x{self.card}", nodes), stage=3,
                          micro_batch=2, grad_accum=4, seq_len=2048, gradient_checkpointing=True,
                          lora_rank=self.lora, flavour="hf")


LAUNCHES = (Launch("Llama-3.1-8B full fine-tuning", "llama-3.1-8b", None, "H100"),
            Launch("Llama-3.1-8B LoRA r16", "llama-3.1-8b", 16, "H100"),
            Launch("Qwen2.5-7B LoRA r16", "qwen2.5-7b", 16, "H100"),
            Launch("Llama-3.1-8B full fine-tuning", "llama-3.1-8b", None, "L40S"),
            Launch("Llama-3.1-8B LoRA r16", "llama-3.1-8b", 16, "L40S"),
            Launch("Qwen2.5-7B LoRA r16", "qwen2.5-7b", 16, "L40S"))


def family(p: PlanInputs) -> str:
    """What a flip is counted on: the stage, offload, recomputation and micro batch (changes of overlap_comm or a
    bucket alone are near-ties, often within 0.1%: shown in the table, not counted)."""
    return describe(p, finer=False)


def describe(p: PlanInputs, finer: bool = True) -> str:
    """A candidate's settings in a few words."""
    parts = [f"ZeRO-{p.stage}"]
    if p.offload_optimizer != "none":
        parts.append("optimizer offload")
    if p.offload_param != "none":
        parts.append("parameter offload")
    parts.append("checkpointing" if p.gradient_checkpointing else "no checkpointing")
    parts.append(f"mb {p.micro_batch} x {p.grad_accum}")
    if not finer:
        return ", ".join(parts)
    if p.stage == 3 and p.max_live_parameters < 10**9:
        parts.append(f"max live {p.max_live_parameters // 10**6} M")
    if p.stage == 3 and p.prefetch_bucket_size < 50_000_000:
        parts.append(f"prefetch {p.prefetch_bucket_size // 10**6} M")
    if p.reduce_bucket_size < 500_000_000:
        parts.append(f"reduce bucket {p.reduce_bucket_size // 10**6} M")
    if p.stage in (1, 2) and p.overlap_comm:
        parts.append("overlap_comm")
    return ", ".join(parts)


#: the first choice, its step s, the runner-up, its ratio to the first, the first's family (:func:`family`)
Choice = Tuple[str, float, str, float, str]


def choose(inputs: PlanInputs, speed, constants) -> Choice:
    ranked, _ = search(inputs, constants=constants, speed=speed)
    if not ranked:
        return ("nothing fits", float("nan"), "", float("nan"), "nothing fits")
    first = ranked[0]
    second = ranked[1] if len(ranked) > 1 else None
    return (describe(first.plan.inputs), first.step_s, describe(second.plan.inputs) if second else "",
            second.ratio if second else float("nan"), family(first.plan.inputs))


def flip_points(xs: Sequence[float], pick: Callable[[float], Choice], geometric: bool = True,
                tol: float = 0.01) -> Tuple[Dict[float, Choice], List[Tuple[float, str, str]]]:
    """The choice at every x, and each x where its family changes between neighbours, bisected to ``tol``
    (relative): (x, the family below, the family above)."""
    got = {x: pick(x) for x in xs}
    flips = []
    for lo, hi in zip(xs, xs[1:]):
        if got[lo][4] == got[hi][4]:
            continue
        a, b, ca = lo, hi, got[lo][4]
        while b / a - 1 > tol:
            mid = (a * b) ** 0.5 if geometric else (a + b) / 2
            if pick(mid)[4] == ca:
                a = mid
            else:
                b = mid
        flips.append(((a * b) ** 0.5, ca, got[hi][4]))
    return got, flips


def intra_case(launch: Launch, xs: Sequence[float], tol: float = 0.01) -> Tuple[Dict[float, Choice], List]:
    inputs = launch.inputs()
    base = speed_of(launch.card, None, inputs.world_size)

    def pick(gbs: float) -> Choice:
        sp = dataclasses.replace(base, intra_busbw_bytes_per_s=Figure(gbs * 1e9, f"sweep: {gbs:g} GB/s"))
        return choose(inputs, sp, DEFAULT)

    return flip_points(xs, pick, tol=tol)


def nodes_case(launch: Launch, nodes: int, xs: Sequence[float]) -> Tuple[Dict[float, Choice], List]:
    inputs = launch.inputs(nodes)
    base = speed_of(launch.card, None, inputs.world_size)
    constants = with_outside_torch(DEFAULT, OUTSIDE_GIB * 2**30, "flip.py: assumed for the sweep", nodes=nodes)

    def pick(gbps: float) -> Choice:
        return choose(inputs, with_inter_node(base, gbps), constants)

    return flip_points(xs, pick)


#: ZeRO-3's memory levers the search offers, against the defaults (the launch: Llama-3.1-8B full fine-tuning, 8 x H100)
LEVERS = (("defaults (prefetch bucket 50 M, max live 1000 M)", {}),
          ("prefetch bucket 0", {"prefetch_bucket_size": 0}),
          ("prefetch bucket 10 M, max live 100 M", {"prefetch_bucket_size": 10_000_000,
                                                     "max_live_parameters": 100_000_000}))


def levers(launch: Launch, gbs: Sequence[float]) -> List[str]:
    """What ZeRO-3's prefetch bucket and max live parameters cost in time, at each link."""
    inputs = launch.inputs()
    base = speed_of(launch.card, None, inputs.world_size)
    out = ["| GB/s | setting | step s | collectives not hidden, s | link busy, s | all-gathered, GB |",
           "|---|---|---|---|---|---|"]
    for x in gbs:
        sp = dataclasses.replace(base, intra_busbw_bytes_per_s=Figure(x * 1e9, f"sweep: {x:g} GB/s"))
        for name, change in LEVERS:
            t = estimate_time(inputs.with_(**change), sp)
            c = t.collectives
            out.append(f"| {x:g} | {name} | {t.step_s:.3f} | {c.exposed_s:.3f} | {c.link_s:.3f} | "
                       f"{c.gathered_bytes / 1e9:.1f} |")
    return out


def _table(unit: str, got: Dict[float, Choice], flips: List) -> List[str]:
    out = [f"| {unit} | first choice | step s | runner-up | its ratio |", "|---|---|---|---|---|"]
    prev = None
    for x, (first, step, second, ratio, fam) in got.items():
        mark = "" if prev is None or fam == prev else " **(flipped)**"
        out.append(f"| {x:g} | {first}{mark} | {step:.3f} | {second} | {ratio:.3f} |")
        prev = fam
    if flips:
        out += [""] + [f"- flips at about **{x:.3g} {unit.split()[0]}**: {a} -> {b}" for x, a, b in flips]
    else:
        out += ["", "- no flip in this range"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/plan/time/results/flip.md"))
    ap.add_argument("--quick", action="store_true", help="the first launch only, few points (a smoke test)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    launches = LAUNCHES[:1] if args.quick else LAUNCHES
    intra = (16, 64, 361) if args.quick else INTRA_GBS
    lines = ["# Where `plan --search`'s first choice flips with the link (on paper)", "",
             f"Generated by `python bench/plan/time/flip.py` (`{Path(__file__).name}`'s docstring says how). Each "
             "launch: 8 GPUs per node, sequence 2048, 8 samples per GPU per step (the search splits them into "
             "micro batches), launched as ZeRO-3, micro batch 2 x 4, checkpointing; the search free to change "
             "every lever but Liger. Speed figures: the card table's, estimated with the ratios the shipped H100 "
             "profile measured (one H100, calibrate); the link within the node replaced by each bus bandwidth of "
             "the sweep; across nodes the link within the node stays the card's (H100: 361 GB/s) and the network "
             f"is `--inter-node-gbps` (line rate); memory outside PyTorch across nodes {OUTSIDE_GIB} GiB per rank "
             "(assumed: not measured). The step times are predictions, not measurements: nothing here ran on more "
             "than one GPU. A flip is a change of stage, offload, recomputation or micro batch (`overlap_comm` or a "
             "bucket alone are near-ties); the runner-up is the best of another family, its ratio its predicted "
             "step over the first's (below 1 where it is predicted faster but changes more settings of the launch: "
             "the search asks 1% per changed setting, `memory/search.py` `PER_CHANGE`).", ""]
    lines += [f"## ZeRO-3's memory levers in time: {launches[0].name}, 8 x {launches[0].card}, ZeRO-3, micro batch 2 "
              "x 4, checkpointing", ""] + levers(launches[0], (20, 361)) + [""]
    for launch in launches:
        got, flips = intra_case(launch, intra)
        lines += [f"## {launch.name}, 8 x {launch.card}: the link within the node", ""] + _table("GB/s", got, flips)
        lines.append("")
    if not args.quick:
        for launch in LAUNCHES[:3]:
            for nodes in NODES:
                got, flips = nodes_case(launch, nodes, NODE_GBPS)
                lines += [f"## {launch.name}, {nodes} nodes x 8 x {launch.card}: the network between nodes", ""]
                lines += _table("Gb/s per node", got, flips) + [""]
    lines.append(f"Wall time of this run: {time.perf_counter() - t0:.0f} s.")
    text = "\n".join(lines) + "\n"
    if args.quick:
        print(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
