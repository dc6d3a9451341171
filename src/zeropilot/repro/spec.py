"""What a repro runs, worked out from a launch: pure, no torch.

:func:`launch_settings` is the ONE place that reads the launch for ``repro``. ZeRO stage, precision, PEFT and
offload come from the typed launch facts (:mod:`zeropilot.launch.facts`); sequence length, batch values, gradient
checkpointing, LoRA rank and bucket sizes from :func:`zeropilot.launch.planfacts.plan_facts`, the reader
``plan`` uses; it adds the few training values a run needs that a plan does not (learning rate, schedule, LoRA
alpha/dropout/target, seed).

:func:`build_spec` turns those settings and the command-line options into a :class:`ReproSpec`, a plain
JSON-able record that every rank of every leg reads (``repro-spec.json`` in the run directory).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.errors import InputError

#: Parts of the training state a resume must bring back, in the order the verdict names them.
PARTS = ("loss", "weights", "optimizer", "scheduler", "step", "rng", "data", "world_size")
#: Parts a resume can be told to leave out (``--leave-out``), as a checkpoint that lacks them would.
LEAVE_OUT = ("optimizer", "scheduler", "rng", "data")

#: The shrunk shape ``--cpu`` uses unless ``--full-size``: same model type and config keys, 2 layers.
SHRUNK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              vocab_size=512, max_position_embeddings=256)
SHRUNK_SEQ = 32
SHRUNK_GA = 2
#: Relative tolerance of the resume check: CPU runs are bitwise; on GPU see docs/repro.md (reduction order).
TOLERANCE = {"cpu": {"loss": 0.0, "state": 0.0}, "cuda": {"loss": 1e-3, "state": 1e-2}}
#: Through a universal checkpoint onto another world size, by training precision (docs/repro.md, "Resume on another
#: number of ranks"): the gradient is reduced over other ranks in another order, so the values are not bitwise
#: equal. ``loss``: relative difference of each step's mean loss; ``state``: the weights' and the optimizer state's
#: difference relative to what training changed after the resume (L2 over the part, ``repro.across``). Measured on
#: CPU (tests/repro): fp32 2e-8 (loss) and 2e-6 (state), bf16 2e-5 and 0.02; a part left out differs by about 1.
UNIVERSAL_TOLERANCE = {"fp32": {"loss": 1e-6, "state": 1e-4}, "bf16": {"loss": 1e-3, "state": 0.1},
                       "fp16": {"loss": 1e-3, "state": 0.1}}
#: How leg 2 resumes: from the ZeRO checkpoint itself, or converted by ``zeropilot ckpt universal``.
RESUME_VIA = ("zero", "universal")
#: Where leg 1's save at ``resume_from`` is converted to a universal checkpoint (``repro.run``, before leg 2).
UNIVERSAL_DIR = "checkpoints-universal"
#: Per-tensor values kept whole for the state comparison up to this many elements; larger ones are digested.
KEEP_WHOLE = 1 << 22


@dataclass
class Options:
    """The command-line options of ``zeropilot repro`` (None: take it from the launch)."""

    nproc: Optional[int] = None
    cpu: bool = False
    gpu_mem_cap: Optional[int] = None
    steps: int = 12
    save_every: int = 4
    resume_from: Optional[int] = None
    resume_nproc: Optional[int] = None
    lora_rank: Optional[int] = None
    seq_len: Optional[int] = None
    micro_batch: Optional[int] = None
    grad_accum: Optional[int] = None
    full_size: bool = False
    leave_out: Tuple[str, ...] = ()
    resume: bool = True
    deterministic: bool = True
    resume_via: Optional[str] = None  # "zero" | "universal"; None: universal when the world size changes


@dataclass
class Settings:
    """What the launch says, with where each value came from (``sources``: name -> ``file:line key``)."""

    model: Optional[str]
    model_base: Optional[str]
    values: Dict[str, Any]
    sources: Dict[str, str]
    ds_config: Dict[str, Any]
    ds_path: str
    world_size: Optional[int]
    notes: List[str] = field(default_factory=list)


@dataclass
class ReproSpec:
    """Everything one rank needs, as plain data (written to ``repro-spec.json``).

    Attributes:
        model_config: ``config.json`` fields the model is built from (random weights).
        model_note: what model this is (shrunk shape, stand-in) in words.
        ds_config: the DeepSpeed config the engine gets, ``"auto"`` filled the way the HF integration fills it.
        stage, precision, micro_batch, grad_accum, seq_len: the launch's values (or the options').
        lora: None for full fine-tuning, else {rank, alpha, dropout, target}.
        gradient_checkpointing: as the launch turns it on.
        lr, scheduler, warmup_steps, weight_decay: the optimizer and schedule.
        steps, save_every, resume_from: the legs: leg 1 trains ``steps`` steps and saves every ``save_every``;
            leg 2 (a new process group) loads the save at ``resume_from`` and trains to ``steps``.
        nproc, resume_nproc: ranks of leg 1 and leg 2.
        device: ``cpu`` or ``cuda``; gpu_mem_cap: emulated card size in bytes (None: the whole card).
        exclude_frozen: save with ``exclude_frozen_parameters`` (as the HF Trainer does for PEFT, see notes).
        leave_out: parts the resume does not restore.
        universal: leg 2 loads the save converted by ``zeropilot ckpt universal`` (``load_universal``), with
            ``resume_micro_batch`` x ``resume_grad_accum`` per rank so the global batch stays the same.
        notes: what the repro assumed or changed, each with its reason.
    """

    model_config: Dict[str, Any]
    model_note: str
    ds_config: Dict[str, Any]
    stage: int
    precision: str
    micro_batch: int
    grad_accum: int
    seq_len: int
    lora: Optional[Dict[str, Any]]
    gradient_checkpointing: bool
    lr: float
    scheduler: str
    warmup_steps: int
    weight_decay: float
    steps: int
    save_every: int
    resume_from: Optional[int]
    nproc: int
    resume_nproc: int
    device: str
    gpu_mem_cap: Optional[int]
    exclude_frozen: bool
    leave_out: List[str]
    deterministic: bool = True
    universal: bool = False
    resume_micro_batch: Optional[int] = None
    resume_grad_accum: Optional[int] = None
    seed: int = 42
    keep_whole: int = KEEP_WHOLE
    name: str = "repro"
    notes: List[str] = field(default_factory=list)
    sources: Dict[str, str] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ReproSpec":
        return cls(**data)

    @property
    def saves(self) -> List[int]:
        """Steps after which leg 1 saves (every ``save_every``, not after the last step)."""
        return list(range(self.save_every, self.steps, self.save_every))

    def batch(self, leg: int) -> Tuple[int, int]:
        """(micro batch, gradient accumulation) per rank in `leg`."""
        if leg == 2 and self.universal:
            return self.resume_micro_batch or self.micro_batch, self.resume_grad_accum or self.grad_accum
        return self.micro_batch, self.grad_accum

    def tolerance(self) -> Dict[str, float]:
        """The relative tolerance of the comparison (see :data:`TOLERANCE`, :data:`UNIVERSAL_TOLERANCE`)."""
        if self.universal and self.resume_nproc != self.nproc:
            base = UNIVERSAL_TOLERANCE.get(self.precision, UNIVERSAL_TOLERANCE["bf16"])
            device = TOLERANCE[self.device]
            return {k: max(base[k], device[k]) for k in base}
        return TOLERANCE[self.device]


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except ValueError:
        return None
    return out if math.isfinite(out) else None


def _precision(ds_facts, train) -> Tuple[str, str]:
    """(precision, where): the DeepSpeed config's when concrete (launch facts), else the training args' flag, which
    the HF integration copies into an ``"auto"`` ``enabled``."""
    from zeropilot.launch.facts import truthy

    if ds_facts.precision is not None and (ds_facts.precision != "fp32" or train is None):
        return ds_facts.precision, f"{ds_facts.doc.path} (fp16/bf16 enabled)"
    if train is not None:
        for name in ("bf16", "fp16"):
            node = train.get(name)
            if node is not None and truthy(node.plain()) is True:
                return name, f"{train.path}:{node.line} {name}"
    return "fp32", "neither bf16 nor fp16 is on"


def _train_value(train, key: str, default: Any) -> Tuple[Any, Optional[str]]:
    node = train.get(key) if train is not None else None
    if node is None:
        return default, None
    return node.plain(), f"{train.path}:{node.line} {key}"


def launch_settings(launch) -> Settings:
    """The launch values ``repro`` needs (the one place it reads the launch; see the module docstring).

    ZeRO stage, precision, PEFT and offload come from the launch facts (``zeropilot.launch.facts``); sequence
    length, batch values, gradient checkpointing, LoRA rank and bucket sizes from the reader ``plan`` uses.

    Raises:
        InputError: the launch has no DeepSpeed config, or none whose ZeRO stage can be read.
    """
    from zeropilot.launch.facts import facts
    from zeropilot.launch.planfacts import plan_facts

    lf = facts(launch)
    lv = plan_facts(launch)
    pairs = lf.hf_pairs
    train = pairs[0][0] if pairs else (launch.train_args[0] if launch.train_args else None)
    ds = pairs[0][1] if pairs else (launch.ds_configs[0] if launch.ds_configs else None)
    if ds is None:
        raise InputError("the launch has no DeepSpeed config (a JSON with zero_optimization): nothing to "
                         "reproduce; give the folder or the files of a DeepSpeed launch")
    dsf = lf.for_doc(ds)
    if dsf.stage is None:
        raise InputError(f"the ZeRO stage cannot be known ({dsf.stage_reason})", path=ds.path)
    values, sources = dict(lv.values), {name: source.text for name, source in lv.sources.items()}
    values["stage"] = dsf.stage
    sources["stage"] = f"{ds.path}:{dsf.stage_node.line if dsf.stage_node is not None else ''} {dsf.stage_reason}"
    values["precision"], sources["precision"] = _precision(dsf, train)
    if train is not None and not lf.peft(train):
        values["lora_rank"] = None
    values["offload_optimizer"], values["offload_param"] = dsf.offload_optimizer, dsf.offload_param
    for name, key, default in (("lr", "learning_rate", 5e-5), ("scheduler", "lr_scheduler_type", "linear"),
                               ("warmup_ratio", "warmup_ratio", 0.0), ("warmup_steps", "warmup_steps", 0),
                               ("weight_decay", "weight_decay", 0.0), ("max_grad_norm", "max_grad_norm", 1.0),
                               ("lora_alpha", "lora_alpha", None), ("lora_dropout", "lora_dropout", 0.0),
                               ("seed", "seed", 42)):
        value, where = _train_value(train, key, default)
        values[name] = value
        if where:
            sources[name] = where
    plain = ds.root.plain()
    if not isinstance(plain, dict):
        raise InputError("the DeepSpeed config is not a JSON object", path=ds.path)
    return Settings(lv.model, str(lv.model_base) if lv.model_base else None, values, sources, plain,
                    str(ds.path), lf.world_size)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def _lora(settings: Settings, opts: Options) -> Optional[Dict[str, Any]]:
    v = settings.values
    rank = opts.lora_rank if opts.lora_rank is not None else v.get("lora_rank")
    if not rank:
        return None
    alpha = _num(v.get("lora_alpha")) or 2 * rank  # LLaMA-Factory's default: 2 x rank
    dropout = _num(v.get("lora_dropout")) or 0.0
    # the modules LoRA wraps, as the launch facts read them (lora_target, target_modules, an adapter config, a
    # LoraConfig in a script): a tuple of names, one regular expression, or None for every linear layer
    targets = v.get("lora_targets")
    target = ("all-linear" if targets in (None, "all-linear") else list(targets) if isinstance(targets, tuple)
              else targets)
    return {"rank": int(rank), "alpha": float(alpha), "dropout": float(dropout), "target": target}


def shrink(config: Dict[str, Any]) -> Dict[str, Any]:
    """The same model type and config keys at :data:`SHRUNK`'s size (heads and KV heads kept in ratio)."""
    out = dict(config)
    heads = int(config.get("num_attention_heads") or 4)
    kv = int(config.get("num_key_value_heads") or heads)
    out.update(SHRUNK)
    out["num_key_value_heads"] = 4 if kv >= heads else (2 if kv * 2 <= heads else 4)
    if "head_dim" in config:
        out["head_dim"] = SHRUNK["hidden_size"] // SHRUNK["num_attention_heads"]
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in config:
            out[key] = 64
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if key in config:
            out[key] = min(int(config[key]), 4)
    for key in ("layer_types", "sliding_window", "max_window_layers", "rope_scaling"):
        out.pop(key, None)
    return out


