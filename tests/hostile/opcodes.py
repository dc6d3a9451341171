"""A tiny pickle assembler: crafted ``data.pkl`` bytes that no well-behaved pickler would write."""

from __future__ import annotations

import struct

PROTO2 = b"\x80\x02"
STOP = b"."
MARK = b"("
TUPLE = b"t"
TUPLE1 = b"\x85"
EMPTY_TUPLE = b")"
EMPTY_DICT = b"}"
EMPTY_LIST = b"]"
APPEND = b"a"
SETITEM = b"s"
SETITEMS = b"u"
REDUCE = b"R"
BUILD = b"b"
NEWOBJ = b"\x81"
BINPERSID = b"Q"
NONE = b"N"
FALSE = b"\x89"


def glob(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


def s(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def i(value: int) -> bytes:
    if -(1 << 31) <= value < (1 << 31):
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + struct.pack("<I", len(raw)) + raw  # LONG4


def f(value: float) -> bytes:
    return b"G" + struct.pack(">d", value)


def put(n: int) -> bytes:
    return b"r" + struct.pack("<I", n)  # LONG_BINPUT


def get(n: int) -> bytes:
    return b"j" + struct.pack("<I", n)  # LONG_BINGET


def tup(*items: bytes) -> bytes:
    return MARK + b"".join(items) + TUPLE


def dict_(*pairs) -> bytes:
    return EMPTY_DICT + (MARK + b"".join(k + v for k, v in pairs) + SETITEMS if pairs else b"")


def list_(*items: bytes) -> bytes:
    return EMPTY_LIST + (MARK + b"".join(items) + b"e" if items else b"")  # APPENDS


def storage(key: str, numel: int, kind: str = "ByteStorage") -> bytes:
    """A persistent id naming the archive record data/<key>."""
    return tup(s("storage"), glob("torch", kind), s(key), s("cpu"), i(numel)) + BINPERSID


def tensor(storage_bytes: bytes, offset: bytes, size, stride) -> bytes:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())``."""
    return (glob("torch._utils", "_rebuild_tensor_v2")
            + tup(storage_bytes, offset, tup(*map(i, size)), tup(*map(i, stride)), FALSE,
                  glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE)
            + REDUCE)


def pickle(body: bytes) -> bytes:
    return PROTO2 + body + STOP
