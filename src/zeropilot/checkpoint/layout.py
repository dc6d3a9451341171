"""What a DeepSpeed checkpoint folder holds, read from names, sizes and pickle opcodes — no torch.

This module and :mod:`zeropilot.checkpoint.names` (the file and folder names themselves) are the only
places in zeropilot that know DeepSpeed's checkpoint layout (DeepSpeed 0.19.8, FACTS.md C). It never
unpickles anything: a few scalar facts (ZeRO stage, partition count, DeepSpeed version) are read with
:mod:`pickletools`, which walks opcodes without executing them. Everything here is importable without
torch, so ``zeropilot check`` can use it.

Layout (``save_dir`` is what ``engine.save_checkpoint(save_dir)`` was given)::

    save_dir/latest                      text: the tag
    save_dir/zero_to_fp32.py             DeepSpeed's converter
    save_dir/<tag>/mp_rank_00_model_states.pt                          ZeRO-1/2 (16-bit module, rank 0)
    save_dir/<tag>/zero_pp_rank_{r}_mp_rank_00_model_states.pt         ZeRO-3 (one per rank)
    save_dir/<tag>/[bf16_|fp16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt   one per rank

A Hugging Face Trainer writes ``output_dir/checkpoint-N/`` as such a ``save_dir`` (tag
``global_stepN``) with ``trainer_state.json``, ``config.json`` or PEFT adapter files beside it.

A universal checkpoint (``ds_to_universal.py``, ``zeropilot ckpt universal``) has ``latest_universal``
instead of ``latest`` (or beside it), and its tag folder holds the model-states files and
``zero/optimizer_state.pt`` with one folder per parameter, no optimizer files
(:attr:`CheckpointLayout.universal`).

Use :func:`read_layout`; it raises :class:`~zeropilot.errors.InputError` only when the path is not a
checkpoint at all (or ``--tag`` is not a tag name). Problems of a checkpoint (missing, empty, truncated
rank files, a ``latest`` that points nowhere or outside the save folder, a rank file that is a FIFO or a
symlink leaving the checkpoint) are listed in :attr:`CheckpointLayout.problems`, not raised.

Hostile input: every file is opened through :mod:`zeropilot.checkpoint.fsguard` (regular files inside
the checkpoint's root, bounded reads); ``latest`` and ``--tag`` must name one folder of the save dir;
world sizes claimed by file names or pickles are never enumerated past what is on disk.
"""

from __future__ import annotations

import os
import pickletools
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot.checkpoint.names import (GLOBAL_STEP_RE, HF_CHECKPOINT_RE, HF_MODEL_FILES, HF_WEIGHT_FILES,
                                       LATEST_FILE, LATEST_UNIVERSAL_FILE, MODEL_RE, MODEL_STATES_SUFFIX, OPTIM_RE,
                                       OPTIM_STATES_SUFFIX, PEFT_FILES, TRAINER_FILES, UNIVERSAL_OPTIMIZER_FILE,
                                       UNIVERSAL_ZERO_DIR, ZERO12_MODEL_FILE)
from zeropilot.checkpoint import fsguard
from zeropilot.checkpoint.fsguard import Confinement
from zeropilot.checkpoint.terminal import clean
from zeropilot.errors import InputError

_LISTED_MISSING = 32  # missing rank files named one by one; the rest are counted
_TAG_RE = re.compile(r"^[^/\\\x00-\x1f\x7f]{1,255}$")


@dataclass(frozen=True)
class RankFile:
    """One ``*_model_states.pt`` or ``*_optim_states.pt`` file of a tag folder."""

    path: Path
    kind: str  # "model" or "optim"
    rank: Optional[int]  # data-parallel rank; None for ZeRO-1/2's single model file
    size: int
    truncated: Optional[str] = None  # why the file cannot be a complete torch zip archive

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def empty(self) -> bool:
        return self.size == 0 and not self.truncated or self.truncated == "empty (0 bytes)"


