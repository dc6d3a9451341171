"""``zeropilot run -- COMMAND ...``: run a launch unmodified with the guard in every rank, then summarise it."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Tuple

from zeropilot import extras
from zeropilot.errors import InputError
from zeropilot.safefile import check_output

DEFAULT_HANG_TIMEOUT_S = 300.0
MIN_HANG_TIMEOUT_S = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="run a launch with the guard in every rank: records, OOM forensics, hang watchdog",
        description="Run COMMAND (deepspeed, torchrun, accelerate launch, llamafactory-cli, python) unmodified, "
                    "with zeropilot's guard inside every rank; write the run directory and print its summary.",
        usage="zeropilot run [--out DIR] [--no-check] [--hang-timeout S] [--timeouts-from DIR] "
              "[--on-hang report|stop] [--memory-history] [--metrics max|ranks|off] [--format text|json] "
              "[--preempt-grace S] [--heal [--restarts N] [--heal-allow KIND] [--heal-backoff S]] -- COMMAND ...")
    p.add_argument("--out", type=Path, metavar="DIR", help="run directory (default: zeropilot-runs/<time>)")
    p.add_argument("--no-check", action="store_true", help="start even when `check` finds errors")
    p.add_argument("--hang-timeout", type=float, metavar="S",
                   help="seconds without progress on any rank before the watchdog reports, in a section (start-up, "
                        "first step, step, save, load) not seen yet (default: from the plan's save time, else 300); "
                        "once seen, the section's own durations set its deadline (docs/run.md)")
    p.add_argument("--timeouts-from", type=Path, metavar="DIR",
                   help="start from the section durations an earlier run learned: its run directory (its "
                        "timeouts.json, else its records) or a timeouts.json")
    p.add_argument("--on-hang", choices=("report", "stop"), default="report",
                   help="after reporting a hang: let the job run on (report) or end it (stop)")
    p.add_argument("--memory-history", action="store_true",
                   help="record allocation history; an OOM writes a snapshot for PyTorch's memory_viz")
    p.add_argument("--metrics", choices=("max", "ranks", "off"),
                   help="the guard's figures in the job's own trackers (the Trainer's report_to, DeepSpeed's "
                        "monitor) under zeropilot/: the max over ranks (max, the default), also each rank's "
                        "(ranks), or none (off); docs/metrics.md")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: print the report (zeropilot.report/1, as `zeropilot report DIR --format json`); "
                        "the launch's own standard output then goes to standard error")
    p.add_argument("--preempt-grace", type=float, default=120.0, metavar="S",
                   help="on SIGTERM or SIGUSR1, HF Trainer ranks save at a step and stop; the job is stopped after "
                        "S seconds whatever it did (default 120)")
    p.add_argument("--heal", action="store_true",
                   help="restart the launch when it fails in a way a restart can help (a rank killed, a hang the "
                        "watchdog stopped, an OOM with a fix that leaves the training the same), resuming from the "
                        "newest complete checkpoint; on a DIR that holds a run, go on healing it (docs/run.md)")
    p.add_argument("--restarts", type=int, default=3, metavar="N", help="with --heal: restarts at most (default 3)")
    p.add_argument("--heal-allow", action="append", default=[], metavar="KIND",
                   help="with --heal: also apply fixes of this kind, which change the data or the model: "
                        "seq_len (a shorter maximum length), packing; shrink (restart on fewer nodes). Repeatable")
    p.add_argument("--heal-backoff", type=float, default=10.0, metavar="S",
                   help="with --heal: seconds before the first restart, doubled for each further one (default 10)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the launch")
    p.set_defaults(func=run)


def _out_dir(out: Optional[Path]) -> Tuple[Path, bool]:
    """The run directory, made if missing, and whether it was empty (a node of a job across nodes may share
    one that other nodes already write: :func:`_claim` decides)."""
    if out is None:
        out = Path("zeropilot-runs") / time.strftime("%Y%m%d-%H%M%S")
    check_output(out, "dir")  # a file, FIFO or device there: never used as a run directory
    empty = not out.exists() or not any(out.iterdir())
    out.mkdir(parents=True, exist_ok=True)
    return out.resolve(), empty


def _claim(out: Path, empty: bool, node: Optional[dict]) -> Tuple[Optional[Path], Path]:
    """(run.json path or None for DIR/run.json, launch script path) for this supervisor; an input error when the
    directory belongs to another run. A node of a launch across nodes (``node.file_key``) may share a directory
    with the other nodes' supervisors: only its own ``run-node-<key>.json`` must be new."""
    from zeropilot.runlog.layout import RunDir

    key = (node or {}).get("file_key")
    if key is None:
        if not empty:
            raise InputError("the run directory exists and is not empty: pick another --out", path=out)
        return None, out / "launch.sh"
    run_file = RunDir(out).node_run_file(key)
    if run_file.exists() or (RunDir(out).run_file.exists()):
        raise InputError(f"the run directory already holds a run of node {key} (or a one-node run): pick "
                         "another --out", path=out)
    return run_file, out / f"launch-node-{key}.sh"


