"""Measure real GPU memory of DeepSpeed ZeRO training, one config per process; prints one JSON line.

A variant of ``../shared/calibration/zero_mem_probe.py`` (same output format) with, in the spec:
  cap_gib        emulate a card of this size: the allocator gets ``cap_gib - non_torch`` via
                 ``torch.cuda.set_per_process_memory_fraction`` (non_torch = 1.30 GiB ZeRO-1/2,
                 1.68 GiB ZeRO-3, FACTS F; 1.77 / 2.05 GiB per rank at world size 2, the ws2-issue5 rows
                 of data/rows.jsonl);
                 the limit is recorded as ``cap_alloc_gib``
  alloc_conf     PYTORCH_CUDA_ALLOC_CONF for the run (e.g. "expandable_segments:True")
  offload_param  ZeRO-3 parameter offload to CPU
  exclude_frozen pass exclude_frozen_parameters=True to save_checkpoint (runs with save: true)
  cpu_adam       with offload: DeepSpeed's CPUAdam instead of torch's AdamW (the op is built on first use)
  zero_init      ZeRO-3: build the model inside ``deepspeed.zero.Init`` the way the HF Trainer does
                 (``HfDeepSpeedConfig`` before ``from_config``); otherwise the whole bf16 model is built
                 on the GPU first, as a raw script does before ``deepspeed.initialize``
  sgs / mlp / mrd  sub_group_size, stage3_max_live_parameters, stage3_max_reuse_distance (DeepSpeed
                 defaults when absent)
  trace_frames   with ``trace``: each allocation of 32 MiB or more carries its innermost DeepSpeed /
                 transformers / PEFT / probe frames (a fifth or sixth field)
  trace          record the caching allocator's history from the start (``torch.cuda.memory.
                 _record_memory_history``, no stacks) and write rank 0's events as
                 ``$TRACE_DIR/<trace>.json.gz``: a list of [action, addr, size, phase] (``analyze_trace.py``),
                 and the CUDA stream with ``trace_streams``
issue 26's settings (``settings/device.sh``; ``settings/specs.py`` ``inputs_of`` gives their plan inputs):
  targets        LoRA ``target_modules`` (a list of names) instead of all linear layers
  mts            PEFT ``modules_to_save`` (LLaMA-Factory's ``additional_target``), e.g. ["embed_tokens", "lm_head"]
  freeze         LLaMA-Factory freeze tuning, ``freeze_trainable_layers`` N, modules ``all`` (no ``lora``): the
                 parameters named ``.{id}.`` for the last N layer ids (first |N| for N < 0) train, the rest not
  quant          4 or 8: load the model with bitsandbytes (``from_pretrained`` of the random checkpoint
                 ``$PROBE_CKPT``, written by ``--save-random``) as LLaMA-Factory does: compute dtype bf16, nf4,
                 ``double_quant``; under ZeRO-3 no device_map and ``bnb_4bit_quant_storage`` bf16
                 (``model/model_utils/quantization.py``), else ``device_map={"": rank}``; ``quant_storage``
                 another storage dtype (``uint8``: bitsandbytes' and transformers' default, a script's)
  liger          ``liger_kernel.transformers.apply_liger_kernel_to_llama()`` before the build, with LLaMA-Factory's
                 arguments for training (its defaults: rope, rms_norm, swiglu, fused linear cross-entropy)
  trainable_fp32 cast every trainable tensor to fp32 after the adapters are added (LLaMA-Factory's
                 ``cast_trainable_params_to_fp32``, which it skips under ZeRO-3): PEFT's fp32 adapters and bf16
                 ``modules_to_save`` copies then share one dtype, which ZeRO-3's ``defragment`` asserts
  optim          "adamw_8bit": bitsandbytes' ``AdamW8bit`` as a client optimizer (what the HF Trainer makes of
                 ``optim: adamw_bnb_8bit``; ``zero_allow_untested_optimizer``)
issue 40's timing (``time/run_rows.py`` runs them one at a time; ``time/spec_check.py`` checks a spec file):
  steps          optimizer steps after ``deepspeed.initialize`` (default 3); ``step_s`` stays the median of all of
                 them, the first included (the memory rows' field)
  warmup         the first ``warmup`` steps (default 0) are left out of ``step_median_s``
  ga             gradient accumulation steps (default 1): one step is ``ga`` micro batches of ``mb`` (forward,
                 ``engine.backward``, ``engine.step`` each; DeepSpeed steps the optimizer on the last)
  adam           the optimizer: "torch" (the default without ``cpu_adam``: the config's AdamW with ``torch_adam``,
                 torch's AdamW, foreach), "fused" (``torch_adam: false`` on the GPU: DeepSpeed's FusedAdam, its op
                 built on first use), "client" (what the HF Trainer of transformers 5.17 builds when the DeepSpeed
                 config names no optimizer: its default ``optim`` ``adamw_torch_fused``, i.e.
                 ``torch.optim.AdamW(fused=True)`` over its two weight-decay groups, lr/betas/eps of the Trainer's
                 defaults but lr 1e-5, passed as ``deepspeed.initialize(optimizer=...)`` with
                 ``zero_allow_untested_optimizer``), "cpu" (with ``offload``: DeepSpeed's CPUAdam, as ``cpu_adam``)
  liger          (also) ``apply_liger_kernel_to_qwen2``/``_qwen3``/``_mistral`` by the model's ``model_type``
and, in the output: ``step_times_s`` (each step's wall time, ending in ``torch.cuda.synchronize()``),
``step_median_s`` (median of the steps after ``warmup``), ``phase_ms`` (per step, CUDA events around
``engine(...)``, ``engine.backward`` and ``engine.step``, summed over the micro batches: ``fwd``, ``bwd``, ``opt``;
read after the step's synchronize, no sync added inside it), ``losses``, ``tokens_per_step``, ``optimizer_class``
(DeepSpeed's basic optimizer, the one the ZeRO wrapper steps, with its ``fused``/``foreach`` flags as
``optimizer_flags``), ``client_optimizer`` ("client": the Trainer's ``optim``, class, keyword arguments, group sizes),
``liger_applied``, ``op_load_s`` (with "fused"/"cpu": loading the optimizer's op, its build when not built yet;
left out of ``init_s``), ``seconds_per_row`` (the process's wall time from the probe's first line), ``gpu_name``;
``versions`` adds peft, liger_kernel, triton and CUDA.
With ``ZP_PROBE_DEVICE=cpu`` (and ``DS_ACCELERATOR=cpu``) the same code runs on the CPU: a smoke test of the code
paths, no memory figures (the snapshots are empty) and no GPU time.
Also in the output: ``phase`` of an OOM (init or step), ``host_peak_rss_gb``, ``non_torch_nvml_gb``
(this process's memory by NVML minus PyTorch's reserved, where NVML answers); snapshots ``built`` (after
the model is built), ``after_init`` (after ``deepspeed.initialize``: its peaks are the init phase's), then
the peak counters are reset (``peaks_reset_after_init``: true) so ``steady`` holds the training phase's
peaks alone; ``host_rss_init_gb`` is the host peak RSS at the end of the init phase.
Usage: python zero_mem_probe_plan.py '<json spec>'
       python zero_mem_probe_plan.py --save-random '<model json>' DIR   (a random bf16 checkpoint for ``quant``)
"""
import json, os, resource, shutil, statistics, sys, time

