"""Reading a reassembled TCP stream through its piece map, for the framing kernels.

:mod:`.reassembly` describes each direction's byte stream as pieces sorted by stream start:
``p_start`` (stream position of the piece's first byte), ``p_avail`` (stream position just past its
last *captured* byte) and ``p_off`` (file offset of its first byte in ``buf``); ``lo``/``hi`` bound
one direction's pieces. These kernels read stream bytes by stream position, every byte checked: a
byte in a hole or past a snapshot length reads as missing, never as a neighbour's byte. Shared by
:mod:`.framing` (every framing) and :mod:`.framing_http` (the HTTP framing's kernels).
"""
from __future__ import annotations

import numpy as np

from ..jit import njit


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def locate(p_start, lo, hi, x):
    """Largest k in [lo, hi) with p_start[k] <= x, or lo - 1."""
    a, b = lo, hi
    while a < b:
        m = (a + b) // 2
        if p_start[m] <= x:
            a = m + 1
        else:
            b = m
    return a - 1


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def byte_at(buf, p_start, p_avail, p_off, lo, hi, x):
    """The stream byte at position x, or -1 when it was not captured."""
    k = locate(p_start, lo, hi, x)
    if k < lo or x >= p_avail[k]:
        return -1
    return np.int64(buf[p_off[k] + (x - p_start[k])])


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def read_be(buf, p_start, p_avail, p_off, lo, hi, x, n):
    """n bytes at x as a big-endian integer, or -1 when any is missing."""
    v = np.int64(0)
    for k in range(n):
        b = byte_at(buf, p_start, p_avail, p_off, lo, hi, x + k)
        if b < 0:
            return -1
        v = (v << 8) | b
    return v


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def captured_until(p_start, p_avail, lo, hi, x, stop):
    """The first stream position in [x, stop) whose byte was not captured, or stop."""
    while x < stop:
        k = locate(p_start, lo, hi, x)
        if k < lo or x >= p_avail[k]:
            return x
        x = p_avail[k]
    return stop
