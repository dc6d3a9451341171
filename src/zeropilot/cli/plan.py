"""`zeropilot plan`: per-GPU memory, host memory, checkpoint size and save time of a ZeRO launch.

Inputs come from a launch (``LAUNCH_PATH``: files or a directory that ``zeropilot check`` reads) and
from flags; a flag overrides what the launch says. Parse -> build :class:`PlanInputs` -> plan -> render.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.errors import InputError

_FLAG_FIELDS = {"stage": "--stage", "lora_targets": "--lora-target", "modules_to_save": "--modules-to-save",
                "freeze": "--freeze-layers", "quant_bits": "--quantization-bit", "fused_loss": "--fused-loss",
                "optimizer": "--optim", "micro_batch": "--micro-batch", "seq_len": "--seq-len",
                "grad_accum": "--grad-accum", "gradient_checkpointing": "--gradient-checkpointing",
                "offload_optimizer": "--offload-optimizer", "offload_param": "--offload-param",
                "overlap_comm": "--overlap-comm", "attn": "--attn", "expandable_segments": "--expandable-segments",
                "save_total_limit": "--save-total-limit", "reduce_bucket_size": "--reduce-bucket-size",
                "prefetch_bucket_size": "--prefetch-bucket-size", "zero_init": "--zero-init",
                "sub_group_size": "--sub-group-size", "max_live_parameters": "--max-live-parameters",
                "torch_adam": "--torch-adam", "samples": "--samples", "max_steps": "--max-steps",
                "epochs": "--epochs"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="predict per-GPU memory, host memory, checkpoint size and save time of a ZeRO launch",
        description="Predict what each GPU will hold, whether it fits, how big each checkpoint is and how "
                    "long saving takes. Values come from LAUNCH_PATH (DeepSpeed JSON, training YAML, "
                    "launch script, or a directory of them) and from flags; flags win.")
    p.add_argument("launch", nargs="?", metavar="LAUNCH_PATH", help="launch files or directory (optional)")
    p.add_argument("--model", help="config.json, model directory, Hub id or catalogued name (e.g. Qwen/Qwen2-7B)")
    p.add_argument("--gpus", help="COUNTxMEM or COUNTxCARD per node, e.g. 4x16GiB, 1x139.8GiB, 4xH100, 8xMI300X "
                                  "(MEM or CARD alone: count from the launch; cards: docs/cards.md)")
    p.add_argument("--nodes", type=int, help="nodes (default 1)")
    p.add_argument("--stage", choices=["0", "1", "2", "3", "auto"], help="ZeRO stage (auto: fastest that fits)")
    p.add_argument("--micro-batch", type=int, help="micro batch per GPU")
    p.add_argument("--grad-accum", type=int, help="gradient accumulation steps")
    p.add_argument("--seq-len", type=int, help="tokens per sample (cutoff_len)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--lora-rank", type=int, help="LoRA rank (0: full fine-tuning)")
    p.add_argument("--lora-target", metavar="NAMES", help="modules LoRA wraps, comma-separated (q_proj,v_proj; all: "
                                                         "every linear layer, the default)")
    p.add_argument("--modules-to-save", metavar="NAMES", help="modules trained in full beside LoRA "
                                                              "(embed_tokens,lm_head)")
    p.add_argument("--freeze-layers", type=int, metavar="N", help="freeze tuning (LLaMA-Factory): the last N layers "
                                                                  "train (N < 0: the first |N|)")
    p.add_argument("--quantization-bit", type=int, choices=[4, 8], help="bitsandbytes quantization of the LoRA base")
    p.add_argument("--fused-loss", choices=["none", "liger", "cce"], help="a loss that never holds the whole logits")
    p.add_argument("--optim", choices=["adamw", "adamw_8bit"], help="optimizer states: fp32 AdamW or 8-bit")
    p.add_argument("--offload-optimizer", choices=["none", "cpu", "nvme"])
    p.add_argument("--offload-param", choices=["none", "cpu", "nvme"])
    p.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--torch-adam", action=argparse.BooleanOptionalAction, default=None,
                   help="an offloaded optimizer is torch's AdamW, not DeepSpeed's CPUAdam (default: follows the "
                        "launch's DeepSpeed config)")
    p.add_argument("--reduce-bucket-size", type=int, help="elements")
    p.add_argument("--prefetch-bucket-size", type=int, help="elements (ZeRO-3)")
    p.add_argument("--attn", choices=["sdpa", "eager", "flash"])
    p.add_argument("--zero-init", action=argparse.BooleanOptionalAction, default=None,
                   help="ZeRO-3 model built inside deepspeed.zero.Init (default: follows the launch; on for HF "
                        "Trainer/accelerate/LLaMA-Factory, off for a raw deepspeed.initialize script)")
    p.add_argument("--sub-group-size", type=int, help="ZeRO-3 sub_group_size (elements)")
    p.add_argument("--max-live-parameters", type=int, help="stage3_max_live_parameters (elements)")
    p.add_argument("--hardware", metavar="FILE", help="hardware profile from `zeropilot calibrate` (default: the "
                                                      "profile of the visible GPU model, when planning without --gpus)")
    p.add_argument("--outside-torch", type=float, metavar="GiB",
                   help="memory outside PyTorch per rank that you measured (CUDA/HIP context, BLAS, NCCL/RCCL; "
                        "`zeropilot report DIR` shows it per rank): replaces the H200/profile figure, and is what "
                        "a plan across --nodes needs before it gives a verdict")
    p.add_argument("--host-mem", type=float, metavar="GiB", help="host RAM per node (default: this machine's "
                                                                 "when planning without --gpus)")
    p.add_argument("--expandable-segments", action=argparse.BooleanOptionalAction, default=None,
                   help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    p.add_argument("--disk-write", type=float, metavar="GB/s", help="checkpoint write speed (default 1.0)")
    p.add_argument("--disk-free", type=float, metavar="GB", help="free space where checkpoints go")
    p.add_argument("--save-total-limit", type=int)
    p.add_argument("--timeout", type=float, metavar="S", help="collective timeout a save must beat (default 600)")
    p.add_argument("--card", metavar="NAME", help="the card whose speed figures the time model uses when --gpus gives "
                                                  "memory only (4x16GiB --card K100); default: --gpus's card")
    p.add_argument("--inter-node-gbps", type=float, metavar="GBPS",
                   help="with --nodes 2+: one node's network to the others, all its ports, Gb/s each way (a DGX "
                        "H100's eight 400 Gb/s ports: 3200); default: a profile measured across nodes, else an "
                        "assumed 400, named in the plan")
    p.add_argument("--samples", type=int, metavar="N", help="training samples in the dataset: with the launch's epochs, "
                                                            "the run's length and time")
    p.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps of the run (as max_steps)")
    p.add_argument("--epochs", type=float, metavar="E", help="passes over the data (as num_train_epochs)")
    p.add_argument("--gpu-hour-cost", type=float, metavar="COST", help="what one GPU-hour costs: the run's cost")
    p.add_argument("--liger", action=argparse.BooleanOptionalAction, default=None,
                   help="--search may propose Liger's kernels and fused loss (default: where the launch is "
                        "LLaMA-Factory's or the HF Trainer's and liger_kernel is installed here)")
    p.add_argument("--search", action="store_true", help="rank configurations that fit with a 10%% margin, fastest "
                                                         "first by the predicted step time")
    p.add_argument("--write-ds-config", metavar="PATH", help="with --search: write the best DeepSpeed JSON here")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _launch_values(path: Optional[str]):
    if not path:
        return None
    from zeropilot.launch import load_launch
    from zeropilot.launch.planfacts import plan_facts

    launch = load_launch([path], use_installed=False)
    if launch.read_errors:  # as `check` does: a plan from half a launch would be silently wrong
        raise launch.read_errors[0]
    return plan_facts(launch)


def _resolve_arch(args: argparse.Namespace, lv):
    from zeropilot.models import HubAccess, resolve_model

    hub = HubAccess.from_env()  # sizing the named model is what plan is asked; HF_HUB_OFFLINE=1 stops it
    if args.model:
        return resolve_model(args.model, hub=hub), "flag --model"
    if lv is None or not lv.model:
        raise InputError("no model: pass --model (a config.json, model directory, Hub id or catalogued name)"
                         + ("" if lv is None else "; the launch names no model_name_or_path"))
    where = lv.sources["model"].text
    try:
        return resolve_model(lv.model, lv.model_base, hub), where
    except InputError as exc:
        why = exc.reason.split(";")[0] if exc.path is None else exc.render()
        raise InputError(f"model_name_or_path {lv.model!r} ({where}) cannot be sized here "
                         f"({why}): pass --model with the base model's config.json or name, e.g. "
                         "--model Qwen/Qwen2-7B") from None


def _flag_values(args: argparse.Namespace) -> Dict[str, Any]:
    out = {name: getattr(args, name) for name in _FLAG_FIELDS if getattr(args, name, None) is not None}
    if args.stage is not None and args.stage != "auto":
        out["stage"] = int(args.stage)
    elif "stage" in out:
        del out["stage"]
    if args.lora_rank is not None:
        out["lora_rank"] = args.lora_rank or None
    if args.lora_target is not None:
        from zeropilot.launch.settings import names

        targets = names(args.lora_target)
        out["lora_targets"] = None if targets in ((), ("all",)) else targets
    if args.modules_to_save is not None:
        from zeropilot.launch.settings import names

        out["modules_to_save"] = names(args.modules_to_save)
    if args.freeze_layers is not None:
        from zeropilot.launch.settings import Freeze

        out["freeze"], out["lora_rank"] = Freeze(args.freeze_layers), None
    if args.quantization_bit is not None:
        out["quant_bits"] = args.quantization_bit
    if args.fused_loss is not None:
        out["fused_loss"] = None if args.fused_loss == "none" else args.fused_loss
    if args.optim is not None:
        out["optimizer"] = args.optim
    if args.disk_write is not None:
        out["disk_write_bytes_per_s"] = args.disk_write * 1e9
    if args.disk_free is not None:
        out["disk_free_bytes"] = int(args.disk_free * 1e9)
    if args.timeout is not None:
        out["collective_timeout_s"] = args.timeout
    for name, flag in (("samples", "--samples"), ("max_steps", "--max-steps")):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise InputError(f"{flag} {value}: must be at least 1")
            out[name] = value
    if args.epochs is not None:
        if not 0 < args.epochs < 1e6:
            raise InputError(f"--epochs {args.epochs}: must be more than 0")
        out["epochs"] = args.epochs
    if args.host_mem is not None:
        if args.host_mem <= 0:
            raise InputError(f"--host-mem {args.host_mem}: must be positive (GiB)")
        out["host_mem_bytes"] = int(args.host_mem * 2**30)
    return out


def _visible_gpu(args: argparse.Namespace) -> Optional[str]:
    """This machine's GPU, whose profile a plan without --gpus or --hardware uses (None: none found or not asked)."""
    if args.hardware or args.gpus:
        return None
    from zeropilot.launch.hardware import visible_gpu_name

    return visible_gpu_name()


