"""The terminal table of a repro verdict: what ran, memory around each save per rank, the resume verdict."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from zeropilot.runlog.text import gib


def _mb(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


def _mem(mem: Optional[Dict[str, Any]], cuda: bool, peak: bool = False) -> str:
    """GPU: reserved (allocated) or their peaks; CPU: host RSS."""
    if not mem:
        return "-"
    if not cuda:
        return gib(mem.get("host_rss_bytes")) + " RSS"
    r, a = ("peak_reserved_bytes", "peak_allocated_bytes") if peak else ("reserved_bytes", "allocated_bytes")
    return f"{gib(mem.get(r))} ({gib(mem.get(a)).replace(' GiB', '')})"


def _head(v: Dict[str, Any]) -> List[str]:
    s = v["spec"]
    lora = f"LoRA r{s['lora']['rank']}" if s["lora"] else "full fine-tuning"
    lines = [f"model: {s['model_note']}",
             f"run: ZeRO-{s['stage']} {s['precision']}, {lora}, micro batch {s['micro_batch']} x GA {s['grad_accum']}"
             f", sequence {s['seq_len']}, gradient checkpointing {'on' if s['gradient_checkpointing'] else 'off'}, "
             f"{s['nproc']} rank(s) on {s['device']}; {s['steps']} steps, save every {s['save_every']}"
             + (f", resumed from step {s['resume_from']} in a new process group of {s['resume_nproc']} rank(s)"
                if s["resume_from"] is not None else " (no resume)")
             + (f" through a universal checkpoint (micro batch {s['resume_micro_batch']} x GA "
                f"{s['resume_grad_accum']})" if s.get("universal") else "")
             + (f", leaving out {', '.join(s['leave_out'])}" if s["leave_out"] else "")]
    for cap in v.get("cap") or []:
        lines.append(f"memory cap: EMULATED {gib(cap['cap_bytes'])} card: allocator limit {gib(cap['limit_bytes'])} "
                     f"= cap - {gib(cap['outside_torch_bytes'])} outside PyTorch (measured {cap['measured']}) on a "
                     f"{gib(cap['device_total_bytes'])} device")
    return lines


def _save_rows(v: Dict[str, Any], cuda: bool) -> List[str]:
    if not v["saves"]:
        return ["saves: none completed"]
    unit = "reserved (allocated) GiB" if cuda else "host RSS"
    rows = [f"save  rank       size     time  before {unit:<24} peak during save         after"
            "                   peak, first step after"]
    for s in v["saves"]:
        nxt = (s.get("first_step_after") or {}).get("mem")
        rows.append(f"{s['step']:>4}  {s['rank']:>4}  {_mb(s['bytes']):>9}  {s['seconds']:>6.2f} s  "
                    f"{_mem(s['mem_before'], cuda):<31} {_mem(s['mem_peak'], cuda, True):<23} "
                    f"{_mem(s['mem_after'], cuda):<23} {_mem(nxt, cuda, True)}")
    return rows


def _resume(v: Dict[str, Any]) -> List[str]:
    if v["spec"]["resume_from"] is None:
        return ["resume: not run (--no-resume)"]
    if v["resume_exact"] is None:
        return ["resume: NOT CHECKED: the run failed (below)"]
    tol = v["tolerance"]
    how = "bitwise" if tol["kind"] == "bitwise" else f"within {tol['state']:g} (state) / {tol['loss']:g} (loss)"
    conv = v.get("universal")
    lines = []
    if conv and not conv.get("error"):
        lines.append(f"universal checkpoint: zeropilot ckpt universal wrote {conv['files']} files "
                     f"({conv['tensor_bytes'] / 1e6:.1f} MB: {', '.join(conv['states'])}) in {conv['seconds']:.2f} s")
    if v["resume_exact"]:
        parts = ", ".join(p for p in v["details"] if p != "restored")
        if tol["kind"] == "bitwise":
            return lines + [f"resume: EXACT ({how}): {parts} equal to the uninterrupted run"]
        worst = ", ".join(f"{p} {d['max_rel_diff']:.2g}" for p, d in v["details"].items()
                          if isinstance(d, dict) and d.get("max_rel_diff"))
        return lines + [f"resume: EXACT ({how}): {parts} equal to the uninterrupted run"
                        + (f" (largest relative differences: {worst})" if worst else "")]
    lines.append(f"resume: NOT EXACT: differs: {', '.join(v['differs'])}")
    if v.get("not_restored"):
        lines.append(f"  cause: the resume did not restore: {', '.join(v['not_restored'])} (compared right after "
                     "the load with the uninterrupted run right after the save)")
    for part in v["differs"]:
        d = v["details"].get(part, {})
        if part == "loss" and d.get("first_differing"):
            f = d["first_differing"]
            who = f"rank {f['rank']}" if f.get("rank") is not None else "mean over the ranks"
            lines.append(f"  loss: first at step {f['step']} ({who}): uninterrupted "
                         f"{f['uninterrupted'][0]:.6g}, resumed {f['resumed'][0]:.6g}")
        elif part == "world_size":
            lines.append(f"  world size: saved by {d['uninterrupted']} rank(s), resumed on {d['resumed']}")
        elif d.get("differing"):
            extra = f" (max relative difference {d['max_rel_diff']:.3g})" if d.get("max_rel_diff") else ""
            lines.append(f"  {part}: {d['n_differing']} value(s) differ{extra}, e.g. {'; '.join(d['differing'][:2])}")
        elif part == "data" and d.get("first_step_with_other_samples"):
            lines.append(f"  data: other samples from step {d['first_step_with_other_samples']}")
    return lines


def render(v: Dict[str, Any]) -> str:
    cuda = v["spec"]["device"] == "cuda"
    lines = _head(v) + _save_rows(v, cuda) + _resume(v)
    for f in v["failures"]:
        where = f" at step {f.get('step')} ({f.get('phase')})" if f.get("phase") else ""
        who = f"leg {f['leg']} rank {f['rank']}" if f.get("rank") is not None else f"before leg {f['leg']}"
        lines.append(f"{who}: {f['kind'].upper()}{where}: {f.get('message', '')[:300]}")
    for note in v["notes"]:
        lines.append(f"note: {note}")
    lines.append(f"run directory: {v['run_dir']} (zeropilot report {v['run_dir']})")
    return "\n".join(lines) + "\n"
