"""A job across two nodes, simulated on this machine: two ``torchrun --nnodes 2 --nproc_per_node 2`` launchers
(CPU, gloo, DeepSpeed ZeRO-3, saves at steps 2 and 4), each under its own ``zeropilot run``; once with one run
directory per node and once with one directory both nodes write. Both layouts run at once (they wait on each
other's ranks most of the time). Also: the guard reaching ranks that DeepSpeed's runner starts through pdsh."""

from __future__ import annotations

import base64
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import pytest

from tests import runjobs
from zeropilot.cli import main
from zeropilot.runlog import summarize
from zeropilot.runlog.job import read_job
from tests.report.conftest import validate  # noqa: F401  (the report schema's validator, a fixture)

pytestmark = [pytest.mark.slow]
TIMEOUT_S = 300.0


def _launch_node(name: str, node: int, out: Path, port: int, ckpt: Path, extra: tuple = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "zeropilot", "run", "--out", str(out), "--",
           "torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", str(node), "--master_addr",
           "127.0.0.1", "--master_port", str(port), str(runjobs.JOBS / "ds_nodes.py"), "--save-dir", str(ckpt),
           "--deepspeed_config", str(runjobs.JOBS / "ds_config.json"), *extra]
    return subprocess.Popen(cmd, cwd=str(runjobs.REPO), env=runjobs.job_env(name), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _two_nodes(name: str, shared: bool, extra: tuple = ()) -> Dict:
    """Both nodes' ``zeropilot run``; every process group ended on every path."""
    base = runjobs.root() / name
    base.mkdir(parents=True, exist_ok=True)
    port = runjobs.free_port()
    outs = [base / "run"] * 2 if shared else [base / "node0", base / "node1"]
    procs: List[subprocess.Popen] = []
    results = []
    try:
        procs = [_launch_node(name, k, outs[k], port, base / "ckpt", extra) for k in (0, 1)]
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            results.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name}: the two nodes did not end within {TIMEOUT_S:.0f} s") from None
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return {"dirs": sorted(set(outs)), "base": base, "results": results, "ckpt": base / "ckpt"}


@functools.lru_cache(maxsize=None)
def _jobs() -> Dict[str, Dict]:
    with ThreadPoolExecutor(2) as pool:
        per_node = pool.submit(_two_nodes, "nodes_per_dir", False)
        shared = pool.submit(_two_nodes, "nodes_shared", True)
        return {"per_node": per_node.result(), "shared": shared.result()}


@functools.lru_cache(maxsize=None)
def _killed() -> Dict:
    """Global rank 3 SIGKILLs itself after step 3 (alone: not beside the other two jobs on 2 cores)."""
    return _two_nodes("nodes_rank3_killed", False, ("--kill-rank", "3", "--kill-at", "3"))


