"""``zeropilot check``: find what will break a DeepSpeed ZeRO launch before it starts."""

from __future__ import annotations

import argparse
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
    p.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    p.add_argument("--fail-on", choices=("error", "warning", "info"), default="error",
                   help="lowest severity that makes the exit status 1 (default: error)")
    p.add_argument("--select", metavar="CODES", help="only these rule codes (comma-separated)")
    p.add_argument("--ignore", metavar="CODES", help="skip these rule codes (comma-separated)")
    p.add_argument("--gpus", metavar="COUNTxMEM", help="GPUs for memory rules, e.g. 4x16GiB")
    p.add_argument("--oracle", action="store_true",
                   help="also validate each DeepSpeed config with the installed DeepSpeed/transformers/accelerate "
                        "(a subprocess; takes seconds)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    group.add_argument("--diff", action="store_true", help="show the safe fixes as a diff; change nothing")
    p.set_defaults(func=run)


def _codes(text):
    return {c.strip().upper() for c in text.split(",") if c.strip()} if text else set()


def run(args: argparse.Namespace) -> int:
    from zeropilot.check import check
    from zeropilot.fix.edits import apply_edits, diff, planned
    from zeropilot.rules.registry import Applicability, Severity

    if args.world_size is not None and args.world_size < 1:
        raise InputError(f"--world-size must be at least 1, got {args.world_size}")
    result, launch = check(args.paths, versions=args.versions, world_size=args.world_size,
                           select=_codes(args.select), ignore=_codes(args.ignore), gpus=args.gpus,
                           oracle=args.oracle)
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
    return result.exit_code(Severity(args.fail_on))


def _render(result, fmt: str) -> str:
    if fmt == "json":
        from zeropilot.report import jsonout
        return jsonout.render(result)
    if fmt == "sarif":
        from zeropilot.report import sarif
        return sarif.render(result)
    from zeropilot.report import text
    return text.render(result, colour=text.use_colour(sys.stdout))
