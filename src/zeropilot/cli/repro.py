"""``zeropilot repro``: the smallest train → save → train → resume run of a launch, with an exact-resume check."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from zeropilot import extras
from zeropilot.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "repro", help="train, save, resume in a new process group: is the resume exact, what do saves cost",
        description="Run the smallest train -> save -> train -> stop -> resume (new process group) -> train of a "
                    "launch with random weights, check that the resume is exact, and measure memory around saves.")
    p.add_argument("launch", nargs="?", default=".", metavar="LAUNCH_PATH",
                   help="folder or files of the launch (default: .)")
    p.add_argument("--model", metavar="CONFIG|NAME",
                   help="config.json, model folder, Hub id or catalogued name (default: the launch's model)")
    p.add_argument("--nproc", type=int, metavar="N", help="ranks (default: the launch's world size)")
    p.add_argument("--cpu", action="store_true", help="run on CPU (gloo); shrinks the model unless --full-size")
    p.add_argument("--full-size", action="store_true", help="with --cpu: keep the model's real size")
    p.add_argument("--gpu-mem-cap", metavar="SIZE", help="emulate a card of SIZE (16GiB) on a larger GPU")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps of the uninterrupted run (default 12)")
    p.add_argument("--save-every", type=int, default=4, metavar="N", help="save every N steps (default 4)")
    p.add_argument("--resume-from", type=int, metavar="STEP", help="the save to resume from (default: the first)")
    p.add_argument("--resume-nproc", type=int, metavar="N", help="ranks of the resumed run (default: --nproc)")
    p.add_argument("--resume-via", choices=("universal", "zero"),
                   help="resume from the save converted by `zeropilot ckpt universal` (load_universal: the default "
                        "when --resume-nproc differs from --nproc), or from the ZeRO checkpoint itself (DeepSpeed "
                        "refuses it on another world size: shows the error a plain resume gets)")
    p.add_argument("--no-resume", action="store_true", help="only train and save (memory around saves)")
    p.add_argument("--leave-out", metavar="PARTS", default="",
                   help="what the resume does not restore, as a checkpoint without it: optimizer,scheduler,rng,data")
    p.add_argument("--lora-rank", type=int, metavar="R", help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--seq-len", type=int, metavar="N")
    p.add_argument("--micro-batch", type=int, metavar="N")
    p.add_argument("--grad-accum", type=int, metavar="N")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--out", type=Path, metavar="DIR", help="run directory (default: a new temporary folder)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the checkpoints in the run directory")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S", help="limit per leg in seconds")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace):
    from zeropilot.repro.spec import Options

    cap = None
    if args.gpu_mem_cap:
        if args.cpu:
            raise InputError("--gpu-mem-cap emulates a smaller GPU: it does not go with --cpu")
        from zeropilot.memory.inputs import parse_gpus

        try:
            cap = parse_gpus(f"1x{args.gpu_mem_cap}").gpu_bytes
        except InputError:
            raise InputError(f"--gpu-mem-cap {args.gpu_mem_cap!r}: expected a size such as 16GiB") from None
    for name in ("nproc", "resume_nproc", "seq_len", "micro_batch", "grad_accum", "steps", "save_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.full_size and not args.cpu:
        raise InputError("--full-size only matters with --cpu (a GPU run keeps the model's size)")
    leave = tuple(p.strip() for p in args.leave_out.split(",") if p.strip())
    return Options(nproc=args.nproc, cpu=args.cpu, gpu_mem_cap=cap, steps=args.steps, save_every=args.save_every,
                   resume_from=args.resume_from, resume_nproc=args.resume_nproc, lora_rank=args.lora_rank,
                   seq_len=args.seq_len, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
                   full_size=args.full_size, leave_out=leave, resume=not args.no_resume, resume_via=args.resume_via)


def _need_gpus(ranks: int) -> None:
    """Refuse a GPU run this machine cannot start (one GPU per rank), before any process is launched."""
    from zeropilot.launch.hardware import visible_gpus

    found = visible_gpus()
    count = int(found.split("x", 1)[0]) if found else 0
    if count < ranks:
        raise InputError(f"{ranks} rank(s) need {ranks} visible NVIDIA GPU(s), this machine shows {count}: "
                         "pass --cpu (and --nproc), or fewer ranks")


def run(args: argparse.Namespace) -> int:
    from zeropilot.repro.prepare import prepare
    from zeropilot.repro.render import render
    from zeropilot.repro.run import clear_run_dir, run_cases

    opts = _options(args)
    spec, check_summary = prepare([args.launch], args.model, opts)
    extras.need("repro", "trains in worker processes with torch, DeepSpeed and transformers" +
                (" (and PEFT: the launch trains LoRA)" if spec.lora else ""), "repro",
                ["torch", "deepspeed", "transformers"] + (["peft"] if spec.lora else []))
    if not args.cpu:
        _need_gpus(max(spec.nproc, spec.resume_nproc))
    out = args.out or Path(tempfile.mkdtemp(prefix="zeropilot-repro-"))
    clear_run_dir(out)
    if args.format == "text":
        print(f"check: {check_summary['errors']} error(s), {check_summary['warnings']} warning(s)"
              + (f" ({', '.join(check_summary['codes'])})" if check_summary["codes"] else "")
              + f"; running {spec.nproc} rank(s), resume on {spec.resume_nproc} ...", file=sys.stderr)
    verdict = run_cases([(spec, out.resolve())], timeout=args.timeout, command=["zeropilot", "repro"] + sys.argv[2:],
                        check=check_summary, keep_checkpoints=args.keep_checkpoints)[0]
    if args.format == "json":
        from zeropilot.envelope import dumps, rewrap

        sys.stdout.write(dumps(rewrap(verdict)))
    else:
        sys.stdout.write(render(verdict))
    if verdict["failures"]:
        return 1
    return 0 if verdict["resume_exact"] in (True, None) else 1