@pytest.mark.parametrize("layout", ["per_node", "shared"])
def test_two_nodes_make_one_report_with_four_ranks(layout, validate, capsys):
    job = _jobs()[layout]
    for code, out, err in job["results"]:
        assert code == 0, err[-3000:]
        assert "MN002" not in out  # a warning (127.0.0.1 on one machine works): it did not stop the launch
    s = summarize(read_job(job["dirs"]))
    assert s["verdict"]["kind"] == "ok" and validate(s) == []
    assert [(r["rank"], r["node"], r["steps"], r["ended"]) for r in s["ranks"]] == \
        [(0, "node 0", 4, True), (1, "node 0", 4, True), (2, "node 1", 4, True), (3, "node 1", 4, True)]
    n = s["nodes"]
    assert (n["count"], n["expected"], n["world_size"], n["missing_ranks"], n["findings"]) == (2, 2, 4, [], [])
    assert [x["exit_code"] for x in n["list"]] == [0, 0]
    assert all(x["host_rss_peak_bytes"] > 0 and x["host_rss_sum_bytes"] >= x["host_rss_peak_bytes"]
               for x in n["list"])
    assert n["clock"]["anchor"].startswith("the end of step 1")
    assert not any(x["applied"] for x in n["clock"]["nodes"])  # one machine, one clock
    assert sorted({(x["step"], len([y for y in s["saves"] if y["step"] == x["step"]])) for x in s["saves"]}) == \
        [(2, 4), (4, 4)]
    # each node's supervisor wrote its own files, named by its node rank; no run.json
    files = sorted(p.name for d in job["dirs"] for p in d.iterdir() if p.name.startswith(("run", "launch")))
    assert files == ["launch-node-0.sh", "launch-node-1.sh", "run-node-0.json", "run-node-1.json"]
    # the CLI: DIR..., or the folder holding them, and the checkpoint it saved (resumable on 4 ranks only)
    where = [str(d) for d in job["dirs"]] if layout == "shared" else [str(job["base"] / "node0"),
                                                                       str(job["base"] / "node1")]
    assert main(["report", *where, "--format", "json", "--checkpoint"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert validate(doc) == [] and len(doc["ranks"]) == 4
    assert (doc["checkpoint"]["verdict"], doc["checkpoint"]["world_size"], doc["checkpoint"]["tag"]) == \
        ("ok", 4, "global_step4")
    assert main(["report", *where]) == 0
    text = capsys.readouterr().out
    assert "nodes: 2 of 2, world size 4" in text and "node 1 (" in text and "ranks 2-3" in text


def test_every_rank_and_node_records_where_it_ran():
    job = _jobs()["per_node"]
    for node, d in enumerate(job["dirs"]):
        run = json.loads((d / f"run-node-{node}.json").read_text())
        assert run["node"]["node_rank"] == node and run["node"]["nnodes"] == 2 and run["node"]["per_node"]
        assert run["node"]["from"]["node_rank"] == "torchrun --node_rank"
        assert (run["node"]["master_addr"], run["node"]["launcher"]) == ("127.0.0.1", "torchrun")
        assert "MN002" in run["check"]["codes"] and run["check"]["errors"] == 0
        for local in (0, 1):
            rank = 2 * node + local
            start = json.loads((d / f"rank-{rank}.jsonl").read_text().splitlines()[0])
            place = start["node"]
            assert (place["rank"], place["node_rank"], place["node_rank_from"], place["local_rank"]) == \
                (rank, node, "GROUP_RANK", local)
            assert (place["world_size"], place["local_world_size"], place["nnodes"], place["launcher"]) == \
                (4, 2, 2, "torchrun")


def test_guard_reaches_ranks_that_deepspeeds_runner_starts_through_pdsh(tmp_path):
    """DeepSpeed's PDSH runner (``deepspeed --hostfile``) passes only PYTHON*/MLFLOW*/MV2*/UCX* (and the
    accelerator's) variables to the other nodes. The command its own ``get_cmd`` builds, run here the way pdsh runs
    it on a node (a login shell: only PATH and HOME), starts a rank whose guard records into the run directory;
    without zeropilot's carrier variable the guard's run directory does not arrive."""
    import collections

    from deepspeed.launcher.multinode_runner import PDSHRunner
    from deepspeed.launcher.runner import EXPORT_ENVS, encode_world_info, parse_args
    from zeropilot.runner.supervisor import CARRIER_ENV, RunOptions, child_env

    script = tmp_path / "rank.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
                      "dist.destroy_process_group()\n")
    run_dir = tmp_path / "run"
    env = child_env(RunOptions(command=["deepspeed", str(script)], out=run_dir, hang_timeout_s=60.0),
                    base={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    port = runjobs.free_port()
    args = parse_args(["--hostfile", str(tmp_path / "hostfile"), "--master_addr", "127.0.0.1", "--master_port",
                       str(port), str(script)])
    pool = collections.OrderedDict(localhost=[0])
    runner = PDSHRunner(args, encode_world_info(pool))
    for var, value in env.items():  # deepspeed/launcher/runner.py main(): what it exports to other nodes
        if any(var.startswith(name) for name in EXPORT_ENVS):
            runner.add_export(var, value)
    cmd, _, _ = runner.get_cmd(dict(env), pool)
    remote = " ".join(cmd[cmd.index("-w") + 2:]).replace("%n", "0")
    login = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    probe = "python -c 'import os; print(os.environ.get(\"ZEROPILOT_RUN_DIR\"))'"
    exports = remote.split("cd ", 1)[0]
    assert CARRIER_ENV in exports and "ZEROPILOT_RUN_DIR=" not in exports
    without = exports.replace(f"export {CARRIER_ENV}=", "export UNUSED_CARRIER=")
    for line, expected in ((exports, str(run_dir)), (without, "None")):
        got = subprocess.run(["bash", "-c", line + probe], env=login, capture_output=True, text=True, timeout=60)
        assert got.stdout.strip().splitlines()[-1] == expected, got.stderr[-2000:]
    proc = subprocess.Popen(["bash", "-c", remote], env=login, cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out = proc.communicate(timeout=180)[0]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    assert proc.returncode == 0, out[-3000:]
    start = json.loads((run_dir / "rank-0.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["node"]["launcher"] == "deepspeed"
    assert (start["node"]["node_rank"], start["node"]["node_rank_from"]) == (0, "CROSS_RANK")
    carried = json.loads(base64.urlsafe_b64decode(env[CARRIER_ENV]))
    assert carried["ZEROPILOT_RUN_DIR"] == str(run_dir) and shlex.quote(env[CARRIER_ENV]) == env[CARRIER_ENV]


def test_a_rank_killed_on_node_1_is_named_in_the_jobs_report_with_the_checkpoint_it_left(validate, capsys):
    """Global rank 3 SIGKILLs itself after step 3 (the saves were at step 2): each node's launcher ends with an
    error; the report of both node directories names rank 3 as killed first, the others as its peers' failures,
    and the last save (step 2, all 4 ranks) as complete and resumable on 4 ranks."""
    job = _killed()
    assert [code for code, _, _ in job["results"]] == [1, 1]
    s = summarize(read_job(job["dirs"]))
    assert validate(s) == []
    assert s["verdict"]["kind"] == "crash" and s["verdict"]["ranks"][0] == 3, s["verdict"]
    assert "rank 3 stopped recording without an error" in s["verdict"]["reason"]
    assert main(["report", *map(str, job["dirs"]), "--format", "json", "--checkpoint"]) == 0  # rendered
    doc = json.loads(capsys.readouterr().out)
    assert (doc["checkpoint"]["verdict"], doc["checkpoint"]["world_size"], doc["checkpoint"]["tag"]) == \
        ("ok", 4, "global_step2")
