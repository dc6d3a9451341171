"""ZeRO-1/2's large tensors (and ZeRO-3's with ``offload_param`` and the optimizer on the GPU) replayed through a model
of PyTorch's caching allocator: the segments it reserves.

The caching allocator never gives a segment back during training (nothing calls ``empty_cache``), so what it
reserves is the sum of the segments it ever had to create; a tensor gets a new segment when no free block is
large enough, however much is free in smaller pieces. Call 7's allocator histories (``bench/plan/
analyze_trace.py``, ``bench/plan/data/traces``) show ZeRO-1/2's peak set this way: ``deepspeed.initialize``
leaves the blocks the model was built in, a flattening copy and a zeroed fp32 gradient cached; the forward's
activations and the logits' fp32 copies take them or new segments; the optimizer step needs whole fp32
blocks of the partition's size, which the split cache no longer has.

Hand-written rather than run: PyTorch's allocator needs a GPU, and ``check``/``plan`` import no torch. It models
the large pool only (tensors of 1 MiB and more; smaller ones are left out): best fit over free blocks, split
when the rest is at least 1 MiB, merged with free neighbours on free; a new segment is the request rounded up
to 2 MiB, or 20 MiB for requests under 10 MiB (``c10/cuda/CUDACachingAllocator.cpp``: ``kMinLargeAlloc``,
``kLargeBuffer``, ``kRoundLarge``). The sequence of tensors is DeepSpeed 0.19.8's ZeRO-1/2 (``stage_1_and_2.py``)
and transformers' causal-LM loss, at the granularity of whole tensors; each decoder layer's tensors are taken as the
traces show them (``LAYER_TEMPLATES`` in ``memory/gpu.py``).

What is checked: fed each committed H200 trace's own requests, :class:`Allocator` ends with the segments the
real allocator had, within 0.2 GiB, on every committed trace but the overlap and side-stream ones (53; ZeRO-1/2/3,
LoRA, offload; two known exceptions named in ``tests/memory/test_segments.py``), so the policy is right. The synthetic request sequence follows the traces (``bench/plan/
analyze_trace.py``): each decoder layer's tensors with their lifetimes, and under checkpointing the first forward
run without autograd (each tensor released after its last use; call 52) and the recompute; freeze tuning's frozen
front layers run the same way, and without checkpointing keep the key/value cache's copies until the logits go;
the two cuBLAS workspaces every trace keeps (one for the forward's thread, one for autograd's); DeepSpeed's
``temp_grad_buffer_for_gpu_offload``; Gemma 2's soft-capped logits; the embedding's gradient at the end of
backward; the fp64 copies DeepSpeed takes for gradient norms. It ends within 2% of 23 of the 29 world-size-1
ZeRO-1/2 traces (``tests/memory/test_accuracy_bench.py``). Where it misses, a small long-lived tensor (the
backward's cuBLAS workspace) settled in a different hole than the real one, and a large block was or was not
reusable later; the overlap_comm stream's separate pool is not modelled. ``docs/plan.md`` lists the rows it misses.
:func:`zero3_reserved` replays DeepSpeed's stage-3 sequence the same way: parameter offload with the optimizer on the
GPU (call 7's and call 21's traces, within 2%; pre-registered call 32), and parameters on the GPU at world size 1,
the optimizer on the GPU or offloaded (calls 39 and 43's traces; there the ZeRO-3 reduction stream's pool is
modelled; pre-registered calls 40 and 44), and LoRA with both offloads at world size 1 (calls 34 and 35's traces:
the prefetched window of gathered parameters, :class:`_Window`).

Under ``expandable_segments:True`` (LLaMA-Factory's setting) the same sequences run through
:class:`ExpandableAllocator`, the allocator as it then works: one address range whose 20 MiB pages are mapped as the
program needs them, so what it reserves is the pages mapped. Fed the requests of issue 40's two expandable traces
(one H100, ``bench/plan/time/data/call1/traces``) it has mapped, after every request, what the real allocator had
(``tests/memory/test_h100_traces.py``).
"""

from __future__ import annotations

import bisect
import functools
from typing import Dict, List, Optional, Sequence, Tuple

MIB = 2**20
_SMALL = MIB  # under this, PyTorch's small pool: left out
_MIN_LARGE = 10 * MIB  # requests under this share 20 MiB segments
_LARGE_BUFFER = 20 * MIB
_ROUND = 2 * MIB
_CUBLAS_WORKSPACE = 32 * MIB  # CUBLAS_WORKSPACE_CONFIG's default, :4096:8, one per cuBLAS handle (per thread)
_NORM_CHUNK = 250_000_000  # stage3.py _constant_buffered_norm2's buffer_size, in elements


class _Block:
    __slots__ = ("size", "free", "prev", "next", "key")

    def __init__(self, size: int, key: int, prev: Optional["_Block"] = None, nxt: Optional["_Block"] = None):
        self.size, self.free, self.prev, self.next, self.key = size, True, prev, nxt, key  # key: its address


class Exceeded(Exception):
    """A replay given a ``ceiling`` reserved more than it once the run's set-up was done: what it reserves in the end
    is more still (segments are never given back during training), so ``plan --search`` needs no more of it."""


