"""Reading integers from a uint8 buffer in either byte order. Callers check bounds first.

Every reader returns int64: Numba turns arithmetic that mixes signed and unsigned 64-bit integers
into float64, which silently loses nanoseconds.
"""
import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def u16be(buf, off):
    return (np.int64(buf[off]) << 8) | np.int64(buf[off + 1])


@njit(cache=True, inline="always")
def u16le(buf, off):
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@njit(cache=True, inline="always")
def u32be(buf, off):
    return ((np.int64(buf[off]) << 24) | (np.int64(buf[off + 1]) << 16)
            | (np.int64(buf[off + 2]) << 8) | np.int64(buf[off + 3]))


@njit(cache=True, inline="always")
def u32le(buf, off):
    return (np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)
            | (np.int64(buf[off + 2]) << 16) | (np.int64(buf[off + 3]) << 24))


@njit(cache=True, inline="always")
def u16(buf, off, big_endian):
    return u16be(buf, off) if big_endian else u16le(buf, off)


@njit(cache=True, inline="always")
def u32(buf, off, big_endian):
    return u32be(buf, off) if big_endian else u32le(buf, off)


@njit(cache=True, inline="always")
def u64(buf, off, big_endian):
    """As int64 (two's complement for values ≥ 2**63, which no timestamp reaches)."""
    if big_endian:
        return (u32be(buf, off) << 32) | u32be(buf, off + 4)
    return (u32le(buf, off + 4) << 32) | u32le(buf, off)


@njit(cache=True, inline="always")
def next_tcp_option(buf, p, end):
    """The TCP option at ``p`` (RFC 9293 §3.1): (kind, length, next position); kind -1 when the
    options end (EOL, or a malformed length that would run past ``end``). NOP has length 1."""
    if p >= end:
        return -1, 0, end
    kind = np.int64(buf[p])
    if kind == 0:
        return -1, 0, end
    if kind == 1:
        return 1, 1, p + 1
    if p + 1 >= end:
        return -1, 0, end
    olen = np.int64(buf[p + 1])
    if olen < 2 or p + olen > end:
        return -1, 0, end
    return kind, olen, p + olen