def describe(config: Dict[str, Any]) -> str:
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size")
    return f"{config.get('model_type')} " + ", ".join(f"{k.replace('num_', '').replace('_size', '')} "
                                                      f"{config.get(k)}" for k in keys)


def fill_ds_config(raw: Dict[str, Any], micro: int, ga: int, world: int, precision: str, hidden: int,
                   max_grad_norm: float) -> Tuple[Dict[str, Any], List[str]]:
    """The DeepSpeed config with ``"auto"`` filled as the HF integration fills it (FACTS B/D).

    The batch values are set to what the repro runs (the launch's, or the options'), so DeepSpeed's batch
    assertion holds at the repro's world size. Returns (config, notes on what was changed).
    """
    import copy

    cfg = copy.deepcopy(raw)
    notes = []
    for key, value in (("train_micro_batch_size_per_gpu", micro), ("gradient_accumulation_steps", ga),
                       ("train_batch_size", micro * ga * world)):
        if cfg.get(key) not in ("auto", None, value):
            notes.append(f"DeepSpeed config {key}={cfg.get(key)!r} replaced by {value} (the value the run uses)")
        cfg[key] = value
    if cfg.get("gradient_clipping") == "auto":
        cfg["gradient_clipping"] = max_grad_norm
    for name in ("fp16", "bf16"):
        section = cfg.get(name)
        if isinstance(section, dict):
            section["enabled"] = precision == name
    if precision in ("fp16", "bf16") and not isinstance(cfg.get(precision), dict):
        cfg[precision] = {"enabled": True}
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        fill = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden}
        for key in list(zero):
            if zero[key] == "auto":
                if key in fill:
                    zero[key] = fill[key]
                else:
                    del zero[key]
    for key in [k for k, v in cfg.items() if v == "auto"]:
        del cfg[key]
    cfg["steps_per_print"] = 10 ** 9
    cfg.setdefault("zero_allow_untested_optimizer", True)
    return cfg, notes