def _profile(args: argparse.Namespace, world: int, gpu_name: Optional[str]):
    """The hardware profile named by --hardware, or found for the visible GPU ``gpu_name``."""
    from zeropilot.memory.profile import find, load

    if args.hardware:
        return load(args.hardware)
    return find(gpu_name, world) if gpu_name else None


def _apply_profile(profile, values: Dict[str, Any], sources: Dict[str, str], args) -> None:
    """Fill what the profile knows and the flags and launch did not say."""
    where = f"hardware profile {profile.path}"
    if profile.expandable_segments is False and values.get("expandable_segments"):
        values["expandable_segments"] = False
        sources["expandable_segments"] = f"{where}: expandable_segments does not take effect on this build"
    if profile.disk_write_bytes_per_s and "disk_write_bytes_per_s" not in values:
        values["disk_write_bytes_per_s"] = profile.disk_write_bytes_per_s
        sources["disk_write_bytes_per_s"] = f"{where} ({profile.disk_path})"
    if profile.host_mem_bytes and "host_mem_bytes" not in values and not args.gpus:
        values["host_mem_bytes"] = profile.host_mem_bytes
        sources["host_mem_bytes"] = where


def _hardware(args: argparse.Namespace, lv):
    """``--gpus``: COUNTxMEM or COUNTxCARD, or MEM or CARD alone with the count from the launch."""
    from zeropilot.memory.inputs import has_count, parse_gpus

    nodes = args.nodes or 1
    if not args.gpus:
        return None
    text = args.gpus
    if not has_count(text):
        if lv is None or not lv.world_size:
            raise InputError(f"--gpus {text!r}: give COUNTxMEM or COUNTxCARD (the launch does not say how many GPUs)")
        text = f"{max(lv.world_size // nodes, 1)}x{text}"
    return parse_gpus(text, nodes)


