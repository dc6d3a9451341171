"""Run files written atomically get the permissions ``open`` would give them (0o666 less the umask), not mkstemp's
0o600: a teammate who can read the appended ``rank-N.jsonl`` can read ``run.json`` and ``heal.json`` beside it."""

from __future__ import annotations

import os
import stat

import pytest

from zeropilot.runlog.layout import write_json_atomic, write_text_atomic


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_files_follow_the_umask_as_open_does(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "run.json", {"a": 1})
        with open(tmp_path / "rank-0.jsonl", "a", encoding="utf-8") as fh:  # how the ranks append
            fh.write("{}\n")
    finally:
        os.umask(old)
    atomic = stat.S_IMODE((tmp_path / "run.json").stat().st_mode)
    appended = stat.S_IMODE((tmp_path / "rank-0.jsonl").stat().st_mode)
    assert atomic == appended == 0o666 & ~umask


def test_an_explicit_mode_wins(tmp_path):
    write_text_atomic(tmp_path / "report.txt", "x", mode=0o640)
    assert stat.S_IMODE((tmp_path / "report.txt").stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["report.txt"]  # no temporary file left