def _scale_buckets(zero: Dict[str, Any], hidden: int) -> str:
    """Bucket sizes of the shrunk model: as the HF integration sizes them from hidden_size (h², 0.9 h², 10 h).

    The launch's (or DeepSpeed's default 5e8-element) buckets are sized for the real model; ZeRO-1/2 allocate the
    whole reduce bucket at the first backward, gigabytes for a model of kilobytes.
    """
    sizes = {"reduce_bucket_size": hidden * hidden, "allgather_bucket_size": hidden * hidden,
             "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
             "stage3_param_persistence_threshold": 10 * hidden}
    zero.update(sizes)
    return ("bucket sizes scaled to the shrunk model (reduce/allgather " + str(hidden * hidden) + ", prefetch "
            + str(sizes["stage3_prefetch_bucket_size"]) + ", persistence " + str(10 * hidden) + " elements)")


def _exclude_frozen(settings: Settings, lora: Optional[Dict[str, Any]]) -> Tuple[bool, str]:
    """Whether saves leave out frozen parameters, as the HF Trainer's checkpoint of this launch would."""
    v = settings.values
    if lora is None:
        return False, "full fine-tuning: every parameter is trained and saved"
    if v.get("save_only_model") and v.get("stage") == 3 and not v.get("gather_16bit_on_save"):
        return False, ("save_only_model with ZeRO-3 and stage3_gather_16bit_weights_on_model_save false: the "
                       "Trainer's save_model falls back to engine.save_checkpoint without "
                       "exclude_frozen_parameters, so every save writes the frozen base (transformers < 5; "
                       "FACTS C)")
    return True, "PEFT: the Trainer saves with exclude_frozen_parameters=True"


