"""Hostile pickles inside a real ZeRO-2 checkpoint's ``data.pkl``: nothing runs, nothing outside is read.

Each case replaces the pickle of ``mp_rank_00_model_states.pt`` (the archive's tensor records stay) with
crafted opcodes: BUILD on the reader's own objects pointing a tensor at a secret file, code execution
through globals, DAG and recursion bombs, views larger than their storage, numbers where they do not
belong. ``export`` must end with one line and exit 2, ``inspect`` with a DAMAGED verdict and exit 1.
A hypothesis fuzzer throws random opcode streams at the unpickler itself.
"""

from __future__ import annotations

import struct
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile import opcodes as op
from tests.hostile.conftest import Z2, rewrite_archive, run_cli

pytestmark = pytest.mark.slow


def _module_states(tensor: bytes) -> bytes:
    """A model-states dict whose one module tensor is `tensor`; shapes claim it is a (1,) parameter."""
    return op.dict_((op.s("module"), op.glob("collections", "OrderedDict") + op.EMPTY_TUPLE + op.REDUCE
                     + op.MARK + op.s("w") + tensor + op.SETITEMS),
                    (op.s("param_shapes"), op.list_(op.dict_((op.s("w"), op.tup(op.i(1)))))),
                    (op.s("buffer_names"), op.list_()))


def _laughs(levels: int = 30, width: int = 10) -> bytes:
    body = op.s("lol") + op.put(0)
    for level in range(1, levels + 1):
        body += op.list_(*[op.get(level - 1)] * width) + op.put(level)
    return op.dict_((op.s("module"), op.dict_()), (op.s("param_shapes"), op.get(levels)))


def _deep(depth: int = 200_000) -> bytes:
    return op.EMPTY_LIST * depth + op.APPEND * (depth - 1)


def cases(n: int, secret: str, marker: str):
    """name -> pickle body; `n` is the size of record data/0, used as a ByteStorage."""
    store = op.storage("0", n)
    t = op.tensor(store, op.i(0), (n,), (1,))
    evil_fields = op.dict_((op.s("path"), op.s(secret)), (op.s("offset"), op.i(0)))
    return {
        "build-sets-tensor-path": _module_states(t + evil_fields + op.BUILD),
        "build-slotstate-tensor-path": _module_states(t + op.tup(op.NONE, evil_fields) + op.BUILD),
        "build-sets-storage-path": _module_states(op.tensor(store + op.tup(op.NONE, evil_fields) + op.BUILD,
                                                            op.i(0), (n,), (1,))),
        "build-on-reader-function": _module_states(
            op.glob("torch._utils", "_rebuild_tensor_v2")
            + op.tup(op.NONE, op.dict_((op.s("__defaults__"), op.tup(op.s(secret))))) + op.BUILD),
        "build-on-stand-in-class": op.glob("deepspeed.runtime.fp16.loss_scaler", "LossScaler")
        + op.dict_((op.s("__init__"), op.s(secret))) + op.BUILD,
        "stand-in-field-named-dunder": op.glob("deepspeed.runtime.fp16.loss_scaler", "LossScaler") + op.EMPTY_TUPLE
        + op.NEWOBJ + op.dict_((op.s("__class__"), op.s("x"))) + op.BUILD,
        "os-system": op.glob("posix", "system") + op.tup(op.s(f"touch {marker}")) + op.REDUCE,
        "builtins-eval": op.glob("builtins", "eval") + op.tup(op.s(f"open({marker!r}, 'w')")) + op.REDUCE,
        "newobj-of-a-function": op.glob("torch._utils", "_rebuild_tensor_v2") + op.EMPTY_TUPLE + op.NEWOBJ,
        "reduce-on-a-string": op.glob("torch", "FloatStorage") + op.EMPTY_TUPLE + op.REDUCE,
        "billion-laughs": _laughs(),
        "recursion-bomb": _deep(),
        "memo-index-bomb": op.s("x") + b"r" + struct.pack("<I", 0xFFFFFFF0) + op.get(0xFFFFFFF0),
        "stride-0-view": _module_states(op.tensor(op.storage("0", 1), op.i(0), (10**9,), (0,))),
        "float-storage-offset": _module_states(op.tensor(store, op.f(0.5), (1,), (1,))),
        "negative-storage-offset": _module_states(op.tensor(store, op.i(-1), (1,), (1,))),
        "negative-shape": _module_states(op.tensor(store, op.i(0), (-1, -1), (1, 1))),
        "huge-int-shape": _module_states(op.tensor(store, op.i(0), (2**100,), (1,))),
        "storage-without-record": _module_states(op.tensor(op.storage("999", 1), op.i(0), (1,), (1,))),
        "storage-key-traversal": _module_states(op.tensor(op.storage("../data.pkl", 1), op.i(0), (1,), (1,))),
        "storage-larger-than-record": _module_states(op.tensor(op.storage("0", n * 10**6), op.i(0), (1,), (1,))),
        "frame-length-bomb": b"\x95" + struct.pack("<Q", 1 << 60) + op.s("x"),
        "unicode8-length-bomb": b"\x8d" + struct.pack("<Q", 1 << 40) + b"abc",
        "model-states-a-list": op.list_(op.i(1), op.i(2)),
        "param-shapes-missing": op.dict_((op.s("module"), op.dict_())),
        "param-shapes-of-strings": op.dict_((op.s("module"), op.dict_()), (op.s("param_shapes"),
                                            op.list_(op.dict_((op.s("w"), op.tup(op.s("2")))))),),
        "truncated-pickle": op.dict_((op.s("module"), op.dict_()))[:-3],
    }


