"""How stored JSON is kept on disk (SQLite) and in Redis: compact, and read back exactly.

A 100-token Response with k=5 alternatives is ~36 KB of JSON, nearly all of it logprobs: 600 entries
that each spell out `token`, `logprob`, `bytes` (a list of numbers) and a key per field. The same
information is a token table (each distinct byte string once), one index per entry, one float per
entry and one alternatives count per position. `encode` stores every Responses logprobs list of the
usual shape (`render_responses`: `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}` with `token` the bytes decoded as `render_responses` decodes them, and float logprobs) that
way, the rest of the value as JSON, and deflates the lot. The logprobs are float32 when every one of
the value's floats is exactly a float32 (what vLLM and llama.cpp send: their logprobs are float32
numbers printed in full), else as decimal units where every one has at most 3, 6 or 9 decimals,
else float64, so `decode(encode(v))` is `v` again, float for float, with the
same key order (`orjson.dumps` of both is the same bytes). A list of any other shape is kept as JSON.

The columns are found by one compiled pass over the bytes (`_fastpath.store_columns`, ~0.1 ms for that
Response) where the C extension is built, else by `columns` here, its twin (two `re` passes, ~2 ms):
the same parts, byte for byte, which tests/test_store_codec.py holds over rendered Responses and
adversarial JSON. A value written before this format (plain JSON: it starts with `{` or `[`) is read
as it is.
"""

from __future__ import annotations

import itertools
import re
import struct
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.logprobs.compiled import fastpath

MAGIC = b"RGC1"  # never the first bytes of JSON
# zlib's fastest level: a 100-token k=5 Response deflates to ~7.1 KB (6.9 KB at 6, the default) in a
# quarter of the time (~80 us against ~300 us), and 8 KB is the target.
LEVEL = 1
# At that level ISA-L's deflate writes the same zlib format (stdlib zlib reads it back) ~3x faster than
# zlib 1.2: ~38 against ~109 us for that Response's 9.3 KB of columns, 6.1 against 5.9 KB out. It is a
# dependency; where it has no wheel and was not built, zlib does the same job.
try:
    from isal.isal_zlib import compress as _fast_compress
except ImportError:
    _fast_compress = None


def _deflate(data: bytes, level: int) -> bytes:
    """zlib-format deflate; the default LEVEL by ISA-L where installed (both release the GIL)."""
    if level == LEVEL and _fast_compress is not None:
        return _fast_compress(data, 1)
    return zlib.compress(data, level)

_HEADER = struct.Struct("<IIIIIIB")  # lengths: skeleton, table, list lengths, counts, indices, floats; float kind

# The JSON orjson writes for a Responses logprobs list of the usual shape (render_responses). A quote
# inside a JSON string is escaped, so `"logprobs":[{"token":` never matches inside one.
_STR = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_NUM = rb"-?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)"  # a float as orjson writes it (an int has neither . nor e)
_BYTES = rb"\[(?:\d+(?:,\d+)*)?\]"
_TOP = rb'\{"token":' + _STR + rb',"logprob":' + _NUM + rb',"bytes":' + _BYTES + rb"\}"
_ENTRY = (rb'\{"token":' + _STR + rb',"logprob":' + _NUM + rb',"bytes":' + _BYTES + rb',"top_logprobs":\[(?:'
          + _TOP + rb"(?:," + _TOP + rb")*)?\]\}")
# Only a key named `logprobs` (after `{` or `,`): a key that ends in an escaped quote and `logprobs`
# (`"a\"logprobs":[`) is some other key.
_LIST = re.compile(rb'(?<=[{,])"logprobs":\[(' + _ENTRY + rb"(?:," + _ENTRY + rb")*)\]")
# Each entry and each alternative, in order; the 4th group is set for an entry (its alternatives follow).
_ITEM = re.compile(rb'\{"token":(' + _STR + rb'),"logprob":(' + _NUM + rb'),"bytes":\[([\d,]*)\](,"top)?')
_INT_LOGPROBS = re.compile(rb'"logprobs":-?\d')  # would read back as a stripped list: then nothing is stripped
# (getattr: an extension built before the scanner existed, e.g. a tree rebased but not rebuilt, runs the twin)
_compiled_columns = getattr(fastpath, "store_columns", None)


