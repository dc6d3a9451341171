"""Reports of jobs across nodes, from directories written with the real writer: merging, clocks, a lost node,
hostile combinations. The real two-node job is in ``tests/guard/test_multinode.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, Iterable, Optional

import pytest

from zeropilot.errors import InputError
from zeropilot.runlog import EventWriter, RunDir, event, summarize
from zeropilot.runlog.job import read_job
from zeropilot.runlog.layout import write_json_atomic
from zeropilot.runlog.nodes import rank_place

T0 = 1_790_000_000.0
GiB = 1 << 30


def _node_env(rank: int, per_node: int, world: int, port: int = 29500) -> Dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % per_node), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node), "TORCHELASTIC_RUN_ID": "none",
            "GROUP_WORLD_SIZE": str(world // per_node), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": str(port)}


def write_node(root: Path, node: int, per_node: int = 2, nodes: int = 2, steps: int = 4, skew: float = 0.0,
               stop_at: Optional[int] = None, peer_error_after: Optional[float] = None, ended: bool = True,
               versions: Optional[Dict[str, str]] = None, port: int = 29500, run_key: Optional[str] = None,
               ranks: Optional[Iterable[int]] = None) -> Path:
    """One node's run directory: its ranks' records (``skew``: this node's clock runs ahead by that much),
    ``stop_at``: its ranks stop silently after that step (SIGKILL); ``peer_error_after``: its ranks record a
    peer failure that many seconds after the last step; ``ended``: its supervisor recorded an end."""
    d = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    world = per_node * nodes
    for rank in (ranks if ranks is not None else range(node * per_node, (node + 1) * per_node)):
        host = f"host{node}"
        with EventWriter(d.events(rank)) as w:
            def put(kind, t, **f):
                rec = event(kind, rank, **f)
                rec["t"] = t + skew
                w.write(rec)
            put("start", T0, pid=1000 + rank, host=host, node=rank_place(_node_env(rank, per_node, world, port), host))
            last = T0
            for s in range(1, steps + 1):
                if stop_at is not None and s > stop_at:
                    break
                last = T0 + 10 + s + 0.001 * rank
                put("step", last, step=s, seconds=1.0, mem={"host_rss_bytes": (2 + rank) * GiB,
                                                             "outside_torch_bytes": GiB + rank})
            if peer_error_after is not None:
                put("error", last + peer_error_after, type="DistBackendError", message="Connection reset by peer",
                    where=[], step=s, phase="backward", peer_failure=True)
            elif stop_at is None:
                put("end", last + 0.5, steps=steps)
    run = {"schema": "zeropilot.run/1", "command": ["torchrun", "--node_rank", str(node)], "started_at": T0 - 5,
           "world_size": world, "versions": versions or {"torch": "2.13.0", "deepspeed": "0.19.8"},
           "node": {"node_rank": node, "nnodes": nodes, "file_key": str(node)}}
    if ended:
        run.update(ended_at=T0 + 30, exit_code=0 if stop_at is None and peer_error_after is None else 1, signal=None)
    write_json_atomic(d.node_run_file(run_key or str(node)), run)
    return root


def test_node_directories_merge_into_one_job(tmp_path, validate):
    a, b = write_node(tmp_path / "n0", 0), write_node(tmp_path / "n1", 1)
    s = summarize(read_job([a, b]))
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2, 3]
    assert [r["node"] for r in s["ranks"]] == ["node 0", "node 0", "node 1", "node 1"]
    n = s["nodes"]
    assert (n["count"], n["expected"], n["world_size"], n["missing_ranks"]) == (2, 2, 4, [])
    node1 = n["list"][1]
    assert node1["hostnames"] == ["host1"] and node1["ranks"] == [2, 3]
    assert node1["host_rss_peak_bytes"] == 5 * GiB and node1["host_rss_sum_bytes"] == 9 * GiB
    assert node1["outside_torch_bytes"] == GiB + 3 and node1["exit_code"] == 0
    assert s["verdict"]["kind"] == "ok" and validate(s) == []
    # a folder holding the node directories is the same job
    assert summarize(read_job([tmp_path]))["nodes"]["list"] == n["list"]


def test_a_shared_directory_is_one_job_as_is(tmp_path, validate):
    shared = tmp_path / "shared"
    write_node(shared, 0)
    write_node(shared, 1)
    s = summarize(read_job([shared]))
    assert s["nodes"]["count"] == 2 and len(s["ranks"]) == 4 and s["exit_code"] == 0
    assert s["verdict"]["kind"] == "ok" and validate(s) == []


def test_clocks_are_aligned_on_the_first_common_step(tmp_path):
    a, b = write_node(tmp_path / "n0", 0), write_node(tmp_path / "n1", 1, skew=7.5)
    records = read_job([a, b])
    clock = records.clock
    assert clock["anchor"].startswith("the end of step 1")
    node1 = next(x for x in clock["nodes"] if x["node"] == "node 1")
    assert node1["applied"] and abs(node1["offset_s"] - 7.5) < 0.01
    assert abs(records.ranks[2].steps["t"][0] - records.ranks[0].steps["t"][0]) < 0.01
    # same clock (jitter only): nothing is shifted
    same = read_job([write_node(tmp_path / "m0", 0), write_node(tmp_path / "m1", 1)]).clock
    assert not any(x["applied"] for x in same["nodes"]) and "none shifted" in same["how"]


def test_a_lost_node_is_named_once(tmp_path, validate):
    """Node 1's ranks stop after step 2 without a record, its supervisor with them; node 0's ranks see their
    peers fail: one node failure, not two rank crashes."""
    a = write_node(tmp_path / "n0", 0, stop_at=2, peer_error_after=20.0)
    b = write_node(tmp_path / "n1", 1, stop_at=2, ended=False)
    s = summarize(read_job([a, b]))
    v = s["verdict"]
    assert v["kind"] == "crash" and v["ranks"] == [2, 3]
    assert v["node"] == {"node": "node 1", "node_rank": 1, "hostnames": ["host1"], "ranks": [2, 3]}
    assert "node 1 (host host1) lost" in v["reason"] and "recorded no end" in v["reason"]
    assert "0-1 then saw their peers fail" in v["reason"]
    assert validate(s) == []


def test_one_rank_killed_is_not_a_node_failure(tmp_path):
    a = write_node(tmp_path / "n0", 0, peer_error_after=5.0, stop_at=2)
    b = write_node(tmp_path / "n1", 1, ranks=[2], peer_error_after=5.0, stop_at=2)
    write_node(tmp_path / "n1", 1, ranks=[3], stop_at=1)  # rank 3 killed after step 1
    v = summarize(read_job([a, b]))["verdict"]
    assert v["kind"] == "crash" and v["ranks"] == [3] and "node" not in v


def test_versions_that_differ_across_nodes_are_a_finding(tmp_path):
    a = write_node(tmp_path / "n0", 0)
    b = write_node(tmp_path / "n1", 1, versions={"torch": "2.12.0", "deepspeed": "0.19.8"})
    n = summarize(read_job([a, b]))["nodes"]
    assert [f["kind"] for f in n["findings"]] == ["versions-differ"]
    assert "torch differs across nodes (node 0: 2.13.0; node 1: 2.12.0)" in n["findings"][0]["message"]


def test_a_missing_node_directory_is_said(tmp_path):
    n = summarize(read_job([write_node(tmp_path / "n0", 0)]))["nodes"]
    assert n["missing_ranks"] == [2, 3] and n["findings"][0]["kind"] == "ranks-missing"


def test_the_same_rank_in_two_directories_is_an_input_error(tmp_path, capsys):
    from zeropilot.cli import main

    a = write_node(tmp_path / "n0", 0)
    shutil.copytree(a, tmp_path / "copy")
    with pytest.raises(InputError, match="rank 0 is in both"):
        read_job([a, tmp_path / "copy"])
    assert main(["report", str(a), str(tmp_path / "copy")]) == 2
    err = capsys.readouterr().err
    assert "rank 0 is in both" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    # the same folder named twice is one directory, not a clash
    assert len(summarize(read_job([a, a / "." ]))["ranks"]) == 2


def test_directories_of_different_jobs_are_refused(tmp_path):
    a = write_node(tmp_path / "n0", 0)
    b = write_node(tmp_path / "n1", 1, port=31000)
    with pytest.raises(InputError, match="not one job.*master port"):
        read_job([a, b])


def test_a_folder_without_run_directories_is_an_input_error(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(InputError, match="not a run directory"):
        read_job([tmp_path / "empty"])


def test_hostile_node_records_keep_the_schema(tmp_path, validate, capsys):
    from zeropilot.cli import main

    a = write_node(tmp_path / "n0", 0)
    with open(RunDir(a).events(0), "a") as fh:  # a start record whose node holds garbage
        fh.write(json.dumps({"v": 1, "event": "start", "t": T0, "rank": 0,
                             "node": {"node_rank": "\x1b[31mx", "hostname": ["a"], "world_size": 1e400}}) + "\n")
    (a / "run-node-\x1b.json").write_text("{}")  # a name the reader does not match
    write_json_atomic(a / "run-node-9.json", {"node": "not an object", "ended_at": "late", "versions": [1]})
    s = summarize(read_job([a, write_node(tmp_path / "n1", 1)]))
    assert validate(s) == []
    assert main(["report", str(a), str(tmp_path / "n1")]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_report_checkpoint_flag_checks_the_last_save(tmp_path, capsys, validate):
    from zeropilot.cli import main

    a, b = write_node(tmp_path / "n0", 0), write_node(tmp_path / "n1", 1)
    missing = tmp_path / "no-such-ckpt"
    with EventWriter(RunDir(a).events(0)) as w:
        w.write(event("save", 0, step=4, tag="global_step4", path=str(missing), bytes=1, seconds=0.1, phases=[]))
    assert main(["report", str(a), str(b), "--checkpoint", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint"]["verdict"] == "unreadable" and validate(doc) == []
    assert main(["report", str(a), str(b)]) == 0  # without the flag nothing named by the run is read
    assert f"checkpoint {missing}" not in capsys.readouterr().out
