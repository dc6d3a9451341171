"""Opening input files as hostile input: regular files only, never a wait, bounded in size.

Every file zeropilot reads because a user named it (a launch, a config, a model's ``config.json``, a hardware
profile, a run directory, a checkpoint) is opened here, and every path it writes that a user named is checked
here first. The promise: a FIFO, a device, a socket or a directory where a file is expected is one
:class:`UnsafePathError` (one line, exit status 2 in the CLI), never a wait and never an endless read.

* ``stat`` first, without opening: opening a device can have effects (a tape rewinds, a watchdog starts), so
  anything that is not a regular file is refused before ``open``;
* then ``open`` with ``O_NONBLOCK`` and ``O_NOCTTY`` and ``fstat`` on the open descriptor: a file swapped
  for a FIFO between the ``stat`` and the ``open`` cannot make the open wait, and what is read is what was
  checked (``O_NOFOLLOW`` too where symlinks are refused, as in a run directory);
* the size is compared with the caller's limit before reading, and the read stops at the limit anyway (a
  file that grows while it is read; ``/proc`` files that say 0 bytes).

Hand-written because ``open``/``pathlib`` block on FIFOs and follow links by design.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Optional, Union

from zeropilot.errors import InputError

PathLike = Union[str, Path]
_CHUNK = 1 << 20
_WHAT = {"dir": "a directory", "fifo": "a FIFO", "socket": "a socket", "device": "a device",
         "symlink": "a symbolic link"}


class UnsafePathError(InputError):
    """A path zeropilot refuses to open or replace: a FIFO, device, socket or directory where a file is expected,
    a symlink where links are refused, or (``checkpoint.fsguard``) a symlink leading out of a checkpoint."""


def kind_of(path: PathLike, follow_symlinks: bool = True) -> Optional[str]:
    """'file', 'dir', 'fifo', 'socket', 'device', 'symlink' (not followed) or 'symlink-dangling'; None when absent."""
    try:
        mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    except FileNotFoundError:
        return "symlink-dangling" if os.path.islink(path) else None
    except OSError:
        return None
    return _kind(mode)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def not_regular(kind: str) -> str:
    """The reason given for refusing a path of this kind: 'a FIFO, not a regular file: refused'."""
    return f"{_WHAT.get(kind, 'a ' + kind)}, not a regular file: refused"


def open_regular(path: PathLike, follow_symlinks: bool = True) -> int:
    """A read-only descriptor of `path`, which must be a regular file; the caller closes it.

    Args:
        path: the file.
        follow_symlinks: False refuses a symlink at `path` itself (``O_NOFOLLOW``).

    Raises:
        UnsafePathError: a FIFO, device, socket or directory (or a symlink, when not followed).
        InputError: absent, a symlink loop, or the open failed.
    """
    try:
        mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    except FileNotFoundError:
        raise InputError("no such file" + (" (a dangling symlink)" if os.path.islink(path) else ""), path) from None
    except OSError as exc:
        raise InputError(_os_reason(exc), path) from None
    if not stat.S_ISREG(mode):
        raise UnsafePathError(not_regular(_kind(mode)), path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO without a writer, swapped in after the stat
            raise UnsafePathError(not_regular("socket or FIFO"), path) from None
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafePathError(not_regular("symlink"), path) from None
        raise InputError(_os_reason(exc), path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePathError(not_regular(_kind(mode)), path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno == errno.ENOENT:
        return "no such file"
    return f"cannot read: {exc.strerror or exc}"


def read_bytes(path: PathLike, limit: int, follow_symlinks: bool = True, too_large: Optional[str] = None) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    Args:
        limit: the most bytes such a file ever needs; a larger file is refused before it is read.
        too_large: the reason given for a larger file (default: its size and the limit).

    Raises:
        UnsafePathError, InputError: as :func:`open_regular`; larger than `limit`.
    """
    fd = open_regular(path, follow_symlinks)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputError(too_large or f"{size} bytes: larger than the {limit} bytes such a file ever needs; "
                             "refused", path)
        chunks, got = [], 0
        while got <= limit:
            try:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - got))
            except OSError as exc:
                raise InputError(_os_reason(exc), path) from None
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise InputError(too_large or f"grew past {limit} bytes while being read; refused", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: PathLike, limit: int, too_large: Optional[str] = None) -> str:
    """The UTF-8 text of `path` (a BOM dropped), at most `limit` bytes.

    Raises:
        InputError: as :func:`read_bytes`; binary (a NUL byte near the start) or not UTF-8, with its line and column.
    """
    data = read_bytes(path, limit, too_large=too_large)
    if b"\x00" in data[:8192]:
        raise InputError("a binary file, not text", path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", path, line, col) from None


def read_json(path: PathLike, limit: int, what: str = "JSON") -> Any:
    """The JSON value in `path` (bounded in size; deep nesting is an error, not a crash).

    Raises:
        InputError: as :func:`read_bytes`; not JSON (with its line and column).
    """
    raw = read_bytes(path, limit)
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid {what}: {exc.msg}", path, exc.lineno, exc.colno) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"not valid {what} ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})",
                         path) from None


def check_output(path: PathLike, want: str = "file") -> None:
    """Refuse to write to `path` when it exists as something a write must never replace or block on.

    A FIFO would block the write, and an atomic write renames over what is there: over ``/dev/null`` run as
    root it would replace the device. So an existing FIFO, device or socket is refused; so is a directory
    where a file is wanted (``want="file"``) and a file where a folder is wanted (``want="dir"``).

    Raises:
        UnsafePathError: what is at `path` must not be written.
    """
    kind = kind_of(path)
    if kind in (None, "symlink-dangling", want):
        return
    if kind in ("file", "dir"):
        raise UnsafePathError(f"{_WHAT.get(kind, 'a file')} is there, where a {'folder' if want == 'dir' else 'file'} "
                              "is to be written: refused", path)
    raise UnsafePathError(f"{_WHAT[kind]}: refused as an output (never written to or replaced)", path)