def _legs(settings: Settings, opts: Options) -> Tuple[int, int, int, int, int]:
    """(steps, save_every, nproc, resume_nproc, resume_from), checked.

    Raises:
        InputError: options that cannot make a train → save → resume run.
    """
    steps, every = _positive("--steps", opts.steps), _positive("--save-every", opts.save_every)
    if every >= steps:
        raise InputError(f"--save-every {every} must be smaller than --steps {steps}: the resumed run needs "
                         "steps after the save")
    nproc = _positive("--nproc", opts.nproc or settings.world_size or 1)
    resume_nproc = _positive("--resume-nproc", opts.resume_nproc or nproc)
    saves = list(range(every, steps, every))
    resume_from = opts.resume_from if opts.resume_from is not None else saves[0]
    if resume_from not in saves:
        raise InputError(f"--resume-from {resume_from}: leg 1 saves at steps {saves}; pick one before {steps}")
    bad = [p for p in opts.leave_out if p not in LEAVE_OUT]
    if bad:
        raise InputError(f"--leave-out {','.join(bad)}: the parts are {', '.join(LEAVE_OUT)}")
    if opts.resume_via is not None and opts.resume_via not in RESUME_VIA:
        raise InputError(f"--resume-via {opts.resume_via}: expected one of {', '.join(RESUME_VIA)}")
    return steps, every, nproc, resume_nproc, resume_from


