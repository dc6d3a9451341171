"""`zeropilot ckpt`: inspect, export, convert to universal and verify DeepSpeed ZeRO checkpoints.

Parses arguments, calls :mod:`zeropilot.checkpoint`, renders. Exit status: 0 fine, 1 a damaged,
incomplete or mismatching checkpoint (the verdict names the files), 2 bad input (one line on stderr).
Everything printed that came from a checkpoint goes through :func:`terminal.clean`.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

from zeropilot.checkpoint.terminal import clean
from zeropilot.errors import InputError

# Errors a crafted file could still provoke deep in a reader: one line and exit 2, never a traceback
# (ZEROPILOT_DEBUG=1 shows the traceback).
_LAST_RESORT = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, MemoryError,
                UnicodeError, struct.error, OverflowError, OSError)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ckpt", help="inspect, export, convert and verify DeepSpeed ZeRO checkpoints",
        description="Inspect, export (to Hugging Face safetensors), convert to universal checkpoints (resume on "
                    "another number of GPUs) and verify DeepSpeed ZeRO checkpoints without running pickled code.")
    sub = parser.add_subparsers(dest="ckpt_command", metavar="ACTION")
    parser.set_defaults(func=run, ckpt_command=None)

    p = sub.add_parser("inspect", help="what a checkpoint holds, and whether it is complete")
    p.add_argument("path", type=Path, help="HF output dir, checkpoint-N, DeepSpeed save dir or tag dir")
    p.add_argument("--tag", help="tag to read instead of what `latest` says")
    p.add_argument("--format", choices=("text", "json"), default="text")
    _common(p)

    p = sub.add_parser("export", help="write a Hugging Face model or PEFT adapter")
    p.add_argument("path", type=Path)
    p.add_argument("out", type=Path, help="new folder to write (refused if it exists, unless --force)")
    p.add_argument("--tag")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="output dtype of floating tensors (default: the dtype of the saved module)")
    p.add_argument("--max-shard-size", default="5GB")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--adapter-only", action="store_true", help="write the PEFT adapter only")
    group.add_argument("--merge-into", type=Path, metavar="BASE_MODEL_DIR",
                       help="merge the LoRA weights into this base model's weights")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--no-progress", action="store_true")
    _format(p, "zeropilot.ckpt-export/1")
    _common(p)

    p = sub.add_parser("universal", help="write DeepSpeed's universal checkpoint: resume on any number of ranks",
                       description="Write the universal checkpoint of a ZeRO-1/2/3 checkpoint (what DeepSpeed's "
                                   "ds_to_universal.py writes) into the new folder OUT; resume from OUT with "
                                   '"checkpoint": {"load_universal": true} in the DeepSpeed config.')
    p.add_argument("path", type=Path, help="HF output dir, checkpoint-N, DeepSpeed save dir or tag dir")
    p.add_argument("out", type=Path, help="new folder to write (refused if it exists, unless --force)")
    p.add_argument("--tag", help="tag to convert instead of what `latest` says")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--format", choices=("text", "json"), default="text")
    _common(p)

    p = sub.add_parser("verify", help="compare an export with its checkpoint, tensor for tensor")
    p.add_argument("out", type=Path)
    p.add_argument("--against", type=Path, required=True, metavar="PATH")
    p.add_argument("--tag")
    p.add_argument("--load", action="store_true", help="also load OUT with transformers/PEFT and run a forward")
    _format(p, "zeropilot.ckpt-verify/1")
    _common(p)


def _format(p: argparse.ArgumentParser, schema: str) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help=f"json: the versioned {schema} document on stdout, a damaged checkpoint included "
                        "(docs/json-schema.md)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-pickle", action="store_true",
                   help="load files with weights_only=False (runs code in the pickle: only for files you trust)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="open files whose symlinks lead outside the checkpoint folder (e.g. a Hugging Face Hub "
                        "cache snapshot)")


def run(args: argparse.Namespace) -> int:
    from zeropilot.checkpoint.reconstruct import DamagedCheckpoint

    action = {"inspect": _inspect, "export": _export, "universal": _universal,
              "verify": _verify}.get(args.ckpt_command)
    if action is None:
        print("usage: zeropilot ckpt {inspect,export,universal,verify} ... (see --help)", file=sys.stderr)
        return 2
    try:
        return action(args)
    except DamagedCheckpoint as exc:
        if getattr(args, "format", "text") == "json" and args.ckpt_command != "inspect":
            sys.stdout.write(_dumps(_damaged_document(args, exc)))
        print(clean(f"verdict: DAMAGED — {exc}:"), file=sys.stderr)
        for f in exc.files:
            print(clean(f"  - {f}"), file=sys.stderr)
        return 1
    except InputError as exc:
        print(clean(f"zeropilot: error: {exc.render()}"), file=sys.stderr)
        return 2
    except _LAST_RESORT as exc:
        if os.environ.get("ZEROPILOT_DEBUG"):
            raise
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        print(clean(f"zeropilot: error: cannot read this checkpoint ({type(exc).__name__}: {text}); "
                    "ZEROPILOT_DEBUG=1 shows where"), file=sys.stderr)
        return 2


def _inspect(args: argparse.Namespace) -> int:
    from zeropilot.checkpoint.inspect import inspect_checkpoint, render_text, to_json

    report = inspect_checkpoint(args.path, args.tag, trust_pickle=args.trust_pickle,
                                follow_symlinks=args.follow_symlinks)
    if args.format == "json":
        from zeropilot.envelope import CKPT_INSPECT_SCHEMA, envelope

        print(json.dumps(envelope(CKPT_INSPECT_SCHEMA, to_json(report)), indent=2))
    else:
        print(render_text(report))
    return report.exit_code


def _export(args: argparse.Namespace) -> int:
    from zeropilot.checkpoint.export import ExportOptions, export_checkpoint

    options = ExportOptions(tag=args.tag, dtype=args.dtype, max_shard_size=args.max_shard_size,
                            adapter_only=args.adapter_only, merge_into=args.merge_into, force=args.force,
                            trust_pickle=args.trust_pickle, progress=False if args.no_progress else None,
                            follow_symlinks=args.follow_symlinks)
    result = export_checkpoint(args.path, args.out, options)
    if args.format == "json":
        sys.stdout.write(_dumps(export_document(args.path, result)))
        return 0
    print(clean(f"wrote {result.product} to {result.out}: {result.tensors} tensors, {result.bytes / 1e9:.3f} GB "
                f"{result.dtype} in {', '.join(result.files)}"))
    if result.dropped_tied:
        print(clean(f"  tied weights written once (transformers re-ties them): {', '.join(result.dropped_tied)}"))
    if result.copied:
        print(clean(f"  copied: {', '.join(result.copied)}"))
    for note in result.notes:
        print(clean(f"  note: {note}"))
    return 0


def _universal(args: argparse.Namespace) -> int:
    from zeropilot.checkpoint.universal import UniversalOptions, convert, to_json

    options = UniversalOptions(tag=args.tag, force=args.force, trust_pickle=args.trust_pickle,
                               progress=False if args.no_progress else None, follow_symlinks=args.follow_symlinks)
    result = convert(args.path, args.out, options)
    if args.format == "json":
        from zeropilot.envelope import CKPT_UNIVERSAL_SCHEMA, dumps, envelope

        sys.stdout.write(dumps(envelope(CKPT_UNIVERSAL_SCHEMA, to_json(result))))
        return 0
    print(clean(f"wrote the universal checkpoint of {result.tag} (ZeRO-{result.stage}, saved by {result.world_size} "
                f"ranks) to {result.out}: {result.parameters} parameters with {', '.join(result.states)}; "
                f"{result.files} files, {result.bytes / 1e9:.3f} GB"))
    if result.from_module:
        print(clean(f"  {len(result.from_module)} module tensors without optimizer state (frozen, tied or buffers) "
                    f"as fp32 only, as DeepSpeed writes them: {', '.join(result.from_module[:4])}"
                    + (" ..." if len(result.from_module) > 4 else "")))
    print(clean(f"  copied: {', '.join(result.model_files + result.copied)}"))
    for note in result.notes:
        print(clean(f"  note: {note}"))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from zeropilot.checkpoint.verify import verify

    result = verify(args.out, args.against, tag=args.tag, load=args.load, trust_pickle=args.trust_pickle,
                    follow_symlinks=args.follow_symlinks)
    if args.format == "json":
        sys.stdout.write(_dumps(verify_document(args.against, result)))
        return 0 if result.ok else 1
    print(clean(f"compared {result.compared} tensors of {result.out} with {args.against}"))
    for label, names in (("DIFFERENT", result.mismatched), ("missing in OUT", result.missing_in_out),
                         ("not in the checkpoint", result.extra_in_out)):
        for name in names:
            print(clean(f"  {label}: {name}"))
    if result.load:
        print(clean(f"  load: {result.load}"))
    if result.load_error:
        print(clean(f"  load FAILED: {result.load_error}"))
    print("verdict: OK — identical" if result.ok else "verdict: MISMATCH")
    return 0 if result.ok else 1


# ---- JSON: zeropilot.ckpt-export/1 and zeropilot.ckpt-verify/1 (docs/json-schema.md, docs/ckpt-*.schema.json) ----


def _dumps(document: dict) -> str:
    """As ``envelope.dumps``, but ASCII: names from a checkpoint may hold C1 controls (``\\x9b``) that JSON
    leaves raw otherwise (as ``ckpt inspect --format json``)."""
    return json.dumps(document, indent=2, default=str) + "\n"


def export_document(path, result) -> dict:
    """``zeropilot.ckpt-export/1`` for a written export (every key always present; ``problems`` empty)."""
    from zeropilot.envelope import CKPT_EXPORT_SCHEMA, envelope

    return envelope(CKPT_EXPORT_SCHEMA, {
        "verdict": "ok", "path": str(path), "out": str(result.out), "product": result.product,
        "files": list(result.files), "tensors": result.tensors, "bytes": result.bytes, "dtype": result.dtype,
        "dropped_tied": list(result.dropped_tied), "copied": list(result.copied), "notes": list(result.notes),
        "problems": []})


def verify_document(against, result) -> dict:
    """``zeropilot.ckpt-verify/1``: ``verdict`` ``ok`` or ``mismatch`` and what differs."""
    from zeropilot.envelope import CKPT_VERIFY_SCHEMA, envelope

    return envelope(CKPT_VERIFY_SCHEMA, {
        "verdict": "ok" if result.ok else "mismatch", "out": str(result.out), "against": str(against),
        "compared": result.compared, "mismatched": list(result.mismatched),
        "missing_in_out": list(result.missing_in_out), "extra_in_out": list(result.extra_in_out),
        "load": result.load, "load_error": result.load_error, "problems": []})


def _damaged_document(args: argparse.Namespace, exc) -> dict:
    """The export or verify document of a damaged checkpoint: ``verdict`` ``damaged``, ``problems`` says why."""
    from zeropilot.envelope import CKPT_EXPORT_SCHEMA, CKPT_VERIFY_SCHEMA, envelope

    problems = [str(exc)] + [str(f) for f in exc.files]
    if args.ckpt_command == "export":
        return envelope(CKPT_EXPORT_SCHEMA, {
            "verdict": "damaged", "path": str(args.path), "out": None, "product": None, "files": [], "tensors": 0,
            "bytes": 0, "dtype": None, "dropped_tied": [], "copied": [], "notes": [], "problems": problems})
    return envelope(CKPT_VERIFY_SCHEMA, {
        "verdict": "damaged", "out": str(args.out), "against": str(args.against), "compared": 0, "mismatched": [],
        "missing_in_out": [], "extra_in_out": [], "load": None, "load_error": None, "problems": problems})