def build_inputs(args: argparse.Namespace):
    """PlanInputs from the launch (if any) with the flags applied on top.

    The launch is read first and whole (``launch.planfacts``), the flags next; ``memory`` then takes over: the plan's
    input path crosses from ``launch`` to ``memory`` once (``tests/test_plan_one_pass.py``)."""
    from zeropilot.memory.from_launch import launch_inputs
    from zeropilot.memory.inputs import PlanInputs

    lv = _launch_values(args.launch)
    arch, model_source = _resolve_arch(args, lv)
    flags = _flag_values(args)
    gpu_name = _visible_gpu(args)
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {"model": model_source}
    args._launch_said_nothing = False
    if lv is not None:
        given = launch_inputs(lv, arch.hidden)
        args._launch_said_nothing = not any(k in given.sources for k in given.values)  # a value with no source: derived
        values.update(given.values)
        sources.update({k: v for k, v in given.sources.items() if k in given.values or k in ("model", "world_size")})
        if lv.world_size:
            values["world"] = lv.world_size
        values["flavour"] = lv.flavour
    values.update(flags)
    sources.update({k: "flag " + _FLAG_FIELDS.get(k, "--" + k.replace("_", "-")) for k in flags})
    hardware = _hardware(args, lv)
    if hardware is not None:
        sources["hardware"] = f"flag --gpus {args.gpus}"
    world = hardware.world_size if hardware else values.get("world", 1)
    profile = _profile(args, world, gpu_name)
    if profile is not None:
        _apply_profile(profile, values, sources, args)
        if hardware is None and profile.gpu_total_bytes:
            from zeropilot.memory.inputs import Hardware

            hardware = Hardware(world, profile.gpu_total_bytes, args.nodes or 1,
                                f"{world}x{profile.gpu_name} (profile)")
            sources["hardware"] = f"hardware profile {profile.path}"
    if "host_mem_bytes" not in values and not args.gpus:
        from zeropilot.calibrate.run import host_mem_bytes

        values["host_mem_bytes"] = host_mem_bytes()
        sources["host_mem_bytes"] = "this machine (/proc/meminfo)"
    values.pop("world", None) if hardware is not None else None
    inputs = PlanInputs(arch=arch, hardware=hardware, sources=sources, **values)
    inputs.validate()
    args._profile = profile
    return inputs


