"""`zeropilot plan` (being built: see its issue)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="(not yet available)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("zeropilot plan is not available yet")
    return 2
