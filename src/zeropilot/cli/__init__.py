"""The ``zeropilot`` command: registers one subcommand per module and turns input errors into exit 2.

Each subcommand module exposes ``register(subparsers)`` and a ``run(args) -> int`` that the
parser binds with ``set_defaults(func=run)``. Argument parsing never leaks into library code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from zeropilot import __version__
from zeropilot.errors import InputError

# Imported lazily, in this order, so `zeropilot check` never pays for `ckpt`'s imports.
_COMMANDS = ("check", "rules", "plan", "ckpt", "report", "top", "run", "repro", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zeropilot",
        description="Check, plan and export DeepSpeed ZeRO training launches.",
    )
    parser.add_argument("--version", action="version", version=f"zeropilot {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        module = importlib.import_module(f"zeropilot.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except InputError as exc:
        print(f"zeropilot: error: {exc.render()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeropilot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error of ours.
        sys.stderr.close()
        return 0
