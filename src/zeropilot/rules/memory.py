"""Rules that run ``zeropilot plan`` on a launch: predicted OOM, checkpoints that outgrow the disk, saves
longer than the collective timeout, a ZeRO-3 script whose whole-model init overflows the GPU, and host
memory that the node's processes outgrow.

They run when the model and the hardware are known: ``zeropilot check --gpus COUNTxMEM`` and a
``model_name_or_path`` that resolves (a local config, the HF cache or the built-in catalogue). The plan
is the one ``zeropilot plan`` prints (``zeropilot.memory``, accuracy in ``bench/plan/results``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.launch import Document, Launch
from zeropilot.rules.registry import Hit, Severity, rule

_SOURCES = "bench/plan/data/rows.jsonl, sources h200_call1 and h200_call2 (capped H200 runs)"


def unplannable(launch: Launch) -> Optional[Tuple[Document, str]]:
    """(training args, why) when --gpus is given but the launch's model cannot be sized here."""
    pairs = launch.training_pairs()
    if not launch.gpus or not pairs:
        return None
    from zeropilot.launch.planfacts import plan_facts
    from zeropilot.models import resolve_model

    lv = plan_facts(launch)
    if not lv.model:
        return pairs[0][0], "the training arguments name no model_name_or_path"
    try:
        resolve_model(lv.model, lv.model_base, launch.hub)
    except InputError:
        return pairs[0][0], (f"model_name_or_path {lv.model!r} is not a config, a cached Hub id or a catalogued "
                             "name here")
    return None


def _plans(launch: Launch) -> Iterator[Tuple[Document, Document, object]]:
    """(training args, DeepSpeed config, Plan) for each pair whose model and GPUs are known."""
    if not launch.gpus:
        return
    from zeropilot.launch.planfacts import plan_facts
    from zeropilot.memory.from_launch import launch_inputs
    from zeropilot.memory.inputs import PlanInputs, has_count, parse_gpus
    from zeropilot.memory.plan import make_plan
    from zeropilot.models import resolve_model

    lv = plan_facts(launch)
    if not lv.model:
        return
    try:
        arch = resolve_model(lv.model, lv.model_base, launch.hub)
        text = launch.gpus if has_count(launch.gpus) else f"{lv.world_size or 1}x{launch.gpus}"
        hardware = parse_gpus(text)
        given = launch_inputs(lv, arch.hidden)
        inputs = PlanInputs(arch=arch, hardware=hardware, sources=given.sources, **given.values)
        plan = make_plan(inputs, _constants(launch, inputs))
    except InputError:
        return
    pairs = launch.training_pairs()
    if pairs:
        train, ds = pairs[0]
        yield train, ds, plan


def _constants(launch: Launch, inputs):
    """The estimator's constants: a hardware profile's (``check --hardware FILE``) or the H200 defaults."""
    from zeropilot.memory.constants import DEFAULT

    profile = getattr(launch, "hardware_profile", None)
    if profile is None:
        return DEFAULT
    from zeropilot.memory.profile import apply

    return apply(profile, DEFAULT, inputs.world_size, inputs.stage)[0]


def _zero_node(ds: Document):
    return ds.get("zero_optimization.stage") or ds.get("zero_optimization") or ds.root


@rule("MEM001", "predicted-gpu-oom", Severity.ERROR, packages=("deepspeed", "torch", "transformers"),
      versions="deepspeed 0.19.8, torch 2.11 (measured on H200); other versions by the same code paths",
      witness=f"fixture:tests/memory/test_rules_memory.py::test_mem001_fires_when_the_plan_does_not_fit; {_SOURCES}")
