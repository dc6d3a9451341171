"""The measured rows of the plan benchmark (``data/rows.jsonl``), their split, and the plan inputs each one stands for.

``data/rows.jsonl`` holds one line per measured run, in the order the results list them:
  source  where the run comes from: ``calibration`` (``../shared/calibration/measured_h200.jsonl``, copied here so
          the committed results stay reproducible; ``calibration_drift()`` says when the shared file beside the
          clone has changed since), ``h200_callN`` (device call N on one H200) or ``h200x2_callN`` (on two H200s),
          ``h200x2_issue5`` (the first world-size-2 runs);
  split   which figures the row counts in (below);
  spec    the probe's input (``zero_mem_probe_plan.py``: model config, ZeRO settings, ``ws``; issue-14 rows carry the
          split and the predictions, ``pred_gib*``, written into the spec and committed before the run);
  and what the probe measured: ``status`` (``phase``: where an OOM struck), ``snaps`` (allocator counters in GiB
  after the build, after ``deepspeed.initialize`` and in training), ``non_torch_gb`` / ``non_torch_nvml_gb`` (memory
  outside PyTorch: device-wide, and NVML's per process), ``host_peak_rss_gb``, ``ds_estimate_gpu_gb`` (DeepSpeed's
  own estimator), ``step_s``, ``ckpt_bytes`` of the save runs, ``versions``. A world-size-2 run is its rank 0's row
  (both ranks measure alike). ``python bench/plan/rows.py add SOURCE OUT/probe.jsonl`` appends a device call's
  results; ``python bench/plan/rows.py specs SOURCE`` prints a source's specs, to measure them again.

Splits:
  tuning    the calibration file's rows: the only rows the fitted constants saw (``fit.py``).
  holdout   our own runs of the calibration file's architectures (Qwen2.5, Llama 3.2), not tuned on.
  new-arch  our own runs of architectures absent from the calibration file (Gemma 2/3, Phi-3,
            Mistral, Qwen3, Llama 3.1 8B), not tuned on.
  (Runs of h200_call2 ran up to four at a time, packed by predicted peak: their memory outside PyTorch is NVML's
  per-process figure, ``non_torch_nvml_gb``.)
  capped    runs under a memory cap (emulated 16/24 GiB cards): scored on the fits/OOM verdict.
  x2-fit / x2-holdout  issue 14's runs on 2 x H200 (world size 1 and 2, ZeRO-3 with and without zero.Init, 7-8B
            full fine-tuning, offload): the split is in each spec, chosen before the run; only x2-fit rows fit the
            issue-14 constants (``fit.py --x2``). x2-repeat: four older rows measured again (call 5).
  trace     rows measured again with the caching allocator's history recorded (``data/traces/<spec trace>.json.gz``,
            ``analyze_trace.py``); neither fitted nor scored.
  ws2-issue5  issue 5's three runs at world size 2 (model built on the GPU), seen while the NCCL term was set, never
            fitted; scored apart.
"""
from __future__ import annotations

import functools
import gzip
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))

from zeropilot.memory.inputs import GIB, Hardware, PlanInputs  # noqa: E402
from zeropilot.models.arch import from_config  # noqa: E402

ROWS = HERE / "data" / "rows.jsonl"
TRACES = HERE / "data" / "traces"
#: issue 40's GPU calls on one H100 (``time/``): each call's ``rows.jsonl``, the probe's results with their specs
TIME_DATA = HERE / "time" / "data"
SHARED = ROOT.parent / "shared" / "calibration" / "measured_h200.jsonl"
CALIBRATED_NAMES = {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "llama-3.2-1b", "llama-3.2-3b"}
#: what a probe's result line carries that no figure or test reads (the rank: a row is rank 0's)
DROPPED = ("rank", "world_size", "gpus", "error", "largest_param")


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
        kv_cache=True,  # the probe calls the engine without use_cache=False: the config's use_cache (on) holds
        expandable_segments="expandable_segments:true" in str(spec.get("alloc_conf", "")).lower(),
        # the probe builds the model on the GPU unless the spec asks for zero.Init (older rows never did)
        zero_init=bool(spec.get("zero_init")), sub_group_size=int(spec.get("sgs", 1e9)),
        max_live_parameters=int(spec.get("mlp", 1e9)), max_reuse_distance=int(spec.get("mrd", 1e9)))


def timing_inputs(spec: dict, total_gb: float = 79.1) -> PlanInputs:
    """The plan inputs of an issue-40 spec (``time/matrix.py``, ``time/memory_matrix.py``): ``time/fit.py``
    ``inputs_of``, with ``trainer_optimizer`` where the probe builds the HF Trainer's optimizer (``adam: client``: its
    two weight-decay groups, ``torch.optim.AdamW(fused=True)``)."""
    sys.path.insert(0, str(HERE / "time"))
    from fit import inputs_of

    return replace(inputs_of(spec, total_gb), trainer_optimizer=spec.get("adam") == "client")


