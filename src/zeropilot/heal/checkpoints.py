"""The checkpoint a restart resumes from: the newest that is complete and resumable at the restart's world size.

Candidates are every checkpoint in the folders the job saved into, as its ranks' ``save`` records name them (the HF
Trainer's ``output_dir`` with its ``checkpoint-N`` folders, a raw loop's ``save_dir`` with its tag folders), newest
step first. Each is judged with ``ckpt inspect``'s reader (:func:`zeropilot.checkpoint.layout.read_layout`: names,
sizes and each rank file's zip directory, no torch, no unpickling) and the records:

- damaged or partial (a rank file missing, empty or truncated: a rank died in the save) — skipped;
- saved on another number of data-parallel ranks than the restart runs (DeepSpeed refuses its optimizer partitions
  on another world size; a universal checkpoint resumes on any) — skipped;
- weights only (no optimizer state) — skipped: resuming from it is not the same training;
- a Trainer checkpoint without ``trainer_state.json`` (the Trainer writes it last) — skipped;
- a save some rank recorded with an error, or that fewer ranks than the world recorded ending — skipped. On one
  node of a job across nodes (its run directory holds its own ranks' records only: ``here`` in each save record),
  every rank of this node must have recorded it; the other nodes' ranks are judged by their files above.

The first that passes is chosen; those newer than it are listed with why they were skipped. Never a partial save.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from zeropilot.checkpoint.names import GLOBAL_STEP_RE, HF_CHECKPOINT_RE
from zeropilot.errors import InputError

MAX_CANDIDATES = 256  # per save folder, newest first: a long run keeps a few (save_total_limit); never enumerate more


@dataclass
class Candidate:
    """One checkpoint and what the judge found."""

    path: Path  # HF: the checkpoint-N folder; DeepSpeed: the save folder
    tag: str  # HF: checkpoint-N; DeepSpeed: the tag folder (global_stepN)
    step: Optional[int]
    framework: str  # hf | deepspeed
    why_not: Optional[str] = None  # None: resumable
    world_size: Optional[int] = None
    universal: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return {"path": str(self.path), "tag": self.tag, "step": self.step, "framework": self.framework,
                "world_size": self.world_size, "universal": self.universal, "why_not": self.why_not}


@dataclass
class Choice:
    """The checkpoint chosen (or None) and the newer ones skipped."""

    chosen: Optional[Candidate]
    skipped: List[Candidate] = field(default_factory=list)  # newer than the chosen one, with why_not
    folders: List[str] = field(default_factory=list)  # the save folders looked into

    def to_dict(self) -> Dict[str, Any]:
        return {"chosen": None if self.chosen is None else self.chosen.to_dict(),
                "skipped": [c.to_dict() for c in self.skipped], "folders": list(self.folders)}


def _step_of(tag: str) -> Optional[int]:
    m = HF_CHECKPOINT_RE.match(tag) or GLOBAL_STEP_RE.match(tag)
    return int(m.group(1)) if m else None


def save_folders(saves: Iterable[Dict[str, Any]]) -> List[Tuple[Path, str]]:
    """``(folder, framework)`` for each folder the ``save`` records name, in first-seen order.

    A Trainer's save is recorded with the ``output_dir`` as ``path`` and ``checkpoint-N`` as ``tag``; a raw
    engine's with its ``save_dir`` and the tag folder. ``save_16bit_model`` (tag ``16bit_model``) is no checkpoint.
    """
    out: List[Tuple[Path, str]] = []
    seen = set()
    for s in saves:
        path, tag = s.get("path"), str(s.get("tag") or "")
        if not isinstance(path, str) or not path or tag == "16bit_model":
            continue
        framework = "hf" if HF_CHECKPOINT_RE.match(tag) else "deepspeed"
        key = (os.path.realpath(path), framework)
        if key not in seen:
            seen.add(key)
            out.append((Path(path), framework))
    return out


def _listed(folder: Path, framework: str) -> List[Tuple[str, Optional[int]]]:
    """(tag, step) of the checkpoints in a save folder, newest first, at most :data:`MAX_CANDIDATES`."""
    pattern = HF_CHECKPOINT_RE if framework == "hf" else GLOBAL_STEP_RE
    try:
        names = [e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False) and pattern.match(e.name)]
    except OSError:
        return []
    tags = [(n, _step_of(n)) for n in names]
    tags.sort(key=lambda t: -(t[1] or 0))
    return tags[:MAX_CANDIDATES]


def _record_problem(saves: List[Dict[str, Any]], world: Optional[int]) -> Optional[str]:
    """Why the ranks' own records of this save say it is not whole, or None (also when none recorded it)."""
    if not saves:
        return None
    last_attempt = max(s.get("attempt", 1) for s in saves)
    latest = [s for s in saves if s.get("attempt", 1) == last_attempt]
    failed = [s for s in latest if s.get("error")]
    if failed:
        s = failed[0]
        return f"rank {s.get('rank')} recorded this save failing: {str(s.get('error'))[:200]}"
    ranks = sorted({s.get("rank") for s in latest if isinstance(s.get("rank"), int)})
    here = [r for r in latest[0].get("here") or [] if isinstance(r, int)]
    if world and 0 < len(here) < world:  # one node of several: its own ranks' records, the files for the rest
        missing = sorted(set(here) - set(ranks))
        return (f"rank(s) {', '.join(map(str, missing))} of this node did not record the end of this save: they died "
                "or were stopped inside it") if missing else None
    if world and len(ranks) < world:
        return (f"only rank(s) {', '.join(map(str, ranks))} of {world} recorded the end of this save: the others "
                "died or were stopped inside it")
    return None


