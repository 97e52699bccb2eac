"""TCP stream reassembly as a *piece map*: which file bytes make up each direction's byte stream.

Segments of one direction are taken in capture order. The first copy of every stream byte wins (as most
stacks keep the data they queued first); later copies of the same bytes are retransmissions, and when
their bytes differ from the first copy the overlap is counted as a conflict (an evasion or corruption
signal). Bytes never seen are holes; bytes beyond a segment's captured length (snapshot length) are
known to exist but are missing. Nothing is copied: a piece is (stream start, stream end, where its
captured bytes end, file offset, frame, time). The framing layer reads through the map.

Stream offsets count payload bytes from the first byte after the SYN (or, when the capture starts
mid-connection, from the first segment seen), unwrapped past 2**32.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..jit import njit

MAX_HOLES = 64  # holes tracked per direction; beyond that the oldest becomes a permanent gap

Pieces = namedtuple("Pieces", ["dir", "start", "end", "avail_end", "file_off", "frame", "ts"])
DirectionStats = namedtuple("DirectionStats", ["stream_end", "hole_bytes", "uncaptured_bytes",
                                               "duplicate_bytes", "conflict_bytes"])


@njit(cache=True, inline="always")
def _d(a, b):
    x = (np.int64(a) - np.int64(b)) & 0xFFFFFFFF
    return x - 0x100000000 if x >= 0x80000000 else x


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _compare(buf, a_off, b_off, n):
    diff = 0
    for k in range(n):
        if buf[a_off + k] != buf[b_off + k]:
            diff += 1
    return diff


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _find_piece(p_start, p_end, lo, hi, x):
    """Index of the piece among [lo, hi) (any order) that contains stream offset x, or -1."""
    for k in range(hi - 1, lo - 1, -1):
        if p_start[k] <= x < p_end[k]:
            return k
    return -1


@njit(cache=True)
def build_pieces(buf, dir_id, seq, syn, seglen, caplen, file_off, frame, ts, n_dirs):
    """Segments grouped by direction (``dir_id`` ascending, capture order inside a direction).

    Returns (pieces arrays ..., per-direction stats arrays). Every piece either extends the stream
    (one per segment) or fills part of a hole, and holes are created or split at most once per
    segment, so 3 pieces per segment bound the output.
    """
    n = seq.shape[0]
    cap = n * 3 + MAX_HOLES + 16
    p_dir = np.empty(cap, np.int64)
    p_start = np.empty(cap, np.int64)
    p_end = np.empty(cap, np.int64)
    p_avail = np.empty(cap, np.int64)
    p_off = np.empty(cap, np.int64)
    p_frame = np.empty(cap, np.int64)
    p_ts = np.empty(cap, np.int64)
    stream_end = np.zeros(n_dirs, np.int64)
    hole_bytes = np.zeros(n_dirs, np.int64)
    uncaptured = np.zeros(n_dirs, np.int64)
    dup_bytes = np.zeros(n_dirs, np.int64)
    conflict_bytes = np.zeros(n_dirs, np.int64)
    holes_lo = np.zeros(MAX_HOLES, np.int64)
    holes_hi = np.zeros(MAX_HOLES, np.int64)
    k = 0
    i = 0
    while i < n:
        d = dir_id[i]
        j = i
        while j < n and dir_id[j] == d:
            j += 1
        # direction [i, j): the stream origin
        base = np.int64(-1)
        for s in range(i, j):
            if syn[s]:
                base = (np.int64(seq[s]) + 1) & 0xFFFFFFFF
                break
            if seglen[s] > 0:
                base = np.int64(seq[s])
                break
        if base < 0:
            i = j
            continue
        dir_first_piece = k
        hi = np.int64(0)
        n_holes = 0
        last_seq = base
        last_rel = np.int64(0)
        for s in range(i, j):
            rel = last_rel + _d(seq[s], last_seq)
            last_seq = np.int64(seq[s])
            last_rel = rel
            if syn[s]:
                rel += 1  # the SYN occupies one sequence number before the data
            length = np.int64(seglen[s])
            if length <= 0:
                continue
            lo = rel
            end = rel + length
            got = np.int64(caplen[s])
            if lo < 0:  # bytes before the stream origin (e.g. data on a retransmitted SYN)
                cut = -lo
                if cut >= length:
                    continue
                lo = 0
                got = max(np.int64(0), got - cut)
                off0 = file_off[s] + cut
            else:
                off0 = file_off[s]
            avail_end = lo + min(got, end - lo)
            # bytes below hi: fill holes, count duplicates
            if lo < hi:
                top = min(end, hi)
                covered = top - lo
                h = 0
                while h < n_holes:
                    a = max(lo, holes_lo[h])
                    b = min(top, holes_hi[h])
                    if a < b:
                        covered -= b - a
                        p_dir[k] = d
                        p_start[k] = a
                        p_end[k] = b
                        p_avail[k] = min(b, max(a, avail_end))
                        p_off[k] = off0 + (a - lo)
                        p_frame[k] = frame[s]
                        p_ts[k] = ts[s]
                        k += 1
                        if a > holes_lo[h] and b < holes_hi[h]:  # split
                            if n_holes < MAX_HOLES:
                                holes_lo[n_holes] = b
                                holes_hi[n_holes] = holes_hi[h]
                                n_holes += 1
                            holes_hi[h] = a
                        elif a > holes_lo[h]:
                            holes_hi[h] = a
                        elif b < holes_hi[h]:
                            holes_lo[h] = b
                        else:  # filled: remove
                            n_holes -= 1
                            holes_lo[h] = holes_lo[n_holes]
                            holes_hi[h] = holes_hi[n_holes]
                            continue
                    h += 1
                dup_bytes[d] += covered
                # conflicts: compare captured duplicate bytes with the first copy where both exist
                x = lo
                while x < min(top, avail_end):
                    pk = _find_piece(p_start, p_end, dir_first_piece, k, x)
                    if pk < 0:
                        x += 1
                        continue
                    y = min(p_avail[pk], min(top, avail_end))
                    if y > x and p_frame[pk] != frame[s]:
                        conflict_bytes[d] += _compare(buf, p_off[pk] + (x - p_start[pk]), off0 + (x - lo), y - x)
                    x = max(y, p_end[pk]) if y <= x else y
            # bytes above hi: a hole first if the segment starts beyond hi
            if end > hi:
                a = max(lo, hi)
                if lo > hi:
                    if n_holes < MAX_HOLES:
                        holes_lo[n_holes] = hi
                        holes_hi[n_holes] = lo
                        n_holes += 1
                    else:
                        hole_bytes[d] += lo - hi  # untracked: a permanent gap
                p_dir[k] = d
                p_start[k] = a
                p_end[k] = end
                p_avail[k] = min(end, max(a, avail_end))
                p_off[k] = off0 + (a - lo)
                p_frame[k] = frame[s]
                p_ts[k] = ts[s]
                k += 1
                hi = end
            if k + MAX_HOLES + 2 >= cap:  # cannot happen with cap = 2n+16 unless holes split a lot
                break
        for h in range(n_holes):
            hole_bytes[d] += holes_hi[h] - holes_lo[h]
        for q in range(dir_first_piece, k):
            uncaptured[d] += p_end[q] - p_avail[q]
        stream_end[d] = hi
        i = j
    return (p_dir[:k], p_start[:k], p_end[:k], p_avail[:k], p_off[:k], p_frame[:k], p_ts[:k],
            stream_end, hole_bytes, uncaptured, dup_bytes, conflict_bytes)
