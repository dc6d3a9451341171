"""One rank of one repro leg: ``python -m zeropilot.repro.worker JOB_JSON`` (RANK/WORLD_SIZE/... in the env).

A job is ``{"leg": 1|2, "cases": [{"spec": ReproSpec, "dir": run directory}, ...]}``; one process group runs
every case in turn (one engine after the other), so tests pay for one start-up per leg, not per case.

Leg 1 is the uninterrupted run: train ``steps`` optimizer steps, save after every ``save_every`` (but the last).
Leg 2, started as a new process group, loads the save at ``resume_from`` (leaving out the parts the spec says),
trains to ``steps`` and compares its final state with leg 1's (:mod:`zeropilot.repro.state`). On another world
size through a universal checkpoint (``spec.universal``) both legs also save after the last step, and rank 0 of
leg 2 compares the two final checkpoints parameter by parameter (:mod:`zeropilot.repro.across`).
Everything a rank learns goes to ``DIR/leg{N}-rank-{R}.json`` (the verdict's input) and ``DIR/rank-R.jsonl``
(the run-directory contract, via :mod:`zeropilot.repro.recorder`).

Written by hand rather than through the HF Trainer: the Trainer hides what a resume restores (that is the point
of the check) and costs seconds of start-up per engine; the loop below is DeepSpeed's documented one.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.repro.recorder import Recorder, RssPeak, attach, attach_guard
from zeropilot.repro.spec import UNIVERSAL_DIR, ReproSpec
from zeropilot.runlog.layout import write_json_atomic

OOM_EXIT = 3


def _no_shm_op() -> None:
    """Skip DeepSpeed's CPU shared-memory all-reduce (compiled with gcc on first use; a lock left by a killed
    build hangs every later launch). gloo runs the same collectives (tests/checkpoint/ds_build.py)."""
    import importlib

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def _seed_all(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _dtype(precision: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


class Data:
    """Random token samples in a seeded shuffled order; each rank reads every ``world``-th sample.

    Its state is the position (micro-batches read) and a digest of the order read so far: a resume that does not
    restore the position re-reads the first samples, and the digest of the next steps differs.
    """

    def __init__(self, spec: ReproSpec, rank: int, world: int, leg: int = 1) -> None:
        import torch

        self.spec, self.vocab = spec, int(spec.model_config["vocab_size"])
        self.micro, ga = spec.batch(leg)
        # Step s reads samples perm[s*G:(s+1)*G], G = micro x accumulation x ranks, however G is split over ranks.
        n = spec.steps * ga * self.micro * world
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(spec.seed + 1))
        self.order = perm[rank::world].tolist()
        self.position, self.digest = 0, ""
        self.read: List[int] = []  # the samples of the current step (the runner clears it)

    def next(self):
        import torch

        mb = self.micro
        idx = [self.order[(self.position * mb + j) % len(self.order)] for j in range(mb)]
        self.position += 1
        self.read += idx
        self.digest = hashlib.sha256((self.digest + repr(idx)).encode()).hexdigest()[:16]
        rows = [torch.randint(0, self.vocab, (self.spec.seq_len,),
                              generator=torch.Generator().manual_seed(self.spec.seed * 1_000_003 + i)) for i in idx]
        return torch.stack(rows)

    def state(self) -> Dict[str, Any]:
        return {"position": self.position, "order_digest": self.digest}

    def restore(self, state: Dict[str, Any]) -> None:
        self.position, self.digest = int(state["position"]), str(state["order_digest"])


def _rng_state(cuda: bool) -> Dict[str, Any]:
    """Every generator's state as tensors and plain values (loadable with ``weights_only=True``)."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    out = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}
    if cuda:
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(state: Dict[str, Any], cuda: bool) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if cuda and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


#: This rank's RNG and data position beside DeepSpeed's files (as the HF Trainer's rng_state_N.pth): DeepSpeed's
#: client_state is written into rank 0's model file under ZeRO-1/2, so every rank would load rank 0's.
RANK_STATE = "repro_rank_{}_state.pt"