def judge(path: Path, tag: str, framework: str, world: Optional[int], saves: List[Dict[str, Any]]) -> Candidate:
    """One candidate judged (see the module docstring); ``saves``: the records of this save, every rank's."""
    from zeropilot.checkpoint.layout import read_json, read_layout

    folder = path / tag if framework == "hf" else path
    cand = Candidate(folder, tag, _step_of(tag), framework)
    try:
        layout = read_layout(folder, None if framework == "hf" else tag)
    except InputError as exc:
        cand.why_not = f"not a checkpoint: {exc.render()}"
        return cand
    cand.world_size, cand.universal = layout.world_size, layout.universal
    if framework == "hf":
        state = layout.hf_files.get("trainer_state.json")
        data = read_json(state, layout.confinement) if state else None
        step = data.get("global_step") if isinstance(data, dict) else None
        cand.step = step if type(step) is int else cand.step
        if data is None:
            cand.why_not = "no readable trainer_state.json: the Trainer writes it last, so its save did not finish"
            return cand
    cand.why_not = _layout_problem(layout, world) or _record_problem(saves, world)
    return cand


def _layout_problem(layout: Any, world: Optional[int]) -> Optional[str]:
    if layout.problems:
        more = f" (and {len(layout.problems) - 1} more)" if len(layout.problems) > 1 else ""
        return f"incomplete: {layout.problems[0]}{more}"
    if not layout.universal and not layout.optim_files:
        return "weights only (no optimizer state): resuming from it would not be the same training"
    if world and not layout.universal and layout.world_size != world:
        return (f"saved on {layout.world_size} data-parallel ranks, the restart runs on {world}: DeepSpeed loads "
                "ZeRO optimizer partitions only on the world size that wrote them (`zeropilot ckpt universal` "
                "converts it)")
    return None


def choose(saves: List[Dict[str, Any]], world: Optional[int]) -> Choice:
    """The newest complete checkpoint resumable on ``world`` data-parallel ranks among those the job saved.

    Args:
        saves: every rank's ``save`` records of every attempt so far, each with ``attempt`` added.
        world: the restart's data-parallel world size (None: not checked).
    """
    folders = save_folders(saves)
    cands: List[Candidate] = []
    for folder, framework in folders:
        for tag, _ in _listed(folder, framework):
            mine = [s for s in saves if s.get("tag") == tag and isinstance(s.get("path"), str)
                    and os.path.realpath(s["path"]) == os.path.realpath(folder)]
            cands.append(judge(folder, tag, framework, world, mine))
    cands.sort(key=lambda c: -(c.step if c.step is not None else -1))
    skipped: List[Candidate] = []
    for c in cands:
        if c.why_not is None:
            return Choice(c, skipped, [str(f) for f, _ in folders])
        skipped.append(c)
    return Choice(None, skipped, [str(f) for f, _ in folders])
