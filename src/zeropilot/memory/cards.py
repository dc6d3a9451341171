"""The built-in card table: what a GPU's vendor (or, where the vendor publishes nothing, a public quote of it) says
the card holds and does, each figure with its source.

Torch-free data. :func:`lookup` reads a name a user types (``--gpus 4xH100``, ``1xA100-40GB``, ``8xMI300X``, case
and ``-``/``_``/spaces ignored) and raises one :class:`~zeropilot.errors.InputError` listing the known names;
:func:`match_device` reads the name PyTorch or ``nvidia-smi`` reports (``NVIDIA H100 80GB HBM3``) and returns None
for a card the table does not know. These are datasheet figures, never measured here: the achievable rates the time
model uses are made from them in :func:`zeropilot.memory.speed.speed_for`, which says how. A figure the vendor does
not publish is ``None`` with the reason, never a guess; ``zeropilot calibrate`` measures the card instead.

Memory is the total ``nvidia-smi`` (or ``rocm-smi``/``hy-smi``) reports, where a public log of it was found, else the
nominal capacity (said so in its source). Link figures are per direction: a datasheet's "900 GB/s NVLink" counts both
directions of all links together, so one direction is half of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from zeropilot.errors import InputError

MIB = 1024**2
GIB = 1024**3
T = 1e12
G = 1e9

#: raw per-direction rate of one PCIe lane by generation, bytes/s: 8, 16 and 32 GT/s with 128b/130b encoding (PCI-SIG
#: base specifications 3.0, 4.0 and 5.0); x16 Gen4 is 31.5 GB/s each way, the "64 GB/s bidirectional" of datasheets
PCIE_LANE_BYTES_PER_S = {3: 8e9 * 128 / 130 / 8, 4: 16e9 * 128 / 130 / 8, 5: 32e9 * 128 / 130 / 8}

H100_SHEET = "NVIDIA H100 datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)"
H200_SHEET = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200)"
A100_SHEET = ("NVIDIA A100 datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
              "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)")
A800_SHEET = ("NVIDIA A800 datasheet (nvidia.cn/data-center/a800): the A100's GA100 with NVLink cut from 600 to "
              "400 GB/s")
L40S_SHEET = "NVIDIA L40S datasheet (resources.nvidia.com/en-us-l40s/l40s-datasheet-28413)"
ADA_PAPER = ("NVIDIA Ada GPU architecture whitepaper, appendix A (images.nvidia.com/aem-dam/Solutions/geforce/ada/"
             "nvidia-ada-gpu-architecture.pdf)")
MI250X_SHEET = "AMD Instinct MI250X data sheet (amd.com/en/products/accelerators/instinct/mi200/mi250x.html)"
MI300X_SHEET = "AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html)"
DEVICE_NOTES = "nvidia-smi on this project's GPU machines (the device tool's notes, KINDS.md, 2026-10/11)"
SMI_LOGS = "nvidia-smi's total in public logs of this card"
#: Hygon publishes no datasheet we could find; these figures are a public table that calls them the official ones
DCU_TABLE = ("github.com/wangzy0327/hblas-bench DCU-bench.md (a third-party table of Hygon's published figures; no "
             "Hygon datasheet found)")
DCU_SMI = "hy-smi's total (65520 MiB) in github.com/gpustack/gpustack issue 5170"


@dataclass(frozen=True)
class Spec:
    """One datasheet figure: ``value`` in the field's unit, or None where it is not public (``source`` says so)."""

    value: Optional[float]
    source: str


def _none(why: str) -> Spec:
    return Spec(None, why)


