"""One job across nodes: node directories merged into one set of records, ranks grouped into nodes, clocks aligned,
a lost node named.

Pure functions over :class:`~zeropilot.runlog.read.RunRecords` (no torch), used by ``zeropilot report DIR...``:

- :func:`read_job`: the directories the user named (node directories, one directory holding them, or one shared
  directory that every node wrote) read into one ``RunRecords``; two directories claiming one global rank, or ranks
  that disagree on the job (world size, master port, rendezvous id), are an input error;
- :func:`nodes_section`: the report's ``nodes`` (per node: ranks, hosts, outside-PyTorch memory, host RSS, exit,
  versions; how clocks were aligned; findings such as versions that differ across nodes);
- :func:`node_verdict`: a crash whose first failure is a whole node's ranks stopping at once is a node failure;
- :func:`checkpoint_check`: what ``ckpt inspect`` says of the last checkpoint, and on which world size it resumes.

Which node a rank ran on comes from its ``start`` record's ``node`` (:mod:`zeropilot.runlog.nodes`).
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zeropilot.errors import InputError
from zeropilot.runlog import normalize as nz
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.nodes import node_key
from zeropilot.runlog.read import MAX_EVENTS, MAX_STEP_ROWS, RunRecords, _Budget, merge_runs, read_run

MAX_NODE_DIRS = 1024
#: a clock offset below this is not corrected: ranks leave one collective within milliseconds of each other, so
#: the anchor cannot tell a smaller skew from that jitter, and nothing in a report turns on it
MIN_SKEW_S = 0.05
#: version differences across nodes worth a finding (the packages that decide what a ZeRO job computes)
_VERSION_KEYS = ("torch", "deepspeed", "transformers", "accelerate", "peft", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
                 "python", "zeropilot")


# -- reading ----------------------------------------------------------------------------------------------------

def _is_run_dir(path: Path) -> bool:
    d = RunDir(path)
    return (os.path.lexists(d.run_file) or bool(d.node_run_files(limit=1)) or bool(d.ranks("rank")))


def node_dirs(paths: Sequence[Path]) -> List[Path]:
    """The run directories the user means: each path that is one, else the run directories directly inside it
    (a folder of node directories; links are not followed). The same folder named twice counts once."""
    out: List[Path] = []
    seen = set()
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise InputError("not a run directory (" + ("not a folder" if path.exists() else "no such folder") + ")",
                             path=path)
        if _is_run_dir(path):
            found = [path]
        else:
            try:
                children = sorted(path.iterdir())[: MAX_NODE_DIRS + 1]
            except OSError as exc:
                raise InputError(f"cannot list the folder ({exc.strerror or exc})", path=path) from None
            found = [c for c in children if not c.is_symlink() and c.is_dir() and _is_run_dir(c)]
            if not found:
                raise InputError("not a run directory: no run.json, run-node-K.json or rank-N.jsonl, and no "
                                 "run directories inside", path=path)
        for f in found:
            key = os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                out.append(f)
    if len(out) > MAX_NODE_DIRS:
        raise InputError(f"more than {MAX_NODE_DIRS} run directories: name the job's node directories")
    return out


def read_job(paths: Sequence[Path]) -> RunRecords:
    """The records of one job from one or several run directories (see the module docstring).

    Raises:
        InputError: a path that is no run directory; two directories with the same global rank; directories
            whose ranks say they belong to different jobs.
    """
    dirs = node_dirs(paths)
    if len(dirs) == 1:
        records = read_run(dirs[0])
        align_clocks(records)
        return records
    budget = _Budget(MAX_STEP_ROWS, MAX_EVENTS)
    parts = [read_run(d, budget) for d in dirs]
    merged = _merge(parts)
    merged.root = Path(paths[0]) if len(paths) == 1 else dirs[0]
    _same_job(merged)
    align_clocks(merged)
    return merged


def _merge(parts: List[RunRecords]) -> RunRecords:
    owner: Dict[int, Path] = {}
    out = RunRecords(root=parts[0].root, run=None, ranks={}, ooms={}, hang=None, heartbeats={}, problems=[])
    runs: Dict[str, Dict[str, Any]] = {}
    for part in parts:
        for rank in part.ranks:
            if rank in owner:
                raise InputError(f"rank {rank} is in both {owner[rank]} and {part.root}: these are not the node "
                                 "directories of one job (each global rank runs once)", path=part.root)
            owner[rank] = part.root
        out.ranks.update(part.ranks)
        out.rank_dirs.update(part.rank_dirs)
        for kind in ("ooms", "heartbeats", "stacks"):
            getattr(out, kind).update({r: v for r, v in getattr(part, kind).items() if r not in getattr(out, kind)})
        if part.hang is not None and (out.hang is None or (nz.num(part.hang.get("t")) or math.inf)
                                      < (nz.num(out.hang.get("t")) or math.inf)):
            out.hang = part.hang
        if part.node_runs:
            for key, rec in part.node_runs.items():
                runs[key if key not in runs else f"{key}@{part.root.name}"] = rec
        elif part.run is not None:
            runs[part.root.name] = part.run
        out.problems += [f"{part.root.name}: {p}" for p in part.problems]
    out.node_runs = runs
    out.run = merge_runs(runs, out.problems) if runs else None
    return out


def _start(records: RunRecords, rank: int) -> Dict[str, Any]:
    rec = records.ranks.get(rank)
    return next((e for e in rec.events if e.get("event") == "start"), {}) if rec is not None else {}


def place_of(records: RunRecords, rank: int) -> Dict[str, Any]:
    """The rank's ``start.node`` (normalized), or ``{}``."""
    node = _start(records, rank).get("node")
    if not isinstance(node, dict):
        return {}
    return {"node_rank": nz.integer(node.get("node_rank")), "hostname": nz.text(node.get("hostname")),
            "local_rank": nz.integer(node.get("local_rank")), "world_size": nz.integer(node.get("world_size")),
            "nnodes": nz.integer(node.get("nnodes")), "launcher": nz.text(node.get("launcher")),
            "started_by": nz.text(node.get("started_by")), "run_id": nz.text(node.get("run_id")),
            "master_port": nz.integer(node.get("master_port")), "master_addr": nz.text(node.get("master_addr"))}


