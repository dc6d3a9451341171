"""Which ranked OOM fix a restart applies: the first that fits and leaves the training mathematically the same.

The OOM record's fixes come ranked (:mod:`zeropilot.guard.whatif`: those predicted to fit first, cheapest first).
Each has a ``key``; this module sorts the keys into

- **math-neutral** (:data:`NEUTRAL`): the optimizer sees the same samples per step and computes the same update —
  a smaller micro batch with more gradient accumulation (the same samples per optimizer step), gradient
  checkpointing (recomputes what it dropped), optimizer or parameter offload, ``expandable_segments``, a higher ZeRO
  stage, no 16-bit gather on save, bucket sizes. A restart applies one of these without asking.
- **data- or model-changing** (:data:`CHANGES_DATA`): a shorter maximum length cuts samples, packing changes what a
  micro batch holds. Applied only when the user allows that kind (``--heal-allow seq_len``); else the fix is
  printed and the healing stops.
- **not a launch change** (:data:`NOT_APPLICABLE`): more GPUs, freeing the GPU of another process: said, never
  applied.

:func:`pick` walks the ranked fixes (those that fit; when no fix's fit is known, all of them, cheapest first) and
takes the first that is neutral or allowed and that :mod:`zeropilot.heal.patch` can apply to this launch; the
fixes it passed over are returned with why, so that the report says what was not applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from zeropilot.guard.whatif import TIERS  # the cost order, used when no fix's fit is known

#: fix keys (guard.whatif, guard.verdicts) that leave the training mathematically the same
NEUTRAL = frozenset({"micro_batch", "gradient_checkpointing", "offload_optimizer", "offload_param",
                     "expandable_segments", "stage", "gather_16bit_on_save", "reduce_bucket_size",
                     "prefetch_bucket_size", "buckets"})
#: fix keys that change the data or the model, by the word ``--heal-allow`` takes to allow them
CHANGES_DATA = {"seq_len": "seq_len", "seq_len_outlier": "seq_len", "packing": "packing"}
#: fix keys no restart can apply: hardware or the machine, not the launch
NOT_APPLICABLE = {"world_size": "needs more GPUs: a restart runs on the same machines",
                  "outside_torch": "memory outside PyTorch is another process's or the driver's: free the GPU"}
#: what ``--heal-allow`` accepts: the data-changing kinds, and ``shrink`` (restart with fewer nodes)
ALLOW_WORDS = ("seq_len", "packing", "shrink")


def parts(key: str) -> List[str]:
    """The single changes of a fix key (a combination is ``a+b``)."""
    return [k for k in str(key or "").split("+") if k]


def neutral(key: str) -> bool:
    """Whether every change of the fix leaves the training mathematically the same."""
    keys = parts(key)
    return bool(keys) and all(k in NEUTRAL for k in keys)


def needs_allow(key: str) -> List[str]:
    """The ``--heal-allow`` words this fix needs (empty for a neutral fix)."""
    return sorted({CHANGES_DATA[k] for k in parts(key) if k in CHANGES_DATA})


def blocked(key: str) -> Optional[str]:
    """Why no restart can apply this fix at all, or None."""
    for k in parts(key):
        if k in NOT_APPLICABLE:
            return NOT_APPLICABLE[k]
        if k not in NEUTRAL and k not in CHANGES_DATA:
            return f"{k}: not a change zeropilot makes to a launch"
    return None


@dataclass
class Pick:
    """The fix to apply (or None) and what was passed over, in rank order."""

    fix: Optional[Dict[str, Any]]
    passed: List[Dict[str, Any]] = field(default_factory=list)  # {fix, key, why}
    first_ranked: Optional[Dict[str, Any]] = None
    applied: Any = None  # what the apply step returned for the fix (heal.patch.Patch)

    @property
    def stop_reason(self) -> str:
        """Why no fix is applied, in one line (the first ranked fix named)."""
        if not self.passed:
            return "no ranked fix in the OOM record (the plan could not size this run)"
        first = self.passed[0]
        return f"the first ranked fix, {first['fix']!r}, is not applied: {first['why']}"


def _candidates(fixes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The fixes to walk: those predicted to fit, in rank order; when no fit is known at all, every fix, cheapest
    first (the ranking could not judge them)."""
    fitting = [f for f in fixes if f.get("fits")]
    if fitting:
        return fitting
    if any(f.get("fits") is False for f in fixes):
        return []
    return sorted(fixes, key=lambda f: max((TIERS.get(k, 5) for k in parts(f.get("key"))), default=5))


def pick(fixes: List[Dict[str, Any]], allow: List[str], apply: Callable[[Dict[str, Any]], Any],
         in_force: List[Dict[str, Any]] = ()) -> Pick:
    """The first fix that fits, is neutral or allowed, is new, and applies to this launch.

    Args:
        fixes: the OOM record's ranked fixes (``fixes`` of ``oom-rank-N.json``).
        allow: the ``--heal-allow`` words.
        apply: tries the fix on this launch: returns what it changed, or a string saying why it cannot.
        in_force: the fixes earlier attempts applied (the same change is never applied twice).
    """
    out = Pick(None, first_ranked=fixes[0] if fixes else None)
    walk = _candidates(fixes)
    if fixes and not walk:
        out.passed.append({"fix": fixes[0].get("fix"), "key": fixes[0].get("key"),
                           "why": "no fix is predicted to fit (the closest is shown)"})
    done = [(f.get("key"), f.get("change")) for f in in_force]
    for f in walk:
        key = str(f.get("key") or "")
        why = blocked(key)
        words = needs_allow(key)
        if why is None and words and not set(words) <= set(allow):
            why = (f"it changes the data or the model ({', '.join(words)}): allow it with "
                   + " ".join(f"--heal-allow {w}" for w in words))
        if why is None and (key, f.get("change")) in done:
            why = "an earlier attempt applied it already"
        if why is None:
            result = apply(f)
            if isinstance(result, str):
                why = f"cannot apply it to this launch: {result}"
            else:
                out.fix, out.applied = f, result
                return out
        out.passed.append({"fix": f.get("fix"), "key": key, "why": why})
    return out
