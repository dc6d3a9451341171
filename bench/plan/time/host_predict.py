"""Call 4's comparison, committed before the call (issue 40): the model as committed, with call 3's profile whose
host figures are replaced by those host_figures.py measured on call 4's machine.

    python bench/plan/time/host_predict.py [CALL_DIR]     (default bench/plan/time/data/call4)

Writes CALL_DIR/profile_host.json (call 3's profile; ``launch_s``, ``launch_issue_s`` from this call's launch;
``cpu_adam_elems_per_s`` and ``torch_cpu_adamw_elems_per_s`` from its largest partition that stepped) and prints
fit.py's table of CALL_DIR/rows.jsonl against it, and against call 3's profile unchanged.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fit  # noqa: E402


def host_profile(call: Path) -> Path:
    prof = json.loads((HERE / "data/call3/profile.json").read_text())
    host = json.loads((call / "host_figures.json").read_text())
    s = prof["speed"]
    s.update(host["launch"])
    for which, field in (("cpu_adam", "cpu_adam_elems_per_s"), ("torch_adamw", "torch_cpu_adamw_elems_per_s")):
        done = [a for a in host["adam"] if a["optimizer"] == which and "elems_per_s" in a]
        if done:
            s[field] = max(done, key=lambda a: a["elements"])["elems_per_s"]
    out = call / "profile_host.json"
    out.write_text(json.dumps(prof, indent=1))
    return out


def main(argv=None) -> int:
    call = Path((argv or sys.argv[1:] or [str(HERE / "data/call4")])[0])
    rows = str(call / "rows.jsonl")
    print("## call 3's profile, this call's host figures\n")
    fit.main([rows, str(host_profile(call)), "--split", "holdout"])
    print("\n## call 3's profile unchanged\n")
    fit.main([rows, str(HERE / "data/call3/profile.json"), "--split", "holdout"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
