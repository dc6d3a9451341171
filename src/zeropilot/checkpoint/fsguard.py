"""Open files of a checkpoint as hostile input: regular files only, inside the checkpoint, bounded.

A checkpoint folder comes from strangers. Whatever it names, zeropilot opens only

* regular files (never a FIFO, which would block the reader, a device or a directory): the file is
  opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open descriptor, so a file swapped
  for a FIFO between a check and the open cannot make it hang;
* files whose real path stays inside the checkpoint's root folder, unless the user passed
  ``--follow-symlinks`` (a Hugging Face Hub cache snapshot, whose files link into ``blobs/``);
* at most a stated number of bytes where a file is read into memory (``latest``, JSON side files):
  the limit is checked against the size before reading, and the read stops at the limit anyway.

Opening regular files without waiting is :mod:`zeropilot.safefile`'s (every reader of zeropilot uses it);
this module adds the confinement to the checkpoint's folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.safefile import UnsafePathError, kind_of  # noqa: F401 - the names checkpoint/ uses

LATEST_LIMIT = 4096  # DeepSpeed writes the tag name and nothing else
JSON_LIMIT = 64 << 20  # trainer_state.json of a long run holds its whole log history
SIDE_FILE_LIMIT = 2 << 30  # tokenizer and config files copied into an export


@dataclass(frozen=True)
class Confinement:
    """The folder a checkpoint's files must stay inside, and whether symlinks may leave it."""

    root: Path  # resolved
    follow_symlinks: bool = False

    @classmethod
    def of(cls, root: Union[str, Path], follow_symlinks: bool = False) -> "Confinement":
        return cls(Path(os.path.realpath(root)), follow_symlinks)

    def contains(self, path: Union[str, Path]) -> bool:
        real = Path(os.path.realpath(path))
        return real == self.root or self.root in real.parents

    def check(self, path: Union[str, Path]) -> Path:
        """`path` if its real path stays inside the root (or symlinks may leave it), else UnsafePathError."""
        path = Path(path)
        if not self.follow_symlinks and not self.contains(path):
            raise UnsafePathError(
                f"a symlink to {os.path.realpath(path)}, outside the checkpoint folder {self.root}: refused "
                "(pass --follow-symlinks if you trust where it points)", path)
        return path


def open_regular(path: Union[str, Path], confinement: Optional[Confinement] = None) -> int:
    """A read-only descriptor of `path`, which must be a regular file (inside `confinement`).

    Raises:
        UnsafePathError: a FIFO, device, socket or directory, or a symlink leaving the confinement.
        InputError: the file cannot be opened.
    """
    if confinement is not None:
        confinement.check(path)
    return safefile.open_regular(path)


def read_bounded(path: Union[str, Path], limit: int, confinement: Optional[Confinement] = None) -> bytes:
    """The bytes of the regular file `path`; InputError if it holds more than `limit` bytes."""
    if confinement is not None:
        confinement.check(path)
    return safefile.read_bytes(path, limit)


def read_json(path: Union[str, Path], confinement: Optional[Confinement] = None, limit: int = JSON_LIMIT) -> dict:
    """A JSON object from `path`, bounded in size and nesting.

    Raises:
        InputError: unreadable, too large, too deeply nested, not JSON or not an object.
    """
    raw = read_bounded(path, limit, confinement)
    try:  # json's C scanner raises RecursionError on deep nesting (no crash); memory is bounded by `limit`
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"not valid JSON ({str(exc).splitlines()[0][:120]})", path) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, found {type(data).__name__}", path)
    return data


def copy_regular(src: Union[str, Path], dest: Union[str, Path], confinement: Optional[Confinement] = None,
                 limit: int = SIDE_FILE_LIMIT) -> None:
    """Copy the regular file `src` (inside `confinement`, at most `limit` bytes) to the new file `dest`."""
    fd = open_regular(src, confinement)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputError(f"{size} bytes: larger than {limit} bytes, refused as a side file", src)
        with open(dest, "xb") as out:
            done = 0
            while done < size:
                chunk = os.read(fd, min(16 << 20, size - done))
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
    finally:
        os.close(fd)
