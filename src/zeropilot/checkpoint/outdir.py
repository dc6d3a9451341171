"""OUT, the folder ``ckpt export`` and ``ckpt universal`` write: checked first, written atomically.

Everything is written into a temporary sibling of OUT (``.zeropilot-tmp-<pid>-<hash of OUT's name>``, with a
marker file naming OUT) and renamed into place only when complete: a killed command leaves OUT as it was.
Temporary folders left by a killed command (its pid no longer runs) are removed by the next command writing
the same OUT, and named in its notes. OUT is never ``.``/``..``, never a folder holding the working
directory, never inside the checkpoint or containing it, and never replaced without ``force``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

from zeropilot import safefile
from zeropilot.checkpoint import fsguard
from zeropilot.checkpoint.layout import CheckpointLayout
from zeropilot.errors import InputError

MARKER = ".zeropilot-export-in-progress"  # the name export has always used: leftovers of older runs are known
_LEFTOVER_RE = re.compile(r"^\.zeropilot-(tmp|old)-(\d+)-([0-9a-f]{8})$")


def out_hash(out: Path) -> str:
    return hashlib.sha1(out.name.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def check_out(out: Path, layout: CheckpointLayout, force: bool, command: str = "export") -> None:
    """Refuse an OUT that cannot be written safely (see the module docstring).

    Raises:
        InputError: naming what is wrong with OUT.
    """
    if out.name in ("", ".", "..") or str(out).endswith(("/.", "/..")):
        raise InputError("OUT must name a new folder (not '.' or '..')", out)
    target = out.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise InputError(f"OUT holds the current directory: {command} never replaces it", out)
    parent = out.parent
    if fsguard.kind_of(parent) != "dir":
        what = "does not exist" if fsguard.kind_of(parent) is None else "is not a folder"
        raise InputError(f"its parent folder {parent} {what}", out)
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(out.name)) > name_max:
        raise InputError(f"the name is {len(os.fsencode(out.name))} bytes long; this file system allows "
                         f"{name_max}", out)
    folders = {layout.path.resolve(), layout.tag_dir.resolve()}
    if layout.save_dir:
        folders.add(layout.save_dir.resolve())
    for inside in folders:
        if target == inside or inside in target.parents:
            raise InputError(f"OUT is inside the checkpoint folder {inside}: {command} never writes there", out)
        if target in inside.parents:
            raise InputError(f"OUT contains the checkpoint {inside}: --force would delete it", out)
    if fsguard.kind_of(out) not in (None, "symlink-dangling", "dir", "file"):
        safefile.check_output(out, "dir")  # a FIFO, device or socket at OUT: never replaced, even with --force
    if os.path.lexists(out) and not force:
        what = "a symlink (dangling)" if not out.exists() else ("a symlink" if out.is_symlink() else "it")
        raise InputError(f"already exists ({what}): pass --force to replace it", out)


def remove_leftovers(out: Path, command: str = "export") -> List[str]:
    """Remove temporary folders of earlier commands writing `out` whose process is gone; notes naming them."""
    notes: List[str] = []
    try:
        siblings = list(os.scandir(out.parent))
    except OSError:
        return notes
    for entry in siblings:
        m = _LEFTOVER_RE.match(entry.name)
        if not m or m.group(3) != out_hash(out) or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group(2))
        if pid == os.getpid() or _alive(pid):
            notes.append(f"{entry.path}: left by {command} process {pid}, which still runs: not touched")
            continue
        if m.group(1) == "tmp" and not os.path.isfile(os.path.join(entry.path, MARKER)):
            continue  # not written by us: leave it
        shutil.rmtree(entry.path, ignore_errors=True)
        notes.append(f"removed {entry.path}, left by a zeropilot write into it (pid {pid}) that was killed")
    return notes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


@contextmanager
def staging(out: Path, command: str = "export") -> Iterator[Path]:
    """A new temporary sibling of `out` to write into; renamed to `out` when the block ends without error.

    Raises:
        InputError: the temporary folder or OUT cannot be written (disk full, permissions).
    """
    tmp = out.parent / f".zeropilot-tmp-{os.getpid()}-{out_hash(out)}"
    try:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp)
        tmp.mkdir()
        (tmp / MARKER).write_text(json.dumps({"out": out.name, "pid": os.getpid()}) + "\n")
        yield tmp
        (tmp / MARKER).unlink()
        replace_dir(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(f"cannot write the {command} here: {exc.strerror or exc}", out) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`, moving an existing `out` aside first and removing it after."""
    if os.path.lexists(out):
        old = out.parent / f".zeropilot-old-{os.getpid()}-{out_hash(out)}"
        os.replace(out, old)
        os.replace(tmp, out)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
    else:
        os.replace(tmp, out)
