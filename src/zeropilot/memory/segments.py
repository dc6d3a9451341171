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
real allocator had, within 0.2 GiB, on all 22 traces (ZeRO-1/2/3, LoRA, offload; ``tests/memory/
test_segments.py``), so the policy is right. The synthetic request sequence is the weak part. It follows the traces
(``bench/plan/analyze_trace.py``): each decoder layer's saved tensors at their real shapes, and under checkpointing
the forward's and the recompute's transient ones; the two cuBLAS workspaces every trace keeps (one for the
forward's thread, one for autograd's); DeepSpeed's ``temp_grad_buffer_for_gpu_offload``; Gemma 2's soft-capped
logits; the embedding's gradient at the end of backward; the fp64 copies DeepSpeed takes for gradient norms. Small
long-lived tensors still settle inside large cached blocks in ways whole-tensor granularity cannot always
reproduce (the overlap_comm stream's separate pool is not modelled), so the replay can miss a segment either way;
``docs/plan.md`` lists the rows it misses.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

MIB = 2**20
_SMALL = MIB  # under this, PyTorch's small pool: left out
_MIN_LARGE = 10 * MIB  # requests under this share 20 MiB segments
_LARGE_BUFFER = 20 * MIB
_ROUND = 2 * MIB
_CUBLAS_WORKSPACE = 32 * MIB  # CUBLAS_WORKSPACE_CONFIG's default, :4096:8, one per cuBLAS handle (per thread)


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
                    gpu_optimizer: bool, activations: List[float], recompute: Sequence[float], logits_bf16: float,
                    logits_fp32: float, output_grad: float, buckets: List[float], embedding_grad: float = 0.0,
                    tied: bool = False, softcap: bool = False, norm_pieces: Sequence[float] = (),
                    early_partition: bool = True, steps: int = 2) -> int:
    """Bytes the caching allocator reserves for ZeRO-1/2's large tensors over ``steps`` training steps.

    Args:
        build: bytes of each trainable tensor as the model is built (freed once flattened).
        frozen: bytes of each frozen tensor (LoRA's base model; stays where it was built).
        trainable: trainable elements; ``world_size``: data-parallel ranks (the partition is 1/N).
        stage: 1 or 2; both reduce gradients through the buckets into a flat 16-bit partition.
        gpu_optimizer: the optimizer's fp32 state is on the GPU (no ``offload_optimizer``).
        activations: bytes of each tensor the forward keeps, in order (freed in reverse in backward).
        recompute: the tensors of one layer recomputed in backward under gradient checkpointing (none without),
            taken together and released before the next layer's.
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
        early_partition: the 16-bit gradient partition is taken at the first bucket's reduction, which comes in
            the backward when there are more trainable elements than one bucket holds (stage 2 always does).
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
    for step in range(steps):
        if step == 0:
            if not gpu_optimizer:  # temp_grad_buffer_for_gpu_offload: 16-bit, the largest parameter's size, kept
                pool.alloc(max(build + frozen, default=0))
            pool.alloc(_CUBLAS_WORKSPACE)  # the forward's first matmul: a cuBLAS workspace, kept
        acts = []
        for size in activations:
            acts.append(pool.alloc(size))
            for r in [pool.alloc(size) for size in recompute]:  # checkpointed: the layer's tensors, not kept
                pool.free(r)
        # transformers' causal-LM loss, as call 7's traces show it: bf16 logits, fp32 upcast, log-softmax,
        # then in backward two fp32 gradients and the bf16 one
        lb = pool.alloc(logits_bf16)
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
        og = pool.alloc(output_grad)  # the output layer's weight gradient
        if step == 0:  # autograd's thread has its own cuBLAS handle: a second workspace, kept
            pool.alloc(_CUBLAS_WORKSPACE)
        pool.free(gb)
        held = [pool.alloc(size) for size in buckets]  # setup_buckets, at the first gradient hook
        grads = []
        if gpu_optimizer and (stage == 2 or early_partition):
            grads = [pool.alloc(2 * part)]  # the flat gradient partition
        for b in reversed(acts):
            again = [pool.alloc(size) for size in recompute]
            for r in again:
                pool.free(r)
            pool.free(b)
        if embedding_grad:  # the embedding's gradient comes last; tied, it is summed with the output layer's
            parts = [pool.alloc(embedding_grad) for _ in range(2 if tied else 1)]
            for b in parts:
                pool.free(b)
        if gpu_optimizer and not grads:
            grads = [pool.alloc(2 * part)]  # taken at the one reduction, at the end of backward
        pool.free(og)
        if not gpu_optimizer:  # each gradient's fp64 norm and its fp32 copy to the CPU partition
            for n in norm_pieces:
                pool.free(pool.alloc(8 * n))
                pool.free(pool.alloc(4 * n))
        for b in held:
            pool.free(b)
        if gpu_optimizer:
            for n in norm_pieces:  # scaled_global_norm: each gradient's norm in fp64
                pool.free(pool.alloc(8 * n))
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
