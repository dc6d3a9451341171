"""Which failure a restart can help: a pure function of one attempt's report (no torch, no I/O).

The report's verdict (``runlog.summary``: ``ok``, ``oom``, ``hang``, ``crash``) and the attempt's records say what
ended the attempt; :func:`failure_of` turns that into a :class:`Failure` with whether a restart can help and why:

- ``ok``: nothing to heal.
- ``preempted``: the supervisor was asked to stop (SIGTERM/SIGUSR1): the next ``zeropilot run --heal`` on the same
  run directory resumes; this one does not restart on a machine that is going away.
- ``oom``: only with a fix (the same launch fails at the same batch): :mod:`zeropilot.heal.fixes` decides.
- ``hang`` (the watchdog stopped it): restarted, except the classes a restart meets again, which are bugs of the
  launch or of the machine, not transient faults: :data:`HANG_NO_RESTART`.
- ``crash``: a rank killed from outside (SIGKILL, a segfault, the kernel's OOM killer: no ``error`` record) or a
  communication, I/O or device error (:data:`TRANSIENT_ERRORS`) is restarted; a Python error of the job's own code
  (``ValueError``, ``KeyError``, ...) would happen again at the same step and is not. A launch that failed before
  any rank started is not restarted either (its command, files or environment fail the same way).

Whatever this module allows, the no-loop rule (:func:`zeropilot.heal.record.repeated`) ends the healing when the
same failure comes back at the same step with the same changes in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: hang classes (``hang.json`` ``verdict.class``) that a restart of the same launch meets again, and why
HANG_NO_RESTART = {
    "stale_lock": "an op-build lock no live build holds blocks every rank before its first step: remove it (the path "
                  "is in hang.json); a restart would wait on it again",
    "save_partial": "the launch saves on some ranks only (a save under `if rank == 0`): a bug of the script that "
                    "comes back at the next save",
    "collective_mismatch": "the ranks call different collectives: a bug of the script that comes back at the same "
                           "step",
}

#: exception types of a rank that a restart can get past: communication, storage and device faults
TRANSIENT_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError", "OSError", "IOError",
                    "ConnectionError", "ConnectionResetError", "BrokenPipeError", "TimeoutError",
                    "ChildFailedError", "CudaError", "AcceleratorError")
#: words of a ``RuntimeError`` message that name a communication or device fault rather than a bug
TRANSIENT_WORDS = ("nccl", "gloo", "connection", "timed out", "timeout", "cuda error", "ecc", "uncorrectable",
                   "hip error", "device-side", "socket", "broken pipe", "peer")


@dataclass(frozen=True)
class Failure:
    """What ended one attempt.

    Attributes:
        kind: ``ok``, ``oom``, ``hang``, ``crash``, ``preempted`` or ``running`` (the supervisor died).
        cls: the verdict's class: the OOM class, the hang class, the crash's error type or ``killed``.
        step: the last optimizer step any rank recorded (None: none).
        ranks: the rank(s) the verdict names.
        reason: the verdict's reason, in words.
        restart: whether a restart of the same launch can help (an OOM: only with a fix).
        why: why (not), in words.
    """

    kind: str
    cls: Optional[str]
    step: Optional[int]
    ranks: List[int] = field(default_factory=list)
    reason: str = ""
    restart: bool = False
    why: str = ""

    def key(self) -> Tuple[str, Optional[str], Optional[int]]:
        """What makes two failures "the same failure at the same step" (:func:`zeropilot.heal.record.repeated`)."""
        return (self.kind, self.cls, self.step)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Failure":
        return cls(str(d.get("kind") or "crash"), d.get("class"), d.get("step"), list(d.get("ranks") or []),
                   str(d.get("reason") or ""), bool(d.get("restart")), str(d.get("why") or ""))

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "class": self.cls, "step": self.step, "ranks": list(self.ranks),
                "reason": self.reason, "restart": self.restart, "why": self.why}


def _error_type(events_by_rank: Dict[int, List[Dict[str, Any]]], rank: Optional[int]) -> Optional[Dict[str, Any]]:
    """The first own (not a peer's) ``error`` record of ``rank``, else None."""
    if rank is None:
        return None
    own = [e for e in events_by_rank.get(rank, []) if e.get("event") == "error" and not e.get("peer_failure")]
    return own[0] if own else None


def transient(error: Dict[str, Any]) -> bool:
    """Whether an ``error`` record names a fault a restart can get past (see :data:`TRANSIENT_ERRORS`)."""
    kind = str(error.get("type") or "")
    if kind in TRANSIENT_ERRORS:
        return True
    text = str(error.get("message") or "").lower()
    return kind == "RuntimeError" and any(w in text for w in TRANSIENT_WORDS)


def failure_of(summary: Dict[str, Any], events_by_rank: Dict[int, List[Dict[str, Any]]],
               preempted: Optional[Dict[str, Any]] = None) -> Failure:
    """The failure of one attempt from its report (``runlog.summarize``) and its ranks' non-step records.

    ``preempted``: ``run.json``'s ``preempted`` object when the supervisor was asked to stop.
    """
    verdict = summary.get("verdict") or {}
    kind = verdict.get("kind") or "crash"
    steps = summary.get("steps")
    step = steps if isinstance(steps, int) and steps > 0 else None
    ranks = [r for r in verdict.get("ranks") or [] if isinstance(r, int)]
    reason = str(verdict.get("reason") or "")
    if preempted:
        saved = preempted.get("saved_step")
        shared = preempted.get("shared") if isinstance(preempted.get("shared"), dict) else {}
        who = ("zeropilot run" if not shared or shared.get("own") else
               f"node {shared.get('by_node')}'s zeropilot run (its stop step, shared through the job's store)")
        reason = (f"{preempted.get('signal')} to {who}: every rank saved at step {saved} and stopped"
                  if saved is not None else f"{preempted.get('signal')} to {who}: {preempted.get('why')}")
        return Failure("preempted", preempted.get("signal"), step, ranks, reason, False,
                       f"stopped by {preempted.get('signal')}" + (f" after a save at step {saved}" if saved is not None
                                                                   else " with no save (" + str(preempted.get("why"))
                                                                   + ")")
                       + ": run the same `zeropilot run --heal --out DIR` again to resume")
    if kind == "ok":
        return Failure("ok", None, step, [], reason, False, "every rank finished")
    if kind == "running":
        return Failure("running", None, step, [], reason, False, "the attempt did not end (its supervisor died)")
    if kind == "oom":
        return Failure("oom", verdict.get("class"), step, ranks, reason, True,
                       "the same launch runs out of memory at the same batch: restarted only with a fix")
    if kind == "hang":
        cls = verdict.get("class")
        if cls in HANG_NO_RESTART:
            return Failure("hang", cls, step, ranks, reason, False, HANG_NO_RESTART[cls])
        return Failure("hang", cls, step, ranks, reason, True,
                       "the watchdog stopped a job that made no progress: a restart resumes it")
    return _crash(verdict, events_by_rank, step, ranks, reason)


def _crash(verdict: Dict[str, Any], events_by_rank: Dict[int, List[Dict[str, Any]]], step: Optional[int],
           ranks: List[int], reason: str) -> Failure:
    if not any(events_by_rank.values()):
        return Failure("crash", "before_training", None, ranks, reason, False,
                       "the launch failed before any rank started: a restart runs the same command, files and "
                       "environment into the same error")
    error = _error_type(events_by_rank, ranks[0] if ranks else None)
    if error is None:
        return Failure("crash", "killed", step, ranks, reason, True,
                       "a rank was killed from outside (SIGKILL, a segfault, the OOM killer, a lost machine): a "
                       "restart resumes from the last complete checkpoint")
    kind = str(error.get("type") or "error")
    if transient(error):
        return Failure("crash", kind, step, ranks, reason, True,
                       f"{kind}: a communication, storage or device fault, which a restart can get past")
    return Failure("crash", kind, step, ranks, reason, False,
                   f"{kind} in the job's own code: a restart would raise it again at the same step (fix the script "
                   "or the data, then run again)")
