"""The check as a library call: read a launch, run the rules, return the result.

No hidden I/O: the call reads the files it is given and nothing else. This machine's GPUs and the
Hugging Face Hub are inputs (``gpus``, ``hub``); the ``zeropilot check`` command detects the GPUs and says so.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence, Tuple

from zeropilot.errors import InputError
from zeropilot.launch import Launch, load_launch
from zeropilot.findings import CheckResult
from zeropilot.rules import all_rules, run_rules
from zeropilot.rules.registry import match_selector, select_rules


def check(
    paths: Sequence,
    versions: Optional[str] = None,
    world_size: Optional[int] = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    gpus: Optional[str] = None,
    use_installed: bool = True,
    hub=None,
    per_file_ignores: Optional[Dict[str, Sequence[str]]] = None,
    machine=None,
    oracle: bool = False,
    host_mem: Optional[float] = None,
    hardware: Optional[str] = None,
    gpu_name: Optional[str] = None,
) -> Tuple[CheckResult, Launch]:
    """Check a launch.

    Args:
        paths: files or folders of the launch.
        versions: ``NAME=VER,...`` overrides of the installed versions.
        world_size: overrides the world size the launch implies.
        select, ignore: rule codes, names or prefixes to run only / to skip (as ruff: the most specific wins).
        gpus: ``COUNTxMEM`` or ``MEM`` for the memory rules (``4x16GiB``); None: they wait for it.
        use_installed: read installed package versions (off in tests that pin versions).
        hub: a :class:`zeropilot.models.HubAccess` to read unknown model configs from; None: no network.
        per_file_ignores: glob -> codes/prefixes silenced in matching files (see ``report/suppress.py``).
        machine: this machine's op-build locks (``zeropilot.launch.machine.inspect_machine``) for MC001; None: not
            inspected (the CLI reads them).
        oracle: also ask the installed DeepSpeed / transformers / accelerate, in a subprocess (seconds; see
            :mod:`zeropilot.oracle`).
        host_mem: host RAM per node in GiB for the host-memory rule (MEM005); None: it waits for it.
        hardware: a hardware profile from ``zeropilot calibrate`` for the memory rules (outside-PyTorch memory).
        gpu_name: the GPU model the launch runs on (``NVIDIA H200``); without ``hardware``, the calibrate profile
            of that model closest to the launch's world size is used when one is installed or shipped.

    Returns:
        The result (findings less inline suppressions, notices) and the launch that was read.

    Raises:
        InputError: a path cannot be read, a selector names no rule, or `gpus` is not ``COUNTxMEM`` / ``MEM``.
    """
    rules = all_rules()
    chosen = select_rules(rules, select, ignore)
    for selectors in (per_file_ignores or {}).values():
        for selector in selectors:
            match_selector(selector, rules)
    if gpus:
        _check_gpus(gpus)
    launch = load_launch(paths, versions=versions, world_size=world_size, use_installed=use_installed)
    launch.gpus = gpus
    launch.hub = hub
    launch.machine = machine
    launch.host_mem = int(host_mem * 2**30) if host_mem else None
    if hardware:
        from zeropilot.memory.profile import load as load_profile

        launch.hardware_profile = load_profile(hardware)
    elif gpu_name:
        from zeropilot.memory.profile import find as find_profile

        launch.hardware_profile = find_profile(gpu_name, launch.world_size.value or 1)
    if oracle:
        from zeropilot.oracle import ask

        launch.oracle = ask(launch)
    findings = run_rules(launch, chosen)
    findings, suppressed, notices = _suppress(launch, findings, rules, per_file_ignores or {})
    files = sorted({str(d.path) for d in launch.documents} | {str(s.path) for s in launch.scripts}
                   | {str(p.path) for p in launch.python_files})
    notices.extend(f"{script.path}:{line}: a line of {size} characters was not read as a command (longer than "
                   "256 KiB: no launch command is)" for script in launch.scripts for line, size in script.long_lines)
    if not files and not launch.read_errors:
        notices.insert(0, "no launch file found in " + ", ".join(str(p) for p in paths) +
                       " (looked for DeepSpeed JSON, training YAML/JSON, accelerate YAML, shell and Python "
                       "scripts); nothing was checked")
    result = CheckResult(findings, launch.versions, launch.world_size, list(launch.read_errors), files,
                         notices=notices, suppressed=suppressed,
                         skipped=[(str(p), why) for p, why in launch.skipped])
    return result, launch


def _suppress(launch: Launch, findings, rules, per_file_ignores):
    from zeropilot.findings.suppress import apply

    texts = {str(d.path): d.text for d in launch.documents if d.fmt != "flags"}
    texts.update({str(s.path): s.text for s in launch.scripts})
    texts.update({str(p.path): p.text for p in launch.python_files})
    return apply(findings, texts, rules, per_file_ignores)


def _check_gpus(gpus: str) -> None:
    """Refuse a `gpus` value the memory rules could not read (they would skip it, silently)."""
    from zeropilot.memory.inputs import has_count, parse_gpus

    try:
        parse_gpus(gpus if has_count(gpus) else f"1x{gpus}")
    except InputError:
        raise InputError(f"--gpus {gpus!r}: expected COUNTxMEM such as 4x16GiB or COUNTxCARD such as 4xH100, or MEM "
                         "or CARD alone such as 16GiB (the count is then the launch's world size; cards: "
                         "docs/cards.md)") from None
