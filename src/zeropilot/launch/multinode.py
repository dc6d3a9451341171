"""The multi-node settings of a launch, derived once: how many nodes, which one this is, where the master is.

Read from the launch the way each launcher reads it (no torch, no network):

- ``torchrun``: ``--nnodes`` (``N`` or ``MIN:MAX``), ``--node_rank``, ``--master_addr``/``--master_port``,
  ``--rdzv_backend``/``--rdzv_endpoint``, ``--standalone`` (a c10d rendezvous on ``localhost``: one node only);
- ``deepspeed``: ``--hostfile`` (DeepSpeed's format: ``host slots=N``; its ``_parse_hostfile`` refuses anything
  else), ``--num_nodes``, ``--include``/``--exclude``, ``--master_addr``, ``--no_ssh`` with ``--node_rank``;
- ``accelerate launch``: ``--num_machines``/``--machine_rank``/``--main_process_ip``/``--main_process_port``,
  else the same keys of its config YAML;
- ``llamafactory-cli train`` under ``FORCE_TORCHRUN``: ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``,
  ``MASTER_PORT`` (LLaMA-Factory's launcher defaults them to 1, 0, ``127.0.0.1`` and a random free port);
- Slurm: ``#SBATCH`` directives of the script and the flags of ``srun`` before the launcher (``--nodes``/``-N``,
  ``--ntasks``/``-n``, ``--ntasks-per-node``, ``--gpus-per-node``).

API::

    from zeropilot.launch.multinode import node_facts
    nf = node_facts(launch)          # NodeFacts, cached on the launch
    for nl in nf.commands:           # NodeLaunch per launch command
        nl.nnodes.value, nl.nnodes.source    # e.g. 2, "torchrun --nnodes"
    nf.spans_nodes                   # any command runs on more than one node
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.launch.commands import LaunchCommand, as_int
from zeropilot.launch.shell import EnvSetting

#: addresses that reach only the machine they are used on
LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "ip6-localhost")
MAX_HOSTFILE_BYTES = 1 << 20
_SBATCH = re.compile(r"^#SBATCH\s+(.*)$")
_SBATCH_SHORT = {"N": "nodes", "n": "ntasks", "G": "gpus", "c": "cpus_per_task"}


@dataclass(frozen=True)
class Setting:
    """One value and where it was read: ``source`` names the flag, key or variable (``torchrun --nnodes``)."""

    value: Any
    source: str
    file: Optional[Path] = None
    line: Optional[int] = None


@dataclass
class Hostfile:
    """A DeepSpeed hostfile: ``hosts`` [(name, slots, line)], or ``error`` when DeepSpeed would refuse it or it
    cannot be read (``missing``: DeepSpeed warns and trains on the local machine only)."""

    path: Path
    hosts: List[Tuple[str, int, int]] = field(default_factory=list)
    error: Optional[str] = None
    missing: bool = False


@dataclass
class NodeLaunch:
    """The multi-node settings of one launch command (None where the launch does not say)."""

    command: LaunchCommand
    launcher: str
    nnodes: Optional[Setting] = None  # the node count the launcher runs with
    node_rank: Optional[Setting] = None
    nproc_per_node: Optional[Setting] = None
    master_addr: Optional[Setting] = None
    master_port: Optional[Setting] = None
    rdzv_backend: Optional[Setting] = None
    rdzv_endpoint: Optional[Setting] = None
    standalone: Optional[Setting] = None
    hostfile: Optional[Hostfile] = None
    include: Optional[Setting] = None
    exclude: Optional[Setting] = None
    num_nodes: Optional[Setting] = None  # deepspeed --num_nodes (a cap on the hostfile's hosts)
    scheduler_nodes: Optional[Setting] = None  # srun -N / #SBATCH --nodes: how many nodes the job holds
    tasks_per_node: Optional[Setting] = None  # srun / #SBATCH --ntasks-per-node
    ntasks: Optional[Setting] = None
    gpus_per_node: Optional[Setting] = None

    @property
    def file(self) -> Path:
        return self.command.command.file

    @property
    def line(self) -> int:
        return self.command.command.line

    @property
    def node_count(self) -> Optional[int]:
        """How many nodes this command's job spans, by the best source it has."""
        for s in (self.nnodes, self.scheduler_nodes):
            if s is not None and isinstance(s.value, int):
                return s.value
        return None

    @property
    def master(self) -> Optional[Setting]:
        """Where the ranks of every node connect: the rendezvous endpoint, else the master address."""
        if self.rdzv_endpoint is not None and (self.rdzv_backend is None or self.rdzv_backend.value != "static"):
            return self.rdzv_endpoint
        return self.master_addr


