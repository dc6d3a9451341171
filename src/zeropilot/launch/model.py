"""The typed result of reading a launch: every document, script, variable and the world size."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.launch.commands import LaunchCommand
from zeropilot.launch.document import Document, Node
from zeropilot.launch.shell import EnvSetting, Script
from zeropilot.launch.versions import Versions

if TYPE_CHECKING:  # only for the annotation: check does not import it unless the CLI reads the machine
    from zeropilot.launch.machine import MachineState


@dataclass
class PythonFile:
    """A Python training script given to check: parsed, never run."""

    path: Path
    text: str
    _tree: Optional[object] = None
    error: Optional[str] = None

    @property
    def tree(self):
        """The module's ``ast`` (None with ``error`` set when it does not parse).

        ``load_launch`` parses every script it reads (:func:`zeropilot.launch.pyread.parse_python`), so a
        script too large or deep to read is an input error there, not an exception here.
        """
        if self._tree is None and self.error is None:
            from zeropilot.launch.pyread import parse_python

            try:
                self._tree, self.error = parse_python(self.text, self.path)
            except InputError as exc:
                self.error = exc.reason
        return self._tree


@dataclass
class WorldSize:
    """How many training processes the launch starts, and how that was worked out."""

    value: Optional[int]
    reason: str
    file: Optional[Path] = None
    line: Optional[int] = None
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    visible_devices: Optional[int] = None
    visible_var: Optional[EnvSetting] = None


@dataclass
class Reference:
    """A file one document or command names: a training YAML's ``deepspeed:``, a script's config path."""

    source: Path
    line: Optional[int]
    key: str
    target: str
    resolved: Optional[Path]
    node: Optional[Node] = None


@dataclass
class Launch:
    """Everything read for one ``zeropilot check``.

    Attributes:
        documents: every configuration file read (DeepSpeed JSON, training args, accelerate YAML, and flags
            on a launch command as a document of format ``flags``).
        scripts: shell scripts.
        python_files: Python training scripts.
        commands: launch commands found in the scripts.
        versions: the versions every verdict assumes.
        world_size: the number of processes, with the reason.
        references: config files named by other files; ``resolved`` is None when not found.
        read_errors: files that could not be read (each is reported, and check exits 2).
        links: training-args or accelerate document -> the DeepSpeed config it uses.
        checkpoint_dirs: ``checkpoint-N`` / ``global_stepN`` folders seen while discovering.
        gpus: ``--gpus COUNTxMEM`` given to check, for the memory rules.
        machine: this machine's op-build locks (:mod:`zeropilot.launch.machine`), None when not inspected.
        oracle: what the installed libraries said (``zeropilot.oracle.OracleReport``), None when not asked.
    """

    documents: List[Document] = field(default_factory=list)
    scripts: List[Script] = field(default_factory=list)
    python_files: List[PythonFile] = field(default_factory=list)
    commands: List[LaunchCommand] = field(default_factory=list)
    versions: Versions = field(default_factory=Versions)
    world_size: WorldSize = field(default_factory=lambda: WorldSize(None, "no launcher found"))
    references: List[Reference] = field(default_factory=list)
    read_errors: List[InputError] = field(default_factory=list)
    links: Dict[int, Document] = field(default_factory=dict)
    checkpoint_dirs: List[Path] = field(default_factory=list)
    gpus: Optional[str] = None
    skipped: List[Tuple[Path, str]] = field(default_factory=list)
    hub: Optional[object] = None
    machine: Optional[MachineState] = None
    oracle: Optional[object] = None

    def of_kind(self, kind: str) -> List[Document]:
        return [d for d in self.documents if d.kind == kind]

    @property
    def ds_configs(self) -> List[Document]:
        return self.of_kind("ds_config")

    @property
    def train_args(self) -> List[Document]:
        return self.of_kind("train_args")

    @property
    def accelerate_configs(self) -> List[Document]:
        return self.of_kind("accelerate")

    def ds_config_for(self, doc: Document) -> Optional[Document]:
        """The DeepSpeed config a training-args or accelerate document uses, if it was found."""
        return self.links.get(id(doc))

    def training_pairs(self) -> List[Tuple[Document, Document]]:
        """(training arguments, DeepSpeed config) for each training-args document that names one.

        Flags of a raw DeepSpeed script (``deepspeed train.py --deepspeed_config ds.json`` running a script that
        calls ``deepspeed.initialize`` itself) are not training arguments: they are left out.
        """
        out = []
        for doc in self.train_args:
            ds = self.ds_config_for(doc)
            if ds is not None and not self.raw_deepspeed_flags(doc):
                out.append((doc, ds))
        return out

    def raw_deepspeed_flags(self, doc: Document) -> bool:
        """Whether a flags document is the command line of a script that calls ``deepspeed.initialize`` itself
        (no HF Trainer, no accelerate): DeepSpeed reads ``--deepspeed_config``, nothing fills ``"auto"``."""
        if doc.fmt != "flags":
            return False
        programs = {Path(lc.program).name for lc in self.commands
                    if lc.program and lc.command.file == doc.path}
        for py in self.python_files:
            if py.path.name in programs:
                return _raw_deepspeed_script(py.text)
        return False

    def hf_linked_configs(self) -> List[Document]:
        """DeepSpeed configs that the HF Trainer or accelerate read (named by their arguments or configs)."""
        out: List[Document] = []
        for doc in self.documents:
            ds = self.links.get(id(doc))
            if ds is not None and not self.raw_deepspeed_flags(doc) and all(ds is not d for d in out):
                out.append(ds)
        return out

    def uses_hf_integration(self, ds: Document) -> Optional[bool]:
        """Whether a DeepSpeed config is consumed by the HF Trainer or accelerate (which fill ``"auto"``).

        True when training arguments or an accelerate config name it; False when only a raw
        ``deepspeed.initialize`` script is known; None when nothing says.
        """
        if any(linked is ds for linked in self.hf_linked_configs()):
            return True
        if any(not self.raw_deepspeed_flags(d) for d in self.train_args) or self.accelerate_configs:
            return True
        for py in self.python_files:
            if _raw_deepspeed_script(py.text):
                return False
        return None

    def facts(self):
        """The launch facts (:func:`zeropilot.launch.facts.facts`), derived once."""
        from zeropilot.launch.facts import facts

        return facts(self)

    def env(self) -> Dict[str, EnvSetting]:
        """Environment variables the scripts export (the last setting of each)."""
        out: Dict[str, EnvSetting] = {}
        for script in self.scripts:
            out.update(script.exported())
        return out


def _raw_deepspeed_script(text: str) -> bool:
    return "deepspeed.initialize" in text and "Trainer" not in text and "accelerate" not in text
