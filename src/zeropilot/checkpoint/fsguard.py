"""Open files of a checkpoint as hostile input: regular files only, inside the checkpoint, bounded.

A checkpoint folder comes from strangers. Whatever it names, zeropilot opens only

* regular files (never a FIFO, which would block the reader, a device or a directory): the file is
  opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open descriptor, so a file swapped
  for a FIFO between a check and the open cannot make it hang;
* files whose real path stays inside the checkpoint's root folder, unless the user passed
  ``--follow-symlinks`` (a Hugging Face Hub cache snapshot, whose files link into ``blobs/``);
* at most a stated number of bytes where a file is read into memory (``latest``, JSON side files):
  the limit is checked against the size before reading, and the read stops at the limit anyway.

Hand-written because ``pathlib``/``open`` follow symlinks and block on FIFOs by design.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from zeropilot.errors import InputError

LATEST_LIMIT = 4096  # DeepSpeed writes the tag name and nothing else
JSON_LIMIT = 64 << 20  # trainer_state.json of a long run holds its whole log history
SIDE_FILE_LIMIT = 2 << 30  # tokenizer and config files copied into an export


class UnsafePathError(InputError):
    """A path of a checkpoint that zeropilot refuses to open (a symlink out, a FIFO, a device)."""


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


def kind_of(path: Union[str, Path]) -> Optional[str]:
    """'file', 'dir', 'symlink-dangling', 'fifo', 'device', 'socket' or None when absent (follows links)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "symlink-dangling" if os.path.islink(path) else None
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def open_regular(path: Union[str, Path], confinement: Optional[Confinement] = None) -> int:
    """A read-only descriptor of `path`, which must be a regular file (inside `confinement`).

    Raises:
        UnsafePathError: a FIFO, device, socket or directory, or a symlink leaving the confinement.
        InputError: the file cannot be opened.
    """
    if confinement is not None:
        confinement.check(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened without a writer on some systems
            raise UnsafePathError("not a regular file: refused", path) from None
        raise InputError(f"cannot open: {exc.strerror or exc}", path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else ("a FIFO" if stat.S_ISFIFO(mode) else "a device")
            raise UnsafePathError(f"{what}, not a regular file: refused", path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Union[str, Path], limit: int, confinement: Optional[Confinement] = None) -> bytes:
    """The bytes of the regular file `path`; InputError if it holds more than `limit` bytes."""
    fd = open_regular(path, confinement)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputError(f"{size} bytes: larger than the {limit} bytes such a file ever needs; refused", path)
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise InputError(f"grew past {limit} bytes while being read; refused", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


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