def predicted_gpu_oom(launch: Launch) -> Iterator[Hit]:
    """The plan predicts a per-GPU peak larger than the GPUs given with `--gpus`.

    ## Why is this bad?
    The launch loads the model, starts training and dies with `CUDA out of memory` at the first step (or,
    when only the allocator's cache overflows, runs slowly with cache flushes until fragmentation ends it).
    The plan adds weights, gradients, optimizer state, activations, the logits and loss buffers (large with
    150k-260k vocabularies), ZeRO buffers, allocator overhead and memory outside PyTorch; on 29 H200
    configurations it was not tuned on its median error was 3.7% (`bench/plan/results/accuracy.md`).

    ## Example
    ```yaml
    # 4x16GiB, Qwen2-7B, ZeRO-2, LoRA: every GPU holds the whole 15 GB of 16-bit weights
    finetuning_type: lora
    deepspeed: ds_z2.json
    ```

    ## Use instead
    ```bash
    zeropilot plan LAUNCH --gpus 4x16GiB --search   # ranks stage, micro batch, checkpointing, offload
    ```

    ## References
    - `bench/plan/results/accuracy.md` (predicted against measured peaks, with memory-capped runs)
    - `docs/plan.md` (the formulas)
    """
    skipped = unplannable(launch)
    if skipped is not None:
        train, why = skipped
        yield Hit(train, train.get("model_name_or_path") or train.root,
                  f"memory not planned: {why} — run `zeropilot plan {train.path.parent} --gpus {launch.gpus} "
                  "--model NAME_OR_CONFIG` with the base model's name or config.json", severity=Severity.INFO)
    for train, ds, plan in _plans(launch):
        v = plan.verdict
        if plan.gpu.peak_phase == "init" and plan.gpu.train_peak_bytes <= plan.inputs.hardware.gpu_bytes:
            continue  # only the whole-model init overflows: MEM004 says so, with its fix
        if v.kind in ("oom", "tight"):
            sev = Severity.ERROR if v.kind == "oom" else Severity.WARNING
            yield Hit(ds, _zero_node(ds), f"predicted peak {plan.gpu_peak_bytes / 2**30:.1f} GiB per GPU — "
                                         f"{v.message} — run `zeropilot plan --search` for a configuration "
                                         "that fits", severity=sev)


def _free_bytes(train: Document, output_dir: Optional[str]) -> Optional[int]:
    """Free space of the filesystem that holds ``output_dir``, if it (or its parent) exists here."""
    if not output_dir:
        return None
    path = Path(output_dir)
    if not path.is_absolute():
        path = train.path.parent / path
    for cand in (path, path.parent):
        if cand.is_dir():
            return shutil.disk_usage(cand).free
    return None


@rule("MEM002", "checkpoints-exceed-disk", Severity.ERROR, packages=("deepspeed", "transformers"),
      versions="deepspeed >= 0.10.1 (exclude_frozen_parameters), layout of 0.19.8",
      witness="tests/memory/test_disk.py::test_checkpoint_bytes_match_a_real_deepspeed_save")
def checkpoints_exceed_disk(launch: Launch) -> Iterator[Hit]:
    """The checkpoints kept by `save_total_limit` (plus the one being written) outgrow the free disk.

    ## Why is this bad?
    Each `engine.save_checkpoint` writes the fp32 master weights and AdamW state (12 bytes per trainable
    parameter) and, for LoRA under ZeRO-3 with `stage3_gather_16bit_weights_on_model_save: false`, the
    whole frozen base again. The save that fills the disk fails part-way, often hours into the run, and
    the half-written checkpoint is not loadable. Without `save_total_limit` every checkpoint stays.

    ## Example
    ```yaml
    save_steps: 100          # and no save_total_limit
    ```

    ## Use instead
    ```yaml
    save_steps: 100
    save_total_limit: 2
    ```

    ## References
    - DeepSpeed `runtime/engine.py` `save_checkpoint(exclude_frozen_parameters=...)`
    - FACTS C (measured checkpoint sizes), `src/zeropilot/memory/disk.py`
    """
    plans = list(_plans(launch))
    if not plans:
        return
    from zeropilot.launch.planfacts import plan_facts

    output_dir = plan_facts(launch).output_dir
    for train, ds, plan in plans:
        k = plan.checkpoint
        free = _free_bytes(train, output_dir)
        if free is None:
            continue
        need = k.disk_peak_bytes if k.disk_peak_bytes is not None else k.total_bytes
        if need > free:
            node = train.get("save_total_limit") or train.get("save_steps") or train.root
            kept = "" if k.disk_peak_bytes is None else f", {plan.inputs.save_total_limit} kept + 1 being written"
            yield Hit(train, node, f"checkpoints need {need / 1e9:.1f} GB ({k.total_bytes / 1e9:.1f} GB per save{kept}"
                                   f") but {free / 1e9:.1f} GB is free where output_dir is — the save that fills "
                                   "the disk fails mid-run — lower save_total_limit, exclude frozen weights or "
                                   "free space")


