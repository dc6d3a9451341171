"""The speed figures of ``zeropilot calibrate`` (imports torch; run in the worker process, never by the core).

What one GPU and its host do per second, as the time model (:mod:`zeropilot.memory.speed`) reads them:

- ``matmul_points``: bf16 ``(m x k) @ (k x n)`` at a transformer layer's shapes (:data:`MATMUL_M` x
  :data:`MATMUL_KN`), FLOP/s = 2mkn / seconds; ``matmul_flops_per_s`` is their median over ``m >= 2048`` (a micro
  batch of 2,048 tokens or more);
- ``attention_points``: ``scaled_dot_product_attention`` (causal, bf16) forward and backward together at
  :data:`ATTENTION` shapes, counted as ``4 b h s^2 d / 2`` FLOPs forward (causal: half the square) and 2.5 times that
  backward, 3.5 times in all; ``attention_flops_per_s`` is their median;
- ``mem_bytes_per_s``: a device-to-device copy of :data:`COPY_BYTES`, bytes read plus written;
- ``h2d_bytes_per_s`` / ``d2h_bytes_per_s``: copies of :data:`COPY_BYTES` between pinned host memory and the device;
- ``cpu_adam_elems_per_s``: DeepSpeed's ``DeepSpeedCPUAdam.step`` over ``cpu_adam_elems`` fp32 elements on the
  host (:func:`adam_elems`: a partition past the host's last-level cache, whose 16 bytes an element (parameter,
  gradient, two moments) are at least :data:`ADAM_PAST_CACHE` times its size, at least :data:`ADAM_MIN_ELEMS`, at most
  a quarter of the host's available memory; a real partition runs at the host's memory bandwidth, not the cache's:
  issue 40's call 4 timed CPUAdam at 11.4 G elements/s over 2^24 elements, 256 MiB inside its 300 MiB L3, and 6.6
  and 6.4 at 2^26 and 2^28; its op is built just in time on first use: ``cpu_adam_build_s`` is how long its
  constructor took, the build or the load of a cached one included: 53 s and 3.4 s on the 2-core development host);
  ``torch_cpu_adamw_elems_per_s``: ``torch.optim.AdamW`` (its default implementation) on the same tensors;
  ``cpu_adam_threads``: the OpenMP threads both ran with (``OMP_NUM_THREADS``, which calibrate sets for this worker,
  else ``torch.get_num_threads()``);
- ``launch_s``: seconds per eager op (:data:`LAUNCH_OPS` ``x.add_(1)`` on a one-element tensor, then a
  synchronize, over their number); ``launch_issue_s`` the same before the synchronize (the host's share alone);
  ``launch_device``: ``cuda`` or ``cpu`` (a CPU run times CPU tensors).

Each is the median of :data:`REPEATS` timed runs after a warm-up. GPU times are CUDA events around the work
(``torch.cuda.Event(enable_timing=True)``: ``elapsed_time`` in milliseconds once the end event has completed), or
``torch.cuda.synchronize()`` and ``time.perf_counter()`` where the host's time is the figure (launch). Without a GPU
the GPU figures are None with the reason; the host ones are measured. A figure that fails is None with the error.
"""

from __future__ import annotations

import glob
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from zeropilot.memory.profile import SPEED_FIGURES

MATMUL_M = (512, 2048, 8192)
#: (k, n) of a layer: a 2048-wide model's projections, a 4096-wide one's, and a Llama-3-8B MLP's up and down
MATMUL_KN = ((2048, 2048), (4096, 4096), (4096, 14336), (14336, 4096))
#: (batch, heads, sequence, head_dim)
ATTENTION = ((1, 32, 2048, 128), (1, 32, 4096, 128))
COPY_BYTES = 1 << 30
#: the host's optimizer partition: bytes per element (fp32 parameter, gradient, two moments), how many times the
#: last-level cache they must exceed, the fewest elements, and the share of available memory they may take
ADAM_BYTES = 16
ADAM_PAST_CACHE = 4
ADAM_MIN_ELEMS = 1 << 26
ADAM_MEM_SHARE = 4
#: the last-level cache assumed when sysfs does not say (a large server L3)
ADAM_CACHE_DEFAULT = 256 << 20
LAUNCH_OPS = 2000
REPEATS = 5
#: the work of one timed repeat of a small matrix product (FLOPs): enough calls that the events' resolution and the
#: launches do not set the figure
MATMUL_WORK = 2e13
NO_GPU = "no GPU visible to PyTorch: a CPU run measures the host figures only"
#: seconds of large matrix products before the first timed one: an idle GPU's clocks are low until work arrives
#: (345 MHz idle, 1980 just after the products on the H200 of the device notes)
WARM_S = 0.5


