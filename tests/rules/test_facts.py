"""The launch-facts layer: one answer per fact, the libraries' answer (checked on the installed DeepSpeed)."""

import pytest

from tests.conftest import write_files
from zeropilot.launch import load_launch
from zeropilot.launch.document import from_plain, Document
from zeropilot.launch.facts import as_int, ds_facts, facts, truthy, zero_stage

STAGES = [({"zero_optimization": {"stage": 3.0}}, 3), ({"zero_optimization": {"stage": "3"}}, 3),
          ({"zero_optimization": {"stage": True}}, 1), ({"zero_optimization": True}, 1),
          ({"zero_optimization": False}, 0), ({"zero_optimization": {}}, 0), ({}, 0),
          ({"zero_optimization": {"stage": 2.5}}, None)]


def _doc(cfg) -> Document:
    from pathlib import Path

    return Document(Path("ds.json"), "ds_config", "json", from_plain(cfg))


@pytest.mark.parametrize("cfg,stage", STAGES)
def test_stage(cfg, stage):
    assert zero_stage(_doc(cfg))[0] == stage


@pytest.mark.witness
def test_stage_witness():
    """DeepSpeed's get_zero_config reads every case as facts.zero_stage does (2.5 it refuses)."""
    from deepspeed.runtime.zero.config import get_zero_config

    for cfg, stage in STAGES:
        try:
            got = int(get_zero_config(dict(cfg)).stage)
        except Exception:  # refused: the fact is None
            got = None
        assert got == stage, cfg


def test_truthy_is_the_one_helper():
    assert [truthy(v) for v in (True, "yes", "T", "1", 1, "off", "False", 0, "auto", None, 2)] == \
        [True, True, True, True, True, False, False, False, None, None, None]
    assert as_int(1e9) == 10**9 and as_int(True) is None and as_int(2.5) is None


def test_facts_once_per_launch(tmp_path):
    root = write_files(tmp_path, {"ds.json": {"zero_optimization": {"stage": 3.0,
                                                                    "offload_optimizer": {"device": "cpu"}},
                                              "bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto"},
                                  "train.yaml": "output_dir: o\nfinetuning_type: lora\ndataset: x\n"
                                                "deepspeed: ds.json\n"})
    launch = load_launch([root], use_installed=False)
    f = facts(launch)
    assert f is facts(launch) and f is launch.facts()
    [ds] = f.ds
    assert (ds.stage, ds.offload_optimizer, ds.precision, ds.batch.auto, ds.hf) == \
        (3, "cpu", None, ("train_micro_batch_size_per_gpu",), True)
    [(train, linked)] = f.hf_pairs
    assert linked is ds.doc and f.peft(train) is True
    assert ds_facts(_doc({"fp16": {"enabled": True}})).precision == "fp16"


@pytest.mark.parametrize("stage", [3, 3.0, "3"])
def test_rules_share_the_stage(tmp_path, stage):
    """Every rule reads the stage from the facts: 3, 3.0 and "3" are ZeRO-3 for DS011 and DS016 alike."""
    from tests.conftest import run_check

    root = write_files(tmp_path, {"ds.json": {"train_micro_batch_size_per_gpu": 1,
                                              "zero_optimization": {"stage": stage, "allgather_bucket_size": 3}}})
    codes = sorted(f.code for f in run_check(root, versions="deepspeed=0.19.8", select={"DS011", "DS016"}))
    assert codes == ["DS011"]  # ZeRO-3 ignores the bucket (DS011); the odd size matters only at 1/2 (DS016)
