"""ZeRO's collectives against the compute (memory/schedule.py): hand-computable cases, what DeepSpeed gathers, and
the step time's response to the link (memory/links.py, memory/steptime.py)."""

import dataclasses

import pytest

from zeropilot.memory import PlanInputs, parse_gpus, schedule
from zeropilot.memory.links import ASSUMED_NODE_GBPS, Ring, latency_s, ring, with_inter_node
from zeropilot.memory.schedule import BACKWARD, FORWARD, Compute, Settings, Trace, simulate
from zeropilot.memory.speed import Figure, speed_of
from zeropilot.memory.steptime import estimate_time
from zeropilot.models import CATALOGUE, from_config

L = 10
X = 1_000_000  # elements per use
#: a link that moves one use's 2 MB in 1 ms (8 ranks: 7/8 of the bytes cross each link), no latency
LINK = Ring(8, 1, 2 * X * 7 / 8 / 1e-3, 0.0, "within the node", "test", True)
G = 1e-3
#: prefetch one use ahead per module call
OPEN = Settings(prefetch=X, max_live=10**9, reuse=0, bucket=10**9, overlap=True)


def _forward(c: float, host: float) -> tuple:
    """L uses of L different tensors in the forward, each computing c seconds on the GPU and host seconds on the
    host."""
    tr = Trace.of(range(L), [X] * L, [0.0] * L, [FORWARD] * L, [1] * L)
    return tr, Compute((L * c, 0.0, 0.0, 0.0, 0.0), L * host, 0.0)


def test_long_compute_with_prefetch_hides_all_but_the_first_gather():
    tr, comp = _forward(c=5e-3, host=1e-4)
    out = simulate(tr, comp, LINK, None, OPEN)
    assert out.without_s == pytest.approx(L * 5e-3)
    assert out.exposed_s == pytest.approx(G)  # the first use's own gather: nothing before it to hide it
    assert out.gathered == L * X and out.gathers == L  # its own fetch, then one use ahead at each use
    # a bucket of all nine is one coalesced collective: the first of them waits for all nine (9 G, minus the 5 ms
    # of the first use's compute)
    bulk = simulate(tr, comp, LINK, None, dataclasses.replace(OPEN, prefetch=9 * X))
    assert bulk.gathers == 2 and bulk.exposed_s == pytest.approx(G + 9 * G - 5e-3)


def test_without_prefetch_each_gather_waits_for_the_host_to_reach_its_use():
    """DeepSpeed 0.19.8's own fetch is asynchronous (the host goes on): with the host level with the GPU each use's
    gather starts when the host reaches it and delays that use's compute by G, once, not per use; with the link
    slower than the compute the link sets the pace (the host waits behind FETCH_EVENTS fetches in flight)."""
    level = simulate(*_forward(c=2e-3, host=2e-3), LINK, None, dataclasses.replace(OPEN, prefetch=0))
    assert level.seconds == pytest.approx(L * 2e-3 + G)
    slow = simulate(*_forward(c=0.5e-3, host=0.0), LINK, None, dataclasses.replace(OPEN, prefetch=0))
    assert slow.seconds == pytest.approx(L * G + 0.5e-3)  # fully serialised on the link: every gather, one compute
    assert slow.exposed_s == pytest.approx(L * G + 0.5e-3 - L * 0.5e-3)


