"""``zeropilot report DIR``: what every rank of a ``zeropilot run`` did, as text, JSON or one HTML page."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict

from zeropilot.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="summarise a run directory written by `zeropilot run`",
                              description="Summarise what every rank of a `zeropilot run` did. For a job across "
                                          "nodes give each node's run directory, or the folder holding them, or "
                                          "the one directory every node wrote: one report of the whole job.")
    p.add_argument("run_dir", metavar="DIR", type=Path, nargs="+",
                   help="the run directory; several (or a folder of them) for the nodes of one job")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="text (default), json (schema docs/report.schema.json) or html (one self-contained page)")
    p.add_argument("--out", metavar="FILE", type=Path, help="write the report to FILE (atomically) instead of stdout")
    p.add_argument("--compare", metavar="DIR2", type=Path, action=_Compare,
                   help="a second run directory to put side by side (before and after a fix); the two are A and B "
                        "in the order given: DIR --compare DIR2, or --compare DIR DIR2")
    p.add_argument("--checkpoint", metavar="PATH", nargs="?", const="last",
                   help="check a checkpoint with `ckpt inspect`'s reader and say on which world size the job can "
                        "resume from it: PATH, or without PATH the last save the run recorded (that path is read)")
    p.add_argument("--hardware", metavar="FILE",
                   help="hardware profile from `zeropilot calibrate` whose speed figures predict the step time (default: "
                        "the profile found for the run's card, as `plan` finds it, else the card table's estimates)")
    p.set_defaults(func=run, compare_first=False)


class _Compare(argparse.Action):
    """``--compare``, remembering whether it came before the positional DIR: ``report --compare A B`` compares A
    (first) with B, as ``report A --compare B`` does. (argparse fills DIR when it reaches it on the line.)"""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.compare_first = getattr(namespace, "run_dir", None) is None


def _write(text: str, out: Path) -> None:
    """Write atomically (never a half-written report), readable by others (0o644) like any file the user asks for."""
    from zeropilot.runlog.layout import write_text_atomic

    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise InputError("cannot write the report: no such folder", path=folder)
    from zeropilot.safefile import check_output

    check_output(out)  # a folder, a FIFO, a device (/dev/stdout): never replaced; omit --out to print
    try:
        write_text_atomic(out, text, mode=0o644)
    except OSError as exc:
        raise InputError(f"cannot write the report ({exc.strerror or exc})", path=out) from None


def _render(args: argparse.Namespace) -> str:
    from zeropilot.runlog import summarize
    from zeropilot.runlog import text as text_render
    from zeropilot.runlog.job import checkpoint_section, read_job

    predictor = _predictor(args)
    records = read_job(args.run_dir)
    summary = summarize(records, predictor)
    if args.checkpoint:  # only when asked: the document is otherwise the one `run --format json` prints
        summary["checkpoint"] = checkpoint_section(summary, args.checkpoint)
    if args.compare is None:
        if args.format == "json":
            return render_json(summary)
        if args.format == "html":
            from zeropilot.runlog.report_html import render
            return render(records, summary)
        return text_render.render(summary)
    from zeropilot.runlog.summary import compare

    other = read_job([args.compare])
    pair = [(records, summary), (other, summarize(other, predictor))]
    if args.compare_first:
        pair.reverse()
    (rec_a, sum_a), (rec_b, sum_b) = pair
    cmp = compare(sum_a, sum_b)
    if args.format == "json":
        return render_json(cmp)
    if args.format == "html":
        from zeropilot.runlog.report_html import render_compare
        return render_compare(rec_a, rec_b, cmp)
    return text_render.render_compare(cmp)


def _predictor(args: argparse.Namespace):
    """How the step time is predicted: with the speed figures of ``--hardware FILE`` where given."""
    from zeropilot.runlog.timing import Predictor

    if not args.hardware:
        return Predictor()
    from zeropilot.memory.profile import load

    return Predictor(profile=load(args.hardware))


def render_json(obj: Dict[str, Any]) -> str:
    """``zeropilot.report/1`` (or ``report-compare/1``) in the envelope every command's JSON has."""
    from zeropilot.envelope import rewrap

    return json.dumps(rewrap(obj), indent=2, allow_nan=False) + "\n"


def run(args: argparse.Namespace) -> int:
    out = _render(args)
    if args.out is not None:
        _write(out, args.out)
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(out)
    return 0