def _names():
    return list(cases(1, "s", "m"))


def _plant(case_, name: str):
    victim = case_.file("mp_rank_00_model_states.pt")
    with zipfile.ZipFile(victim) as zf:
        n = next(i.file_size for i in zf.infolist() if i.filename.endswith("/data/0"))
    body = cases(n, str(case_.secret), str(case_.marker))[name]
    proto = b"\x80\x04" if body.startswith(b"\x95") else b"\x80\x02"
    rewrite_archive(victim, replace={"data.pkl": proto + body + op.STOP})


@pytest.mark.parametrize("name", _names())
def test_export_refuses_a_hostile_pickle_with_one_line(case, name):
    c = case(Z2)
    _plant(c, name)
    c.check(c.export("--dtype", "fp32"), 2)


@pytest.mark.parametrize("name", ["build-sets-tensor-path", "build-sets-storage-path", "billion-laughs", "stride-0-view",
                                  "model-states-a-list"])
def test_inspect_calls_a_hostile_pickle_damaged(case, name):
    c = case(Z2)
    _plant(c, name)
    ran = run_cli("ckpt", "inspect", c.root)
    c.check(ran, 1)
    assert "mp_rank_00_model_states.pt" in ran.stdout


# ---- fuzzing the unpickler itself (in process: it must only ever raise the reader's own errors) ----------

_ATOMS = [op.MARK, op.TUPLE, op.TUPLE1, op.EMPTY_TUPLE, op.EMPTY_DICT, op.EMPTY_LIST, op.APPEND, op.SETITEM,
          op.SETITEMS, op.REDUCE, op.BUILD, op.NEWOBJ, op.BINPERSID, op.NONE, op.FALSE, b"e", b"0", b"2",
          op.s("storage"), op.s("0"), op.s("w"), op.i(1), op.i(-1), op.i(2**40), op.f(0.5), op.put(0), op.get(0),
          op.glob("torch._utils", "_rebuild_tensor_v2"), op.glob("collections", "OrderedDict"),
          op.glob("torch", "FloatStorage"), op.glob("torch", "Size"), op.glob("builtins", "set"),
          op.glob("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), op.glob("torch._utils", "_rebuild_parameter"),
          op.glob("deepspeed.runtime.zero.config", "ZeroStageEnum"), op.glob("posix", "system"),
          op.storage("0", 4), op.tensor(op.storage("0", 4), op.i(0), (4,), (1,))]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(_ATOMS), max_size=40))
def test_random_opcode_streams_only_raise_the_readers_errors(atoms):
    from zeropilot.checkpoint import torchzip
    from zeropilot.errors import InputError

    rec = torchzip.Record("/nonexistent", "data/0", 0, 16, 0)
    data = op.PROTO2 + b"".join(atoms) + op.STOP
    try:
        torchzip.unpickle(data, {"0": rec}, "/nonexistent")
    except (torchzip.Unsupported, InputError):
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=300))
def test_random_bytes_as_a_pickle_are_refused_not_crashing(tmp_path_factory, raw):
    """Random bytes in data.pkl of a well-formed archive: load raises the reader's errors, nothing else."""
    from zeropilot.checkpoint import torchzip
    from zeropilot.errors import InputError

    path = tmp_path_factory.mktemp("fz") / "f.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("f/data.pkl", op.PROTO2 + raw + op.STOP)
        zf.writestr("f/data/0", b"\0" * 16)
    try:
        torchzip.load(path)
    except (torchzip.Unsupported, InputError):
        pass
