"""The terminal summary of a run: verdict, steps, peaks per rank against the plan, saves."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

GiB = float(1 << 30)


def gib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / GiB:.2f} GiB"


def render(summary: Dict[str, Any]) -> str:
    v = summary["verdict"]
    lines: List[str] = []
    who = f" (rank {', '.join(str(r) for r in v['ranks'])})" if v.get("ranks") else ""
    lines.append(f"verdict: {v['kind'].upper()}{who}: {v.get('reason', '')}")
    for frame in (v.get("where") or [])[-4:]:
        lines.append(f"  at {frame}")
    med = summary["step_seconds"]["median"]
    lines.append(f"steps: {summary['steps']}" + (f", median step {med:.3f} s" if med is not None else ""))
    if summary["ranks"]:
        lines.append("rank  steps  peak reserved  peak allocated  outside torch  host RSS   plan")
        for r in summary["ranks"]:
            lines.append(f"{r['rank']:>4}  {r['steps']:>5}  {gib(r['peak_reserved_bytes']):>13}  "
                         f"{gib(r['peak_allocated_bytes']):>14}  {gib(r['outside_torch_bytes']):>13}  "
                         f"{gib(r['host_rss_peak_bytes']):>9}  {gib(r['plan_bytes'])}")
    for s in summary["saves"]:
        size = "-" if s.get("bytes") is None else f"{s['bytes'] / 1e9:.2f} GB"
        secs = "-" if s.get("seconds") is None else f"{s['seconds']:.2f} s"
        lines.append(f"save at step {s.get('step')} on rank {s['rank']}: {size} in {secs}")
    for p in summary.get("problems") or []:
        lines.append(f"note: {p}")
    lines.append(f"run directory: {summary['run_dir']}")
    return "\n".join(lines) + "\n"
