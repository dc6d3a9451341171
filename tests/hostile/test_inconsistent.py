"""Inconsistent checkpoints: real rank files from DeepSpeed, edited with torch and saved back with torch.

Files of different steps or runs mixed in one tag folder, partitions of uneven size with the right
total, counts that do not fit, invalid shapes and names. Before this suite several of these exported
silently wrong models (exit 0). Each is now a DAMAGED verdict naming the rank and the field (exit 1),
or, where one file is not a DeepSpeed file at all, one line (exit 2); nothing is written at OUT.
"""

from __future__ import annotations

import shutil

import pytest

from tests.hostile.conftest import Z2, Z3, resave, run_cli

pytestmark = pytest.mark.slow

OPT = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"
Z3_MODEL = "zero_pp_rank_{}_mp_rank_00_model_states.pt"


def _osd(obj):
    return obj["optimizer_state_dict"]


def _adam_step(value):
    import torch

    def edit(obj):
        for entry in _osd(obj)["base_optimizer_state"]["state"].values():
            entry["step"] = torch.tensor(float(value))
    return edit


def _set(*keys, value):
    def edit(obj):
        target = obj
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return edit


def _pop(key):
    def edit(obj):
        del obj[key]
    return edit


def _uneven(c):
    """Move two values from the end of rank 0's partition to the front of rank 1's: same total."""
    import torch

    parts = {}

    def take(obj):
        t = _osd(obj)["single_partition_of_fp32_groups"][0]
        parts["tail"] = t[-2:].clone()
        _osd(obj)["single_partition_of_fp32_groups"][0] = t[:-2].clone()

    def give(obj):
        t = _osd(obj)["single_partition_of_fp32_groups"][0]
        _osd(obj)["single_partition_of_fp32_groups"][0] = torch.cat([parts["tail"], t])

    resave(c.tag_dir / OPT.format(0), take)
    resave(c.tag_dir / OPT.format(1), give)


def _rename_param(new_name):
    def edit(obj):
        old = next(iter(obj["param_shapes"][0]))
        obj["param_shapes"][0] = {(new_name if k == old else k): v for k, v in obj["param_shapes"][0].items()}
        obj["module"] = type(obj["module"])((new_name if k == old else k, v) for k, v in obj["module"].items())
    return edit


def _negative_shape(obj):
    import torch

    name, shape = next(iter(obj["param_shapes"][0].items()))
    obj["param_shapes"][0][name] = torch.Size([-shape[0], -shape[1]])  # the same element count


def _meta_tensor(obj):
    import torch

    name = next(iter(obj["module"]))
    obj["module"][name] = torch.empty(obj["module"][name].shape, device="meta")


def _expanded_view(obj):
    import torch

    name = next(iter(obj["module"]))
    obj["module"][name] = torch.zeros(1).expand(10**8)  # stride 0: 400 MB if materialised


def _bf16_partition(obj):
    import torch

    _osd(obj)["single_partition_of_fp32_groups"][0] = _osd(obj)["single_partition_of_fp32_groups"][0].to(
        torch.bfloat16)


# name -> (checkpoint, file to edit, edit, exit code, words the message must hold)
CASES = {
    "adam-step-of-another-step": (Z2, OPT.format(1), _adam_step(1), 1, ["rank 1", "step"]),
    "ds-config-of-another-run": (Z2, OPT.format(1), _set("ds_config", "train_micro_batch_size_per_gpu", value=4),
                                 1, ["rank 1", "ds_config"]),
    "z3-global-steps-differ": (Z3, Z3_MODEL.format(1), _set("global_steps", value=3), 1, ["rank 1", "global_steps"]),
    "z3-param-shapes-differ": (Z3, Z3_MODEL.format(1), _rename_param("model.other.weight"), 1,
                               ["rank 1", "param_shapes"]),
    "partition-count-1e9": (Z2, "*optim_states.pt", _set("optimizer_state_dict", "partition_count", value=[10**9]),
                            1, ["1000000000"]),
    "partition-count-a-string": (Z2, OPT.format(0), _set("optimizer_state_dict", "partition_count", value="2"), 2,
                                 ["partition_count"]),
    "partition-dtype-bf16": (Z2, OPT.format(1), _bf16_partition, 1, ["rank 1", "float32"]),
    "optimizer-state-dict-missing": (Z2, OPT.format(0), _pop("optimizer_state_dict"), 2,
                                     ["optimizer_state_dict"]),
    "param-shapes-missing": (Z2, "mp_rank_00_model_states.pt", _pop("param_shapes"), 2, ["param_shapes"]),
    "model-states-a-list": (Z2, "mp_rank_00_model_states.pt", lambda o: [o["module"]], 2, ["dict"]),
    "negative-shape-same-count": (Z2, "mp_rank_00_model_states.pt", _negative_shape, 2, ["not a size"]),
    "metadata-as-a-name": (Z2, "mp_rank_00_model_states.pt", _rename_param("__metadata__"), 1, ["__metadata__"]),
    "control-chars-in-a-name": (Z2, "mp_rank_00_model_states.pt", _rename_param("w\x1b]0;pwned\x07"), 1,
                                ["control"]),
    "meta-tensor": (Z2, "mp_rank_00_model_states.pt", _meta_tensor, 2, ["meta"]),
    "expanded-stride-0-view": (Z2, "mp_rank_00_model_states.pt", _expanded_view, 2, ["storage"]),
    "global-steps-not-the-tag": (Z2, "mp_rank_00_model_states.pt", _set("global_steps", value=7), 1,
                                 ["global_steps", "global_step2"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_inconsistent_checkpoint_is_refused_naming_the_field(case, name):
    which, pattern, edit, code, words = CASES[name]
    c = case(which)
    for f in sorted(c.tag_dir.glob(pattern)):
        resave(f, edit)
    ran = c.export("--dtype", "fp32")
    c.check(ran, code)
    text = ran.stdout + ran.stderr
    assert all(w in text for w in words), text[-2000:]


def test_uneven_partitions_with_the_right_total_are_damaged(case):
    c = case(Z2)
    _uneven(c)
    ran = c.export("--dtype", "fp32")
    c.check(ran, 1)
    assert "rank 1" in ran.stderr and "partition" in ran.stderr


def test_a_rank_file_named_rank_999999999_is_damaged_in_bounded_memory(case):
    c = case(Z2)
    shutil.copyfile(c.tag_dir / OPT.format(1), c.tag_dir / OPT.format(999999999))
    ran = c.export()
    c.check(ran, 1)
    inspect = run_cli("ckpt", "inspect", c.root)
    c.check(inspect, 1)
    assert "beyond the saved world size" in inspect.stdout


def test_a_tag_folder_renamed_to_another_step_is_damaged(case):
    c = case(Z2)
    c.tag_dir.rename(c.root / "global_step3")
    (c.root / "latest").write_text("global_step3")
    ran = c.export()
    c.check(ran, 1)
    assert "global_steps is 2" in ran.stderr
