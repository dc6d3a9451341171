"""A fix applied to a launch on copies: the user's files are never edited.

The launch is read the way ``check`` reads it (:mod:`zeropilot.launch`: every value with its file, key path and text
span). A fix's ``change`` (:mod:`zeropilot.guard.whatif` names: ``micro_batch`` + ``grad_accum``,
``gradient_checkpointing``, ``stage``, ``offload_optimizer``, ``offload_param``, ``gather_16bit_on_save``,
``expandable_segments``, ``seq_len``) becomes settings of the launch's own keys:

- a value in a JSON or YAML file (a DeepSpeed config, LLaMA-Factory's YAML, a training-arguments JSON): the file is
  copied into the attempt's ``launch/`` folder and the copy edited with span edits (comments, order and layout
  kept: :mod:`zeropilot.fix.edits`); a key the file lacks is added to its mapping;
- a value given as a flag on the command line (``--per_device_train_batch_size 4``): the flag's value is replaced in
  the command, or the flag appended when absent;
- ``expandable_segments``: the launch's environment (``PYTORCH_CUDA_ALLOC_CONF``).

Every file that names a copied file (the command's ``--deepspeed ds.json``, a YAML's ``deepspeed:``) is pointed at
the copy, itself on a copy when it is a file. The result is the new command, the environment added and the diff of
every change, for ``heal.json`` and the report. A change whose value lives nowhere zeropilot can copy (hard-coded
in the script) is "cannot apply", with the key it looked for.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.fix.edits import apply_to_text, render_scalar, replace_value
from zeropilot.fix.model import Edit
from zeropilot.launch.document import Document, Node

ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


@dataclass
class Patch:
    """What a fix changed in a launch."""

    command: List[str]
    env: Dict[str, str]  # added to (or replacing in) the launch's environment
    files: List[Dict[str, str]] = field(default_factory=list)  # {original, copy}
    settings: List[str] = field(default_factory=list)  # "per_device_train_batch_size: 4 -> 2 (flag)"
    diff: str = ""
    texts: Dict[str, str] = field(default_factory=dict)  # copy path -> its text (written by :meth:`write`)

    def write(self) -> None:
        """Write the copies (atomically, readable by the user)."""
        from zeropilot.runlog.layout import write_text_atomic

        for path, text in self.texts.items():
            write_text_atomic(Path(path), text, mode=0o644)

    def to_dict(self) -> Dict[str, Any]:
        return {"command": list(self.command), "env": dict(self.env), "files": list(self.files),
                "settings": list(self.settings), "diff": self.diff}


@dataclass
class _Set:
    """One setting to make: a dotted key in documents of a kind, to a value."""

    kind: str  # ds_config | train_args
    key: str  # dotted
    value: Any
    only_if_present: bool = False  # set it only where the document already has the key (not "auto")


def settings_for(change: Dict[str, Any], flavour: Optional[str]) -> Tuple[List[_Set], Dict[str, str], Optional[str]]:
    """The settings that make a fix's ``change`` in a launch of this flavour (``hf``, ``llamafactory`` or None for
    a raw DeepSpeed launch), the environment to add, or why it cannot be made."""
    sets: List[_Set] = []
    env: Dict[str, str] = {}
    hf = flavour in ("hf", "llamafactory")
    for name, value in change.items():
        if name == "micro_batch":
            if hf:
                sets.append(_Set("train_args", "per_device_train_batch_size", value))
            sets.append(_Set("ds_config", "train_micro_batch_size_per_gpu", value, only_if_present=hf))
        elif name == "grad_accum":
            if hf:
                sets.append(_Set("train_args", "gradient_accumulation_steps", value))
            sets.append(_Set("ds_config", "gradient_accumulation_steps", value, only_if_present=hf))
        elif name == "gradient_checkpointing":
            if flavour == "llamafactory":
                sets.append(_Set("train_args", "disable_gradient_checkpointing", not value))
            elif flavour == "hf":
                sets.append(_Set("train_args", "gradient_checkpointing", bool(value)))
            else:
                return [], {}, "a raw DeepSpeed script turns gradient checkpointing on in its own code"
        elif name == "stage":
            sets.append(_Set("ds_config", "zero_optimization.stage", value))
        elif name in ("offload_optimizer", "offload_param"):
            sets.append(_Set("ds_config", f"zero_optimization.{name}", {"device": value}))
        elif name == "gather_16bit_on_save":
            sets.append(_Set("ds_config", "zero_optimization.stage3_gather_16bit_weights_on_model_save", bool(value)))
        elif name == "load_universal":  # a restart on fewer nodes (heal.shrink)
            sets.append(_Set("ds_config", "checkpoint.load_universal", bool(value)))
        elif name == "expandable_segments":
            env[ALLOC_ENV] = "expandable_segments:True"
        elif name == "seq_len":
            if flavour == "llamafactory":
                sets.append(_Set("train_args", "cutoff_len", value))
            else:
                sets.append(_Set("train_args", "max_length", value, only_if_present=True))
                sets.append(_Set("train_args", "max_seq_length", value, only_if_present=True))
        else:
            return [], {}, f"zeropilot does not make the change {name!r} to a launch"
    return sets, env, None


# -- edits on one document ----------------------------------------------------------------------------------------

def _json_insert(doc: Document, mapping: Node, key: str, value: Any) -> Optional[Edit]:
    """Add ``"key": value`` as the last member of a JSON object node."""
    if mapping.start is None or mapping.end is None:
        return None
    text = doc.text
    close = mapping.end - 1
    if text[close] != "}":
        return None
    body = text[mapping.start + 1:close]
    indent = "  "
    members = list(mapping.value.values()) if isinstance(mapping.value, dict) else []
    if members and members[-1].key_start is not None:
        line_start = text.rfind("\n", 0, members[-1].key_start) + 1
        indent = text[line_start:members[-1].key_start] if text[line_start:members[-1].key_start].strip() == "" \
            else " "
    rendered = json.dumps(value)
    if body.strip():
        last = close - 1
        while last > mapping.start and text[last] in " \t\r\n":
            last -= 1
        sep = "\n" if "\n" in body else " "
        return Edit(doc.path, last + 1, last + 1, f",{sep}{indent if sep == chr(10) else ''}{json.dumps(key)}: "
                                                  f"{rendered}")
    return Edit(doc.path, mapping.start + 1, close, f"{json.dumps(key)}: {rendered}")


def _yaml_insert(doc: Document, key: str, value: Any) -> Optional[Edit]:
    """Add ``key: value`` at the end of a YAML file's top-level mapping."""
    if "." in key:
        return None
    text = doc.text
    lead = "" if not text or text.endswith("\n") else "\n"
    scalar = render_scalar(doc, value) if not isinstance(value, dict) else json.dumps(value)
    return Edit(doc.path, len(text), len(text), f"{lead}{key}: {scalar}\n")


