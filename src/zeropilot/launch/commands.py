"""What a launch command means: which launcher, how many processes, which program and config files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot.launch.shell import Command

VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                       "ASCEND_RT_VISIBLE_DEVICES")
_PYTHONS = ("python", "python3")


@dataclass
class LaunchCommand:
    """A command that starts training.

    Attributes:
        launcher: ``deepspeed``, ``torchrun``, ``accelerate``, ``llamafactory`` or ``python``.
        nproc: processes per node from the command's own flags, None when it does not say.
        nnodes: nodes from its flags, None when it does not say.
        include: the device ids a ``deepspeed --include localhost:0,1`` names.
        program: the training script or module it runs.
        program_args: the arguments after the program (training arguments as flags).
        program_args_index: index in ``command.argv`` where program_args start.
        config_file: an accelerate ``--config_file`` or LLaMA-Factory YAML it names.
        flags: the launcher's own flags, name -> (value, argv index).
        wrapper: ``srun`` when Slurm's ``srun`` starts the launcher (``srun torchrun ...``, ``srun python ...``).
        wrapper_flags: the wrapper's flags, name -> (value, argv index in the whole command): short names
            spelled long (``-N`` is ``nodes``, ``-n`` is ``ntasks``).
    """

    command: Command
    launcher: str
    nproc: Optional[str] = None
    nnodes: Optional[str] = None
    include: Optional[str] = None
    program: Optional[str] = None
    program_args: List[str] = field(default_factory=list)
    program_args_index: int = 0
    config_file: Optional[str] = None
    flags: Dict[str, Tuple[Optional[str], int]] = field(default_factory=dict)
    wrapper: Optional[str] = None
    wrapper_flags: Dict[str, Tuple[Optional[str], int]] = field(default_factory=dict)


def _norm(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _launcher_flags(argv: List[str], start: int, takes_value) -> Tuple[Dict[str, Tuple[Optional[str], int]], int]:
    """Flags up to the first positional word: name -> (value, index), and that word's index."""
    flags: Dict[str, Tuple[Optional[str], int]] = {}
    i = start
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        name, eq, value = word.partition("=")
        key = _norm(name)
        if eq:
            flags[key] = (value, i)
        elif takes_value(key) and i + 1 < len(argv):
            flags[key] = (argv[i + 1], i)
            i += 1
        else:
            flags[key] = (None, i)
        i += 1
    return flags, i


_BOOL_FLAGS = {"use_deepspeed", "no_python", "module", "m", "standalone", "no_local_rank", "autotuning",
               "force_multi", "bind_cores_to_rank", "enable_each_rank_log", "cpu", "multi_gpu",
               "tpu", "debug", "quiet", "q", "zero3_init_flag", "zero3_save_16bit_model", "same_network",
               "rdzv_standalone", "no_ssh_check", "save_pid", "enable_cpu_affinity"}


def _takes_value(key: str) -> bool:
    return key not in _BOOL_FLAGS


_PROGRAMS = ("deepspeed", "torchrun", "accelerate", "llamafactory-cli", "lmf") + _PYTHONS
_SRUN_SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus_per_task", "G": "gpus", "w": "nodelist", "p": "partition"}


def _srun_flags(words: List[str]) -> Dict[str, Tuple[Optional[str], int]]:
    """``srun``'s own flags (``words`` are argv[1:program]): ``--name=v``, ``--name v``, ``-N 2``, ``-N2``."""
    flags: Dict[str, Tuple[Optional[str], int]] = {}
    i = 0
    while i < len(words):
        word, index = words[i], i + 1
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if not eq and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            flags[_norm(name)] = (value if (eq or value) else None, index)
        elif word.startswith("-") and len(word) >= 2:
            name, value = word[1], word[2:] or None
            if value is None and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            flags[_SRUN_SHORT.get(name, name)] = (value, index)
        i += 1
    return flags


