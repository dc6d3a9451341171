"""``zeropilot run --heal``: run the launch; when it fails in a way a restart can help, restart it, resuming.

One attempt is one supervised run (:func:`zeropilot.runner.supervise`) in its own run directory: the heal run's root
for the first, ``attempt-K/`` inside it for the others, all written into ``heal.json`` (:mod:`zeropilot.heal.record`).
After each attempt:

1. its report (``runlog``) gives the failure, and :mod:`zeropilot.heal.causes` says whether a restart can help;
2. the no-loop rule (:func:`zeropilot.heal.record.repeated`) and ``--restarts`` may end the healing;
3. an OOM gets the first ranked fix that fits and leaves the training mathematically the same
   (:mod:`zeropilot.heal.fixes`), made on copies of the launch's files (:mod:`zeropilot.heal.patch`); none: it stops;
4. the newest complete checkpoint resumable at the same world size is chosen (:mod:`zeropilot.heal.checkpoints`):
   a Trainer gets it through the guard (``ZEROPILOT_RESUME_FROM``), a raw DeepSpeed loop loads its own ``latest``;
5. after a back-off (``backoff_s`` x 2^(restart-1)), the next attempt starts.

What a restart never changes: the launch's own files (fixes go to copies), the world size, the data, the model, the
precision, unless ``--heal-allow`` names the kind of change. A preempted attempt (SIGTERM/SIGUSR1 to ``zeropilot
run``) ends the healing on this machine: the same ``zeropilot run --heal --out DIR`` later resumes it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.guard.resume import HEAL_ATTEMPT_ENV, RESUME_ENV, STEPS_REDONE_ENV
from zeropilot.heal import causes, checkpoints, fixes, patch, record, shrink
from zeropilot.runlog.layout import RunDir


@dataclass
class HealOptions:
    """What ``--heal`` was asked: restarts at most, the kinds of change allowed, the first back-off."""

    restarts: int = 3
    allow: List[str] = field(default_factory=list)
    backoff_s: float = 10.0


def say(text: str) -> None:
    print(f"zeropilot run: heal: {text}", file=sys.stderr, flush=True)


def prepare(command: List[str], folder: Path, env: Dict[str, str]) -> Tuple[Dict[str, Any], Any, Optional[int]]:
    """``run.json``'s first version for an attempt (check and plan of its command), the launch as read, the world."""
    from zeropilot.runner import runinfo

    folder.mkdir(parents=True, exist_ok=True)
    script = runinfo.write_launch_script(command, folder / "launch.sh", env=dict(os.environ, **env))
    try:
        summary, launch, _ = runinfo.run_check(command, script)
    except InputError as exc:
        summary, launch = {"errors": None, "warnings": None, "codes": [], "skipped": exc.render()}, None
    plan = runinfo.make_plan(launch) if launch is not None else None
    world = getattr(getattr(launch, "world_size", None), "value", None)
    return {"check": summary, "plan": plan}, launch, world


def attempt_report(folder: Path) -> Tuple[Dict[str, Any], Dict[int, List[Dict[str, Any]]], Any]:
    """An attempt's report, its ranks' non-step records and its records."""
    from zeropilot.runlog import read_run, summarize

    records = read_run(folder)
    return summarize(records), {r: rec.events for r, rec in records.ranks.items()}, records


