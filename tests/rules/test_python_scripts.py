import pytest

from tests.conftest import codes, run_check

RANK0_SAVE = '''import deepspeed
import torch.distributed as dist

def train(engine, args, loader):
    for step, batch in enumerate(loader):
        engine.backward(engine(**batch).loss)
        engine.step()
        if dist.get_rank() == 0:
            engine.save_checkpoint(args.output_dir)
        if args.local_rank == 0 and step == 0:
            engine.load_checkpoint(args.output_dir)
'''

ALL_RANKS = '''import deepspeed
import torch.distributed as dist

def train(engine, args, loader, tokenizer):
    engine.save_checkpoint(args.output_dir)
    if dist.get_rank() == 0:
        tokenizer.save_pretrained(args.output_dir)
'''


def test_py001_fires(launch_dir):
    findings = run_check(launch_dir({"train.py": RANK0_SAVE}), select={"PY001"})
    assert codes(findings) == ["PY001", "PY001"]
    assert [f.line for f in findings] == [9, 11] and findings[0].key == "save_checkpoint"


def test_py001_fires_on_is_main_process(launch_dir):
    text = "def f(accelerator, engine):\n    if accelerator.is_main_process:\n        engine.save_checkpoint('o')\n"
    assert codes(run_check(launch_dir({"train.py": text}), select={"PY001"})) == ["PY001"]


def test_py001_fires_on_local_rank_in_list(launch_dir):
    text = "def f(args, engine):\n    if args.local_rank in [-1, 0]:\n        engine.save_checkpoint('o')\n"
    assert codes(run_check(launch_dir({"train.py": text}), select={"PY001"})) == ["PY001"]


def test_py001_quiet_on_all_ranks(launch_dir):
    assert run_check(launch_dir({"train.py": ALL_RANKS}), select={"PY001"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_py001_witness():
    """2 gloo ranks, only rank 0 calls save_checkpoint: it waits for a peer that never joins and fails at the
    15 s process-group timeout instead of saving."""
    from tests.witness.sessions import engine

    ranks = engine("rank0_save", 2, pg_timeout=15)
    assert "Timed out" in ranks["rank0"]["outcome"]
    assert ranks["rank0"]["seconds"] >= 14


GA_SKIP = '''import deepspeed

def train(model_engine, loader, args):
    for i, batch in enumerate(loader):
        model_engine.backward(model_engine(**batch).loss)
        if (i + 1) % args.gradient_accumulation_steps == 0:
            model_engine.step()
'''


def test_py002_fires(launch_dir):
    findings = run_check(launch_dir({"train.py": GA_SKIP}), select={"PY002"})
    assert codes(findings) == ["PY002"] and findings[0].line == 7


def test_py002_quiet_on_plain_optimizer_and_every_step(launch_dir):
    plain = GA_SKIP.replace("model_engine.step()", "optimizer.step()")
    assert run_check(launch_dir({"train.py": plain}), select={"PY002"}) == []
    every = GA_SKIP.replace("        if (i + 1) % args.gradient_accumulation_steps == 0:\n            ", "        ")
    assert run_check(launch_dir({"train.py": every}), select={"PY002"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_py002_witness():
    """GA 4, 8 micro-batches: stepping after each backward gives 2 optimizer steps; stepping by hand every
    4th micro-batch gives 0 (the engine never reaches its boundary)."""
    from tests.witness.sessions import engine

    run = engine("ga_skip", 1, ga=4)
    assert run["every_micro_batch"]["global_steps"] == 2
    assert run["only_at_boundary"]["global_steps"] == 0 and run["only_at_boundary"]["boundaries_seen"] == 0


SHARD_LOAD = '''import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2-7B")
sd = torch.load("out/checkpoint-500/global_step500/zero_pp_rank_0_mp_rank_00_model_states.pt")
model.load_state_dict(sd, strict=False)
'''


def test_py003_fires(launch_dir):
    findings = run_check(launch_dir({"export.py": SHARD_LOAD}), select={"PY003"})
    assert codes(findings) == ["PY003"] and findings[0].line == 5


def test_py003_quiet_on_exported_weights(launch_dir):
    text = SHARD_LOAD.replace("global_step500/zero_pp_rank_0_mp_rank_00_model_states.pt", "pytorch_model.bin")
    assert run_check(launch_dir({"export.py": text}), select={"PY003"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_py003_witness():
    """A real ZeRO-3 rank file loaded into the model: strict raises, strict=False loads nothing, and even its
    `module` entry holds 0-element placeholders."""
    import torch

    from tests.witness.common import tiny_model
    from tests.witness.sessions import root, trainer_saves
    from zeropilot.checkpoint.layout import read_layout

    trainer_saves()
    layout = read_layout(root() / "saves" / "z3_full" / "checkpoint-2")
    sd = torch.load(str(layout.model_file(0)), map_location="cpu", weights_only=False)
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError):
        model.load_state_dict(sd)
    result = model.load_state_dict(sd, strict=False)
    assert len(result.missing_keys) == len(before)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.load_state_dict(sd["module"])


def test_py003_follows_assigned_paths(launch_dir):
    text = ('import glob, torch\nfrom transformers import AutoModelForCausalLM\n'
            'model = AutoModelForCausalLM.from_pretrained("base")\n'
            'for f in glob.glob("ckpt/global_step9/*_optim_states.pt"):\n'
            '    model.load_state_dict(torch.load(f), strict=False)\n')
    findings = run_check(launch_dir({"merge.py": text}), select={"PY003"})
    assert codes(findings) == ["PY003"] and findings[0].line == 5