def split_batch(total: int, micro: int, ga: int, ranks: int) -> Optional[Tuple[int, int]]:
    """(micro batch, accumulation) per rank that make `total` samples per step on `ranks` ranks: the same micro
    batch if it divides, else the same accumulation, else the largest micro batch that does; None if `ranks` does
    not divide `total`."""
    if total % ranks:
        return None
    per_rank = total // ranks
    if per_rank % micro == 0:
        return micro, per_rank // micro
    if per_rank % ga == 0:
        return per_rank // ga, ga
    best = max(m for m in range(1, min(micro, per_rank) + 1) if per_rank % m == 0)
    return best, per_rank // best


def _universal(settings: Settings, opts: Options, nproc: int, resume_nproc: int, micro: int, ga: int,
               config: Dict[str, Any], lora: Optional[Dict[str, Any]], notes: List[str]
               ) -> Tuple[bool, Optional[int], Optional[int]]:
    """Whether leg 2 resumes through a universal checkpoint, and its batch split (the same global batch).

    Raises:
        InputError: the global batch cannot be split evenly over the resumed ranks.
    """
    via = opts.resume_via or ("universal" if resume_nproc != nproc else "zero")
    if via == "zero" or not opts.resume:
        return False, None, None
    total = micro * ga * nproc
    split = split_batch(total, micro, ga, resume_nproc)
    if split is None:
        raise InputError(f"--resume-nproc {resume_nproc}: the global batch of {total} samples ({micro} x {ga} "
                         f"accumulation x {nproc} ranks) cannot be split evenly over {resume_nproc} ranks; pick a "
                         "world size that divides it, or change --micro-batch / --grad-accum")
    notes.append(f"leg 2 resumes through the universal checkpoint `zeropilot ckpt universal` writes "
                 f"(\"checkpoint\": {{\"load_universal\": true}}) on {resume_nproc} rank(s), micro batch {split[0]} "
                 f"x {split[1]} accumulation: the same {total} samples per step, in the same steps")
    dropped = [k for k, v in config.items() if "dropout" in k and isinstance(v, (int, float)) and v]
    for key in dropped:
        config[key] = 0.0
    if lora and lora.get("dropout"):
        lora["dropout"] = 0.0
        dropped.append("lora_dropout")
    if dropped:
        notes.append(f"{', '.join(dropped)} set to 0: dropout masks come from each rank's generator, which cannot "
                     "carry over to another world size")
    return True, split[0], split[1]