T_PROCESS = time.time()
if sys.argv[1] == "--save-random":
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**json.loads(sys.argv[2])), dtype=torch.bfloat16
                                     ).save_pretrained(sys.argv[3])
    sys.exit(0)
spec = json.loads(sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "time"))
from spec_check import problems  # noqa: E402  (no torch: a bad spec is refused before the GPU is touched)

if problems(spec):
    sys.exit("zero_mem_probe_plan: " + "; ".join(problems(spec)))
DEV = os.environ.get("ZP_PROBE_DEVICE", "cuda")  # "cpu": a smoke run of the code paths (docstring)
CUDA = DEV == "cuda"
if spec.get("alloc_conf"):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = spec["alloc_conf"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
import torch, deepspeed
from transformers import AutoConfig, AutoModelForCausalLM
GB = 1024**3
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
if CUDA:
    torch.cuda.set_device(LOCAL_RANK)  # one GPU per rank under torchrun; GPU 0 alone otherwise


def sync():
    if CUDA:
        torch.cuda.synchronize()


class HostEvent:
    """``torch.cuda.Event``'s two methods on the host clock (the CPU smoke run)."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def event():
    return torch.cuda.Event(enable_timing=True) if CUDA else HostEvent()


def snap(tag):
    if not CUDA:
        return dict(tag=tag)
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    return dict(tag=tag, alloc=s["allocated_bytes.all.current"]/GB, reserved=s["reserved_bytes.all.current"]/GB,
                peak_alloc=s["allocated_bytes.all.peak"]/GB, peak_reserved=s["reserved_bytes.all.peak"]/GB,
                inactive_split=s.get("inactive_split_bytes.all.current", 0)/GB, retries=s.get("num_alloc_retries", 0), ooms=s.get("num_ooms", 0))


def nvml_own_gb():
    try:
        import pynvml
        vis = [x for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
        idx = int(vis[LOCAL_RANK]) if len(vis) > LOCAL_RANK and vis[LOCAL_RANK].strip().isdigit() else LOCAL_RANK
        pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid() and p.usedGpuMemory:
                return p.usedGpuMemory / GB
    except Exception:
        return None
    return None


cfg = AutoConfig.for_model(**spec["model"])
stage = spec["stage"]; mb = spec["mb"]; seq = spec["seq"]
total_gb = torch.cuda.get_device_properties(LOCAL_RANK).total_memory / GB if CUDA else 0.0
out = dict(spec=spec, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
if spec.get("cap_gib") and CUDA:
    multi = int(os.environ["WORLD_SIZE"]) > 1  # FACTS F and the ws2-issue5 rows: outside PyTorch per rank
    cap_alloc = spec["cap_gib"] - ((2.05 if multi else 1.68) if stage == 3 else (1.77 if multi else 1.30))
    torch.cuda.set_per_process_memory_fraction(cap_alloc / total_gb)
    out["cap_alloc_gib"] = cap_alloc
ga = spec.get("ga", 1)
adam = spec.get("adam") or ("cpu" if spec.get("cpu_adam") and spec.get("offload") else "torch")
ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga, "bf16": {"enabled": True},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True, "adam_w_mode": True}},
      "zero_optimization": {"stage": stage, "overlap_comm": spec.get("overlap", False), "contiguous_gradients": True,
                            "reduce_bucket_size": int(spec.get("rbs", 5e8)),
                            "stage3_prefetch_bucket_size": int(spec.get("pbs", 5e8)),
                            "stage3_param_persistence_threshold": int(spec.get("ppt", 1e6)),
                            "stage3_gather_16bit_weights_on_model_save": spec.get("gather", False)},
      "steps_per_print": 10**9}
for key, name in (("sgs", "sub_group_size"), ("mlp", "stage3_max_live_parameters"),
                  ("mrd", "stage3_max_reuse_distance")):
    if spec.get(key) is not None:
        ds["zero_optimization"][name] = int(spec[key])
if spec.get("offload"):
    ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if adam == "cpu":  # DeepSpeed's CPUAdam, the default for an offloaded optimizer (built on first use)
        ds["optimizer"]["params"]["torch_adam"] = False
    else:
        ds["zero_force_ds_cpu_optimizer"] = False
elif adam == "fused":  # torch_adam false on the GPU: DeepSpeed's FusedAdam (engine.get_optimizer_configuration)
    ds["optimizer"]["params"]["torch_adam"] = False
if spec.get("offload_param"):
    ds["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
if spec.get("optim") == "adamw_8bit" or adam == "client":
    # a client optimizer, as the HF Trainer passes its own (or bitsandbytes') to DeepSpeed when the config names none
    del ds["optimizer"]
    ds["zero_allow_untested_optimizer"] = True
t0 = time.time()
snaps = []
phase = "init"
if spec.get("trace"):
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc" if spec.get("trace_frames") else None,
                                             stacks="python", max_entries=2_000_000)
marks = []  # (trace index, phase) where each phase starts


def mark(name):
    if spec.get("trace"):
        marks.append((len(torch.cuda.memory._snapshot()["device_traces"][LOCAL_RANK]), name))


def build_quantized():
    """LLaMA-Factory's bitsandbytes load (v0.9.5 model/model_utils/quantization.py) of the random checkpoint."""
    from transformers import BitsAndBytesConfig
    if spec["quant"] == 4:
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=bool(spec.get("double_quant")),
                               bnb_4bit_quant_storage=getattr(torch, spec.get("quant_storage", "bfloat16")))
    else:
        q = BitsAndBytesConfig(load_in_8bit=True)
    kw = {} if stage == 3 else {"device_map": {"": LOCAL_RANK}}
    return AutoModelForCausalLM.from_pretrained(os.environ["PROBE_CKPT"], quantization_config=q, dtype=torch.bfloat16,
                                                attn_implementation=spec.get("attn", "sdpa"), **kw)