@dataclass
class CheckpointLayout:
    """Facts about one checkpoint tag, from file names, sizes and pickle opcodes.

    Attributes whose value cannot be known are ``None`` with the reason in ``unknown``
    (``unknown["stage"] = "no optimizer file could be read"``).
    """

    path: Path  # what the user gave
    kind: str  # "hf-output-dir", "hf-checkpoint", "save-dir" or "tag-dir"
    save_dir: Optional[Path]  # the folder with `latest` (None for a bare tag dir)
    tag: str
    tag_dir: Path
    latest: Optional[str]  # what `latest` says, None if there is no `latest`
    tags: List[str]  # every tag folder found in save_dir
    stage: Optional[int]
    world_size: Optional[int]
    optim_dtype: Optional[str]  # "bf16", "fp16" or "fp32" (from the optimizer file prefix)
    ds_version: Optional[str]
    model_files: List[RankFile]
    optim_files: List[RankFile]
    missing: List[str]  # names of expected rank files that are absent
    hf_files: Dict[str, Path]  # config.json, adapter_config.json, trainer_state.json... found beside
    problems: List[str] = field(default_factory=list)
    unknown: Dict[str, str] = field(default_factory=dict)
    hf_checkpoints: List[Path] = field(default_factory=list)  # checkpoint-N dirs of an output dir
    confinement: Optional[Confinement] = None  # the folder every file read must stay inside
    missing_count: int = 0  # expected rank files absent (``missing`` names at most _LISTED_MISSING)
    universal: bool = False  # the tag folder is a universal checkpoint (zero/optimizer_state.pt, no optim files)
    latest_file: str = LATEST_FILE  # the file `latest` was read from (``latest_universal`` without ``latest``)

    @property
    def rank_files(self) -> List[RankFile]:
        return list(self.model_files) + list(self.optim_files)

    @property
    def empty(self) -> List[RankFile]:
        return [f for f in self.rank_files if f.empty]

    @property
    def truncated(self) -> List[RankFile]:
        return [f for f in self.rank_files if f.truncated and not f.empty]

    @property
    def complete(self) -> bool:
        """True when every expected rank file is present, non-empty and a whole archive."""
        return not self.problems

    @property
    def model_bytes(self) -> int:
        return sum(f.size for f in self.model_files)

    @property
    def optim_bytes(self) -> int:
        return sum(f.size for f in self.optim_files)

    @property
    def is_peft(self) -> bool:
        return "adapter_config.json" in self.hf_files

    @property
    def has_optimizer_state(self) -> bool:
        return bool(self.optim_files)

    def model_file(self, rank: int = 0) -> Path:
        """The model-states file reconstruction reads for `rank` (ZeRO-1/2: the only one)."""
        if self.stage is not None and self.stage <= 2:
            return self.tag_dir / ZERO12_MODEL_FILE
        return self.tag_dir / model_file_name(rank)

    def optim_file(self, rank: int) -> Path:
        prefix = {"bf16": "bf16_", "fp16": "fp16_"}.get(self.optim_dtype or "", "")
        return self.tag_dir / optim_file_name(rank, prefix)


def model_file_name(rank: int) -> str:
    """ZeRO-3's per-rank module file name."""
    return f"zero_pp_rank_{rank}_mp_rank_00{MODEL_STATES_SUFFIX}"


def optim_file_name(rank: int, prefix: str = "") -> str:
    """A rank's optimizer file name; `prefix` is ``bf16_``, ``fp16_`` or empty."""
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00{OPTIM_STATES_SUFFIX}"