def _file_edit(doc: Document, s: _Set) -> Tuple[Optional[Edit], Optional[str]]:
    """(the edit, the old value as text) making ``s`` in a JSON/YAML document; (None, None) when not applicable."""
    node = doc.get(s.key)
    if node is not None:
        if s.only_if_present and (node.value == "auto" or node.value is None):
            return None, None
        if node.is_mapping or isinstance(s.value, dict):
            if doc.fmt != "json" or node.start is None:
                return None, None
            return Edit(doc.path, node.start, node.end, json.dumps(s.value)), doc.text[node.start:node.end]
        if node.value == s.value:
            return None, None
        return replace_value(doc, node, s.value), node.raw or repr(node.value)
    if s.only_if_present:
        return None, None
    parent_key, _, leaf = s.key.rpartition(".")
    if doc.fmt == "json":
        parent = doc.get(parent_key) if parent_key else doc.root
        if parent is None:  # the section is missing: add it whole
            if "." in parent_key:
                return None, None
            return _json_insert(doc, doc.root, parent_key, {leaf: s.value}), None
        return (_json_insert(doc, parent, leaf, s.value) if parent.is_mapping else None), None
    if doc.fmt == "yaml":
        return _yaml_insert(doc, s.key, s.value), None
    return None, None


# -- the command line ---------------------------------------------------------------------------------------------

def _flag_names(key: str) -> Tuple[str, str]:
    return f"--{key}", f"--{key.replace('_', '-')}"


