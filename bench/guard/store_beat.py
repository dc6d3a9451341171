"""The cost of the cross-node heartbeat (guard/storebeat.py) on CPU: store round-trips against step time.

    python bench/guard/store_beat.py --out bench/guard/results/store_beat.json

One process: a TCPStore served here (as torchrun's agent serves it), a gloo process group of one rank on it, and
the guard's own publisher (:class:`zeropilot.guard.storebeat.StoreBeat`, the real class, one ``set`` per
``STORE_BEAT_S``). Measured:

- ``set_us``: one heartbeat ``set`` (the payload as a rank sends it, 40 frames deep) through a client of its own
  (TCPStore's ``set`` does not wait for a reply); ``payload_us``: building it (the main thread's frames, JSON) - the
  part that holds the GIL;
- ``get_us`` and ``round_trips_per_s``: a ``get`` of that heartbeat (a full round trip, what a node's watchdog does
  per rank and second), and how many one client does per second back to back;
- the step time of a CPU training step (a small MLP, forward, backward, SGD) in alternating blocks of ``--block-s``
  seconds (several beats) with and without the publisher running: ``overhead_pct`` (median of the per-pair
  differences), and the bound the rate limit gives: ``bound_pct`` = (payload_us + set_us) / STORE_BEAT_S as a share
  of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from zeropilot.guard import storebeat  # noqa: E402


class _Guard:
    """What the publisher reads of a rank's guard."""

    def __init__(self) -> None:
        self.rank, self.pid, self.host = 0, os.getpid(), "bench"
        self.phase, self.phase_since, self.step, self.progress, self.activity = "forward", time.time(), 0, 0, 0
        self._main_ident = threading.main_thread().ident


def _deep(n, fn):
    return fn() if n == 0 else _deep(n - 1, fn)


def _median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--block-s", type=float, default=5.0,
                    help="seconds of steps per block: several beats, so that the publisher runs in every 'on' block")
    args = ap.parse_args()
    torch.set_num_threads(1)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", server), rank=0, world_size=1)
    addr = ("127.0.0.1", server.port)
    guard = _Guard()
    beat = storebeat.StoreBeat.__new__(storebeat.StoreBeat)  # the real publisher, its thread started below
    beat.guard, beat.addr, beat.place, beat.key, beat.seq = guard, addr, {"node_rank": 0}, "zeropilot/hb/0", 0
    beat.store, beat.next_try, beat.errors, beat.sent = None, 0.0, 0, 0
    beat._stop, beat._lock = threading.Event(), threading.Lock()
    payload = {}
    build = _deep(35, lambda: _median_us(lambda: payload.update(p=json.dumps(beat.payload())), 2000))
    client = storebeat.connect(addr)
    value = payload["p"]
    set_us = _median_us(lambda: client.set("zeropilot/hb/bench", value), 2000)
    get_us = _median_us(lambda: client.get("zeropilot/hb/bench"), 2000)  # a round trip: the reply carries it
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 2.0:
        client.get("zeropilot/hb/bench")
        n += 1
    per_s = n / (time.perf_counter() - t0)

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512)

    def block() -> float:
        times = []
        end = time.perf_counter() + args.block_s
        while time.perf_counter() < end:
            s = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            guard.step += 1
            guard.progress += 1
            times.append(time.perf_counter() - s)
        return statistics.median(times)

    block()  # warm-up
    pairs = []
    sent = 0
    for i in range(args.pairs):
        first_on = i % 2 == 1  # alternate the order within a pair
        res = {}
        for on in ((True, False) if first_on else (False, True)):
            thread = None
            if on:
                beat._stop.clear()
                thread = threading.Thread(target=beat._loop, daemon=True)
                thread.start()
            res[on] = block()
            if thread is not None:
                beat._stop.set()
                thread.join()
        pairs.append({"off_s": res[False], "on_s": res[True], "sets": beat.sent - sent})
        sent = beat.sent
    diffs = [100 * (p["on_s"] - p["off_s"]) / p["off_s"] for p in pairs]
    step = statistics.median(p["off_s"] for p in pairs)
    result = {"command": "python bench/guard/store_beat.py " + " ".join(sys.argv[1:]),
              "torch": torch.__version__, "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
              "store_beat_s": storebeat.STORE_BEAT_S, "payload_bytes": len(value), "payload_us": round(build, 1),
              "set_us": round(set_us, 1), "get_us": round(get_us, 1), "round_trips_per_s": round(per_s),
              "sets_by_publisher": beat.sent, "block_s": args.block_s,
              "step_s": step, "beats_per_step": step / storebeat.STORE_BEAT_S,
              "bound_pct": round(100 * (build + set_us) * 1e-6 / storebeat.STORE_BEAT_S, 4),
              "overhead_pct": round(statistics.median(diffs), 3), "overhead_pct_pairs": [round(d, 3) for d in diffs],
              "pairs": pairs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("pairs",)}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
