"""Plan inputs from what a launch says (:class:`zeropilot.launch.planfacts.PlanFacts`): the one hand-over from
``launch`` to ``memory``.

The launch is read once, in ``launch/``; here only what needs the model is done: ``"auto"`` bucket sizes resolve as
the HF integration resolves them (FACTS B: reduce_bucket_size h², prefetch 0.9·h², persistence threshold 10·h).
Nothing here opens or reads a launch document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

from zeropilot.launch.planfacts import PlanFacts


@dataclass(frozen=True)
class LaunchInputs:
    """A launch's plan inputs for one model.

    Attributes:
        values: PlanInputs field -> value, ``"auto"`` filled in (or left to the default where nothing fills it).
        sources: every value's source as the plan prints it, and the model's and the world size's.
        notes: field -> how an ``"auto"`` was filled (``auto -> 12845056``).
    """

    values: Dict[str, Any]
    sources: Dict[str, str]
    notes: Dict[str, str]


def resolve_auto(values: Dict[str, Any], hidden: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Replace ``"auto"`` bucket sizes with what the HF integration fills in for ``hidden``."""
    fill = {"reduce_bucket_size": hidden * hidden, "prefetch_bucket_size": int(0.9 * hidden * hidden),
            "param_persistence_threshold": 10 * hidden}
    out, notes = dict(values), {}
    for name, value in values.items():
        if value == "auto":
            if name in fill:
                out[name] = fill[name]
                notes[name] = f"auto -> {fill[name]}"
            else:
                del out[name]
    return out, notes


def launch_inputs(facts: PlanFacts, hidden: int) -> LaunchInputs:
    """The plan inputs ``facts`` gives a model of hidden size ``hidden``."""
    values, notes = resolve_auto(dict(facts.values), hidden)
    return LaunchInputs(values, {name: source.text for name, source in facts.sources.items()}, notes)