def _same_job(records: RunRecords) -> None:
    """Ranks of different jobs put together: world sizes, master ports or rendezvous ids that differ."""
    for field, what in (("world_size", "world size"), ("master_port", "master port"), ("run_id", "rendezvous id")):
        seen: Dict[Any, Path] = {}
        for rank in records.ranks:
            value = place_of(records, rank).get(field)
            if value is None or value == "none":  # torchrun's static rendezvous names its run "none"
                continue
            seen.setdefault(value, records.rank_dirs.get(rank, records.root))
        if len(seen) > 1:
            (a, da), (b, db) = list(seen.items())[:2]
            raise InputError(f"these directories are not one job: ranks in {da} say {what} {a}, ranks in {db} say "
                             f"{b}", path=db)


# -- nodes ------------------------------------------------------------------------------------------------------

def groups(records: RunRecords) -> Dict[str, List[int]]:
    """Node -> its ranks, by each rank's ``start.node`` (ranks that recorded none: by their directory)."""
    out: Dict[str, List[int]] = {}
    for rank in sorted(records.ranks):
        key = node_key(place_of(records, rank)) or (f"dir {records.rank_dirs[rank].name}"
                                                    if rank in records.rank_dirs else "unknown")
        out.setdefault(key, []).append(rank)
    return dict(sorted(out.items(), key=lambda kv: (min(kv[1]), kv[0])))


def _anchor(records: RunRecords) -> Tuple[Optional[str], Dict[int, float]]:
    """(what, rank -> time) of the first event every rank recorded: the end of the first step all ranks finished
    (they leave it together: it ends in the step's collectives), else ``deepspeed.initialize``'s return."""
    ranks = list(records.ranks.values())
    if not ranks:
        return None, {}
    common = set.intersection(*[{s for s in r.steps["step"] if s == s} for r in ranks])
    if common:
        step = min(common)
        times = {}
        for r in ranks:
            i = next(i for i, s in enumerate(r.steps["step"]) if s == step)
            times[r.rank] = r.steps["t"][i]
        if all(t == t for t in times.values()):
            return f"the end of step {int(step)}, which every rank finishes with the same collectives", times
    inits = {r.rank: nz.num(next((e.get("t") for e in r.events if e.get("event") == "init"), None)) for r in ranks}
    if all(t is not None for t in inits.values()):
        return "the return of deepspeed.initialize on every rank (it ends in collectives)", inits
    return None, {}