class _Columns:
    def __init__(self) -> None:
        self.table: dict[tuple[bytes, bytes], int] = {}  # (token JSON, byte values text) -> index
        self.data: list[bytes] = []  # the table's byte strings, by index
        self.list_lengths: list[int] = []
        self.top_counts: list[int] = []
        self.indices: list[int] = []
        self.numbers: list[bytes] = []

    def _add(self, keys: list[tuple[bytes, bytes]]) -> None:
        """Put new (token JSON, byte values text) keys in the table, checked all at once (C-level calls):
        ValueError unless each token is its bytes as render_responses spells them, each list canonical."""
        listed = b"[[" + b"],[".join([text for _, text in keys]) + b"]]"
        values = orjson.loads(listed)
        if orjson.dumps(values) != listed:
            raise ValueError("not the usual entry")
        data = list(map(bytes, values))  # ValueError past 255, TypeError for a non-int
        tokens = b"[" + b",".join([token for token, _ in keys]) + b"]"
        if orjson.dumps([piece.decode("utf-8", "backslashreplace") for piece in data]) != tokens:
            raise ValueError("not the usual entry")
        start = len(self.data)
        self.table.update(zip(keys, range(start, start + len(keys)), strict=True))
        self.data += data

    def take(self, match: re.Match[bytes]) -> bytes:
        """The list's columns appended; its place in the skeleton (`"logprobs":N`)."""
        items = _ITEM.findall(match.group(1))
        keys = [(token, text) for token, _, text, _ in items]
        table = self.table
        try:
            new = [key for key in dict.fromkeys(keys) if key not in table]
            if new:
                self._add(new)
        except (ValueError, TypeError, orjson.JSONDecodeError):
            return match.group(0)
        heads = [position for position, item in enumerate(items) if item[3]]
        if not heads or heads[0] != 0:
            return match.group(0)
        self.indices += map(table.__getitem__, keys)
        self.numbers += [number for _, number, _, _ in items]
        heads.append(len(items))
        self.top_counts += [after - before - 1 for before, after in itertools.pairwise(heads)]
        self.list_lengths.append(len(heads) - 1)
        return b'"logprobs":%d' % (len(self.list_lengths) - 1)


# A logprobs list of a value to encode, as the server holds it: the Fragment of its JSON that the value
# holds, the TokenBatch it was rendered from (`render_json(k)`), and k.
LogprobList = tuple[orjson.Fragment, Any, int]


Parts = tuple[bytes, bytes, bytes, bytes, bytes, bytes, int]


def encode(value: Any, level: int = LEVEL, *, lists: Sequence[LogprobList] = ()) -> bytes:
    """`value` (JSON bytes as orjson writes them, or a JSON value) in the compact form.

    `lists`: the value's logprobs lists that were rendered from a TokenBatch, when the caller has them: the
    columns are then taken from the batch (`TokenBatch.store_columns`), not found again in the list's JSON
    (no ~0.45 MB dump of a 1,000-token list to scan), with the same result byte for byte."""
    return pack(*columns_of(value, lists=lists), level)


def columns_of(value: Any, *, lists: Sequence[LogprobList] = ()) -> tuple[bytes, Parts | None]:
    """`encode`'s first step, the one that reads the value: (its JSON, or the skeleton, and the parts; None:
    kept as JSON). `pack` of it is the second, which reads only bytes (the store's writer thread runs it,
    zlib letting the event loop run meanwhile)."""
    if len(lists) == 1 and not isinstance(value, bytes):
        found = _columns_from_batch(value, lists[0])
        if found is not None:
            return found
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    parts = _compiled_columns(raw) if _compiled_columns is not None else None
    if parts is None:
        parts = columns(raw)
    return (raw, None) if parts is None else (parts[0], parts)  # the JSON itself only when kept as JSON


_FIRST_LIST = orjson.Fragment(b"0")  # where the skeleton names the value's first (here only) list


