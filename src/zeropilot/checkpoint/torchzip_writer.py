"""Write ``torch.save`` archives without torch, tensor values streamed from other files.

DeepSpeed's loader reads every file of a universal checkpoint with ``torch.load``, so they must be
``torch.save`` archives. Hand-written instead of calling ``torch.save`` because that needs every tensor
whole in memory (a 7B model's embedding and its two Adam moments are 2.2 GB each, and DeepSpeed's own
converter holds whole optimizer partitions) and torch imported; here a tensor's values are copied from
the byte ranges of the rank files that hold them (``copy_file_range`` in the kernel where it can), so
resident memory stays about one block whatever the model size. The format is small and fixed (the
reader side is :mod:`zeropilot.checkpoint.torchzip`, which reads every file written here back):

* a zip archive of stored (uncompressed) records under one folder named after the file's stem:
  ``data.pkl``, ``.format_version`` (``1``), ``.storage_alignment`` (``64``), ``byteorder``
  (``little``), ``data/<key>`` (one per tensor storage) and ``version`` (``3``), as torch 2.x writes
  them; every record's data starts at a multiple of 64 bytes (torch pads the local header with an
  extra field, id ``FB``, so storages can be memory-mapped), its CRC-32 is computed from the bytes
  written, and zip64 fields are used where a size or an offset needs them;
* ``data.pkl`` is pickle protocol 2: tensors as ``torch._utils._rebuild_tensor_v2(storage, 0, size,
  stride, False, OrderedDict())`` with the storage a persistent id ``("storage", torch.<T>Storage,
  key, "cpu", numel)``; DeepSpeed's objects (``LossScaler``, ``ZeroStageEnum``) as DeepSpeed pickles
  them, from the inert stand-ins :mod:`safe_load` reads them into. Nothing is imported to write them.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from zeropilot.checkpoint import torchzip
from zeropilot.checkpoint.safe_load import DEEPSPEED_GLOBALS, DeepSpeedObject, ZeroStageEnum
from zeropilot.checkpoint.safetensors_writer import FileSpan, copy_span, write_all

ALIGNMENT = 64  # torch's storage alignment in its archives
ZIP64_LIMIT = 0xFFFFFFFF  # sizes and offsets from this one on need zip64 fields (a module value: tests lower it)
_STORAGE_OF = {dtype: name for name, (dtype, _size) in torchzip.STORAGES.items()}
_CLASS_GLOBALS = {cls: name for name, (cls, _why) in DEEPSPEED_GLOBALS.items()}
_COPY_BLOCK = 64 << 20
_DOS_DATE = (1 << 5) | 1  # 1980-01-01, 00:00: the same bytes for the same content


class Unwritable(ValueError):
    """An object this writer cannot put in a ``torch.save`` archive (a type DeepSpeed never saves)."""


Chunk = Union[memoryview, bytes, FileSpan]


@dataclass(frozen=True)
class TensorOut:
    """A tensor to write: dtype (torch's name), shape and a function yielding its bytes in order.

    ``produce`` yields ``FileSpan`` (bytes copied from another file) or bytes-like chunks; together
    exactly ``nbytes``.
    """

    dtype: str
    shape: Tuple[int, ...]
    produce: Callable[[], Iterator[Chunk]]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torchzip.ITEMSIZE[self.dtype]


class _Global:
    """A module-level name written as a pickle GLOBAL opcode (``torch._utils._rebuild_tensor_v2``)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle's save_reduce wants a callable; this one is only ever written
        raise TypeError(f"{self.module}.{self.name} is a name to write, not to call")

    @classmethod
    def of(cls, dotted: str) -> "_Global":
        module, _, name = dotted.rpartition(".")
        return cls(module, name)


_REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")
_NEWOBJ_NAME = "__newobj__"


def _newobj(cls, *args):  # named like copyreg.__newobj__, which pickle's save_reduce writes as NEWOBJ
    raise AssertionError("never called: only its name is used")


_newobj.__name__ = _NEWOBJ_NAME


class _StorageRef:
    __slots__ = ("key", "tensor")

    def __init__(self, key: str, tensor: TensorOut) -> None:
        self.key, self.tensor = key, tensor


class _Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can take our types
    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file, storages: List[_StorageRef]) -> None:
        super().__init__(file, protocol=2)
        self.storages = storages
        self.keys: Dict[int, _StorageRef] = {}

    def persistent_id(self, obj: Any) -> Optional[tuple]:
        if isinstance(obj, _StorageRef):
            t = obj.tensor
            return ("storage", _Global("torch", _STORAGE_OF[t.dtype]), obj.key, "cpu", t.numel)
        return None

    def save_global_ref(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        self.memoize(obj)

    dispatch[_Global] = save_global_ref

    def save_tensor(self, obj: TensorOut) -> None:
        ref = self.keys.get(id(obj))
        if ref is None:
            ref = self.keys[id(obj)] = _StorageRef(str(len(self.storages)), obj)
            self.storages.append(ref)
        stride = _contiguous_stride(obj.shape)
        self.save_reduce(_REBUILD, (ref, 0, tuple(obj.shape), stride, False, OrderedDict()), obj=obj)

    dispatch[TensorOut] = save_tensor

    def save_deepspeed(self, obj: DeepSpeedObject) -> None:
        cls = _Global.of(_CLASS_GLOBALS[type(obj)])
        if isinstance(obj, ZeroStageEnum):  # an IntEnum: pickled as a call with its value
            self.save_reduce(cls, (int(obj.value),), obj=obj)
            return
        state = {k: v for k, v in vars(obj).items() if k != "args"}
        self.save_reduce(_newobj, (cls,), state, obj=None)

    for _cls in _CLASS_GLOBALS:
        dispatch[_cls] = save_deepspeed


def _contiguous_stride(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


_PLAIN = (str, bytes, int, float, bool, type(None))


def _check(obj: Any, depth: int = 0) -> None:
    """Refuse what this writer does not write (anything beyond DeepSpeed's plain data), iteratively bounded."""
    if depth > torchzip.MAX_DEPTH:
        raise Unwritable("nested too deeply")
    if isinstance(obj, _PLAIN) or isinstance(obj, TensorOut):
        return
    if type(obj) in _CLASS_GLOBALS:
        _check({k: v for k, v in vars(obj).items() if k != "args"}, depth + 1)
        return
    if isinstance(obj, dict):  # OrderedDict included (pickled by reference to collections.OrderedDict)
        for k, v in obj.items():
            _check(k, depth + 1)
            _check(v, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _check(v, depth + 1)
        return
    raise Unwritable(f"a {type(obj).__name__} object")


def pickle_bytes(obj: Any) -> Tuple[bytes, List[_StorageRef]]:
    """``data.pkl`` for `obj` and the storages it names, in key order.

    Raises:
        Unwritable: `obj` holds something DeepSpeed never saves.
    """
    _check(obj)
    buf = io.BytesIO()
    storages: List[_StorageRef] = []
    _Pickler(buf, storages).dump(obj)
    return buf.getvalue(), storages


# ---- the zip layer ---------------------------------------------------------------------------------

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header, 46 bytes
_END = struct.Struct("<IHHHHIIH")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")


@dataclass
class _Entry:
    name: bytes
    offset: int  # of the local header
    size: int
    crc: int = 0


class _ZipWriter:
    """Stored records, each aligned to 64 bytes, written in order to a file opened unbuffered."""

    def __init__(self, f) -> None:
        self.f = f
        self.entries: List[_Entry] = []

    def _header(self, name: bytes, size: int) -> Tuple[_Entry, int]:
        offset = self.f.tell()
        zip64 = size >= ZIP64_LIMIT
        extra = struct.pack("<HHQQ", 1, 16, size, size) if zip64 else b""
        pad = -(offset + _LOCAL.size + len(name) + len(extra) + 4) % ALIGNMENT
        extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's "FB" padding field
        small = 0xFFFFFFFF if zip64 else size
        head = _LOCAL.pack(0x04034B50, 45 if zip64 else 20, 0x0800, 0, 0, _DOS_DATE, 0, small, small,
                           len(name), len(extra))
        write_all(self.f, head + name + extra)
        entry = _Entry(name, offset, size)
        self.entries.append(entry)
        return entry, self.f.tell()

    def add_bytes(self, name: str, data: bytes) -> None:
        entry, _start = self._header(name.encode("utf-8"), len(data))
        write_all(self.f, data)
        entry.crc = zlib.crc32(data)
        self._patch_crc(entry)

    def add_tensor(self, name: str, tensor: TensorOut) -> None:
        entry, start = self._header(name.encode("utf-8"), tensor.nbytes)
        written = 0
        for chunk in tensor.produce():
            if isinstance(chunk, FileSpan):
                copy_span(self.f, chunk)
                written += chunk.nbytes
            else:
                write_all(self.f, chunk)
                written += memoryview(chunk).nbytes
        if written != tensor.nbytes:
            raise RuntimeError(f"{name}: wrote {written} bytes, expected {tensor.nbytes}")
        entry.crc = torchzip.file_crc32(self.f.fileno(), start, tensor.nbytes)  # parallel, from the page cache
        self._patch_crc(entry)

    def _patch_crc(self, entry: _Entry) -> None:
        os.pwrite(self.f.fileno(), struct.pack("<I", entry.crc), entry.offset + 14)

    def close(self) -> None:
        start = self.f.tell()
        for e in self.entries:
            fields = [v for v in (e.size, e.size, e.offset) if v >= ZIP64_LIMIT]
            big_size = e.size >= ZIP64_LIMIT
            extra = b""
            if fields:
                values = ([e.size, e.size] if big_size else []) + ([e.offset] if e.offset >= ZIP64_LIMIT else [])
                extra = struct.pack("<HH", 1, 8 * len(values)) + b"".join(struct.pack("<Q", v) for v in values)
            small = 0xFFFFFFFF if big_size else e.size
            head = _CENTRAL.pack(0x02014B50, 45 if fields else 20, 45 if fields else 20, 0x0800, 0, 0, _DOS_DATE,
                                 e.crc, small, small, len(e.name), len(extra), 0, 0, 0, 0,
                                 min(e.offset, 0xFFFFFFFF))
            write_all(self.f, head + e.name + extra)
        end = self.f.tell()
        count, size = len(self.entries), end - start
        if count >= 0xFFFF or size >= ZIP64_LIMIT or start >= ZIP64_LIMIT:
            write_all(self.f, _END64.pack(0x06064B50, _END64.size - 12, 45, 45, 0, 0, count, count, size, start))
            write_all(self.f, _LOCATOR64.pack(0x07064B50, 0, end, 1))
            write_all(self.f, _END.pack(0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), 0xFFFFFFFF,
                                         0xFFFFFFFF, 0))
        else:
            write_all(self.f, _END.pack(0x06054B50, 0, 0, count, count, size, start, 0))


def write(path, obj: Any) -> int:
    """Write `obj` to the new file `path` as ``torch.save`` would; returns the bytes of tensor data written.

    Raises:
        Unwritable: `obj` holds something DeepSpeed never saves.
        FileExistsError: `path` exists.
    """
    path = Path(path)
    data, storages = pickle_bytes(obj)
    prefix = path.name.rsplit(".", 1)[0] or "archive"
    with open(path, "x+b", buffering=0) as f:  # read too: the CRC is computed from the bytes written
        z = _ZipWriter(f)
        z.add_bytes(f"{prefix}/data.pkl", data)
        z.add_bytes(f"{prefix}/.format_version", b"1")
        z.add_bytes(f"{prefix}/.storage_alignment", str(ALIGNMENT).encode())
        z.add_bytes(f"{prefix}/byteorder", b"little")
        for ref in storages:
            z.add_tensor(f"{prefix}/data/{ref.key}", ref.tensor)
        z.add_bytes(f"{prefix}/version", b"3\n")
        z.close()
    return sum(ref.tensor.nbytes for ref in storages)


def read_back(path) -> Any:
    """The object in `path` as :mod:`torchzip` reads it (the archive and pickle checked, values not read).

    Raises:
        RuntimeError: the file is not a valid archive (a bug or a failing disk: it was just written).
    """
    try:
        return torchzip.load(path)
    except Exception as exc:  # noqa: BLE001 - whatever the reader says, the write failed
        raise RuntimeError(f"read-back of {path} failed: {exc}") from None