@rule("MEM003", "save-longer-than-collective-timeout", Severity.WARNING, packages=("deepspeed", "torch"),
      versions="all (torch's 10-minute default for the NCCL groups DeepSpeed clones, FACTS B)",
      witness=("fixture:tests/memory/test_rules_memory.py::test_mem003_fires_for_a_slow_save; "
               "torch/distributed/constants.py default_pg_nccl_timeout; deepspeed/utils/groups.py"))
def save_longer_than_collective_timeout(launch: Launch) -> Iterator[Hit]:
    """A checkpoint save that takes longer, at 1 GB/s, than the 10-minute collective timeout.

    ## Why is this bad?
    While one rank writes, the others wait in the next collective. DeepSpeed's cloned NCCL groups keep
    torch's 10-minute default whatever `ddp_timeout` says (FACTS B), so a save longer than that kills the
    run with a watchdog timeout right after the save.

    ## Example
    ```yaml
    # 70B full fine-tuning, ZeRO-3: about 1 TB per save
    finetuning_type: full
    ```

    ## Use instead
    ```bash
    zeropilot plan LAUNCH --gpus 8x80GiB --disk-write 2.0   # check the save time at your disk's speed
    ```

    ## References
    - `torch/distributed/constants.py` (default_pg_nccl_timeout, 10 minutes)
    - transformers #32036, #38933; accelerate #3680
    """
    for train, ds, plan in _plans(launch):
        k = plan.checkpoint
        if k.save_seconds > plan.inputs.collective_timeout_s:
            node = train.get("save_steps") or train.root
            yield Hit(train, node, f"a save writes {k.total_bytes / 1e9:.0f} GB: ~{k.save_seconds / 60:.0f} min at "
                                   f"{plan.inputs.disk_write_bytes_per_s / 1e9:.1f} GB/s, longer than the "
                                   f"{plan.inputs.collective_timeout_s / 60:.0f}-minute collective timeout — the "
                                   "other ranks' next collective times out — save less (LoRA: exclude frozen "
                                   "weights) or to a faster disk")



def _pretrained_name(tree) -> Optional[str]:
    """The first string literal passed to a ``from_pretrained`` call in a script, if any."""
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
            arg = node.args[0] if node.args else next((k.value for k in node.keywords
                                                       if k.arg == "pretrained_model_name_or_path"), None)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                return arg.value
    return None


def _raw_init_plans(launch: Launch):
    """(script, build, plan) for ZeRO-3 scripts that call deepspeed.initialize without zero.Init."""
    if not launch.gpus:
        return
    from zeropilot.launch.build import model_build
    from zeropilot.launch.planfacts import plan_facts
    from zeropilot.memory.from_launch import launch_inputs
    from zeropilot.memory.inputs import PlanInputs, has_count, parse_gpus
    from zeropilot.memory.plan import make_plan
    from zeropilot.models import resolve_model

    lv = plan_facts(launch)
    if lv.values.get("stage") != 3:
        return
    for py in launch.python_files:
        build = model_build(py.tree) if py.tree is not None else None
        if build is None or build.zero_init is not False:
            continue
        name = lv.model or _pretrained_name(py.tree)
        try:
            arch = resolve_model(name, lv.model_base or py.path.parent) if name else None
            if arch is None:
                continue
            text = launch.gpus if has_count(launch.gpus) else f"{lv.world_size or 1}x{launch.gpus}"
            given = launch_inputs(lv, arch.hidden)
            values = dict(given.values, zero_init=False)
            inputs = PlanInputs(arch=arch, hardware=parse_gpus(text), sources=given.sources, **values)
            plan = make_plan(inputs, _constants(launch, inputs))
        except InputError:
            continue
        yield py, build, plan


@rule("MEM004", "whole-model-init-exceeds-gpu", Severity.ERROR, packages=("deepspeed", "torch"),
      versions="deepspeed 0.19.8 (engine moves a model without ds_id to the GPU, then partitions it); measured "
               "on 2 x H200",
      witness=("fixture:tests/memory/test_rules_memory.py::test_mem004_fires_for_a_raw_zero3_script; "
               "deepspeed/runtime/engine.py _configure_distributed_model; bench/plan/data/rows.jsonl source "
               "h200x2_call3 (Qwen2.5-7B LoRA, 2 x 16 GiB cap: raw build OOM at init, zero.Init build runs)"))
