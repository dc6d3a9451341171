"""Which checkpoint a restart resumes from, judged on real DeepSpeed checkpoints (``tests/checkpoint``'s builds):
the newest complete one at the restart's world size; newer ones that are partial, of another world size, weights
only or unfinished by the Trainer are skipped with why."""

from __future__ import annotations

import shutil

from tests.checkpoint.conftest import checkpoints  # noqa: F401 - the session's real checkpoints, a fixture
from zeropilot.heal import checkpoints as choice


def _raw(checkpoints, tmp_path):  # noqa: F811
    """A raw engine's save folder (ZeRO-2, 2 ranks) holding its tag and a newer copy of it."""
    save = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "z2")
    (tag,) = [p for p in save.iterdir() if p.is_dir()]
    shutil.copytree(tag, save / "global_step9")
    return save, tag.name


def _saves(save, tags, ranks=(0, 1), **extra):
    return [dict(path=str(save), tag=t, rank=r, attempt=1, **extra) for t in tags for r in ranks]


def test_the_newest_complete_checkpoint_is_chosen(checkpoints, tmp_path):  # noqa: F811
    save, old = _raw(checkpoints, tmp_path)
    got = choice.choose(_saves(save, [old, "global_step9"]), world=2)
    assert got.chosen.tag == "global_step9" and got.chosen.step == 9 and got.skipped == []
    assert got.chosen.framework == "deepspeed" and got.folders == [str(save)]


def test_a_partial_save_is_skipped_with_why_never_resumed(checkpoints, tmp_path):  # noqa: F811
    save, old = _raw(checkpoints, tmp_path)
    next(p for p in (save / "global_step9").iterdir() if "rank_1" in p.name and "optim" in p.name).unlink()
    got = choice.choose(_saves(save, [old, "global_step9"]), world=2)
    assert got.chosen.tag == old
    assert [s.tag for s in got.skipped] == ["global_step9"]
    assert got.skipped[0].why_not.startswith("incomplete:") and "missing" in got.skipped[0].why_not


def test_a_save_a_rank_recorded_failing_or_never_ended_is_skipped(checkpoints, tmp_path):  # noqa: F811
    save, old = _raw(checkpoints, tmp_path)
    saves = _saves(save, [old]) + _saves(save, ["global_step9"], ranks=(0,))
    got = choice.choose(saves, world=2)
    assert got.chosen.tag == old and "only rank(s) 0 of 2 recorded the end" in got.skipped[0].why_not
    saves = _saves(save, [old]) + _saves(save, ["global_step9"], error="OSError: No space left on device")
    assert "recorded this save failing: OSError" in choice.choose(saves, world=2).skipped[0].why_not


def test_a_checkpoint_of_another_world_size_is_not_resumable_as_it_is(checkpoints, tmp_path):  # noqa: F811
    save = checkpoints("z3_w3_fp32").copy(tmp_path / "z3")
    (tag,) = [p.name for p in save.iterdir() if p.is_dir()]
    got = choice.choose(_saves(save, [tag], ranks=(0, 1, 2)), world=2)
    assert got.chosen is None and "saved on 3 data-parallel ranks, the restart runs on 2" in got.skipped[0].why_not
    assert choice.choose(_saves(save, [tag], ranks=(0, 1, 2)), world=3).chosen.tag == tag


def test_a_trainer_checkpoint_without_its_state_file_is_unfinished(checkpoints, tmp_path):  # noqa: F811
    out = checkpoints("trainer_z2_full").copy(tmp_path / "hf")
    (ckpt,) = [p for p in out.iterdir() if p.name.startswith("checkpoint-")]
    saves = _saves(out, [ckpt.name])
    got = choice.choose(saves, world=2)
    assert got.chosen.framework == "hf" and got.chosen.path == ckpt and got.chosen.step == int(ckpt.name[11:])
    (ckpt / "trainer_state.json").unlink()
    got = choice.choose(saves, world=2)
    assert got.chosen is None and "trainer_state.json" in got.skipped[0].why_not


def test_no_save_recorded_means_nothing_to_resume(tmp_path):
    assert choice.choose([], world=2).chosen is None
    assert choice.choose([dict(path=str(tmp_path), tag="16bit_model", rank=0)], world=2).folders == []


def test_one_node_of_several_judges_its_own_ranks_records_and_the_files_for_the_others(checkpoints, tmp_path):  # noqa: F811,E501
    """A job across nodes: node 1's run directory holds rank 1's records only (``here``); the save is whole when every
    rank of this node recorded it and every rank's files are there."""
    save, old = _raw(checkpoints, tmp_path)
    got = choice.choose(_saves(save, [old, "global_step9"], ranks=(1,), here=[1]), world=2)
    assert got.chosen.tag == "global_step9" and got.skipped == []
    got = choice.choose(_saves(save, [old], ranks=(1,), here=[1]) + _saves(save, ["global_step9"], ranks=(), here=[1])
                        + [dict(path=str(save), tag="global_step9", rank=2, attempt=1, here=[1, 3])], world=4)
    assert got.chosen is None or got.chosen.tag != "global_step9"
    next(p for p in (save / "global_step9").iterdir() if "rank_0" in p.name and "optim" in p.name).unlink()
    got = choice.choose(_saves(save, [old, "global_step9"], ranks=(1,), here=[1]), world=2)
    assert got.chosen.tag == old and got.skipped[0].why_not.startswith("incomplete:")
