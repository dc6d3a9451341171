"""Without torch, DeepSpeed, transformers or PEFT, the commands that need them say which extra brings them, in one
line with exit 2, before anything starts or is written (never a worker's traceback).

The CLI runs in a subprocess whose imports of those libraries fail, as in an environment without them: a
``sitecustomize`` on its path puts a finder first on ``sys.meta_path`` that refuses them (worker processes would
inherit it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "tests" / "data" / "checkpoints" / "ds0.14.4_z2_w2_bf16" / "run"
BLOCK = '''import os
import sys
BLOCKED = set(os.environ["ZP_TEST_WITHOUT"].split(","))


class _Without:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Without())
'''


@pytest.fixture(scope="module")
def without(tmp_path_factory):
    """Run ``python -m zeropilot ARGS`` where torch and the training libraries cannot be imported."""
    shim = tmp_path_factory.mktemp("without-torch")
    (shim / "sitecustomize.py").write_text(BLOCK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(ROOT / "src")]), ZEROPILOT_OFFLINE="1",
               ZP_TEST_WITHOUT="torch,deepspeed,transformers,peft,safetensors,accelerate")

    def run(*args, cwd, only=None):
        return subprocess.run([sys.executable, "-m", "zeropilot", *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, env=dict(env, ZP_TEST_WITHOUT=only or env["ZP_TEST_WITHOUT"]), timeout=120)
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    return run


@pytest.mark.parametrize("argv,extra,names", [
    (["calibrate", "--out", "OUT/cal.json", "--checkpoint-dir", "OUT"], "calibrate", "torch is not installed"),
    (["repro", ROOT / "examples" / "raw-deepspeed", "--cpu", "--nproc", "2", "--out", "OUT/r"], "repro",
     "torch, deepspeed and transformers are not installed"),
    (["repro", ROOT / "examples" / "seed", "--cpu", "--nproc", "2", "--out", "OUT/r"], "repro",
     "torch, deepspeed, transformers and peft are not installed"),
    (["ckpt", "export", CKPT, "OUT/hf", "--dtype", "bf16"], "ckpt", "torch is not installed"),
], ids=["calibrate", "repro", "repro-lora", "ckpt-export-cast"])
def test_a_missing_extra_is_one_line_and_exit_2(without, tmp_path, argv, extra, names):
    out = tmp_path / "OUT"
    out.mkdir()
    r = without(*[str(a).replace("OUT", str(out)) if str(a).startswith("OUT") else a for a in argv], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line, = r.stderr.splitlines()
    assert line.startswith("zeropilot: error: ") and names in line and f"pip install 'zeropilot[{extra}]'" in line
    assert not any(out.iterdir()), "nothing is written before the extra is there"


def test_ckpt_verify_names_its_extras(without, tmp_path):
    """``verify`` compares tensors with torch (ckpt); with ``--load`` it loads the export with transformers (hf).
    The export itself needs no torch: fp32 masters are copied byte for byte."""
    assert without("ckpt", "export", CKPT, tmp_path / "hf", "--dtype", "fp32", cwd=tmp_path).returncode == 0
    r = without("ckpt", "verify", tmp_path / "hf", "--against", CKPT, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "`zeropilot ckpt verify` compares tensor values: torch and safetensors are not installed" in r.stderr
    assert "pip install 'zeropilot[ckpt]'" in r.stderr
    r = without("ckpt", "verify", tmp_path / "hf", "--against", CKPT, "--load", cwd=tmp_path, only="transformers")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "`zeropilot ckpt verify --load` loads the export and runs one forward: transformers is not installed" \
        in r.stderr and "pip install 'zeropilot[hf]'" in r.stderr


def test_the_core_runs_without_them(without, tmp_path):
    """check and plan import none of them (their one-line errors are not about extras)."""
    assert without("check", ROOT / "examples" / "healthy", cwd=tmp_path).returncode == 0
    r = without("plan", ROOT / "examples" / "seed", "--model", "Qwen/Qwen2-7B", "--gpus", "4x16GiB", cwd=tmp_path)
    assert r.returncode == 0 and "Verdict: fits" in r.stdout