@dataclass(frozen=True)
class Card:
    """One card as the table knows it.

    Attributes:
        key: the table's name (``H100-SXM``); what :class:`~zeropilot.memory.inputs.Hardware` keeps.
        title: the card in words.
        vendor: ``cuda`` or ``rocm`` (as a hardware profile says it).
        aliases: names a user types (compared case-insensitively, ``-``/``_``/spaces ignored).
        device_names: names PyTorch (``torch.cuda.get_device_name``) or the vendor's smi reports.
        memory_bytes: one device's memory.
        bf16_flops_per_s: dense bf16 tensor peak (a datasheet's sparse figure halved).
        mem_bytes_per_s: device memory bandwidth.
        host_pcie: the host link as (PCIe generation, lanes), None where not public.
        intra_bytes_per_s: one direction of the card's links to the other GPUs of its node.
        intra_link: what that link is (``NVLink 4``, ``PCIe Gen4 x16``, ``xGMI``).
        note: what a user should know (an alias's choice, one GCD per device).
    """

    key: str
    title: str
    vendor: str
    aliases: Tuple[str, ...]
    device_names: Tuple[str, ...]
    memory_bytes: Spec
    bf16_flops_per_s: Spec
    mem_bytes_per_s: Spec
    host_pcie: Optional[Tuple[int, int]]
    host_source: str
    intra_bytes_per_s: Spec
    intra_link: str
    note: str = ""

    def host_bytes_per_s(self) -> Spec:
        """The host link's raw rate, one direction (PCIe generation x lanes), or None where it is not public."""
        if self.host_pcie is None:
            return Spec(None, self.host_source)
        gen, lanes = self.host_pcie
        return Spec(PCIE_LANE_BYTES_PER_S[gen] * lanes, f"PCIe Gen{gen} x{lanes} ({self.host_source}): "
                                                         f"{PCIE_LANE_BYTES_PER_S[gen] * lanes / G:.1f} GB/s each way")


def pcie_peer(gen: int, why: str) -> Spec:
    """One direction of a PCIe x16 link of generation ``gen`` between two GPUs, with why it is the link."""
    return Spec(PCIE_LANE_BYTES_PER_S[gen] * 16, f"PCIe Gen{gen} x16 between GPUs ({why})")


