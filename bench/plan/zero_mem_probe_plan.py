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
and, in the output: ``phase`` of an OOM (init or step), ``host_peak_rss_gb``, ``non_torch_nvml_gb``
(this process's memory by NVML minus PyTorch's reserved, where NVML answers); snapshots ``built`` (after
the model is built), ``after_init`` (after ``deepspeed.initialize``: its peaks are the init phase's), then
the peak counters are reset (``peaks_reset_after_init``: true) so ``steady`` holds the training phase's
peaks alone; ``host_rss_init_gb`` is the host peak RSS at the end of the init phase.
Usage: python zero_mem_probe_plan.py '<json spec>'
       python zero_mem_probe_plan.py --save-random '<model json>' DIR   (a random bf16 checkpoint for ``quant``)
"""
import json, os, resource, shutil, sys, time

if sys.argv[1] == "--save-random":
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**json.loads(sys.argv[2])), dtype=torch.bfloat16
                                     ).save_pretrained(sys.argv[3])
    sys.exit(0)
spec = json.loads(sys.argv[1])
if spec.get("alloc_conf"):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = spec["alloc_conf"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
import torch, deepspeed
from transformers import AutoConfig, AutoModelForCausalLM
GB = 1024**3
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(LOCAL_RANK)  # one GPU per rank under torchrun; GPU 0 alone otherwise


def snap(tag):
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
total_gb = torch.cuda.get_device_properties(LOCAL_RANK).total_memory / GB
out = dict(spec=spec, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
if spec.get("cap_gib"):
    multi = int(os.environ["WORLD_SIZE"]) > 1  # FACTS F and the ws2-issue5 rows: outside PyTorch per rank
    cap_alloc = spec["cap_gib"] - ((2.05 if multi else 1.68) if stage == 3 else (1.77 if multi else 1.30))
    torch.cuda.set_per_process_memory_fraction(cap_alloc / total_gb)
    out["cap_alloc_gib"] = cap_alloc
ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
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
    if spec.get("cpu_adam"):  # DeepSpeed's CPUAdam, the default for an offloaded optimizer (built on first use)
        ds["optimizer"]["params"]["torch_adam"] = False
    else:
        ds["zero_force_ds_cpu_optimizer"] = False
if spec.get("offload_param"):
    ds["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
if spec.get("optim") == "adamw_8bit":  # a client optimizer, as the HF Trainer passes bitsandbytes' to DeepSpeed
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


try:
    if spec.get("liger"):
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama()  # LLaMA-Factory passes no arguments for training (model_utils/liger_kernel.py)
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
        with torch.device("cuda"):
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
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, optimizer=client, config=ds)
    out["init_s"] = time.time()-t0
    snaps.append(snap("after_init"))
    out["host_rss_init_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    torch.cuda.reset_peak_memory_stats(); out["peaks_reset_after_init"] = True
    phase = "step"
    mark("step")
    g = torch.Generator(device="cuda").manual_seed(0)

    def step():
        x = torch.randint(0, cfg.vocab_size, (mb, seq), device="cuda", generator=g)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss); engine.step()
        return loss.item()
    ckdir = "/tmp/ck_probe_%d" % os.getpid(); shutil.rmtree(ckdir, ignore_errors=True)
    times = []
    for i in range(spec.get("steps", 3)):
        t = time.time(); step(); torch.cuda.synchronize(); times.append(time.time()-t)
    snaps.append(snap("steady")); out["step_s"] = sorted(times)[len(times)//2]
    free, total = torch.cuda.mem_get_info(); out["non_torch_gb"] = (total-free)/GB - torch.cuda.memory_reserved()/GB
    own = nvml_own_gb()
    out["non_torch_nvml_gb"] = None if own is None else own - torch.cuda.memory_reserved()/GB
    if spec.get("save", False):
        phase = "save"
        torch.cuda.reset_peak_memory_stats()
        t = time.time()
        engine.save_checkpoint(ckdir, tag="s1", exclude_frozen_parameters=bool(spec.get("exclude_frozen")))
        torch.cuda.synchronize(); out["save_s"] = time.time()-t
        snaps.append(snap("after_save"))
        out["ckpt_bytes"] = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckdir) for f in fs)
        out["ckpt_files"] = sorted(os.listdir(os.path.join(ckdir, "s1")))
        out["ckpt_file_bytes"] = {f: os.path.getsize(os.path.join(ckdir, "s1", f)) for f in out["ckpt_files"]}
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
print("RESULT " + json.dumps(out), flush=True)
