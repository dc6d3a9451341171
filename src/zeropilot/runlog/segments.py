"""Compacted segments: a closed part of one rank's records kept as columns (``rank-N.seg-K.col``).

A rank's guard appends JSON lines (``runlog.events.EventWriter``): crash-safe, one ``write`` per record, about 440
bytes per step record. Past :data:`~zeropilot.runlog.events.SEGMENT_BYTES` the writer closes the file as a segment
(``rank-N.seg-K.jsonl``) and starts a new one; the supervisor turns each closed segment into one file of this
format (``runlog.compact``) and removes the JSON lines once the new file is durable. Nothing is lost: decoding a
segment gives back every record, with its keys in their order and every value as JSON read it (:func:`records`).

**Why this format.** Generic and schema-less per field: a step record is flattened into key paths (``mem`` ->
``allocated_bytes`` is the column ``("mem", "allocated_bytes")``), so a field a later guard adds becomes a column
without this module knowing it. Each column is stored by what its values are: integers as offsets from their
minimum, or as differences from the previous row when those span less (a step counter, a clock), in the narrowest
of 1/2/4/8 bytes, the bytes of each significance together ("shuffled"), then zlib; floats as integers where that is
exact (decimal fractions such as the guard's microsecond phase times, or a clock's binary fraction: a value is kept
as an integer only when converting it back gives the same float), else as their 8 bytes; strings and anything else
(lists, ``null`` among numbers) through a per-column dictionary. Only the standard library (``zlib``, ``array``,
``json``) reads or writes it: the core needs no pyarrow, and a columnar file of our own says what it keeps. An
ecosystem format (Parquet) would need one schema per file and a dependency to read it; :func:`records` turns a
segment back into the JSON lines any tool reads.

**Reading a little.** The head of a file says, per numeric column, its count, minimum, maximum, sum and the step and
time of the first minimum and maximum (exact aggregates: a rank's peaks come from these), and where each part is.
Before the row groups come small ones: the *samples*, one per stride level (``every``: :data:`SAMPLE_EVERY`, twice
it, four times it, ... while a level holds at least :data:`MIN_LEVEL_ROWS` of its steps: :func:`sample_levels`),
each the rows whose step is a multiple of its stride, the segment's first :data:`HEAD_ROWS` rows, the row before and
after each record that is not a step (the step after a save) and its last row; and the *tail* (the last
:data:`TAIL_ROWS` rows). ``zeropilot report`` of a long run reads heads and, per segment, the one sample of the
coarsest level its stride allows: at a stride of 256 a rank of 100k steps (a save every 5,000) decodes 433 rows, not
the 823 of the first level (``bench/report/results/scale.md``); a short run, or ``zeropilot top``, reads what it
needs. The levels overlap (a row of the 256 level is in the 128 one too): together they cost about twice the first
one, about 1% more bytes than one sample.

**Versions.** :data:`SCHEMA` is what :func:`encode` writes; every schema of :data:`SCHEMAS` reads. Schema 1 had one
sample (every 128th step, without the segment's last row): its files read as before, the reader taking a rank's
newest row from the tail.

**Damage.** Every part carries a CRC-32 and the head the file's length: a truncated or corrupt file is read up to
the damage (the row groups before it) and the reader says where (:class:`Damaged`).

Layout: ``MAGIC`` (8 bytes), the head's length and CRC-32 (4 bytes each, little-endian), the head (zlib of a JSON
object, schema :data:`SCHEMA`), then the parts: ``events``, one ``sample`` per level (finest first, each with its
``every``), ``tail``, and ``rows`` groups of :data:`GROUP_ROWS` rows, each at the offset the head gives from the end
of the head.
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from functools import reduce
from itertools import accumulate, repeat
from operator import add, mul, or_, sub, truediv
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

SCHEMA = "zeropilot.segment/2"
SCHEMAS = ("zeropilot.segment/1", SCHEMA)  # what reads (module doc, "Versions")
MAGIC = b"ZPSEG1\r\n"  # the file kind, the same in every schema: the head's schema says which
SAMPLE_EVERY = 128  # a step that is a multiple of this is in every segment's sample: ranks sampled at the same steps
MIN_LEVEL_ROWS = 64  # a coarser sample level is kept while it holds at least this many of its stride's steps
HEAD_ROWS = 4
TAIL_ROWS = 160  # top's first look (runlog.live.RECENT_ROWS): 64 steps, and 16 GPU probes at every 10 steps
GROUP_ROWS = 4096
MAX_COLUMNS = 256  # distinct key paths of step rows per segment; a step record beyond them is kept as its line
MAX_DEPTH = 4  # nested objects deeper than this are one value (JSON text)
MAX_HEAD = 4 << 20
MAX_PART = 256 << 20
LEVEL = 6
_BIG = 1 << 62  # integers beyond this (never a real count, byte size or time) are kept as JSON text

Path = Tuple[str, ...]

# value kinds (tags) of a column's values
NULL, FALSE, TRUE, INT, FLOAT, STR, JSON = range(7)


class _Absent:
    """A row without this column's key (not the same as ``null``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class Damaged(Exception):
    """A segment file that cannot be read past ``offset``: ``what`` says which part."""

    def __init__(self, offset: int, what: str) -> None:
        self.offset, self.what = offset, what
        super().__init__(f"damaged at byte {offset} ({what})")