_CARDS = (
    Card("H100-SXM", "NVIDIA H100 SXM5 80GB", "cuda", ("H100", "H100-80GB", "H100-SXM", "H100-SXM5"),
         ("NVIDIA H100 80GB HBM3",),
         Spec(81559 * MIB, f"81559 MiB: {DEVICE_NOTES}; datasheet 80 GB"),
         Spec(1979 * T / 2, f"{H100_SHEET}: BFLOAT16 Tensor Core 1,979 TFLOPS with sparsity, dense half"),
         Spec(3.35 * T, f"{H100_SHEET}: 3.35 TB/s"), (5, 16), f"{H100_SHEET}: PCIe Gen5 128 GB/s",
         Spec(450 * G, f"{H100_SHEET}: NVLink 900 GB/s (both directions)"), "NVLink 4",
         note="H100 alone is the SXM card; the PCIe card is H100-PCIe"),
    Card("H100-PCIe", "NVIDIA H100 PCIe 80GB", "cuda", ("H100-PCIe", "H100-80GB-PCIe"), ("NVIDIA H100 PCIe",),
         Spec(81559 * MIB, f"81559 MiB: {SMI_LOGS}; datasheet 80 GB"),
         Spec(1513 * T / 2, f"{H100_SHEET}: H100 PCIe BFLOAT16 1,513 TFLOPS with sparsity, dense half"),
         Spec(2.0 * T, f"{H100_SHEET}: H100 PCIe 2 TB/s"), (5, 16), f"{H100_SHEET}: PCIe Gen5 128 GB/s",
         pcie_peer(5, "the 600 GB/s NVLink bridge joins two cards only: not assumed"), "PCIe Gen5 x16"),
    Card("H200", "NVIDIA H200 SXM 141GB", "cuda", ("H200", "H200-SXM", "H200-141GB"), ("NVIDIA H200",),
         Spec(143771 * MIB, f"143771 MiB: {DEVICE_NOTES}; datasheet 141 GB"),
         Spec(1979 * T / 2, f"{H200_SHEET}: BFLOAT16 Tensor Core 1,979 TFLOPS with sparsity, dense half"),
         Spec(4.8 * T, f"{H200_SHEET}: 4.8 TB/s"), (5, 16), f"{H200_SHEET}: PCIe Gen5 128 GB/s",
         Spec(450 * G, f"{H200_SHEET}: NVLink 900 GB/s (both directions)"), "NVLink 4"),
    Card("A100-40GB", "NVIDIA A100 SXM4 40GB", "cuda", ("A100", "A100-40GB", "A100-SXM4-40GB"),
         ("NVIDIA A100-SXM4-40GB",),
         Spec(40960 * MIB, f"40960 MiB: {SMI_LOGS}; datasheet 40 GB"),
         Spec(312 * T, f"{A100_SHEET}: BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity)"),
         Spec(1555 * G, f"{A100_SHEET}: 40GB 1,555 GB/s"), (4, 16), f"{A100_SHEET}: PCIe Gen4 64 GB/s",
         Spec(300 * G, f"{A100_SHEET}: NVLink 600 GB/s (both directions)"), "NVLink 3",
         note="A100 alone is the 40 GB card (the safe side for memory); write A100-80GB for the other"),
    Card("A100-80GB", "NVIDIA A100 SXM4 80GB", "cuda", ("A100-80GB", "A100-SXM4-80GB"), ("NVIDIA A100-SXM4-80GB",),
         Spec(81920 * MIB, f"81920 MiB: {SMI_LOGS}; datasheet 80 GB"),
         Spec(312 * T, f"{A100_SHEET}: BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity)"),
         Spec(2039 * G, f"{A100_SHEET}: 80GB SXM 2,039 GB/s"), (4, 16), f"{A100_SHEET}: PCIe Gen4 64 GB/s",
         Spec(300 * G, f"{A100_SHEET}: NVLink 600 GB/s (both directions)"), "NVLink 3"),
    Card("A800", "NVIDIA A800 SXM4 80GB", "cuda", ("A800", "A800-80GB", "A800-SXM4-80GB"), ("NVIDIA A800-SXM4-80GB",),
         Spec(81920 * MIB, f"81920 MiB: {SMI_LOGS}; datasheet 80 GB"),
         Spec(312 * T, f"{A800_SHEET}: BFLOAT16 Tensor Core 312 TFLOPS"),
         Spec(2039 * G, f"{A800_SHEET}: 80GB SXM 2,039 GB/s"), (4, 16), f"{A800_SHEET}: PCIe Gen4 64 GB/s",
         Spec(200 * G, f"{A800_SHEET}: NVLink 400 GB/s (both directions)"), "NVLink 3"),
    Card("L40S", "NVIDIA L40S 48GB", "cuda", ("L40S",), ("NVIDIA L40S",),
         Spec(46068 * MIB, f"46068 MiB: {SMI_LOGS}; datasheet 48 GB GDDR6 with ECC"),
         Spec(362.05 * T, f"{L40S_SHEET}: BFLOAT16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
         Spec(864 * G, f"{L40S_SHEET}: 864 GB/s"), (4, 16), f"{L40S_SHEET}: PCIe Gen4 x16 64 GB/s bidirectional",
         pcie_peer(4, f"{L40S_SHEET}: no NVLink"), "PCIe Gen4 x16"),
    Card("RTX4090", "NVIDIA GeForce RTX 4090 24GB", "cuda", ("4090", "RTX4090", "GeForce-RTX-4090"),
         ("NVIDIA GeForce RTX 4090",),
         Spec(24564 * MIB, f"24564 MiB: {SMI_LOGS}; 24 GB GDDR6X"),
         Spec(165.2 * T, f"{ADA_PAPER}: Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2 (330.4 with sparsity)"),
         Spec(1008 * G, f"{ADA_PAPER}: 1,008 GB/s"), (4, 16), f"{ADA_PAPER}: PCIe Gen4 x16",
         pcie_peer(4, "no NVLink, and GeForce cards have no peer-to-peer: NCCL goes through host memory, so this "
                       "is an upper bound"), "PCIe Gen4 x16, no peer-to-peer"),
    Card("MI250X", "AMD Instinct MI250X, one GCD", "rocm", ("MI250X", "MI250X-GCD"),
         ("AMD Instinct MI250X", "AMD Instinct MI250X/MI250"),
         Spec(68702699520, "68702699520 bytes per GCD (gfx90a's total as ROCm reports it in public logs); data sheet "
                        "128 GB per module, two GCDs"),
         Spec(383 * T / 2, f"{MI250X_SHEET}: peak BF16 383 TFLOPs per module of two GCDs: half per GCD"),
         Spec(3276.8 * G / 2, f"{MI250X_SHEET}: 3.2768 TB/s per module: half per GCD"), (4, 16),
         f"{MI250X_SHEET}: PCIe Gen4 x16 per module (shared by its two GCDs)",
         _none("Infinity Fabric links differ by GCD pair (in package and between modules): no one figure"), "xGMI",
         note="one GCD is one torch device: an 8-GPU MI250X node is 4 modules, --gpus 8xMI250X"),
    Card("MI300X", "AMD Instinct MI300X 192GB", "rocm", ("MI300X",), ("AMD Instinct MI300X", "AMD Instinct MI300X VF"),
         Spec(205822885888, "205822885888 bytes: rocm-smi's VRAM total in public logs; data sheet 192 GB HBM3"),
         Spec(1307.4 * T, f"{MI300X_SHEET}: peak BF16 1,307.4 TFLOPs (2,614.9 with sparsity)"),
         Spec(5.3 * T, f"{MI300X_SHEET}: 5.3 TB/s"), (5, 16), f"{MI300X_SHEET}: PCIe Gen5 x16",
         Spec(448 * G, f"{MI300X_SHEET}: Infinity Fabric 7 links, 896 GB/s peak (both directions)"), "xGMI"),
    Card("K100-AI", "Hygon DCU K100-AI 64GB", "rocm", ("K100-AI", "K100AI", "K100_AI"), ("K100_AI",),
         Spec(65520 * MIB, f"{DCU_SMI}; 64 GB in {DCU_TABLE}"),
         Spec(196 * T, f"{DCU_TABLE}: BF16 196 TFLOPS"), Spec(896 * G, f"{DCU_TABLE}: 896 GB/s"), None,
         "host link not found in public figures", _none("links between DCUs not found in public figures"), "unknown",
         note="figures from a third-party table of Hygon's numbers: run `zeropilot calibrate` on the card"),
    Card("K100", "Hygon DCU K100 64GB", "rocm", ("K100",), ("K100",),
         Spec(64 * GIB, f"nominal 64 GB ({DCU_TABLE}); the total the driver reports was not found"),
         _none(f"{DCU_TABLE}: BF16 NA (FP16 100 TFLOPS)"), _none(f"{DCU_TABLE}: memory bandwidth NA"), None,
         "host link not found in public figures", _none("links between DCUs not found in public figures"), "unknown",
         note="no public bf16 or bandwidth figure: run `zeropilot calibrate` on the card"),
    Card("BW200", "Hygon DCU BW200 64GB", "rocm", ("BW200",), ("BW200",),
         Spec(64 * GIB, f"nominal 64 GB ({DCU_TABLE}); the total the driver reports was not found"),
         Spec(480 * T, f"{DCU_TABLE}: BF16 480 TFLOPS"), Spec(1.6 * T, f"{DCU_TABLE}: 1.6 TB/s"), None,
         "host link not found in public figures", _none("links between DCUs not found in public figures"), "unknown",
         note="figures from a third-party table of Hygon's numbers: run `zeropilot calibrate` on the card"),
    Card("Z100", "Hygon DCU Z100", "rocm", ("Z100", "Z100L"), ("Z100", "Z100L"),
         _none("no public figure found for the Z100's memory"), _none("no public bf16 figure found for the Z100"),
         _none("no public bandwidth figure found for the Z100"), None, "host link not found in public figures",
         _none("links between DCUs not found in public figures"), "unknown",
         note="no public figures: give --gpus COUNTxMEM and run `zeropilot calibrate` on the card"),
)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


CARDS: Dict[str, Card] = {c.key: c for c in _CARDS}
_BY_ALIAS: Dict[str, Card] = {_norm(n): c for c in _CARDS for n in (c.key,) + c.aliases}
_BY_DEVICE: Dict[str, Card] = {_norm(n): c for c in _CARDS for n in c.device_names}
#: what PyTorch's names put before the card's own (``NVIDIA GeForce RTX 4090`` -> ``RTX 4090``)
_PREFIXES = ("nvidia", "geforce", "amd", "instinct", "hygon", "dcu")


def known_names() -> str:
    """The names :func:`lookup` takes, for a message: the table's keys and the short aliases."""
    return (", ".join(c.key for c in _CARDS) + " (any case; also " +
            ", ".join(a for c in _CARDS for a in c.aliases if len(_norm(a)) < len(_norm(c.key))) +
            ", and the names PyTorch reports)")


def lookup(name: str) -> Card:
    """The card a user named (a key, an alias or a reported device name; case, ``-``, ``_`` and spaces ignored).

    Raises:
        InputError: a name the table does not know (the message lists those it does).
    """
    card = _BY_ALIAS.get(_norm(name or "")) or match_device(name or "")
    if card is None:
        raise InputError(f"unknown GPU {name!r}: the card table knows {known_names()} (or give its memory, "
                         "COUNTxMEM such as 4x16GiB, and run `zeropilot calibrate` on it)")
    return card


def is_card(name: str) -> bool:
    """Whether :func:`lookup` knows ``name``."""
    return _BY_ALIAS.get(_norm(name or "")) is not None or match_device(name or "") is not None


def match_device(device_name: str) -> Optional[Card]:
    """The card PyTorch or the vendor's smi names ``device_name`` (``NVIDIA H100 80GB HBM3``), None when unknown.

    Exact names first, then the name without its vendor's words (``NVIDIA``, ``GeForce``, ``AMD Instinct``) as an
    alias; never a substring (``NVIDIA H100 NVL`` is not the SXM card)."""
    norm = _norm(device_name)
    if norm in _BY_DEVICE:
        return _BY_DEVICE[norm]
    words = [w for w in re.split(r"[\s_\-]+", device_name.lower()) if w]
    while words and words[0] in _PREFIXES:
        words.pop(0)
    return _BY_ALIAS.get("".join(words)) if words else None


def _cell(spec: Spec, scale: float, unit: str) -> str:
    return "not public" if spec.value is None else f"{spec.value / scale:,.4g} {unit}"


def markdown() -> str:
    """The table as ``docs/cards.md`` shows it (a test keeps the page equal to this): figures, then their sources."""
    rows = ["| card | names | memory | bf16 dense | memory bandwidth | host link, each way | to other GPUs, each way |",
            "|---|---|---|---|---|---|---|"]
    for c in _CARDS:
        rows.append(f"| {c.key} | {', '.join(dict.fromkeys(c.aliases + c.device_names))} | "
                    f"{_cell(c.memory_bytes, GIB, 'GiB')} | {_cell(c.bf16_flops_per_s, T, 'TFLOP/s')} | "
                    f"{_cell(c.mem_bytes_per_s, G, 'GB/s')} | {_cell(c.host_bytes_per_s(), G, 'GB/s')} | "
                    f"{_cell(c.intra_bytes_per_s, G, 'GB/s')} ({c.intra_link}) |")
    out = ["\n".join(rows), ""]
    for c in _CARDS:
        out.append(f"- **{c.key}** ({c.title}){': ' + c.note if c.note else ''}")
        for what, spec in (("memory", c.memory_bytes), ("bf16", c.bf16_flops_per_s), ("bandwidth", c.mem_bytes_per_s),
                           ("host link", c.host_bytes_per_s()), ("other GPUs", c.intra_bytes_per_s)):
            out.append(f"  - {what}: {spec.source}")
    return "\n".join(out) + "\n"
