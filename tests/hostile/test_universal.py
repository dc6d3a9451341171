"""``ckpt universal`` on hostile checkpoints: the threat model of ``docs/ckpt.md`` for the new command.

The families of the other modules, run through ``universal`` (a representative case of each: pickles, zip records,
inconsistent ranks, paths), and what only this command meets: parameter names that become folder names (a
traversal, a name equal to ``optimizer_state.pt``), optimizer moments that do not lie like the fp32 partitions, an
optimizer state in a layout it does not read, a CRC hole in a moment, a kill -9 half way. Each refused case: one
line and exit 2 or a DAMAGED verdict and exit 1, no hang, memory bounded, no secret anywhere, nothing at OUT.
"""

from __future__ import annotations

import os
import shutil
import zipfile

import pytest

from tests.hostile.conftest import SECRET, Z2, Z3, resave, run_cli
from tests.hostile.test_inconsistent import _adam_step, _rename_param, _uneven
from tests.hostile.test_pickles import _plant

pytestmark = pytest.mark.slow

OPT = "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"
Z3_MODEL = "zero_pp_rank_{}_mp_rank_00_model_states.pt"


def universal(c, *extra):
    return run_cli("ckpt", "universal", c.root, c.out, "--no-progress", *extra)


def _base_state(obj):
    osd = obj["optimizer_state_dict"]
    return osd["base_optimizer_state"] if "base_optimizer_state" in osd else osd["optimizer_state_dict"]


def _moment(edit):
    def apply(obj):
        entry = _base_state(obj)["state"][0]
        entry["exp_avg"] = edit(entry["exp_avg"])
    return apply


def _drop_moment(obj):
    del _base_state(obj)["state"][0]["exp_avg_sq"]


def _elastic(obj):
    base = obj["optimizer_state_dict"]["base_optimizer_state"]
    obj["optimizer_state_dict"]["base_optimizer_state"] = [base["state"][0]]


def _extra_group(obj):
    state = _base_state(obj)["state"]
    state[7] = dict(state[0])


def _rename_everywhere(c, model_pattern, new):
    for f in sorted(c.tag_dir.glob(model_pattern)):
        resave(f, _rename_param(new))