def read_layout(path, tag: Optional[str] = None, follow_symlinks: bool = False) -> CheckpointLayout:
    """Read the layout of the checkpoint at `path` without torch.

    Args:
        path: an HF Trainer output dir (its last ``checkpoint-N`` is taken), a ``checkpoint-N``
            dir, a DeepSpeed save dir (with ``latest``) or a tag dir.
        tag: the tag to read instead of what ``latest`` says.
        follow_symlinks: open files whose symlinks lead outside the checkpoint folder.

    Returns:
        The layout; its ``problems`` list what is damaged or missing.

    Raises:
        InputError: `path` does not exist or holds no DeepSpeed checkpoint.
    """
    root = Path(path)
    if not root.exists():
        raise InputError("no such file or directory", root)
    if not root.is_dir():
        raise InputError("not a directory: give the checkpoint folder", root)
    if tag is not None and not _TAG_RE.match(tag) or tag in (".", ".."):
        raise InputError(f"--tag {clean(tag)!r}: not a tag name (one folder name, no '/')", root)
    kind, save_dir, hf_checkpoints = _classify(root)
    confinement = Confinement.of(save_dir if (kind == "tag-dir" and save_dir) else root, follow_symlinks)
    problems: List[str] = []
    latest_file = _latest_file(save_dir) if save_dir else LATEST_FILE
    latest = _read_latest(save_dir, confinement, problems, latest_file) if save_dir else None
    tags = _list_tags(save_dir) if save_dir else []
    tag_name, tag_dir = _resolve_tag(root, kind, save_dir, latest, tags, tag, problems, latest_file)
    if tag_dir != root and not confinement.follow_symlinks and not confinement.contains(tag_dir):
        problems.append(f"{tag_dir}: a symlink to {os.path.realpath(tag_dir)}, outside the checkpoint folder: "
                        "refused (pass --follow-symlinks if you trust it)")
        tag_dir = root / ".zeropilot-refused-tag"
    layout = CheckpointLayout(
        path=root, kind=kind, save_dir=save_dir, tag=tag_name, tag_dir=tag_dir, latest=latest, tags=tags,
        stage=None, world_size=None, optim_dtype=None, ds_version=None, model_files=[], optim_files=[],
        missing=[], hf_files=_hf_files(save_dir or tag_dir.parent), problems=problems,
        hf_checkpoints=hf_checkpoints, confinement=confinement, latest_file=latest_file,
    )
    if fsguard.kind_of(tag_dir) == "dir":
        _read_tag_dir(layout)
    return layout


def _latest_file(save_dir: Path) -> str:
    """``latest``, or ``latest_universal`` when only that one is there."""
    if fsguard.kind_of(save_dir / LATEST_FILE) is None and fsguard.kind_of(save_dir / LATEST_UNIVERSAL_FILE):
        return LATEST_UNIVERSAL_FILE
    return LATEST_FILE


def _has_latest(folder: Path) -> bool:
    return any(fsguard.kind_of(folder / n) is not None for n in (LATEST_FILE, LATEST_UNIVERSAL_FILE))


def _classify(root: Path) -> Tuple[str, Optional[Path], List[Path]]:
    if _has_latest(root) or _list_tags(root):
        kind = "hf-checkpoint" if (root / "trainer_state.json").is_file() else "save-dir"
        return kind, root, []
    if _rank_files_in(root):
        parent = root.parent
        return "tag-dir", (parent if _has_latest(parent) else None), []
    checkpoints = sorted(
        (p for p in root.iterdir() if p.is_dir() and HF_CHECKPOINT_RE.match(p.name)),
        key=lambda p: int(HF_CHECKPOINT_RE.match(p.name).group(1)),
    )
    if checkpoints:
        return "hf-output-dir", checkpoints[-1], checkpoints
    raise InputError(
        "no DeepSpeed checkpoint here: expected a `latest` file, a global_step* folder, "
        "*_optim_states.pt / *_model_states.pt files or checkpoint-N folders", root)


def _rank_files_in(folder: Path) -> List[Path]:
    try:
        return [p for p in folder.iterdir() if p.name.endswith((MODEL_STATES_SUFFIX, OPTIM_STATES_SUFFIX))]
    except OSError:
        return []


def _list_tags(save_dir: Path) -> List[str]:
    """Sub-folders holding rank files, global_stepN in numeric order first."""
    tags = [p.name for p in save_dir.iterdir() if p.is_dir() and _rank_files_in(p)]
    return sorted(tags, key=_tag_order)


def _tag_order(tag: str) -> Tuple[int, int, str]:
    m = GLOBAL_STEP_RE.match(tag)
    return (0, int(m.group(1)), tag) if m else (1, 0, tag)


