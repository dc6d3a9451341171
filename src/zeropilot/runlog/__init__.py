"""The run directory: what ``zeropilot run`` writes and ``report`` / ``repro`` read.

This package is the one contract between the runtime side (the guard inside every rank, the
supervisor that launched them) and everything that explains a run afterwards. It imports no torch:
the guard fills the records, this package only names, writes and reads them. The layout and every
field are documented in ``docs/run-dir.md``; :data:`RUN_SCHEMA`, :data:`EVENT_VERSION` and
:data:`REPORT_SCHEMA` change when a field changes meaning.

Layout of ``DIR`` (names spelled only in :mod:`zeropilot.runlog.layout`):

- ``run.json``: written by the supervisor (command, versions, environment in force, plan, exit).
- ``rank-N.jsonl``: one JSON object per line, appended by rank N's guard (start, init, step, save,
  load, oom, error, end).
- ``heartbeat-rank-N.json``: rank N's latest phase and progress, replaced atomically; read by the
  hang watchdog.
- ``oom-rank-N.json``: the OOM forensics of rank N, with its verdict and ranked fixes.
- ``hang.json``: the watchdog's verdict, with ``stacks-rank-N.txt`` beside it.
"""

from zeropilot.runlog.events import EVENT_VERSION, EventWriter, MEMORY_FIELDS, event
from zeropilot.runlog.layout import RUN_SCHEMA, RunDir
from zeropilot.runlog.read import RunRecords, read_run
from zeropilot.runlog.summary import REPORT_SCHEMA, summarize

__all__ = [
    "EVENT_VERSION",
    "EventWriter",
    "MEMORY_FIELDS",
    "REPORT_SCHEMA",
    "RUN_SCHEMA",
    "RunDir",
    "RunRecords",
    "event",
    "read_run",
    "summarize",
]