def _columns_from_batch(value: Any, source: LogprobList) -> tuple[bytes, Parts] | None:
    """columns_of(value) when its one logprobs list is `source`'s Fragment; None when it is not that case (no
    compiled batch, an empty list, the Fragment not in the value, or another `"logprobs":` key in it)."""
    fragment, batch, k = source
    store_columns = getattr(batch, "store_columns", None)
    skeleton_value = _replaced(value, fragment)
    if store_columns is None or skeleton_value is _NOT_FOUND:
        return None
    found = store_columns(k)
    if found is None:
        return None
    skeleton = orjson.dumps(skeleton_value)
    if skeleton.count(b'"logprobs":') != 1:  # another list (or number) the scanner would have had to read
        return None
    table, list_lengths, counts, indices, floats, kind = found
    return skeleton, (skeleton, table, list_lengths, counts, indices, floats, kind)


_NOT_FOUND: Any = object()


def _replaced(value: Any, fragment: orjson.Fragment) -> Any:
    """`value` (not changed) copied along the path to `fragment` (found by identity), which becomes
    `_FIRST_LIST`; _NOT_FOUND when it is not there."""
    if value is fragment:
        return _FIRST_LIST
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is dict or type(item) is list or item is fragment:
                found = _replaced(item, fragment)
                if found is not _NOT_FOUND:
                    return {**value, key: found}
    elif type(value) is list:
        for index, item in enumerate(value):
            if type(item) is dict or type(item) is list or item is fragment:
                found = _replaced(item, fragment)
                if found is not _NOT_FOUND:
                    return [*value[:index], found, *value[index + 1:]]
    return _NOT_FOUND


def columns(raw: bytes) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, int] | None:
    """The parts of raw's compact form (skeleton, table, list lengths, alternatives counts, indices,
    floats) and the float kind; None when it is to be kept as JSON. The pure-Python twin of
    `_fastpath.store_columns`, which returns the same or None (then this decides)."""
    table = _Columns()
    skeleton = raw if _INT_LOGPROBS.search(raw) else _LIST.sub(table.take, raw)
    floats, kind = _floats(list(map(float, table.numbers)))
    try:
        counts = array("B", table.top_counts)
    except OverflowError:  # more than 255 alternatives somewhere
        return None
    return (skeleton, orjson.dumps([_plain(data) for data in table.data]), array("I", table.list_lengths).tobytes(),
            counts.tobytes(), array("I", table.indices).tobytes(), floats.tobytes(), kind)


# In a float kind's byte: the indices column is stored in byte planes (every index's lowest byte, then
# every second byte, ...). Indices point into a table of at most a few thousand entries, so their high
# planes are zeros that deflate to nearly nothing: a 100-token k=5 Response 6.1 -> 5.6 KB (ISA-L).
_PLANED = 0x80


def _planes(data: bytes) -> bytes:
    return b"".join([data[0::4], data[1::4], data[2::4], data[3::4]])


def _unplaned(data: memoryview) -> bytearray:
    out = bytearray(len(data))
    size = len(data) // 4
    for plane in range(4):
        out[plane::4] = data[plane * size:(plane + 1) * size]
    return out


# A value kept as JSON and shorter than this is stored as it is: deflate saves ~30 of ~200 bytes of a
# usual input-items list, and building its Huffman tables is most of what the save's deflating costs
# beside the Response's (~50k of ~380k instructions). `decode` reads plain JSON as it always has.
PLAIN_BELOW = 256


def pack(raw: bytes, parts: Parts | None, level: int = LEVEL) -> bytes:
    """The compact form of `raw` from its `columns` (None: raw kept as JSON; else raw is not read), deflated
    (a short JSON value, PLAIN_BELOW, is kept as it is)."""
    if parts is None or not parts[2]:  # kept as JSON, or no list found: then the skeleton is the JSON
        plain = raw if parts is None else parts[0]
        if len(plain) < PLAIN_BELOW and plain[:1] in (b"{", b"["):
            return plain
        if parts is None:
            return encode_plain(raw, level)
    skeleton, table, list_lengths, counts, indices, floats, kind = parts
    data = (skeleton, table, list_lengths, counts, _planes(indices), floats)
    header = _HEADER.pack(*(len(part) for part in data), kind | _PLANED)
    return MAGIC + _deflate(header + b"".join(data), level)


