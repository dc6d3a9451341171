"""``heal.json``: every attempt of a ``zeropilot run --heal``, and the no-loop rule over them (pure but for I/O here).

One document (schema ``zeropilot.heal/1``, :data:`zeropilot.runlog.layout.HEAL_SCHEMA`) in the heal run's root
directory, which is also the first attempt's run directory; attempt K >= 2 runs in ``attempt-K/``. Written
atomically when an attempt starts and when it ends. Keys (``docs/run-dir.md``):

- ``command``: the launch as given; ``restarts``, ``allow``, ``backoff_s``: the options;
- ``attempts``: one object per attempt: ``attempt``, ``dir`` (relative to the root), ``command`` and ``env`` (what
  this attempt ran: the fixes in force), ``fix`` (the fix applied before it: ``key``, ``fix``, ``change``,
  ``settings``, ``files``, ``diff``, ``passed`` — the ranked fixes not applied, with why), ``in_force`` (every
  fix applied so far), ``resume`` (the checkpoint chosen: ``chosen``, ``skipped`` newer ones with why, ``how``),
  ``resumed`` (what the ranks really did: ``loaded_step``, ``first_step``, ``really``, ``note``), ``steps_redone``,
  ``backoff_s``, ``started_at``, ``ended_at``, ``exit_code``, ``failure`` (:class:`zeropilot.heal.causes.Failure`);
- ``outcome``: ``status`` (``finished``: the first attempt needed no healing; ``healed``; ``restarted_from_scratch``:
  it finished, but a restart did not resume, or had no checkpoint to resume from after steps were trained;
  ``stopped``: the healing ended, ``why`` says why; ``preempted``; ``running``), ``why``, ``exit_code``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.errors import InputError
from zeropilot.runlog.layout import HEAL_SCHEMA, RunDir, write_json_atomic

MAX_HEAL_FILE = 16 << 20


def new(command: List[str], restarts: int, allow: List[str], backoff_s: float) -> Dict[str, Any]:
    return {"schema": HEAL_SCHEMA, "command": list(command), "restarts": restarts, "allow": sorted(allow),
            "backoff_s": backoff_s, "attempts": [], "outcome": {"status": "running", "why": None, "exit_code": None}}


def load(root: Path) -> Optional[Dict[str, Any]]:
    """The heal record of a run directory, or None; an input error when it is there but not one."""
    from zeropilot import safefile

    path = RunDir(root).heal_file
    if safefile.kind_of(path, follow_symlinks=False) is None:
        return None
    try:
        data = json.loads(safefile.read_bytes(path, MAX_HEAL_FILE, follow_symlinks=False))
    except InputError:
        raise
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not a heal record ({exc.__class__.__name__})", path=path) from None
    if not isinstance(data, dict) or data.get("schema") != HEAL_SCHEMA or not isinstance(data.get("attempts"), list):
        raise InputError(f"not a heal record (schema {HEAL_SCHEMA} with attempts expected)", path=path)
    for n, a in enumerate(data["attempts"], 1):
        # attempt K lives in attempt-K/ of this directory: a record naming another folder is not followed
        if not isinstance(a, dict) or a.get("attempt") != n or a.get("dir") != (
                "." if n == 1 else RunDir(root).attempt_dir(n).name):
            raise InputError(f"not a heal record: attempt {n} is not attempt {n} of this directory", path=path)
        if not isinstance(a.get("in_force") or [], list):
            raise InputError(f"not a heal record: attempt {n}'s in_force is not a list", path=path)
    if not isinstance(data.get("command"), list) or not all(isinstance(w, str) for w in data["command"]):
        raise InputError("not a heal record: command is not a list of words", path=path)
    return data


def save(root: Path, doc: Dict[str, Any]) -> None:
    write_json_atomic(RunDir(root).heal_file, doc)


def start_attempt(doc: Dict[str, Any], number: int, folder: str, command: List[str], env: Dict[str, str],
                  **fields: Any) -> Dict[str, Any]:
    entry = {"attempt": number, "dir": folder, "command": list(command), "env": dict(env), "started_at": time.time(),
             "ended_at": None, "exit_code": None, "failure": None, **fields}
    doc["attempts"].append(entry)
    return entry


def repeated(attempts: List[Dict[str, Any]], failure: Dict[str, Any]) -> Optional[str]:
    """The no-loop rule: why the healing ends when this failure (of the last attempt) is one an earlier attempt had
    already, at the same step, with the same fixes in force; else None."""
    if not attempts:
        return None
    last = attempts[-1]
    key = (failure.get("kind"), failure.get("class"), failure.get("step"))
    for earlier in attempts[:-1]:
        f = earlier.get("failure") or {}
        if (f.get("kind"), f.get("class"), f.get("step")) == key and earlier.get("in_force") == last.get("in_force"):
            what = f"{key[0]}" + (f" ({key[1]})" if key[1] else "")
            fixes = "the same fixes" if last.get("in_force") else "no fix"
            return (f"the same {what} at step {key[2]} in attempt {earlier.get('attempt')} and attempt "
                    f"{last.get('attempt')}, with {fixes} in force: a restart does not help")
    return None


def backoff(base_s: float, restart: int, cap_s: float = 300.0) -> float:
    """Seconds to wait before restart number ``restart`` (1 for the first): ``base x 2^(restart-1)``, capped."""
    return min(cap_s, base_s * (2 ** max(restart - 1, 0)))
