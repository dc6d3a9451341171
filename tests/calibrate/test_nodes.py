"""calibrate as the ranks of a launch across nodes (two torchrun launchers, CPU, gloo), its profile, and what
`plan --nodes N --hardware PROFILE` makes of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.runjobs import free_port
from zeropilot.errors import InputError
from zeropilot.memory.profile import GIB, from_dict, load

PLAN = [sys.executable, "-m", "zeropilot", "plan", "--model", "Qwen/Qwen2-7B", "--gpus", "8x80GiB", "--stage", "3",
        "--lora-rank", "16", "--micro-batch", "1", "--seq-len", "1024", "--gradient-checkpointing", "--grad-accum",
        "4", "--host-mem", "512", "--format", "json"]


def _plan(*extra):
    proc = subprocess.run(PLAN + list(extra), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_calibrate_under_two_torchrun_nodes_measures_each_node_and_the_network(tmp_path):
    out = tmp_path / "cluster.json"
    port = free_port()
    procs = []
    try:
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                   "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
                   "-m", "zeropilot", "calibrate", "--out", str(out), "--checkpoint-dir", str(tmp_path),
                   "--disk-mib", "4", "--network-mib", "1", "--no-cpu-adam"]
            procs.append(subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "profile written to" in outs[0] and "profile written to" not in outs[1]  # rank 0 writes it
    profile = load(str(out))
    assert (profile.vendor, profile.world_size, profile.nodes, profile.ranks_per_node) == ("cpu", 2, 2, 1)
    assert profile.network_backend == "gloo" and "gloo on CPU" in profile.unmeasured["network"]
    assert set(profile.outside_torch_per_node) == {"node 0", "node 1"}  # unmeasured on CPU: None each
    assert profile.outside_torch_bytes is None
    assert profile.speed["torch_cpu_adamw_elems_per_s"] > 0 and profile.speed["launch_device"] == "cpu"  # rank 0's
    assert profile.speed["cpu_adam_threads"] == 1  # OMP_NUM_THREADS=1 given to the launchers
    assert "--no-cpu-adam" in profile.unmeasured["speed.cpu_adam_elems_per_s"]
    world = profile.network["world"]
    assert world["ranks"] == 2 and world["all_gather"]["busbw_bytes_per_s"] > 0
    assert world["reduce_scatter"]["busbw_bytes_per_s"] > 0 and "inter_node" in profile.network
    # plan across the 2 nodes: the step's collectives at the measured (CPU) speed, labelled as such
    doc = _plan("--nodes", "2", "--hardware", str(out))
    comm = doc["step_comm"]
    expected = (comm["gathered_bytes"] / world["all_gather"]["busbw_bytes_per_s"]
                + comm["reduced_bytes"] / world["reduce_scatter"]["busbw_bytes_per_s"]) * 15 / 16
    assert comm["seconds"] == pytest.approx(expected, rel=1e-6)
    assert any("gloo on CPU" in m for m in comm["measured"]) and comm["assumed"]
    assert doc["verdict"]["kind"] == "unknown"  # no GPU figure outside PyTorch: still not judged


def _gpu_profile(nodes: int, outside_gib: float = 2.1, bw: float = 20e9) -> dict:
    net = {"all_gather": {"busbw_bytes_per_s": bw, "bytes": 64 << 20, "seconds": 0.01},
           "reduce_scatter": {"busbw_bytes_per_s": bw / 2, "bytes": 64 << 20, "seconds": 0.02}}
    return {"schema": 1, "gpu_name": "NVIDIA H200", "vendor": "cuda", "world_size": 8 * nodes,
            "gpu_total_bytes": int(139.8 * GIB), "outside_torch_bytes": int(outside_gib * GIB), "nodes": nodes,
            "ranks_per_node": 8, "outside_torch_per_node": {f"node {i}": int(outside_gib * GIB) for i in range(nodes)},
            "network": {"world": {**net, "ranks": 8 * nodes}, "intra_node": {**net, "ranks": 8}},
            "network_backend": "nccl"}


def test_plan_across_nodes_is_judged_with_a_profile_measured_across_them(tmp_path):
    path = tmp_path / "h200-2nodes.json"
    path.write_text(json.dumps(_gpu_profile(2)))
    judged = _plan("--nodes", "2", "--hardware", str(path))
    assert judged["verdict"]["kind"] in ("fits", "tight", "does not fit")
    assert any("on 2 nodes" in n for n in judged["notes"])
    comm = judged["step_comm"]
    assert comm["link"] == "every rank, measured across 2 nodes" and comm["seconds"] > 0
    # the time model's ring across the nodes: the world group's slower collective, measured
    ring = judged["time"]["collectives"]
    assert ring["link"] == "across 2 nodes" and ring["busbw"]["measured"] and ring["busbw"]["value"] == 10e9
    assert "over every rank across 2 nodes" in ring["busbw"]["source"]
    # the same profile for 4 nodes: memory not judged (measured across 2), the bandwidth assumed to hold
    four = _plan("--nodes", "4", "--hardware", str(path))
    assert four["verdict"]["kind"] == "unknown" and "--hardware PROFILE" in four["verdict"]["message"]
    assert any("measured on 2 nodes holds for 4" in a for a in four["step_comm"]["assumed"])
    # without a profile across nodes: the bytes, and why there is no time
    alone = _plan("--nodes", "2")
    assert alone["step_comm"]["seconds"] is None and "calibrate" in alone["step_comm"]["reason"]


def test_step_traffic_follows_the_stage():
    from zeropilot.memory.comm import traffic
    from zeropilot.memory.inputs import PlanInputs
    from zeropilot.memory.schedule import gathered
    from zeropilot.models import resolve_model
    from zeropilot.models.params import count_params

    arch = resolve_model("Qwen/Qwen2-7B")
    p = 2 * count_params(arch).total
    z3 = traffic(PlanInputs(arch=arch, stage=3, grad_accum=4))
    # ZeRO-3 gathers what the schedule gathers: each partitioned tensor in the forward and again in the backward,
    # less those kept between two uses (the last layers before the backward, by the reuse distance)
    assert z3 == {"all_gather": int(4 * 2 * gathered(PlanInputs(arch=arch, stage=3))), "reduce_scatter": 4 * p}
    assert 4 * 1.5 * p < z3["all_gather"] < 4 * 2 * p
    z2 = traffic(PlanInputs(arch=arch, stage=2, grad_accum=4))
    assert z2 == {"all_gather": p, "reduce_scatter": 4 * p}


@pytest.mark.parametrize("bad", [{"nodes": 0}, {"nodes": True}, {"network": {"world": {"all_gather": {}}}},
                                 {"network": {"world": {"all_gather": {"busbw_bytes_per_s": -1}}}},
                                 {"network": []}, {"ranks_per_node": 0}])
def test_a_bad_multinode_profile_is_an_input_error(bad):
    with pytest.raises(InputError):
        from_dict({**_gpu_profile(2), **bad})