def _save_rank_state(tag_dir: Path, rank: int, data: Data, cuda: bool) -> None:
    import torch

    tmp = tag_dir / (RANK_STATE.format(rank) + ".tmp")
    torch.save({"data": data.state(), "rng": _rng_state(cuda)}, str(tmp))
    os.replace(tmp, tag_dir / RANK_STATE.format(rank))


def _load_rank_state(tag_dir: Path, rank: int) -> Dict[str, Any]:
    import torch

    return torch.load(str(tag_dir / RANK_STATE.format(rank)), weights_only=True)


def _ds_config(spec: ReproSpec, world: int, leg: int = 1) -> Dict[str, Any]:
    cfg = json.loads(json.dumps(spec.ds_config))
    micro, ga = spec.batch(leg)
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=ga, train_batch_size=micro * ga * world)
    if leg == 2 and spec.universal:
        cfg.setdefault("checkpoint", {})["load_universal"] = True
    return cfg


def build_model(spec: ReproSpec, ds: Dict[str, Any], cuda: bool):
    """The model from its config with random weights, inside zero.Init for ZeRO-3 (as the HF integration builds
    it), gradient checkpointing and LoRA as the launch sets them. Returns (model, keep-alive object)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(spec.model_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    keep = None
    if spec.stage == 3:
        from transformers.integrations import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(ds)  # from_config builds inside deepspeed.zero.Init while this lives
    where = torch.device("cuda") if cuda and spec.stage != 3 else nullcontext()
    with where:
        model = AutoModelForCausalLM.from_config(config, dtype=_dtype(spec.precision))
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.lora:
        from peft import LoraConfig, get_peft_model

        lora = spec.lora
        model = get_peft_model(model, LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                                                 lora_dropout=lora["dropout"], target_modules=lora["target"],
                                                 task_type="CAUSAL_LM"))
    return model, keep


def build_engine(spec: ReproSpec, world: int, cuda: bool, leg: int = 1):
    import deepspeed
    import torch
    import transformers

    ds = _ds_config(spec, world, leg)
    model, keep = build_model(spec, ds, cuda)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if "optimizer" not in ds:  # the HF default: torch AdamW with the launch's learning rate and weight decay
        optimizer = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)

    def scheduler(opt):
        return transformers.get_scheduler(spec.scheduler, opt, num_warmup_steps=spec.warmup_steps,
                                          num_training_steps=spec.steps)

    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, optimizer=optimizer,
                                      lr_scheduler=scheduler if "scheduler" not in ds else None, config=ds,
                                      dist_init_required=False)
    engine._repro_keep = keep
    return engine


def train_step(engine, data: Data, cuda: bool) -> List[float]:
    """One optimizer step (``grad_accum`` micro-batches); the micro-batch losses as Python floats (exact)."""
    losses = []
    for _ in range(engine.gradient_accumulation_steps()):
        ids = data.next()
        if cuda:
            ids = ids.cuda()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach().float().item()))
    return losses


def _rank_files(tag_dir: Path, rank: int) -> int:
    """Bytes this rank wrote into a checkpoint tag folder (names as ``zeropilot.checkpoint.names`` spells them)."""
    from zeropilot.checkpoint.names import MODEL_RE, OPTIM_RE

    total = 0
    for f in tag_dir.iterdir():
        m = MODEL_RE.match(f.name) or OPTIM_RE.match(f.name)
        if m:
            owner = int(m.group(1) if MODEL_RE.match(f.name) else m.group(2))
            if owner == rank:
                total += f.stat().st_size
        elif rank == 0 and f.is_file() and not f.name.startswith("repro_"):
            total += f.stat().st_size  # mp_rank_00_model_states.pt (ZeRO-1/2) and other rank-0 files
    return total


def save(engine, spec: ReproSpec, rec: Recorder, step: int, ckpt: Path, data: Data, cuda: bool) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    tag = f"global_step{step}"
    rec.reset_peaks()
    before = rec.mem()
    t = time.perf_counter()
    with RssPeak() as rss:
        engine.save_checkpoint(str(ckpt), tag=tag, exclude_frozen_parameters=spec.exclude_frozen)
        _save_rank_state(ckpt / tag, dist.get_rank(), data, cuda)
        if cuda:
            torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = rec.mem()
    peak["host_rss_bytes"] = rss.peak
    dist.barrier()
    after = rec.mem()
    size = _rank_files(ckpt / tag, dist.get_rank())
    rec.write("save", step=step, tag=tag, path=str(ckpt / tag), bytes=size, seconds=seconds, phases=[],
              mem_before=before, mem_peak=peak, mem_after=after)
    return {"step": step, "bytes": size, "seconds": seconds, "mem_before": before, "mem_peak": peak,
            "mem_after": after}


def load(engine, spec: ReproSpec, rec: Recorder, ckpt: Path, data: Data, cuda: bool) -> Dict[str, Any]:
    import torch

    tag = f"global_step{spec.resume_from}"
    rec.reset_peaks()
    before = rec.mem()
    t = time.perf_counter()
    # A checkpoint saved without frozen parameters (PEFT) loads non-strict, as the HF Trainer loads it. A universal
    # one is found through latest_universal; the tag is given all the same.
    path, _ = engine.load_checkpoint(str(ckpt), tag=tag, load_module_strict=not spec.exclude_frozen,
                                     load_optimizer_states="optimizer" not in spec.leave_out,
                                     load_lr_scheduler_states="scheduler" not in spec.leave_out)
    if path is None:
        raise RuntimeError(f"DeepSpeed found no checkpoint {tag} under {ckpt}")
    extra = None if spec.universal else _load_rank_state(ckpt / tag, torch.distributed.get_rank())
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    if extra is None:  # each rank's generators and position belong to the old world size: the position is recomputed
        if "data" not in spec.leave_out:
            data.position = spec.resume_from * spec.batch(2)[1]
    else:
        if "rng" not in spec.leave_out:
            _set_rng_state(extra["rng"], cuda)
        if "data" not in spec.leave_out:
            data.restore(extra["data"])
    after = rec.mem()
    rec.write("load", step=spec.resume_from, tag=tag, path=str(ckpt / tag), bytes=None, seconds=seconds, phases=[],
              mem_before=before, mem_peak=after, mem_after=after)
    return {"step": spec.resume_from, "seconds": seconds, "global_steps": engine.global_steps}


def _device_info(cuda: bool) -> Dict[str, Any]:
    if not cuda:
        return {"name": "cpu", "backend": "cpu", "total_bytes": None}
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "backend": "hip" if torch.version.hip else "cuda", "total_bytes": props.total_memory}


def apply_cap(cap: int, when: str, previous: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Emulate a ``cap``-byte card: allocator limit = cap - memory outside PyTorch measured now on this rank."""
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    if previous is not None and outside <= previous["outside_torch_bytes"]:
        return previous
    limit = cap - outside
    if limit <= 0:
        raise RuntimeError(f"--gpu-mem-cap {cap} bytes is smaller than the memory outside PyTorch ({outside})")
    torch.cuda.set_per_process_memory_fraction(limit / total)
    return {"emulated": True, "cap_bytes": cap, "outside_torch_bytes": outside, "limit_bytes": limit,
            "device_total_bytes": total, "measured": when}


