"""The cross-node watchdog simulated small (issue 41, item 4): 8 nodes of 4 stand-in ranks, one real TCPStore.

The benchmark's own code (``bench/guard/watchdog_scale.py``, full size: 128 nodes of 8 ranks) at a size CI runs:
every node's watchdog names the culprit, the same on every node, within the learned deadline + 10 s of it stopping.
No assertion on speed beyond that requirement. The steps start once every worker's stand-ins and watchdogs are up
(on a loaded machine, minutes at full size; seconds here), on a store of its own at a free port, in the test's own
folder.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "guard" / "watchdog_scale.py"


def _bench():
    spec = importlib.util.spec_from_file_location("watchdog_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("watchdog_scale", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scenario, verdict_class", [("hang", "straggler"), ("die", "rank_gone")])
def test_every_node_names_the_stopped_rank_within_the_learned_deadline_and_10_s(tmp_path, scenario, verdict_class):
    out = tmp_path / "result.json"
    _bench().main(["--nodes", "8", "--ranks-per-node", "4", "--workers", "2", "--period", "0.5",
                   "--learn-steps", "8", "--idle-s", "0.3", "--linger-s", "2", "--scenario", scenario,
                   "--max-verdict-s", "40", "--tmp", str(tmp_path), "--out", str(out)])
    s = json.loads(out.read_text())["scenarios"][0]
    assert s["culprit"] == 17  # rank 1 of node 4
    assert s["verdicts"] == 8, s["per_node"]
    assert s["same_culprit_on_every_node"], s["culprits_named"]
    assert s["classes"] == {verdict_class: 8}
    assert s["deadline_source"]["source"] == "learned" and s["learned_deadline_s"] < 30  # not --hang-timeout
    assert s["within_target"], (s["seconds_to_verdict"], s["target_s"])
    relayed = s["store"]["steady"]["calls_per_s"]
    assert "check" not in relayed and "get" not in relayed  # read through the nodes' relays, no per-rank reads