def freeze_tuning(model, n):
    """LLaMA-Factory's freeze tuning (v0.9.5 model/adapter.py _setup_freeze_tuning), modules ``all``."""
    layers = cfg.num_hidden_layers
    ids = range(max(0, layers - n), layers) if n > 0 else range(min(-n, layers))
    keys = [f".{i:d}." for i in ids]
    for name, p in model.named_parameters():
        p.requires_grad_(any(k in name for k in keys))


def trainer_adamw(model):
    """What the HF Trainer builds when the DeepSpeed config names no optimizer (``deepspeed_optim_sched``:
    ``trainer.create_optimizer()``), from the installed transformers' own code: ``Trainer.get_optimizer_cls_and_kwargs``
    for ``TrainingArguments``' default ``optim`` (transformers 5.17: ``adamw_torch_fused`` on torch >= 2.8, i.e.
    ``torch.optim.AdamW(fused=True)``) and its adam defaults, lr 1e-5 here; the two groups of ``create_optimizer``
    (``get_decay_parameter_names``: decay, and bias/norm weights without). No ``TrainingArguments`` instance: making
    one starts torch.distributed (accelerate's PartialState) before DeepSpeed does."""
    from types import SimpleNamespace
    from transformers import Trainer, TrainingArguments
    fields = TrainingArguments.__dataclass_fields__
    args = SimpleNamespace(learning_rate=1e-5, **{k: fields[k].default for k in (
        "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "optim_args", "weight_decay")})
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    out["client_optimizer"] = {"optim": str(args.optim), "class": f"{cls.__module__}.{cls.__qualname__}",
                               "kwargs": {k: v for k, v in kwargs.items() if k != "params"},
                               "group_sizes": [len(g["params"]) for g in groups]}
    return cls(groups, **kwargs)


def apply_liger():
    """LLaMA-Factory's ``apply_liger_kernel`` for training (model_utils/liger_kernel.py): the model type's
    ``apply_liger_kernel_to_<type>()`` with no arguments (``require_logits`` is false for pt and sft), i.e. Liger's
    defaults: rope, rms_norm, swiglu and fused_linear_cross_entropy on, cross_entropy off."""
    import importlib, inspect
    fn = getattr(importlib.import_module("liger_kernel.transformers"), f"apply_liger_kernel_to_{cfg.model_type}")
    fn()
    return {"fn": fn.__name__, "kwargs": {k: v.default for k, v in inspect.signature(fn).parameters.items()
                                          if k != "model"}}


try:
    if spec.get("liger"):
        out["liger_applied"] = apply_liger()
    if spec.get("zero_init") and stage == 3:
        from transformers.integrations import HfDeepSpeedConfig
        deepspeed.init_distributed()
        hf_ds = HfDeepSpeedConfig(ds)  # kept alive: from_config builds inside deepspeed.zero.Init
        if spec.get("quant"):
            model = build_quantized()
        else:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=spec.get("attn", "sdpa"))
    elif spec.get("quant"):
        model = build_quantized()
    else:
        with torch.device(DEV):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=spec.get("attn", "sdpa"))
    snaps.append(snap("built"))
    model.train()  # as the HF Trainer does; from_pretrained (the quant rows) returns eval mode, where checkpointing is off
    if spec.get("gc"): model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = spec.get("lora")
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=lora, lora_alpha=2*lora, target_modules=spec.get("targets") or "all-linear",
                                                 modules_to_save=spec.get("mts"), task_type="CAUSAL_LM"))
    if spec.get("freeze"):
        freeze_tuning(model, int(spec["freeze"]))
    if spec.get("trainable_fp32"):
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.float32)
    numel = lambda p: p.ds_numel if hasattr(p, "ds_numel") else p.numel()
    n_params = sum(numel(p) for p in model.parameters()); n_train = sum(numel(p) for p in model.parameters() if p.requires_grad)
    largest = max(numel(p) for p in model.parameters())
    out.update(n_params=n_params, n_trainable=n_train, largest_param=largest)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    if stage == 3:
        _, g, _ = estimate_zero3_model_states_mem_needs(n_params, largest, int(os.environ["WORLD_SIZE"]), 1, cpu_offload=bool(spec.get("offload")), cpu_offload_params=bool(spec.get("offload_param")), zero_init=True)
    else:
        _, g = estimate_zero2_model_states_mem_needs(n_params, int(os.environ["WORLD_SIZE"]), 1, cpu_offload=bool(spec.get("offload")))
    out["ds_estimate_gpu_gb"] = g/GB
    trained = [p for p in model.parameters() if p.requires_grad]
    client = None
    if spec.get("optim") == "adamw_8bit":
        import bitsandbytes as bnb
        client = bnb.optim.AdamW8bit(trained, lr=1e-5)
    elif adam == "client":
        client = trainer_adamw(model)
        ds["zero_allow_untested_optimizer"] = True  # what transformers' deepspeed_optim_sched sets with it
    if adam in ("fused", "cpu"):  # the op the optimizer loads (built on first use), timed apart from init_s
        from deepspeed.accelerator import get_accelerator
        t = time.time()
        get_accelerator().create_op_builder({"fused": "FusedAdamBuilder", "cpu": "CPUAdamBuilder"}[adam]).load()
        out["op_load_s"] = time.time() - t
        t0 += out["op_load_s"]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, optimizer=client, config=ds)
    out["init_s"] = time.time()-t0
    basic = engine.basic_optimizer
    out["optimizer_class"] = f"{type(basic).__module__}.{type(basic).__qualname__}"
    out["optimizer_flags"] = {k: basic.defaults.get(k) for k in ("fused", "foreach") if k in basic.defaults}
    snaps.append(snap("after_init"))
    out["host_rss_init_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    out["peaks_reset_after_init"] = True
    phase = "step"
    mark("step")
    g = torch.Generator(device=DEV).manual_seed(0)
    phases = []  # per step: the CUDA events of each micro batch, read after the step's synchronize

    def step():
        """One optimizer step: ``ga`` micro batches; the loss of the last, still on the device."""
        evs = []
        for _ in range(ga):
            x = torch.randint(0, cfg.vocab_size, (mb, seq), device=DEV, generator=g)
            ev = [event() for _ in range(4)]
            ev[0].record(); loss = engine(input_ids=x, labels=x).loss
            ev[1].record(); engine.backward(loss)
            ev[2].record(); engine.step()
            ev[3].record(); evs.append(ev)
        phases.append(evs)
        return loss
    ckdir = "/tmp/ck_probe_%d" % os.getpid(); shutil.rmtree(ckdir, ignore_errors=True)
    times, losses = [], []
    for i in range(spec.get("steps", 3)):
        t = time.time(); loss = step(); sync(); times.append(time.time()-t); losses.append(loss.item())
    snaps.append(snap("steady")); out["step_s"] = sorted(times)[len(times)//2]
    warmup = spec.get("warmup", 0)
    out.update(step_times_s=times, step_median_s=statistics.median(times[warmup:]), warmup=warmup, ga=ga,
               tokens_per_step=mb * seq * ga, losses=losses)
    out["phase_ms"] = {name: [sum(ev[i].elapsed_time(ev[i + 1]) for ev in evs) for evs in phases]
                       for i, name in enumerate(("fwd", "bwd", "opt"))}
    phases.clear()
    if CUDA:
        free, total = torch.cuda.mem_get_info(); out["non_torch_gb"] = (total-free)/GB - torch.cuda.memory_reserved()/GB
        own = nvml_own_gb()
        out["non_torch_nvml_gb"] = None if own is None else own - torch.cuda.memory_reserved()/GB
    if spec.get("save", False):
        phase = "save"
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        t = time.time()
        engine.save_checkpoint(ckdir, tag="s1", exclude_frozen_parameters=bool(spec.get("exclude_frozen")))
        sync(); out["save_s"] = time.time()-t
        snaps.append(snap("after_save"))
        out["ckpt_bytes"] = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckdir) for f in fs)
        out["ckpt_files"] = sorted(os.listdir(os.path.join(ckdir, "s1")))
        out["ckpt_file_bytes"] = {f: os.path.getsize(os.path.join(ckdir, "s1", f)) for f in out["ckpt_files"]}
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        phase = "step_after_save"
        step(); snaps.append(snap("first_step_after_save"))
        step(); snaps.append(snap("second_step_after_save"))
        shutil.rmtree(ckdir, ignore_errors=True)
    out["status"] = "ok"
