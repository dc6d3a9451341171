"""ZeRO's collectives against one micro batch's compute, simulated tensor by tensor as DeepSpeed 0.19.8 issues them.

Pure, no torch. The time model (:mod:`zeropilot.memory.steptime`) gives each pass's GPU and host seconds; this module
lays them over the parameters' uses in order and runs three queues, each one thing at a time:

- **the host** (Python: the module hooks, the launches) walks the uses in order and issues the collectives;
- **the link**: every collective of the data-parallel group, all-gathers and reduce-scatters alike, one after the
  other (torch's ``ProcessGroupNCCL`` runs a group's collectives on one internal stream per device), each taking
  :meth:`~zeropilot.memory.links.Ring.seconds` of its bytes;
- **the GPU's compute stream**, where a module's kernels run once the host launched them and its parameters are
  gathered.

What DeepSpeed does at each use, and where (``deepspeed/runtime/zero/`` of 0.19.8):

- ZeRO-3's ``fetch_sub_module`` (``partitioned_param_coordinator.py`` lines 353-492): the module's own parameters
  are all-gathered if they are neither gathered nor in flight (lines 374-388; asynchronously: ``AllGatherCoalescedHandle
  .wait`` makes the compute stream wait, not the host, ``partition_parameters.py`` lines 761-765); the host blocks only
  when more than :data:`FETCH_EVENTS` earlier fetches are still in flight (lines 398-411,
  ``__max_ongoing_fetch_events``); then it prefetches from the trace of the previous step: at most
  ``min(stage3_max_live_parameters - gathered, stage3_prefetch_bucket_size)`` elements per module call, whole tensors,
  skipping those already gathered or in flight (lines 451-489). Every module call prefetches, those without
  partitioned parameters too (the decoder layer, attention, the norms, LoRA's wrappers): :func:`trace` gives each
  use its share of a layer's module calls.
- ``release_sub_module`` (lines 494-535, ``__params_to_release`` 634-665): after a module the host releases its
  parameters unless the prefetcher already passed their next use (it skipped it because they were gathered) or
  they are used again within ``stage3_max_reuse_distance`` elements; a kept tensor is not gathered again.
- The trace restarts at every forward (``parameter_offload.py`` lines 298-306, ``reset_step``); the backward's
  epilogue waits for its reduce stream (``stage3.py`` lines 1407-1414), so each micro batch starts with the host and
  the GPU level, as simulated.
- Gradients (``stage3.py`` lines 1569-1591, ``stage_1_and_2.py`` lines 1414-1426): each trainable tensor's gradient
  goes into a bucket of ``reduce_bucket_size`` elements; a bucket that would overflow is reduce-scattered first, after
  the compute that made its gradients; with ``overlap_comm`` on its own stream (``stage3.py`` lines 340-341; the host
  waits when more than :data:`REDUCE_EVENTS` are in flight, lines 1664-1666), without it on the compute stream,
  which waits for it. What is left is reduced at the end of the backward.

What it assumes: each layer's compute and host time split over its tensors in proportion to their elements (the
products are), the head's to the output layer, nothing to the embedding; a module's kernels may start as soon as the
host reaches it; one collective per fetch or prefetch call, its latency NCCL's model; the GPU's copies and parameter
offload's host-to-device copies stay in the compute stream's time (:mod:`~zeropilot.memory.steptime` counts them).
Not simulated: NCCL and compute sharing the GPU's memory bandwidth and SMs, ZeRO++ (hpZ's intra-node gathers, qwZ,
qgZ), NVMe offload's swaps, MoE's experts by their routing (a layer's tensors gathered as one use).

The exposed time is the micro batch's end minus the same walk with collectives that take no time: what the
compute does not hide.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from zeropilot.memory import tuning
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.links import Ring
from zeropilot.models.params import attention_linears, count_params, dense_mlp_linears
from zeropilot.models.trainable import named_parameters

#: bytes per element of what moves: 16-bit parameters, and gradients reduced in the parameters' dtype
#: (``engine.py`` ``communication_data_type``: bf16 where bf16 is enabled)
BYTES = 2
#: fetches in flight past which the host waits for the oldest (``partitioned_param_coordinator.py`` line 142)
FETCH_EVENTS = 2
#: reduce-scatters in flight past which the host waits for the oldest (``stage3.py`` line 462)
REDUCE_EVENTS = 2
#: a decoder layer's partitioned tensors are simulated as at most this many uses (consecutive small ones merged)
MAX_USES_PER_LAYER = 8
#: nn.Modules per wrapped linear layer that PEFT adds (the LoRA layer, its dropout, A, B and their dicts)
LORA_MODULES_PER_WRAPPED = 10
#: the parts of a micro batch whose compute the uses share
FORWARD, FORWARD_HEAD, RECOMPUTE, BACKWARD, BACKWARD_HEAD = range(5)


def modules(inputs: PlanInputs) -> int:
    """nn.Modules DeepSpeed's ZeRO-3 hooks run on in one pass: each decoder layer's (the layer, attention, its
    linears, MLP, its linears, the activation, the norms), LoRA's wrappers, and the model's few outer ones."""
    a = inputs.arch
    per_layer = 2 + len(attention_linears(a)) + 1 + len(dense_mlp_linears(a, a.intermediate)) + 1 + a.norms_per_layer
    if a.qk_norm:
        per_layer += 2
    if inputs.lora_rank:
        per_layer += LORA_MODULES_PER_WRAPPED * (len(attention_linears(a)) + len(dense_mlp_linears(a, a.intermediate)))
    return per_layer * a.layers + 7


@dataclass(frozen=True)
class Layout:
    """The tensors ZeRO-3 partitions (``stage3_param_persistence_threshold`` elements or more; smaller ones stay
    whole on every GPU), grouped into uses.

    Attributes:
        layers: per decoder layer, the elements of each use in forward order.
        embed: elements of the embedding if partitioned (0 otherwise).
        head: elements of the output layer if partitioned and not tied to the embedding.
        tensors: partitioned tensors in all.
    """

    layers: Tuple[Tuple[float, ...], ...]
    embed: float
    head: float
    tensors: int

    @property
    def elements(self) -> float:
        return sum(map(sum, self.layers)) + self.embed + self.head


@functools.lru_cache(maxsize=64)
def layout(arch, threshold: int) -> Layout:
    """The partitioned tensors of ``arch`` at ``threshold`` (``stage3_param_persistence_threshold``)."""
    per: Dict[int, List[float]] = {}
    embed = head = 0.0
    tensors = 0
    for p in named_parameters(arch):
        if p.numel < threshold:
            continue
        tensors += 1
        if p.layer is not None:
            per.setdefault(p.layer, []).append(float(p.numel))
        elif p.name.startswith("model.embed_tokens"):
            embed = float(p.numel)
        elif p.name.startswith("lm_head"):
            head = float(p.numel)
    return Layout(tuple(_merge(per.get(i, [])) for i in range(arch.layers)), embed, head, tensors)


def _merge(sizes: List[float]) -> Tuple[float, ...]:
    """At most :data:`MAX_USES_PER_LAYER` uses: consecutive tensors merged, in order."""
    if len(sizes) <= MAX_USES_PER_LAYER:
        return tuple(sizes)
    step = len(sizes) / MAX_USES_PER_LAYER
    return tuple(sum(sizes[int(i * step):int((i + 1) * step)]) for i in range(MAX_USES_PER_LAYER))


@dataclass(frozen=True)
class Trace:
    """One micro batch's parameter uses in order: the forward, then the backward (the output layer's, then each
    trained decoder layer from the last: its recomputation with gradient checkpointing, then its backward), one entry
    per use of a partitioned tensor (ZeRO-3) or per decoder layer (ZeRO-1/2, where only gradients move).

    Attributes:
        keys: which tensor each entry uses (the same key is the same parameter).
        elems: elements all-gathered when the entry fetches it (0: nothing partitioned).
        grads: trainable elements whose gradients the entry's backward makes.
        part: which part of the micro batch's compute the entry takes a share of (:data:`FORWARD` ...).
        weight: its share of that part.
        calls: module calls at the entry (each one prefetches).
        next_use: the index of the same tensor's next use (``len(keys)``: none).
        between: elements of the entries strictly between this use and the next.
        gathers: whether the entries' tensors are gathered (ZeRO-3).
    """

    keys: Tuple[int, ...]
    elems: Tuple[float, ...]
    grads: Tuple[float, ...]
    part: Tuple[int, ...]
    weight: Tuple[float, ...]
    calls: Tuple[int, ...]
    next_use: Tuple[int, ...]
    between: Tuple[float, ...]
    gathers: bool

    @classmethod
    def of(cls, keys, elems, grads, part, calls, gathers: bool = True) -> "Trace":
        """A trace from its uses (each use's compute as an equal share of its part), for a hand-made case."""
        nxt, between = _reuse(list(keys), list(elems))
        return cls(tuple(keys), tuple(elems), tuple(grads), tuple(part), _normalised(list(part), [1.0] * len(keys)),
                   tuple(calls), nxt, between, gathers)


def _trainable_by_place(inputs: PlanInputs) -> Tuple[Tuple[float, ...], float, float]:
    """Trainable elements per decoder layer, of the embedding, and of the output layer and final norm."""
    return _by_place(inputs.arch, inputs.lora_rank, inputs.lora_targets, inputs.lora_rank_pattern, inputs.dora,
                     inputs.modules_to_save, inputs.freeze)


@functools.lru_cache(maxsize=64)
def _by_place(arch, lora_rank, lora_targets, lora_rank_pattern, dora, modules_to_save, freeze
              ) -> Tuple[Tuple[float, ...], float, float]:
    inputs = PlanInputs(arch, lora_rank=lora_rank, lora_targets=lora_targets, lora_rank_pattern=lora_rank_pattern,
                        dora=dora, modules_to_save=modules_to_save, freeze=freeze)  # what trains, nothing else
    a = arch
    listed = tuning.trainable_list(inputs)
    per = [0.0] * a.layers
    embed = head = 0.0
    if listed is None and not inputs.lora_rank:  # full fine-tuning: every parameter
        listed = named_parameters(a)
        rest = 0.0
    else:
        listed = listed or []
        rest = tuning.trainable_params(inputs, count_params(a)) - sum(p.numel for p in listed)  # LoRA's adapters
    for p in listed:
        if p.layer is not None:
            per[p.layer] += p.numel
        elif p.name.startswith("model.embed_tokens"):
            embed += p.numel
        else:
            head += p.numel
    if rest > 0:
        per = [x + rest / a.layers for x in per]
    return tuple(per), embed, head


def trace(inputs: PlanInputs) -> Trace:
    """The uses of one micro batch of ``inputs`` (cached on what they depend on)."""
    modules_per_layer = (modules(inputs) - 7) / inputs.arch.layers
    grads = _trainable_by_place(inputs) if inputs.stage >= 1 else None
    key = (inputs.arch, inputs.stage == 3, inputs.param_persistence_threshold, inputs.gradient_checkpointing,
           tuning.first_saving_layer(inputs), round(modules_per_layer, 3),
           grads)
    return _trace(*key)


@functools.lru_cache(maxsize=256)
def _trace(arch, gathers: bool, threshold: int, checkpointing: bool, front: int, modules_per_layer: float,
           grads) -> Trace:
    lay = layout(arch, threshold) if gathers else None
    layers = lay.layers if lay is not None else tuple((1.0,) for _ in range(arch.layers))
    g_layers, g_embed, g_head = grads if grads is not None else ((0.0,) * arch.layers, 0.0, 0.0)
    out: Dict[str, list] = {k: [] for k in ("keys", "elems", "grads", "part", "weight", "calls")}
    embed_key, ids = 0, iter(range(2, 1 << 30))
    head_key = embed_key if arch.tied else 1
    keys = [[next(ids) for _ in uses] for uses in layers]
    per_pass = [sum(uses) for uses in layers]
    passes = sum(per_pass) or 1.0

    def add(key, elems, grad, part, weight, calls):
        for name, v in zip(out, (key, elems, grad, part, weight, calls)):
            out[name].append(v)

    def layer(i: int, part: int, backward: bool) -> None:
        uses = list(zip(keys[i], layers[i]))
        calls = max(modules_per_layer / len(uses), 1.0)
        for j, (k, x) in enumerate(reversed(uses) if backward else uses):
            share = x / passes
            add(k, x if gathers else 0.0, g_layers[i] * x / per_pass[i] if backward and per_pass[i] else 0.0,
                part, share, int(calls * (j + 1)) - int(calls * j))

    emb = lay.embed if lay is not None else 0.0
    head = (lay.embed if arch.tied else lay.head) if lay is not None else 0.0
    add(embed_key, emb, 0.0, FORWARD_HEAD, 0.0, 2)
    for i in range(arch.layers):
        layer(i, FORWARD, False)
    add(head_key, head, 0.0, FORWARD_HEAD, 1.0, 2)
    add(head_key, head, g_head, BACKWARD_HEAD, 1.0, 2)
    for i in range(arch.layers - 1, front - 1, -1):
        if checkpointing:
            layer(i, RECOMPUTE, False)
        layer(i, BACKWARD, True)
    if g_embed:  # the embedding's backward (its gradient, tied or not, is whole only there)
        add(embed_key, emb, g_embed, BACKWARD_HEAD, 0.0, 2)
    nxt, between = _reuse(out["keys"], out["elems"])
    return Trace(tuple(out["keys"]), tuple(out["elems"]), tuple(out["grads"]), tuple(out["part"]),
                 _normalised(out["part"], out["weight"]), tuple(out["calls"]), nxt, between, gathers)


def _normalised(parts: List[int], weights: List[float]) -> Tuple[float, ...]:
    """Each entry's weight as its share of its part (they add up to 1 in every part that has any)."""
    total = [0.0] * 5
    for p, w in zip(parts, weights):
        total[p] += w
    return tuple(w / total[p] if total[p] else 0.0 for p, w in zip(parts, weights))


def _reuse(keys: List[int], elems: List[float]) -> Tuple[Tuple[int, ...], Tuple[float, ...]]:
    """For each entry the index of its tensor's next use and the elements strictly between (DeepSpeed's reuse
    distance walks the modules after the current one, counting their parameters' elements)."""
    n = len(keys)
    prefix = [0.0]
    for x in elems:
        prefix.append(prefix[-1] + x)
    nxt = [n] * n
    last: Dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(keys[i], n)
        last[keys[i]] = i
    return tuple(nxt), tuple(prefix[j] - prefix[i + 1] if j < n else 0.0 for i, j in enumerate(nxt))


@dataclass(frozen=True)
class Compute:
    """One micro batch's compute, seconds: the GPU's per part (:data:`FORWARD` ... :data:`BACKWARD_HEAD`), and the
    host's for the forward and for the backward (with its recomputation)."""

    gpu: Tuple[float, float, float, float, float]
    host_forward: float
    host_backward: float


@dataclass(frozen=True)
class Settings:
    """The ZeRO settings the schedule follows (elements).

    Attributes:
        prefetch: ``stage3_prefetch_bucket_size``.
        max_live: ``stage3_max_live_parameters``.
        reuse: ``stage3_max_reuse_distance``.
        bucket: ``reduce_bucket_size``.
        overlap: ``overlap_comm``: the reduce-scatters on their own stream, not the compute stream.
        reduce: whether gradients are reduced in this micro batch's backward (ZeRO-2/3 always; ZeRO-1 with
            ``overlap_comm`` on the last micro batch of a step only).
    """

    prefetch: int
    max_live: int
    reuse: int
    bucket: int
    overlap: bool
    reduce: bool = True


@dataclass(frozen=True)
class Schedule:
    """One micro batch with its collectives.

    Attributes:
        seconds: its wall time.
        without_s: the same with collectives that take no time.
        forward_exposed_s: what the forward waited for gathers.
        gathered: elements all-gathered.
        gathers: all-gather calls.
        reduced: elements reduce-scattered.
        reduces: reduce-scatter calls.
        link_s: seconds the link was busy.
    """

    seconds: float
    without_s: float
    forward_exposed_s: float
    gathered: float
    gathers: int
    reduced: float
    reduces: int
    link_s: float

    @property
    def exposed_s(self) -> float:
        """What the compute does not hide."""
        return max(0.0, self.seconds - self.without_s)


def _entry_times(tr: Trace, c: Compute) -> Tuple[List[float], List[float]]:
    fwd = c.gpu[FORWARD] + c.gpu[FORWARD_HEAD]
    bwd = c.gpu[RECOMPUTE] + c.gpu[BACKWARD] + c.gpu[BACKWARD_HEAD]
    rf = c.host_forward / fwd if fwd else 0.0
    rb = c.host_backward / bwd if bwd else 0.0
    per_gpu = c.gpu
    per_host = tuple(x * (rf if p <= FORWARD_HEAD else rb) for p, x in enumerate(c.gpu))
    return ([per_gpu[p] * w for p, w in zip(tr.part, tr.weight)],
            [per_host[p] * w for p, w in zip(tr.part, tr.weight)])


def simulate(tr: Trace, comp: Compute, gather: Optional[Ring], reduce: Optional[Ring], s: Settings) -> Schedule:
    """Run one micro batch (module docstring). ``gather``: the ring ZeRO-3's all-gathers take (None: nothing is
    gathered, ZeRO-1/2); ``reduce``: the ring of the gradients' reduce-scatters (None: none in the backward)."""
    gpu, host = _entry_times(tr, comp)
    keys, elems, grads, calls = tr.keys, tr.elems, tr.grads, tr.calls
    n = len(keys)
    gathering = tr.gathers and gather is not None
    reducing = s.reduce and reduce is not None
    g_lat = gather.latency_s if gathering else 0.0
    g_per = BYTES * (gather.ranks - 1) / gather.ranks / gather.busbw if gathering else 0.0
    r_lat = reduce.latency_s if reducing else 0.0
    r_per = BYTES * (reduce.ranks - 1) / reduce.ranks / reduce.busbw if reducing else 0.0
    reuse, prefetch, max_live, cap, overlap = s.reuse, s.prefetch, s.max_live, s.bucket, s.overlap
    kept = [j < n and b < reuse for j, b in zip(tr.next_use, tr.between)]
    size = max(keys) + 1
    state = [0] * size  # 0 partitioned, 1 in flight, 2 gathered
    ready = [0.0] * size
    furthest = [-1] * size  # the furthest use the prefetcher popped for a tensor
    fetches: deque = deque()
    reduces: deque = deque()
    live = 0.0
    h = g = q = 0.0  # host, compute stream, link: when each is next free
    h0 = g0 = 0.0  # host and compute stream with collectives that take no time
    ptr = 0
    bucket = gathered = reduced = link = 0.0
    n_gathers = n_reduces = 0
    fwd_gap = 0.0
    last_forward = max((i for i, p in enumerate(tr.part) if p <= FORWARD_HEAD), default=-1)
    for e in range(n):
        k, x = keys[e], elems[e]
        need = 0.0
        if gathering:
            if x:
                st = state[k]
                if st == 0:  # its own fetch: the prefetcher did not reach it
                    took = g_lat + x * g_per
                    q = (q if q > h else h) + took
                    link += took
                    ready[k] = q
                    st = 1
                    live += x
                    gathered += x
                    n_gathers += 1
                if st == 1:  # wait for it; the host blocks while too many fetches are in flight
                    while fetches and fetches[0] <= h:
                        fetches.popleft()
                    if len(fetches) > FETCH_EVENTS:
                        first = fetches.popleft()
                        if first > h:
                            h = first
                    need = ready[k]
                    fetches.append(need)
                state[k] = 2
            if ptr == e:  # its own entry leaves the prefetch queue
                ptr = e + 1
                if furthest[k] < e:
                    furthest[k] = e
            if prefetch > 0:
                for _ in range(calls[e]):
                    budget = max_live - live
                    if budget > prefetch:
                        budget = prefetch
                    if budget <= 0 or ptr >= n:
                        break
                    batch, issued = 0.0, []
                    while ptr < n and batch < budget:
                        kj = keys[ptr]
                        if furthest[kj] < ptr:
                            furthest[kj] = ptr
                        xj = elems[ptr]
                        if xj and state[kj] == 0:
                            state[kj] = 1
                            batch += xj
                            issued.append(kj)
                        ptr += 1
                    if batch:
                        live += batch
                        took = g_lat + batch * g_per
                        q = (q if q > h else h) + took
                        link += took
                        gathered += batch
                        n_gathers += 1
                        for kj in issued:
                            ready[kj] = q
        c = gpu[e]
        start = g if g > h else h
        g = (start if start > need else need) + c
        h += host[e]
        g0 = (g0 if g0 > h0 else h0) + c
        h0 += host[e]
        if gathering and x and furthest[k] <= e and not kept[e]:
            state[k] = 0
            live -= x
        if reducing and grads[e]:
            if bucket + grads[e] > cap and bucket > 0:
                h, g, q, took = _reduce(reduces, h, g, q, r_lat + bucket * r_per, overlap)
                link += took
                reduced += bucket
                n_reduces += 1
                bucket = 0.0
            bucket += grads[e]
        if e == last_forward:
            fwd_gap = max(0.0, max(g, h) - max(g0, h0))
    if reducing and bucket > 0:
        h, g, q, took = _reduce(reduces, h, g, q, r_lat + bucket * r_per, overlap)
        link += took
        reduced += bucket
        n_reduces += 1
    return Schedule(max(h, g, q), max(h0, g0), fwd_gap, gathered, n_gathers, reduced, n_reduces, link)


def _reduce(events: deque, h: float, g: float, q: float, took: float,
            overlap: bool) -> Tuple[float, float, float, float]:
    """One bucket's reduce-scatter, issued by the host after the compute that made it; the host waits while more
    than :data:`REDUCE_EVENTS` are in flight; without ``overlap_comm`` the compute stream waits for it."""
    while events and events[0] <= h:
        events.popleft()
    if len(events) > REDUCE_EVENTS:
        h = max(h, events.popleft())
    q = max(q, h, g) + took
    events.append(q)
    return h, (g if overlap else q), q, took


def settings(inputs: PlanInputs, reduce: bool = True) -> Settings:
    """The launch's ZeRO settings."""
    return Settings(inputs.prefetch_bucket_size, inputs.max_live_parameters, inputs.max_reuse_distance,
                    inputs.reduce_bucket_size, inputs.overlap, reduce)


def gathered(inputs: PlanInputs) -> float:
    """ZeRO-3: the elements one micro batch all-gathers (what :func:`simulate` gathers; it does not depend on the
    link's speed)."""
    free = Ring(2, 1, float("inf"), 0.0, "", "", True)
    return simulate(trace(inputs), Compute((0.0,) * 5, 0.0, 0.0), free, None, settings(inputs)).gathered