@dataclass(frozen=True)
class Shapes:
    """What the device figures time: :data:`FULL` on a GPU; a test passes small ones and a CPU device."""

    matmul_m: Tuple[int, ...]
    matmul_kn: Tuple[Tuple[int, int], ...]
    attention: Tuple[Tuple[int, int, int, int], ...]
    copy_bytes: int
    matmul_work: float
    warm_s: float


FULL = Shapes(MATMUL_M, MATMUL_KN, ATTENTION, COPY_BYTES, MATMUL_WORK, WARM_S)


def _median_events(torch, fn: Callable[[], None], calls: int) -> float:
    """Seconds per call of ``fn`` on the current CUDA stream: median of :data:`REPEATS` event-timed runs."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0 / calls)
    return statistics.median(times)


def _median_host(fn: Callable[[], None], calls: int = 1) -> float:
    """Seconds per call of ``fn`` run on the host (CPU tensors, or the host's share): median of :data:`REPEATS`."""
    fn()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _timer(torch, device) -> Callable[[Callable[[], None], int], float]:
    """CUDA events for a GPU's work, the host's clock for CPU tensors."""
    return (lambda fn, calls: _median_events(torch, fn, calls)) if device.type == "cuda" else _median_host


def warm_up(torch, device, seconds: float) -> None:
    """Large bf16 matrix products for ``seconds``, so that the first timed shape runs at working clocks."""
    a = torch.randn(8192 if device.type == "cuda" else 64, 8192 if device.type == "cuda" else 64, device=device,
                    dtype=torch.bfloat16)
    c = torch.empty_like(a)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            torch.matmul(a, a, out=c)
        c.sum().item()  # waits for the products on a GPU
    del a, c


def matmul_points(torch, device, shapes: Shapes = FULL) -> List[dict]:
    """bf16 matrix products at the layer shapes, FLOP/s each."""
    timed = _timer(torch, device)
    warm_up(torch, device, shapes.warm_s)
    out = []
    for m in shapes.matmul_m:
        for k, n in shapes.matmul_kn:
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            flops = 2.0 * m * k * n
            calls = max(1, min(2000, int(shapes.matmul_work / flops)))
            seconds = timed(lambda: torch.matmul(a, b, out=c), calls)
            out.append({"m": m, "k": k, "n": n, "flops_per_s": flops / seconds})
            del a, b, c
    return out


def attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """FLOPs of causal attention forward and backward as the time model counts them (3.5 x the forward's)."""
    forward = 4.0 * batch * heads * seq * seq * head_dim / 2
    return forward * 3.5


def attention_points(torch, device, shapes: Shapes = FULL) -> List[dict]:
    """``scaled_dot_product_attention`` (causal, bf16) forward + backward, FLOP/s each."""
    import torch.nn.functional as F

    timed = _timer(torch, device)
    out = []
    for b, h, s, d in shapes.attention:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), grad)

        seconds = timed(step, 3)
        out.append({"batch": b, "heads": h, "seq": s, "head_dim": d, "flops_per_s": attention_flops(b, h, s, d)
                    / seconds})
        del q, k, v, grad
    return out


def copies(torch, device, shapes: Shapes = FULL) -> Dict[str, float]:
    """Device copy (bytes read + written) and host <-> device copies from pinned host memory (pageable on a
    CPU-only build, which cannot pin), bytes/s."""
    timed = _timer(torch, device)
    gpu = device.type == "cuda"
    size = min(shapes.copy_bytes, torch.cuda.mem_get_info()[0] // 8) if gpu else shapes.copy_bytes
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=gpu)
    out = {"mem_bytes_per_s": 2 * size / timed(lambda: dst.copy_(src), 2),
           "h2d_bytes_per_s": size / timed(lambda: dst.copy_(host, non_blocking=True), 1),
           "d2h_bytes_per_s": size / timed(lambda: host.copy_(src, non_blocking=True), 1)}
    del src, dst, host
    return out


