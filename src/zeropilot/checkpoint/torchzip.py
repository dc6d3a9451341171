"""Read ``torch.save`` zip archives without torch and without running pickled code.

A ``torch.save`` file (the zip format, the default since torch 1.6) is a zip archive of stored,
uncompressed records: ``<prefix>/data.pkl`` (a pickle of the object), ``<prefix>/data/<key>``
(the raw bytes of each tensor storage), ``<prefix>/byteorder`` and a few version records. The pickle
names a storage by persistent id ``("storage", torch.FloatStorage, key, location, numel)`` and builds
each tensor with ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``.

:func:`load` unpickles ``data.pkl`` with an unpickler that resolves exactly the globals DeepSpeed
checkpoints use (the torch ones below and :data:`safe_load.DEEPSPEED_GLOBALS`) to inert stand-ins:
tensors come back as :class:`StoredTensor`, which says where the values lie in the file (byte
offset, dtype, shape) and reads nothing until asked. Any other global raises :class:`Unsupported`;
the caller then falls back to ``torch.load(weights_only=True)``, which refuses what is not safe.

So the values of a checkpoint can be copied file to file (``copy_file_range``) or read in bounded
blocks, without importing torch (about 2 s of start-up with a CPU wheel) or mapping whole files.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from zeropilot.checkpoint.safe_load import DEEPSPEED_GLOBALS, DamagedFileError

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


class Unsupported(Exception):
    """This file needs something the torch-free reader does not do (a global, a layout)."""


@dataclass(frozen=True)
class StoredTensor:
    """A tensor of a ``torch.save`` file: where its values lie, not the values.

    ``offset`` is the byte offset of element 0 in ``path``; ``stride`` is in elements, as torch's.
    """

    path: str
    offset: int
    dtype: str
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]

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
        return StoredTensor(self.path, self.offset, self.dtype, (self.numel,), (1,))

    def narrow(self, start: int, length: int) -> "StoredTensor":
        """Elements ``[start, start + length)`` of a 1-D tensor."""
        if len(self.shape) != 1 or start < 0 or start + length > self.shape[0]:
            raise ValueError(f"narrow({start}, {length}) of shape {self.shape}")
        return StoredTensor(self.path, self.offset + start * self.itemsize, self.dtype, (length,), (1,))

    def span(self) -> Optional[Tuple[str, int]]:
        """(file, byte offset) of the values, for a kernel copy; None when not contiguous."""
        return (self.path, self.offset) if self.is_contiguous() else None

    def blocks(self, block_bytes: int = _BLOCK) -> Iterator[memoryview]:
        """The raw bytes of the values, in order, at most `block_bytes` at a time (contiguous only)."""
        span = self.flat()
        block = max(self.itemsize, block_bytes // self.itemsize * self.itemsize)
        with open(self.path, "rb", buffering=0) as f:
            for start in range(0, self.nbytes, block):
                buf = memoryview(bytearray(min(block, self.nbytes - start)))
                _read_exactly(f, span.offset + start, buf, self.path)
                yield buf

    def to_torch(self):
        """The values as a new torch tensor of this shape and dtype (imports torch)."""
        import torch

        out = torch.empty(self.numel, dtype=getattr(torch, self.dtype))
        if self.numel:
            with open(self.path, "rb", buffering=0) as f:
                _read_exactly(f, self.flat().offset, memoryview(out.view(torch.uint8).numpy()), self.path)
        return out.view(self.shape)


def _read_exactly(f, offset: int, buf: memoryview, path: str) -> None:
    f.seek(offset)
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            raise DamagedFileError("ends inside a tensor: truncated", path)
        got += n


class _Storage:
    """A storage record of the archive: its file offset, dtype and element count."""

    __slots__ = ("path", "offset", "dtype", "numel")

    def __init__(self, path: str, offset: int, dtype: str, numel: int) -> None:
        self.path, self.offset, self.dtype, self.numel = path, offset, dtype, numel


class _TensorType:
    """Stand-in for ``torch.Tensor`` as the type argument of ``_rebuild_from_type_v2``."""


def _rebuild_tensor_v2(storage: _Storage, storage_offset: int, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None) -> StoredTensor:
    shape, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if shape and any(s < 0 for s in stride):
        raise Unsupported("negative strides")
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    if storage_offset < 0 or storage_offset + extent > storage.numel:
        raise Unsupported(f"a tensor reaches past its storage in {storage.path}")
    itemsize = ITEMSIZE[storage.dtype]
    return StoredTensor(storage.path, storage.offset + storage_offset * itemsize, storage.dtype, shape, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_state) -> Any:
    return data


def _rebuild_from_type_v2(func, new_type, args, state) -> Any:
    if new_type is not _TensorType:
        raise Unsupported(f"a tensor subclass {new_type!r}")
    return func(*args)


def _size(*args) -> tuple:
    return tuple(*args)


_TORCH_GLOBALS: Dict[str, Any] = {
    "collections.OrderedDict": OrderedDict,
    "builtins.set": set,  # DeepSpeed 0.14's model states; protocol 2 names it __builtin__.set
    "__builtin__.set": set,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "torch.Tensor": _TensorType,
    "torch.Size": _size,
}
for _name in STORAGES:
    _TORCH_GLOBALS[f"torch.{_name}"] = _name


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, records: Dict[str, Tuple[int, int]], path: str) -> None:
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
        raise Unsupported(f"global {full}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise Unsupported(f"persistent id {pid!r}")
        _tag, kind, key, _location, numel = pid
        if kind not in STORAGES:
            raise Unsupported(f"storage type {kind!r}")
        if key in self.storages:
            return self.storages[key]
        dtype, itemsize = STORAGES[kind]
        if key not in self.records:
            raise Unsupported(f"no record data/{key}")
        offset, size = self.records[key]
        if size < int(numel) * itemsize:
            raise Unsupported(f"record data/{key} holds {size} bytes, fewer than its {numel} elements")
        storage = _Storage(self.path, offset, dtype, int(numel))
        self.storages[key] = storage
        return storage


def load(path) -> Any:
    """The object pickled in the ``torch.save`` archive `path`, tensors as :class:`StoredTensor`.

    Raises:
        Unsupported: not a zip archive written by ``torch.save``, a big-endian one, or its pickle
            needs a global outside the DeepSpeed set (nothing is executed either way).
        OSError: the file cannot be read.
    """
    path = str(Path(path).resolve())
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            pkl = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(pkl) != 1:
                raise Unsupported("no data.pkl record: not a torch.save archive")
            prefix = pkl[0].filename[: -len("data.pkl")]
            byteorder = prefix + "byteorder"
            if byteorder in zf.namelist() and zf.read(byteorder).strip() != b"little":
                raise Unsupported("a big-endian archive")
            data = zf.read(pkl[0])
    except zipfile.BadZipFile as exc:
        raise Unsupported(f"not a zip archive ({exc})") from None
    records = _records(path, infos, prefix + "data/")
    try:
        return _Unpickler(data, records, path).load()
    except Unsupported:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise Unsupported(f"pickle not understood ({type(exc).__name__}: {exc})") from None


def _records(path: str, infos, data_prefix: str) -> Dict[str, Tuple[int, int]]:
    """key -> (byte offset of the record's data in the file, its size) for the stored storage records."""
    records = {}
    with open(path, "rb") as f:
        for info in infos:
            if not info.filename.startswith(data_prefix):
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise Unsupported(f"record {info.filename} is compressed")
            f.seek(info.header_offset)
            head = f.read(_LOCAL_HEADER.size)
            if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
                raise Unsupported(f"record {info.filename} has no local header")
            fields = _LOCAL_HEADER.unpack(head)
            name_len, extra_len = fields[-2], fields[-1]
            offset = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
            records[info.filename[len(data_prefix):]] = (offset, info.file_size)
    return records