def _read_latest(save_dir: Path, confinement: Confinement, problems: List[str],
                 name: str = LATEST_FILE) -> Optional[str]:
    """The tag `latest` (or `name`) names, or None (with a problem when it exists but is not a tag name)."""
    f = save_dir / name
    kind = fsguard.kind_of(f)
    if kind is None:
        return None
    try:
        text = fsguard.read_bounded(f, fsguard.LATEST_LIMIT, confinement).decode("utf-8", errors="replace").strip()
    except InputError as exc:
        problems.append(f"{exc.render()}: `{name}` not followed")
        return None
    if not _TAG_RE.match(text) or text in (".", ".."):
        problems.append(f"{f}: holds {clean(text[:80])!r}, which is not a tag folder name (one folder of "
                        f"{save_dir}, no '/'): not followed")
        return None
    return text


def _resolve_tag(root, kind, save_dir, latest, tags, tag, problems, latest_file=LATEST_FILE) -> Tuple[str, Path]:
    if kind == "tag-dir":
        if tag is not None and tag != root.name:
            raise InputError(f"--tag {tag} given, but this is the tag folder {root.name}", root)
        return root.name, root
    if tag is not None:
        if not (save_dir / tag).is_dir():
            raise InputError(f"no tag folder {tag!r} (tags here: {', '.join(tags) or 'none'})", save_dir)
        return tag, save_dir / tag
    if latest is None:
        if not tags:
            problems.append(f"{save_dir}: no `latest` file and no tag folder with rank files")
            return "", save_dir
        problems.append(f"{save_dir / latest_file}: missing; took the last tag folder, {tags[-1]}")
        return tags[-1], save_dir / tags[-1]
    if not (save_dir / latest).is_dir():
        problems.append(
            f"{save_dir / latest_file}: points to {latest!r}, which does not exist "
            f"(tags here: {', '.join(tags) or 'none'}); pass --tag to choose one")
        return latest, save_dir / latest
    newer = [t for t in tags if _tag_order(t) > _tag_order(latest) and GLOBAL_STEP_RE.match(t)]
    if newer:
        problems.append(
            f"{save_dir / latest_file}: points to {latest!r} but a newer tag folder exists ({newer[-1]}); "
            "the save that should have updated `latest` may have failed")
    return latest, save_dir / latest


def _hf_files(folder: Path) -> Dict[str, Path]:
    """Side files beside the checkpoint (regular files or links to them; opened later through fsguard)."""
    names = HF_MODEL_FILES + PEFT_FILES + TRAINER_FILES + HF_WEIGHT_FILES
    return {n: folder / n for n in names if fsguard.kind_of(folder / n) == "file"}


def _read_tag_dir(layout: CheckpointLayout) -> None:
    model, optim, prefixes = _scan_rank_files(layout.tag_dir, layout.confinement)
    if len(prefixes) > 1:
        layout.problems.append(
            f"{layout.tag_dir}: optimizer files with several dtype prefixes ({', '.join(sorted(prefixes))}): "
            "files of two different runs are mixed")
    prefix = sorted(prefixes)[0] if prefixes else None
    layout.optim_dtype = {"bf16_": "bf16", "fp16_": "fp16", "": "fp32"}.get(prefix) if prefix is not None else None
    if prefix == "":
        layout.unknown["optim_dtype"] = "no bf16_/fp16_ prefix: fp32 or fp16 training"
    layout.model_files, layout.optim_files = model, optim
    if not optim and fsguard.kind_of(layout.tag_dir / UNIVERSAL_ZERO_DIR / UNIVERSAL_OPTIMIZER_FILE) is not None:
        _read_universal(layout)
        return
    _infer_stage_and_world(layout)
    _find_missing(layout, prefix or "")
    _record_damage(layout)