def _auto_stage(inputs, speed):
    """``--stage auto``: of ZeRO-1, 2 and 3, the fastest by predicted step time that fits with the safe margin (else
    ZeRO-3)."""
    from zeropilot.memory.plan import SAFE_MARGIN, make_plan

    if inputs.hardware is None:
        raise InputError("--stage auto needs --gpus")
    fitting = [make_plan(inputs.with_(stage=stage), speed=speed) for stage in (2, 1, 3)]
    fitting = [p for p in fitting if p.gpu_peak_bytes <= inputs.hardware.gpu_bytes * (1 - SAFE_MARGIN)]
    if not fitting:
        return inputs.with_(stage=3)
    return min(fitting, key=lambda p: p.time.step_s).inputs


def _speed(args: argparse.Namespace, inputs):
    """The card's speed figures: ``--card``, else the card ``--gpus`` named, else the hardware profile's GPU (a
    profile's measured figures win for its own card, and a card's own profile is found where none is given); a card
    the table does not know has a stand-in, said in the figures' notes."""
    import math

    from zeropilot.memory.links import with_inter_node
    from zeropilot.memory.speed import speed_of

    card = args.card or (inputs.hardware.card if inputs.hardware is not None else None)
    speed = speed_of(card, args._profile, inputs.world_size)
    gbps = getattr(args, "inter_node_gbps", None)
    if gbps is not None and not (math.isfinite(gbps) and 0 < gbps <= 1e6):
        raise InputError(f"--inter-node-gbps {gbps}: give one node's network in Gb/s, more than 0 (400 for one "
                         "InfiniBand NDR port)")
    nodes = inputs.hardware.nodes if inputs.hardware is not None else 1
    return with_inter_node(speed, gbps) if nodes > 1 or gbps is not None else speed


def _gpu_hour_cost(args: argparse.Namespace):
    import math

    cost = args.gpu_hour_cost
    if cost is not None and (not math.isfinite(cost) or cost < 0):
        raise InputError(f"--gpu-hour-cost {cost}: give what one GPU-hour costs, a number 0 or more")
    return cost


def _fused_losses(args: argparse.Namespace, inputs):
    """The fused losses --search may propose: Liger where the launch's framework offers it (LLaMA-Factory's
    ``enable_liger_kernel``, the Trainer's ``use_liger_kernel``) and it is installed here; ``--liger`` says it will
    be (and the launch can take it), ``--no-liger`` never."""
    if args.liger is not None:
        return ("liger",) if args.liger else ()
    if inputs.flavour not in ("llamafactory", "hf"):
        return ()
    import importlib.util

    return ("liger",) if importlib.util.find_spec("liger_kernel") is not None else ()


