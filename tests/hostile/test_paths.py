"""Hostile paths: what OUT is, what the checkpoint's files are (FIFOs, symlinks, huge sparse files), what
``latest``/``--tag`` point at, what ends up on the terminal, and ``verify`` on a crafted export.

Each refused case: one line and exit 2, or a DAMAGED verdict and exit 1; no hang, memory bounded, no byte
of the planted secret anywhere, nothing at OUT, nothing written outside what the user named.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import (RSS_LIMIT, SECRET, Z2, Case, assert_no_secret_written, assert_promise, resave,
                                    run_cli)

pytestmark = pytest.mark.slow

OPT1 = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
GIB4 = 4 << 30


# ---- OUT ------------------------------------------------------------------------------------------------


def test_out_whose_parent_is_a_file(case):
    c = case()
    (c.tmp / "afile").write_text("x")
    ran = run_cli("ckpt", "export", c.root, c.tmp / "afile" / "out")
    assert_promise(ran, code=2, tmp=c.tmp)
    assert "is not a folder" in ran.stderr


def test_out_under_proc(case):
    c = case()
    ran = run_cli("ckpt", "export", c.root, "/proc/self/zeropilot-out", "--no-progress")
    assert_promise(ran, code=2, tmp=c.tmp)


def test_out_with_a_name_too_long_for_the_file_system(case):
    c = case()
    c.out = c.tmp / ("o" * 300)
    ran = c.export()
    assert_promise(ran, code=2, tmp=c.tmp)
    assert "bytes long" in ran.stderr


def test_out_with_a_250_character_name_is_written(case):
    """The temporary folder's name no longer grows with OUT's: a 250-character OUT works."""
    c = case()
    c.out = c.tmp / ("o" * 250)
    ran = c.export()
    assert ran.rc == 0, ran.stderr
    assert (c.out / "model.safetensors").is_file()


def test_out_dot_with_force_never_replaces_the_working_directory(case):
    c = case()
    work = c.tmp / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    ran = run_cli("ckpt", "export", c.root, ".", "--force", "--no-progress", cwd=work)
    assert_promise(ran, code=2, tmp=c.tmp)
    assert (work / "keep.txt").read_text() == "mine"


def test_a_dangling_symlink_at_out_is_not_replaced_without_force(case):
    c = case()
    c.out.symlink_to(c.tmp / "nowhere")
    ran = c.export()
    assert ran.rc == 2 and "already exists" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert c.out.is_symlink() and not c.out.exists()
    assert c.export("--force").rc == 0
    assert (c.out / "model.safetensors").is_file() and not c.out.is_symlink()


def test_out_inside_the_checkpoint_is_refused(case):
    c = case()
    c.out = c.root / "exported"
    c.check(c.export(), 2)


KILL_AFTER_FIRST_FILE = (
    "import os, signal, sys\n"
    "import zeropilot.checkpoint.safetensors_writer as w\n"
    "real = w.write_file\n"
    "def write_then_die(*a, **k):\n"
    "    real(*a, **k)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "w.write_file = write_then_die\n"
    "from zeropilot.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def test_a_temp_folder_left_by_kill_9_is_removed_by_the_next_export(case):
    c = case()
    killed = run_cli("ckpt", "export", c.root, c.out, "--no-progress", python_code=KILL_AFTER_FIRST_FILE)
    assert killed.rc == -9
    left = [p for p in c.tmp.iterdir() if p.name.startswith(".zeropilot-tmp-")]
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file() and not c.out.exists()
    ran = c.export()
    assert ran.rc == 0, ran.stderr
    assert not left[0].exists() and f"removed {left[0]}" in ran.stdout
    assert not [p for p in c.tmp.iterdir() if p.name.startswith(".zeropilot-")]


# ---- files of the checkpoint ------------------------------------------------------------------------------


def test_a_side_file_symlinked_to_a_secret_is_refused(case):
    c = case()
    (c.root / "tokenizer.json").symlink_to(c.secret)
    ran = c.export()
    c.check(ran, 2)
    assert "outside the checkpoint folder" in ran.stderr and "--follow-symlinks" in ran.stderr
    trusted = c.export("--follow-symlinks")
    assert trusted.rc == 0 and (c.out / "tokenizer.json").read_bytes().startswith(SECRET)


def test_a_rank_file_symlinked_outside_is_damaged(case):
    c = case()
    outside = c.tmp / "elsewhere.pt"
    shutil.move(c.tag_dir / OPT1, outside)
    (c.tag_dir / OPT1).symlink_to(outside)
    c.check(c.export(), 1)


@pytest.mark.parametrize("target", ["../../elsewhere", "/etc", "global_step2/../../..", ".."])
def test_latest_pointing_outside_the_save_folder_is_not_followed(case, target):
    c = case()
    (c.tmp / "elsewhere").mkdir()
    (c.root / "latest").write_text(target)
    ran = c.export()
    c.check(ran, 1)
    assert "not followed" in ran.stderr


@pytest.mark.parametrize("tag", ["../ckpt", "/etc", "..", "global_step2/../global_step2"])
def test_tag_outside_the_save_folder_is_refused(case, tag):
    c = case()
    c.check(c.export("--tag", tag), 2)


def test_a_tag_folder_symlinked_outside_is_damaged(case):
    c = case()
    shutil.move(c.tag_dir, c.tmp / "moved")
    c.tag_dir.symlink_to(c.tmp / "moved")
    c.check(c.export(), 1)


def test_a_fifo_as_a_rank_file_does_not_hang(case):
    c = case()
    (c.tag_dir / OPT1).unlink()
    os.mkfifo(c.tag_dir / OPT1)
    c.check(c.export(), 1)
    c.check(run_cli("ckpt", "inspect", c.root), 1)


def test_a_fifo_as_latest_does_not_hang(case):
    c = case()
    (c.root / "latest").unlink()
    os.mkfifo(c.root / "latest")
    c.check(c.export(), 1)


def test_a_fifo_as_config_json_does_not_hang_and_is_not_copied(case):
    c = case()
    (c.root / "config.json").unlink()
    os.mkfifo(c.root / "config.json")
    ran = c.export()
    assert ran.rc == 0, ran.stderr
    assert not (c.out / "config.json").exists()


@pytest.mark.parametrize("name,code", [("latest", 1), ("config.json", 2)])
def test_huge_sparse_side_files_are_refused_in_bounded_memory(case, name, code):
    c = case()
    with open(c.root / name, "wb") as f:
        f.truncate(GIB4)
    c.check(c.export(), code)


def test_a_huge_sparse_trainer_state_is_skipped_in_bounded_memory(case):
    c = case()
    with open(c.root / "trainer_state.json", "wb") as f:
        f.truncate(GIB4)
    ran = run_cli("ckpt", "inspect", c.root)
    assert ran.rc == 0 and "Traceback" not in ran.stderr and ran.peak_rss < RSS_LIMIT, ran.stderr


def test_escape_sequences_from_the_checkpoint_are_not_printed_raw(case):
    c = case()
    resave(c.tag_dir / "mp_rank_00_model_states.pt", lambda o: o.__setitem__("ds_version", "\x1b]0;owned\x07\x1b[2J"))
    for f in c.tag_dir.glob("*optim_states.pt"):
        resave(f, lambda o: o.__setitem__("ds_version", "\x1b]0;owned\x07\x1b[2J"))
    ran = run_cli("ckpt", "inspect", c.root)
    assert ran.rc == 0 and "\x1b" not in ran.stdout and "\\x1b]0;owned" in ran.stdout, ran.stdout
    evil_tag = c.root / "global_step2\x1b[31m"
    c.tag_dir.rename(evil_tag)
    (c.root / "latest").write_text(evil_tag.name)
    for ran in (run_cli("ckpt", "inspect", c.root), c.export()):
        c.check(ran, 1)


# ---- verify on a crafted export -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def _export(tmp_path_factory, checkpoints):
    """One real export of the ZeRO-2 checkpoint for the module (an export is a process that imports torch)."""
    base = tmp_path_factory.mktemp("exported")
    c = Case(root=checkpoints(Z2).copy(base / "ckpt"), tmp=base, secret=base / "secret.txt", marker=base / "pwned",
             out=base / "out")
    assert c.export().rc == 0
    return c.out


@pytest.fixture
def exported(case, _export):
    """A private copy of the checkpoint and of its export, for a test to damage."""
    c = case()
    shutil.copytree(_export, c.out)
    return c


def _verify(c) -> "object":
    return run_cli("ckpt", "verify", c.out, "--against", c.root)


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, (2**63).to_bytes(8, "little") + b"{}",
                                     (20).to_bytes(8, "little") + b'{"a": {"dtype": 1}}  ',
                                     (2).to_bytes(8, "little") + b"[]"])
def test_verify_on_a_garbage_model_safetensors(exported, content):
    (exported.out / "model.safetensors").write_bytes(content)
    assert_promise(_verify(exported), code=2, tmp=exported.tmp)


@pytest.mark.parametrize("index", ["{not json", "[]", '{"weight_map": []}', '{"weight_map": {"a": 5}}',
                                   '{"weight_map": {"a": "../secret.safetensors"}}',
                                   '{"weight_map": {"a": "/etc/passwd.safetensors"}}', '{"weight_map": {}}'])
def test_verify_on_a_bad_shard_index(exported, index):
    (exported.tmp / "secret.safetensors").write_bytes(SECRET)
    (exported.out / "model.safetensors.index.json").write_text(index)
    assert_promise(_verify(exported), code=2)
    assert_no_secret_written(exported.tmp, skip=[exported.tmp / "secret.safetensors"])


def test_verify_without_torch_says_so_in_one_line(exported):
    code = ("import sys\nsys.modules['torch'] = None\nfrom zeropilot.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    ran = run_cli("ckpt", "verify", exported.out, "--against", exported.root, python_code=code)
    assert_promise(ran, code=2)
    assert "torch is not installed" in ran.stderr and "zeropilot[ckpt]" in ran.stderr


def test_the_secret_never_reaches_an_export(exported):
    """The control case of this family: a normal export, then every output searched for the secret."""
    assert_no_secret_written(exported.tmp)
    assert json.loads(run_cli("ckpt", "inspect", exported.root, "--format", "json").stdout)["verdict"] == "ok"
    assert Path(exported.out / "model.safetensors").stat().st_size > 0


def test_the_harness_measures_the_childs_own_peak_memory():
    """The witness for the RSS bound: a child that touches 600 MB is seen as such, whatever pytest holds."""
    code = "import sys\nb = bytearray(600 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
    ran = run_cli(python_code=code)
    assert ran.rc == 0 and ran.peak_rss >= 600 << 20
    assert run_cli("--version").peak_rss < 100 << 20