@dataclass
class Block:
    """Step rows as columns: ``cols[path][i]`` is row ``i``'s value (:data:`ABSENT` where it has no such key);
    ``shapes`` the distinct key orders (``shape_of[i]`` row ``i``'s; None: every row has ``shapes[0]``)."""

    n: int
    cols: Dict[Path, List[Any]]
    shapes: List[Tuple[Path, ...]]
    shape_of: Optional[List[int]] = None

    def take(self, rows: Sequence[int]) -> "Block":
        """The block of these rows (in this order)."""
        get = [c.__getitem__ for c in self.cols.values()]
        cols = {p: list(map(g, rows)) for p, g in zip(self.cols, get)}
        shape_of = None if self.shape_of is None else [self.shape_of[i] for i in rows]
        return Block(len(rows), cols, self.shapes, shape_of)


@dataclass
class Segment:
    """One closed segment of a rank (``seq``; segments ``seq`` to ``last`` when several are merged): its step rows,
    the other records (``(position, line)``: the number of step rows before each, and its JSON line as written) and
    where it came from."""

    rank: int
    seq: int
    rows: Block
    others: List[Tuple[int, bytes]] = field(default_factory=list)
    source: Dict[str, Any] = field(default_factory=dict)
    last: Optional[int] = None


def concat(parts: Sequence[Segment]) -> Segment:
    """Consecutive segments of one rank as one (``seq`` of the first to ``last`` of the last): the same records in
    the same order, as :func:`from_records` would make of them all."""
    paths: Dict[Path, None] = {}
    shapes: Dict[Tuple[Path, ...], int] = {}
    for part in parts:
        paths.update(dict.fromkeys(part.rows.cols))
        for shape in part.rows.shapes:
            if shape:
                shapes.setdefault(shape, len(shapes))
    n = sum(p.rows.n for p in parts)
    cols: Dict[Path, List[Any]] = {p: [] for p in paths}
    shape_of: List[int] = []
    others: List[Tuple[int, bytes]] = []
    done = 0
    for part in parts:
        b = part.rows
        for path, col in cols.items():
            col.extend(b.cols[path] if path in b.cols else [ABSENT] * b.n)
        if b.n:
            codes = [shapes[shape] for shape in b.shapes]
            shape_of.extend([codes[0]] * b.n if b.shape_of is None else [codes[c] for c in b.shape_of])
        others.extend((pos + done, line) for pos, line in part.others)
        done += b.n
    one = len(shapes) <= 1
    source = {"records": sum(p.source.get("records", 0) for p in parts),
              "skipped": sum(p.source.get("skipped", 0) for p in parts)}
    last = parts[-1].last if parts[-1].last is not None else parts[-1].seq
    return Segment(parts[0].rank, parts[0].seq, Block(n, cols, list(shapes) or [()], None if one else shape_of),
                   others, source, last)


# -- from JSON lines -----------------------------------------------------------------------------------------------

_decode = json.JSONDecoder().decode


def flatten(obj: Dict[str, Any], prefix: Path, depth: int, paths: List[Path], values: List[Any]) -> None:
    for key, value in obj.items():
        path = prefix + (key,)
        if type(value) is dict and value and depth < MAX_DEPTH:
            flatten(value, path, depth + 1, paths, values)
        else:
            paths.append(path)
            values.append(value)