def test_max_live_below_one_use_stops_the_prefetcher():
    tr, comp = _forward(c=0.5e-3, host=0.4e-3)
    none = simulate(tr, comp, LINK, None, dataclasses.replace(OPEN, prefetch=0))
    low = simulate(tr, comp, LINK, None, dataclasses.replace(OPEN, max_live=X // 2))
    full = simulate(tr, comp, LINK, None, OPEN)
    assert low == none  # the budget (max live less what is gathered) is never positive
    assert full.seconds == pytest.approx(none.seconds) == pytest.approx(L * G + 0.5e-3)  # the link sets the pace


@pytest.mark.parametrize("overlap", [True, False])
def test_reduce_scatter_hides_behind_the_backward_only_with_overlap_comm(overlap):
    """L backward uses, each making one bucket of gradients (r seconds on the link): a bucket is reduce-scattered when
    the next gradient would overflow it (after the next use's compute), the last one at the end of the backward; with
    overlap_comm only those two are left, without it every one holds the compute stream."""
    c, r = 3e-3, 1e-3
    tr = Trace.of(range(L), [0.0] * L, [X] * L, [BACKWARD] * L, [1] * L, gathers=False)
    link = dataclasses.replace(LINK, busbw=2 * X * 7 / 8 / r)
    out = simulate(tr, Compute((0.0, 0.0, 0.0, L * c, 0.0), 0.0, 0.0), None, link,
                   Settings(0, 0, 0, bucket=X, overlap=overlap))
    assert out.reduces == L and out.reduced == L * X
    assert out.exposed_s == pytest.approx(2 * r if overlap else L * r)


def test_reuse_distance_and_prefetch_keep_what_is_used_again():
    """What one micro batch gathers, on Qwen2.5-7B with LoRA (the embedding makes no gradient): every partitioned
    tensor in the forward and again in the backward when nothing is kept; the recomputation shares the backward's
    gather when the reuse distance spans a layer; the defaults keep the last layers for the backward."""
    arch = from_config(CATALOGUE["qwen2.5-7b"], "q")
    lay = schedule.layout(arch, 100_000)
    layers = sum(map(sum, lay.layers))
    base = PlanInputs(arch=arch, stage=3, lora_rank=16, prefetch_bucket_size=0, max_reuse_distance=0)
    assert schedule.gathered(base) == pytest.approx(lay.embed + 2 * layers + 2 * lay.head)
    ckpt = base.with_(gradient_checkpointing=True)
    assert schedule.gathered(ckpt) == pytest.approx(lay.embed + 3 * layers + 2 * lay.head)
    assert schedule.gathered(ckpt.with_(max_reuse_distance=10**9)) < lay.embed + 2 * layers + 2 * lay.head
    assert schedule.gathered(ckpt.with_(prefetch_bucket_size=50_000_000)) < schedule.gathered(ckpt)


QWEN = from_config(CATALOGUE["qwen2.5-7b"], "q")


@pytest.mark.parametrize("stage,lora", [(3, 16), (3, None), (2, None)])
def test_a_faster_link_never_makes_a_step_slower(stage, lora):
    h100 = speed_of("H100", None, 8)
    inputs = PlanInputs(arch=QWEN, hardware=parse_gpus("8xH100"), stage=stage, micro_batch=2, grad_accum=4,
                        seq_len=2048, gradient_checkpointing=True, lora_rank=lora)
    steps = [estimate_time(inputs, dataclasses.replace(h100, intra_busbw_bytes_per_s=Figure(gbs * 1e9, "t")))
             for gbs in (16, 25, 50, 100, 200, 400)]
    assert all(a.step_s >= b.step_s for a, b in zip(steps, steps[1:]))
    assert steps[0].step_s > steps[-1].step_s
    assert all(sum(t.seconds for t in s.terms) == pytest.approx(s.step_s) for s in steps)


def test_rings_across_nodes_take_the_slower_link_and_nccls_latency():
    h100 = speed_of("H100", None, 16)
    assert ring(h100, 16, 2) is None  # nothing across nodes until measured, given or assumed
    assumed = ring(with_inter_node(h100), 16, 2)
    assert assumed.busbw == ASSUMED_NODE_GBPS * 1e9 / 8 and assumed.basis == "assumed" and not assumed.measured
    fast = ring(with_inter_node(h100, 3200), 16, 2)
    assert fast.busbw == h100.intra_busbw_bytes_per_s.value  # the NVLink ring is the slower one now
    assert ring(with_inter_node(h100, 100), 16, 2).basis == "given"
    assert latency_s(8, 1, "nvlink") == pytest.approx(8.4e-6 + 7 * 3.4e-6)
    assert latency_s(16, 2, "nvlink") == pytest.approx(8.4e-6 + 14 * 3.4e-6 + 14.0e-6)


def test_the_plan_says_which_link_figure_it_assumed(capsys):
    """Across nodes with nothing measured, the plan's time names the assumed network in its notes and JSON; the
    user's --inter-node-gbps replaces it; a figure that is not a speed is one line and exit 2."""
    import json

    from zeropilot.cli import main

    argv = ["plan", "--model", "qwen2.5-7b", "--gpus", "8xH100", "--nodes", "2", "--stage", "3", "--lora-rank", "16",
            "--host-mem", "256", "--outside-torch", "3", "--format", "json"]
    assert main(argv) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    link = time["collectives"]
    assert link["link"] == "across 2 nodes" and link["ranks"] == 16 and link["exposed_s"] >= 0
    assert link["busbw"]["source"].startswith("assumed") and link["busbw"]["measured"] is False
    assert time["figures"]["inter_busbw_bytes_per_s"]["source"].startswith("assumed")
    assert "inter_busbw_bytes_per_s" in time["estimated"] and any("assumed" in n for n in time["notes"])
    assert main(argv + ["--inter-node-gbps", "800"]) == 0
    given = json.loads(capsys.readouterr().out)["time"]["collectives"]["busbw"]
    assert given["value"] == 100e9 and given["source"].startswith("flag --inter-node-gbps 800")
    assert main(argv + ["--inter-node-gbps", "-1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _flip():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "plan" / "time" / "flip.py"
    spec = importlib.util.spec_from_file_location("flip_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["flip_bench"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod, path.parent / "results" / "flip.md"


def test_the_flip_table_is_what_the_search_chooses():
    """bench/plan/time/flip.py: a change of family is bisected to where it happens; its first case's two ends are
    the committed table's rows."""
    flip, committed = _flip()
    pick = lambda x: ("a", 1.0, "", 1.0, "a") if x < 42 else ("b", 1.0, "", 1.0, "b")  # noqa: E731
    _, flips = flip.flip_points((10, 30, 100), pick)
    assert [(a, b) for _, a, b in flips] == [("a", "b")] and flips[0][0] == pytest.approx(42, rel=0.01)
    got, flips = flip.intra_case(flip.LAUNCHES[0], (16, 361), tol=10)  # one bisection: the ends are what count
    table = committed.read_text()
    for gbs, (first, step, *_rest) in got.items():
        assert f"| {gbs:g} | {first} | {step:.3f} |" in table
    assert got[16][4] != got[361][4] and len(flips) == 1