def hang_timeout(flag: Optional[float], plan: Optional[dict]) -> float:
    """--hang-timeout, else twice the plan's save time plus a minute (at least the default), else 300 s."""
    if flag is not None:
        if flag < MIN_HANG_TIMEOUT_S:
            raise InputError(f"--hang-timeout must be at least {MIN_HANG_TIMEOUT_S:g} s, got {flag:g}")
        return flag
    save = ((plan or {}).get("checkpoint") or {}).get("save_seconds")
    if isinstance(save, (int, float)) and save > 0:
        return max(DEFAULT_HANG_TIMEOUT_S, 2 * float(save) + 60)
    return DEFAULT_HANG_TIMEOUT_S


def _timeouts_from(source: Optional[Path]):
    """``--timeouts-from``: the learned timeouts of an earlier run (an input error when unreadable), or None."""
    if source is None:
        return None
    from zeropilot.runlog import timeouts

    return timeouts.load_source(source)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """While active, file descriptor 1 (inherited by the launch) is standard error: stdout stays JSON only."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _summary(out: Path, fmt: str) -> str:
    """The run's report: the text summary, or the ``zeropilot.report/1`` document in the envelope."""
    from zeropilot.runlog import read_run, summarize

    summary = summarize(read_run(out))
    if fmt == "json":
        from zeropilot.cli.report import render_json

        return render_json(summary)
    from zeropilot.runlog.text import render

    return render(summary)


def _heal_options(args: argparse.Namespace):
    """``--heal``'s options, checked: an unknown kind or a negative count is an input error."""
    from zeropilot.heal.fixes import ALLOW_WORDS
    from zeropilot.heal.loop import HealOptions

    unknown = [w for w in args.heal_allow if w not in ALLOW_WORDS]
    if unknown:
        raise InputError(f"--heal-allow {unknown[0]!r}: not a kind of change zeropilot knows (one of "
                         f"{', '.join(ALLOW_WORDS)})")
    if args.restarts < 0 or args.heal_backoff < 0 or args.preempt_grace < 0:
        raise InputError("--restarts, --heal-backoff and --preempt-grace must be 0 or more")
    if not args.heal and (args.heal_allow or args.restarts != 3 or args.heal_backoff != 10.0):
        raise InputError("--restarts, --heal-allow and --heal-backoff go with --heal")
    return HealOptions(restarts=args.restarts, allow=list(args.heal_allow), backoff_s=args.heal_backoff)


def _no_program(program: str) -> InputError:
    return InputError(f"cannot start {program!r}: no such program{extras.program_hint(program)}")


