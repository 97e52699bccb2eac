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
from numba import njit

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
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    array = pa.Array.from_buffers(pa.large_utf8(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pl.Series(name, pl.from_arrow(array)).cast(pl.String)


@njit(cache=True)
def _gather(arena, start, length, offsets, out):
    for i in range(start.shape[0]):
        out[offsets[i]:offsets[i] + length[i]] = arena[start[i]:start[i] + length[i]]