def _warm_up() -> None:
    """Create the NCCL communicator and the cuBLAS handle, so the memory outside PyTorch is there to measure."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).float().sum().item()
    del x, a


def _just_before(step: int, saves: List[int], phase: str) -> str:
    if step - 1 in saves and phase != "save":
        return f"first step after the save at step {step - 1}"
    return f"during {phase}" if phase else "during training"


class _Leg:
    """One case's leg on this rank: its spec, records and result; ``step``/``phase`` say where it is."""

    def __init__(self, case: Dict[str, Any], leg: int, cuda: bool, cap: Optional[Dict[str, Any]]) -> None:
        import torch.distributed as dist

        self.spec, self.root = ReproSpec.from_json(case["spec"]), Path(case["dir"])
        self.leg, self.cuda, self.cap = leg, cuda, cap
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.rec = attach(self.root, self.rank, cuda, leg, self.spec.name)
        self.step, self.phase = 0, "init"
        self.result: Dict[str, Any] = {"leg": leg, "rank": self.rank, "world_size": self.world, "steps": {},
                                       "saves": [], "load": None, "error": None, "oom": None, "cap": cap,
                                       "compare": None, "restored": None}

    def start(self):
        """Build the engine (and, in leg 2, load the save); returns (engine, data, first step to run)."""
        spec = self.spec
        self.rec.write("start", pid=os.getpid(), host=socket.gethostname(),
                       local_rank=int(os.environ.get("LOCAL_RANK", 0)), world_size=self.world,
                       device=_device_info(self.cuda), framework="deepspeed", allocator_settings=None)
        _seed_all(spec.seed)
        t = time.perf_counter()
        engine = build_engine(spec, self.world, self.cuda, self.leg)
        attach_guard(engine)
        self.rec.write("init", zero_stage=spec.stage, seconds=time.perf_counter() - t, mem=self.rec.mem())
        data = Data(spec, self.rank, self.world, self.leg)
        if self.leg == 1:
            return engine, data, 1
        self.phase = "load"
        source = self.root / (UNIVERSAL_DIR if spec.universal else "checkpoints")
        self.result["load"] = load(engine, spec, self.rec, source, data, self.cuda)
        if not spec.universal:
            self.result["restored"] = self.state(engine, data, f"step{spec.resume_from}")
        return engine, data, spec.resume_from + 1

    def train(self, engine, data: Data, first: int) -> None:
        """Steps ``first`` .. ``steps``, each recorded, with the saves of this leg after theirs."""
        import torch

        spec = self.spec
        for self.step in range(first, spec.steps + 1):
            self.phase = "step"
            self.rec.reset_peaks()
            t = time.perf_counter()
            losses = train_step(engine, data, self.cuda)
            if self.cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            if self.cap and self.step == first:
                self.cap = self.result["cap"] = apply_cap(self.cap["cap_bytes"], f"after step {self.step}", self.cap)
            mem = self.rec.mem()
            self.rec.write("step", step=self.step, seconds=seconds, mem=mem, losses=losses, data=data.digest)
            self.result["steps"][str(self.step)] = {"losses": losses, "data": data.digest, "seconds": seconds,
                                                    "mem": mem, "samples": sorted(data.read)}
            data.read = []
            final = spec.universal and self.step == spec.steps  # both legs keep their last state for the comparison
            if final or self.step in spec.saves and (self.leg == 1 or self.step > spec.resume_from):
                self.phase = "save"
                folder = self.root / ("checkpoints" if self.leg == 1 else "checkpoints-leg2")
                self.result["saves"].append(save(engine, spec, self.rec, self.step, folder, data, self.cuda))
                if self.leg == 1 and self.step == spec.resume_from:
                    self.state(engine, data, f"step{self.step}")

    def state(self, engine, data: Data, point: str) -> Optional[Dict[str, Any]]:
        return _state(engine, self.spec, self.root, point, self.leg, self.rank, data)

    def failed(self, exc: BaseException) -> None:
        """Record an OOM or an error where it happened."""
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            self.rec.oom(self.step, self.phase, exc, _just_before(self.step, self.spec.saves, self.phase))
            self.result["oom"] = {"step": self.step, "phase": self.phase,
                                  "message": str(exc).splitlines()[0][:400]}
            return
        where = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)[-6:]]
        self.rec.write("error", type=type(exc).__name__, message=str(exc)[:2000], where=where)
        self.result["error"] = {"type": type(exc).__name__, "message": str(exc)[:2000], "phase": self.phase,
                                "step": self.step}


