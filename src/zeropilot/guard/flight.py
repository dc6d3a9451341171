"""Flight-recorder dumps (NCCL and gloo), read without torch and without running pickled code.

PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE``; NCCL dumps on the watchdog's request through
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` into ``nccl-trace-rank-N``; gloo ranks are asked by the guard's heartbeat
thread, which writes ``fr-trace-rank-N`` with ``torch._C._distributed_c10d._dump_fr_trace``) writes a pickle of plain dicts, lists,
strings and numbers. It is read here with an unpickler that refuses every global (no class, no
function can be named, so nothing runs) and a size cap, instead of PyTorch's ``fr_trace`` analyzer
(which needs torch and unpickles freely). What the hang verdict needs: per rank, the last completed
collective and the first that is not, and the first sequence number at which ranks called different
collectives (a desync).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional

MAX_DUMP = 64 << 20


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle protocol
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def read_dump(path: Path) -> Optional[Dict[str, Any]]:
    """A flight-recorder dump as plain data, or None when absent, too large or not the expected shape."""
    try:
        if path.stat().st_size > MAX_DUMP:
            return None
        data = _NoGlobals(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), list) else None


def _op(entry: Dict[str, Any]) -> str:
    return str(entry.get("profiling_name", "?")).split(":", 1)[-1]


def _group(entry: Dict[str, Any]) -> str:
    """The process group's description, or its name where the recorder has none (``undefined``: gloo's)."""
    pg = entry.get("process_group")
    if not isinstance(pg, (list, tuple)) or len(pg) < 2:
        return str(pg)
    if str(pg[1]) not in ("", "undefined"):
        return str(pg[1])
    return "default_pg" if str(pg[0]) == "0" else f"group {pg[0]}"


def rank_summary(dump: Dict[str, Any]) -> Dict[str, Any]:
    """Per process group: the last completed collective, the first pending one and the newest sequence number.

    NCCL marks entries ``completed``; gloo's recorder leaves every entry ``scheduled``, so without any completed
    entry the newest one is taken as the one the rank waits in (it is, while the rank is blocked in a collective).
    """
    groups: Dict[str, Dict[str, Any]] = {}
    entries = [e for e in dump["entries"] if isinstance(e, dict) and not e.get("is_p2p")]
    tracked = any(e.get("state") == "completed" for e in entries)
    for e in entries:
        g = groups.setdefault(_group(e), {"last_completed": None, "pending": None, "newest": None})
        seq = e.get("collective_seq_id")
        if isinstance(seq, int) and (g["newest"] is None or seq > g["newest"]):
            g["newest"] = seq
        if e.get("state") == "completed":
            g["last_completed"] = {"seq": seq, "op": _op(e)}
        elif tracked and g["pending"] is None:
            g["pending"] = {"seq": seq, "op": _op(e), "state": e.get("state"), "sizes": e.get("input_sizes")}
    if not tracked:
        for e in entries:
            g = groups[_group(e)]
            if e.get("collective_seq_id") == g["newest"]:
                g["pending"] = {"seq": g["newest"], "op": _op(e), "state": e.get("state"), "sizes": e.get("input_sizes")}
    return groups


def _calls_by_seq(dump: Dict[str, Any]) -> Dict[tuple, tuple]:
    return {(_group(e), e.get("collective_seq_id")): (_op(e), repr(e.get("input_sizes"))) for e in dump["entries"]
            if isinstance(e, dict) and not e.get("is_p2p")}


def summarize(dumps: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """Per-rank summaries, the first desync (same sequence number, a different collective or different sizes)
    and a sentence for each finding."""
    ranks = {r: rank_summary(d) for r, d in sorted(dumps.items())}
    calls = {r: _calls_by_seq(d) for r, d in dumps.items()}
    desync = None
    keys = sorted({k for c in calls.values() for k in c}, key=lambda k: (k[0], k[1] if isinstance(k[1], int) else -1))
    for key in keys:
        seen = {r: c[key] for r, c in calls.items() if key in c}
        ops = {r: op for r, (op, _) in seen.items()}
        if len(set(ops.values())) > 1:
            desync = {"group": key[0], "seq": key[1], "ops": {str(r): op for r, op in sorted(ops.items())}}
            break
        if len({sizes for _, sizes in seen.values()}) > 1:
            desync = {"group": key[0], "seq": key[1], "sizes": True,
                      "ops": {str(r): f"{op} {sizes}" for r, (op, sizes) in sorted(seen.items())}}
            break
    lines: List[str] = []
    if desync:
        what = "different sizes" if desync.get("sizes") else "different collectives"
        lines.append(f"flight recorder: collective #{desync['seq']} of {desync['group']} is "
                     + ", ".join(f"{op} on rank {r}" for r, op in desync["ops"].items())
                     + f": the ranks called {what}")
    for r, groups in ranks.items():
        for name, g in groups.items():
            if g["pending"]:
                done = g["last_completed"]
                lines.append(f"rank {r} waits in {g['pending']['op']} #{g['pending']['seq']} of {name} "
                             f"({g['pending']['state']}; " + (f"last completed #{done['seq']})" if done else
                                                              "no completion recorded)"))
    return {"ranks": {str(r): g for r, g in ranks.items()}, "desync": desync, "text": lines}