def set_flag(command: List[str], start: int, key: str, value: Any) -> Tuple[List[str], Optional[str], bool]:
    """The command with the value of ``--key`` replaced among the program's arguments (from index ``start``):
    (command, old value or None when the flag is absent, changed). A flag the command lacks is never added: the
    script may not take it."""
    names = _flag_names(key)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    out = list(command)
    for i in range(start, len(out)):
        word = out[i]
        if word in names and i + 1 < len(out):
            old = out[i + 1]
            out[i + 1] = text
            return out, old, old != text
        name, eq, old = word.partition("=")
        if eq and name in names:
            out[i] = f"{name}={text}"
            return out, old, old != text
    return command, None, False


def _program_start(command: List[str], launch: Any) -> int:
    """Where the program's own arguments start in ``command`` (0 when the launch reader does not say)."""
    for cmd in getattr(launch, "commands", []) or []:
        program = getattr(cmd, "program", None)
        if program and program in command:
            return command.index(program) + 1
    return 0


def _same_file(word: str, path: Path, cwd: Path) -> bool:
    candidate = Path(word)
    if not candidate.is_absolute():
        candidate = cwd / candidate
    try:
        return os.path.exists(candidate) and os.path.samefile(candidate, path)
    except OSError:
        return False


def repoint(command: List[str], original: Path, copy: Path, cwd: Path) -> Tuple[List[str], bool]:
    """The command with every word naming ``original`` (``PATH`` or ``--flag=PATH``) naming ``copy``."""
    out, changed = [], False
    for word in command:
        name, eq, value = word.partition("=")
        if eq and name.startswith("-") and value and _same_file(value, original, cwd):
            out.append(f"{name}={copy}")
            changed = True
        elif _same_file(word, original, cwd):
            out.append(str(copy))
            changed = True
        else:
            out.append(word)
    return out, changed


# -- the whole launch ---------------------------------------------------------------------------------------------

