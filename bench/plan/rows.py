"""The measured rows of the plan benchmark, their split, and the plan inputs each one stands for.

Rows come from ``../shared/calibration/measured_h200.jsonl`` (the calibration file, as copied into
``data/calibration_h200.jsonl`` so the committed results stay reproducible; ``calibration_drift()`` says
when the shared file beside the clone has changed since)
and from this folder's own H200 runs (``data/h200_call*.jsonl``, made with ``zero_mem_probe_plan.py``).

Splits:
  tuning    the calibration file's rows: the only rows the fitted constants saw (``fit.py``).
  holdout   our own runs of the calibration file's architectures (Qwen2.5, Llama 3.2), not tuned on.
  new-arch  our own runs of architectures absent from the calibration file (Gemma 2/3, Phi-3,
            Mistral, Qwen3, Llama 3.1 8B), not tuned on.
  (Runs of data/h200_call2.jsonl ran up to four at a time, packed by predicted peak: their memory
  outside PyTorch is NVML's per-process figure, ``non_torch_nvml_gb``.)
  capped    runs under a memory cap (emulated 16/24 GiB cards): scored on the fits/OOM verdict.
  x2-fit / x2-holdout  issue 14's runs on 2 x H200 (data/h200x2_call*.jsonl, world size 1 and 2, ZeRO-3
            with and without zero.Init, 7-8B full fine-tuning, offload): the split is in each spec,
            chosen before the run (make_specs_x2.py); only x2-fit rows fit the issue-14 constants.
  trace     calls 7, 10, 11: rows measured before, run again with the caching allocator's history recorded
            (``analyze_trace.py``); neither fitted nor scored.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))

from zeropilot.memory.inputs import GIB, Hardware, PlanInputs  # noqa: E402
from zeropilot.models.arch import from_config  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration" / "measured_h200.jsonl"
LOCAL_COPY = HERE / "data" / "calibration_h200.jsonl"
OWN = sorted((HERE / "data").glob("h200_call*.jsonl"))
X2 = sorted((HERE / "data").glob("h200x2_call*.jsonl"))
CALIBRATED_NAMES = {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama-3.2-1b", "llama-3.2-3b"}


@dataclass
class Row:
    """One measured configuration."""

    source: str
    split: str
    raw: dict
    inputs: PlanInputs
    measured_bytes: Optional[int]  # peak_reserved + non_torch, None for OOM rows
    ok: bool
    cap_gib: Optional[float]

    @property
    def label(self) -> str:
        s = self.raw["spec"]
        bits = [s.get("name", "?"), f"z{s['stage']}", f"mb{s['mb']}", f"s{s['seq']}"]
        bits += ["gc"] if s.get("gc") else []
        bits += [f"lora{s['lora']}"] if s.get("lora") else []
        bits += ["offload"] if s.get("offload") else []
        bits += ["offload_param"] if s.get("offload_param") else []
        bits += ["overlap"] if s.get("overlap") else []
        bits += [s["attn"]] if s.get("attn") else []
        bits += ["expandable"] if "expandable" in str(s.get("alloc_conf", "")) else []
        bits += [f"cap{s['cap_gib']}"] if s.get("cap_gib") else []
        bits += ["save" + ("(exclude_frozen)" if s.get("exclude_frozen") else "")] if s.get("save") else []
        return " ".join(bits)


def spec_inputs(spec: dict, total_gb: float) -> PlanInputs:
    """The plan inputs of a probe spec (world size ``ws``, default 1; the probe's DeepSpeed settings)."""
    arch = from_config(spec["model"], spec.get("name", ""))
    gpu = spec.get("cap_gib") or total_gb
    ws = int(spec.get("ws", 1))
    return PlanInputs(
        arch=arch, hardware=Hardware(ws, int(gpu * GIB), 1, f"{ws}x{gpu}GiB"), stage=spec["stage"],
        micro_batch=spec["mb"], seq_len=spec["seq"], gradient_checkpointing=bool(spec.get("gc")),
        lora_rank=spec.get("lora") or None, offload_optimizer="cpu" if spec.get("offload") else "none",
        offload_param="cpu" if spec.get("offload_param") else "none", overlap_comm=bool(spec.get("overlap", False)),
        torch_adam=not spec.get("cpu_adam"),  # the probe's optimizer: torch's AdamW unless the spec asks for CPUAdam
        reduce_bucket_size=int(spec.get("rbs", 5e8)), prefetch_bucket_size=int(spec.get("pbs", 5e8)),
        param_persistence_threshold=int(spec.get("ppt", 1e6)), attn=spec.get("attn", "sdpa"),
        expandable_segments="expandable_segments:true" in str(spec.get("alloc_conf", "")).lower(),
        # the probe builds the model on the GPU unless the spec asks for zero.Init (older rows never did)
        zero_init=bool(spec.get("zero_init")), sub_group_size=int(spec.get("sgs", 1e9)),
        max_live_parameters=int(spec.get("mlp", 1e9)), max_reuse_distance=int(spec.get("mrd", 1e9)))


def _measured(r: dict) -> Optional[int]:
    if r.get("status") != "ok":
        return None
    snaps = {s["tag"]: s for s in r["snaps"]}
    steady = dict(snaps["steady"])
    if r.get("peaks_reset_after_init"):  # the probe reset the peak counters after the init phase
        steady["peak_reserved"] = max(steady["peak_reserved"], snaps["after_init"]["peak_reserved"])
    # Capped runs ran four at a time: device-wide free memory counts the others, NVML's per-process does not.
    nt = r.get("non_torch_nvml_gb") if r["spec"].get("cap_gib") or r.get("concurrent") else r.get("non_torch_gb")
    if nt is None:
        nt = r.get("non_torch_gb")
    return int((steady["peak_reserved"] + nt) * GIB)


def _split(r: dict, source: str) -> str:
    s = r["spec"]
    if s.get("cap_gib"):
        return "capped"
    if s.get("trace"):  # calls 7, 10, 11: rows measured again with the allocator's history recorded
        return "trace"
    if "split" in s:  # issue-14 rows: the split was written into the spec before it was measured
        return "x2-" + s["split"]
    if source == "calibration":
        return "tuning"
    return "holdout" if s.get("name") in CALIBRATED_NAMES else "new-arch"


def calibration_drift() -> Optional[str]:
    """A warning when ../shared/calibration/measured_h200.jsonl differs from the copy used here."""
    if SHARED.is_file() and SHARED.read_bytes() != LOCAL_COPY.read_bytes():
        return f"note: {SHARED} differs from {LOCAL_COPY}; copy it over and rerun fit.py and accuracy.py"
    return None


def load_rows() -> List[Row]:
    """Every measured row, calibration first."""
    files = [("calibration", LOCAL_COPY)] + [(p.stem, p) for p in OWN + X2]
    rows = []
    for source, path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("rank", 0) != 0:
                continue  # ranks of one world-size-2 run measure alike (bench/multigpu); rank 0 stands for it
            inputs = spec_inputs(r["spec"], r.get("total_gpu_gb", 139.8))
            rows.append(Row(source, _split(r, source), r, inputs, _measured(r), r.get("status") == "ok",
                            r["spec"].get("cap_gib")))
    return rows
