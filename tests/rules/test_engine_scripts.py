"""PY004-PY007 (raw deepspeed.initialize scripts against their config): fixtures and witnesses.

The witnesses read what a real one-rank engine did with the same pattern (``tests/rules/init_probe.py``).
"""

import pytest

from tests.conftest import run_check

DS_NEW = "deepspeed=0.19.8"
INIT = "engine, opt, _, _ = deepspeed.initialize(model=model, {opt}config='ds.json')\n"


def _script(body: str, opt: str = "") -> str:
    return "import deepspeed, torch\nmodel = torch.nn.Linear(2, 2)\n" + INIT.format(opt=opt) + body


NO_SYNC = "for x in data:\n    with engine.no_sync():\n        engine.backward(engine(x).sum())\n    engine.step()\n"
STEP_IN = "for x in data:\n    with engine.no_sync():\n        engine.backward(engine(x).sum())\n        engine.step()\n"
SGD = "optimizer=torch.optim.SGD(model.parameters(), lr=0.1), "
ADAMW_VAR = "opt = torch.optim.AdamW(model.parameters())\n"


def _run(launch_dir, code, cfg, script):
    files = {"ds.json": dict({"train_micro_batch_size_per_gpu": 1}, **cfg), "train.py": script}
    return run_check(launch_dir(files), versions=DS_NEW, select={code})


# (probe case, rule, config, script, fires)
CASES = [
    ("no_sync_z2", "PY004", {"zero_optimization": {"stage": 2}}, _script(NO_SYNC), True),
    ("no_sync_z3", "PY004", {"zero_optimization": {"stage": 3}}, _script(NO_SYNC), True),
    ("no_sync_z1", "PY004", {"zero_optimization": {"stage": 1}}, _script(NO_SYNC), False),
    ("step_in_no_sync_z1", "PY005", {"zero_optimization": {"stage": 1}}, _script(STEP_IN), True),
    ("no_sync_z1", "PY005", {"zero_optimization": {"stage": 1}}, _script(NO_SYNC), False),
    ("sgd_z2", "PY006", {"zero_optimization": {"stage": 2}}, _script("", SGD), True),
    ("sgd_z2_allowed", "PY006", {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True},
     _script("", SGD), False),
    ("sgd_z0", "PY006", {}, _script("", SGD), False),
    ("adamw_offload_z2", "PY007", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
     ADAMW_VAR + _script("", "optimizer=opt, "), True),
    ("adamw_offload_z2_unforced", "PY007", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                                            "zero_force_ds_cpu_optimizer": False},
     ADAMW_VAR + _script("", "optimizer=opt, "), False),
]


@pytest.mark.parametrize("case,code,cfg,script,fires", CASES)
def test_fixtures(launch_dir, case, code, cfg, script, fires):
    assert bool(_run(launch_dir, code, cfg, script)) is fires


def test_py004_quiet_under_the_trainer(launch_dir):
    files = {"ds.json": {"zero_optimization": {"stage": 2}}, "train.py": _script(NO_SYNC),
             "train.yaml": "output_dir: o\ndeepspeed: ds.json\n"}
    assert run_check(launch_dir(files), versions=DS_NEW, select={"PY004"}) == []


def test_py005_points_at_the_step(launch_dir):
    [f] = _run(launch_dir, "PY005", {}, _script(STEP_IN))
    assert f.line == 7 and f.file.endswith("train.py")


def _witness(init_probe, code):
    for case, c, _, _, fires in CASES:
        if c == code:
            assert (init_probe[case] != "ok") is fires, (case, init_probe[case])


@pytest.mark.witness
@pytest.mark.slow
def test_py004_witness(init_probe):
    _witness(init_probe, "PY004")
    assert "incompatible with gradient partitioning" in init_probe["no_sync_z2"]


@pytest.mark.witness
@pytest.mark.slow
def test_py005_witness(init_probe):
    _witness(init_probe, "PY005")
    assert "illegal to call Engine.step() inside no_sync" in init_probe["step_in_no_sync_z1"]


@pytest.mark.witness
@pytest.mark.slow
def test_py006_witness(init_probe):
    _witness(init_probe, "PY006")
    assert "zero_allow_untested_optimizer" in init_probe["sgd_z2"]


@pytest.mark.witness
@pytest.mark.slow
def test_py007_witness(init_probe):
    _witness(init_probe, "PY007")
    assert init_probe["adamw_offload_z2"].startswith("ZeRORuntimeException")
