"""Write safetensors files tensor by tensor, without holding them all in memory.

The safetensors format is an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw bytes. All shapes are known before any value is
read, so the header is written first and values are streamed after it in header order.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from zeropilot.checkpoint.safe_load import DamagedFileError
from zeropilot.errors import InputError

# torch dtype name -> (safetensors dtype, bytes per element)
DTYPES: Dict[str, Tuple[str, int]] = {
    "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2), "float64": ("F64", 8),
    "int64": ("I64", 8), "int32": ("I32", 4), "int16": ("I16", 2), "int8": ("I8", 1), "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}


@dataclass(frozen=True)
class FileSpan:
    """Bytes to copy from another file: in the kernel where it can, else through a bounded buffer."""

    path: str
    offset: int
    nbytes: int


_COPY_BLOCK = 64 << 20


def copy_span(out, span: FileSpan) -> None:
    """Append `span` to the unbuffered file `out`: ``copy_file_range`` (same file system), else ``sendfile``,
    else read/write."""
    done = 0
    with open(span.path, "rb", buffering=0) as src:
        for name in ("copy_file_range", "sendfile"):
            copy = getattr(os, name, None)
            if copy is None or done == span.nbytes:
                continue
            try:
                while done < span.nbytes:
                    if name == "sendfile":
                        n = copy(out.fileno(), src.fileno(), span.offset + done, span.nbytes - done)
                    else:
                        n = copy(src.fileno(), out.fileno(), span.nbytes - done, span.offset + done)
                    if n <= 0:
                        break
                    done += n
            except OSError:
                pass
        while done < span.nbytes:
            chunk = os.pread(src.fileno(), min(_COPY_BLOCK, span.nbytes - done), span.offset + done)
            if not chunk:
                raise DamagedFileError("ends inside a tensor: truncated", span.path)
            write_all(out, memoryview(chunk))
            done += len(chunk)


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to write: name in the file, shape, output dtype and a function yielding its bytes."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    produce: Callable[[], Iterator[memoryview]]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


def parse_size(text: str) -> int:
    """``"5GB"`` -> 5_000_000_000 (also KB, MB, GiB, MiB, KiB, plain bytes), as transformers reads it."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text or "", re.IGNORECASE)
    if not m:
        raise InputError(f"--max-shard-size {text!r}: expected a size such as 5GB, 500MB or 2GiB")
    unit = (m.group(2) or "B").upper()
    mult = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
            "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(m.group(1)) * mult)


def plan_shards(tensors: List[PlannedTensor], max_bytes: int) -> List[List[PlannedTensor]]:
    """Split `tensors`, in order, into shards of at most `max_bytes` (a larger tensor gets its own)."""
    shards: List[List[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def shard_names(count: int) -> List[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def header(tensors: Iterable[PlannedTensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    head: Dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in tensors:
        head[t.name] = {"dtype": DTYPES[t.dtype][0], "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(head, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_file(path, tensors: List[PlannedTensor], on_tensor: Optional[Callable[[PlannedTensor], None]] = None,
               metadata: Optional[Dict[str, str]] = None) -> int:
    """Write `tensors` to `path` as one safetensors file; returns the bytes of tensor data written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        write_all(f, memoryview(header(tensors, metadata)))
        for t in tensors:
            start = written
            for chunk in t.produce():
                if isinstance(chunk, FileSpan):
                    copy_span(f, chunk)
                else:
                    write_all(f, chunk)
                written += chunk.nbytes
            if written - start != t.nbytes:
                raise RuntimeError(f"{t.name}: wrote {written - start} bytes, expected {t.nbytes}")
            if on_tensor:
                on_tensor(t)
    return written


def write_all(f, chunk) -> None:
    """Unbuffered writes may be short: loop until the whole chunk is written."""
    view = memoryview(chunk).cast("B")
    while len(view):
        n = f.write(view)
        view = view[n:]


HEADER_LIMIT = 100 << 20  # safetensors' own limit on the JSON header


def read_header(path) -> Tuple[Dict[str, dict], int]:
    """The JSON header of the safetensors file `path` (without ``__metadata__``) and where data starts.

    Checks what safetensors' loader checks: header length within the file and under 100 MB, a JSON
    object, every tensor's dtype known, shape a list of non-negative ints, data offsets contiguous
    from 0, matching ``shape x itemsize`` and ending at the end of the file.

    Raises:
        InputError: not a safetensors file, or one that breaks those rules.
    """
    from zeropilot.checkpoint import fsguard

    fd = fsguard.open_regular(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) != 8:
            raise InputError("not a safetensors file (shorter than 8 bytes)", path)
        (length,) = struct.unpack("<Q", head)
        if length > min(HEADER_LIMIT, size - 8):
            raise InputError(f"not a safetensors file (header length {length} for a {size}-byte file)", path)
        raw = os.pread(fd, length, 8)
    finally:
        os.close(fd)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError("not a safetensors file (its header is not JSON)", path) from None
    if not isinstance(header, dict):
        raise InputError("not a safetensors file (its header is not a JSON object)", path)
    header.pop("__metadata__", None)
    _check_offsets(header, size - 8 - length, path)
    return header, 8 + length


_ITEMSIZE_BY_CODE = {code: size for code, size in DTYPES.values()}


def _check_offsets(header: Dict[str, object], data_bytes: int, path) -> None:
    spans = []
    for name, info in header.items():
        ok = isinstance(info, dict) and info.get("dtype") in _ITEMSIZE_BY_CODE and isinstance(info.get("shape"), list)
        ok = ok and all(type(d) is int and d >= 0 for d in info["shape"])
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
        if not ok:
            raise InputError(f"tensor {name[:80]!r}: dtype, shape or data_offsets malformed", path)
        if offsets[1] - offsets[0] != math.prod(info["shape"]) * _ITEMSIZE_BY_CODE[info["dtype"]]:
            raise InputError(f"tensor {name[:80]!r}: data_offsets do not match its shape", path)
        spans.append((offsets[0], offsets[1]))
    end = 0
    for lo, hi in sorted(spans):
        if lo != end:
            raise InputError("tensor data overlaps or leaves a hole", path)
        end = hi
    if end != data_bytes:
        raise InputError(f"tensor data ends at byte {end}, the file holds {data_bytes}", path)


def check_written(path, tensors: List[PlannedTensor]) -> None:
    """Read back the file `write_file` wrote: its header must list exactly `tensors`, in their dtypes,
    shapes and sizes, and the file must end where the data does (``safe_open`` agrees when installed).

    Raises:
        RuntimeError: the file on disk is not what was planned (a bug or a failing disk, not input).
    """
    try:
        header, _start = read_header(path)
    except InputError as exc:
        raise RuntimeError(f"read-back of {path} failed: {exc}") from None
    want = {t.name: (DTYPES[t.dtype][0], list(t.shape)) for t in tensors}
    got = {n: (i["dtype"], i["shape"]) for n, i in header.items()}
    if got != want:
        raise RuntimeError(f"read-back of {path}: the header does not list the planned tensors")
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - safetensors comes with the ckpt extra
        return
    with safe_open(str(path), framework="numpy") as handle:
        if set(handle.keys()) != set(want):
            raise RuntimeError(f"read-back of {path}: safe_open lists other tensors")