@dataclass
class NodeFacts:
    """The launch's multi-node settings: per command, and the variables every node needs alike."""

    commands: List[NodeLaunch] = field(default_factory=list)
    sbatch: Dict[str, Setting] = field(default_factory=dict)
    env: Dict[str, EnvSetting] = field(default_factory=dict)

    @property
    def spans_nodes(self) -> bool:
        return any((nl.node_count or 1) > 1 for nl in self.commands)

    def setting(self, name: str) -> Optional[EnvSetting]:
        return self.env.get(name)


def sbatch_directives(text: str, path: Path) -> Dict[str, Setting]:
    """``#SBATCH`` options of a batch script (only those before its first command, as sbatch reads them),
    long names with ``_`` (``ntasks_per_node``); short ones spelled long (``-N`` is ``nodes``)."""
    out: Dict[str, Setting] = {}
    for lineno, raw in enumerate(text.splitlines()[:2000], 1):
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("#SBATCH")):
            continue
        m = _SBATCH.match(line)
        if m is None:
            break  # sbatch stops reading directives at the first command
        words = m.group(1).split("#", 1)[0].split()
        i = 0
        while i < len(words):
            word = words[i]
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
                key = name.replace("-", "_")
            elif word.startswith("-") and len(word) >= 2:
                key, value = _SBATCH_SHORT.get(word[1], word[1]), word[2:]
                if not value and i + 1 < len(words) and not words[i + 1].startswith("-"):
                    value, i = words[i + 1], i + 1
            else:
                i += 1
                continue
            out[key] = Setting(value or None, f"#SBATCH --{key.replace('_', '-')}", path, lineno)
            i += 1
    return out


def _count(value: Any) -> Optional[int]:
    """A node or task count: ``2``, ``2-4`` (Slurm's min-max: the minimum it may start with) or ``2:4``."""
    if value is None:
        return None
    text = str(value).strip()
    m = re.match(r"^(\d{1,6})(?:[-:](\d{1,6}))?$", text)
    return int(m.group(1)) if m else None


def read_hostfile(path: Path) -> Hostfile:
    """A DeepSpeed hostfile, read as ``deepspeed/launcher/runner.py`` ``_parse_hostfile`` reads it (bounded;
    only a regular file is opened: a FIFO would block)."""
    hf = Hostfile(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        hf.missing, hf.error = True, "no such file: DeepSpeed warns and trains on this machine only"
        return hf
    if not stat.S_ISREG(mode):
        hf.error = "not a regular file"
        return hf
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_HOSTFILE_BYTES + 1)
    except OSError as exc:
        hf.error = f"cannot read: {exc.strerror or exc}"
        return hf
    if len(data) > MAX_HOSTFILE_BYTES:
        hf.error = "larger than 1 MiB: not a hostfile"
        return hf
    seen = set()
    for lineno, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.search(r"^(\S+)\s+slots=(\d+)", line)
        if m is None:
            hf.error = f"line {lineno}: {line[:80]!r} is not 'HOST slots=N': DeepSpeed refuses the hostfile"
            return hf
        if m.group(1) in seen:
            hf.error = f"line {lineno}: {m.group(1)} listed twice: DeepSpeed refuses the hostfile"
            return hf
        seen.add(m.group(1))
        hf.hosts.append((m.group(1), int(m.group(2)), lineno))
    if not hf.hosts:
        hf.error = "no host in it: DeepSpeed refuses the hostfile"
    return hf


def _flag(lc: LaunchCommand, label: str, *names: str) -> Optional[Setting]:
    for name in names:
        if name in lc.flags:
            value, _ = lc.flags[name]
            return Setting(value if value is not None else True, f"{label} --{name}", lc.command.file, lc.command.line)
    return None


def _env(lc: LaunchCommand, env: Dict[str, EnvSetting], name: str) -> Optional[Setting]:
    setting = lc.command.env.get(name) or env.get(name)
    if setting is None:
        return None
    return Setting(setting.value, name, setting.file, setting.line)


def _int_setting(s: Optional[Setting]) -> Optional[Setting]:
    if s is None:
        return None
    n = _count(s.value)
    return Setting(n, s.source, s.file, s.line) if n is not None else None


def _resolve(target: str, base: Path) -> Path:
    p = Path(os.path.expanduser(target))
    if p.is_absolute():
        return p
    for candidate in (base.parent / p, Path.cwd() / p):
        if candidate.exists():
            return candidate
    return base.parent / p


