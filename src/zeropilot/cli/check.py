"""``zeropilot check``: find what will break a DeepSpeed ZeRO launch before it starts."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict

from zeropilot.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="diagnose a launch (DeepSpeed JSON, training args, accelerate YAML, scripts)",
        description="Find what will break a DeepSpeed ZeRO launch before it starts.")
    p.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                   help="files, or a folder in which to discover the launch (default: .)")
    p.add_argument("--versions", metavar="NAME=VER[,NAME=VER...]",
                   help="versions to assume instead of the installed ones (deepspeed, transformers, "
                        "accelerate, torch, peft, llamafactory)")
    p.add_argument("--world-size", type=int, metavar="N", help="number of training processes")
    p.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text",
                   help="json: the versioned zeropilot.check/1 document (docs/json-schema.md); sarif: SARIF 2.1.0 "
                        "for code scanning; github: GitHub Actions annotations (::error file=...,line=...::...)")
    p.add_argument("--fail-on", choices=("error", "warning", "info"), default=None,
                   help="lowest severity that makes the exit status 1 (default: error)")
    p.add_argument("--select", metavar="RULES",
                   help="only these rules: codes, names or prefixes such as DS (comma-separated)")
    p.add_argument("--extend-select", metavar="RULES", help="add these rules to the selection")
    p.add_argument("--ignore", metavar="RULES", help="skip these rules: codes, names or prefixes")
    p.add_argument("--gpus", metavar="COUNTxMEM",
                   help="GPUs for memory rules, e.g. 4x16GiB (default: this machine's, from nvidia-smi; "
                        "'none': do not detect)")
    p.add_argument("--host-mem", type=float, metavar="GiB", help="host RAM per node, for the host-memory rule (MEM005)")
    p.add_argument("--hardware", metavar="FILE", help="hardware profile from `zeropilot calibrate` for the memory rules")
    p.add_argument("--hub", action="store_true",
                   help="read model configs not found locally from the Hugging Face Hub (honours HF_ENDPOINT, "
                        "HF_TOKEN, HF_HUB_OFFLINE); off by default: check makes no network request")
    p.add_argument("--isolated", action="store_true", help="ignore [tool.zeropilot] in pyproject.toml")
    p.add_argument("--oracle", action="store_true",
                   help="also validate each DeepSpeed config with the installed DeepSpeed/transformers/accelerate "
                        "(a subprocess; takes seconds)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    group.add_argument("--diff", action="store_true", help="show the safe fixes as a diff; change nothing")
    p.set_defaults(func=run)


def _codes(text):
    return [c.strip() for c in text.split(",") if c.strip()] if text else []


def _options(args: argparse.Namespace) -> dict:
    """check()'s arguments: the flags, over ``[tool.zeropilot]`` found from the first path upward."""
    from zeropilot.settings import Settings, find_pyproject, load_settings

    source = None if args.isolated else find_pyproject(args.paths)
    settings = load_settings(source) if source else Settings()
    base = source.parent if source else Path.cwd()
    select = _codes(args.select) or settings.select
    select = select + settings.extend_select + _codes(args.extend_select) if select else []
    if not select and (settings.extend_select or args.extend_select):
        select = ["ALL"]
    gpus = args.gpus or settings.gpus
    gpu_name = None
    if gpus is None:
        gpus = _detected_card()
        if gpus is not None and not args.hardware:
            from zeropilot.launch.hardware import visible_gpu_name

            gpu_name = visible_gpu_name()
    elif gpus.lower() == "none":
        gpus = None
    hub = None
    if args.hub or settings.hub:
        from zeropilot.models import HubAccess

        hub = HubAccess.from_env()
        _note(f"model configs not found locally are read from the Hub: {hub.describe()}")
    from zeropilot.launch.machine import inspect_machine

    return {"machine": inspect_machine(os.environ), "oracle": args.oracle, "host_mem": args.host_mem, "hardware": args.hardware,
            "gpu_name": gpu_name,
            "versions": args.versions or settings.versions, "world_size": args.world_size or settings.world_size,
            "select": select, "ignore": settings.ignore + _codes(args.ignore), "gpus": gpus, "hub": hub,
            "per_file_ignores": {(str(base / g) if "/" in g else g): c
                                 for g, c in settings.per_file_ignores.items()},
            "fail_on": args.fail_on or settings.fail_on or "error"}


def _detected_card():
    """This machine's card size for the memory rules (the count is the launch's world size), said on stderr."""
    from zeropilot.launch.hardware import visible_gpus

    detected = visible_gpus()
    if not detected:
        return None
    _note(f"memory rules use this machine's GPUs: {detected} (nvidia-smi); --gpus overrides, --gpus none "
          "turns detection off")
    return detected.split("x", 1)[1]


def _note(message: str) -> None:
    print(f"zeropilot: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from zeropilot.check import check
    from zeropilot.fix.edits import apply_edits, diff, planned
    from zeropilot.rules.registry import Applicability, Severity

    if args.world_size is not None and args.world_size < 1:
        raise InputError(f"--world-size must be at least 1, got {args.world_size}")
    options = _options(args)
    fail_on = options.pop("fail_on")
    result, launch = check(args.paths, **options)
    profile = getattr(launch, "hardware_profile", None)
    if options.get("gpu_name") and profile is not None:
        _note(f"memory rules use the hardware profile {profile.path} (found for {options['gpu_name']}); "
              "--hardware overrides")
    for notice in result.notices:
        print(f"zeropilot: warning: {notice}", file=sys.stderr)
    if args.fix or args.diff:
        edits = [e for f in result.findings if f.fix and f.fix.applicability == Applicability.SAFE
                 for e in f.fix.edits]
        texts: Dict[Path, str] = {d.path: d.text for d in launch.documents if d.fmt != "flags"}
        changes = planned([e for e in edits if Path(e.file) in texts], texts)
        if args.diff:
            sys.stdout.write(diff(changes))
            return 1 if changes else 0
        written = apply_edits(changes)
        if written:
            fixed_files = {str(p) for p in written}
            before = len(result.findings)
            result.findings = [f for f in result.findings
                               if not (f.fix and f.fix.applicability == Applicability.SAFE and f.file in fixed_files)]
            result.fixed = before - len(result.findings)
            for path in written:
                print(f"fixed: {path}", file=sys.stderr)
    out = _render(result, args.format)
    sys.stdout.write(out)
    return result.exit_code(Severity(fail_on))


def _render(result, fmt: str) -> str:
    if fmt == "json":
        from zeropilot.findings import jsondoc
        return jsondoc.render(result)
    if fmt == "sarif":
        from zeropilot.findings import sarif
        return sarif.render(result)
    if fmt == "github":
        from zeropilot.findings import github
        return github.render(result)
    from zeropilot.findings import text
    return text.render(result, colour=text.use_colour(sys.stdout))