def _read_universal(layout: CheckpointLayout) -> None:
    """A universal tag folder: stage and saved world size from ``zero/optimizer_state.pt``; the model-states
    file DeepSpeed's loader reads (rank 0's) must be there."""
    layout.universal = True
    layout.unknown.pop("optim_dtype", None)
    state_file = layout.tag_dir / UNIVERSAL_ZERO_DIR / UNIVERSAL_OPTIMIZER_FILE
    facts = pickle_facts(state_file, ("zero_stage", "partition_count", "ds_version"), layout.confinement)
    layout.stage = facts.get("zero_stage")
    layout.world_size = facts.get("partition_count")
    layout.ds_version = facts.get("ds_version") or _first_facts(layout.model_files, ("ds_version",)).get("ds_version")
    if not facts:
        layout.problems.append(f"{state_file}: not a readable torch.save archive")
    for key in ("stage", "world_size"):
        if getattr(layout, key) is None:
            layout.unknown[key] = f"not found in {state_file.name}"
    needed = layout.model_file(0) if layout.stage is not None else None
    if needed is not None and needed.name not in {f.name for f in layout.model_files}:
        layout.missing.append(needed.name)
        layout.missing_count += 1
        layout.problems.append(f"{needed}: missing (DeepSpeed's loader reads it)")
    _record_damage(layout)


def _scan_rank_files(tag_dir: Path, confinement: Optional[Confinement] = None
                     ) -> Tuple[List[RankFile], List[RankFile], set]:
    model: List[RankFile] = []
    optim: List[RankFile] = []
    prefixes = set()
    for p in sorted(tag_dir.iterdir()):
        m = MODEL_RE.match(p.name)
        o = OPTIM_RE.match(p.name)
        if p.name == ZERO12_MODEL_FILE:
            model.append(_rank_file(p, "model", None, confinement))
        elif m:
            model.append(_rank_file(p, "model", int(m.group(1)), confinement))
        elif o:
            prefixes.add(o.group(1) or "")
            optim.append(_rank_file(p, "optim", int(o.group(2)), confinement))
    key = lambda f: (-1 if f.rank is None else f.rank)  # noqa: E731
    return sorted(model, key=key), sorted(optim, key=key), prefixes


def _rank_file(path: Path, kind: str, rank: Optional[int], confinement: Optional[Confinement]) -> RankFile:
    try:
        fd = fsguard.open_regular(path, confinement)
    except InputError as exc:
        return RankFile(path=path, kind=kind, rank=rank, size=0, truncated=exc.reason)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return RankFile(path=path, kind=kind, rank=rank, size=size, truncated=_truncation(f, size))


def _truncation(f, size: int) -> Optional[str]:
    """Why the open file `f` cannot be a whole torch zip archive (None when it looks whole)."""
    if size == 0:
        return "empty (0 bytes)"
    try:
        with zipfile.ZipFile(f) as zf:
            for info in zf.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"record {clean(info.filename)} runs past the end of the file"
    except (zipfile.BadZipFile, ValueError, EOFError):
        return "not a complete zip archive (no end-of-archive record): truncated or not written by torch.save"
    except OSError as exc:
        return f"unreadable: {exc}"
    return None


def _infer_stage_and_world(layout: CheckpointLayout) -> None:
    ranks = [f.rank for f in layout.rank_files if f.rank is not None]
    facts = _first_facts(layout.optim_files, ("zero_stage", "partition_count"))
    model_facts = _first_facts(layout.model_files, ("ds_version",))
    layout.ds_version = model_facts.get("ds_version") or _first_facts(layout.optim_files, ("ds_version",)).get(
        "ds_version")
    stage = facts.get("zero_stage")
    if stage is None:
        if any(f.name == ZERO12_MODEL_FILE for f in layout.model_files):
            layout.unknown["stage"] = "ZeRO-1 or 2 (one mp_rank_00 model file); no optimizer file could be read"
        elif any(f.rank is not None for f in layout.model_files):
            stage = 3
        else:
            layout.unknown["stage"] = "no rank files to read it from"
    layout.stage = stage
    world = facts.get("partition_count")
    if world is not None and world <= 0:
        layout.problems.append(f"{layout.tag_dir}: the optimizer files say {world} ranks (partition_count)")
        world = None
    if world is None and ranks:
        world = max(ranks) + 1
        layout.unknown["world_size"] = "from the highest rank file name: ranks past the last file may be missing"
    elif world is None:
        layout.unknown["world_size"] = "no rank files"
    layout.world_size = world
    if layout.ds_version is None:
        layout.unknown["ds_version"] = "not found in the model states file"


