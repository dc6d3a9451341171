"""Read ``torch.save`` zip archives without torch, without running pickled code, as hostile input.

A ``torch.save`` file (the zip format, the default since torch 1.6) is a zip archive of stored,
uncompressed records: ``<prefix>/data.pkl`` (a pickle of the object), ``<prefix>/data/<key>``
(the raw bytes of each tensor storage), ``<prefix>/byteorder`` and a few version records. The pickle
names a storage by persistent id ``("storage", torch.FloatStorage, key, location, numel)`` and builds
each tensor with ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``.

:func:`load` returns the pickled object with tensors as :class:`StoredTensor` (where the values lie
in the file: byte offset, dtype, shape), reading nothing until asked. Every byte is treated as
hostile (``docs/ckpt.md``, threat model):

* **Archive** (:func:`read_archive`): every entry stored (no compression, so no zip bomb), not
  encrypted, no unknown flags, names unique and under one prefix, local headers agreeing with the
  central directory, records inside the file and not overlapping. A record's CRC-32 is checked the
  first time its values are read or copied (:func:`verify_record`); ``data.pkl``'s at once.
* **Pickle**: the pure-Python unpickler with its dispatch table narrowed: globals resolve only to the
  torch and DeepSpeed names DeepSpeed checkpoints use, each an inert stand-in; ``REDUCE`` calls only
  those; ``BUILD`` only fills a DeepSpeed stand-in's fields (or drops an ``OrderedDict``'s
  ``_metadata``), never an attribute of anything else — so nothing can point a tensor or storage at
  another file; ``NEWOBJ`` only makes DeepSpeed stand-ins; ``INST``/``OBJ``/``EXT*``/text ``PERSID``
  are refused. A storage resolves only to a ``data/<key>`` record of the same archive, and a tensor
  only to elements of its storage, with no more elements than the storage holds (a stride-0 view
  cannot blow up).
* **Bounds**: after loading, one iterative walk checks every node's type, a depth limit, and a
  visit budget proportional to the pickle's size, so a "billion laughs" DAG of shared references or a
  recursion bomb is refused before any other code walks it.

Hand-written instead of ``torch.load(weights_only=True)``: that needs torch (about 2 s of start-up),
maps whole files, and leaves zip bombs and DAG bombs to the caller. The pure-Python unpickler is used
because the C one cannot have its ``BUILD``/``NEWOBJ`` narrowed; ``data.pkl`` is small (kilobytes to
a few MB even at 7B parameters), so its speed does not matter.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from zeropilot.checkpoint.fsguard import Confinement, open_regular
from zeropilot.checkpoint.safe_load import DEEPSPEED_GLOBALS, DamagedFileError, DeepSpeedObject, enum_member

# Storage class names in the pickle -> (torch dtype name, bytes per element).
STORAGES: Dict[str, Tuple[str, int]] = {
    "FloatStorage": ("float32", 4), "DoubleStorage": ("float64", 8), "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2), "LongStorage": ("int64", 8), "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2), "CharStorage": ("int8", 1), "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
}
ITEMSIZE = {name: size for name, size in STORAGES.values()}
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header, 30 bytes
_BLOCK = 64 << 20  # bytes read at a time by StoredTensor.blocks
_CRC_BLOCK = 8 << 20
_ALLOWED_FLAGS = 0x0008 | 0x0800  # data descriptor, UTF-8 names: what torch's writer sets
MAX_DIMS = 64  # torch's own limit on a tensor's dimensions
MAX_INT = 1 << 62  # no size, offset or count in a checkpoint is larger
MAX_DEPTH = 100  # DeepSpeed's files nest about 8 deep
_MAX_ENTRIES = 1 << 20


class Unsupported(Exception):
    """This file needs something the torch-free reader does not do.

    ``fallback`` is True when ``torch.load(weights_only=True)`` may read it instead (a global in
    torch's own allowlist, a strided tensor); False when the file is simply not a torch zip archive.
    """

    def __init__(self, message: str, fallback: bool = True) -> None:
        super().__init__(message)
        self.fallback = fallback


class HostileFileError(DamagedFileError):
    """A file that breaks the torch zip format's rules: damaged, or crafted. Never read further."""


@dataclass(frozen=True)
class Record:
    """One stored zip record: where its bytes lie in the file and their CRC-32."""

    path: str
    name: str
    offset: int
    size: int
    crc: int


_VERIFIED: set = set()


def verify_record(record: Record) -> None:
    """Check the CRC-32 of `record` once per process (the first time its values are read).

    Raises:
        HostileFileError: the bytes do not match the CRC the archive records, or the file is short.
    """
    key = (record.path, record.offset, record.size, record.crc)
    if key in _VERIFIED:
        return
    fd = open_regular(record.path)
    try:
        crc = file_crc32(fd, record.offset, record.size)
    except EOFError:
        raise HostileFileError(f"record {record.name} ends early: truncated", record.path) from None
    finally:
        os.close(fd)
    if crc != record.crc:
        raise HostileFileError(f"record {record.name}: its bytes do not match its CRC-32 (damaged or altered)",
                               record.path)
    _VERIFIED.add(key)


# CRC-32 of large records in parallel: zlib.crc32 releases the GIL, so chunks hashed by threads run on every
# core, and zlib's crc32_combine (not exposed by Python) joins them. A 7B checkpoint's fp32 partitions are
# 30 GB: one core hashes about 1.7 GB/s, which alone would take more time than the whole export.
_PARALLEL_CHUNK = 64 << 20
_CRC_POLY = 0xEDB88320


def _gf2_times(mat: List[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_compose(a: List[int], b: List[int]) -> List[int]:
    """The operator ``a`` after ``b``."""
    return [_gf2_times(a, column) for column in b]


_ZEROS_OPERATORS: Dict[int, List[int]] = {}


def _zeros_operator(nbytes: int) -> List[int]:
    """The 32x32 GF(2) operator that advances a CRC-32 over ``nbytes`` zero bytes (zlib's crc32_combine)."""
    cached = _ZEROS_OPERATORS.get(nbytes)
    if cached is not None:
        return cached
    op = [_CRC_POLY] + [1 << (n - 1) for n in range(1, 32)]  # one zero bit
    for _ in range(3):  # one zero byte
        op = _gf2_compose(op, op)
    result = [1 << n for n in range(32)]  # identity
    remaining = nbytes
    while remaining:
        if remaining & 1:
            result = _gf2_compose(op, result)
        remaining >>= 1
        if remaining:
            op = _gf2_compose(op, op)
    _ZEROS_OPERATORS[nbytes] = result
    return result


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32 of ``A + B`` from the CRC-32s of ``A`` and ``B`` and the length of ``B``."""
    return _gf2_times(_zeros_operator(len_b), crc_a) ^ crc_b if len_b else crc_a


def _chunk_crc32(fd: int, offset: int, size: int) -> int:
    crc, done = 0, 0
    while done < size:
        chunk = os.pread(fd, min(_CRC_BLOCK, size - done), offset + done)
        if not chunk:
            raise EOFError
        crc = zlib.crc32(chunk, crc)
        done += len(chunk)
    return crc


def file_crc32(fd: int, offset: int, size: int, chunk: int = _PARALLEL_CHUNK, workers: Optional[int] = None) -> int:
    """CRC-32 of ``size`` bytes of ``fd`` from ``offset``; chunks hashed by threads when there are several.

    Raises:
        EOFError: the file ends before ``offset + size``.
    """
    if size <= chunk:
        return _chunk_crc32(fd, offset, size)
    from concurrent.futures import ThreadPoolExecutor

    spans = [(offset + start, min(chunk, size - start)) for start in range(0, size, chunk)]
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        crcs = list(pool.map(lambda span: _chunk_crc32(fd, *span), spans))
    total = crcs[0]
    for (_, length), crc in zip(spans[1:], crcs[1:]):
        total = crc32_combine(total, crc, length)
    return total


@dataclass(frozen=True)
class StoredTensor:
    """A tensor of a ``torch.save`` file: where its values lie, not the values.

    ``offset`` is the byte offset of element 0 in ``path``; ``stride`` is in elements, as torch's.
    ``record`` is the zip record holding the values (its CRC is checked before they are used).
    """

    path: str
    offset: int
    dtype: str
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    record: Optional[Record] = field(default=None, compare=False, repr=False)

    def __setstate__(self, state: Any) -> None:
        raise HostileFileError("a pickle tried to rebuild a tensor's fields", self.path)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def is_floating_point(self) -> bool:
        return self.dtype in ("float32", "float64", "float16", "bfloat16")

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def flat(self) -> "StoredTensor":
        """The values as one dimension (contiguous tensors only)."""
        if not self.is_contiguous():
            raise Unsupported(f"non-contiguous tensor of shape {self.shape} in {self.path}")
        return StoredTensor(self.path, self.offset, self.dtype, (self.numel,), (1,), self.record)

    def narrow(self, start: int, length: int) -> "StoredTensor":
        """Elements ``[start, start + length)`` of a 1-D tensor."""
        if len(self.shape) != 1 or start < 0 or length < 0 or start + length > self.shape[0]:
            raise ValueError(f"narrow({start}, {length}) of shape {self.shape}")
        return StoredTensor(self.path, self.offset + start * self.itemsize, self.dtype, (length,), (1,), self.record)

    def _checked(self) -> None:
        if self.record is not None:
            verify_record(self.record)

    def span(self) -> Optional[Tuple[str, int]]:
        """(file, byte offset) of the values, for a kernel copy; None when not contiguous. Checks the CRC."""
        if not self.is_contiguous():
            return None
        self._checked()
        return self.path, self.offset

    def blocks(self, block_bytes: int = _BLOCK) -> Iterator[memoryview]:
        """The raw bytes of the values, in order, at most `block_bytes` at a time (contiguous only)."""
        span = self.flat()
        self._checked()
        block = max(self.itemsize, block_bytes // self.itemsize * self.itemsize)
        fd = open_regular(self.path)
        try:
            for start in range(0, self.nbytes, block):
                buf = memoryview(bytearray(min(block, self.nbytes - start)))
                _read_exactly(fd, span.offset + start, buf, self.path)
                yield buf
        finally:
            os.close(fd)

    def scalar(self) -> Optional[float]:
        """The value of a one-element float32/float64/int tensor, read without torch; None for other dtypes."""
        fmt = {"float32": "<f", "float64": "<d", "int64": "<q", "int32": "<i"}.get(self.dtype)
        if fmt is None or self.numel != 1:
            return None
        raw = b"".join(bytes(b) for b in self.blocks())
        return struct.unpack(fmt, raw)[0]

    def to_torch(self):
        """The values as a new torch tensor of this shape and dtype (imports torch)."""
        import torch

        out = torch.empty(self.numel, dtype=getattr(torch, self.dtype))
        if self.numel:
            flat = self.flat()
            self._checked()
            fd = open_regular(self.path)
            try:
                _read_exactly(fd, flat.offset, memoryview(out.view(torch.uint8).numpy()), self.path)
            finally:
                os.close(fd)
        return out.view(self.shape)


def _read_exactly(fd: int, offset: int, buf: memoryview, path: str) -> None:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got) if hasattr(os, "preadv") else _pread_into(fd, buf[got:],
                                                                                              offset + got)
        if not n:
            raise DamagedFileError("ends inside a tensor: truncated", path)
        got += n


def _pread_into(fd: int, buf: memoryview, offset: int) -> int:
    chunk = os.pread(fd, len(buf), offset)
    buf[:len(chunk)] = chunk
    return len(chunk)


# ---- the archive -----------------------------------------------------------------------------------


@dataclass
class Archive:
    """A validated torch zip archive: its pickle bytes and its storage records by key."""

    path: str
    size: int
    prefix: str
    pickle: bytes
    records: Dict[str, Record]


def read_archive(path, confinement: Optional[Confinement] = None) -> Archive:
    """Validate the torch zip archive at `path` and read its ``data.pkl`` (CRC checked).

    Raises:
        Unsupported: not a zip archive at all (``fallback`` False), or a big-endian one.
        HostileFileError: a zip archive that breaks the rules torch's writer follows.
        InputError: the file cannot be opened, or is not a regular file inside the checkpoint.
    """
    path = os.path.realpath(path)
    fd = open_regular(path, confinement)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            zf = zipfile.ZipFile(f)
            infos = zf.infolist()
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error) as exc:
            raise Unsupported(f"not a zip archive ({exc})", fallback=False) from None
        if len(infos) > _MAX_ENTRIES:
            raise HostileFileError(f"{len(infos)} zip entries: refused", path)
        cd_start = min(size, int(getattr(zf, "start_dir", size)))  # no record's data may reach the directory
        records = [_record(f, path, info, cd_start) for info in infos]
    _check_names_and_overlaps(path, infos, records)
    prefix = _prefix(path, infos)
    by_name = {r.name: r for r in records}
    byteorder = by_name.get(prefix + "byteorder")
    if byteorder is not None and _read_record(byteorder, 16).strip() != b"little":
        raise Unsupported("a big-endian archive", fallback=False)
    pkl = _read_record(by_name[prefix + "data.pkl"], size)
    data_prefix = prefix + "data/"
    storages = {r.name[len(data_prefix):]: r for r in records if r.name.startswith(data_prefix)}
    return Archive(path=path, size=size, prefix=prefix, pickle=pkl, records=storages)


def _record(f, path: str, info: zipfile.ZipInfo, end: int) -> Record:
    name = info.filename
    if info.flag_bits & 0x1 or info.flag_bits & 0x40:
        raise HostileFileError(f"zip entry {name!r} is encrypted: torch.save never encrypts", path)
    if info.flag_bits & ~_ALLOWED_FLAGS:
        raise HostileFileError(f"zip entry {name!r} has flags {info.flag_bits:#06x} torch.save never sets", path)
    if info.compress_type != zipfile.ZIP_STORED:
        raise HostileFileError(f"zip entry {name!r} is compressed (method {info.compress_type}): torch.save "
                               "stores every record", path)
    if info.compress_size != info.file_size:
        raise HostileFileError(f"zip entry {name!r}: stored size {info.compress_size} differs from its size "
                               f"{info.file_size}", path)
    f.seek(info.header_offset)
    head = f.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise HostileFileError(f"zip entry {name!r} has no local header where the directory says", path)
    fields = _LOCAL_HEADER.unpack(head)
    method, name_len, extra_len = fields[4], fields[-2], fields[-1]
    local_name = f.read(name_len)
    if method != zipfile.ZIP_STORED or local_name != name.encode("utf-8"):
        raise HostileFileError(f"zip entry {name!r}: its local header disagrees with the directory", path)
    offset = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    if offset + info.file_size > end:
        raise HostileFileError(f"zip entry {name!r} runs past the end of the file", path)
    return Record(path, name, offset, info.file_size, info.CRC)


def _check_names_and_overlaps(path: str, infos, records: List[Record]) -> None:
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise HostileFileError(f"zip entry {dup!r} appears twice: torch.save writes each record once", path)
    spans = sorted((i.header_offset, r.offset + r.size, r.name) for i, r in zip(infos, records))
    for (_s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise HostileFileError(f"zip entries {n0!r} and {n1!r} overlap in the file", path)


def _prefix(path: str, infos) -> str:
    pkl = [i.filename for i in infos if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")]
    pkl = [n for n in pkl if n.count("/") <= 1]
    if len(pkl) != 1:
        raise Unsupported("no data.pkl record: not a torch.save archive", fallback=False)
    prefix = pkl[0][: -len("data.pkl")]
    stray = [i.filename for i in infos if not i.filename.startswith(prefix)]
    if stray:
        raise HostileFileError(f"zip entry {stray[0]!r} is outside the archive's folder {prefix!r}", path)
    return prefix


def _read_record(record: Record, limit: int) -> bytes:
    if record.size > limit:
        raise HostileFileError(f"record {record.name} is larger than the file", record.path)
    verify_record(record)
    fd = open_regular(record.path)
    try:
        data = os.pread(fd, record.size, record.offset)
    finally:
        os.close(fd)
    if len(data) != record.size:
        raise HostileFileError(f"record {record.name} ends early: truncated", record.path)
    return data


# ---- the pickle ------------------------------------------------------------------------------------


class _Storage:
    """A storage record of the archive: its file offset, dtype and element count."""

    __slots__ = ("path", "offset", "dtype", "numel", "record")

    def __init__(self, record: Record, dtype: str, numel: int) -> None:
        self.path, self.offset, self.dtype, self.numel, self.record = record.path, record.offset, dtype, numel, record

    def __setstate__(self, state: Any) -> None:
        raise HostileFileError("a pickle tried to rebuild a storage's fields", self.path)


class _TensorType:
    """Stand-in for ``torch.Tensor`` as the type argument of ``_rebuild_from_type_v2``."""


def _int(value: Any, what: str, lo: int = 0) -> int:
    if type(value) is not int or not lo <= value < MAX_INT:
        raise _Refused(f"{what} must be an integer in [{lo}, 2**62), found {_short(value)}")
    return value


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
        return "an integer of more than 62 bits"
    text = f"{type(value).__name__} {value!r}" if isinstance(value, (int, float, str, bytes)) else type(value).__name__
    return text[:80]


class _Refused(Exception):
    """Raised inside the unpickler; :func:`load` turns it into a HostileFileError naming the file."""


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None) -> StoredTensor:
    if not isinstance(storage, _Storage):
        raise _Refused(f"a tensor rebuilt from {_short(storage)}, not from a storage record")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride):
        raise _Refused("a tensor's size and stride must be tuples of one length")
    if len(size) > MAX_DIMS:
        raise _Refused(f"a tensor of {len(size)} dimensions")
    offset = _int(storage_offset, "a tensor's storage offset")
    shape = tuple(_int(s, "a tensor dimension") for s in size)
    steps = tuple(_int(s, "a tensor stride") for s in stride)
    numel = math.prod(shape)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, steps)) if numel else 0
    if offset + extent > storage.numel:
        raise _Refused(f"a tensor of shape {shape} reaches past its storage of {storage.numel} elements")
    if numel > storage.numel:
        raise _Refused(f"a view of shape {shape} has more elements than its storage holds ({storage.numel})")
    itemsize = ITEMSIZE[storage.dtype]
    return StoredTensor(storage.path, storage.offset + offset * itemsize, storage.dtype, shape, steps, storage.record)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_state) -> Any:
    if not isinstance(data, StoredTensor):
        raise _Refused(f"a parameter rebuilt from {_short(data)}")
    return data


def _rebuild_from_type_v2(func, new_type, args, state) -> Any:
    if new_type is not _TensorType:
        raise Unsupported(f"a tensor subclass {new_type!r}")
    if func is not _rebuild_tensor_v2 or not isinstance(args, tuple):
        raise _Refused("_rebuild_from_type_v2 of something other than a tensor")
    return func(*args)


def _size(*args) -> tuple:
    if len(args) != 1 or not isinstance(args[0], (tuple, list)):
        raise _Refused("torch.Size of something other than a sequence")
    return tuple(args[0])


def _set(*args) -> set:
    if len(args) > 1 or (args and not isinstance(args[0], (list, tuple))):
        raise _Refused("set() of something other than a list")
    return set(*args)


def _ordered_dict(*args) -> OrderedDict:
    if len(args) > 1 or (args and not isinstance(args[0], (list, tuple))):
        raise _Refused("OrderedDict() of something other than a list")
    return OrderedDict(*args)


_TORCH_GLOBALS: Dict[str, Any] = {
    "collections.OrderedDict": _ordered_dict,
    "builtins.set": _set,  # DeepSpeed 0.14's model states; protocol 2 names it __builtin__.set
    "__builtin__.set": _set,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.Tensor": _TensorType,
    "torch.Size": _size,
}
for _name in STORAGES:
    _TORCH_GLOBALS[f"torch.{_name}"] = _name
_CALLABLES = {id(v): v for v in _TORCH_GLOBALS.values() if callable(v) and v is not _TensorType}
_CALLABLES.update({id(cls): cls for cls, _why in DEEPSPEED_GLOBALS.values()})
_CALLABLES[id(enum_member)] = enum_member  # getattr(ZeroStageEnum, name): how some Pythons pickle an enum member
_DS_CLASSES = tuple(cls for cls, _why in DEEPSPEED_GLOBALS.values())

_PU = pickle._Unpickler  # the pure-Python unpickler: its dispatch table can be narrowed


class _Unpickler(_PU):
    dispatch = dict(_PU.dispatch)

    def __init__(self, data: bytes, records: Dict[str, Record], path: str) -> None:
        super().__init__(io.BytesIO(data))
        self.records = records
        self.path = path
        self.storages: Dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full in _TORCH_GLOBALS:
            return _TORCH_GLOBALS[full]
        if full in DEEPSPEED_GLOBALS:
            return DEEPSPEED_GLOBALS[full][0]
        if full in ("builtins.getattr", "__builtin__.getattr"):  # protocol 2 writes the Python 2 name
            return enum_member
        raise Unsupported(f"global {full}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Refused(f"persistent id {_short(pid)}")
        _tag, kind, key, _location, numel = pid
        if not isinstance(kind, str) or kind not in STORAGES:
            raise Unsupported(f"storage type {_short(kind)}")
        if not isinstance(key, str):
            raise _Refused(f"storage key {_short(key)}")
        numel = _int(numel, f"storage {key!r}'s element count")
        dtype, itemsize = STORAGES[kind]
        if key in self.storages:
            known = self.storages[key]
            if known.dtype != dtype or known.numel != numel:
                raise _Refused(f"storage {key!r} named twice with different types or sizes")
            return known
        record = self.records.get(key)
        if record is None:
            raise _Refused(f"storage {key!r} has no record data/{key} in this archive")
        if record.size < numel * itemsize:
            raise _Refused(f"record data/{key} holds {record.size} bytes, fewer than its {numel} elements")
        storage = _Storage(record, dtype, numel)
        self.storages[key] = storage
        return storage

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is OrderedDict and isinstance(state, dict):
            return  # a state_dict's `_metadata` (torch's module versions): not needed, not kept
        if isinstance(inst, DeepSpeedObject):
            inst.__setstate__(state)
            return
        raise _Refused(f"pickle BUILD on {type(inst).__name__}: only DeepSpeed's plain objects are rebuilt")

    dispatch[pickle.BUILD[0]] = load_build

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(_new(cls, args))

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if kwargs:
            raise _Refused("NEWOBJ_EX with keyword arguments")
        self.append(_new(cls, args))

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if _CALLABLES.get(id(func)) is not func:
            raise _Refused(f"pickle REDUCE calls {_short(func)}, which is not a torch or DeepSpeed name")
        if not isinstance(args, tuple):
            raise _Refused("pickle REDUCE with arguments that are not a tuple")
        self.stack[-1] = func(*args)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def _refuse(self) -> None:
        raise _Refused("pickle opcode INST, OBJ, EXT or PERSID: torch.save never writes it")

    for _op in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4, pickle.PERSID,
                pickle.NEXT_BUFFER, pickle.READONLY_BUFFER):
        dispatch[_op[0]] = _refuse


def _new(cls, args) -> DeepSpeedObject:
    if not (isinstance(cls, type) and issubclass(cls, _DS_CLASSES)) or not isinstance(args, tuple):
        raise _Refused(f"pickle NEWOBJ of {_short(cls)}: only DeepSpeed's plain objects are made")
    return cls.__new__(cls)  # as pickle's NEWOBJ does: no __init__, the fields come with BUILD


_LEAVES = (str, bytes, int, float, bool, type(None), StoredTensor)


def check_tree(obj: Any, budget: int, path: str) -> None:
    """Walk `obj` iteratively: every node of an allowed type, depth <= MAX_DEPTH, visits <= `budget`.

    Shared references are visited once per reference, so a "billion laughs" DAG exhausts the budget
    here, before any recursive code (repr, json, the readers) walks it.

    Raises:
        HostileFileError: a node of another type, too deep, or too many visits.
    """
    stack = [(obj, 0)]
    visits = 0
    while stack:
        node, depth = stack.pop()
        visits += 1
        if visits > budget:
            raise HostileFileError(f"the pickle's object graph needs more than {budget} visits for a "
                                   f"{budget // 8}-byte pickle (shared references multiplying): refused", path)
        if depth > MAX_DEPTH:
            raise HostileFileError(f"the pickle nests deeper than {MAX_DEPTH} levels: refused", path)
        if isinstance(node, _LEAVES):
            continue
        if isinstance(node, dict):
            stack.extend((k, depth + 1) for k in node.keys())
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, DeepSpeedObject):
            stack.extend((v, depth + 1) for v in vars(node).values())
        else:
            raise HostileFileError(f"the pickle holds a {type(node).__name__} object, which DeepSpeed never "
                                   "saves: refused", path)


def load(path, confinement: Optional[Confinement] = None) -> Any:
    """The object pickled in the ``torch.save`` archive `path`, tensors as :class:`StoredTensor`.

    Raises:
        Unsupported: not a torch zip archive (``fallback`` False), or its pickle needs a global or a
            tensor layout outside the DeepSpeed set (``fallback`` True; nothing is executed either way).
        HostileFileError: the archive or its pickle breaks the rules (see the module docstring).
        InputError: the file cannot be opened or is not a regular file inside the checkpoint.
    """
    archive = read_archive(path, confinement)
    return unpickle(archive.pickle, archive.records, archive.path)


def unpickle(data: bytes, records: Dict[str, Record], path: str) -> Any:
    """Unpickle `data` with the narrowed unpickler, storages resolved in `records`, the result walked.

    Raises:
        Unsupported: a global or tensor layout the reader does not know (``fallback`` True).
        HostileFileError: anything else wrong with the pickle.
    """
    try:
        obj = _Unpickler(data, records, path).load()
    except (Unsupported, DamagedFileError):
        raise
    except _Refused as exc:
        raise HostileFileError(f"refused: {exc}", path) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError, MemoryError, RecursionError, UnicodeDecodeError, struct.error) as exc:
        raise HostileFileError(f"pickle not understood ({type(exc).__name__}: {str(exc)[:120]})", path) from None
    check_tree(obj, 8 * len(data) + 10_000, path)
    return obj
