"""The cross-node watchdog on real two-node jobs, simulated on this machine: two ``torchrun --nnodes 2
--nproc_per_node 2`` launchers (CPU, gloo, a plain all_reduce loop: tests/guard/jobs/nodes_loop.py), each under its
own ``zeropilot run`` with its own run directory. The ranks publish their heartbeats in torchrun's own c10d store;
each node's watchdog reads them all. Three jobs at once:

- a straggler on node 1 (global rank 3 sleeps in its own code): both nodes write the same verdict naming rank 3,
  node 1 and its frame, and both stop;
- node 1 lost (every process of it frozen with SIGSTOP once the job's first save is complete: a machine that died
  without closing its connections, as a power loss or a cut network looks to the others; here a DeepSpeed ZeRO-3
  job, tests/guard/jobs/ds_nodes.py): node 0 names node 1 lost and stops, and the job's report names the last
  complete save and on how many ranks it resumes;
- node 0 lost, the node whose launcher serves the store: node 1 says the store is gone and stops.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests import runjobs
from tests.report.conftest import validate  # noqa: F401  (the report schema's validator, a fixture)
from zeropilot.cli import main

pytestmark = [pytest.mark.slow]
TIMEOUT_S = 240.0
LOOP = runjobs.JOBS / "nodes_loop.py"


def _tree(pid: int) -> List[int]:
    """``pid`` and its descendants (from /proc)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _signal_all(pids: List[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _node(name: str, k: int, out: Path, port: int, flags: List[str], script: List[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "zeropilot", "run", "--out", str(out), *flags, "--",
           "torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", str(k), "--master_addr",
           "127.0.0.1", "--master_port", str(port), *script]
    return subprocess.Popen(cmd, cwd=str(runjobs.REPO), env=runjobs.job_env(name), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _seen_all(out: Path) -> bool:
    try:
        return len(json.loads((out / "store-peers.json").read_text())["ranks_seen"]) == 4
    except (OSError, ValueError, KeyError):
        return False


def _job(name: str, flags: List[str], script: List[str], freeze: Optional[int] = None,
         freeze_after: Optional[str] = None) -> Dict:
    """Both nodes' ``zeropilot run`` of ``script`` (its path and arguments, under ``torchrun``); with ``freeze``,
    that node's every process is stopped once both watchdogs saw all four ranks in the store (and, with
    ``freeze_after``, once that file of the job's folder exists). Every process ends on every path."""
    base = runjobs.root() / name
    base.mkdir(parents=True, exist_ok=True)
    port = runjobs.free_port()
    outs = [base / "node0", base / "node1"]
    script = [arg.replace("{base}", str(base)) for arg in script]
    procs: List[subprocess.Popen] = []
    frozen: List[int] = []
    try:
        procs = [_node(name, k, outs[k], port, flags, script) for k in (0, 1)]
        deadline = time.time() + TIMEOUT_S
        if freeze is not None:
            while time.time() < deadline and not (all(_seen_all(o) for o in outs) and (
                    freeze_after is None or (base / freeze_after).exists())):
                time.sleep(0.2)
            frozen = _tree(procs[freeze].pid)
            _signal_all(frozen, signal.SIGSTOP)
        survivors = [p for k, p in enumerate(procs) if k != freeze]
        logs = {}
        for k, p in enumerate(procs):
            if p in survivors:
                logs[k] = p.communicate(timeout=max(deadline - time.time(), 1))[0]
    finally:
        _signal_all(frozen, signal.SIGKILL)
        for p in procs:
            _signal_all(_tree(p.pid), signal.SIGKILL)
            p.wait()
    hangs = {k: json.loads((outs[k] / "hang.json").read_text()) for k in (0, 1) if (outs[k] / "hang.json").exists()}
    runs = {k: json.loads((outs[k] / f"run-node-{k}.json").read_text()) for k in (0, 1) if k != freeze}
    return {"hangs": hangs, "runs": runs, "logs": logs, "dirs": outs, "base": base}


@functools.lru_cache(maxsize=None)
def _jobs() -> Dict[str, Dict]:
    stop = ["--on-hang", "stop"]
    with ThreadPoolExecutor(3) as pool:
        jobs = {"straggler": pool.submit(_job, "watch_straggler", ["--hang-timeout", "5", *stop],
                                         [str(LOOP), "--steps", "400", "--sleep-rank", "3", "--sleep-step", "12"]),
                # a DeepSpeed ZeRO-3 job that saves every 2 steps; node 1 lost after the first save is complete
                "node_lost": pool.submit(_job, "watch_node_lost", ["--hang-timeout", "300", *stop],
                                         [str(runjobs.JOBS / "ds_nodes.py"), "--save-dir", "{base}/ckpt",
                                          "--steps", "400", "--step-sleep", "0.5", "--deepspeed_config",
                                          str(runjobs.JOBS / "ds_config.json")], freeze=1, freeze_after="ckpt/latest"),
                "store_gone": pool.submit(_job, "watch_store_gone", ["--hang-timeout", "300", *stop],
                                          [str(LOOP), "--steps", "4000"], freeze=0)}
        return {k: f.result() for k, f in jobs.items()}


def test_a_straggler_is_named_the_same_way_on_every_node_and_every_node_stops(validate, capsys):
    job = _jobs()["straggler"]
    assert sorted(job["hangs"]) == [0, 1], job["logs"]
    verdicts = [job["hangs"][k]["verdict"] for k in (0, 1)]
    assert verdicts[0] == verdicts[1]  # one verdict, written on both nodes
    v = verdicts[0]
    assert v["class"] == "straggler" and v["ranks"] == [3]
    culprit = v["culprits"][0]
    assert (culprit["rank"], culprit["node_rank"]) == (3, 1)
    line = next(i for i, text in enumerate(LOOP.read_text().splitlines(), 1) if "time.sleep(600)" in text)
    assert any(f"nodes_loop.py:{line}" in w for w in culprit["where"]), culprit
    assert "wait in all_reduce" in v["cause"] and "rank 3 on node 1" in v["cause"]
    assert all(job["runs"][k]["stopped_on_hang"] for k in (0, 1))
    # one report of the job from both node directories: the verdict with its culprit's node
    assert main(["report", *map(str, job["dirs"]), "--format", "json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert validate(doc) == [], validate(doc)[:3]
    main(["report", *map(str, job["dirs"])])
    assert "rank 3 on node 1" in capsys.readouterr().out


def test_a_lost_node_and_a_lost_store_are_named_and_the_survivors_stop(validate, capsys):
    lost = _jobs()["node_lost"]
    v = lost["hangs"][0]["verdict"]
    assert v["class"] == "node_lost" and v["nodes_lost"] == [1] and v["ranks"] == [2, 3], lost["logs"]
    assert "node 1" in v["cause"] and lost["runs"][0]["stopped_on_hang"]
    # the job's report from both node directories (node 1's ends where it was lost): the node failure, and the last
    # save every rank finished, resumable on the 4 ranks it was saved at but not on node 0's 2 as it is
    assert main(["report", *map(str, lost["dirs"]), "--format", "json", "--checkpoint"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert validate(doc) == [], validate(doc)[:3]
    v = doc["verdict"]
    assert (v["kind"], v["class"], v["node"]["node_rank"], v["node"]["ranks"]) == ("hang", "node_lost", 1, [2, 3]), v
    ck = doc["checkpoint"]
    latest = (lost["base"] / "ckpt" / "latest").read_text().strip()
    assert (ck["verdict"], ck["world_size"], ck["tag"]) == ("ok", 4, latest), ck
    assert "not on the 2 surviving ranks" in ck["resume_on"]
    gone = _jobs()["store_gone"]
    v = gone["hangs"][1]["verdict"]
    assert v["class"] == "store_gone" and "c10d store" in v["cause"], gone["logs"]
    assert gone["runs"][1]["stopped_on_hang"] and gone["runs"][1]["store"]["answered"] is True
