"""Reading a launch from paths: discover files, read each, link configs, work out the world size."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from zeropilot import safefile
from zeropilot.checkpoint.names import is_checkpoint_dir
from zeropilot.errors import InputError
from zeropilot.launch.classify import classify
from zeropilot.launch.commands import (VISIBLE_DEVICE_VARS, LaunchCommand, as_int, count_devices, interpret,
                                       parse_flag_args)
from zeropilot.launch.document import Document, LineIndex, Node, set_paths
from zeropilot.launch.jsonread import read_json
from zeropilot.launch.model import Launch, PythonFile, Reference, WorldSize
from zeropilot.launch.pyread import MAX_PYTHON_BYTES, parse_python
from zeropilot.launch.shell import parse_script
from zeropilot.launch.versions import resolve_versions

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_DISCOVERED = 2000
MAX_DEPTH = 4
_SKIP_DIRS = {".git", ".hg", "__pycache__", "node_modules", ".venv", "venv", "site-packages", "wandb",
              ".mypy_cache", ".pytest_cache", ".tox", "runs", "logs"}
_CONFIG_SUFFIXES = {".json", ".yaml", ".yml", ".conf"}
_SCRIPT_SUFFIXES = {".sh", ".bash", ".sbatch", ".slurm"}
_REQ_NAME = re.compile(r"^(requirements.*|.*freeze.*|constraints.*)\.txt$", re.I)
# Files a model, tokenizer, checkpoint or dataset folder holds beside a launch: never a launch, and some are
# large (a 150k-token tokenizer.json is 7-11 MB). Discovery skips them by name, without reading them.
_NOT_LAUNCH = {
    "tokenizer.json": "a tokenizer", "tokenizer_config.json": "a tokenizer config",
    "special_tokens_map.json": "a tokenizer file", "added_tokens.json": "a tokenizer file",
    "vocab.json": "a tokenizer vocabulary", "chat_template.json": "a chat template",
    "generation_config.json": "a generation config", "preprocessor_config.json": "a processor config",
    "processor_config.json": "a processor config", "adapter_config.json": "a PEFT adapter config",
    "trainer_state.json": "a Trainer checkpoint state", "dataset_info.json": "a dataset registry",
    "dataset_dict.json": "a dataset", "dataset_infos.json": "a dataset card", "state.json": "a dataset state",
}
_NOT_LAUNCH_SUFFIX = (".safetensors.index.json", ".bin.index.json", ".index.json")
#: a config that is empty, only comments, ``---`` or ``null``: ``yaml.safe_load`` and ``json.load`` give None, on
#: which accelerate's config loader and HfArgumentParser fail (witness: tests/launch/test_empty_configs.py)
NO_SETTINGS = ("no settings in the file (it is empty, or only comments, '---' or null): accelerate and the HF "
               "Trainer fail on it; write the launch's settings in it or leave it out")
# A model's config.json says what the model is; a launch config never has these at its top level.
_MODEL_CONFIG_KEYS = ("model_type", "architectures")


def load_launch(
    paths: Sequence[os.PathLike],
    versions: Optional[str] = None,
    world_size: Optional[int] = None,
    use_installed: bool = True,
) -> Launch:
    """Read a launch from files and directories.

    Args:
        paths: files, or directories in which to discover the launch (configs, scripts, requirements).
        versions: ``--versions`` overrides, ``NAME=VER[,NAME=VER...]``.
        world_size: ``--world-size``; overrides what the launch says.
        use_installed: read installed package versions (tests turn this off for fixtures).

    Returns:
        The Launch. Files that cannot be read are in ``launch.read_errors``; nothing is raised for them.

    Raises:
        InputError: when a path does not exist or ``versions`` is malformed.
    """
    launch = Launch()
    files: List[Tuple[Path, bool]] = []  # (file, found by discovery rather than named)
    for raw in paths:
        path = Path(raw)
        try:
            st = path.stat()
        except RuntimeError:
            raise InputError("symbolic link loop", path) from None
        except FileNotFoundError:
            raise InputError("no such file or directory", path) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", path) from None
        if stat.S_ISDIR(st.st_mode):
            files.extend((found, True) for found in _discover(path, launch))
        else:
            files.append((path, False))
    seen = set()
    requirement_files = []
    for path, discovered in files:
        key = _key(path)
        if key in seen:
            continue
        seen.add(key)
        if _REQ_NAME.match(path.name):
            try:
                read_text(path)  # the same limits as every other file (size, binary, UTF-8)
            except InputError as exc:
                launch.read_errors.append(exc)
                continue
            requirement_files.append(path)
            continue
        _read_into(launch, path, discovered)
    launch.versions = resolve_versions(versions, requirement_files, use_installed=use_installed)
    _follow_references(launch, seen)
    _refuse_relaxed_json(launch)
    launch.world_size = _world_size(launch, world_size)
    return launch


def _refuse_relaxed_json(launch: Launch) -> None:
    """Comments and trailing commas where the file's reader is ``json.load``: an input error.

    DeepSpeed reads its config with ``hjson.load`` (``deepspeed/runtime/config.py``), which accepts them; the
    HF integration and accelerate read the same file with ``json.load`` (``HfDeepSpeedConfig``), and
    ``HfArgumentParser.parse_json_file`` reads training arguments with ``json.loads``: both refuse them.
    """
    linked = {id(d) for d in launch.links.values()}
    for doc in list(launch.documents):
        if not doc.relaxed:
            continue
        if doc.kind == "ds_config" and id(doc) in linked:
            reader = "the HF Trainer and accelerate read it with json.load (HfDeepSpeedConfig)"
        elif doc.kind == "train_args":
            reader = "transformers reads training arguments with json.loads (HfArgumentParser.parse_json_file)"
        else:
            continue
        line, what = doc.relaxed[0]
        launch.read_errors.append(InputError(
            f"a {what}: DeepSpeed's own loader (hjson) accepts it, but {reader}, which refuses it; remove it",
            doc.path, line))


def _key(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):
        return str(path.absolute())


def _discover(root: Path, launch: Launch) -> List[Path]:
    found: List[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=lambda e: launch.read_errors.append(
            InputError(f"cannot read directory: {e.strerror}", e.filename))):
        depth = len(Path(dirpath).relative_to(root).parts)
        kept = []
        for d in sorted(dirnames):
            if d in _SKIP_DIRS or d.startswith("."):
                continue
            if is_checkpoint_dir(d):
                launch.checkpoint_dirs.append(Path(dirpath) / d)
                continue
            kept.append(d)
        dirnames[:] = kept if depth < MAX_DEPTH else []
        for name in sorted(filenames):
            suffix = Path(name).suffix.lower()
            if suffix in _CONFIG_SUFFIXES | _SCRIPT_SUFFIXES | {".py"} or _REQ_NAME.match(name):
                path = Path(dirpath) / name
                if path.is_symlink() and not path.exists():
                    continue
                why = _not_a_launch(path)
                if why:
                    launch.skipped.append((path, why))
                    continue
                found.append(path)
        if len(found) > MAX_DISCOVERED:
            raise InputError(f"more than {MAX_DISCOVERED} candidate files: point check at the launch's "
                             "folder or files", root)
    return found


def _not_a_launch(path: Path) -> Optional[str]:
    """Why a discovered file is not read (None: read it), from its name and size only."""
    name = path.name.lower()
    if name in _NOT_LAUNCH:
        return _NOT_LAUNCH[name]
    if name.endswith(_NOT_LAUNCH_SUFFIX):
        return "a weights index"
    try:
        size = path.stat().st_size
    except OSError:
        return None  # reading it reports why
    if size > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: not a launch file"
    if path.suffix == ".py" and size > MAX_PYTHON_BYTES:
        return f"a Python file larger than {MAX_PYTHON_BYTES // 1024} KiB: not a training script zeropilot reads"
    return None


def read_text(path: Path) -> str:
    """A file's text, refusing what is not a small UTF-8 text file (through :mod:`zeropilot.safefile`).

    Raises:
        InputError: missing, unreadable, not a regular file (a FIFO, device, socket, directory), too large,
            binary, or not UTF-8.
    """
    return safefile.read_text(path, MAX_FILE_BYTES,
                              too_large=f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: not a launch config")


def _read_into(launch: Launch, path: Path, discovered: bool = False) -> Optional[Document]:
    """Read one file into the launch; an unreadable file goes to ``read_errors``. A file found by discovery
    that turns out to be a dataset or a model config goes to ``skipped``."""
    try:
        return _read_file(launch, path, discovered)
    except InputError as exc:
        launch.read_errors.append(exc)
        return None


def _read_file(launch: Launch, path: Path, discovered: bool = False) -> Optional[Document]:
    text = read_text(path)
    suffix = path.suffix.lower()
    if suffix in _SCRIPT_SUFFIXES or (not suffix and text.startswith("#!") and "sh" in text.split("\n", 1)[0]):
        launch.scripts.append(parse_script(text, path))
        return None
    if suffix == ".py":
        tree, error = parse_python(text, path)
        launch.python_files.append(PythonFile(path, text, tree, error))
        return None
    if suffix in (".json", ".conf") or (not suffix and text.lstrip().startswith("{")):
        if discovered and text.lstrip().startswith("["):
            launch.skipped.append((path, "a JSON list (a dataset), not a launch config"))
            return None
        try:
            read = read_json(text, path)
        except InputError as exc:
            if discovered and exc.line == 2 and exc.col == 1 and "extra text" in exc.reason:
                launch.skipped.append((path, "JSON Lines (a dataset), not a launch config"))
                return None
            raise
        root, fmt, relaxed = read.root, "json", read.relaxed
    else:
        from zeropilot.launch.yamlread import parse_yaml  # PyYAML's import is a third of check's start-up

        root, fmt, relaxed = parse_yaml(text, path) if text.strip() else None, "yaml", []
    if root is None or root.value is None:  # whitespace (PyYAML refuses a tab there) or what safe_load reads as None
        raise InputError(NO_SETTINGS, path)
    keys = root.value.keys() if isinstance(root.value, dict) else ()
    scalars = [k for k, v in root.value.items() if not isinstance(v.value, dict)] if keys else []
    kind, flavour = classify(keys, fmt, scalars)
    if not isinstance(root.value, dict):
        kind = "other"
    if discovered and kind == "other" and any(k in keys for k in _MODEL_CONFIG_KEYS):
        launch.skipped.append((path, "a model config"))
        return None
    doc = Document(path, kind, fmt, root, text, flavour, relaxed)
    launch.documents.append(doc)
    return doc


def _find_document(launch: Launch, path: Path) -> Optional[Document]:
    key = _key(path)
    for doc in launch.documents:
        if _key(doc.path) == key:
            return doc
    return None


def _resolve(target: str, bases: Iterable[Path]) -> Optional[Path]:
    candidate = Path(os.path.expanduser(target))
    if candidate.is_absolute():
        return candidate if candidate.is_file() else None
    for base in bases:
        path = base / candidate
        if path.is_file():
            return path
    return None


def _bases(source: Path) -> List[Path]:
    parent = source.parent
    out = [parent, Path.cwd()]
    out.extend(parent.parents)
    return out


def _load_reference(launch: Launch, seen: set, ref: Reference) -> Optional[Document]:
    launch.references.append(ref)
    if ref.resolved is None:
        return None
    doc = _find_document(launch, ref.resolved)
    if doc is None and _key(ref.resolved) not in seen:
        seen.add(_key(ref.resolved))
        doc = _read_into(launch, ref.resolved)
    return doc


def _by_basename(launch: Launch, target: str) -> Optional[Document]:
    name = Path(target).name
    matches = [d for d in launch.ds_configs if d.path.name == name]
    return matches[0] if len(matches) == 1 else None


def _follow_references(launch: Launch, seen: set) -> None:
    for script in list(launch.scripts):
        for command in script.commands:
            lc = interpret(command)
            if lc is None:
                continue
            launch.commands.append(lc)
            _command_references(launch, seen, lc)
    for doc in list(launch.documents):
        _document_references(launch, seen, doc)


def _command_references(launch: Launch, seen: set, lc: LaunchCommand) -> None:
    cmd = lc.command
    bases = _bases(cmd.file)
    if lc.config_file:
        target = lc.config_file
        _load_reference(launch, seen, Reference(cmd.file, cmd.line, lc.launcher, target, _resolve(target, bases)))
    if lc.program and lc.program.endswith(".py"):
        resolved = _resolve(lc.program, bases)
        if resolved is not None and _key(resolved) not in seen:
            seen.add(_key(resolved))
            _read_into(launch, resolved)
    flags = parse_flag_args(lc.program_args)
    if lc.launcher != "llamafactory" and any(k == "deepspeed" or k == "deepspeed_config" for k, _, _ in flags):
        doc = _flags_document(launch, lc, flags)
        launch.documents.append(doc)
    elif lc.launcher == "llamafactory" and flags:
        doc = _flags_document(launch, lc, flags)
        doc.flavour = "llamafactory"
        launch.documents.append(doc)


def _flags_document(launch: Launch, lc: LaunchCommand, flags) -> Document:
    """Training arguments given as ``--key value`` on a command line, as a document of the script."""
    cmd = lc.command
    text = next((s.text for s in launch.scripts if s.path == cmd.file), "")
    lines = LineIndex(text) if text else None
    members = {}
    for key, value, index in flags:
        argv_index = lc.program_args_index + index
        offset = cmd.offsets[argv_index] if argv_index < len(cmd.offsets) else None
        line = lines.line(offset) if offset is not None and lines else cmd.line
        members[key] = Node(_flag_value(value), line=line, col=None, raw=value)
    root = Node(members, line=cmd.line)
    set_paths(root)
    return Document(cmd.file, "train_args", "flags", root, "", "hf")


def _flag_value(value: Optional[str]):
    if value is None:
        return True
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _document_references(launch: Launch, seen: set, doc: Document) -> None:
    if doc.kind == "train_args":
        key = "deepspeed"
        node = doc.get("deepspeed")
    elif doc.kind == "accelerate":
        key = "deepspeed_config.deepspeed_config_file"
        node = doc.get(key)
    else:
        return
    if node is None or not isinstance(node.value, str) or not node.value.strip():
        return
    target = node.value.strip()
    ref = Reference(doc.path, node.line, key, target, _resolve(target, _bases(doc.path)), node)
    linked = _load_reference(launch, seen, ref)
    if linked is None and ref.resolved is None:
        linked = _by_basename(launch, target)
    if linked is not None and linked.kind in ("ds_config", "other"):
        launch.links[id(doc)] = linked


def _visible_devices(launch: Launch):
    env = launch.env()
    for name in VISIBLE_DEVICE_VARS:
        if name in env:
            return env[name], count_devices(env[name].value)
    return None, None


def _world_size(launch: Launch, override: Optional[int]) -> WorldSize:
    var, visible = _visible_devices(launch)
    if override is not None:
        return WorldSize(override, "--world-size", visible_devices=visible, visible_var=var)
    env = launch.env()
    for lc in launch.commands:
        cmd = lc.command
        nnodes = as_int(lc.nnodes) or 1
        nproc = as_int(lc.nproc)
        reason = f"{lc.launcher} command"
        if lc.launcher == "deepspeed" and nproc is None and lc.include:
            hosts = lc.include.split("@")
            nproc = sum(len(h.split(":", 1)[1].split(",")) for h in hosts if ":" in h) or None
        if lc.launcher == "llamafactory":
            run_env = {**{k: v.value for k, v in env.items()}, **{k: v.value for k, v in cmd.env.items()}}
            nproc = as_int(run_env.get("NPROC_PER_NODE"))
            nnodes = as_int(run_env.get("NNODES")) or 1
            reason = "NPROC_PER_NODE" if nproc else reason
        if lc.launcher == "accelerate" and nproc is None:
            nproc = _accelerate_processes(launch, lc)
            if nproc is not None:
                return WorldSize(nproc, "accelerate config num_processes", cmd.file, cmd.line,
                                 nproc, None, visible, var)
        if nproc is None and lc.launcher in ("deepspeed", "llamafactory", "torchrun") and visible:
            nproc = visible
            reason = f"{lc.launcher} uses every visible device ({var.name})"
        if lc.launcher == "python":
            nproc, reason = 1, "plain python command"
        spread = _multinode_world(launch, lc)
        if spread is not None:
            return WorldSize(spread[0], spread[1], cmd.file, cmd.line, spread[2], spread[3], visible, var)
        if nproc is not None:
            return WorldSize(nproc * nnodes, reason, cmd.file, cmd.line, nproc, nnodes, visible, var)
    for doc in launch.accelerate_configs:
        n = as_int(doc.value("num_processes"))
        if n:
            return WorldSize(n, "accelerate config num_processes", doc.path, doc.get("num_processes").line,
                             n, as_int(doc.value("num_machines")) or 1, visible, var)
    return WorldSize(None, "no launcher found that says how many processes", visible_devices=visible,
                     visible_var=var)


def _multinode_world(launch: Launch, lc: LaunchCommand) -> Optional[Tuple[int, str, Optional[int], int]]:
    """(world, reason, per node, nodes) where the node settings decide it: ``srun python train.py`` (one rank
    per Slurm task) and ``deepspeed --hostfile`` (the active hosts' slots, :mod:`zeropilot.launch.multinode`)."""
    from zeropilot.launch.multinode import hostfile_slots, node_facts, srun_world

    nl = next((n for n in node_facts(launch).commands if n.command is lc), None)
    if nl is None:
        return None
    if lc.launcher == "python" and lc.wrapper == "srun":
        found = srun_world(nl)
        if found is not None:
            nodes = nl.scheduler_nodes.value if nl.scheduler_nodes is not None else 1
            per = nl.tasks_per_node.value if nl.tasks_per_node is not None else None
            return found[0], f"srun: one rank per task ({found[1]})", per, nodes
    if lc.launcher == "deepspeed" and nl.hostfile is not None and not nl.hostfile.error:
        slots = hostfile_slots(nl)
        if slots:
            return slots, f"deepspeed --hostfile: slots of {nl.nnodes.value} host(s)", None, nl.nnodes.value
    return None


def _accelerate_processes(launch: Launch, lc: LaunchCommand) -> Optional[int]:
    for doc in launch.accelerate_configs:
        if lc.config_file is None or doc.path.name == Path(lc.config_file).name:
            return as_int(doc.value("num_processes"))
    return None
