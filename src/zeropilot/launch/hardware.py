"""The GPUs visible on this machine, for the memory rules when ``--gpus`` is not given (no torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional

_QUERY = ["--query-gpu=memory.total", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str, visible: Optional[str] = None) -> Optional[str]:
    """``COUNTxMEMMiB`` from ``nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits``.

    The smallest card sets the memory (ZeRO ranks are as strong as the weakest); ``visible`` is a
    ``CUDA_VISIBLE_DEVICES`` value of plain indices that narrows the set. None when nothing parses.
    """
    sizes = []
    for line in text.strip().splitlines():
        try:
            sizes.append(int(float(line.strip())))
        except ValueError:
            return None
    if visible is not None and visible.strip():
        try:
            picked = [int(i) for i in visible.split(",") if i.strip()]
            sizes = [sizes[i] for i in picked if 0 <= i < len(sizes)]
        except ValueError:  # UUIDs or MIG names: keep every card
            pass
    if not sizes:
        return None
    return f"{len(sizes)}x{min(sizes)}MiB"


def nvidia_smi(args: List[str], timeout: float = 5.0) -> Optional[str]:
    """What ``nvidia-smi ARGS`` prints, or None without ``nvidia-smi`` or when it fails or times out."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def visible_gpu_name(timeout: float = 5.0) -> Optional[str]:
    """The first visible NVIDIA GPU's name from ``nvidia-smi`` (no torch), or None."""
    lines = [x.strip() for x in (nvidia_smi(["--query-gpu=name", "--format=csv,noheader"], timeout) or "").splitlines()
             if x.strip()]
    return lines[0] if lines else None


def visible_gpus(timeout: float = 5.0) -> Optional[str]:
    """The local NVIDIA GPUs as ``COUNTxMEMMiB``, or None without ``nvidia-smi`` or when it fails."""
    text = nvidia_smi(_QUERY, timeout)
    return None if text is None else parse_nvidia_smi(text, os.environ.get("CUDA_VISIBLE_DEVICES"))