def from_lines(rank: int, seq: int, lines: Sequence[bytes], max_line: int) -> Segment:
    """A segment from a closed segment's lines (without their newlines; a torn or unreadable line is counted in
    ``source['skipped']`` and dropped, as every reader drops it)."""
    skipped = 0

    def parsed() -> Iterator[Dict[str, Any]]:
        nonlocal skipped
        for raw in lines:
            if not raw.strip():
                continue
            rec = None
            if len(raw) <= max_line:
                try:
                    rec = _decode(raw.decode("utf-8"))
                except (ValueError, RecursionError):
                    rec = None
            if isinstance(rec, dict):
                yield rec
            else:
                skipped += 1

    out = from_records(rank, seq, parsed())
    out.source["skipped"] = skipped
    return out


def from_records(rank: int, seq: int, recs: Iterable[Dict[str, Any]]) -> Segment:
    """A segment from records as a rank wrote them, in order: step records become columns (up to
    :data:`MAX_COLUMNS` key paths), every other record is kept as the line the writer writes for it."""
    from zeropilot.runlog.events import line

    shapes: Dict[Tuple[Path, ...], int] = {}
    shape_rows: List[int] = []
    row_values: List[List[Any]] = []
    others: List[Tuple[int, bytes]] = []
    columns: Dict[Path, None] = {}
    for rec in recs:
        if rec.get("event") == "step":
            paths: List[Path] = []
            values: List[Any] = []
            flatten(rec, (), 0, paths, values)
            key = tuple(paths)
            code = shapes.get(key)
            if code is None and len(columns.keys() | set(paths)) <= MAX_COLUMNS:
                code = shapes[key] = len(shapes)
                columns.update(dict.fromkeys(paths))
            if code is not None:
                shape_rows.append(code)
                row_values.append(values)
                continue
        others.append((len(row_values), line(rec)[:-1]))
    shape_list = list(shapes)
    n = len(row_values)
    cols: Dict[Path, List[Any]] = {p: [ABSENT] * n for p in columns}
    for i, (code, values) in enumerate(zip(shape_rows, row_values)):
        for path, value in zip(shape_list[code], values):
            cols[path][i] = value
    one = len(shape_list) <= 1
    return Segment(rank, seq, Block(n, cols, shape_list or [()], None if one else shape_rows), others,
                   {"records": n + len(others), "skipped": 0})


# -- numbers ------------------------------------------------------------------------------------------------------

_TYPECODES = {w: next(c for c in codes if array(c).itemsize == w)
              for w, codes in ((1, "B"), (2, "H"), (4, "IL"), (8, "LQ"))}
_SWAP = sys.byteorder == "big"


def _width(span: int) -> int:
    return 0 if span == 0 else 1 if span < 1 << 8 else 2 if span < 1 << 16 else 4 if span < 1 << 32 else 8


def _pack(vals: Sequence[int], w: int) -> bytes:
    arr = array(_TYPECODES[w], vals)
    if _SWAP:
        arr.byteswap()
    raw = arr.tobytes()
    return raw if w == 1 else b"".join(raw[i::w] for i in range(w))


def _unpack(data: bytes, w: int, n: int) -> array:
    if len(data) != w * n:
        raise ValueError("integer part of the wrong length")
    if w > 1:
        out = bytearray(w * n)
        for i in range(w):
            out[i::w] = data[i * n:(i + 1) * n]
        data = bytes(out)
    arr = array(_TYPECODES[w])
    arr.frombytes(data)
    if _SWAP:
        arr.byteswap()
    return arr


def _enc_ints(ints: List[int], parts: List[bytes]) -> Dict[str, Any]:
    """Integers (each within +-2^62) as offsets from the minimum, or as differences when those span less."""
    n = len(ints)
    meta: Dict[str, Any] = {"n": n}
    if not n:
        return meta
    lo, hi = min(ints), max(ints)
    seq, base, span = ints, lo, hi - lo
    if n > 2 and span:
        deltas = list(map(sub, ints[1:], ints[:-1]))
        dlo, dhi = min(deltas), max(deltas)
        if dhi - dlo < span:
            meta["first"] = ints[0]
            seq, base, span = deltas, dlo, dhi - dlo
    w = _width(span)
    meta["base"], meta["w"] = base, w
    if w:
        parts.append(_pack(list(map(sub, seq, repeat(base))) if base else seq, w))
    return meta


