from pathlib import Path

from hypothesis import given, settings, strategies as st

from zeropilot.launch.commands import interpret, parse_flag_args
from zeropilot.launch.shell import parse_script

SEED = """#!/bin/bash
pkill -9 python; pkill -9 torchrun
export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
export ROCR_VISIBLE_DEVICES=0,1,2,3
CFG=configs/a.yaml
FORCE_TORCHRUN=1 llamafactory-cli train \\
    $CFG \\
    learning_rate=1e-4  # override
"""


def test_exports_prefixes_and_commands():
    script = parse_script(SEED, Path("run.sh"))
    env = script.exported()
    assert env["ROCR_VISIBLE_DEVICES"].value == "0,1,2,3" and env["ROCR_VISIBLE_DEVICES"].line == 4
    assert env["FORCE_TORCHRUN"].command == "llamafactory-cli"
    assert "CFG" not in env
    names = [c.name for c in script.commands]
    assert names == ["pkill", "pkill", "llamafactory-cli"]
    train = script.commands[2]
    assert train.argv[2] == "configs/a.yaml" and train.line == 6
    assert SEED[train.offsets[3]:].startswith("learning_rate=1e-4")


def test_interpret_launchers():
    def lc(line):
        return interpret(parse_script(line, Path("x.sh")).commands[0])

    d = lc("deepspeed --num_gpus 2 --num_nodes=2 train.py --deepspeed ds.json --bf16")
    assert (d.launcher, d.nproc, d.nnodes, d.program) == ("deepspeed", "2", "2", "train.py")
    assert parse_flag_args(d.program_args) == [("deepspeed", "ds.json", 0), ("bf16", None, 2)]
    t = lc("python -m torch.distributed.run --nproc-per-node=4 train.py --x 1")
    assert (t.launcher, t.nproc, t.program) == ("torchrun", "4", "train.py")
    a = lc("accelerate launch --config_file acc.yaml --num_processes 8 train.py")
    assert (a.launcher, a.nproc, a.config_file) == ("accelerate", "8", "acc.yaml")
    assert lc("echo hello") is None


def test_unbalanced_quotes_do_not_crash():
    script = parse_script("echo 'oops\nexport A=1\n", Path("x.sh"))
    assert isinstance(script.commands, list)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_never_crashes(text):
    script = parse_script(text, Path("x.sh"))
    for command in script.commands:
        interpret(command)
