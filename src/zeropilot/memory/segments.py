"""ZeRO-1/2's large tensors replayed through a model of PyTorch's caching allocator: the segments it reserves.

The caching allocator never gives a segment back during training (nothing calls ``empty_cache``), so what it
reserves is the sum of the segments it ever had to create; a tensor gets a new segment when no free block is
large enough, however much is free in smaller pieces. Call 7's allocator histories (``bench/plan/
analyze_trace.py``, ``bench/plan/data/traces7``) show ZeRO-1/2's peak set this way: ``deepspeed.initialize``
leaves the blocks the model was built in, a flattening copy and a zeroed fp32 gradient cached; the forward's
activations and the logits' fp32 copies take them or new segments; the optimizer step needs whole fp32
blocks of the partition's size, which the split cache no longer has.

Hand-written rather than run: PyTorch's allocator needs a GPU, and ``check``/``plan`` import no torch. It models
the large pool only (tensors of 1 MiB and more; smaller ones are left out): best fit over free blocks, split
when the rest is at least 1 MiB, merged with free neighbours on free; a new segment is the request rounded up
to 2 MiB, or 20 MiB for requests under 10 MiB (``c10/cuda/CUDACachingAllocator.cpp``: ``kMinLargeAlloc``,
``kLargeBuffer``, ``kRoundLarge``). The sequence of tensors is DeepSpeed 0.19.8's ZeRO-1/2 (``stage_1_and_2.py``)
and transformers' causal-LM loss, at the granularity of whole tensors; activations are grouped per layer.

What is checked: fed each committed H200 trace's own requests, :class:`Allocator` ends with the segments the
real allocator had, within 0.2 GiB, on all 16 traces (ZeRO-1/2/3, LoRA, offload; ``tests/memory/
test_segments.py``), so the policy is right. The synthetic request sequence is the weak part: with
``offload_optimizer`` and checkpointing, small long-lived tensors settle inside the large cached blocks in ways
the per-layer grouping does not reproduce, and the replay under-counts (the plan's note says so).
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

MIB = 2**20
_SMALL = MIB  # under this, PyTorch's small pool: left out
_MIN_LARGE = 10 * MIB  # requests under this share 20 MiB segments
_LARGE_BUFFER = 20 * MIB
_ROUND = 2 * MIB


class _Block:
    __slots__ = ("size", "free", "prev", "next", "key")

    def __init__(self, size: int, key: int, prev: Optional["_Block"] = None, nxt: Optional["_Block"] = None):
        self.size, self.free, self.prev, self.next, self.key = size, True, prev, nxt, key  # key: its address


class Allocator:
    """Blocks linked in address order within their segment, free ones in a list sorted by (size, address) for
    best fit, as PyTorch's ``BlockPool`` orders them; ``reserved`` only grows, as without ``empty_cache``.

    Addresses: each new segment lies below the previous ones (what ``cudaMalloc`` gave on the H200 traces), so
    among equal free blocks the newest segment's is taken first.
    """

    def __init__(self) -> None:
        self.reserved = 0
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
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left
        del self._blocks[right.key]
        return left

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


def zero12_reserved(*, build: List[float], frozen: List[float], trainable: float, world_size: int, stage: int,
                    gpu_optimizer: bool, activations: List[float], recompute: float, logits_bf16: float,
                    logits_fp32: float, output_grad: float, buckets: List[float], steps: int = 2) -> int:
    """Bytes the caching allocator reserves for ZeRO-1/2's large tensors over ``steps`` training steps.

    Args:
        build: bytes of each trainable tensor as the model is built (freed once flattened).
        frozen: bytes of each frozen tensor (LoRA's base model; stays where it was built).
        trainable: trainable elements; ``world_size``: data-parallel ranks (the partition is 1/N).
        stage: 1 or 2 (both reduce into a flat gradient partition; kept for the caller's record).
        gpu_optimizer: the optimizer's fp32 state is on the GPU (no ``offload_optimizer``).
        activations: bytes the forward keeps, per tensor group, in order (freed in reverse in backward).
        recompute: bytes of one layer recomputed in backward under gradient checkpointing (0 without).
        logits_bf16 / logits_fp32: the logits in bf16 and one fp32 copy of them.
        output_grad: bytes of the output layer's weight gradient, taken right after the logits' backward and
            held until the end of backward (0 when the output layer is frozen).
        buckets: the reduce buckets, taken at the first gradient and released after backward.
    """
    pool = Allocator()
    part = trainable / world_size
    for size in frozen:
        pool.alloc(size)
    built = [pool.alloc(size) for size in build]
    pool.empty_cache()  # stage_1_and_2.py calls empty_cache() before it flattens each group
    flat = pool.alloc(2 * trainable)  # _flatten_dense_tensors of the group
    for b in built:
        pool.free(b)
    pool.alloc(2 * trainable)  # the aligned 16-bit flat buffer the parameters become views of
    pool.free(flat)
    if gpu_optimizer:
        pool.alloc(4 * part)  # fp32 master partition
        pool.free(pool.alloc(4 * part))  # initialize_optimizer_states' zeroed fp32 gradient
    states = 0
    for _ in range(steps):
        acts = [pool.alloc(size) for size in activations]
        # transformers' causal-LM loss, as call 7's traces show it: bf16 logits, fp32 upcast, log-softmax,
        # then in backward two fp32 gradients and the bf16 one
        lb = pool.alloc(logits_bf16)
        f1, f2 = pool.alloc(logits_fp32), pool.alloc(logits_fp32)
        pool.free(f1)
        pool.free(lb)
        f3, f4 = pool.alloc(logits_fp32), pool.alloc(logits_fp32)
        pool.free(f3)
        pool.free(f2)
        gb = pool.alloc(logits_bf16)
        pool.free(f4)
        og = pool.alloc(output_grad)  # the output layer's weight gradient
        pool.free(gb)
        held = [pool.alloc(size) for size in buckets]  # setup_buckets, at the first gradient hook
        # the flat 16-bit gradient partition: ZeRO-1 too reduces through the buckets into one (0.19.8), and at world
        # size 1 the two stages reserve alike (13 measured pairs, tests/memory/test_segments.py)
        grads = [pool.alloc(2 * part)] if gpu_optimizer else []
        for b in reversed(acts):
            if recompute:
                pool.free(pool.alloc(recompute))
            pool.free(b)
        pool.free(og)
        for b in held:
            pool.free(b)
        if gpu_optimizer:
            flat_grads = pool.alloc(2 * part)  # flatten(averaged_gradients)
            g32 = pool.alloc(4 * part)  # ... as fp32
            pool.free(flat_grads)
            for b in grads:
                pool.free(b)
            grads = []
            while states < 2:  # AdamW's exp_avg and exp_avg_sq, on the first step
                pool.alloc(4 * part)
                states += 1
            pool.free(pool.alloc(4 * part))  # foreach temporary (sqrt of exp_avg_sq)
            pool.free(g32)
        for b in grads:
            pool.free(b)
    return pool.reserved