class _Copies:
    """Edited texts of the launch's files, by original path; written into the attempt's launch folder at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.texts: Dict[Path, Tuple[str, str]] = {}  # original -> (old text, new text)
        self.names: Dict[Path, Path] = {}

    def edit(self, doc: Document, edits: List[Edit]) -> None:
        old, new = self.texts.get(doc.path, (doc.text, doc.text))
        new, _ = apply_to_text(new, edits)
        self.texts[doc.path] = (old, new)

    def copy_path(self, original: Path) -> Path:
        if original not in self.names:
            name = original.name
            taken = {p.name for p in self.names.values()}
            n = 2
            while name in taken:
                name = f"{n}-{original.name}"
                n += 1
            self.names[original] = self.folder / name
        return self.names[original]


def _flavour(launch: Any) -> Optional[str]:
    """``llamafactory``, ``hf`` (training arguments the HF Trainer reads) or None (a raw DeepSpeed launch: its
    flags are the script's own, its batch lives in the DeepSpeed config)."""
    docs = [d for d in launch.train_args if not launch.raw_deepspeed_flags(d)]
    if any(d.flavour == "llamafactory" for d in docs):
        return "llamafactory"
    return "hf" if any(d.flavour == "hf" for d in docs) else None


def apply(change: Dict[str, Any], command: List[str], env: Dict[str, str], launch: Any, folder: Path,
          cwd: Optional[Path] = None) -> Any:
    """Make ``change`` in the launch: a :class:`Patch`, or a string saying why it cannot be made.

    Args:
        change: the fix's ``change`` (whatif names).
        command: the command of the attempt that failed (it may already point at earlier copies).
        env: the environment that attempt added.
        launch: that command read by ``check`` (``zeropilot.launch.Launch``).
        folder: where the copies go (the next attempt's ``launch/`` folder); nothing is written here.
        cwd: the folder relative paths of the command are relative to.
    """
    cwd = Path(cwd or os.getcwd())
    flavour = _flavour(launch)
    sets, new_env, why = settings_for(change, flavour)
    if why:
        return why
    copies = _Copies(folder)
    docs = {"ds_config": ds_configs(launch, cwd), "train_args": list(launch.train_args)}
    out_cmd = list(command)
    words: List[str] = []
    start = _program_start(command, launch)
    for s in sets:
        made = _make(s, docs[s.kind], copies, out_cmd, start, words)
        if made is None:
            continue
        out_cmd = made
    missing = [s for s in sets if not s.only_if_present and not any(w.startswith(s.key.rsplit(".", 1)[-1] + ":")
                                                                    for w in words)]
    if missing:
        return f"{', '.join(s.key for s in missing)}: not in a file or flag of the launch (set in the script's code?)"
    if not copies.texts and out_cmd == command and not new_env:
        if any(w.endswith("(already)") for w in words):
            return "the launch already has this setting"
        return (f"{', '.join(dict.fromkeys(s.key for s in sets))}: not in a file or flag of the launch (set in the "
                "script's code?)")
    out_cmd, files = _write_plan(copies, docs["ds_config"] + docs["train_args"] + list(launch.accelerate_configs),
                                 out_cmd, cwd)
    merged_env = dict(env)
    for k, v in new_env.items():
        current = merged_env.get(k) or os.environ.get(k) or ""
        merged_env[k] = v if not current else f"{current},{v}" if v.split(":")[0] not in current else current
        words.append(f"{k}={merged_env[k]} (environment)")
    diff = "".join(_file_diff(Path(f["original"]), Path(f["copy"]), *copies.texts[Path(f["original"])]) for f in files)
    if out_cmd != command:
        diff += f"--- command\n+++ command\n-{shlex.join(command)}\n+{shlex.join(out_cmd)}\n"
    texts = {f["copy"]: copies.texts[Path(f["original"])][1] for f in files}
    return Patch(out_cmd, merged_env, files, words, diff, texts)


def ds_configs(launch: Any, cwd: Path) -> List[Document]:
    """The launch's DeepSpeed configs, and the one a raw script's ``--deepspeed_config`` names (the launch reader
    links that flag only as training arguments' ``deepspeed``), read by the same reader."""
    docs = list(launch.ds_configs)
    for doc in launch.train_args:
        node = doc.get("deepspeed_config") if doc.fmt == "flags" else None
        if node is None or not isinstance(node.value, str):
            continue
        path = Path(node.value) if Path(node.value).is_absolute() else cwd / node.value
        if path.is_file() and not any(_same_file(str(d.path), path, cwd) for d in docs):
            from zeropilot.launch.load import load_launch

            docs += load_launch([path], use_installed=False).ds_configs
    return docs


def _make(s: _Set, docs: List[Document], copies: _Copies, command: List[str], start: int, words: List[str]
          ) -> Optional[List[str]]:
    """Make one setting in every document of its kind (``docs``); the new command when a flag changed, else None."""
    new_cmd = None
    leaf = s.key.rsplit(".", 1)[-1]
    for doc in docs:
        if doc.fmt == "flags":
            cmd, old, changed = set_flag(new_cmd or command, start, s.key, s.value)
            if changed:
                new_cmd = cmd
                words.append(f"{leaf}: {old if old is not None else '(unset)'} -> {s.value} (flag)")
            elif old is not None:
                words.append(f"{leaf}: {old} (already)")
            continue
        edit, old = _file_edit(doc, s)
        if edit is not None:
            copies.edit(doc, [edit])
            words.append(f"{leaf}: {old if old is not None else '(unset)'} -> {json.dumps(s.value)} ({doc.path.name})")
        elif doc.get(s.key) is not None and doc.get(s.key).value == s.value:
            words.append(f"{leaf}: {s.value} (already)")
    return new_cmd


def _file_diff(original: Path, copy: Path, old: str, new: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), str(original),
                                        str(copy)))


def _write_plan(copies: _Copies, docs: List[Document], command: List[str], cwd: Path
                ) -> Tuple[List[str], List[Dict[str, str]]]:
    """Point the command and the other files at the copies (copying those files too); the copies' list."""
    pending = list(copies.texts)
    done = set()
    while pending:
        original = pending.pop()
        if original in done:
            continue
        done.add(original)
        copy = copies.copy_path(original)
        command, _ = repoint(command, original, copy, cwd)
        for doc in docs:
            if doc.fmt == "flags" or doc.path == original:
                continue
            edits = [replace_value(doc, n, str(copy)) for n in doc.root.walk()
                     if isinstance(n.value, str) and n.start is not None
                     and (_same_file(n.value, original, cwd) or _same_file(n.value, original, doc.path.parent))]
            edits = [e for e in edits if e is not None]
            if edits:
                copies.edit(doc, edits)
                if doc.path not in done:
                    pending.append(doc.path)
    files = [{"original": str(o), "copy": str(copies.copy_path(o))} for o in copies.texts]
    return command, files