def _write_json_atomic(path: str, data: dict) -> None:
    """The ``--write-ds-config`` file, written atomically into a folder that must exist."""
    from zeropilot.runlog.layout import write_text_atomic

    target = Path(path)
    if not target.parent.is_dir():
        raise InputError("directory does not exist", target.parent)
    from zeropilot.safefile import check_output

    check_output(target)
    try:
        write_text_atomic(target, json.dumps(data, indent=2) + "\n", mode=0o644)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", target) from None


def _outside_torch(args: argparse.Namespace, inputs, constants, notes: List[str]):
    """``--outside-torch GiB``: the user's own per-rank figure; it covers the plan's nodes (they measured there).

    Raises:
        InputError: a negative or absurd figure; ``--search`` across nodes without it (candidates would be
            ranked on memory that leaves the inter-node buffers out).
    """
    from zeropilot.memory.profile import with_outside_torch

    nodes = inputs.hardware.nodes if inputs.hardware else 1
    if args.outside_torch is None:
        if args.search and nodes > constants.outside_nodes:
            raise InputError(f"--search across {nodes} nodes needs --outside-torch GiB: NCCL's inter-node "
                             "buffers are not modelled, so no configuration can be said to fit")
        return constants, notes
    if not 0 <= args.outside_torch <= 1024:
        raise InputError(f"--outside-torch {args.outside_torch}: give GiB per rank, 0-1024")
    constants = with_outside_torch(constants, args.outside_torch * (1 << 30), "flag --outside-torch, measured by you",
                                   nodes=nodes)
    return constants, notes + [f"outside PyTorch: {args.outside_torch:.2f} GiB per rank (flag --outside-torch)"]


def _defaults_note(launch: str, inputs) -> Optional[str]:
    """What the plan assumed where the launch sets no training setting it reads (an empty mapping, only a model,
    only output settings), so that a plan of defaults is not taken for the plan of the launch; None when flags
    gave every headline setting."""
    from zeropilot.memory.render import assumed_defaults

    assumed = assumed_defaults(inputs)
    if not assumed:
        return None
    flags = ", ".join(_FLAG_FIELDS.get(name, "--lora-rank") for name, _ in assumed)
    return (f"{launch} sets no training setting the plan reads: it assumed "
            f"{', '.join(words for _, words in assumed)}; set them in the launch, or pass {flags}")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.plan import make_plan
    from zeropilot.memory.render import render_text, to_dict
    from zeropilot.memory.search import deepspeed_config, search

    inputs = build_inputs(args)
    cost = _gpu_hour_cost(args)
    speed = _speed(args, inputs)
    if args.stage == "auto":
        inputs = _auto_stage(inputs, speed)
    constants, notes = DEFAULT, []
    if args._profile is not None:
        from zeropilot.memory.profile import apply

        constants, notes = apply(args._profile, DEFAULT, inputs.world_size, inputs.stage)
    constants, notes = _outside_torch(args, inputs, constants, notes)
    assumed = _defaults_note(args.launch, inputs) if args._launch_said_nothing else None
    notes = ([assumed] if assumed else []) + notes
    plan = make_plan(inputs, constants, speed, gpu_hour_cost=cost)
    if notes:
        plan = dataclasses.replace(plan, notes=tuple(notes) + plan.notes)
    found = (search(inputs, constants=constants, speed=speed, fused_losses=_fused_losses(args, inputs))
             if args.search else None)
    if args.write_ds_config:
        if not found or not found[0]:
            raise InputError("--write-ds-config needs --search with a configuration that fits")
        _write_json_atomic(args.write_ds_config, deepspeed_config(found[0][0].plan.inputs))
    comm = _step_comm(inputs, args._profile)
    if args.format == "json":
        from zeropilot.envelope import PLAN_SCHEMA, dumps, envelope

        doc = to_dict(plan, found)
        doc["step_comm"] = comm.to_dict() if comm is not None else None
        sys.stdout.write(dumps(envelope(PLAN_SCHEMA, doc)))
    else:
        print(render_text(plan, found), end="")
        if comm is not None:
            from zeropilot.memory.comm import render_lines

            print("\n".join(render_lines(comm)))
    return 0


def _step_comm(inputs, profile):
    """The step's collectives across nodes (or at a profile's measured speed), None for a one-node plan without
    network figures (nothing to say)."""
    from zeropilot.memory.comm import step_comm

    nodes = inputs.hardware.nodes if inputs.hardware else 1
    if nodes <= 1 and not getattr(profile, "network", None):
        return None
    return step_comm(inputs, profile)
