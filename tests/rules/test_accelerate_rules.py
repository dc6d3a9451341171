"""AC003-AC005 (accelerate against the DeepSpeed config): fixtures, and witnesses on the installed accelerate."""

import pytest

from tests.conftest import run_check
from tests.rules.accelerate_probe import CASES

VERSIONS = "deepspeed=0.19.8,accelerate=1.15.0"
SCRIPT = ("import torch\nfrom accelerate import Accelerator\nfrom accelerate.utils import DummyOptim\n"
          "acc = Accelerator()\nmodel = torch.nn.Linear(2, 2)\n{opt}\nmodel, opt = acc.prepare(model, opt)\n")
OPT = {"real": "opt = torch.optim.AdamW(model.parameters())", "dummy": "opt = DummyOptim(model.parameters())"}


def _files(cfg, precision, optimizer):
    flag = f"--mixed_precision {precision} " if precision else ""
    files = {"ds.json": cfg, "run.sh": f"accelerate launch {flag}--deepspeed_config_file ds.json train.py\n"}
    if optimizer:
        files["train.py"] = SCRIPT.format(opt=OPT[optimizer])
    return files


def _fires(launch_dir, code, name):
    return bool(run_check(launch_dir(_files(*CASES[name])), versions=VERSIONS, select={code}))


EXPECT = {  # rule -> {probe case: fires}
    "AC003": {"mp_fp16_vs_bf16": True, "mp_bf16_vs_fp16": True, "mp_bf16_vs_bf16": False, "mp_fp16_vs_auto": False},
    "AC004": {"opt_both": True, "opt_real_only": False, "dummy_with": False},
    "AC005": {"dummy_without": True, "dummy_with": False, "opt_real_only": False},
}


@pytest.mark.parametrize("code,name", [(c, n) for c, cases in EXPECT.items() for n in cases])
def test_fixtures(launch_dir, code, name):
    assert _fires(launch_dir, code, name) is EXPECT[code][name]


def test_ac003_env_variable(launch_dir):
    files = {"ds.json": CASES["mp_fp16_vs_bf16"][0],
             "run.sh": "export ACCELERATE_MIXED_PRECISION=fp16\naccelerate launch --deepspeed_config_file ds.json "
                       "train.py\n"}
    [f] = run_check(launch_dir(files), versions=VERSIONS, select={"AC003"})
    assert f.key == "bf16.enabled" and f.file.endswith("ds.json")


def _witness(probe, code):
    for name, fires in EXPECT[code].items():
        assert (probe[name] != "ok") is fires, (name, probe[name])


@pytest.mark.witness
@pytest.mark.slow
def test_ac003_witness(accelerate_probe):
    _witness(accelerate_probe, "AC003")
    assert "cannot be set to `fp16` when `bf16`" in accelerate_probe["mp_fp16_vs_bf16"]


@pytest.mark.witness
@pytest.mark.slow
def test_ac004_witness(accelerate_probe):
    _witness(accelerate_probe, "AC004")


@pytest.mark.witness
@pytest.mark.slow
def test_ac005_witness(accelerate_probe):
    _witness(accelerate_probe, "AC005")