def _first_facts(files: List[RankFile], keys: Tuple[str, ...]) -> Dict[str, object]:
    for f in files:
        if f.truncated:
            continue
        facts = pickle_facts(f.path, keys)
        if facts:
            return facts
    return {}


def pickle_facts(path: Path, keys: Tuple[str, ...], confinement: Optional[Confinement] = None) -> Dict[str, object]:
    """Scalar values stored under `keys` in a torch zip archive's pickle, without unpickling.

    Walks the opcodes of ``data.pkl`` (read through :func:`torchzip.read_archive`, which validates
    the archive first): after a string equal to a wanted key, the next int (or, for ``ds_version``,
    string) opcode is its value. Lists of ints (``partition_count`` is one per parameter group) give
    their first element. Returns what was found; nothing for a file that is not a valid archive.
    """
    from zeropilot.checkpoint import torchzip

    try:
        data = torchzip.read_archive(path, confinement).pickle
    except (torchzip.Unsupported, InputError, OSError):
        return {}
    return _scan_opcodes(data, keys)


_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG"}
_STR_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"}


def _scan_opcodes(data: bytes, keys: Tuple[str, ...]) -> Dict[str, object]:
    found: Dict[str, object] = {}
    pending: Optional[str] = None
    budget = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            if pending is not None:
                budget -= 1
                if op.name in _INT_OPS and pending != "ds_version":
                    if isinstance(arg, int) and 0 <= arg < 1 << 62:
                        found[pending] = int(arg)
                    pending = None
                elif op.name in _STR_OPS and pending == "ds_version":
                    found[pending] = str(arg)[:64]
                    pending = None
                elif budget <= 0:
                    pending = None
                continue
            if op.name in _STR_OPS and arg in keys and arg not in found:
                pending, budget = arg, 12
            if len(found) == len(keys):
                break
    except Exception:  # noqa: BLE001 - a crafted pickle may break genops anywhere: no facts, not a crash
        pass
    return found


def _find_missing(layout: CheckpointLayout, prefix: str) -> None:
    """Name the absent rank files: at most _LISTED_MISSING one by one, never enumerating a huge world."""
    world, stage = layout.world_size, layout.stage
    if world is None:
        return
    names = {f.name for f in layout.rank_files}
    makers = [lambda r: optim_file_name(r, prefix)]
    if stage == 3 or (stage is None and any(f.rank is not None for f in layout.model_files)):
        makers.append(model_file_name)
    elif ZERO12_MODEL_FILE not in names:
        layout.missing.append(ZERO12_MODEL_FILE)
        layout.missing_count += 1
    for make in makers:
        present = sum(1 for r in {f.rank for f in layout.rank_files if f.rank is not None and f.rank < world}
                      if make(r) in names)
        layout.missing_count += world - present
        for r in range(world):
            if len(layout.missing) >= _LISTED_MISSING or len(layout.missing) >= layout.missing_count:
                break
            if make(r) not in names:
                layout.missing.append(make(r))
    for n in layout.missing:
        layout.problems.append(f"{layout.tag_dir / n}: missing (expected {world} ranks)")
    if layout.missing_count > len(layout.missing):
        layout.problems.append(f"{layout.tag_dir}: {layout.missing_count - len(layout.missing)} more rank files "
                               f"missing (expected {world} ranks)")
    extra = sorted(f.name for f in layout.rank_files if f.rank is not None and f.rank >= world)
    for n in extra[:_LISTED_MISSING]:
        layout.problems.append(f"{layout.tag_dir / n}: rank beyond the saved world size {world} "
                               "(left from another run?)")


def _record_damage(layout: CheckpointLayout) -> None:
    for f in layout.rank_files:
        if f.truncated:
            layout.problems.append(f"{f.path}: {f.truncated}")
    if not layout.rank_files:
        layout.problems.append(f"{layout.tag_dir}: no rank files")


def read_json(path: Path, confinement: Optional[Confinement] = None) -> Optional[dict]:
    """A JSON object from `path` (bounded, regular file, inside `confinement`), or None when it is
    absent, unreadable, too large or not an object."""
    try:
        return fsguard.read_json(path, confinement)
    except InputError:
        return None