class Allocator:
    """Blocks linked in address order within their segment, free ones in a list sorted by (size, address) for
    best fit, as PyTorch's ``BlockPool`` orders them; ``reserved`` only grows, as without ``empty_cache``.
    ``ceiling`` (set once the set-up's last ``empty_cache`` is done): a new segment that takes ``reserved`` past it
    raises :class:`Exceeded`.

    Addresses: each new segment lies below the previous ones (what ``cudaMalloc`` gave on the H200 traces), so
    among equal free blocks the newest segment's is taken first.
    """

    def __init__(self) -> None:
        self.reserved = 0
        self.ceiling = float("inf")
        self._free: List[Tuple[int, int]] = []
        self._blocks: Dict[int, _Block] = {}
        self._base = 1 << 50

    def _new(self, size: int, addr: int, prev: Optional[_Block] = None, nxt: Optional[_Block] = None) -> _Block:
        block = _Block(size, addr, prev, nxt)
        self._blocks[addr] = block
        return block

    def _unlist(self, block: _Block) -> None:
        del self._free[bisect.bisect_left(self._free, (block.size, block.key))]

    def alloc(self, size: float) -> Optional[_Block]:
        size = int(size)
        if size < _SMALL:
            return None
        i = bisect.bisect_left(self._free, (size, 0))
        if i < len(self._free):
            block = self._blocks[self._free.pop(i)[1]]
        else:
            total = _LARGE_BUFFER if size < _MIN_LARGE else -(-size // _ROUND) * _ROUND
            self.reserved += total
            if self.reserved > self.ceiling:
                raise Exceeded(self.reserved)
            self._base -= total + _ROUND
            block = self._new(total, self._base)
        if block.size - size >= _SMALL:
            rest = self._new(block.size - size, block.key + size, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            bisect.insort(self._free, (rest.size, rest.key))
        block.free = False
        return block

    def empty_cache(self) -> None:
        """Give back every segment that is one free block (``torch.cuda.empty_cache``)."""
        for addr, block in list(self._blocks.items()):
            if block.free and block.prev is None and block.next is None:
                self._unlist(block)
                del self._blocks[addr]
                self.reserved -= block.size

    def _join(self, left: _Block, right: _Block) -> _Block:
        """Merge ``right`` into its left neighbour ``left`` (neither in the free list)."""
        return _absorb(self._blocks, left, right)

    def free(self, block: Optional[_Block]) -> None:
        if block is None:
            return
        block.free = True
        if block.next is not None and block.next.free:
            self._unlist(block.next)
            block = self._join(block, block.next)
        if block.prev is not None and block.prev.free:
            self._unlist(block.prev)
            block = self._join(block.prev, block)
        bisect.insort(self._free, (block.size, block.key))


_PAGE = _LARGE_BUFFER  # an expandable segment maps the large pool's memory in pages of kLargeBuffer (20 MiB)
_ROUND_REQUEST = 512  # kMinBlockSize: every request rounded up to it


class ExpandableAllocator:
    """The caching allocator's large pool under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, as
    ``c10/cuda/CUDACachingAllocator.cpp`` runs it (torch 2.11): one virtual address range per stream, of which only
    the pages the program needs are backed by memory (``ExpandableSegment``, pages of ``kLargeBuffer``, 20 MiB, in the
    large pool), so what it reserves is the pages mapped, not the segments made.

    - A request (rounded up to 512 bytes) takes the best-fitting free mapped block by (size, address), but a free block
      that ends where the unmapped range begins counts as large as it could grow, so any other free block that fits is
      taken first (``get_free_block``'s ``expandable_size``).
    - When none fits, the lowest unmapped range that can hold it, together with the free block just before it and any
      free or unmapped blocks after it, is mapped: just the pages the request still lacks beyond that free block, so the
      free end of the mapped range is used before anything is added (``find_expandable_block``, ``map_block``).
    - A block is split whenever anything is left over (``should_split``: 512 bytes), and merges with free neighbours
      on release, never across an unmapped range.
    - ``empty_cache`` unmaps every whole page inside a free block (``release_blocks``, ``unmap_block``); nothing else
      gives memory back. A later request maps such a hole again, lowest address first, when the hole with its
      neighbours can hold it.

    Requests of 1 MiB and under (the small pool, with its own 2 MiB pages) are left out.
    Same interface as :class:`Allocator`; ``ceiling`` likewise.
    """

    def __init__(self) -> None:
        self.reserved = 0
        self.ceiling = float("inf")
        self._free: List[Tuple[int, int]] = []  # free mapped blocks by (size, address)
        self._unmapped: List[int] = []  # unmapped blocks by address
        self._blocks: Dict[int, _XBlock] = {}
        self._add(_XBlock(1 << 50, 0, mapped=False))  # the reserved address range: far more than any GPU has

    def _add(self, block: "_XBlock") -> "_XBlock":
        self._blocks[block.key] = block
        if not block.mapped:
            bisect.insort(self._unmapped, block.key)
        elif block.free:
            bisect.insort(self._free, (block.size, block.key))
        return block

    def _drop(self, block: "_XBlock") -> None:
        """Take ``block`` out of its list (not out of the address chain)."""
        if not block.mapped:
            del self._unmapped[bisect.bisect_left(self._unmapped, block.key)]
        elif block.free:
            del self._free[bisect.bisect_left(self._free, (block.size, block.key))]

    def _merge(self, left: "_XBlock", right: "_XBlock") -> "_XBlock":
        """``right`` into its left neighbour ``left`` (both out of their lists, alike in being free and mapped)."""
        return _absorb(self._blocks, left, right)

    def _coalesce(self, block: "_XBlock") -> "_XBlock":
        """``block`` (out of its lists) merged with free neighbours of its own kind (mapped or not)."""
        for side in (block.next, block.prev):
            if side is not None and side.free and side.mapped == block.mapped:
                self._drop(side)
                block = self._merge(block, side) if side is block.next else self._merge(side, block)
        return block

    def _split(self, block: "_XBlock", size: int, mapped: bool) -> "_XBlock":
        """The first ``size`` bytes of ``block`` (out of its lists) stay it; the rest becomes a free block, listed."""
        rest = _XBlock(block.size - size, block.key + size, mapped=mapped, prev=block, nxt=block.next)
        if block.next is not None:
            block.next.prev = rest
        block.next, block.size = rest, size
        self._add(rest)
        return block

    def _map(self, block: "_XBlock", size: int) -> "_XBlock":
        """Back the first ``size`` bytes of the unmapped ``block`` (out of its list) with whole pages; the mapped part,
        merged with free mapped neighbours, returned out of the free list."""
        pages = -(-size // _PAGE) * _PAGE
        self.reserved += pages
        if self.reserved > self.ceiling:
            raise Exceeded(self.reserved)
        if pages < block.size:
            self._split(block, pages, mapped=False)
        block.mapped = True
        return self._coalesce(block)

    def _expandable(self, key: Tuple[int, int]) -> int:
        block = self._blocks[key[1]]
        return block.size + (block.next.size if block.next is not None and not block.next.mapped else 0)

    def _grow(self, size: int) -> "_XBlock":
        """Map what ``size`` lacks: the lowest unmapped range whose free neighbours and itself can hold it."""
        for key in self._unmapped:
            start = self._blocks[key]
            if start.prev is not None and start.prev.free:
                start = start.prev
            room, b = 0, start
            while room < size and b is not None and b.free:
                room, b = room + b.size, b.next
            if room >= size:
                break
        self._drop(start)
        if not start.mapped:
            start = self._map(start, min(start.size, size))
        self._add(start)
        while start.size < size:  # a free mapped block, then an unmapped one (and what lies beyond it)
            nxt = start.next
            self._drop(nxt)
            start = self._map(nxt, min(size - start.size, nxt.size))  # merged with the block before it
            self._add(start)
        self._drop(start)
        return start

    def alloc(self, size: float) -> Optional["_XBlock"]:
        size = int(size)
        if size <= _SMALL:  # get_pool: kSmallSize and under is the small pool's
            return None
        size = -(-size // _ROUND_REQUEST) * _ROUND_REQUEST
        i = bisect.bisect_left(self._free, (size, 0))
        if i < len(self._free):
            while i + 1 < len(self._free) and self._expandable(self._free[i + 1]) < self._expandable(self._free[i]):
                i += 1
            block = self._blocks[self._free.pop(i)[1]]
        else:
            block = self._grow(size)
        if block.size - size >= _ROUND_REQUEST:
            self._split(block, size, mapped=True)
        block.free = False
        return block

    def free(self, block: Optional["_XBlock"]) -> None:
        if block is None:
            return
        block.free = True
        self._add(self._coalesce(block))

    def empty_cache(self) -> None:
        """Unmap every whole page inside a free mapped block (``torch.cuda.empty_cache``)."""
        for size, key in list(self._free):
            start, end = -(-key // _PAGE) * _PAGE, (key + size) // _PAGE * _PAGE
            if start >= end:
                continue
            block = self._blocks[key]
            self._drop(block)
            if start > key:  # the mapped part before the first whole page stays, free
                self._split(block, start - key, mapped=True)
                self._add(block)
                block = block.next
                self._drop(block)
            if end < block.key + block.size:  # and the part after the last one
                self._split(block, end - start, mapped=True)
            block.mapped = False
            self.reserved -= end - start
            self._add(self._coalesce(block))


class _XBlock:
    __slots__ = ("size", "free", "mapped", "prev", "next", "key")

    def __init__(self, size: int, key: int, mapped: bool = True, prev: Optional["_XBlock"] = None,
                 nxt: Optional["_XBlock"] = None):
        self.size, self.key, self.mapped, self.prev, self.next = size, key, mapped, prev, nxt
        self.free = True


@functools.lru_cache(maxsize=64)
def _schedule(layer: Tuple[Tuple[float, Optional[int]], ...]) -> Tuple[tuple, tuple]:
    """``layer`` compiled once: per tensor (sizes, the tensors released before it, whether it is kept), and the
    tensors released at the layer's end; tensors under 1 MiB (PyTorch's small pool) are left out."""
    steps, due = [], {}
    for i, (size, until) in enumerate(layer):
        steps.append((int(size), tuple(due.pop(i, ())), until is None))
        if until is not None and size >= _SMALL:
            due.setdefault(min(until, len(layer)), []).append(i)
    return tuple(steps), tuple(i for k in sorted(due) for i in due[k])


class _Window:
    """ZeRO-3's gathered parameters once the first step has recorded the module trace: the coordinator prefetches the
    parameters of the modules ahead until ``stage3_max_live_parameters`` elements are gathered, and releases each
    module's once it is done (``partitioned_param_coordinator.py`` ``fetch_sub_module``, ``release_sub_module``).
    Replayed per decoder layer: its parameters gathered in order, each after releasing the longest-gathered ones
    beyond ``budget`` bytes (never the layer's own); call 35's traces show one gather after each release, about
    ``max_live_parameters`` elements gathered through the forward, and the output layer's weight among them at the
    loss."""

    def __init__(self, pool: "Allocator", budget: float) -> None:
        self.pool, self.budget, self.held = pool, budget, 0.0
        self.live: Dict[object, Tuple[Optional[_Block], float]] = {}  # in gather order

    def fetch(self, key: object, sizes: Sequence[float]) -> None:
        for j, size in enumerate(sizes):
            if (key, j) in self.live:
                continue
            for old in [k for k in self.live if k[0] != key]:
                if self.held + size <= self.budget:
                    break
                block, gone = self.live.pop(old)
                self.pool.free(block)
                self.held -= gone
            self.live[(key, j)] = (self.pool.alloc(size), size)
            self.held += size

    def release_all(self) -> None:
        """The step's end: every gathered parameter released (``release_and_reset_all``)."""
        for block, _ in self.live.values():
            self.pool.free(block)
        self.live, self.held = {}, 0.0


def _forward(pool: "Allocator", layer: Sequence[Tuple[float, Optional[int]]]) -> List[Optional[_Block]]:
    """One decoder layer's forward: every tensor taken in order and released at its index; the kept ones returned.
    A release index past the layer's end (the residual stream, used by the next layer) is taken as its end."""
    steps, last = _schedule(tuple(layer))
    blocks: List[Optional[_Block]] = [None] * len(steps)
    kept = []
    for i, (size, release, keep) in enumerate(steps):
        for k in release:
            pool.free(blocks[k])
        block = blocks[i] = pool.alloc(size) if size >= _SMALL else None
        if keep:
            kept.append(block)
    for k in last:
        pool.free(blocks[k])
    return kept


def _gather(pool: "Allocator", window: Optional[_Window], key: object,
            sizes: Sequence[float]) -> List[Optional[_Block]]:
    """Parameters gathered (``key``: a layer's index, or a name): the blocks to release once they are used, or none
    when ``window`` holds them."""
    if window is not None:
        window.fetch(key, sizes)
        return []
    return [pool.alloc(size) for size in sizes]


def _forward_pass(pool: "Allocator", layer: Sequence[Tuple[float, Optional[int]]], layers: int, checkpointed: bool,
                  edges: Tuple[float, Sequence[Tuple[float, Optional[int]]]],
                  gathered: Sequence[Sequence[float]] = (),
                  window: Optional[_Window] = None,
                  no_grad_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None, frozen: int = 0,
                  front_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None,
                  workspace: bool = False) -> Tuple[List[Optional[_Block]], List[Optional[_Block]]]:
    """The decoder's forward (arguments as :func:`zero12_reserved`'s): the tensors kept for the backward, and the
    frozen front layers' key/value cache (``front_layer``'s kept tensors before its output), which the model's output
    holds until the loss releases it with the logits.
    ``gathered``: per layer, the 16-bit parameters ZeRO-3 gathers before it and releases after it (or, with
    ``window``, leaves to the window). Under checkpointing each layer runs as ``no_grad_layer`` (the same layer without
    autograd: each tensor released after its last use, the output kept as the next layer's input; or, where that is
    not known, ``layer`` with its tensors released once it is done and its output taken after them); layer 0's input
    is the embedding's output, and the last layer's output is released after the final norm, which keeps its own fp32
    copy (call 41's trace)."""
    first = pool.alloc(edges[0])  # the embedding's output
    if workspace:
        pool.alloc(_CUBLAS_WORKSPACE)
    cache: List[Optional[_Block]] = []
    for _ in range(frozen):  # freeze tuning's frozen layers before the first trainable one: nothing saved
        out = _forward(pool, front_layer or ())
        pool.free(first)
        first = out.pop() if out else pool.alloc(edges[0])
        cache += out  # without checkpointing, the key/value cache's copies
    # layer ``frozen``'s input: kept for the backward (as layer 0's, the embedding's output, when nothing is frozen)
    acts: List[Optional[_Block]] = [None, first] if checkpointed else [first]
    for index in range(frozen, layers):
        params = _gather(pool, window, index, gathered[index] if gathered else ())
        if checkpointed and no_grad_layer:  # run without autograd: its output is the kept tensor
            acts += _forward(pool, no_grad_layer)
        elif checkpointed:  # the layer's tensors released once it is done; its output kept as the next one's input
            for b in _forward(pool, layer):
                pool.free(b)
            acts.append(pool.alloc(edges[0]))
        else:
            acts += _forward(pool, layer)
        for b in params:
            pool.free(b)
    norm = _forward(pool, edges[1])  # the final norm's
    if checkpointed:
        pool.free(acts.pop())  # the last layer's output: the norm keeps its own fp32 copy
    return acts + norm, cache


def _causal_lm_loss(pool: "Allocator", logits_bf16: float, logits_fp32: float, softcap: bool,
                    released: Sequence[Optional[_Block]] = (),
                    output: Sequence[Optional[_Block]] = ()) -> Optional[_Block]:
    """transformers' causal-LM loss, as call 7's traces show it: bf16 logits, fp32 upcast, log-softmax, then in
    backward two fp32 gradients and the bf16 one, which is returned (held until the output layer's gradient).
    ``output``: the rest of the model's output (the key/value cache), released with the logits once the loss is
    taken from it."""
    lb = pool.alloc(logits_bf16)
    for b in released:  # ZeRO-3: the output layer's gathered weight, released after its forward
        pool.free(b)
    capped = []
    if softcap:  # Gemma 2: logits / cap, tanh (kept for its backward), * cap: each a new bf16 tensor
        d = pool.alloc(logits_bf16)
        pool.free(lb)
        capped = [pool.alloc(logits_bf16)]
        pool.free(d)
        lb = pool.alloc(logits_bf16)
    f1, f2 = pool.alloc(logits_fp32), pool.alloc(logits_fp32)
    pool.free(f1)
    pool.free(lb)
    for b in output:  # the model's output held the logits and the key/value cache (call 3's traces)
        pool.free(b)
    f3, f4 = pool.alloc(logits_fp32), pool.alloc(logits_fp32)
    pool.free(f3)
    pool.free(f2)
    gb = pool.alloc(logits_bf16)
    pool.free(f4)
    for t in capped:  # the gradient through * cap, tanh and / cap
        for _ in range(2):
            g = pool.alloc(logits_bf16)
            pool.free(gb)
            gb = g
        pool.free(t)
        g = pool.alloc(logits_bf16)
        pool.free(gb)
        gb = g
    return gb


def _accumulated(pool: "Allocator", micro_batches: int, first_step: bool, buckets: Sequence[float],
                 layer_grads: Sequence[float], output_grad: float, embedding_grad: float, tied: bool,
                 model: dict, loss: Tuple[float, float, bool]) -> List[Optional[_Block]]:
    """ZeRO-1's micro batches before the accumulation boundary (DeepSpeed 0.19.8, ``engine.allreduce_gradients``
    and ``stage_1_and_2.py`` ``process_gradients``): nothing is reduced, so the first one's backward leaves
    autograd's 16-bit gradient of every trainable tensor (the output layer's right after the loss, each decoder
    layer's as its backward begins, the embedding's last; tied, the two summed into a third) and the reduce bucket
    its first gradient hook takes (``setup_buckets``; released only by the boundary's epilogue); the later ones add
    into them, each new gradient released once added. Returns the bucket blocks, then the gradients.
    ``model``: :func:`_forward_pass`'s keyword arguments; ``loss``: the logits' bf16 and fp32 bytes, and softcap."""
    out: List[Optional[_Block]] = []
    grads: List[Optional[_Block]] = []
    for micro in range(micro_batches - 1):
        acts, cache = _forward_pass(pool, workspace=first_step and micro == 0, **model)
        gb = _causal_lm_loss(pool, *loss, output=cache)
        og = pool.alloc(output_grad)
        if first_step and micro == 0:  # autograd's cuBLAS workspace, kept
            pool.alloc(_CUBLAS_WORKSPACE)
        pool.free(gb)
        if micro == 0:
            out = [pool.alloc(size) for size in buckets]
            grads.append(og)
        else:
            pool.free(og)
        kept = _backward_pass(pool, acts, model["layer"], model["checkpointed"], model["edges"],
                              layer_grads=[(size, micro == 0) for size in layer_grads], layers=model["layers"])
        grads += kept
        if embedding_grad:
            parts = [pool.alloc(embedding_grad) for _ in range(2 if tied else 1)]
            keep = parts.pop() if micro == 0 else None
            for b in parts:
                pool.free(b)
            grads.append(keep)
    return out + grads


def _backward_pass(pool: "Allocator", acts: List[Optional[_Block]], layer: Sequence[Tuple[float, Optional[int]]],
                   checkpointed: bool, edges: Tuple[float, Sequence[Tuple[float, Optional[int]]]],
                   gathered: Sequence[Sequence[float]] = (), window: Optional[_Window] = None,
                   layer_grads: Sequence[Tuple[float, bool]] = (), layers: int = 0) -> List[Optional[_Block]]:
    """The decoder's backward: the forward's kept tensors released last to first; under checkpointing each layer's
    forward runs again (with its gathered parameters, ZeRO-3) before its gradient.

    ``layer_grads``: each decoder layer's weight gradients (bytes, whether autograd keeps it as ``param.grad``; if
    not, it is added into the kept one and released), made as the layer's backward begins, while the inputs they
    are computed from are still held; the kept ones are returned (ZeRO-1 before the accumulation boundary).
    ``layers``: the decoder layers ``acts`` holds (with ``layer_grads``, all of them: none frozen)."""
    final = sum(1 for _, until in edges[1] if until is None)
    index = len(acts) - final - 1  # the last layer's
    per_layer = 0 if checkpointed or not layer_grads else (len(acts) - final - 1) // layers  # kept tensors each
    kept: List[Optional[_Block]] = []
    for k, b in enumerate(reversed(acts)):
        starts = (final <= k < len(acts) - 1) and (checkpointed or (per_layer and (k - final) % per_layer == 0))
        if checkpointed and final <= k < len(acts) - 1:  # the layer's forward again, then its gradient
            index -= 1
            params = _gather(pool, window, index, gathered[index] if gathered else ())
            for r in _forward(pool, layer):
                pool.free(r)
            for p in params:
                pool.free(p)
        if layer_grads and starts:
            for size, keep in layer_grads:
                g = pool.alloc(size)
                if keep:
                    kept.append(g)
                else:
                    pool.free(g)
        pool.free(b)
    return kept


def zero12_reserved(*, build: Sequence[float], frozen: Sequence[float], trainable: float, world_size: int,
                    gpu_optimizer: bool, layer: Sequence[Tuple[float, Optional[int]]], layers: int, checkpointed: bool,
                    edges: Tuple[float, Sequence[Tuple[float, Optional[int]]]], logits_bf16: float,
                    logits_fp32: float, output_grad: float, buckets: Sequence[float], embedding_grad: float = 0.0,
                    tied: bool = False, softcap: bool = False, norm_pieces: Sequence[float] = (),
                    grad_partition: float = 0.0, first_reduction: Tuple[int, float] = (0, 0.0),
                    steps: int = 2,
                    no_grad_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None,
                    ceiling: float = float("inf"), eight_bit: bool = False, frozen_layers: int = 0,
                    front_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None,
                    expandable: bool = False, second_group: bool = False, foreach: bool = True,
                    micro_batches: int = 1, layer_grads: Sequence[float] = (),
                    partition_gradients: bool = False) -> int:
    """Bytes the caching allocator reserves for ZeRO-1/2's large tensors over ``steps`` training steps.

    Raises:
        Exceeded: it would reserve more than ``ceiling`` (checked once the set-up has emptied the cache).

    Args:
        build: bytes of each trainable tensor as the model is built (freed once flattened).
        frozen: bytes of each frozen tensor (LoRA's base model; stays where it was built).
        trainable: trainable elements; ``world_size``: data-parallel ranks (the partition is 1/N).
        gpu_optimizer: the optimizer's fp32 state is on the GPU (no ``offload_optimizer``).
        layer: one decoder layer's forward, tensor by tensor: (bytes, the index of the tensor before which it is
            released, counted on from this layer's first; None: kept for the backward). ``layers`` of them.
        checkpointed: gradient checkpointing: the forward keeps each layer's input only, and the backward runs
            each layer's forward again before its gradient; ``no_grad_layer``: the layer's first forward, run without
            autograd (``memory.gpu.NO_GRAD_TEMPLATES``; None: ``layer``'s tensors, each released with the layer).
        edges: bytes of the embedding's output, and the final norm's forward (as ``layer``).
        logits_bf16 / logits_fp32: the logits in bf16 and one fp32 copy of them; ``softcap``: Gemma 2's final
            soft-capping (three more bf16 logits in the forward, three in the backward).
        output_grad: bytes of the output layer's weight gradient, taken right after the logits' backward and
            held until the end of backward (0 when the output layer is frozen).
        buckets: the reduce buckets, taken at the first gradient and released after backward.
        embedding_grad: bytes of the input embedding's gradient, the last one backward produces (0 when frozen);
            ``tied``: it is the output layer's weight too, and autograd sums the two gradients into a third tensor.
        norm_pieces: elements of each trainable tensor in this rank's partition. DeepSpeed takes each one's norm in
            fp64 (``get_norm_dtype``): an 8-byte copy per tensor, at the step without ``offload_optimizer``; with it,
            at the last reduction, followed by the fp32 copy that goes to the CPU.
        frozen_layers: freeze tuning: the decoder layers before the first trainable one, which run without autograd
            as ``front_layer`` (each tensor released after its last use, the output kept as the next layer's input,
            the input released once the output exists); the first trainable layer's input is kept, as the
            embedding's output is when nothing is frozen. Tensors ``front_layer`` keeps before its output are the
            key/value cache's copies (without checkpointing, ``memory.gpu.front_layer``): the model's output holds
            them, so they are released with the logits.
        eight_bit: the optimizer is bitsandbytes' 8-bit AdamW (a client optimizer): its first step makes two one-byte
            states and their fp32 absmax per 256 elements (``Optimizer2State.init_state``), and its fused kernel
            updates in place (no temporary); otherwise AdamW's two fp32 states and one foreach temporary.
        expandable: ``expandable_segments:True``: the pages :class:`ExpandableAllocator` maps, not the segments
            :class:`Allocator` makes.
        second_group: DeepSpeed has a second parameter group (the HF Trainer's biases and norm weights, without
            weight decay, ``memory.tuning.second_param_group``): the loop over groups empties the cache again before
            flattening it, once the first group's fp32 master is made (``stage_1_and_2.py``, 0.19.8; call 1's trace
            ``call1_q3_freeze_z2_exp``, events 712-713); its own tensors are small and left out.
        foreach: the optimizer is torch's foreach AdamW (``torch_adam``), whose step makes one fp32 temporary of the
            partition (the square root of ``exp_avg_sq``); DeepSpeed's FusedAdam and the HF Trainer's default
            ``adamw_torch_fused`` update in place (call 1's traces: no such tensor).
        micro_batches: ZeRO-1's gradient accumulation steps, with ``layer_grads`` (each decoder layer's 16-bit gradient
            bytes, one per trainable tensor, in backward order) set: before the boundary nothing is reduced
            (``engine.allreduce_gradients`` reduces ZeRO-1 only at the boundary; ``process_gradients`` reduces only
            with ``partition_gradients`` or ``overlap_comm``), so autograd's per-parameter gradients, made in the first
            micro batch's backward, and the reduce bucket its first hook takes (``setup_buckets``) stay through the
            later micro batches' forward and backward, until the boundary's reduction and epilogue
            (:func:`_accumulated`). 1 (the default): each step is its boundary micro batch alone.
        partition_gradients: ZeRO-2 (with ``micro_batches``, the optimizer on the GPU): every micro batch reduces as
            the boundary's does, its buckets and a new flat gradient partition (``grads_in_partition``) taken as
            there, but the epilogue (``independent_gradient_partition_epilogue``) keeps the first micro batch's
            partition in ``all_grad_tensors`` (views of it) and adds each later one into it, releasing that one with
            the buckets (``_release_ipg_buffers``, ``_clear_param_grad_only``); at the boundary it becomes
            ``averaged_gradients``, which the step flattens. Witness: tests/memory/test_zero2_accumulation.py.
    """
    pool = ExpandableAllocator() if expandable else Allocator()
    part = trainable / world_size
    if eight_bit:
        first_step = [part, part, 4 * -(-part // 256), 4 * -(-part // 256)]  # state1, state2, absmax1, absmax2
    else:
        first_step = [4 * part, 4 * part]  # exp_avg, exp_avg_sq
    for size in frozen:
        pool.alloc(size)
    built = [pool.alloc(size) for size in build]
    pool.empty_cache()  # stage_1_and_2.py calls empty_cache() before it flattens each group
    pool.alloc(2 * trainable)  # the aligned 16-bit flat buffer the parameters become views of
    for b in built:
        pool.free(b)
    # the fp32 master is this rank's 16-bit partition cloned and then cast (stage_1_and_2.py:
    # ``...[partition_id].detach().clone().to(device=..., dtype=...)``): a 16-bit copy of the partition while the
    # fp32 one is made (and, with offload_optimizer, copied to the CPU); call 22's world-size-2 trace shows it as its
    # own 1/N block
    clone = pool.alloc(2 * part)
    if gpu_optimizer:
        pool.alloc(4 * part)  # fp32 master partition
    pool.free(clone)
    if second_group:  # the next group's empty_cache(); its own tensors are small
        pool.empty_cache()
    pool.ceiling = ceiling  # nothing empties the cache from here on
    if pool.reserved > ceiling:
        raise Exceeded(pool.reserved)
    if gpu_optimizer:
        pool.free(pool.alloc(4 * part))  # initialize_optimizer_states' zeroed fp32 gradient
    states = 0

    def reduce() -> List[Optional[_Block]]:
        if not gpu_optimizer:
            return []
        pool.free(pool.alloc(first_reduction[1]))  # the flattened bucket, across ranks
        return [pool.alloc(grad_partition or 2 * part)]

    for step in range(steps):
        if step == 0 and not gpu_optimizer:  # temp_grad_buffer_for_gpu_offload: 16-bit, the largest parameter's
            pool.alloc(max(list(build) + list(frozen), default=0))  # size, kept
        accumulated: List[Optional[_Block]] = []  # ZeRO-1's gradients and bucket held since the first micro batch
        if micro_batches > 1 and not partition_gradients:
            accumulated = _accumulated(pool, micro_batches, step == 0, buckets, layer_grads, output_grad,
                                       embedding_grad, tied, dict(layer=layer, layers=layers,
                                                                   checkpointed=checkpointed, edges=edges,
                                                                   no_grad_layer=no_grad_layer,
                                                                   frozen=frozen_layers, front_layer=front_layer),
                                       (logits_bf16, logits_fp32, softcap))
        # ZeRO-2 accumulating: the first micro batch's flat gradient partition, which ``all_grad_tensors`` keeps
        partition: List[Optional[_Block]] = []
        for micro in range(micro_batches if partition_gradients else 1):
            first = step == 0 and micro == 0 and not accumulated  # the first backward: autograd's cuBLAS workspace
            acts, cache = _forward_pass(pool, layer, layers, checkpointed, edges, no_grad_layer=no_grad_layer,
                                        frozen=frozen_layers, front_layer=front_layer, workspace=first)
            gb = _causal_lm_loss(pool, logits_bf16, logits_fp32, softcap, output=cache)
            og = pool.alloc(output_grad)  # the output layer's weight gradient
            if first:  # autograd's thread has its own cuBLAS handle: a second workspace, kept
                pool.alloc(_CUBLAS_WORKSPACE)
            pool.free(gb)
            # setup_buckets, at the first gradient hook (ZeRO-1 accumulating: the first micro batch's, still held)
            held = [] if accumulated else [pool.alloc(size) for size in buckets]
            # the flat 16-bit gradient partition (copy_grads_in_partition: every parameter that reaches into this
            # rank's partition, whole), taken at the first reduction of a bucket that holds one of this rank's
            # gradients: ZeRO-1 too reduces through the buckets into one (0.19.8), and at world size 1 the two stages
            # reserve alike (11 measured groups, tests/memory/test_accuracy_bench.py). Across ranks that reduction
            # first flattens the bucket (allreduce_bucket): ``first_reduction`` says after how many layers' backward,
            # and the bytes it flattens.
            after = first_reduction[0]
            grads: List[Optional[_Block]] = []
            if after < layers and not accumulated:  # during the layers' backward: at its start, as the traces show
                grads = reduce()
            _backward_pass(pool, acts, layer, checkpointed, edges,
                           layer_grads=[(size, False) for size in layer_grads] if accumulated else (), layers=layers)
            kept = None
            if embedding_grad:  # the embedding's gradient comes last; tied, it is summed with the output layer's
                parts = [pool.alloc(embedding_grad) for _ in range(2 if tied else 1)]
                if embedding_grad > max(buckets, default=0):  # larger than a bucket: reduced alone, kept to the end
                    kept = parts.pop()
                for b in parts:
                    pool.free(b)
            pool.free(og)
            if after >= layers or accumulated:  # the reduction the embedding's gradient starts, or backward's epilogue
                grads = reduce()  # (ZeRO-1 accumulating: reduce_gradients after the boundary's backward)
            for b in accumulated[len(buckets):]:  # each accumulated gradient, copied into the partition, released
                pool.free(b)
            held += accumulated[:len(buckets)]  # the bucket: released with the epilogue's _release_ipg_buffers
            if not gpu_optimizer:  # each gradient's fp64 norm and its fp32 copy to the CPU partition, in arrival order
                for n in reversed(norm_pieces):
                    pool.free(pool.alloc(8 * n))
                    pool.free(pool.alloc(4 * n))
            pool.free(kept)
            for b in held:
                pool.free(b)
            if micro == 0:
                partition = grads
            else:  # the epilogue drops grads_in_partition and param.grad once added into the first partition
                for b in grads:
                    pool.free(b)
        grads = partition  # averaged_gradients at the boundary: the first micro batch's partition
        if gpu_optimizer:
            for n in norm_pieces:  # scaled_global_norm: each gradient's norm in fp64
                pool.free(pool.alloc(8 * n))
            flat_grads = pool.alloc(2 * part)  # flatten(averaged_gradients)
            g32 = pool.alloc(4 * part)  # ... as fp32
            pool.free(flat_grads)
            for b in grads:
                pool.free(b)
            grads = []
            for size in first_step[states:]:  # the optimizer's states, on the first step
                pool.alloc(size)
            states = len(first_step)
            if not eight_bit and foreach:
                pool.free(pool.alloc(4 * part))  # foreach temporary (sqrt of exp_avg_sq)
            pool.free(g32)
        for b in grads:
            pool.free(b)
    return pool.reserved


def zero3_reserved(*, build: Sequence[float], sub_groups: Sequence[float], bucket: float, grad_partition: float,
                   layer: Sequence[Tuple[float, Optional[int]]], layers: int, gathered: Sequence[Sequence[float]],
                   embedding: float, checkpointed: bool, edges: Tuple[float, Sequence[Tuple[float, Optional[int]]]],
                   logits_bf16: float, logits_fp32: float, output_grad: float, softcap: bool = False,
                   norm_pieces: Sequence[float] = (), frozen: Sequence[float] = (), flat: float = 0.0,
                   side_stream: float = 0.0, offload_buckets: Sequence[Sequence[float]] = (),
                   hooked: Sequence[float] = (), live: float = 0.0,
                   init_gathers: Sequence[Tuple[float, float]] = (), steps: int = 2,
                   no_grad_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None,
                   ceiling: float = float("inf"), init_order: Sequence[Tuple[float, bool]] = (),
                   frozen_layers: int = 0,
                   front_layer: Optional[Sequence[Tuple[float, Optional[int]]]] = None,
                   expandable: bool = False, foreach: bool = True) -> int:
    """Bytes the caching allocator reserves for ZeRO-3: parameters offloaded with the optimizer on the GPU (full
    fine-tuning) or offloaded too (LoRA, at world size 1), or parameters on the GPU at world size 1 (where nothing is
    gathered) with the optimizer on the GPU or offloaded.

    The sequence is DeepSpeed 0.19.8's (``runtime/zero/stage3.py``), as call 7's and call 21's allocator traces show
    it. Without ``zero.Init`` the whole 16-bit model is built on the GPU, one tensor each (``build``; in ``zero.Init``
    it is empty). With ``offload_param`` ``deepspeed.initialize`` moves them to the CPU and nothing empties the cache,
    so those blocks stay. With the parameters on the GPU (``flat``) each tensor is partitioned into a copy (at world
    size 1 the whole tensor; in ``zero.Init`` as soon as it is built) and the original released; the frozen ones
    (``frozen``, LoRA's base model) stay where they were copied, and ``defragment`` moves the trainable ones to the
    CPU, empties the cache and brings them back as one flat buffer (``_create_fp16_partitions_with_defragmentation``,
    ``runtime/zero/utils.py``). ``_create_fp32_partitions`` makes each sub-group's fp32 master from its 16-bit
    partition: a converted fp32 copy on the GPU (released when the next one is made) and its clone (kept).
    ``initialize_optimizer_states`` zeroes an fp32 gradient of the largest sub-group, released. The reduce bucket and
    the 16-bit gradient partition stay for the whole run. ``create_reduce_and_remove_grad_hooks`` then gathers each
    trainable parameter whole and releases it (``hooked``; call 45's trace: with the optimizer offloaded nothing is
    cached by then, so the largest one takes a segment of its own, which later holds the cuBLAS workspaces). Each step
    gathers every layer's parameters (``gathered``; the embedding's and the output layer's, ``embedding``; none at world
    size 1 with the parameters on the GPU: ``_no_gather_coalesced``): in the first step each layer's before it and
    released after it; from the second on, once the module trace is complete, through :class:`_Window` (``live``), the
    prefetched window of ``stage3_max_live_parameters`` elements. It runs the forward and the loss (as ZeRO-1/2's
    replay), takes each gradient's norm through an fp64 copy (``get_grad_norm_direct``), and then the optimizer works
    one sub-group at a time (``_prepare_sub_group``, ``_optimizer_step``, ``_release_sub_group``): the sub-group's
    gradients flattened in 16 bits, cast to fp32 (the flat 16-bit copy released), AdamW's two states on the first step,
    one foreach temporary, and the fp32 gradient released. With more than one sub-group the smaller ones' states land in
    the largest one's released blocks, so the second step needs new segments for its fp32 gradient and temporary (call
    7's trace of Qwen2.5-3B at world size 2). With ``overlap_comm`` each bucket's reduction runs on its
    own stream, and its flattened copy of the bucket (``reduce_scatter_coalesced``'s ``torch.cat``) comes from that
    stream's blocks, which the rest of the run cannot reuse (``side_stream``: the largest such copy).

    Args:
        build: bytes of each 16-bit tensor built on the GPU before ``deepspeed.initialize`` (none in zero.Init).
        sub_groups: fp32 bytes of each of this rank's sub-groups, in order.
        bucket: the reduce bucket's bytes; ``grad_partition``: the 16-bit gradient partition's.
        gathered: per decoder layer, bytes of each gathered 16-bit parameter; ``embedding``: the embedding's.
        output_grad: the output layer's weight gradient (0 when it is frozen). Others: as :func:`zero12_reserved`.
        norm_pieces: elements of each trainable tensor's partition on this rank, in order.
        frozen: parameters on the GPU: bytes of each frozen 16-bit tensor, in the order of ``build`` (whose first
            tensors they are, when it is not empty); ``flat``: the trainable ones' flat buffer (0: offload_param).
        side_stream: overlap_comm: the largest bucket the reduction stream flattens (0 without it).
        offload_buckets: offload_optimizer (then ``sub_groups`` is empty: the optimizer is on the CPU): per reduction,
            in backward order, the elements of each gradient it partitions. At backward's end each bucket is
            flattened, and each gradient's partition comes back from its pinned buffer to the GPU for its norm (fp64,
            in chunks of 250 M elements) and its fp32 copy to the CPU (``partition_grads``,
            ``_offload_grad_partition_at_boundary``; call 43's traces).
        hooked: bytes of each trainable 16-bit parameter, whole, in order (the gathers of the hooks' set-up).
        live: ``gathered``'s budget from the second step on, in bytes (``stage3_max_live_parameters``; 0: each
            layer's parameters released after it, as in the first step, which records the module trace; call 35's
            traces, LoRA with both offloads, peak with about that many gathered).
        init_order: zero.Init with the parameters on the GPU and a trained subset (freeze tuning): every tensor in
            the model's order, its bytes and whether it trains; each is partitioned as it is built (at world size 1 a
            whole copy), and ``defragment`` moves the trained ones to the CPU before the flat buffer (``frozen`` is
            then not read). ``frozen_layers``, ``front_layer``: as :func:`zero12_reserved`'s.
        init_gathers: zero.Init with offload_param: per parameter gathered while the model is built, the bytes of
            the whole and of this rank's partition (transformers' weight initialisation gathers the embedding twice;
            call 35's traces).
        ceiling, expandable, foreach: as :func:`zero12_reserved`'s (``foreach``: one temporary per sub-group).

    Raises:
        Exceeded: it would reserve more than ``ceiling`` (checked once the set-up has emptied the cache).
    """
    make = ExpandableAllocator if expandable else Allocator
    pool = make()
    built = [pool.alloc(size) for size in build]
    if flat and init_order:  # zero.Init, a trained subset: each tensor partitioned as built, the trained ones then
        parts = []  # moved to the CPU by defragment
        for size, trains in init_order:
            whole = pool.alloc(size)
            parts.append((pool.alloc(size), trains))
            pool.free(whole)
        for block, trains in parts:
            if trains:
                pool.free(block)
        pool.empty_cache()
        pool.alloc(flat)
    elif flat:  # the parameters stay on the GPU
        for k, size in enumerate(frozen):
            whole = built[k] if built else pool.alloc(size)  # zero.Init partitions each tensor as it is built
            pool.alloc(size)  # its partition, kept
            pool.free(whole)
        for b in built[len(frozen):]:  # the trainable ones: to the CPU, then back as one flat buffer
            pool.free(b)
        pool.empty_cache()
        pool.alloc(flat)
    else:
        for b in built:
            pool.free(b)
        for size, part in init_gathers:  # zero.Init with offload_param: the embedding gathered as the model is built
            whole, copied = pool.alloc(size), pool.alloc(part)  # _allgather_params_sequential: the buffer, and the
            pool.free(copied)  # rank's partition copied from the CPU
            pool.free(whole)
    pool.ceiling = ceiling  # nothing empties the cache from here on (the side stream's pool only adds to it)
    converted = None
    for size in sub_groups:
        made = pool.alloc(size)  # fp16_partitioned_groups_flat[i].to(device, fp32)
        pool.free(converted)  # the previous one, released when ``converted`` is rebound
        converted = made
        pool.alloc(size)  # its clone: the fp32 master
    pool.free(converted)
    pool.free(pool.alloc(max(sub_groups, default=0)))  # initialize_optimizer_states' zeroed gradient buffer
    pool.alloc(bucket)
    pool.alloc(grad_partition)
    for size in hooked:  # create_reduce_and_remove_grad_hooks: param.all_gather(), released at once
        pool.free(pool.alloc(size))
    for step in range(steps):
        if step == 0:
            pool.alloc(_CUBLAS_WORKSPACE)  # the forward's first matmul: a cuBLAS workspace, kept
        window = _Window(pool, live) if live and step else None
        emb = _gather(pool, window, "embedding", [embedding])
        acts, cache = _forward_pass(pool, layer, layers, checkpointed, edges, gathered, window, no_grad_layer,
                                    frozen=frozen_layers, front_layer=front_layer)
        for b in emb:
            pool.free(b)
        head = _gather(pool, window, "head", [embedding])  # the output layer's weight (tied or not, one size)
        gb = _causal_lm_loss(pool, logits_bf16, logits_fp32, softcap, head, cache)
        head = _gather(pool, window, "head", [embedding])  # gathered again for its backward
        # LinearFunctionForZeroStage3.backward: the input's gradient first, then the weight's. Under checkpointing it
        # takes the hole the last layer's output left after the final norm, so the autograd thread's workspace goes
        # elsewhere (call 41's trace); without it the replay's holes there are not the real ones (the templates keep
        # the backward's tensors, not their exact lifetimes) and it is left out, as smaller tensors are
        ig = pool.alloc(edges[0]) if checkpointed else None
        if step == 0:  # autograd's thread has its own cuBLAS handle: a second workspace, kept
            pool.alloc(_CUBLAS_WORKSPACE)
        og = pool.alloc(output_grad)  # the output layer's weight gradient, before it is reduce-scattered
        pool.free(gb)
        for b in head:
            pool.free(b)
        pool.free(og)
        pool.free(ig)
        _backward_pass(pool, acts, layer, checkpointed, edges, gathered, window)
        if window is not None:
            window.release_all()
        for held in offload_buckets:  # offload_optimizer: each reduction's gradients on their way to the CPU
            flat_bucket = pool.alloc(2 * sum(held))  # reduce_scatter_coalesced's flattened bucket, to the last one
            for n in held:
                on_gpu = pool.alloc(2 * n)  # partition_grads: the pinned partition copied back to the GPU
                for start in range(0, int(n), _NORM_CHUNK):  # _constant_buffered_norm2, in fp64 chunks
                    pool.free(pool.alloc(8 * min(_NORM_CHUNK, n - start)))
                pool.free(pool.alloc(4 * n))  # its fp32 copy, to the CPU fp32 gradient
                pool.free(on_gpu)
            pool.free(flat_bucket)
        for n in norm_pieces:  # get_grad_norm_direct: each gradient's norm in fp64, one copy at a time
            pool.free(pool.alloc(8 * n))
        for size in sub_groups:
            flat_grads = pool.alloc(size / 2)  # flatten(averaged_gradients[i]), 16-bit
            fp32_grad = pool.alloc(size)
            pool.free(flat_grads)
            if step == 0:  # AdamW's exp_avg and exp_avg_sq, kept
                pool.alloc(size)
                pool.alloc(size)
            if foreach:
                pool.free(pool.alloc(size))  # foreach temporary (sqrt of exp_avg_sq)
            pool.free(fp32_grad)
    side = make()  # the reduction stream's blocks (its own address range when expandable), from the first backward on
    side.alloc(side_stream if steps else 0)
    return pool.reserved + side.reserved


def _absorb(blocks: dict, left, right):
    """``right`` folded into its left neighbour ``left`` in a segment's linked blocks (and out of ``blocks``)."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left
    del blocks[right.key]
    return left