def run(args: argparse.Namespace) -> int:
    from zeropilot.runlog.layout import RunDir
    from zeropilot.runner import RunOptions, supervise
    from zeropilot.runner import runinfo

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("no command: zeropilot run [options] -- COMMAND ...")
    heal_opts = _heal_options(args)
    if shutil.which(command[0]) is None:  # said before the run directory is made
        raise _no_program(command[0])
    learned = _timeouts_from(args.timeouts_from)  # a bad one too
    if args.heal:
        from zeropilot.cli import run_heal

        if args.on_hang == "report" and "--on-hang" in sys.argv:
            print("zeropilot run: --heal stops a hung job to restart it: --on-hang report is not kept",
                  file=sys.stderr)
        args.on_hang = "stop"
        existing = run_heal.existing(args.out)
        if existing is not None:
            return run_heal.go_on(run_heal.Run(args, hang_timeout, _stdout_to_stderr), command, heal_opts, existing)
    out, empty = _out_dir(args.out)
    script = runinfo.write_launch_script(command, out / f".launch-{os.getpid()}.sh")
    check_summary, launch, errors, plan = None, None, [], None
    try:
        try:
            check_summary, launch, errors = runinfo.run_check(command, script)
        except InputError as exc:
            check_summary = {"errors": None, "warnings": None, "codes": [], "skipped": exc.render()}
        node = runinfo.node_record(launch)
        run_file, final = _claim(out, empty, node)
        os.replace(script, final)
    finally:
        script.unlink(missing_ok=True)
    unread = getattr(launch, "read_errors", None)
    if unread and not args.no_check:  # a file the job reads and check cannot (empty, not valid): the job fails on it
        raise InputError(f"check: {unread[0].render()}; fix it or pass --no-check (run directory: {out})")
    if errors and not args.no_check:
        for line in errors:
            print(f"zeropilot run: check: {line}", file=sys.stderr)
        print(f"zeropilot run: `check` found {len(errors)} error(s); fix them or pass --no-check "
              f"(run directory: {out})", file=sys.stderr)
        return 1
    if learned is not None:  # copied into this run: the source is never written
        from zeropilot.runlog import timeouts

        timeouts.write(RunDir(out).timeouts_file, learned)
    if launch is not None:
        plan = runinfo.make_plan(launch)
    world = getattr(getattr(launch, "world_size", None), "value", None)
    timeout = hang_timeout(args.hang_timeout, plan)
    record = runinfo.run_record(command, check_summary, plan, world, timeout, args.on_hang, node)
    opts = RunOptions(command=command, out=out, hang_timeout_s=timeout, on_hang=args.on_hang,
                      memory_history=args.memory_history, world_size=world,
                      torch_version=record["versions"].get("torch"), run_file=run_file,
                      timeouts_file=RunDir(out).timeouts_file,  # named here: copies for later attempts keep it
                      preempt_grace_s=args.preempt_grace)
    if args.metrics:  # the launch inherits this environment; rank 0's guard reads it
        from zeropilot.guard.metrics import MODE_ENV

        os.environ[MODE_ENV] = args.metrics
    if args.heal:
        from zeropilot.cli import run_heal

        return run_heal.first(run_heal.Run(args, hang_timeout, _stdout_to_stderr), opts, record, heal_opts)
    try:
        with _stdout_to_stderr(args.format == "json"):
            end = supervise(opts, record)
    except FileNotFoundError:
        raise _no_program(command[0]) from None
    sys.stdout.flush()
    sys.stdout.write(_summary(out, args.format))
    return _exit_code(end, out)


def _exit_code(end: dict, out: Path) -> int:
    """The command's exit status; after a preemption, 128 + the signal's number, with how to resume."""
    import signal as signals

    pre = end.get("preempted")
    if not pre:
        return int(end["exit_code"])
    saved = pre.get("saved_step")
    print(f"zeropilot run: preempted ({pre.get('signal')}): " + (f"every rank saved at step {saved}; " if saved is not None
          else f"no save ({pre.get('why')}); ") + f"resume with `zeropilot run --heal --out {out} -- ...` and the "
          "same command", file=sys.stderr)
    return 128 + int(getattr(signals, str(pre.get("signal")), signals.SIGTERM))