def h100_rows() -> List[Row]:
    """Every measured row of issue 40's calls (``time/data/callN/rows.jsonl``, one H100), call by call, ``source`` the
    call's directory; ``split`` as its spec says (``fit``, ``trace``, ``search``, ``holdout``)."""
    rows = []
    for path in sorted(TIME_DATA.glob("call*/rows.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("status") == "ok" and r.get("snaps"):
                rows.append(Row(path.parent.name, r["spec"].get("split", ""), r,
                                timing_inputs(r["spec"], r.get("total_gpu_gb", 79.1)), _measured(r), True, None))
    return rows


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


def split_of(r: dict, source: str) -> str:
    """The split of a new row: a cap, a trace, or the split its spec was given before the run, else by source."""
    s = r["spec"]
    if s.get("cap_gib"):
        return "capped"
    if s.get("trace"):  # rows measured again with the allocator's history recorded
        return "trace"
    if "split" in s:  # issue-14 rows: the split was written into the spec before it was measured
        return "x2-" + s["split"]
    if source == "calibration":
        return "tuning"
    return "holdout" if s.get("name") in CALIBRATED_NAMES else "new-arch"


def row_of(result: dict, source: str) -> Optional[dict]:
    """A probe's result line as a row of data/rows.jsonl (None for rank 1 and above)."""
    if result.get("rank", 0) != 0:
        return None
    row = {"source": source, "split": split_of(result, source)}
    row.update((k, v) for k, v in result.items() if k not in DROPPED + ("source", "split"))
    return row


def raw_rows() -> List[dict]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


def calibration_drift() -> Optional[str]:
    """A warning when ../shared/calibration/measured_h200.jsonl differs from the rows copied here."""
    if not SHARED.is_file():
        return None
    shared = [row_of(json.loads(x), "calibration") for x in SHARED.read_text().splitlines() if x.strip()]
    if shared != [r for r in raw_rows() if r["source"] == "calibration"]:
        return (f"note: {SHARED} differs from the calibration rows of {ROWS}; add them again and rerun fit.py and "
                "accuracy.py")
    return None


def load_rows() -> List[Row]:
    """Every measured row, calibration first."""
    rows = []
    for r in raw_rows():
        inputs = spec_inputs(r["spec"], r.get("total_gpu_gb", 139.8))
        rows.append(Row(r["source"], r["split"], r, inputs, _measured(r), r.get("status") == "ok",
                        r["spec"].get("cap_gib")))
    return rows


def trace_events(trace: str) -> list:
    """A traced run's allocator history: [action, addr, size, phase, ...] per event (``zero_mem_probe_plan.py``)."""
    with gzip.open(TRACES / f"{trace}.json.gz", "rt") as f:
        return json.load(f)


def traced_runs() -> list:
    """Every row whose allocator history was recorded: the row, and the bytes of segments its allocator held at the
    end of the init phase and at the end of training. Read once per process (59 gzipped histories, ~4 s of CPU;
    three tests of the suite ask for them): each caller gets its own copy of the rows."""
    return [(json.loads(r), init, final) for r, init, final in _traced_runs()]


@functools.lru_cache(maxsize=1)
def _traced_runs() -> tuple:
    out = []
    for r in raw_rows():
        if r["spec"].get("trace"):
            grown = [(e[2] if e[0] == "segment_alloc" else -e[2], e[3]) for e in trace_events(r["spec"]["trace"])
                     if e[0] in ("segment_alloc", "segment_free")]
            out.append((json.dumps(r), sum(g for g, phase in grown if phase == "init"), sum(g for g, _ in grown)))
    return tuple(out)


def step_tensors(trace: str):
    """The training phase's tensors of 1 MiB or more in a trace, in order: their sizes, and for each the number of
    tensors allocated before its release (None while it is live at the end)."""
    index, sizes, until = {}, [], {}
    for action, addr, size, phase, *_ in trace_events(trace):
        if phase != "step" or size < 2**20 or action not in ("alloc", "free_completed"):
            continue
        if action == "alloc":
            index[addr] = len(sizes)
            sizes.append(size)
        elif addr in index:
            until[index.pop(addr)] = len(sizes)
    return sizes, [until.get(i) for i in range(len(sizes))]


def main(argv) -> int:
    """``add SOURCE RESULTS.jsonl``: append a device call's probe results; ``specs SOURCE``: print its specs."""
    if len(argv) == 3 and argv[0] == "add":
        source, path = argv[1], Path(argv[2])
        if any(r["source"] == source for r in raw_rows()):
            print(f"{ROWS} already has rows of {source}", file=sys.stderr)
            return 1
        new = [row_of(json.loads(x), source) for x in path.read_text().splitlines() if x.strip()]
        new = [r for r in new if r is not None]
        tmp = ROWS.with_suffix(".tmp")
        tmp.write_text(ROWS.read_text() + "".join(json.dumps(r) + "\n" for r in new))
        tmp.replace(ROWS)
        print(f"{len(new)} rows of {source} added to {ROWS}; rerun accuracy.py")
        return 0
    if len(argv) == 2 and argv[0] == "specs":
        specs = [r["spec"] for r in raw_rows() if r["source"] == argv[1]]
        sys.stdout.writelines(json.dumps(s) + "\n" for s in specs)
        return 0 if specs else 1
    print(__doc__.split("\n\n")[0] + "\nUsage: python bench/plan/rows.py add SOURCE RESULTS.jsonl | specs SOURCE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
