"""Rules about PyTorch's caching-allocator variables: which one takes effect, options that do nothing,
and options the installed torch does not support.

Precedence measured on torch 2.13 (CPU: ``torch._C._accelerator_getAllocatorSettings()`` in a fresh process,
see the witnesses) and on torch 2.11+cu130 on an H200 (``tests/witness/cuda_probe.py``, its output in
``tests/witness/cuda_probe_h200.json``): when ``PYTORCH_CUDA_ALLOC_CONF`` is set the other two are not even
parsed; else ``PYTORCH_HIP_ALLOC_CONF`` (read by CUDA builds too); else ``PYTORCH_ALLOC_CONF``. Up to torch 2.8 a CUDA build reads only the CUDA
variable and a ROCm build falls back to the HIP one when the CUDA one is unset (``c10/cuda/CUDAAllocatorConfig.h``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.commands import as_int
from zeropilot.launch.facts import truthy
from zeropilot.launch.shell import EnvSetting
from zeropilot.rules.registry import Gate, Hit, Severity, rule

CUDA_VAR, HIP_VAR, ALLOC_VAR = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"
ALLOC_VARS = (CUDA_VAR, HIP_VAR, ALLOC_VAR)
# What LLaMA-Factory's launcher puts in the torchrun children's environment (OPTIM_TORCH, on by default).
LLAMAFACTORY_ALLOC_CONF = "expandable_segments:True"
# Options torch parses: the accelerator-wide ones (strings of torch 2.13's libc10) and the CUDA/ROCm ones
# (c10/cuda/CUDAAllocatorConfig.cpp, torch docs "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF").
KNOWN_OPTIONS = frozenset({
    "backend", "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "large_segment_size_mb", "pinned_max_cached_size_mb",
    "pinned_max_round_threshold_mb", "pinned_use_background_threads", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_reserve_segment_size_mb",
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
})


@dataclass
class AllocConf:
    """One allocator variable as the launch sets it, with its options parsed."""

    setting: EnvSetting
    options: Dict[str, str]

    @property
    def name(self) -> str:
        return self.setting.name

    def on(self, option: str) -> bool:
        return truthy(self.options.get(option, "")) is True


def parse_options(value: str) -> Dict[str, str]:
    """``key:value,key:[a:b,c:d]`` into key -> value (brackets keep their commas)."""
    out: Dict[str, str] = {}
    depth, part, parts = 0, "", []
    for ch in value:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    for item in parts:
        key, _, val = item.strip().partition(":")
        if key.strip():
            out[key.strip()] = val.strip()
    return out


def _confs(launch: Launch) -> Dict[str, AllocConf]:
    env = launch.env()
    return {name: AllocConf(env[name], parse_options(env[name].value)) for name in ALLOC_VARS if name in env}


def _llamafactory_sets_cuda_conf(launch: Launch) -> Optional[EnvSetting]:
    """The LLaMA-Factory command whose launcher overwrites PYTORCH_CUDA_ALLOC_CONF, as a setting."""
    # The launcher sets it since LLaMA-Factory 0.9.3 (commit 7c61b35, "[misc] upgrade cli", 2025-04-14);
    # an unknown version is taken as the newest.
    if launch.versions.satisfies("llamafactory", ">=0.9.3") is False:
        return None
    env = {k: v.value for k, v in launch.env().items()}
    for lc in launch.commands:
        if lc.launcher != "llamafactory":
            continue
        run_env = {**env, **{k: v.value for k, v in lc.command.env.items()}}
        if truthy(run_env.get("OPTIM_TORCH", "1")) is False and run_env.get("OPTIM_TORCH", "1").strip() != "":
            continue
        forced = truthy(run_env.get("FORCE_TORCHRUN", "")) is True
        many = (as_int(run_env.get("NPROC_PER_NODE")) or 0) > 1 or (launch.world_size.visible_devices or 0) > 1
        if forced or many:
            cmd = lc.command
            return EnvSetting(CUDA_VAR, LLAMAFACTORY_ALLOC_CONF, cmd.file, cmd.line, True, cmd.name)
    return None


def effective(launch: Launch) -> Optional[AllocConf]:
    """The variable whose options the training processes use, or None when none is set."""
    confs = _confs(launch)
    lf = _llamafactory_sets_cuda_conf(launch)
    if lf is not None:
        return AllocConf(lf, parse_options(lf.value))
    for name in ALLOC_VARS:
        if name in confs:
            return confs[name]
    return None


def _hit(conf: AllocConf, message: str, severity: Optional[Severity] = None) -> Hit:
    s = conf.setting
    return Hit(None, None, message, file=s.file, line=s.line, key=s.name, severity=severity)


@rule("AL001", "alloc-conf-shadowed", Severity.WARNING, packages=("torch", "llamafactory"), versions="all",
      witness="tests/rules/test_allocator.py::test_al001_witness")
def alloc_conf_shadowed(launch: Launch) -> Iterator[Hit]:
    """An allocator variable that another one, or LLaMA-Factory's launcher, takes precedence over.

    ## Why is this bad?
    Torch parses one allocator variable: `PYTORCH_CUDA_ALLOC_CONF` when it is set (the others are then
    not even read), else `PYTORCH_HIP_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF` (measured on torch 2.13 CPU
    and 2.11 CUDA on an H200: with `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6` beside
    `expandable_segments:True` in either other variable, expandable segments stayed off; up to 2.8 a CUDA
    build reads only the CUDA variable and ROCm falls back to HIP only when CUDA is unset).
    LLaMA-Factory's launcher sets `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` itself for every
    torchrun launch (unless `OPTIM_TORCH=0`), overwriting yours. So the seed's
    `PYTORCH_HIP_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128` under `FORCE_TORCHRUN=1
    llamafactory-cli train` does nothing: the children run with LLaMA-Factory's value.

    ## Example
    ```bash
    export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
    FORCE_TORCHRUN=1 llamafactory-cli train sft.yaml
    ```

    ## Use instead
    ```bash
    export OPTIM_TORCH=0   # keep LLaMA-Factory from overwriting the allocator setting
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    FORCE_TORCHRUN=1 llamafactory-cli train sft.yaml
    ```

    ## References
    - `c10/cuda/CUDAAllocatorConfig.h` (torch <= 2.8: CUDA variable, HIP fallback on ROCm only)
    - `tests/witness/cuda_probe.py` / `cuda_probe_h200.json` (torch 2.11+cu130, H200)
    - LLaMA-Factory `src/llamafactory/launcher.py` (`env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"`),
      since 0.9.3 (commit 7c61b35, 2025-04-14); 0.9.2 and older leave the variable alone
    """
    confs = _confs(launch)
    winner = effective(launch)
    if winner is None:
        return
    lf = winner.setting.command is not None
    for name, conf in confs.items():
        if conf.setting is winner.setting:
            continue
        if lf and name == CUDA_VAR and conf.options == winner.options:
            continue
        by = ("LLaMA-Factory's launcher, which sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for its "
              "torchrun children (OPTIM_TORCH)") if lf else winner.name
        fix = "set OPTIM_TORCH=0 and use PYTORCH_CUDA_ALLOC_CONF" if lf else f"put the options in {winner.name}"
        yield _hit(conf, f"{name}={conf.setting.value} takes no effect: it is overridden by {by}; {fix}.")


@rule("AL002", "hip-alloc-conf-on-cuda-build", Severity.WARNING, gates=(Gate("torch", "<2.9", False),),
      versions="torch < 2.9 on CUDA builds (2.11 CUDA and 2.13 read it: measured)",
      witness="fixture:tests/rules/test_allocator.py::test_al002_fires_on_old_cuda_torch; "
              "c10/cuda/CUDAAllocatorConfig.h (torch 2.8: `#ifdef USE_ROCM` around the HIP fallback)")
def hip_alloc_conf_on_cuda_build(launch: Launch) -> Iterator[Hit]:
    """`PYTORCH_HIP_ALLOC_CONF` with a CUDA build of torch older than 2.9.

    ## Why is this bad?
    Up to torch 2.8 only ROCm builds read `PYTORCH_HIP_ALLOC_CONF` (and only when
    `PYTORCH_CUDA_ALLOC_CONF` is unset); a CUDA build ignores it silently. Newer torch reads it on every
    build (seen on 2.13 CPU and 2.11+cu130 on an H200, where it enabled expandable segments).

    ## Example
    ```bash
    export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True   # on an NVIDIA machine, torch 2.4
    ```

    ## Use instead
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ```

    ## References
    - `c10/cuda/CUDAAllocatorConfig.h` `CUDAAllocatorConfig::instance()` (torch <= 2.8)
    """
    confs = _confs(launch)
    if HIP_VAR not in confs or launch.versions.is_rocm is not False:
        return
    yield _hit(confs[HIP_VAR], f"{HIP_VAR} is ignored by this CUDA build of torch "
                               f"{launch.versions.raw('torch')} (only ROCm builds read it before 2.9); use "
                               f"{CUDA_VAR}.")


def _sets_memory_fraction(launch: Launch) -> bool:
    return any("set_per_process_memory_fraction" in py.text for py in launch.python_files)


@rule("AL003", "gc-threshold-without-memory-fraction", Severity.WARNING, packages=("torch",), versions="torch >= 1.12",
      witness="fixture:tests/rules/test_allocator.py::test_al003_fires_without_fraction; "
              "c10/cuda/CUDACachingAllocator.cpp (garbage_collect_cached_blocks only when set_fraction); "
              "measured on an H200, torch 2.11: tests/witness/cuda_probe_h200.json")
def gc_threshold_without_memory_fraction(launch: Launch) -> Iterator[Hit]:
    """`garbage_collection_threshold` without `torch.cuda.set_per_process_memory_fraction`.

    ## Why is this bad?
    The allocator's threshold-based reclaiming runs only when a per-process memory fraction was set
    (`set_fraction` in `CUDACachingAllocator.cpp`); launches that set the threshold alone get nothing
    from it. Measured on an H200 (torch 2.11, `garbage_collection_threshold:0.01`, 10 GiB of freed 1 GiB
    blocks cached, then a 3 GiB allocation): reserved memory went 10 -> 13 GiB without a fraction, and
    10 -> 3 GiB with `set_per_process_memory_fraction(0.5)`.

    ## Example
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6
    ```

    ## Use instead
    ```python
    torch.cuda.set_per_process_memory_fraction(0.95)   # in the training script, before the model loads
    ```
    or drop the option; `expandable_segments:True` is the usual remedy for fragmentation.

    ## References
    - `c10/cuda/CUDACachingAllocator.cpp` (`if (set_fraction && garbage_collection_threshold() > 0.0)`)
    - PyTorch docs, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"
    """
    conf = effective(launch)
    if conf is None or "garbage_collection_threshold" not in conf.options or _sets_memory_fraction(launch):
        return
    yield _hit(conf, "garbage_collection_threshold does nothing unless the training script calls "
                     "torch.cuda.set_per_process_memory_fraction; call it, or drop the option.")


@rule("AL004", "expandable-segments-on-rocm", Severity.WARNING, packages=("torch",),
      versions="ROCm builds before upstream support (ROCm >= 7.0.2, 2026); Hygon DTK builds: unknown",
      witness="fixture:tests/rules/test_allocator.py::test_al004_fires_on_dtk; pytorch PRs #177974, #179781")
def expandable_segments_on_rocm(launch: Launch) -> Iterator[Hit]:
    """`expandable_segments:True` on a ROCm or Hygon DTK build of torch.

    ## Why is this bad?
    For years ROCm builds did not support expandable segments: torch warns and keeps the option off,
    so the fragmentation it was meant to fix stays. Upstream support landed in 2026 for ROCm >= 7.0.2;
    on Hygon DTK builds it is unknown until seen working. Check what took effect with
    `torch.cuda.memory._snapshot()["allocator_settings"]` (or the warning at the first allocation).

    ## Example
    ```bash
    export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True   # torch 2.1 + DTK 24.04
    ```

    ## Use instead
    Verify it on the machine first; if it is off, reduce fragmentation otherwise (smaller
    `reduce_bucket_size`/`stage3_prefetch_bucket_size`, shorter `cutoff_len`, fewer live parameters).

    ## References
    - pytorch PRs #177974, #179781 (ROCm support); `c10/cuda/CUDACachingAllocator.cpp` (ROCm warning)
    """
    conf = effective(launch)
    if conf is None or not conf.on("expandable_segments") or launch.versions.is_rocm is not True:
        return
    build = launch.versions.raw("torch") or launch.versions.raw("deepspeed")
    origin = " (set by LLaMA-Factory's launcher)" if conf.setting.command is not None else ""
    yield _hit(conf, f"expandable_segments{origin} on a ROCm/DTK build ({build}): unsupported before ROCm 7.0.2 and "
                     "unknown on DTK, where torch warns and keeps it off; check "
                     "torch.cuda.memory._snapshot()['allocator_settings'] on the machine before relying on it.")


@rule("AL005", "max-split-size-with-expandable-segments", Severity.INFO, packages=("torch",), versions="torch >= 2.1",
      witness="fixture:tests/rules/test_allocator.py::test_al005_fires; "
              "c10/cuda/CUDACachingAllocator.cpp (expandable segments are not split by max_split_size)")
def max_split_size_with_expandable_segments(launch: Launch) -> Iterator[Hit]:
    """`max_split_size_mb` together with `expandable_segments:True`.

    ## Why is this bad?
    With expandable segments a segment grows by mapping more pages instead of being split, so
    `max_split_size_mb` no longer does what it was set for; it is mostly redundant and makes the
    setting look more tuned than it is.

    ## Example
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
    ```

    ## Use instead
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ```

    ## References
    - PyTorch docs, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF"
    """
    for conf in _confs(launch).values():
        if conf.on("expandable_segments") and "max_split_size_mb" in conf.options:
            yield _hit(conf, f"{conf.name}: max_split_size_mb is mostly redundant with expandable_segments:True "
                             "(segments grow instead of splitting); drop one of them.")


@rule("AL006", "unknown-allocator-option", Severity.ERROR, packages=("torch",), versions="all",
      witness="tests/rules/test_allocator.py::test_al006_witness")
def unknown_allocator_option(launch: Launch) -> Iterator[Hit]:
    """An option in an allocator variable that torch does not know (often a typo).

    ## Why is this bad?
    A CUDA build refuses an unknown key when CUDA initialises, at the first use of the GPU, after the
    launch started: `ValueError: Unrecognized key 'expandable_segment' in CUDA allocator config.`
    (measured on torch 2.11+cu130, H200). Torch 2.13's CPU-side parser accepts it silently (seen), so
    on other devices the option the user wanted is just off.

    ## Example
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segment:True
    ```

    ## Use instead
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ```

    ## References
    - `c10/core/AllocatorConfig.cpp` `AcceleratorAllocatorConfig::parseArgs`; `c10/cuda/CUDAAllocatorConfig.cpp`
    - `tests/witness/cuda_probe_h200.json` (`typo_key`)
    """
    for conf in _confs(launch).values():
        for key in conf.options:
            if key in KNOWN_OPTIONS:
                continue
            close = difflib.get_close_matches(key, sorted(KNOWN_OPTIONS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            yield _hit(conf, f"{conf.name}: unknown allocator option {key!r}{hint}; a CUDA build raises "
                             "ValueError (Unrecognized key) at the first GPU use, others ignore it; fix the key.")


@rule("AL007", "alloc-conf-ignored-on-torch-2-9", Severity.WARNING, gates=(Gate("torch", ">=2.9,<2.10", False),),
      versions="torch 2.9.x",
      witness="fixture:tests/rules/test_allocator.py::test_al007_fires_on_2_9; pytorch issue #183387")
def alloc_conf_ignored_on_torch_2_9(launch: Launch) -> Iterator[Hit]:
    """`PYTORCH_ALLOC_CONF=expandable_segments:True` on torch 2.9.x.

    ## Why is this bad?
    In torch 2.9.x the new generic variable's `expandable_segments` was silently ignored on CUDA
    (pytorch #183387, fixed by 2.11): the run behaves as without it.

    ## Example
    ```bash
    export PYTORCH_ALLOC_CONF=expandable_segments:True   # torch 2.9.1
    ```

    ## Use instead
    ```bash
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ```

    ## References
    - pytorch issue #183387
    """
    conf = _confs(launch).get(ALLOC_VAR)
    if conf is None or not conf.on("expandable_segments"):
        return
    yield _hit(conf, f"{ALLOC_VAR}=expandable_segments:True is ignored on torch 2.9.x (pytorch #183387); use "
                     f"{CUDA_VAR} instead, or torch >= 2.11.")
