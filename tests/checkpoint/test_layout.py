"""layout.read_layout on real checkpoints: facts against what was trained, damage detection, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zeropilot.checkpoint.layout import read_layout
from zeropilot.errors import InputError

from .conftest import FULL, LORA, SPECS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", FULL + LORA)
def test_layout_facts_match_the_training_run(checkpoints, name):
    built = checkpoints(name)
    spec = SPECS[name]
    layout = read_layout(built.path)
    assert layout.problems == []
    assert layout.stage == spec["stage"]
    assert layout.world_size == spec["world"]
    assert layout.optim_dtype == ("bf16" if spec["dtype"] == "bf16" else "fp32")
    assert layout.ds_version == "0.19.8"
    assert layout.tag == layout.latest == "global_step2"
    assert layout.kind == ("hf-output-dir" if spec.get("trainer") else "save-dir")
    assert len(layout.optim_files) == spec["world"]
    assert len(layout.model_files) == (spec["world"] if spec["stage"] == 3 else 1)
    assert layout.is_peft == bool(spec.get("lora"))


def test_tag_dir_and_checkpoint_dir_are_accepted(checkpoints):
    built = checkpoints("trainer_z3_lora")
    by_checkpoint = read_layout(built.save_dir)
    by_tag = read_layout(built.save_dir / "global_step2")
    assert by_checkpoint.kind == "hf-checkpoint"
    assert by_tag.kind == "tag-dir" and by_tag.save_dir == built.save_dir
    assert by_checkpoint.stage == by_tag.stage == 3
    assert "trainer_state.json" in by_checkpoint.hf_files


def test_layout_imports_no_torch(checkpoints):
    built = checkpoints("z2_w2_bf16_tied")
    code = ("import sys; sys.modules['torch'] = None\n"
            "from zeropilot.checkpoint.layout import read_layout\n"
            f"l = read_layout({str(built.path)!r}); print(l.stage, l.world_size)\n"
            "assert 'deepspeed' not in sys.modules and 'transformers' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]


def test_missing_rank_file_is_named(checkpoints, tmp_path):
    path = checkpoints("z3_w3_fp32").copy(tmp_path / "c")
    victim = path / "global_step2" / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    victim.unlink()
    layout = read_layout(path)
    # The partition count in rank 0's optimizer file says 3, so the last rank is known to be missing.
    assert layout.world_size == 3
    assert victim.name in layout.missing
    assert any(victim.name in p for p in layout.problems)


def test_truncated_and_empty_files_are_named(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "c")
    tag = path / "global_step2"
    truncated = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"")
    layout = read_layout(path)
    assert [f.name for f in layout.truncated] == [truncated.name]
    assert [f.name for f in layout.empty] == ["mp_rank_00_model_states.pt"]
    assert len(layout.problems) == 2


def test_latest_pointing_nowhere_or_to_an_older_tag(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "c")
    (path / "latest").write_text("global_step9")
    layout = read_layout(path)
    assert any("'global_step9', which does not exist" in p for p in layout.problems)
    # A newer tag than `latest`: the save that should have updated it did not finish.
    (path / "global_step2").rename(path / "global_step4")
    (path / "global_step1").mkdir()
    (path / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(b"")
    (path / "latest").write_text("global_step1")
    layout = read_layout(path)
    assert any("newer tag folder exists (global_step4)" in p for p in layout.problems)
    assert read_layout(path, tag="global_step4").problems == []


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(InputError, match="no DeepSpeed checkpoint here"):
        read_layout(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        read_layout(tmp_path / "nope")
