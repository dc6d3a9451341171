"""The check as a library call: read a launch, run the rules, return the result."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Set, Tuple

from zeropilot.errors import InputError
from zeropilot.launch import Launch, load_launch
from zeropilot.report import CheckResult
from zeropilot.rules import all_rules, run_rules


def check(
    paths: Sequence,
    versions: Optional[str] = None,
    world_size: Optional[int] = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    gpus: Optional[str] = None,
    use_installed: bool = True,
    machine=None,
    oracle: bool = False,
) -> Tuple[CheckResult, Launch]:
    """Check a launch.

    Args:
        paths: files or folders of the launch.
        versions: ``NAME=VER,...`` overrides of the installed versions.
        world_size: overrides the world size the launch implies.
        select, ignore: rule codes to run only / to skip.
        gpus: ``COUNTxMEM`` for the memory rules (``4x16GiB``); by default the NVIDIA GPUs of this machine
            (``nvidia-smi``), if any.
        use_installed: read installed versions (off in tests that pin versions).
        machine: this machine's op-build locks (``zeropilot.launch.machine.MachineState``) for MC001; by default
            read from this machine's torch extensions folder when ``use_installed`` is on.
        oracle: also ask the installed DeepSpeed / transformers / accelerate (a subprocess, seconds; see
            :mod:`zeropilot.oracle`).

    Returns:
        The result and the launch that was read.

    Raises:
        InputError: a path cannot be read, or `gpus` is not ``COUNTxMEM`` / ``MEM``.
    """
    if gpus:
        _check_gpus(gpus)
    launch = load_launch(paths, versions=versions, world_size=world_size, use_installed=use_installed)
    if gpus is None and use_installed:
        from zeropilot.launch.hardware import visible_gpus

        detected = visible_gpus()  # this machine's NVIDIA GPUs, if any; else the memory rules wait for --gpus
        # The card size is this machine's; how many ranks share the work is the launch's world size.
        gpus = detected.split("x", 1)[1] if detected else None
    launch.gpus = gpus
    if machine is None and use_installed:
        import os

        from zeropilot.launch.machine import inspect_machine

        env = dict(os.environ)
        env.update({k: s.value for k, s in launch.env().items()})  # the launch's own TORCH_EXTENSIONS_DIR, if any
        machine = inspect_machine(env)
    launch.machine = machine
    if oracle:
        from zeropilot.oracle import ask

        launch.oracle = ask(launch)
    select: Set[str] = set(select)
    ignore: Set[str] = set(ignore)
    rules = [r for r in all_rules() if (not select or r.code in select) and r.code not in ignore]
    findings = run_rules(launch, rules)
    files = sorted({str(d.path) for d in launch.documents} | {str(s.path) for s in launch.scripts}
                   | {str(p.path) for p in launch.python_files})
    result = CheckResult(findings, launch.versions, launch.world_size, list(launch.read_errors), files)
    return result, launch


def _check_gpus(gpus: str) -> None:
    """Refuse a `gpus` value the memory rules could not read (they would skip it, silently)."""
    from zeropilot.memory.inputs import parse_gpus

    try:
        parse_gpus(gpus if "x" in gpus.lower() else f"1x{gpus}")
    except InputError:
        raise InputError(f"--gpus {gpus!r}: expected COUNTxMEM such as 4x16GiB, or MEM such as 16GiB "
                         "(the count is then the launch's world size)") from None