def align_clocks(records: RunRecords) -> Optional[Dict[str, Any]]:
    """Align the nodes' clocks on the first common event (:func:`_anchor`), in place; returns how (kept on the
    records as ``clock``). A node's offset is applied only when it exceeds the spread of that event's times
    within the nodes (the event's own jitter) and :data:`MIN_SKEW_S`: two launchers on one machine share a clock
    and are left as is."""
    nodes = groups(records)
    clock: Optional[Dict[str, Any]] = None
    if len(nodes) > 1:
        what, times = _anchor(records)
        clock = {"anchor": what, "nodes": []}
        if what is None:
            clock["how"] = "not aligned: no event every rank recorded (no common step, no deepspeed.initialize)"
        else:
            ref_key = next(iter(nodes))
            ref = statistics.median(times[r] for r in nodes[ref_key])
            for key, ranks in nodes.items():
                mine = [times[r] for r in ranks]
                spread = max(max(mine) - min(mine), max(times[r] for r in nodes[ref_key]) -
                             min(times[r] for r in nodes[ref_key]))
                offset = statistics.median(mine) - ref
                applied = key != ref_key and abs(offset) > max(spread, MIN_SKEW_S)
                if applied:
                    _shift(records, ranks, offset)
                clock["nodes"].append({"node": key, "offset_s": offset, "spread_s": spread, "applied": applied})
            moved = [n for n in clock["nodes"] if n["applied"]]
            clock["how"] = (f"aligned on {what}: " + (", ".join(f"{n['node']} shifted by {-n['offset_s']:+.3f} s"
                                                              for n in moved) if moved else
                                                    f"the nodes' clocks agree within {MIN_SKEW_S} s or that event's spread, none shifted"))
    records.clock = clock
    return clock


def _shift(records: RunRecords, ranks: List[int], offset: float) -> None:
    for rank in ranks:
        rec = records.ranks[rank]
        col = rec.steps["t"]
        for i in range(len(col)):
            col[i] -= offset
        for e in rec.events:
            t = nz.num(e.get("t"))
            if t is not None:
                e["t"] = t - offset
        for side in (records.ooms.get(rank), records.heartbeats.get(rank)):
            if isinstance(side, dict) and nz.num(side.get("t")) is not None:
                side["t"] = nz.num(side.get("t")) - offset


def _node_run(records: RunRecords, key: str, node_rank: Optional[int]) -> Optional[Dict[str, Any]]:
    if node_rank is not None and str(node_rank) in records.node_runs:
        return records.node_runs[str(node_rank)]
    for run in records.node_runs.values():
        node = run.get("node") if isinstance(run.get("node"), dict) else {}
        if node_rank is not None and nz.integer(node.get("node_rank")) == node_rank:
            return run
    return None