# name -> (checkpoint, file to edit, edit, exit code, words the message must hold)
CASES = {
    "exp-avg-shorter-than-its-partition": (Z2, OPT.format(1), _moment(lambda t: t[:-2].clone()), 1,
                                           ["rank 1", "exp_avg"]),
    "exp-avg-of-ints": (Z3, OPT.format(0), _moment(lambda t: t.int()), 1, ["rank 0", "exp_avg", "int32"]),
    "exp-avg-of-two-dimensions": (Z2, OPT.format(0), _moment(lambda t: t.view(2, -1)), 1, ["exp_avg", "flat"]),
    "a-moment-missing-on-one-rank": (Z3, OPT.format(1), _drop_moment, 1, ["rank 1", "exp_avg_sq"]),
    "elastic-base-optimizer-state": (Z2, "*optim_states.pt", _elastic, 2, ["elastic"]),
    "state-of-a-group-that-does-not-exist": (Z2, "*optim_states.pt", _extra_group, 2, ["parameter groups"]),
    "state-of-one-more-group-on-rank-0": (Z2, OPT.format(0), _extra_group, 1, ["rank 1", "1 parameter group",
                                                                               "rank 0's for 2"]),
    "adam-step-of-another-step": (Z2, OPT.format(1), _adam_step(1), 1, ["rank 1", "step"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_optimizer_state_that_does_not_fit_is_refused(case, name):
    which, pattern, edit, code, words = CASES[name]
    c = case(which)
    for f in sorted(c.tag_dir.glob(pattern)):
        resave(f, edit)
    ran = universal(c)
    c.check(ran, code)
    text = ran.stdout + ran.stderr
    assert all(w in text for w in words), text[-2000:]


@pytest.mark.parametrize("new", ["../../../escaped", "optimizer_state.pt", ".hidden", "a/b"])
def test_a_parameter_name_that_is_not_one_folder_name_is_refused(case, new):
    c = case(Z3)
    _rename_everywhere(c, "zero_pp_rank_*_model_states.pt", new)
    ran = universal(c)
    c.check(ran, 1)
    assert "parameter name" in ran.stderr and "folder" in ran.stderr
    assert not any("escaped" in name for _dirpath, dirs, files in os.walk(c.tmp.parent) for name in dirs + files)


def test_uneven_partitions_are_refused(case):
    c = case(Z2)
    _uneven(c)
    c.check(universal(c), 1)


@pytest.mark.parametrize("name", ["os-system", "build-sets-tensor-path", "billion-laughs", "storage-key-traversal"])
def test_a_hostile_pickle_is_refused_and_nothing_runs(case, name):
    c = case(Z2)
    _plant(c, name)
    c.check(universal(c), 2)


def test_a_crc_hole_in_a_moment_is_found_before_out_appears(case):
    """The moment's bytes are copied by the kernel; the CRC of the record they come from is checked all the same."""
    c = case(Z2)
    victim = c.tag_dir / OPT.format(1)
    with zipfile.ZipFile(victim) as zf:
        record = max(zf.infolist(), key=lambda i: i.file_size if "/data/" in i.filename else -1)
        start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra)
    with open(victim, "r+b") as f:  # one byte of the largest record's values, after the local header
        f.seek(start + record.file_size // 2)
        byte = f.read(1)
        f.seek(start + record.file_size // 2)
        f.write(bytes([byte[0] ^ 0x55]))
    ran = universal(c)
    c.check(ran, 2)
    assert "CRC" in ran.stderr


def test_a_fifo_as_an_optimizer_file_does_not_hang(case):
    c = case(Z3)
    (c.tag_dir / OPT.format(1)).unlink()
    os.mkfifo(c.tag_dir / OPT.format(1))
    c.check(universal(c), 1)


def test_a_rank_file_symlinked_outside_is_damaged(case):
    c = case(Z2)
    outside = c.tmp / "elsewhere.pt"
    shutil.move(c.tag_dir / OPT.format(1), outside)
    (c.tag_dir / OPT.format(1)).symlink_to(outside)
    c.check(universal(c), 1)


def test_a_side_file_symlinked_to_a_secret_is_not_copied(case):
    c = case(Z2)
    (c.root / "trainer_state.json").symlink_to(c.secret)
    ran = universal(c)
    c.check(ran, 2)
    assert "outside the checkpoint folder" in ran.stderr


def test_out_inside_the_checkpoint_or_existing_is_refused(case):
    c = case(Z2)
    c.out = c.root / "universal"
    c.check(universal(c), 2)
    c.out = c.tmp / "out"
    c.out.mkdir()
    ran = universal(c)
    assert ran.rc == 2 and "already exists" in ran.stderr and "Traceback" not in ran.stderr
    assert universal(c, "--force").rc == 0 and (c.out / "latest_universal").is_file()


def test_a_universal_checkpoint_is_not_converted_again(case):
    c = case(Z3)
    assert universal(c).rc == 0
    again = run_cli("ckpt", "universal", c.out, c.tmp / "again", "--no-progress")
    assert again.rc == 2 and "already a universal checkpoint" in again.stderr
    inspect = run_cli("ckpt", "inspect", c.out)
    assert inspect.rc == 0 and "any number of data-parallel ranks" in inspect.stdout, inspect.stdout


def test_the_tag_and_names_from_the_checkpoint_are_not_printed_raw(case):
    c = case(Z2)
    evil = "global_step2\x1b]0;owned\x07"
    (c.root / "latest").write_text(evil)
    ran = universal(c)
    c.check(ran, 1)
    assert "\\x1b]0;owned" in ran.stderr


KILL_AFTER_FIRST_FILE = (
    "import os, signal, sys\n"
    "import zeropilot.checkpoint.torchzip_writer as w\n"
    "real = w.write\n"
    "def write_then_die(*a, **k):\n"
    "    real(*a, **k)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "w.write = write_then_die\n"
    "from zeropilot.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def test_a_temp_folder_left_by_kill_9_is_removed_by_the_next_run(case):
    c = case(Z2)
    killed = run_cli("ckpt", "universal", c.root, c.out, "--no-progress", python_code=KILL_AFTER_FIRST_FILE)
    assert killed.rc == -9
    left = [p for p in c.tmp.iterdir() if p.name.startswith(".zeropilot-tmp-")]
    assert len(left) == 1 and list(left[0].rglob("fp32.pt")) and not c.out.exists()
    ran = universal(c)
    assert ran.rc == 0, ran.stderr
    assert not left[0].exists() and f"removed {left[0]}" in ran.stdout
    assert not [p for p in c.tmp.iterdir() if p.name.startswith(".zeropilot-")]


def test_the_secret_never_reaches_the_output(case):
    c = case(Z3)
    ran = universal(c)
    assert ran.rc == 0, ran.stderr
    for dirpath, _dirs, files in os.walk(c.out):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                assert SECRET not in f.read()
