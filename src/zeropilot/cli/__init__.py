"""The ``zeropilot`` command: registers one subcommand per module and turns input errors into exit 2.

Each subcommand module exposes ``register(subparsers)`` and a ``run(args) -> int`` that the
parser binds with ``set_defaults(func=run)``. Argument parsing never leaks into library code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from zeropilot import __version__
from zeropilot.errors import InputError

# Imported lazily, in this order, so `zeropilot check` never pays for `ckpt`'s imports.
_COMMANDS = ("check", "rules", "plan", "ckpt", "report", "top", "run", "repro", "calibrate")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line (a bad value of a flag is bad input like any other: one clear line
    and exit 2), with where to read the usage; subcommands' parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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


#: daemon threads that may hold a c10d store client (``zeropilot run`` of a job across nodes: runner/peers.py)
_STORE_THREADS = ("zeropilot-peers", "zeropilot-verdict")


def entry() -> None:
    """The console script and ``python -m zeropilot``: :func:`main`, then the exit status.

    A c10d ``TCPStore`` client still held by a daemon thread when the interpreter shuts down (the cross-node
    heartbeat reader, slow to close on a loaded machine) aborts the process in its C++ destructor ("terminate
    called without an active exception", status -6) after everything was written. Then, with the run directory
    written and both streams flushed, the process leaves without running those destructors.
    """
    import threading

    code = main()
    if any(t.name in _STORE_THREADS and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code % 256)
    raise SystemExit(code)