def whole_model_init_exceeds_gpu(launch: Launch) -> Iterator[Hit]:
    """A ZeRO-3 script builds the whole model before `deepspeed.initialize`, and that alone overflows the GPU.

    ## Why is this bad?
    Without `deepspeed.zero.Init`, `from_pretrained` (or `from_config`) builds the whole 16-bit model and
    `deepspeed.initialize` moves it to every GPU before partitioning it; the caching allocator keeps that
    memory reserved. Where the whole model is larger than training's working set (more ranks, smaller
    cards), the launch dies with `CUDA out of memory` inside `initialize`, before the first step — although
    the plan for training alone fits. Measured: Qwen2.5-7B LoRA on two 16 GiB-capped H200s ran when built in
    `zero.Init` (15.6 GiB) and ran out of memory at init without it (16.7 GiB predicted).

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-7B", torch_dtype=torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, config="ds_z3.json")
    ```

    ## Use instead
    ```python
    with deepspeed.zero.Init(config_dict_or_path="ds_z3.json"):
        model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-7B", torch_dtype=torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, config="ds_z3.json")
    # or: dschf = HfDeepSpeedConfig("ds_z3.json") before from_pretrained (keep the object alive)
    ```

    ## References
    - DeepSpeed docs, "Constructing Massive Models" (`deepspeed.zero.Init`)
    - `zeropilot plan --no-zero-init` (init phase next to training), `bench/plan/results/accuracy.md`
    """
    for py, build, plan in _raw_init_plans(launch):
        gpu, size = plan.gpu, plan.inputs.hardware.gpu_bytes
        if plan.gpu.init_peak_bytes > size:
            yield Hit(None, None, f"ZeRO-3 without deepspeed.zero.Init: the whole 16-bit model is on every GPU "
                                  f"before deepspeed.initialize partitions it — init peak {gpu.init_peak_bytes / 2**30:.1f} "
                                  f"GiB > {size / 2**30:.1f} GiB per GPU (training alone: "
                                  f"{gpu.train_peak_bytes / 2**30:.1f} GiB) — build the model inside "
                                  "`with deepspeed.zero.Init(config_dict_or_path=...)` or create HfDeepSpeedConfig "
                                  "before from_pretrained", file=py.path, line=build.line, key="deepspeed.initialize")


@rule("MEM005", "host-memory-exceeded", Severity.ERROR, packages=("deepspeed",),
      versions="deepspeed 0.19.8 (CPU offload with pinned buffers); measured on H200 hosts",
      witness=("fixture:tests/memory/test_rules_memory.py::test_mem005_fires_when_offload_outgrows_the_host; "
               "bench/plan/data/rows.jsonl source h200x2_call3, host_peak_rss_gb; issue 14 (two 7-8B offloaded full "
               "fine-tunings killed by the kernel on a 128 GiB host)"))
def host_memory_exceeded(launch: Launch) -> Iterator[Hit]:
    """Every process of a node together needs more host RAM than the node has (`check --host-mem GiB`).

    ## Why is this bad?
    Optimizer and parameter offload keep fp32 master weights, AdamW states and pinned 16-bit buffers in host
    memory, one share per rank; loading without `zero.Init` holds a whole 16-bit copy per rank. When the
    node's processes need more than its RAM, the kernel's OOM killer ends a rank (often silently: the others
    hang in the next collective). The GPU verdict alone says "fits".

    ## Example
    ```json
    {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
    ```

    ## Use instead
    ```bash
    zeropilot plan LAUNCH --gpus 2x16GiB --host-mem 128   # host verdict next to the GPU one
    ```
    Fewer ranks per node, parameter offload off, or `offload_optimizer.device: nvme`.

    ## References
    - DeepSpeed docs, ZeRO-Offload / ZeRO-Infinity (host memory needs)
    - `src/zeropilot/memory/host.py`
    """
    host_mem = getattr(launch, "host_mem", None)
    if not host_mem:
        return
    from zeropilot.memory.plan import host_verdict_of

    for train, ds, plan in _plans(launch):
        verdict = host_verdict_of(plan.host, int(host_mem))
        if verdict.kind == "oom":
            node = ds.get("zero_optimization.offload_optimizer") or _zero_node(ds)
            yield Hit(ds, node, verdict.message)
