"""Why a run stopped making progress: pure functions over heartbeats, faulthandler stacks and flight recorders.

Input per rank: its last heartbeat (phase, step, pid), whether its process is alive, and the main thread's
frames that ``faulthandler`` wrote. Each rank is placed from its innermost frames (:func:`activity`): waiting in a
collective, waiting on an op-build lock, loading data (the dataset, the collate function, a DataLoader worker),
writing a checkpoint, or in the user's own code. The verdict of ``hang.json`` names a class, the culprit rank(s)
(always at least one, a single-rank job included), where they are, the cause and the fixes. Classes, in order:

- ``rank_gone``: a rank died or never started while the others wait for it;
- ``stale_lock``: the ranks wait on an op-build lock no live build holds (a live build is progress: the watchdog
  extends its deadline instead of firing, :mod:`zeropilot.runner.watchdog`); ``build_stalled``: a live process of
  this job holds the lock but its build made no progress for the whole timeout;
- ``data_loading``: a rank is stuck in its dataset, collate function or DataLoader worker;
- ``slow_storage``: ranks in a save are writing the checkpoint while the others wait for them;
- ``straggler``: a rank runs its own code outside any collective while the others wait (one rank alone in its
  own code: ``user_code``);
- ``save_partial``: a save entered by some ranks only while the others went on to other collectives (DeepSpeed's
  saves are collective);
- ``collective_mismatch``: the ranks wait in different collectives, or the flight recorder shows different
  collectives or sizes at the same sequence number;
- ``collective``: every rank waits in the same collective (a peer outside this job, the network, the transport).

Whatever the class, the ranks that straggled in the steps before the stall (their own data time or their GPU probe
far above their peers': :mod:`zeropilot.runlog.stragglers`, over each rank's newest records) are named in the
cause, and kept in ``stragglers_before``; where every rank waits in the same collective and the flight recorder
shows none behind, they are the likely culprits.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.runlog import frames as runlog_frames
from zeropilot.runlog.layout import STACKS_MARKER
from zeropilot.runlog.stragglers import describe

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
                "reduce", "gather", "scatter", "send", "recv", "wait", "allreduce", "allgather",
                "monitored_barrier", "_all_gather_base", "all_gather_into_tensor", "reduce_scatter_tensor",
                "all_to_all_single", "_reduce_scatter_base")
_COMM_FILES = ("torch/distributed/", "deepspeed/comm/", "torch/nn/parallel/", "deepspeed/runtime/comm/")
#: DeepSpeed's own wrappers that wait on a collective's handle (ZeRO-3's parameter gather waits in
#: ``partition_parameters._allgather_params_coalesced``, below which only C++ runs)
_DS_COLLECTIVE = re.compile(r"all_?gather|reduce_?scatter|all_?reduce|barrier|broadcast")
_DATA_FILES = ("torch/utils/data/", "accelerate/data_loader.py", "transformers/data/data_collator.py",
               "datasets/arrow_dataset.py", "datasets/iterable_dataset.py")
_DATA_FUNCS = ("__getitem__", "__getitems__", "__iter__", "__next__")
_WORKER_WAIT = ("_try_get_data", "_get_data")
_WRITE_FILES = ("torch/serialization.py", "deepspeed/runtime/checkpoint_engine/", "safetensors/", "zipfile")


@dataclass
class RankState:
    """What the watchdog knows about one rank."""

    rank: int
    phase: Optional[str] = None
    step: Optional[int] = None
    phase_since: Optional[float] = None
    alive: Optional[bool] = None
    frames: List[Dict[str, Any]] = field(default_factory=list)  # main thread, innermost last
    pid: Optional[int] = None
    workers: List[int] = field(default_factory=list)  # child processes (DataLoader workers), where known


def parse_stacks(text: str) -> List[Dict[str, Any]]:
    """The main thread's frames (innermost last) of the last dump in a faulthandler file."""
    if STACKS_MARKER in text:
        text = text[text.rindex(STACKS_MARKER):]
    blocks: List[List[Dict[str, Any]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
            continue
        m = _FRAME.match(line)
        if m and blocks:
            blocks[-1].append({"file": m.group("file"), "line": int(m.group("line")), "func": m.group("func")})
    if not blocks:
        return []
    main = blocks[-1]  # faulthandler lists the newest thread first: the main thread is last
    return list(reversed(main))


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def collective(frames: List[Dict[str, Any]]) -> Optional[str]:
    """The collective (or build lock) a rank waits in, from its innermost frames; None if none."""
    names = {c.lstrip("_") for c in _COLLECTIVES}
    for f in reversed(frames[-12:]):
        path = _norm(f["file"])
        if "file_baton" in path:
            return "build lock (torch.utils.file_baton)"
        if any(p in path for p in _COMM_FILES) and f["func"].lstrip("_") in names:
            return f["func"]
        if "deepspeed/" in path and _DS_COLLECTIVE.search(f["func"].lower()):
            return f["func"]
    return None


def _data_frame(frames: List[Dict[str, Any]]) -> Optional[Tuple[int, Dict[str, Any]]]:
    """The outermost frame of the data path (DataLoader, dataset, collate), with its index; None if none."""
    for i, f in enumerate(frames):
        path = _norm(f["file"])
        if any(p in path for p in _DATA_FILES) or "collate" in f["func"] or f["func"] in ("__getitem__", "__getitems__"):
            return i, f
    return None


def activity(s: RankState) -> Tuple[str, str]:
    """(what, detail) of one rank: ``gone``, ``lock``, ``collective``, ``data``, ``worker``, ``write``, ``code``."""
    if s.alive is False:
        return "gone", f"exited (last phase {s.phase or '?'}, step {s.step})"
    coll = collective(s.frames)
    if coll and coll.startswith("build lock"):
        return "lock", coll
    if coll:
        return "collective", coll
    if not s.frames:
        return "code", "no stack"
    data = _data_frame(s.frames)
    if data is not None:
        inner = s.frames[data[0]:]
        if any(f["func"] in _WORKER_WAIT for f in inner):
            return "worker", "waiting for a DataLoader worker" + (
                f" (worker pids {', '.join(map(str, s.workers))})" if s.workers else "")
        own = [f for f in inner if runlog_frames.kind_of(f["file"]) in ("user", "model")]
        return "data", _short((own or inner)[-1])
    if (s.phase or "").startswith("save") and any(any(w in _norm(f["file"]) for w in _WRITE_FILES)
                                                  for f in s.frames[-15:]):
        return "write", _short(s.frames[-1])
    return "code", _short(_own_frame(s.frames) or s.frames[-1])


def _short(f: Dict[str, Any]) -> str:
    return f"{f['func']} ({runlog_frames.short_path(_norm(f['file']))}:{f['line']})"


def _own_frame(frames: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The innermost frame of the user's own code (or the model's)."""
    for f in reversed(frames):
        if runlog_frames.kind_of(_norm(f["file"])) in ("user", "model"):
            return f
    return None


def where(frames: List[Dict[str, Any]], limit: int = 6) -> List[str]:
    """The frames worth showing, innermost last: the user's and the model's and the innermost one, no guard frames."""
    useful = [runlog_frames.frame(f["func"], f["file"], f["line"]) for f in frames
              if "zeropilot/guard" not in _norm(f["file"])]
    return runlog_frames.display([], useful, limit)[0]


def _describe(s: RankState) -> str:
    what, detail = activity(s)
    phase = s.phase or "unknown phase"
    own = _own_frame(s.frames)
    if what == "gone":
        return f"rank {s.rank} {detail}"
    if what in ("collective", "lock"):
        return f"rank {s.rank} in {phase}, waiting in {detail}" + (f" from {_short(own)}" if own else "")
    if what in ("data", "worker"):
        return f"rank {s.rank} in {phase}, loading data: {detail}"
    if what == "write":
        return f"rank {s.rank} in {phase}, writing the checkpoint at {detail}"
    return f"rank {s.rank} in {phase} at {detail}"


def _ranks(states: List[RankState]) -> str:
    return ", ".join(str(s.rank) for s in states)


def _verdict(cls: str, culprits: List[int], cause: str, fixes: List[str], shown: List[RankState], base: str,
             lines: List[str]) -> Dict[str, Any]:
    where_frames: List[str] = []
    for s in shown[:2]:
        where_frames.extend(where(s.frames))
    return {"class": cls, "ranks": sorted(set(culprits)), "where": where_frames,
            "reason": base + (": " + "; ".join(lines) if lines else ""), "cause": cause, "fixes": fixes,
            "ranks_detail": lines}


def _lock_text(locks: List[Dict[str, Any]]) -> str:
    return ", ".join(f"{lock['path']} (age {lock.get('age_s')} s)" for lock in locks[:3])


def _mismatch(states: List[RankState], fr: Optional[Dict[str, Any]]) -> Optional[Tuple[List[int], str]]:
    """Ranks whose collective differs from the others' (the minority; all of them on a tie), and the sentence."""
    desync = (fr or {}).get("desync")
    if isinstance(desync, dict) and isinstance(desync.get("ops"), dict):
        ops = {int(r): str(op) for r, op in desync["ops"].items() if str(r).isdigit()}
        what = "sizes" if desync.get("sizes") else "collectives"
        counts = Counter(ops.values())
        if len(counts) > 1:
            top = counts.most_common()
            odd = [r for r, op in ops.items() if counts[op] < top[0][1]] or sorted(ops)
            return odd, (f"the flight recorder shows different {what} at collective #{desync.get('seq')}: "
                         + ", ".join(f"{op} on rank {r}" for r, op in sorted(ops.items())))
    waits = {s.rank: collective(s.frames) for s in states}
    counts = Counter(waits.values())
    if len(counts) > 1 and None not in counts:
        top = counts.most_common()
        odd = [r for r, c in waits.items() if counts[c] < top[0][1]] or sorted(waits)
        return odd, "the ranks wait in different collectives: " + ", ".join(
            f"{c} on rank {r}" for r, c in sorted(waits.items()))
    return None


def hang_verdict(states: List[RankState], world_size: Optional[int], timeout_s: float,
                 locks: Optional[List[Dict[str, Any]]] = None, fr: Optional[Dict[str, Any]] = None,
                 slow: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The ``verdict`` object of ``hang.json``: class, culprit ranks, where, reason, cause, fixes; ``slow``: the
    stragglers of the steps before the stall (``runlog.stragglers.find`` / ``find_gpu`` findings)."""
    verdict = _judge(states, world_size, timeout_s, locks or [], fr)
    return _before_stall(verdict, slow or [], {s.rank for s in states}, _behind(fr))


def _before_stall(verdict: Dict[str, Any], slow: List[Dict[str, Any]], ranks: set, behind: List[int]
                  ) -> Dict[str, Any]:
    """The stragglers of the steps before the stall, in the cause (the first two in words) and as records; the
    culprits of a stall where every rank waits in one collective and the flight recorder shows none behind."""
    if not slow:
        return verdict
    words = "; ".join(describe(s) for s in slow[:2])
    culprits = sorted({s["rank"] for s in slow} & ranks)
    if verdict["class"] == "collective" and not behind and culprits:
        verdict["ranks"] = culprits
        verdict["cause"] += f"; the likely cause, straggling before the stall: {words}"
    else:
        verdict["cause"] += f". Before the stall, {words}"
    verdict["stragglers_before"] = slow
    return verdict


def _judge(states: List[RankState], world_size: Optional[int], timeout_s: float, locks: List[Dict[str, Any]],
           fr: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    seen = {s.rank for s in states}
    missing = [r for r in range(world_size or 0) if r not in seen]
    lines = [_describe(s) for s in sorted(states, key=lambda s: s.rank)]
    base = f"no rank made progress for {timeout_s:.0f} s"
    stale = [lock for lock in locks if lock.get("state") != "live"]
    if not states:
        if stale:
            return _verdict("stale_lock", list(range(world_size or 1)), "an op build waits on a lock no live build "
                            "holds (left by a killed build): " + _lock_text(stale), [
                                f"if no build is running, delete {stale[0]['path']}",
                                "or set TORCH_EXTENSIONS_DIR to a fresh folder"], [], base, lines)
        return _verdict("startup", list(range(world_size or 1)), "the job hung before any rank started training",
                        ["look at the launcher's output; a rank may wait for its peers to join (MASTER_ADDR/PORT, "
                         "nnodes)"], [], base, lines)
    acts = {s.rank: activity(s) for s in states}
    by = lambda *kinds: [s for s in states if acts[s.rank][0] in kinds]  # noqa: E731
    waiting = by("collective")
    gone = by("gone")
    if gone or missing:
        who = ", ".join(str(r) for r in [s.rank for s in gone] + missing)
        return _verdict("rank_gone", [s.rank for s in gone] + missing,
                        f"rank(s) {who} are gone or never started while the others wait for them",
                        ["look at the first error of those ranks (their rank-N.jsonl and the launcher's output)"],
                        gone, base, lines)
    lockers = by("lock")
    if lockers and locks and not stale:
        holders = sorted({int(lock["holder_rank"]) for lock in locks if str(lock.get("holder_rank")).isdigit()})
        return _verdict("build_stalled", holders or [s.rank for s in lockers],
                        f"rank(s) {_ranks(lockers)} wait on an op-build lock a live process of this job holds "
                        f"({_lock_text(locks)}"
                        + (f", taken by rank(s) {', '.join(map(str, holders))}" if holders else "")
                        + "), but the build made no progress for the whole timeout: no compiler used CPU and the "
                        "build folder did not change",
                        ["look at the holder's stack (stacks-rank-N.txt) and at its compiler processes",
                         "if the build is legitimately slow (a loaded machine), raise --hang-timeout"],
                        lockers, base, lines)
    if lockers:
        return _verdict("stale_lock", [s.rank for s in lockers],
                        f"rank(s) {_ranks(lockers)} wait on an op-build lock that no live build holds (left by a "
                        "killed build)" + (": " + _lock_text(stale or locks) if locks else ""),
                        [f"if no build is running, delete {(stale or locks)[0]['path']}" if locks else
                         "if no build is running, delete the lock file", "or set TORCH_EXTENSIONS_DIR to a fresh "
                         "folder"], lockers, base, lines)
    loaders = by("data", "worker")
    if loaders:
        where_txt = "; ".join(f"rank {s.rank}: {acts[s.rank][1]}" for s in loaders)
        others = f", while rank(s) {_ranks(waiting)} wait in {acts[waiting[0].rank][1]}" if waiting else ""
        return _verdict("data_loading", [s.rank for s in loaders],
                        f"stuck loading data ({where_txt}){others}: the dataset, the collate function or a "
                        "DataLoader worker does not return",
                        ["look at the dataset's __getitem__ / the collate function at that frame (a network or disk "
                         "read without a timeout, a lock, an endless loop)",
                         "with num_workers > 0: py-spy dump --pid <worker pid> shows the worker's stack",
                         "if loading is legitimately slow, raise --hang-timeout above the slowest batch"],
                        loaders, base, lines)
    writers = by("write")
    if writers:
        return _verdict("slow_storage", [s.rank for s in writers],
                        f"rank(s) {_ranks(writers)} are still writing the checkpoint"
                        + (f" while rank(s) {_ranks(waiting)} wait for them" if waiting else "")
                        + ": the storage is slow or stalled (a network filesystem, a full or failing disk)",
                        ["save to a fast local disk and copy the checkpoint off in the background",
                         "save less: save_only_model, exclude frozen weights (LoRA)",
                         "raise --hang-timeout and the collective timeout above the save time zeropilot plan "
                         "predicts"], writers, base, lines)
    coders = by("code")
    if coders and (waiting or len(states) == 1 or len(coders) == len(states)):
        alone = not waiting
        where_txt = "; ".join(f"rank {s.rank} at {acts[s.rank][1]}" for s in coders)
        cause = (f"rank(s) {_ranks(coders)} run their own code outside any collective ({where_txt})"
                 + (f" while rank(s) {_ranks(waiting)} wait in {acts[waiting[0].rank][1]}: a straggler" if waiting
                    else ": no progress there for the whole timeout"))
        return _verdict("user_code" if alone else "straggler", [s.rank for s in coders], cause,
                        ["look at that frame: code that runs on some ranks only (a save, an evaluation or a forward "
                         "under `if rank == 0`), a sleep, a lock, an endless loop, or one slow rank",
                         "if the work is legitimately long, raise --hang-timeout and the collective timeout above it"],
                        coders, base, lines)
    savers = [s for s in states if (s.phase or "").startswith("save")]
    if savers and len(savers) < len(states):
        return _verdict("save_partial", [s.rank for s in savers],
                        f"rank(s) {_ranks(savers)} are in a checkpoint save the other ranks did not enter: a save "
                        "called on some ranks only (DeepSpeed's save_checkpoint must run on every rank)",
                        ["call engine.save_checkpoint / trainer.save_model on every rank, not under `if rank == 0`"],
                        savers, base, lines)
    mismatch = _mismatch(waiting, fr)
    if mismatch is not None:
        odd, sentence = mismatch
        return _verdict("collective_mismatch", odd, sentence + ": the ranks took different code paths (a "
                        "collective under a rank-dependent condition, or tensors of different shapes)",
                        ["compare the stacks of the named ranks with the others' (stacks-rank-N.txt)",
                         "with NCCL: python -m torch.distributed.flight_recorder.fr_trace on the trace files"],
                        [s for s in states if s.rank in odd], base, lines)
    behind = _behind(fr)
    return _verdict("collective", behind or [s.rank for s in states],
                    "every rank waits in the same collective: a peer outside this job, the network, the transport, "
                    "or a rank whose kernels run behind"
                    + (f"; the flight recorder shows rank(s) {', '.join(map(str, behind))} behind" if behind else ""),
                    ["compare the ranks' stacks in stacks-rank-N.txt",
                     "with NCCL: python -m torch.distributed.flight_recorder.fr_trace on the nccl-trace-rank-N files",
                     "check the network between the nodes (NCCL_DEBUG=INFO) and NCCL_SOCKET_IFNAME"],
                    states, base, lines)


def _behind(fr: Optional[Dict[str, Any]]) -> List[int]:
    """Ranks whose newest collective is behind the others' in the flight recorder (they did not call it yet)."""
    ranks = (fr or {}).get("ranks")
    if not isinstance(ranks, dict):
        return []
    newest: Dict[int, int] = {}
    for r, groups in ranks.items():
        seqs = [g.get("newest") for g in (groups or {}).values() if isinstance(g, dict)]
        seqs = [s for s in seqs if isinstance(s, int)]
        if str(r).isdigit() and seqs:
            newest[int(r)] = max(seqs)
    if len(set(newest.values())) < 2:
        return []
    low = min(newest.values())
    return sorted(r for r, s in newest.items() if s == low)