def nodes_section(records: RunRecords, ranks: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The report's ``nodes`` for a job on more than one node (None otherwise); sets each rank's ``node``."""
    nodes = groups(records)
    by_rank = {r["rank"]: r for r in ranks}
    for key, members in nodes.items():
        for rank in members:
            if rank in by_rank:
                by_rank[rank]["node"] = key
    if len(nodes) <= 1 and not records.node_runs:
        return None
    out_nodes = []
    for key, members in nodes.items():
        places = [place_of(records, r) for r in members]
        node_rank = next((p["node_rank"] for p in places if p.get("node_rank") is not None), None)
        run = _node_run(records, key, node_rank)
        rows = [by_rank[r] for r in members if r in by_rank]
        rss = [r["host_rss_peak_bytes"] for r in rows if r["host_rss_peak_bytes"] is not None]
        outside = [r["outside_torch_bytes"] for r in rows if r["outside_torch_bytes"] is not None]
        out_nodes.append({
            "node": key, "node_rank": node_rank,
            "hostnames": sorted({p["hostname"] for p in places if p.get("hostname")}),
            "ranks": members, "dirs": sorted({str(records.rank_dirs[r]) for r in members if r in records.rank_dirs}),
            "launcher": next((p["launcher"] for p in places if p.get("launcher")), None),
            "steps": max((r["steps"] for r in rows), default=0),
            "ended": all(r["ended"] for r in rows),
            "outside_torch_bytes": max(outside) if outside else None,
            "host_rss_peak_bytes": max(rss) if rss else None,
            "host_rss_sum_bytes": sum(rss) if rss else None,
            "exit_code": nz.integer(run.get("exit_code")) if run else None,
            "supervisor_ended": ("ended_at" in run) if run else None,
            "versions": nz.str_map(run.get("versions")) if run and isinstance(run.get("versions"), dict) else None,
        })
    expected = [p.get("world_size") for p in (place_of(records, r) for r in records.ranks) if p.get("world_size")]
    world = max(expected) if expected else None
    missing = [r for r in range(world) if r not in records.ranks] if world and world <= 65536 else []
    nnodes = [p.get("nnodes") for p in (place_of(records, r) for r in records.ranks) if p.get("nnodes")]
    clock = records.clock
    return {"count": len(out_nodes), "expected": max(nnodes) if nnodes else None, "world_size": world,
            "missing_ranks": missing[:nz.MAX_ITEMS],
            "dirs": sorted({str(d) for d in records.rank_dirs.values()}), "clock": clock, "list": out_nodes,
            "findings": _findings(out_nodes, missing, world)}


def _findings(nodes: List[Dict[str, Any]], missing: List[int], world: Optional[int]) -> List[Dict[str, str]]:
    out = []
    for pkg in _VERSION_KEYS:
        seen = {n["versions"].get(pkg) for n in nodes if n["versions"] and n["versions"].get(pkg)}
        if len(seen) > 1:
            by = "; ".join(f"{n['node']}: {n['versions'].get(pkg)}" for n in nodes if n["versions"])
            out.append({"kind": "versions-differ", "message": f"{pkg} differs across nodes ({by}): ranks of one job "
                                                              "must run the same code (collectives, checkpoint "
                                                              "layout); install the same versions on every node"})
    if missing:
        out.append({"kind": "ranks-missing", "message": f"ranks {_spans(missing)} of world size {world} recorded "
                                                        "nothing here: give their node's run directory too (or their "
                                                        "node never started them)"})
    return out


def _spans(ranks: List[int]) -> str:
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


# -- verdicts ---------------------------------------------------------------------------------------------------

def _named_node(records: RunRecords, lost: List[int]) -> Dict[str, Any]:
    """The node of ranks ``lost`` as the report names nodes (the group holding them; its host and node rank)."""
    key = next((k for k, members in groups(records).items() if set(lost) & set(members)), "unknown")
    hosts = sorted({place_of(records, r).get("hostname") or "?" for r in lost if r in records.ranks})
    node_rank = next((place_of(records, r).get("node_rank") for r in lost
                      if r in records.ranks and place_of(records, r).get("node_rank") is not None), None)
    return {"node": key, "node_rank": node_rank, "hostnames": hosts, "ranks": sorted(lost)}


def node_verdict(records: RunRecords, ranks: List[Dict[str, Any]], verdict: Dict[str, Any]) -> Dict[str, Any]:
    """A crash in which every rank of one node stopped without an ``error`` or ``end`` record and without being
    terminated by its launcher, while ranks of other nodes outlived them, is that node's failure (the machine,
    its network or all its processes lost), named once instead of as its ranks' crashes. A watchdog's ``node_lost``
    hang gets the node it named (so the checkpoint verdict knows the surviving ranks)."""
    if verdict.get("kind") == "hang" and verdict.get("class") == "node_lost":
        return dict(verdict, node=_named_node(records, verdict["ranks"]))
    if verdict.get("kind") != "crash":
        return verdict
    from zeropilot.runlog.crash import terminated_ranks

    nodes = groups(records)
    if len(nodes) < 2:
        return verdict
    terminated = set(terminated_ranks(records.stacks))
    last = {r["rank"]: r["last_record_t"] for r in ranks}
    silent = {r for r, rec in records.ranks.items()
              if not any(e.get("event") in ("error", "end") for e in rec.events) and r not in terminated}
    lost = [(key, members) for key, members in nodes.items() if members and all(r in silent for r in members)]
    if not lost or len(lost) == len(nodes):
        return verdict
    key, members = min(lost, key=lambda kv: max((last.get(r) or 0.0) for r in kv[1]))
    gone_at = max((last.get(r) or 0.0) for r in members)
    others = [r for k, ms in nodes.items() if k != key for r in ms]
    outlived = [r for r in others if (last.get(r) or 0.0) > gone_at]
    if not outlived:
        return verdict
    hosts = sorted({place_of(records, r).get("hostname") or "?" for r in members})
    node_rank = next((place_of(records, r).get("node_rank") for r in members
                      if place_of(records, r).get("node_rank") is not None), None)
    run = _node_run(records, key, node_rank)
    supervisor = "" if run is None or "ended_at" in run else "; its zeropilot run recorded no end either"
    peers = sorted(r for r in others if any(e.get("event") == "error" and e.get("peer_failure")
                                            for e in records.ranks[r].events))
    reason = (f"{key} (host {', '.join(hosts)}) lost: all {len(members)} of its ranks ({_spans(members)}) stopped "
              f"without an error or end record, the last at {_clock(gone_at)}{supervisor}; ranks on the other "
              "nodes ran on" + (f" and {_spans(peers)} then saw their peers fail" if peers else ""))
    return {"kind": "crash", "ranks": members, "where": [], "reason": nz.text(reason),
            "node": {"node": key, "node_rank": node_rank, "hostnames": hosts, "ranks": members}}


def _clock(t: Optional[float]) -> str:
    import time

    return "?" if not t else time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 10)}"


def checkpoint_check(path: str, world_size: Optional[int], survivors: Optional[int] = None,
                     tag: Optional[str] = None) -> Dict[str, Any]:
    """What ``zeropilot ckpt inspect`` says of the checkpoint at ``path`` (layout only, tensors read safely), and
    on which world size the job can resume from it: the one it was saved at, unless converted to a universal
    checkpoint. ``survivors``: ranks left after a node failure, said when they cannot resume it as it is."""
    from zeropilot.checkpoint.inspect import inspect_checkpoint

    try:
        report = inspect_checkpoint(path, tag)
    except InputError as exc:
        return {"path": path, "verdict": "unreadable", "world_size": None, "resumable": None,
                "problems": [exc.render()], "resume_on": None}
    saved_at = report.layout.world_size
    resumable = report.verdict != "damaged" and bool(report.layout.optim_files)
    resume_on = None
    if resumable and saved_at:
        resume_on = f"{saved_at} ranks as saved"
        if survivors and survivors != saved_at:
            resume_on += (f"; not on the {survivors} surviving ranks as it is (another world size needs a universal "
                          "checkpoint: DeepSpeed's ds_to_universal.py, then load_universal_checkpoint)")
    return {"path": str(report.layout.path), "verdict": report.verdict, "world_size": saved_at,
            "tag": report.layout.tag, "resumable": report.resume, "problems": list(report.layout.problems)[:50],
            "resume_on": resume_on, "job_world_size": world_size}


def last_checkpoint(summary: Dict[str, Any]) -> Optional[Tuple[str, Optional[str]]]:
    """(path, tag) of the last save the run recorded (every rank's record of it names the same save)."""
    saves = [o for o in summary.get("saves") or [] if o.get("path") and not o.get("error")]
    if not saves:
        return None
    last = max(saves, key=lambda o: (o["t"] if o["t"] is not None else 0.0, o["step"] or 0))
    return last["path"], last.get("tag")


def checkpoint_section(summary: Dict[str, Any], path: Optional[str]) -> Optional[Dict[str, Any]]:
    """The report's ``checkpoint``: :func:`checkpoint_check` of ``path`` or, for ``"last"``, of the last save the
    run recorded (the user asked for that path to be read: ``report --checkpoint``)."""
    tag = None
    if path == "last":
        found = last_checkpoint(summary)
        if found is None:
            return {"path": None, "verdict": "none", "world_size": None, "tag": None, "resumable": None,
                    "problems": ["the run recorded no save"], "resume_on": None, "job_world_size": None}
        path, tag = found
    n = summary.get("nodes") or {}
    world = n.get("world_size") or summary.get("world_size")
    lost = (summary.get("verdict") or {}).get("node")
    survivors = world - len(lost["ranks"]) if world and lost else None
    return checkpoint_check(str(path), world, survivors, tag)