except torch.OutOfMemoryError as e:
    out["status"] = "oom"; out["phase"] = phase; out["error"] = str(e)[:400]; snaps.append(snap("at_oom"))
out["snaps"] = snaps


def where(frames):
    """The innermost frames of a large allocation in DeepSpeed, transformers, PEFT or this probe (trace_frames)."""
    keep = [f"{f['filename'].rsplit('site-packages/', 1)[-1]}:{f['line']}:{f['name']}" for f in frames
            if any(k in f["filename"] for k in ("deepspeed", "transformers", "peft", "zero_mem_probe"))]
    return " < ".join(keep[:4])


if spec.get("trace") and int(os.environ["RANK"]) == 0:
    import gzip
    events = torch.cuda.memory._snapshot()["device_traces"][LOCAL_RANK]
    starts = dict(marks)
    rows, ph = [], "init"
    for i, e in enumerate(events):
        ph = starts.get(i, ph)
        row = [e["action"], e["addr"], e["size"], ph] + ([e.get("stream", 0)] if spec.get("trace_streams") else [])
        if spec.get("trace_frames") and e["action"] == "alloc" and e["size"] >= 32 * 2**20:
            row.append(where(e.get("frames") or []))
        rows.append(row)
    with gzip.open(os.path.join(os.environ.get("TRACE_DIR", "/tmp"), spec["trace"] + ".json.gz"), "wt") as f:
        json.dump(rows, f)
    out["trace_events"] = len(rows)
out["host_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
out["total_gpu_gb"] = total_gb
out["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                   "transformers": __import__("transformers").__version__}


def _version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


out["versions"].update(peft=_version("peft"), liger_kernel=_version("liger-kernel"), triton=_version("triton"),
                       cuda=torch.version.cuda)
out["gpu_name"] = torch.cuda.get_device_name(LOCAL_RANK) if CUDA else None
out["seconds_per_row"] = time.time() - T_PROCESS
print("RESULT " + json.dumps(out), flush=True)