def _torchrun(nl: NodeLaunch, lc: LaunchCommand) -> None:
    nl.nnodes = _int_setting(_flag(lc, "torchrun", "nnodes"))
    nl.node_rank = _int_setting(_flag(lc, "torchrun", "node_rank"))
    nl.nproc_per_node = _flag(lc, "torchrun", "nproc_per_node")
    nl.master_addr = _flag(lc, "torchrun", "master_addr")
    nl.master_port = _int_setting(_flag(lc, "torchrun", "master_port"))
    nl.rdzv_backend = _flag(lc, "torchrun", "rdzv_backend")
    nl.rdzv_endpoint = _flag(lc, "torchrun", "rdzv_endpoint")
    nl.standalone = _flag(lc, "torchrun", "standalone")


def _deepspeed(nl: NodeLaunch, lc: LaunchCommand) -> None:
    hostfile = _flag(lc, "deepspeed", "hostfile", "H")
    nl.num_nodes = _int_setting(_flag(lc, "deepspeed", "num_nodes"))
    nl.include = _flag(lc, "deepspeed", "include", "i")
    nl.exclude = _flag(lc, "deepspeed", "exclude", "e")
    nl.master_addr = _flag(lc, "deepspeed", "master_addr")
    nl.master_port = _int_setting(_flag(lc, "deepspeed", "master_port"))
    nl.node_rank = _int_setting(_flag(lc, "deepspeed", "node_rank"))
    nl.nproc_per_node = _flag(lc, "deepspeed", "num_gpus", "num_accelerators")
    if hostfile is not None and isinstance(hostfile.value, str):
        nl.hostfile = read_hostfile(_resolve(hostfile.value, lc.command.file))
        hosts = _active_hosts(nl)
        if hosts is not None:
            nl.nnodes = Setting(len(hosts), "hosts of the hostfile" + (" (after --include/--exclude/--num_nodes)"
                                                                       if nl.include or nl.exclude or nl.num_nodes
                                                                       else ""), nl.hostfile.path, None)
    elif nl.num_nodes is not None:
        nl.nnodes = nl.num_nodes


def _active_hosts(nl: NodeLaunch) -> Optional[List[str]]:
    """The hosts DeepSpeed's runner will start ranks on: the hostfile's, filtered by ``--include``/``--exclude``
    (host names only), then the first ``--num_nodes`` (``apply_num_nodes_and_gpus``)."""
    if nl.hostfile is None or nl.hostfile.error:
        return None
    hosts = [h for h, _, _ in nl.hostfile.hosts]
    if nl.include is not None and isinstance(nl.include.value, str):
        named = [spec.split(":", 1)[0] for spec in nl.include.value.split("@") if spec]
        hosts = [h for h in hosts if h in named]
    if nl.exclude is not None and isinstance(nl.exclude.value, str):
        whole = [spec for spec in nl.exclude.value.split("@") if spec and ":" not in spec]
        hosts = [h for h in hosts if h not in whole]
    if nl.num_nodes is not None and nl.num_nodes.value > 0:
        hosts = hosts[: nl.num_nodes.value]
    return hosts


def hostfile_slots(nl: NodeLaunch) -> Optional[int]:
    """Ranks DeepSpeed's runner starts from a hostfile (every slot of the active hosts, or ``--num_gpus`` each)."""
    hosts = _active_hosts(nl)
    if hosts is None:
        return None
    per_host = as_int(nl.nproc_per_node.value) if nl.nproc_per_node is not None else None
    slots = {h: s for h, s, _ in nl.hostfile.hosts}
    return sum(per_host if per_host else slots[h] for h in hosts)


def _accelerate(nl: NodeLaunch, lc: LaunchCommand, launch) -> None:
    doc = next((d for d in launch.accelerate_configs
                if lc.config_file is None or d.path.name == Path(lc.config_file).name), None)

    def from_config(key: str) -> Optional[Setting]:
        node = doc.get(key) if doc is not None else None
        return None if node is None else Setting(node.value, f"accelerate config {key}", doc.path, node.line)

    nl.nnodes = _int_setting(_flag(lc, "accelerate launch", "num_machines") or from_config("num_machines"))
    nl.node_rank = _int_setting(_flag(lc, "accelerate launch", "machine_rank") or from_config("machine_rank"))
    nl.master_addr = _flag(lc, "accelerate launch", "main_process_ip") or from_config("main_process_ip")
    nl.master_port = _int_setting(_flag(lc, "accelerate launch", "main_process_port")
                                  or from_config("main_process_port"))
    nl.rdzv_backend = _flag(lc, "accelerate launch", "rdzv_backend") or from_config("rdzv_backend")


