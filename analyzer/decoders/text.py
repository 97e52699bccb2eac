"""Text columns out of Numba kernels: a byte arena plus (start, length) per row → a Polars String column.

Kernels cannot build Python strings cheaply, so a decoder writes each string's bytes into one uint8
arena and records where it starts and how long it is. :func:`arena_strings` turns that into an Arrow
string array without copying per row. Kernels must write valid UTF-8 (ASCII is simplest): use
:func:`put_escaped` for bytes from the wire, which copies printable ASCII and writes ``\\xNN`` for the
rest, the way Wireshark shows unprintable bytes in names.
"""
from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from ..columns import arrow_series
from ..jit import njit

HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)  # lower-case hex digits, for kernels that write hex into an arena


@njit(cache=True, _nrt=False)
def put_escaped(arena, pos, src, start, n):
    """Copy ``src[start:start+n]`` into ``arena`` at ``pos``, escaping bytes outside printable ASCII
    (and the backslash) as ``\\xNN``. Returns the new position, or -1 when the arena is full (a -1
    passed in stays -1, so calls can be chained)."""
    if pos < 0:
        return -1
    cap = arena.shape[0]
    for k in range(n):
        b = src[start + k]
        if 0x20 <= b < 0x7F and b != 0x5C:
            if pos >= cap:
                return -1
            arena[pos] = b
            pos += 1
        else:
            if pos + 4 > cap:
                return -1
            arena[pos] = 0x5C
            arena[pos + 1] = 0x78
            arena[pos + 2] = HEX_DIGITS[b >> 4]
            arena[pos + 3] = HEX_DIGITS[b & 15]
            pos += 4
    return pos


@njit(cache=True, _nrt=False)
def put_byte(arena, pos, b):
    """Append one byte (the caller guarantees it is ASCII). Returns the new position or -1 if full."""
    if pos < 0 or pos >= arena.shape[0]:
        return -1
    arena[pos] = b
    return pos + 1


def arena_strings(name: str, arena: np.ndarray, start: np.ndarray, length: np.ndarray,
                  valid: np.ndarray | None = None) -> pl.Series:
    """A String series whose row i is ``arena[start[i]:start[i]+length[i]]`` (null where not valid).

    Rows may share bytes or come in any order; the arena is compacted into row order first when they
    are not already laid out back to back.
    """
    n = len(start)
    start = np.asarray(start, np.int64)
    length = np.asarray(length, np.int64)
    if valid is None:
        valid = np.ones(n, np.bool_)
    length = np.where(valid, length, 0)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(length, out=offsets[1:])
    if n and not (np.all(start[valid] == offsets[:-1][valid])):
        data = np.empty(int(offsets[-1]), np.uint8)
        _gather(arena, start, length, offsets, data)
    else:
        data = arena[: int(offsets[-1])]
        if data.shape[0] < offsets[-1]:
            raise ValueError("arena_strings: rows run past the arena")
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if offsets[-1] >= _VIEW_OFFSET_LIMIT:  # more than a view's int32 offset reaches: Arrow's large_utf8
        array = pa.Array.from_buffers(pa.large_utf8(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])
        return arrow_series(name, array).cast(pl.String)
    # Polars' own layout (Arrow string views): imported without a copy. The views hold strings of at
    # most 12 bytes themselves; longer ones point into a buffer of their own (a view of a larger arena
    # would keep all of it alive), none when there are no long strings.
    views = np.zeros((n, 16), np.uint8)
    _string_views(data, offsets, length, views)
    long_bytes = np.ascontiguousarray(data) if (length > _VIEW_INLINE_BYTES).any() else np.zeros(0, np.uint8)
    if long_bytes.base is not None:
        long_bytes = long_bytes.copy()
    array = pa.Array.from_buffers(pa.string_view(), n, [bitmap, pa.py_buffer(views), pa.py_buffer(long_bytes)])
    return arrow_series(name, array)


_VIEW_INLINE_BYTES = 12  # Arrow string view: strings this short live in the 16-byte view
_VIEW_OFFSET_LIMIT = 1 << 31  # a view's offset into its buffer is an int32


@njit(cache=True)
def _string_views(data, offsets, length, views):
    """Arrow string views (Arrow's Utf8View, Polars' String) of rows ``data[offsets[i]:offsets[i] +
    length[i]]`` into the zeroed (rows, 16) ``views``: the length (int32, little-endian), then the bytes
    when at most 12, else their first 4, buffer 0 and the offset (int32). ``offsets`` is the running
    sum of ``length`` and ``data`` holds ``offsets[-1]`` bytes (the caller checks), so every read is
    inside it."""
    for i in range(length.shape[0]):
        n = length[i]
        if n <= 0:
            continue
        o = offsets[i]
        for j in range(4):
            views[i, j] = (n >> (8 * j)) & 0xFF
        if n <= 12:
            for j in range(n):
                views[i, 4 + j] = data[o + j]
        else:
            for j in range(4):
                views[i, 4 + j] = data[o + j]
                views[i, 12 + j] = (o >> (8 * j)) & 0xFF


@njit(cache=True)
def _gather(arena, start, length, offsets, out):
    for i in range(start.shape[0]):
        out[offsets[i]:offsets[i] + length[i]] = arena[start[i]:start[i] + length[i]]
