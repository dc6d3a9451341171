"""``zeropilot run --heal``: the restart loop behind ``zeropilot run`` (:mod:`zeropilot.heal.loop`), its output and
exit status, and going on with a run directory that holds an earlier run (preempted, stopped, or a plain run).

``cli.run`` parses and checks the options and hands over ``Run``: its hang-timeout rule and its standard-output
redirection, so that this module does not import it back."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from zeropilot.errors import InputError
from zeropilot.runlog.layout import RunDir

DONE = ("finished", "healed", "restarted_from_scratch")


@dataclass
class Run:
    """What ``zeropilot run`` gives the heal loop: its arguments and two of its rules."""

    args: argparse.Namespace
    hang_timeout: Callable[[Optional[float], Optional[dict]], float]  # cli.run.hang_timeout
    quiet_stdout: Callable[[bool], Any]  # cli.run._stdout_to_stderr


def existing(out: Optional[Path]) -> Optional[Path]:
    """The run directory ``--out`` names when it already holds a run (``heal.json`` or ``run.json``), else None."""
    from zeropilot.runlog.layout import RunDir

    if out is None or not Path(out).is_dir():
        return None
    d = RunDir(Path(out).resolve())
    return d.root if d.heal_file.exists() or d.run_file.exists() else None


def _plan_record(run: Run):
    """run.json's first version for an attempt after the first (its own check and plan)."""
    from zeropilot.runner import runinfo

    def make(command: List[str], prepared: Dict[str, Any], world: Optional[int]) -> Dict[str, Any]:
        timeout = run.hang_timeout(run.args.hang_timeout, prepared.get("plan"))
        return runinfo.run_record(command, prepared.get("check"), prepared.get("plan"), world, timeout, "stop", None)
    return make


def first(run: Run, opts: Any, run_record: Dict[str, Any], heal_opts: Any) -> int:
    """A new heal run: attempt 1 in ``--out`` (already claimed and checked by ``zeropilot run``)."""
    from zeropilot.heal import record
    from zeropilot.heal.loop import Healer

    healer = Healer(opts.out, opts.command, heal_opts, opts, _plan_record(run), first_record=run_record)
    entry = record.start_attempt(healer.doc, 1, ".", opts.command, {}, fix=None, in_force=[], resume=None,
                                 steps_redone=None, backoff_s=0)
    return _run(run, healer, entry)


def go_on(run: Run, command: List[str], heal_opts: Any, root: Path) -> int:
    """Heal a run directory that holds an earlier run of the same command: the next attempt resumes it."""
    from zeropilot.heal import causes, record
    from zeropilot.heal.loop import Healer
    from zeropilot.runner import RunOptions

    doc = record.load(root)
    if doc is not None and doc.get("command") != command:
        raise InputError("this run directory heals another command: give the same command, or another --out",
                         path=root)
    opts = RunOptions(command=command, out=root, hang_timeout_s=run.hang_timeout(run.args.hang_timeout, None),
                      on_hang="stop", memory_history=run.args.memory_history,
                      preempt_grace_s=run.args.preempt_grace,
                      timeouts_file=RunDir(root).timeouts_file)  # what the earlier attempts learned
    healer = Healer(root, command, heal_opts, opts, _plan_record(run))
    if doc is None:
        _adopt(healer, command)
    status = (healer.doc.get("outcome") or {}).get("status")
    if status in DONE:
        raise InputError(f"this run already finished ({status}): nothing to heal; pick another --out", path=root)
    last = healer.doc["attempts"][-1]
    failure = causes.Failure.from_dict(last.get("failure") or {})
    if failure.kind == "ok":
        raise InputError("this run already finished: nothing to heal; pick another --out", path=root)
    healer.doc["outcome"] = {"status": "running", "why": None, "exit_code": None}
    nxt = healer.next_attempt(last, failure, asked=True)
    if nxt is None:
        return _report(run.args, healer)
    return _run(run, healer, nxt)


def _adopt(healer: Any, command: List[str]) -> None:
    """A plain run directory (run.json, no heal.json) becomes attempt 1 of this heal run."""
    from zeropilot import safefile
    from zeropilot.heal import record
    from zeropilot.runlog.layout import RunDir

    run = safefile.read_json(RunDir(healer.root).run_file, record.MAX_HEAL_FILE, "run.json")
    if not isinstance(run, dict) or run.get("command") != command:
        raise InputError("this run directory holds a run of another command: give the same command, or another "
                         "--out", path=healer.root)
    if "ended_at" not in run:
        raise InputError("the run in this directory has not ended (or its supervisor died): nothing to heal yet",
                         path=healer.root)
    entry = record.start_attempt(healer.doc, 1, ".", command, {}, fix=None, in_force=[], resume=None,
                                 steps_redone=None, backoff_s=0)
    entry["started_at"] = run.get("started_at")
    healer.finish_attempt(entry, run)


def _run(run: Run, healer: Any, entry: Dict[str, Any]) -> int:
    try:
        with run.quiet_stdout(run.args.format == "json"):
            healer.run(entry)
    except FileNotFoundError:
        raise InputError(f"cannot start {entry['command'][0]!r}: no such program") from None
    return _report(run.args, healer)


def _report(args: argparse.Namespace, healer: Any) -> int:
    """Print the last attempt's report with the heal timeline; the exit status of the whole heal run."""
    from zeropilot.runlog import read_run, summarize
    from zeropilot.runlog.heal import section

    doc = healer.doc
    last = doc["attempts"][-1]
    summary = summarize(read_run(healer.root / last["dir"]))
    summary["heal"] = section(doc)
    sys.stdout.flush()
    if args.format == "json":
        from zeropilot.cli.report import render_json

        sys.stdout.write(render_json(summary))
    else:
        from zeropilot.runlog.text import render

        sys.stdout.write(render(summary))
    return exit_status(doc)


def exit_status(doc: Dict[str, Any]) -> int:
    """0 when the job finished; 128 + N when signal N preempted it; else the last attempt's (1 if that was 0)."""
    outcome = doc.get("outcome") or {}
    last = doc["attempts"][-1] if doc.get("attempts") else {}
    code = last.get("exit_code")
    if outcome.get("status") in DONE:
        return int(code or 0)
    if outcome.get("status") == "preempted":
        name = (last.get("failure") or {}).get("class")
        sig = getattr(signal, str(name), None) if isinstance(name, str) and name.startswith("SIG") else None
        return 128 + int(sig) if sig is not None else 1
    return int(code) if isinstance(code, int) and code != 0 else 1