def _llamafactory(nl: NodeLaunch, lc: LaunchCommand, env: Dict[str, EnvSetting]) -> None:
    nl.nnodes = _int_setting(_env(lc, env, "NNODES"))
    nl.node_rank = _int_setting(_env(lc, env, "NODE_RANK"))
    nl.nproc_per_node = _env(lc, env, "NPROC_PER_NODE")
    nl.master_addr = _env(lc, env, "MASTER_ADDR")
    nl.master_port = _int_setting(_env(lc, env, "MASTER_PORT"))


def _scheduler(nl: NodeLaunch, lc: LaunchCommand, sbatch: Dict[str, Setting]) -> None:
    srun = {k: Setting(v, f"srun --{k.replace('_', '-')}", lc.command.file, lc.command.line)
            for k, (v, _) in lc.wrapper_flags.items()} if lc.wrapper == "srun" else {}
    inside = lc.wrapper == "srun" or bool(sbatch)
    if not inside:
        return
    pick = {**sbatch, **srun}  # srun's flags override the allocation's for its step
    nl.scheduler_nodes = _int_setting(pick.get("nodes"))
    nl.tasks_per_node = _int_setting(pick.get("ntasks_per_node"))
    nl.ntasks = _int_setting(pick.get("ntasks"))
    gpus = pick.get("gpus_per_node")
    if gpus is not None:
        nl.gpus_per_node = _int_setting(Setting(str(gpus.value).rsplit(":", 1)[-1], gpus.source, gpus.file, gpus.line))


def node_facts(launch) -> NodeFacts:
    """The launch's multi-node settings, derived once and cached on the launch object."""
    cached = getattr(launch, "_node_facts", None)
    if cached is not None:
        return cached
    out = NodeFacts(env=launch.env())
    for script in launch.scripts:
        out.sbatch.update(sbatch_directives(script.text, script.path))
    for lc in launch.commands:
        nl = NodeLaunch(lc, lc.launcher)
        if lc.launcher == "torchrun":
            _torchrun(nl, lc)
        elif lc.launcher == "deepspeed":
            _deepspeed(nl, lc)
        elif lc.launcher == "accelerate":
            _accelerate(nl, lc, launch)
        elif lc.launcher == "llamafactory":
            _llamafactory(nl, lc, out.env)
        _scheduler(nl, lc, out.sbatch)
        out.commands.append(nl)
    launch._node_facts = out
    return out


def srun_world(nl: NodeLaunch) -> Optional[Tuple[int, str]]:
    """(ranks, how) for ``srun python train.py``: one rank per Slurm task."""
    if nl.ntasks is not None:
        return nl.ntasks.value, f"{nl.ntasks.source} {nl.ntasks.value}"
    if nl.scheduler_nodes is not None and nl.tasks_per_node is not None:
        return (nl.scheduler_nodes.value * nl.tasks_per_node.value,
                f"{nl.scheduler_nodes.source} {nl.scheduler_nodes.value} x {nl.tasks_per_node.source} "
                f"{nl.tasks_per_node.value}")
    return None


def summary(nf: NodeFacts) -> Dict[str, Any]:
    """The first launch command's node settings as JSON (``zeropilot run`` keeps it in ``run.json``)."""
    if not nf.commands:
        return {}
    nl = nf.commands[0]

    def val(s: Optional[Setting]) -> Any:
        return None if s is None else s.value

    out = {"launcher": nl.launcher, "wrapper": nl.command.wrapper, "nnodes": val(nl.nnodes),
           "node_rank": val(nl.node_rank), "master_addr": val(nl.master_addr), "master_port": val(nl.master_port),
           "rdzv_backend": val(nl.rdzv_backend), "rdzv_endpoint": val(nl.rdzv_endpoint),
           "scheduler_nodes": val(nl.scheduler_nodes),
           "hostfile": None if nl.hostfile is None else {"path": str(nl.hostfile.path), "error": nl.hostfile.error,
                                                           "hosts": [h for h, _, _ in nl.hostfile.hosts]}}
    out["from"] = {k: s.source for k, s in (("nnodes", nl.nnodes), ("node_rank", nl.node_rank),
                                            ("master_addr", nl.master_addr), ("master_port", nl.master_port),
                                            ("rdzv_backend", nl.rdzv_backend), ("rdzv_endpoint", nl.rdzv_endpoint),
                                            ("scheduler_nodes", nl.scheduler_nodes)) if s is not None}
    return out