def _dec_ints(meta: Dict[str, Any], take) -> List[int]:
    n = _count(meta.get("n"))
    if not n:
        return []
    base, w = _int(meta.get("base")), meta.get("w")
    first = meta.get("first")
    m = n - 1 if first is not None else n
    if w == 0:
        seq: Any = repeat(base, m)
    elif w in _TYPECODES:
        arr = _unpack(take(), w, m)
        seq = map(add, arr, repeat(base)) if base else arr
    else:
        raise ValueError("unknown integer width")
    if first is not None:
        return list(accumulate(seq, initial=_int(first)))
    return list(seq)


def _decimals(xs: List[float]) -> Optional[int]:
    """The decimal places of a few of ``xs`` as printed (None: exponent form)."""
    most = 0
    step = max(1, len(xs) // 16)
    for x in xs[::step][:17]:
        r = repr(x)
        if "e" in r:
            return None
        most = max(most, len(r) - r.index(".") - 1)
    return most


def _exact_ints(xs: List[float]) -> Optional[Tuple[str, int, List[int]]]:
    """``("dec", d, ints)`` with ``ints[i] / 10**d == xs[i]`` exactly, or ``("bin", e, ints)`` with
    ``ldexp(ints[i], -e) == xs[i]``; None when neither holds within +-2^62."""
    d = _decimals(xs)
    if d is not None and d <= 9:
        scale = 10 ** d
        ints = list(map(round, map(mul, xs, repeat(float(scale)))))
        if -_BIG < min(ints) and max(ints) < _BIG and list(map(truediv, ints, repeat(scale))) == xs:
            return "dec", d, ints
    exps = [e for m, e in map(math.frexp, xs) if m]
    if not exps:
        return "dec", 0, [0] * len(xs)
    shift = 53 - min(exps)
    if max(exps) + shift > 62:
        return None
    ints = list(map(int, map(math.ldexp, xs, repeat(shift))))
    acc = reduce(or_, ints, 0)
    zeros = (acc & -acc).bit_length() - 1 if acc else 0
    if zeros:
        ints = [i >> zeros for i in ints]
    return "bin", shift - zeros, ints


def _enc_floats(xs: List[float], parts: List[bytes]) -> Dict[str, Any]:
    exact = _exact_ints(xs) if xs else None
    if exact is None:
        raw = array("d", xs)
        if _SWAP:
            raw.byteswap()
        b = raw.tobytes()
        parts.append(b"".join(b[i::8] for i in range(8)))
        return {"m": "raw", "n": len(xs)}
    how, e, ints = exact
    return {"m": how, "e": e, **_enc_ints(ints, parts)}


def _dec_floats(meta: Dict[str, Any], take) -> List[float]:
    how = meta.get("m")
    if how == "raw":
        n = _count(meta.get("n"))
        arr = _unpack_floats(take(), n)
        return arr.tolist()
    e = meta.get("e")
    if not isinstance(e, int) or not -1100 < e < 1100:
        raise ValueError("bad float scale")
    ints = _dec_ints(meta, take)
    if how == "dec":
        return list(map(truediv, ints, repeat(10 ** e))) if e >= 0 else list(map(float, ints))
    if how == "bin":
        return list(map(math.ldexp, ints, repeat(-e)))
    raise ValueError("unknown float encoding")


def _unpack_floats(data: bytes, n: int) -> array:
    if len(data) != 8 * n:
        raise ValueError("float part of the wrong length")
    out = bytearray(8 * n)
    for i in range(8):
        out[i::8] = data[i * n:(i + 1) * n]
    arr = array("d")
    arr.frombytes(bytes(out))
    if _SWAP:
        arr.byteswap()
    return arr


# -- columns ------------------------------------------------------------------------------------------------------


def _tag(v: Any) -> int:
    t = type(v)
    if t is float:
        return FLOAT if math.isfinite(v) else JSON
    if t is int:
        return INT if -_BIG < v < _BIG else JSON
    if t is str:
        return STR
    if v is None:
        return NULL
    if t is bool:
        return TRUE if v else FALSE
    return JSON


def _uniform_tag(vals: List[Any]) -> Optional[int]:
    """The one tag of every value, found without a Python loop where the types are uniform; None when mixed."""
    kinds = set(map(type, vals))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind is int:
        return INT if -_BIG < min(vals) and max(vals) < _BIG else None
    if kind is float:
        return FLOAT if all(map(math.isfinite, vals)) else None
    if kind is str:
        return STR
    if kind is type(None):
        return NULL
    return None


def _enc_dict(vals: List[Any], parts: List[bytes], as_json: bool) -> Dict[str, Any]:
    index: Dict[Any, int] = {}
    if as_json:
        vals = [json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in vals]
    codes = [index.setdefault(v, len(index)) for v in vals]
    parts.append(json.dumps(list(index), separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    return {"codes": _enc_ints(codes, parts)}


def _dec_dict(meta: Dict[str, Any], take, as_json: bool) -> List[Any]:
    words = json.loads(take())
    if not isinstance(words, list):
        raise ValueError("bad dictionary")
    if as_json:
        words = [json.loads(w) if isinstance(w, str) else None for w in words]
    elif not all(isinstance(w, str) for w in words):
        raise ValueError("bad string dictionary")
    return [words[c] for c in _dec_ints(meta.get("codes") or {}, take)]


def encode_column(values: List[Any]) -> Tuple[Dict[str, Any], bytes]:
    """One column's values (:data:`ABSENT` where a row lacks the key) as ``(meta, zlib bytes)``."""
    parts: List[bytes] = []
    meta: Dict[str, Any] = {}
    vals = values
    if ABSENT in values:
        flags = [v is not ABSENT for v in values]
        parts.append(bytes(flags))
        meta["pres"] = 1
        vals = [v for v in values if v is not ABSENT]
    tag = _uniform_tag(vals) if vals else NULL
    if tag is None:
        tags = list(map(_tag, vals))
        if len(set(tags)) == 1:
            tag = tags[0]
        else:
            parts.append(bytes(tags))
            meta["tags"] = 1
            for t in sorted(set(tags) & {INT, FLOAT, STR, JSON}):
                meta[str(t)] = _enc_values(t, [v for v, k in zip(vals, tags) if k == t], parts)
    if tag is not None:
        meta["t"] = tag
        if tag in (INT, FLOAT, STR, JSON):
            meta[str(tag)] = _enc_values(tag, vals, parts)
        elif tag in (NULL, TRUE, FALSE):
            meta["n"] = len(vals)
    meta["parts"] = [len(p) for p in parts]
    return meta, zlib.compress(b"".join(parts), LEVEL)


def _enc_values(tag: int, vals: List[Any], parts: List[bytes]) -> Dict[str, Any]:
    if tag == INT:
        return _enc_ints(vals, parts)
    if tag == FLOAT:
        return _enc_floats(vals, parts)
    return _enc_dict(vals, parts, tag == JSON)


_CONST = {NULL: None, TRUE: True, FALSE: False}


def decode_column(meta: Dict[str, Any], chunk: bytes, n: int) -> List[Any]:
    """The values of a column of ``n`` rows (:data:`ABSENT` where a row lacks it). Raises ValueError when damaged."""
    data = _inflate(chunk)
    sizes = meta.get("parts")
    if not isinstance(sizes, list) or sum(s for s in sizes if isinstance(s, int) and s >= 0) != len(data):
        raise ValueError("column parts do not add up")
    pos = [0, 0]

    def take() -> bytes:
        i = pos[1]
        if i >= len(sizes):
            raise ValueError("a column part is missing")
        start = pos[0]
        pos[0], pos[1] = start + sizes[i], i + 1
        return data[start:pos[0]]

    flags = take() if meta.get("pres") else None
    count = n if flags is None else sum(flags)
    if flags is not None and len(flags) != n:
        raise ValueError("presence of the wrong length")
    if meta.get("tags"):
        tags = take()
        if len(tags) != count:
            raise ValueError("tags of the wrong length")
        streams = {t: iter(_dec_values(t, meta.get(str(t)) or {}, take))
                   for t in sorted(set(tags) & {INT, FLOAT, STR, JSON})}
        vals = [next(streams[t]) if t in streams else _CONST.get(t) for t in tags]
    else:
        tag = meta.get("t")
        if tag in _CONST:
            vals = [_CONST[tag]] * count
        elif tag in (INT, FLOAT, STR, JSON):
            vals = _dec_values(tag, meta.get(str(tag)) or {}, take)
        else:
            raise ValueError("unknown value kind")
    if len(vals) != count:
        raise ValueError("values of the wrong count")
    if flags is None:
        return vals
    it = iter(vals)
    return [next(it) if f else ABSENT for f in flags]


def _dec_values(tag: int, meta: Dict[str, Any], take) -> List[Any]:
    if tag == INT:
        return _dec_ints(meta, take)
    if tag == FLOAT:
        return _dec_floats(meta, take)
    return _dec_dict(meta, take, tag == JSON)


def _inflate(chunk: bytes) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(chunk, MAX_PART)
    except zlib.error:
        raise ValueError("compressed part is corrupt") from None
    if d.unconsumed_tail or not d.eof:
        raise ValueError("compressed part truncated or too large")
    return out


def _count(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_PART:
        raise ValueError("bad count")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not -(1 << 64) < v < 1 << 64:
        raise ValueError("bad integer")
    return v


# -- row groups ---------------------------------------------------------------------------------------------------


def encode_group(block: Block, index: Optional[List[int]] = None) -> bytes:
    """A row group: the block's columns (and ``index``: each row's number in its segment, for samples)."""
    metas, chunks = [], []
    for path, values in block.cols.items():
        meta, chunk = encode_column(values)
        meta["p"] = list(path)
        meta["z"] = len(chunk)
        metas.append(meta)
        chunks.append(chunk)
    head: Dict[str, Any] = {"rows": block.n, "cols": metas, "shapes": [[list(p) for p in s] for s in block.shapes]}
    for name, ints in (("shape", block.shape_of), ("index", index)):
        if ints is not None:
            meta, chunk = encode_column(ints)
            meta["z"] = len(chunk)
            head[name] = meta
            chunks.append(chunk)
    text = zlib.compress(json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), LEVEL)
    return len(text).to_bytes(4, "little") + text + b"".join(chunks)


def decode_group(data: bytes, skip: frozenset = frozenset()) -> Tuple[Block, Optional[List[int]]]:
    """A row group's block (without the columns of the paths in ``skip``) and its row index."""
    if len(data) < 4:
        raise ValueError("row group too short")
    size = int.from_bytes(data[:4], "little")
    head = json.loads(_inflate(data[4:4 + size]))
    if not isinstance(head, dict):
        raise ValueError("row group head is not an object")
    n = _count(head.get("rows"))
    pos = 4 + size
    cols: Dict[Path, List[Any]] = {}
    metas = head.get("cols")
    if not isinstance(metas, list):
        raise ValueError("row group has no columns")
    for meta in metas:
        z = _count(meta.get("z")) if isinstance(meta, dict) else -1
        path = tuple(meta.get("p") or ())
        if not path or not all(isinstance(k, str) for k in path):
            raise ValueError("bad column path")
        chunk = data[pos:pos + z]
        pos += z
        if path not in skip:
            cols[path] = decode_column(meta, chunk, n)
    extra = {}
    for name in ("shape", "index"):
        meta = head.get(name)
        if isinstance(meta, dict):
            z = _count(meta.get("z"))
            extra[name] = decode_column(meta, data[pos:pos + z], n)
            pos += z
    if pos != len(data):
        raise ValueError("row group length does not add up")
    shapes = [tuple(tuple(p) for p in s) for s in head.get("shapes") or [[]]]
    return Block(n, cols, shapes, extra.get("shape")), extra.get("index")


# -- statistics and the sample ------------------------------------------------------------------------------------


def column_stats(block: Block) -> List[List[Any]]:
    """``[path, {n, min, max, sum, min_at, max_at}]`` per column with numbers (``*_at``: ``[step, t]`` of the first
    row holding it)."""
    steps, times = block.cols.get(("step",)), block.cols.get(("t",))
    out = []
    for path, values in block.cols.items():
        kinds = set(map(type, values))
        if kinds <= {int, float}:
            nums, rows = values, None
        elif kinds & {int, float}:
            rows = [i for i, v in enumerate(values) if type(v) in (int, float) and (type(v) is int or math.isfinite(v))]
            nums = [values[i] for i in rows]
        else:
            continue
        if rows is None and float in kinds and not all(map(math.isfinite, nums)):
            rows = [i for i, v in enumerate(values) if type(v) is int or math.isfinite(v)]
            nums = [values[i] for i in rows]
        if not nums:
            continue
        lo, hi = min(nums), max(nums)
        if not (-_BIG < lo and hi < _BIG):
            continue
        i_lo, i_hi = nums.index(lo), nums.index(hi)
        if rows is not None:
            i_lo, i_hi = rows[i_lo], rows[i_hi]
        out.append([list(path), {"n": len(nums), "min": lo, "max": hi, "sum": math.fsum(nums),
                                 "min_at": _at(steps, times, i_lo), "max_at": _at(steps, times, i_hi)}])
    return out


def _at(steps: Optional[List[Any]], times: Optional[List[Any]], i: int) -> List[Any]:
    def num(col: Optional[List[Any]]) -> Any:
        v = col[i] if col is not None else None
        return v if type(v) in (int, float) and math.isfinite(v) else None
    return [num(steps), num(times)]


def sample_rows(block: Block, others: Sequence[Tuple[int, bytes]], every: int = SAMPLE_EVERY) -> List[int]:
    """The rows of the sample of stride ``every``: steps that are multiples of it, the first :data:`HEAD_ROWS`, the
    row before and after each other record (the step that held a save, the first one after it), and the last row
    (the rank's newest step, when the segment is its last)."""
    steps = block.cols.get(("step",)) or []
    picked = {i for i, s in enumerate(steps) if type(s) is int and s % every == 0}
    picked.update(range(min(HEAD_ROWS, block.n)))
    for pos, _ in others:
        picked.update(i for i in (pos - 1, pos) if 0 <= i < block.n)
    if block.n:
        picked.add(block.n - 1)
    return sorted(picked)


def sample_levels(block: Block) -> List[int]:
    """The strides of a segment's samples: :data:`SAMPLE_EVERY`, then each twice the last while that level holds at
    least :data:`MIN_LEVEL_ROWS` steps that are multiples of it (a reading at a coarser stride takes the coarsest)."""
    steps = [s for s in block.cols.get(("step",)) or [] if type(s) is int and s % SAMPLE_EVERY == 0]
    levels = [SAMPLE_EVERY]
    while sum(1 for s in steps if s % (2 * levels[-1]) == 0) >= MIN_LEVEL_ROWS:
        levels.append(2 * levels[-1])
    return levels


# -- files ----------------------------------------------------------------------------------------------------------


def encode(seg: Segment) -> bytes:
    """The bytes of a segment file."""
    block = seg.rows
    parts: List[Tuple[str, bytes, Dict[str, Any]]] = []
    pos_z = zlib.compress(json.dumps([p for p, _ in seg.others]).encode("ascii"), LEVEL)
    lines_z = zlib.compress(b"\n".join(line for _, line in seg.others), LEVEL)
    parts.append(("events", len(pos_z).to_bytes(4, "little") + pos_z + lines_z, {"records": len(seg.others)}))
    for every in sample_levels(block):
        chosen = sample_rows(block, seg.others, every)
        parts.append(("sample", encode_group(block.take(chosen), chosen), {"rows": len(chosen), "every": every}))
    tail = list(range(max(0, block.n - TAIL_ROWS), block.n))
    parts.append(("tail", encode_group(block.take(tail), tail), {"rows": len(tail)}))
    for start in range(0, block.n, GROUP_ROWS):
        rows = list(range(start, min(start + GROUP_ROWS, block.n)))
        sub = block if start == 0 and len(rows) == block.n else block.take(rows)
        parts.append(("rows", encode_group(sub), {"first": start, "rows": len(rows)}))
    frames, offset = [], 0
    for kind, data, extra in parts:
        frames.append({"kind": kind, "at": offset, "len": len(data), "crc": zlib.crc32(data), **extra})
        offset += len(data)
    head = {"schema": SCHEMA, "rank": seg.rank, "segment": seg.seq, "last": seg.last, "rows": block.n,
            "records": block.n + len(seg.others), "sample_every": SAMPLE_EVERY, "source": seg.source,
            "stats": column_stats(block), "frames": frames, "body": offset}
    text = zlib.compress(json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), LEVEL)
    return (MAGIC + len(text).to_bytes(4, "little") + zlib.crc32(text).to_bytes(4, "little") + text
            + b"".join(data for _, data, _ in parts))


PREAMBLE = len(MAGIC) + 8


def parse_head(data: bytes) -> Tuple[Dict[str, Any], int]:
    """The head of a segment file from its first bytes, and where its body starts. Raises :class:`Damaged`."""
    if len(data) < PREAMBLE or data[:len(MAGIC)] != MAGIC:
        raise Damaged(0, "not a segment file" if len(data) >= len(MAGIC) else "truncated before its head")
    size = int.from_bytes(data[8:12], "little")
    crc = int.from_bytes(data[12:16], "little")
    if size > MAX_HEAD:
        raise Damaged(8, "its head claims more than 4 MiB")
    text = data[PREAMBLE:PREAMBLE + size]
    if len(text) < size:
        raise Damaged(len(data), "truncated inside its head")
    if zlib.crc32(text) != crc:
        raise Damaged(PREAMBLE, "its head does not match its checksum")
    try:
        head = json.loads(_inflate(text))
    except (ValueError, RecursionError, zlib.error):
        raise Damaged(PREAMBLE, "its head is not readable") from None
    if not isinstance(head, dict) or not isinstance(head.get("frames"), list):
        raise Damaged(PREAMBLE, f"not a {SCHEMA} head")
    if head.get("schema") not in SCHEMAS:
        raise Damaged(PREAMBLE, f"its head is of schema {str(head.get('schema'))[:40]!r}, not one this zeropilot "
                                f"reads ({', '.join(SCHEMAS)})")
    for f in head["frames"]:
        if not (isinstance(f, dict) and f.get("kind") in ("events", "sample", "tail", "rows")
                and all(isinstance(f.get(k), int) and not isinstance(f.get(k), bool) and f[k] >= 0
                        for k in ("at", "len", "crc"))):
            raise Damaged(PREAMBLE, "its head lists a part it cannot describe")
    return head, PREAMBLE + size


def frame(data: bytes, body: int, f: Dict[str, Any]) -> bytes:
    """A part's bytes (``data`` holds the file from byte 0 at least up to the part), checked against its CRC."""
    start = body + f["at"]
    chunk = data[start:start + f["len"]]
    if len(chunk) < f["len"]:
        raise Damaged(start + len(chunk), f"truncated in its {part_name(f)}")
    if zlib.crc32(chunk) != f["crc"]:
        raise Damaged(start, f"its {part_name(f)} does not match its checksum")
    return chunk


def part_name(f: Dict[str, Any]) -> str:
    if f["kind"] == "rows":
        first, rows = f.get("first"), f.get("rows")
        if isinstance(first, int) and isinstance(rows, int):
            return f"rows {first}-{first + rows - 1}"
    return f"{f['kind']} part"


def decode_events(chunk: bytes) -> List[Tuple[int, bytes]]:
    """The ``events`` part: ``(position, line)`` of each record that is not a step row. Raises ValueError."""
    size = int.from_bytes(chunk[:4], "little")
    positions = json.loads(_inflate(chunk[4:4 + size]))
    lines = _inflate(chunk[4 + size:])
    if not isinstance(positions, list) or not all(type(p) is int and p >= 0 for p in positions):
        raise ValueError("bad event positions")
    split = lines.split(b"\n") if positions else []
    if len(split) != len(positions):
        raise ValueError("events and positions differ")
    return list(zip(positions, split))


def records(block: Block, others: Sequence[Tuple[int, bytes]]) -> Iterator[Dict[str, Any]]:
    """Every record of a segment in its order: step rows rebuilt with their keys in order, the other records as
    their lines read."""
    cols = block.cols
    shape_of = block.shape_of
    oi = 0
    for i in range(block.n + 1):
        while oi < len(others) and others[oi][0] <= i:
            try:
                rec = _decode(others[oi][1].decode("utf-8"))
            except (ValueError, RecursionError):
                rec = None
            if isinstance(rec, dict):
                yield rec
            oi += 1
        if i == block.n:
            break
        shape = block.shapes[shape_of[i] if shape_of is not None else 0]
        rec = {}
        for path in shape:
            d = rec
            for key in path[:-1]:
                d = d.setdefault(key, {})
            d[path[-1]] = cols[path][i]
        yield rec