def _unwrap_srun(command: Command) -> Optional[LaunchCommand]:
    """``srun [flags] LAUNCHER ...``: the launcher's command, with srun's flags kept."""
    argv = command.argv
    at = next((i for i in range(1, len(argv)) if Path(argv[i]).name in _PROGRAMS), None)
    if at is None:
        return None
    inner = Command(argv[at:], command.file, command.line, command.env, command.text, command.offsets[at:])
    lc = interpret(inner)
    if lc is None:
        return None
    lc.command = command  # the whole line, so findings and edits point at what the user wrote
    lc.program_args_index += at
    lc.flags = {k: (v, i + at) for k, (v, i) in lc.flags.items()}
    lc.wrapper, lc.wrapper_flags = "srun", _srun_flags(argv[1:at])
    return lc


def interpret(command: Command) -> Optional[LaunchCommand]:
    """The launch a command makes, or None when it starts no training."""
    argv = command.argv
    if not argv:
        return None
    name = Path(argv[0]).name
    if name == "srun":
        return _unwrap_srun(command)
    if name == "deepspeed":
        flags, i = _launcher_flags(argv, 1, _takes_value)
        return _with_program(command, "deepspeed", flags, i, nproc=_get(flags, "num_gpus", "num_accelerators"),
                             nnodes=_get(flags, "num_nodes"), include=_get(flags, "include", "i"))
    if name == "torchrun" or (name in _PYTHONS and argv[1:3] in (["-m", "torch.distributed.run"],
                                                                  ["-m", "torch.distributed.launch"])):
        start = 1 if name == "torchrun" else 3
        flags, i = _launcher_flags(argv, start, _takes_value)
        return _with_program(command, "torchrun", flags, i, nproc=_get(flags, "nproc_per_node"),
                             nnodes=_get(flags, "nnodes"))
    if name == "accelerate" and argv[1:2] == ["launch"]:
        flags, i = _launcher_flags(argv, 2, _takes_value)
        launch = _with_program(command, "accelerate", flags, i, nproc=_get(flags, "num_processes"),
                               nnodes=_get(flags, "num_machines"))
        launch.config_file = _get(flags, "config_file")
        return launch
    if name in ("llamafactory-cli", "lmf") and len(argv) >= 3 and argv[1] == "train":
        return LaunchCommand(command, "llamafactory", program="llamafactory-cli train", config_file=argv[2],
                             program_args=argv[3:], program_args_index=3)
    if name in _PYTHONS and len(argv) >= 2 and argv[1].endswith(".py"):
        return LaunchCommand(command, "python", program=argv[1], program_args=argv[2:], program_args_index=2)
    return None


def _get(flags: Dict[str, Tuple[Optional[str], int]], *names: str) -> Optional[str]:
    for n in names:
        if n in flags:
            return flags[n][0]
    return None


def _with_program(command, launcher, flags, i, **kw) -> LaunchCommand:
    argv = command.argv
    program = argv[i] if i < len(argv) else None
    return LaunchCommand(command, launcher, program=program, program_args=argv[i + 1:],
                         program_args_index=i + 1, flags=flags, **kw)


def parse_flag_args(args: List[str]) -> List[Tuple[str, Optional[str], int]]:
    """``--key value``/``--key=value``/``--flag`` training arguments: (key, value, index in args)."""
    out = []
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if eq:
                out.append((name, value, i))
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out.append((name, args[i + 1], i))
                i += 1
            else:
                out.append((name, None, i))
        elif "=" in word and not word.startswith("-"):
            # LLaMA-Factory's `key=value` overrides after the YAML.
            name, _, value = word.partition("=")
            out.append((name, value, i))
        i += 1
    return out


def count_devices(value: str) -> Optional[int]:
    """Number of devices in a ``*_VISIBLE_DEVICES`` value; None when it is not a plain list."""
    value = value.strip()
    if not value:
        return 0
    parts = [p for p in value.split(",") if p.strip()]
    return len(parts) if parts else None


def as_int(value: Optional[str]) -> Optional[int]:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None
