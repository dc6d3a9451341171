"""``zeropilot report DIR``: what every rank of a ``zeropilot run`` did, as text or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="summarise a run directory written by `zeropilot run`")
    p.add_argument("run_dir", metavar="DIR", type=Path, help="the run directory")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zeropilot.runlog import read_run, summarize
    from zeropilot.runlog.text import render

    summary = summarize(read_run(args.run_dir))
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(summary))
    return 0