def saves_so_far(root: Path, doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every rank's ``save`` records of every attempt, each with its ``attempt`` and ``here``: the ranks whose records
    that attempt's directory holds (one node's, in a job across nodes)."""
    from zeropilot.runlog import read_run

    out: List[Dict[str, Any]] = []
    for a in doc["attempts"]:
        folder = root / a["dir"]
        try:
            records = read_run(folder)
        except InputError:
            continue
        here = sorted(records.ranks)
        for r, rec in records.ranks.items():
            out.extend(dict(e, attempt=a["attempt"], rank=r, here=here) for e in rec.of("save"))
    return out


def _first_steps(records: Any) -> Optional[int]:
    steps = [int(rec.steps["step"][0]) for rec in records.ranks.values() if rec.n_steps]
    return min(steps) if steps else None


def judge_resume(entry: Dict[str, Any], events: Dict[int, List[Dict[str, Any]]], records: Any) -> Dict[str, Any]:
    """``resumed`` of an attempt: whether its ranks resumed where zeropilot meant them to, in words."""
    chosen = ((entry.get("resume") or {}).get("chosen") or {})
    want = chosen.get("step")
    loads = [e for evs in events.values() for e in evs if e.get("event") == "load" and not e.get("error")]
    loaded = max((e.get("step") for e in loads if isinstance(e.get("step"), int)), default=None)
    gave = [e for evs in events.values() for e in evs if e.get("event") == "resume"]
    first = _first_steps(records)
    start = loaded if loaded is not None else (first - 1 if first is not None else None)
    out: Dict[str, Any] = {"wanted_step": want, "loaded_step": loaded, "first_step": first,
                           "given_by": gave[0].get("given_by") if gave else None}
    if want is None:
        out["really"] = None
        out["note"] = "no complete checkpoint to resume from: the attempt started from step 0"
    elif start is None:
        out["really"] = None
        out["note"] = "the attempt ended before it loaded a checkpoint or finished a step"
    elif start == want:
        out["really"] = True
        out["note"] = f"resumed at step {want}" + (" (the launch's own load_checkpoint)" if not gave else "")
    elif loaded is None and (first or 0) <= 1:
        out["really"] = False
        out["note"] = ("did NOT resume: the script never called load_checkpoint, so it trained from step 1 again "
                       "(a raw DeepSpeed loop resumes only if its own code loads a checkpoint, e.g. "
                       "engine.load_checkpoint(save_dir))")
    else:
        out["really"] = True
        out["note"] = f"resumed at step {start}, not at step {want} which zeropilot chose (the launch's own choice)"
    return out


def fix_record(chosen: fixes.Pick) -> Dict[str, Any]:
    """``fix`` of an attempt: the fix applied, whether it is math-neutral or allowed, what it changed where."""
    fix, applied = chosen.fix, chosen.applied
    return {"key": fix.get("key"), "fix": fix.get("fix"), "change": fix.get("change"), "why": fix.get("why"),
            "evidence": fix.get("evidence"), "neutral": fixes.neutral(fix.get("key")),
            "allowed_by": fixes.needs_allow(fix.get("key")), "passed": chosen.passed,
            "settings": applied.settings, "files": applied.files, "diff": applied.diff}


def finished_outcome(attempts: List[Dict[str, Any]]) -> Tuple[str, str]:
    """``(status, why)`` of a heal run whose last attempt finished after restarts: ``restarted_from_scratch`` when a
    restart did not resume (the script never loaded the checkpoint chosen), or had no complete checkpoint to resume
    from after the failed attempt trained (its steps lost); ``healed`` otherwise."""
    cold = [a for a in attempts if (a.get("resumed") or {}).get("really") is False]
    if cold:
        return "restarted_from_scratch", f"finished, but attempt {cold[0]['attempt']} " + cold[0]["resumed"]["note"]
    bare = [a for a in attempts[1:] if (a.get("resumed") or {}).get("really") is None
            and (a.get("resumed") or {}).get("wanted_step") is None and (a.get("steps_redone") or 0) > 0]
    if bare:
        return "restarted_from_scratch", (f"finished, but attempt {bare[0]['attempt']} started from step 0: no "
                                          f"complete checkpoint to resume from, {bare[0]['steps_redone']} step(s) "
                                          "trained again")
    last = attempts[-1]["attempt"]
    return "healed", f"finished in attempt {last} after {last - 1} restart(s)"


class Healer:
    """The restart loop over one heal run directory."""

    def __init__(self, root: Path, command: List[str], opts: HealOptions, run_options: Any, plan_record: Any,
                 first_record: Optional[Dict[str, Any]] = None) -> None:
        self.root = root
        self.command = command
        self.opts = opts
        self.run_options = run_options  # RunOptions of the first attempt: the loop copies it per attempt
        self.plan_record = plan_record  # callable(command, check/plan, world) -> run.json's first version
        self.first_record = first_record  # run.json's first version of attempt 1, made by `zeropilot run` itself
        self.doc = record.load(root) or record.new(command, opts.restarts, opts.allow, opts.backoff_s)
        self.doc.update(restarts=opts.restarts, allow=sorted(opts.allow), backoff_s=opts.backoff_s)
        self.base = len(self.doc["attempts"])  # attempts of earlier `zeropilot run --heal` on this directory

    # -- one attempt ------------------------------------------------------------------------------------------
    def run_attempt(self, entry: Dict[str, Any]) -> Dict[str, Any]:
        from dataclasses import replace

        from zeropilot.runner import supervise

        folder = self.root / entry["dir"]
        folder.mkdir(parents=True, exist_ok=True)
        if entry["attempt"] == 1 and self.first_record is not None:
            run_record, world = self.first_record, self.run_options.world_size
        else:
            prepared, _, world = prepare(entry["command"], folder, entry["env"])
            run_record = self.plan_record(entry["command"], prepared, world)
        run_record = dict(run_record, heal={"attempt": entry["attempt"], "root": str(self.root)})
        env: Dict[str, Optional[str]] = dict(entry["env"])
        env[HEAL_ATTEMPT_ENV] = str(entry["attempt"])
        env[RESUME_ENV] = ((entry.get("resume") or {}).get("give") or None)
        env[STEPS_REDONE_ENV] = str(entry.get("steps_redone")) if entry.get("steps_redone") is not None else None
        opts = replace(self.run_options, command=entry["command"], out=folder, world_size=world, env=env,
                       run_file=None if entry["attempt"] > 1 else self.run_options.run_file)
        record.save(self.root, self.doc)
        return supervise(opts, run_record)

    def finish_attempt(self, entry: Dict[str, Any], end: Dict[str, Any]) -> causes.Failure:
        summary, events, records = attempt_report(self.root / entry["dir"])
        failure = causes.failure_of(summary, events, end.get("preempted"))
        entry.update(ended_at=time.time(), exit_code=end.get("exit_code"), failure=failure.to_dict(),
                     world_size=summary.get("world_size") or len(records.ranks) or None)
        if entry["attempt"] > 1:
            entry["resumed"] = judge_resume(entry, events, records)
        record.save(self.root, self.doc)
        return failure

    # -- between attempts -------------------------------------------------------------------------------------
    def next_attempt(self, last: Dict[str, Any], failure: causes.Failure, asked: bool = False
                     ) -> Optional[Dict[str, Any]]:
        """The next attempt's entry, or None with ``outcome`` set when the healing ends here.

        ``asked``: the user ran ``zeropilot run --heal`` again on this directory: the last failure is restarted
        whatever its kind (an OOM still only with a fix), and the no-loop rule starts afresh."""
        restarts_done = len(self.doc["attempts"]) - max(self.base, 1)
        if asked:
            stop = None
        else:
            stop = (None if failure.restart else failure.why) or record.repeated(self.doc["attempts"],
                                                                                   failure.to_dict())
        if stop is None and restarts_done >= self.opts.restarts:
            stop = f"{self.opts.restarts} restart(s) used (--restarts {self.opts.restarts})"
        if stop is not None:
            self._end("stopped", stop, last)
            return None
        number = last["attempt"] + 1
        folder = os.path.relpath(RunDir(self.root).attempt_dir(number), self.root)
        in_force = list(last.get("in_force") or [])
        # an earlier `zeropilot run` wrote what the last attempt ran: its fixes are made again on this command, never
        # a command read from the directory
        command, env = (self.remake(in_force, number) if asked else (last["command"], dict(last["env"])))
        last = dict(last, command=command, env=env)
        extra: Dict[str, Any] = {}
        if shrink.is_lost(failure):  # a lost node: the survivors restart smaller (--heal-allow shrink), or wait
            smaller, extra = self.lost_node(last, failure, number, folder, restarts_done)
            if smaller is not None:
                return smaller
        fix_entry = None
        if failure.kind == "oom":
            chosen = self.pick_fix(last, number)
            if chosen.fix is None:
                self._end("stopped", "out of memory and no fix to apply: " + chosen.stop_reason, last,
                          passed=chosen.passed)
                return None
            command, env, fix_entry = chosen.applied.command, chosen.applied.env, fix_record(chosen)
            in_force.append({"key": chosen.fix.get("key"), "change": chosen.fix.get("change")})
            chosen.applied.write()
        world = last.get("world_size")
        choice = checkpoints.choose(saves_so_far(self.root, self.doc), world)
        resume = self.resume_entry(choice)
        if shrink.shrunk(in_force):  # after a restart on fewer nodes: its universal checkpoint, or a newer save
            copies = RunDir(RunDir(self.root).attempt_dir(number)).launch_copies
            command, env, resume = shrink.resume_after(self.doc["attempts"], choice, resume, command, env, copies,
                                                       lambda: prepare(command, self.root / last["dir"], env)[1])
        redone = None if failure.step is None else failure.step - ((resume.get("chosen") or {}).get("step") or 0)
        wait = record.backoff(self.opts.backoff_s, restarts_done + 1)
        return record.start_attempt(self.doc, number, folder, command, env, fix=fix_entry, in_force=in_force,
                                    resume=resume, steps_redone=max(redone, 0) if redone is not None else None,
                                    backoff_s=wait, cause=failure.to_dict(), **extra)

    def lost_node(self, last: Dict[str, Any], failure: causes.Failure, number: int, folder: str,
                  restarts_done: int) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
        """After a lost node: the next attempt on the surviving nodes (:func:`zeropilot.heal.shrink.decide`), or
        ``(None, {"node_wait": ...})``: the same launch restarts and waits for the node."""
        summary, events, records = attempt_report(self.root / last["dir"])
        verdict = {**(summary.get("verdict") or {}), **((records.hang or {}).get("verdict") or {})}  # nodes_lost
        setups = [e for evs in events.values() for e in evs if e.get("event") == "setup"]
        plan, resume = shrink.decide(self.opts.allow, verdict, setups, last, RunDir(self.root).attempt_dir(number),
                                     lambda: prepare(last["command"], self.root / last["dir"], last["env"])[1],
                                     lambda: saves_so_far(self.root, self.doc), self.run_options.hang_timeout_s)
        if plan is None:
            say(f"node lost, not shrinking: {resume['why']}; {resume['what']}")
            return None, {"node_wait": resume}
        say(shrink.says(plan))
        step = resume["chosen"]["step"] or 0
        in_force = list(last.get("in_force") or []) + [{"key": "shrink", "change": {"nodes_lost": plan.lost.nodes}}]
        entry = record.start_attempt(self.doc, number, folder, plan.command, plan.env, fix=None, in_force=in_force,
                                     resume=resume, shrink=plan.to_dict(),
                                     steps_redone=None if failure.step is None else max(failure.step - step, 0),
                                     backoff_s=record.backoff(self.opts.backoff_s, restarts_done + 1),
                                     cause=failure.to_dict())
        return entry, {}

    def remake(self, in_force: List[Dict[str, Any]], number: int) -> Tuple[List[str], Dict[str, str]]:
        """The command and environment of ``self.command`` with the fixes in force made again (copies in the next
        attempt's ``launch/``)."""
        command: List[str] = list(self.command)
        env: Dict[str, str] = {}
        folder = RunDir(self.root).attempt_dir(number)
        for fix in in_force:
            if (fix or {}).get("key") == "shrink":
                raise InputError("an earlier attempt went on with fewer nodes (--heal-allow shrink): going on with "
                                 "this directory would mix world sizes; start the job again in a new run directory",
                                 path=RunDir(self.root).heal_file)
            _, launch, _ = prepare(command, folder, env)
            made = patch.apply((fix or {}).get("change") or {}, command, env, launch, RunDir(folder).launch_copies) \
                if launch is not None else "zeropilot could not read the launch"
            if isinstance(made, str):
                raise InputError(f"the fix {fix.get('key')!r} an earlier attempt applied cannot be made again: {made}",
                                 path=RunDir(self.root).heal_file)
            made.write()
            command, env = made.command, made.env
        return command, env

    def pick_fix(self, last: Dict[str, Any], number: int) -> fixes.Pick:
        """The fix for an OOM of the last attempt: from its first OOM record's ranked fixes."""
        from zeropilot.runlog import read_run

        records = read_run(self.root / last["dir"])
        first = min(records.ooms.values(), key=lambda o: (o.get("t") or 0, o.get("rank") or 0)) if records.ooms \
            else {}
        ranked = [f for f in (first.get("fixes") or []) if isinstance(f, dict)]
        folder = RunDir(self.root).attempt_dir(number)  # the next attempt's: its launch.sh, its copies
        _, launch, _ = prepare(last["command"], folder, last["env"])
        copies = RunDir(folder).launch_copies

        def apply(fix: Dict[str, Any]) -> Any:
            if launch is None:
                return "zeropilot could not read the launch"
            return patch.apply(fix.get("change") or {}, last["command"], last["env"], launch, copies)

        return fixes.pick(ranked, self.opts.allow, apply, last.get("in_force") or [])

    @staticmethod
    def resume_entry(choice: checkpoints.Choice) -> Dict[str, Any]:
        """``resume`` of the next attempt: the choice, the path the guard gives a Trainer, how it is resumed."""
        c = choice.chosen
        give = str(c.path) if c is not None and c.framework == "hf" else None
        how = ("none: no complete checkpoint, the attempt starts from step 0" if c is None else
               "the guard passes it to Trainer.train (resume_from_checkpoint)" if give else
               "the script's own load_checkpoint (DeepSpeed reads `latest`); the report says whether it did")
        return dict(choice.to_dict(), give=give, how=how)

    def _end(self, status: str, why: str, last: Dict[str, Any], **extra: Any) -> None:
        """The healing ends here: ``outcome`` written."""
        self.doc["outcome"] = {"status": status, "why": why, "exit_code": last.get("exit_code"), **extra}
        record.save(self.root, self.doc)

    # -- the loop ---------------------------------------------------------------------------------------------
    def run(self, first: Dict[str, Any]) -> Dict[str, Any]:
        entry = first
        while True:
            if entry.get("backoff_s"):
                say(f"attempt {entry['attempt']} in {entry['backoff_s']:g} s")
                if not _sleep(entry["backoff_s"]):
                    return self._stopped_by_signal(entry)
            self.announce(entry)
            end = self.run_attempt(entry)
            failure = self.finish_attempt(entry, end)
            if failure.kind == "ok":
                return self._done(entry)
            if failure.kind == "preempted":
                self._end("preempted", failure.why, entry)
                say(f"attempt {entry['attempt']} {failure.why}")
                return self.doc
            say(f"attempt {entry['attempt']} failed: {failure.kind}" + (f" ({failure.cls})" if failure.cls else "")
                + (f" after step {failure.step}" if failure.step is not None else "") + f": {failure.why}")
            nxt = self.next_attempt(entry, failure)
            if nxt is None:
                say(f"healing stopped: {self.doc['outcome']['why']}")
                return self.doc
            entry = nxt

    def announce(self, entry: Dict[str, Any]) -> None:
        if entry["attempt"] == 1:
            return
        fix = entry.get("fix")
        if fix:
            say(f"fix for attempt {entry['attempt']}: {fix['fix']} — {'; '.join(fix.get('settings') or [])}")
        chosen = (entry.get("resume") or {}).get("chosen")
        for s in (entry.get("resume") or {}).get("skipped") or []:
            say(f"skipped checkpoint {s['path']} ({s['tag']}): {s['why_not']}")
        say(f"attempt {entry['attempt']} resumes from " + (f"{chosen['path']} ({chosen['tag']}, step {chosen['step']})"
                                                           if chosen else "nothing (no complete checkpoint)"))

    def _done(self, entry: Dict[str, Any]) -> Dict[str, Any]:
        if entry["attempt"] == 1:
            self._end("finished", "every rank finished; nothing to heal", entry)
            return self.doc
        self._end(*finished_outcome(self.doc["attempts"]), entry)
        say(self.doc["outcome"]["why"])
        return self.doc

    def _stopped_by_signal(self, entry: Dict[str, Any]) -> Dict[str, Any]:
        self.doc["attempts"].remove(entry)
        last = self.doc["attempts"][-1]
        self._end("stopped", "a signal came during the back-off: no restart", last)
        return self.doc


def _sleep(seconds: float) -> bool:
    """Wait; False when SIGINT/SIGTERM/SIGHUP/SIGUSR1 came meanwhile (the healing stops)."""
    got: List[int] = []
    previous = {}

    def stop(signum, _frame):
        got.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        previous[sig] = signal.signal(sig, stop)
    try:
        deadline = time.time() + seconds
        while not got and time.time() < deadline:
            time.sleep(min(0.2, max(deadline - time.time(), 0)))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return not got
