"""Where the reserved-but-unallocated memory of a probe run lives, from the caching allocator's own history.

Reads the traces ``zero_mem_probe_plan.py`` writes with ``trace`` in the spec (events of
``torch.cuda.memory._record_memory_history``: alloc, free_completed, segment_alloc, segment_free; each tagged
with the phase it happened in, ``init`` or ``step``) and replays them. At the moment training's reserved
memory peaks it prints: allocated and reserved; the free bytes inside segments split by the phase that
created the segment (blocks cached from building the model and ``deepspeed.initialize`` against training's
own, and by segment size); the request that forced the last new segment; and the largest free block (why the
cache could not serve it). Also training's new segments over 1 GiB and the 32 MiB blocks it keeps (cuBLAS
workspaces, one per thread that runs matmuls). Under ``expandable_segments`` (issue 40's ``time/data/call1/traces``)
the events map and unmap pages (``segment_map``, ``segment_unmap``): a "segment" is then one mapped range, and a new
one the pages a request made the allocator map.
Usage: python bench/plan/analyze_trace.py TRACE.json.gz [...]
"""
from __future__ import annotations

import bisect
import gzip
import json
import sys
from collections import Counter

GIB = 1024**3


def _map(segments, addr, size, phase):
    """Expandable segments: pages mapped at ``addr`` join the mapped range they touch (a block may span two maps)."""
    before = next((a for a, (n, _) in segments.items() if a + n == addr), None)
    if before is not None:
        n, phase = segments.pop(before)
        addr, size = before, n + size
    after = segments.pop(addr + size, None)
    if after is not None:
        size += after[0]
    segments[addr] = (size, phase)


def _unmap(segments, addr, size):
    """Expandable segments: pages unmapped from inside a mapped range split it."""
    start = next(a for a, (n, _) in segments.items() if a <= addr < a + n)
    n, phase = segments.pop(start)
    if addr > start:
        segments[start] = (addr - start, phase)
    if addr + size < start + n:
        segments[addr + size] = (start + n - addr - size, phase)


def replay(events):
    """Yield (index, event, state) after every event; state: segments {addr: (size, phase)} (with expandable
    segments, each mapped range), blocks {addr: size}."""
    segments, blocks = {}, {}
    for i, event in enumerate(events):
        action, addr, size, phase = event[:4]  # call 11's traces add the stream
        if action == "segment_alloc":
            segments[addr] = (size, phase)
        elif action == "segment_free":
            segments.pop(addr, None)
        elif action == "segment_map":
            _map(segments, addr, size, phase)
        elif action == "segment_unmap":
            _unmap(segments, addr, size)
        elif action == "alloc":
            blocks[addr] = size
        elif action == "free_completed":
            blocks.pop(addr, None)
        yield i, (action, addr, size, phase), segments, blocks


def free_map(segments, blocks):
    """Free bytes per segment phase, and the largest free gap in any segment."""
    starts = sorted(segments)
    used = {a: 0 for a in starts}
    per_seg = {a: [] for a in starts}
    for addr, size in blocks.items():
        k = bisect.bisect_right(starts, addr) - 1
        if k >= 0:
            used[starts[k]] += size
            per_seg[starts[k]].append((addr, size))
    by_phase, largest = Counter(), 0
    for a in starts:
        size, phase = segments[a]
        by_phase[f"{phase} {_size_class(size)}"] += size - used[a]
        cur = a
        for b, s in sorted(per_seg[a]):
            largest = max(largest, b - cur)
            cur = b + s
        largest = max(largest, a + size - cur)
    return by_phase, largest


def _size_class(size: int) -> str:
    return "<=20MiB" if size <= 20 * 2**20 else "<=1GiB" if size <= GIB else ">1GiB"