def _shape(settings: Settings, model_config: Dict[str, Any], model_name: str, opts: Options,
           notes: List[str]) -> Tuple[Dict[str, Any], str, int, int, int]:
    """(model config, what it is in words, sequence length, micro batch, accumulation), shrunk for ``--cpu``."""
    v = settings.values
    shrunk = opts.cpu and not opts.full_size
    config = shrink(model_config) if shrunk else dict(model_config)
    note = f"{model_name}, random weights"
    if shrunk:
        note += f", shrunk for --cpu to {describe(config)} (--full-size keeps {describe(model_config)})"
    else:
        note += f": {describe(config)}"
    seq = opts.seq_len or v.get("seq_len") or 512
    if shrunk and not opts.seq_len:
        seq = min(seq, SHRUNK_SEQ)
        notes.append(f"sequence length {seq} (--cpu shrinks it; the launch says {v.get('seq_len')})")
    micro = _positive("--micro-batch", opts.micro_batch or v.get("micro_batch") or 1)
    ga = _positive("--grad-accum", opts.grad_accum or v.get("grad_accum") or 1)
    if shrunk and not opts.grad_accum and ga > SHRUNK_GA:
        notes.append(f"gradient accumulation {SHRUNK_GA} (--cpu shrinks it; the launch says {ga})")
        ga = SHRUNK_GA
    return config, note, int(seq), micro, ga


def build_spec(settings: Settings, model_config: Dict[str, Any], model_name: str, opts: Options) -> ReproSpec:
    """The run a repro does for this launch and these options.

    Raises:
        InputError: options that cannot make a train → save → resume run.
    """
    v = settings.values
    steps, every, nproc, resume_nproc, resume_from = _legs(settings, opts)
    notes = list(settings.notes)
    config, note, seq, micro, ga = _shape(settings, model_config, model_name, opts, notes)
    lora = _lora(settings, opts)
    hidden = int(config.get("hidden_size") or 0)
    precision = v["precision"]
    ds, ds_notes = fill_ds_config(settings.ds_config, micro, ga, nproc, precision, hidden,
                                  float(_num(v.get("max_grad_norm")) or 1.0))
    notes += ds_notes
    zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    if opts.cpu and not opts.full_size:
        notes.append(_scale_buckets(zero, hidden))
    for key in ("offload_optimizer", "offload_param"):
        if isinstance(zero.get(key), dict) and zero[key].get("device") not in (None, "none"):
            notes.append(f"zero_optimization.{key} kept ({zero[key].get('device')})")
    exclude, why = _exclude_frozen(settings, lora)
    notes.append(("saves leave out frozen parameters: " if exclude else "saves include frozen parameters: ") + why)
    universal, resume_micro, resume_ga = _universal(settings, opts, nproc, resume_nproc, micro, ga, config, lora,
                                                    notes)
    warmup = int(_num(v.get("warmup_steps")) or 0) or math.ceil((_num(v.get("warmup_ratio")) or 0.0) * steps)
    seed = v.get("seed")
    return ReproSpec(
        model_config=config, model_note=note, ds_config=ds, stage=int(v["stage"]), precision=precision,
        micro_batch=micro, grad_accum=ga, seq_len=seq, lora=lora,
        gradient_checkpointing=bool(v.get("gradient_checkpointing")), lr=float(_num(v.get("lr")) or 5e-5),
        scheduler=str(v.get("scheduler") or "linear"), warmup_steps=warmup,
        weight_decay=float(_num(v.get("weight_decay")) or 0.0), steps=steps, save_every=every,
        resume_from=resume_from if opts.resume else None, nproc=nproc, resume_nproc=resume_nproc,
        device="cpu" if opts.cpu else "cuda", gpu_mem_cap=None if opts.cpu else opts.gpu_mem_cap,
        exclude_frozen=exclude, leave_out=list(dict.fromkeys(opts.leave_out)), deterministic=opts.deterministic,
        universal=universal, resume_micro_batch=resume_micro, resume_grad_accum=resume_ga,
        seed=int(seed) if isinstance(seed, int) and not isinstance(seed, bool) else 42, notes=notes,
        sources=dict(settings.sources))
