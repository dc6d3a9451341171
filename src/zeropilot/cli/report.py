"""``zeropilot report DIR``: what every rank of a ``zeropilot run`` did, as text, JSON or one HTML page."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

from zeropilot.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="summarise a run directory written by `zeropilot run`")
    p.add_argument("run_dir", metavar="DIR", type=Path, help="the run directory")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text (default), json (schema docs/report.schema.json) or html (one self-contained page)")
    p.add_argument("--out", metavar="FILE", type=Path, help="write the report to FILE (atomically) instead of stdout")
    p.add_argument("--compare", metavar="DIR2", type=Path,
                   help="a second run directory to put side by side (before and after a fix)")
    p.set_defaults(func=run)


def _write(text: str, out: Path) -> None:
    """Write through a temporary file in the same folder and a rename: never a half-written report."""
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise InputError("cannot write the report: no such folder", path=folder)
    if out.is_dir():
        raise InputError("cannot write the report: this is a folder", path=out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(folder))
    except OSError as exc:
        raise InputError(f"cannot write the report ({exc.strerror})", path=out) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _render(args: argparse.Namespace) -> str:
    from zeropilot.runlog import read_run, summarize
    from zeropilot.runlog import text as text_render

    records = read_run(args.run_dir)
    summary = summarize(records)
    if args.compare is None:
        if args.format == "json":
            return _json(summary)
        if args.format == "html":
            from zeropilot.runlog.report_html import render
            return render(records, summary)
        return text_render.render(summary)
    from zeropilot.runlog.summary import compare

    other = read_run(args.compare)
    cmp = compare(summary, summarize(other))
    if args.format == "json":
        return _json(cmp)
    if args.format == "html":
        from zeropilot.runlog.report_html import render_compare
        return render_compare(records, other, cmp)
    return text_render.render_compare(cmp)


def _json(obj: Dict[str, Any]) -> str:
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def run(args: argparse.Namespace) -> int:
    out = _render(args)
    if args.out is not None:
        _write(out, args.out)
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(out)
    return 0