def analyze(path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)
    alloc = reserved = 0
    peak_res, peak_alloc_step, at_peak, last_seg, at_alloc_peak = 0, 0, None, None, None
    init_end = None
    for i, (action, addr, size, phase, *_), segments, blocks in replay(events):
        if action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        elif action == "alloc":
            alloc += size
        elif action == "free_completed":
            alloc -= size
        if phase == "init":
            init_end = (alloc, reserved)
            continue
        if action == "alloc" and alloc > peak_alloc_step:
            peak_alloc_step, at_alloc_peak = alloc, (i, reserved)
        if action in ("segment_alloc", "segment_map") and reserved >= peak_res:
            peak_res = reserved
            # the alloc that forced this segment comes next; look it up then
            last_seg = (i, size)
            at_peak = None
        if last_seg and at_peak is None and action == "alloc" and i > last_seg[0]:
            by_phase, largest = free_map(segments, blocks)
            at_peak = dict(index=i, alloc=alloc, reserved=reserved, request=size, free=dict(by_phase),
                           largest_free=largest)
    if at_alloc_peak:  # replay again to the moment training's allocation peaked
        for i, _, segments, blocks in replay(events):
            if i == at_alloc_peak[0]:
                by_phase, largest = free_map(segments, blocks)
                at_alloc_peak = dict(reserved=at_alloc_peak[1], free=dict(by_phase), largest_free=largest)
                break
    seg_sizes = Counter()
    for action, _, size, phase, *_ in events:
        if action in ("segment_alloc", "segment_map"):
            seg_sizes[(phase, _size_class(size))] += size
    new_large = [e[2] for e in events if e[0] in ("segment_alloc", "segment_map") and e[3] == "step" and e[2] > GIB]
    kept = _kept_from_first_step(events)
    return dict(events=len(events), init_end=init_end, step_peak_alloc=peak_alloc_step, step_peak_reserved=peak_res,
                at_peak=at_peak, at_alloc_peak=at_alloc_peak, new_large=new_large, kept=kept, segments={f"{k[0]} {k[1]}": v for k, v in sorted(seg_sizes.items())})


def _kept_from_first_step(events) -> int:
    """32 MiB blocks allocated in training and never freed (one cuBLAS workspace per thread's handle)."""
    live = {}
    for action, addr, size, phase, *_ in events:
        if action == "alloc":
            live[addr] = (size, phase)
        elif action == "free_completed":
            live.pop(addr, None)
    return sum(1 for size, phase in live.values() if size == 32 * 2**20 and phase == "step")


def main(paths):
    for p in paths:
        r = analyze(p)
        g = lambda b: f"{b / GIB:.2f}"  # noqa: E731
        print(f"== {p.split('/')[-1]}  ({r['events']} events)")
        a, res = r["init_end"] or (0, 0)
        print(f"   end of init: alloc {g(a)} reserved {g(res)} (cached {g(res - a)})")
        print(f"   training: peak alloc {g(r['step_peak_alloc'])} peak reserved {g(r['step_peak_reserved'])}")
        if r["at_peak"]:
            ap = r["at_peak"]
            free = ", ".join(f"{k} {g(v)}" for k, v in ap["free"].items())
            print(f"   at the last new segment: alloc {g(ap['alloc'])} reserved {g(ap['reserved'])}; "
                  f"request {ap['request'] / 2**20:.1f} MiB; free in segments: {free}; "
                  f"largest free block {ap['largest_free'] / 2**20:.1f} MiB")
        if r["at_alloc_peak"]:
            ap = r["at_alloc_peak"]
            free = ", ".join(f"{k} {g(v)}" for k, v in ap["free"].items())
            print(f"   at training's peak alloc: reserved {g(ap['reserved'])}; free in segments: {free}; "
                  f"largest free block {ap['largest_free'] / 2**20:.1f} MiB")
        print("   training's new segments over 1 GiB: " + ", ".join(g(x) for x in r["new_large"]))
        print(f"   blocks of 32 MiB taken in training and never freed (cuBLAS workspaces): {r['kept']}")
        print("   segments: " + ", ".join(f"{k} {g(v)}" for k, v in r["segments"].items()))


if __name__ == "__main__":
    main(sys.argv[1:])