def run_case(case: Dict[str, Any], leg: int, cuda: bool, cap: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Run one case's leg on this rank; the result dict (also written to ``DIR/leg{N}-rank-{R}.json``).

    An OOM or an error is recorded, not raised: the verdict names it and the next case still runs.
    """
    run = _Leg(case, leg, cuda, cap)
    try:
        engine, data, first = run.start()
        run.train(engine, data, first)
        run.phase = "compare"
        if run.spec.universal and leg == 2:
            run.result["compare"] = _compare_across(run)
        elif run.spec.resume_from is not None:
            run.result["compare"] = run.state(engine, data, "final")
        run.rec.write("end", steps=run.spec.steps)
    except Exception as exc:  # noqa: BLE001 - torch.OutOfMemoryError is an Exception too
        run.failed(exc)
    finally:
        run.rec.close()
        write_json_atomic(run.root / f"leg{leg}-rank-{run.rank}.json", run.result)
        _release()
    return run.result


def _compare_across(run: "_Leg") -> Optional[Dict[str, Any]]:
    """Rank 0 of leg 2: both legs' final checkpoints, parameter by parameter (the world sizes differ)."""
    import torch.distributed as dist

    from zeropilot.repro.across import compare_checkpoints

    dist.barrier()  # every rank's final save is on disk
    if run.rank != 0:
        return None
    spec = run.spec
    tag = f"global_step{spec.steps}"
    return compare_checkpoints(run.root / "checkpoints", run.root / "checkpoints-leg2", tag,
                               f"global_step{spec.resume_from}", spec.tolerance()["state"])


def _release() -> None:
    """Forget the case's engine before the next: transformers builds every later model inside zero.Init while a
    ZeRO-3 HfDeepSpeedConfig is alive, and DeepSpeed engines hold reference cycles."""
    import gc

    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    gc.collect()


def _state(engine, spec: ReproSpec, root: Path, point: str, leg: int, rank: int,
           data: Data) -> Optional[Dict[str, Any]]:
    """Leg 1 keeps its state at ``point``; leg 2 compares its own with it (same rank, same world size only).

    Points: ``step{R}`` (leg 1 right after the save it resumes from; leg 2 right after the load: what the
    resume restored) and ``final`` (after the last step of both).
    """
    import torch

    from zeropilot.repro import state

    path = root / "state" / f"leg1-{point}-rank-{rank}.pt"
    if leg == 2 and (spec.resume_nproc != spec.nproc or not path.is_file()):
        return None
    mine = state.capture(engine, data.state(), spec.keep_whole)
    if leg == 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(mine, str(path))
        return None
    reference = torch.load(str(path), weights_only=True)
    return state.compare(mine, reference, spec.tolerance()["state"])


def main(argv: List[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    leg, cases = int(job["leg"]), job["cases"]
    cuda = cases[0]["spec"]["device"] == "cuda"
    import deepspeed
    import torch
    import torch.distributed as dist

    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        _no_shm_op()
        torch.set_num_threads(1)
    if cases[0]["spec"].get("deterministic", True):
        torch.use_deterministic_algorithms(True, warn_only=True)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    status = 0
    for case in cases:
        cap = None
        if cuda and case["spec"].get("gpu_mem_cap"):
            _warm_up()
            cap = apply_cap(int(case["spec"]["gpu_mem_cap"]), "after NCCL and cuBLAS warm-up")
        result = run_case(case, leg, cuda, cap)
        if result["oom"]:
            sys.stdout.flush()
            os._exit(OOM_EXIT)  # the other ranks wait in a collective: the launcher stops them
        status = status or (1 if result["error"] else 0)
        if cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