def launch(torch, device) -> Dict[str, float]:
    """Seconds per eager ``add_`` on a one-element tensor: issued (host only) and completed."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(100):
        x.add_(1)
    sync()
    issued, done = [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(LAUNCH_OPS):
            x.add_(1)
        issued.append(time.perf_counter() - t0)
        sync()
        done.append(time.perf_counter() - t0)
    return {"launch_s": statistics.median(done) / LAUNCH_OPS, "launch_issue_s": statistics.median(issued) / LAUNCH_OPS}


def _size(text: str) -> Optional[int]:
    """A sysfs cache size (``32768K``, ``30M``) in bytes, None when it does not read as one."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


def last_level_cache(cache_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> Optional[int]:
    """The largest data or unified cache of CPU 0 in bytes (its level 3 on the hosts of issue 40), None when sysfs
    does not say."""
    sizes = []
    for index in sorted(glob.glob(os.path.join(cache_dir, "index*"))):
        try:
            with open(os.path.join(index, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(index, "size")) as f:
                size = _size(f.read())
        except OSError:
            continue
        if size:
            sizes.append(size)
    return max(sizes) if sizes else None


def mem_available(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """The host's ``MemAvailable`` in bytes, None when ``/proc/meminfo`` does not say."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def adam_elems(cache: Optional[int], available: Optional[int]) -> int:
    """Elements of the host optimizer's timed partition: a power of two whose :data:`ADAM_BYTES` an element are at
    least :data:`ADAM_PAST_CACHE` times the last-level cache (:data:`ADAM_CACHE_DEFAULT` when unknown) and at least
    :data:`ADAM_MIN_ELEMS`; halved while they take more than a 1/:data:`ADAM_MEM_SHARE` of the available memory."""
    need = max(ADAM_MIN_ELEMS, -(-ADAM_PAST_CACHE * (cache or ADAM_CACHE_DEFAULT) // ADAM_BYTES))
    n = 1 << (need - 1).bit_length()
    if available:
        while n > 1 << 20 and n * ADAM_BYTES > available // ADAM_MEM_SHARE:
            n >>= 1
    return n


def _adam_tensors(torch, elems: int):
    p = torch.nn.Parameter(torch.randn(elems, dtype=torch.float32))
    p.grad = torch.randn(elems, dtype=torch.float32)
    return p


def torch_adamw(torch, elems: int) -> float:
    """``torch.optim.AdamW`` steps over ``elems`` fp32 host elements, elements/s."""
    p = _adam_tensors(torch, elems)
    opt = torch.optim.AdamW([p], lr=1e-4)
    return elems / _median_host(opt.step)


def cpu_adam(torch, elems: int) -> Tuple[float, float]:
    """DeepSpeed's CPUAdam over ``elems`` fp32 host elements: (elements/s, seconds its op took to build or load).

    Raises:
        Exception: whatever DeepSpeed raises when its op cannot be built or loaded (the caller records it).
    """
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = _adam_tensors(torch, elems)
    t0 = time.perf_counter()
    opt = DeepSpeedCPUAdam([p], lr=1e-4)
    built = time.perf_counter() - t0
    return elems / _median_host(opt.step), built


def threads(torch) -> int:
    """The OpenMP threads of this process: ``OMP_NUM_THREADS`` (which both torch's and DeepSpeed's OpenMP runtimes
    read at start), else what torch uses."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else int(torch.get_num_threads())


def _try(name: str, fn: Callable[[], dict], out: dict, why: Dict[str, str], fields: Tuple[str, ...]) -> None:
    """Run one measurement into ``out``; on failure each of its ``fields`` is None with the error as the reason."""
    try:
        out.update(fn())
    except Exception as exc:  # a measurement that fails is an unmeasured figure, not a failed calibrate
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        for f in fields:
            out[f] = None
            why[f"speed.{f}"] = f"{name} failed: {type(exc).__name__}: {line}"


def device_figures(torch, device, shapes: Shapes = FULL) -> Tuple[dict, Dict[str, str]]:
    """Matrix products, attention and copies on ``device`` (a GPU; a CPU in tests: the same code, the host's
    clock instead of CUDA events), and why each missing one is missing."""
    out: dict = {"matmul_points": [], "attention_points": []}
    why: Dict[str, str] = {}

    def matmul():
        points = matmul_points(torch, device, shapes)
        large = [p["flops_per_s"] for p in points if p["m"] >= 2048] or [p["flops_per_s"] for p in points]
        return {"matmul_points": points, "matmul_flops_per_s": statistics.median(large)}

    def attention():
        points = attention_points(torch, device, shapes)
        return {"attention_points": points, "attention_flops_per_s": statistics.median(
            p["flops_per_s"] for p in points)}

    _try("the matrix products", matmul, out, why, ("matmul_flops_per_s",))
    _try("attention", attention, out, why, ("attention_flops_per_s",))
    _try("the copies", lambda: copies(torch, device, shapes), out, why,
         ("mem_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s"))
    return out, why


def _host(torch, out: dict, why: Dict[str, str], with_cpu_adam: Optional[str], elems: int) -> None:
    """CPU figures over ``elems`` elements; ``with_cpu_adam``: None to measure DeepSpeed's CPUAdam, else why it is
    skipped."""
    out["cpu_adam_threads"] = threads(torch)
    out["cpu_adam_elems"] = elems
    _try("torch's AdamW", lambda: {"torch_cpu_adamw_elems_per_s": torch_adamw(torch, elems)}, out, why,
         ("torch_cpu_adamw_elems_per_s",))
    if with_cpu_adam is not None:
        out["cpu_adam_elems_per_s"] = None
        why["speed.cpu_adam_elems_per_s"] = with_cpu_adam
        return
    t0 = time.perf_counter()
    try:
        rate, built = cpu_adam(torch, elems)
        out.update(cpu_adam_elems_per_s=rate, cpu_adam_build_s=built)
    except Exception as exc:  # no compiler, no ninja, DeepSpeed missing: the figure is unmeasured, with why
        line = (str(exc).strip().splitlines() or [""])[0][:200]
        cause = exc.__cause__ or exc
        out.update(cpu_adam_elems_per_s=None, cpu_adam_build_s=time.perf_counter() - t0)
        why["speed.cpu_adam_elems_per_s"] = (f"DeepSpeedCPUAdam could not be built or loaded after "
                                             f"{time.perf_counter() - t0:.1f} s: {type(exc).__name__}: {line}"
                                             + (f" ({type(cause).__name__}: {str(cause)[:160]})" if cause is not exc
                                                else ""))


def measure(torch, skip_cpu_adam: Optional[str] = None, elems: Optional[int] = None) -> Tuple[dict, Dict[str, str]]:
    """Every speed figure of this process's device and host, and why each missing one is missing.

    Args:
        skip_cpu_adam: why DeepSpeed's CPUAdam is not measured (``--no-cpu-adam``), None to measure it.
        elems: the host optimizers' partition (``calibrate --adam-elems``; tests pass a small one), None for
            :func:`adam_elems` of this host.

    Returns:
        (the profile's ``speed`` object, ``unmeasured`` entries keyed ``speed.<field>``).
    """
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available()
    if gpu:
        out, why = device_figures(torch, torch.device("cuda"))
    else:
        out, why = {"matmul_points": [], "attention_points": []}, {}
        for f in ("matmul_flops_per_s", "attention_flops_per_s", "mem_bytes_per_s", "h2d_bytes_per_s",
                  "d2h_bytes_per_s"):
            out[f] = None
            why[f"speed.{f}"] = NO_GPU
    device = torch.device("cuda" if gpu else "cpu")
    _try("the launch overhead", lambda: launch(torch, device), out, why, ("launch_s", "launch_issue_s"))
    out["launch_device"] = device.type
    _host(torch, out, why, skip_cpu_adam, elems or adam_elems(last_level_cache(), mem_available()))
    out["seconds"] = time.perf_counter() - t0
    _drop_impossible(out, why)
    return out, why


def _drop_impossible(out: dict, why: Dict[str, str]) -> None:
    """A figure no card or host can have (not finite, not positive, past its bound in the profile's
    :data:`~zeropilot.memory.profile.SPEED_FIGURES`) is a timing that went wrong: None, with the value as the reason."""
    for name, bound in SPEED_FIGURES.items():
        value = out.get(name)
        if value is not None and not (math.isfinite(value) and 0 < value <= bound):
            out[name] = None
            why[f"speed.{name}"] = f"timed as {value!r}, not a possible figure (bound {bound:g})"
    for name in ("matmul_points", "attention_points"):
        out[name] = [p for p in out.get(name) or [] if math.isfinite(p["flops_per_s"]) and
                     0 < p["flops_per_s"] <= SPEED_FIGURES["matmul_flops_per_s"]]