def _floats(values: list[float]) -> tuple[array[Any], int]:
    """The values as float32 (kind 4) when each is exactly one (what vLLM and llama.cpp send); else as
    integers in units of 10^-d (kind 16 + d: int32, 32 + d: int64) when each has at most d <= 9 decimal
    digits (what a server sends that prints them rounded: -0.573378); else as float64 (kind 8)."""
    floats = array("f", values)
    exact = array("d", values).tobytes()
    if array("d", floats).tobytes() == exact:  # (bytes compared: a -0.0 must stay one)
        return floats, 4
    for digits in (6, 3, 9):  # six first: what the simulator (and servers printing %f) send
        scale = 10.0 ** digits
        try:
            units = [round(value * scale) for value in values]
        except (OverflowError, ValueError):
            break
        if array("d", [unit / scale for unit in units]).tobytes() == exact:
            try:
                return array("i", units), 16 + digits
            except OverflowError:
                try:
                    return array("q", units), 32 + digits
                except OverflowError:
                    break
    return array("d", values), 8


def _values(kind: int, raw: memoryview) -> list[float]:
    if kind in (4, 8):
        floats = array("f" if kind == 4 else "d")
        floats.frombytes(raw)
        return floats.tolist()
    units = array("i" if kind < 32 else "q")
    units.frombytes(raw)
    scale = 10.0 ** (kind % 16)
    return [unit / scale for unit in units]


def encode_plain(raw: bytes, level: int = LEVEL) -> bytes:
    """JSON bytes deflated, with no columns (what `decode` reads as well)."""
    header = _HEADER.pack(len(raw), 2, 0, 0, 0, 0, 4)
    return MAGIC + _deflate(header + raw + b"[]", level)


def _plain(data: bytes) -> str | list[int]:
    """The table keeps a byte string as text when it is valid UTF-8 (shorter), else as its byte values."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def decode(blob: bytes) -> Any:
    """The value `encode` was given (or a plain JSON value written before this format)."""
    if not blob.startswith(MAGIC):
        return orjson.loads(blob)
    raw = memoryview(zlib.decompress(blob[len(MAGIC):]))
    *sizes, kind = _HEADER.unpack_from(raw)
    offset, parts = _HEADER.size, []
    for size in sizes:
        parts.append(raw[offset:offset + size])
        offset += size
    skeleton = orjson.loads(parts[0])
    if not sizes[2]:
        return skeleton
    table = [entry.encode() if type(entry) is str else bytes(entry) for entry in orjson.loads(parts[1])]
    rendered = [(data.decode("utf-8", "backslashreplace"), list(data)) for data in table]
    list_lengths, counts, indices = array("I"), array("B"), array("I")
    list_lengths.frombytes(parts[2])
    counts.frombytes(parts[3])
    indices.frombytes(_unplaned(parts[4]) if kind & _PLANED else parts[4])
    kind &= ~_PLANED
    values = _values(kind, parts[5])
    lists: list[list[dict[str, Any]]] = []
    at = position = 0
    for length in list_lengths:
        entries = []
        for count in counts[position:position + length]:
            token, data = rendered[indices[at]]
            top = []
            for j in range(at + 1, at + 1 + count):
                top_token, top_data = rendered[indices[j]]
                top.append({"token": top_token, "logprob": values[j], "bytes": list(top_data)})
            entries.append({"token": token, "logprob": values[at], "bytes": list(data), "top_logprobs": top})
            at += 1 + count
        position += length
        lists.append(entries)
    return _restore(skeleton, lists)


def _restore(value: Any, lists: list[list[dict[str, Any]]]) -> Any:
    if type(value) is dict:
        for key, item in value.items():
            if key == "logprobs" and type(item) is int:
                value[key] = lists[item]
            elif type(item) is dict or type(item) is list:
                _restore(item, lists)
    elif type(value) is list:
        for item in value:
            if type(item) is dict or type(item) is list:
                _restore(item, lists)
    return value
