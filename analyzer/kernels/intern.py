"""Address interning: 128-bit addresses → dense uint32 ids, first-seen order.

An open-addressing hash table (linear probing, load ≤ 1/2) lives across chunks in an
:class:`AddressTable`; a kernel stops when the table is full and the Python side doubles it and calls
again, so the table's size follows the addresses seen.
IPv4 addresses are keyed as IPv4-mapped IPv6 plus their family, so ``::ffff:1.2.3.4`` seen as IPv6
stays distinct from 1.2.3.4.
"""
import socket
from collections import namedtuple

import numpy as np

from ..jit import njit

_EMPTY = np.uint32(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _slot(hi, lo, fam, mask):
    h = (hi * np.uint64(0x9E3779B97F4A7C15)) ^ (lo * np.uint64(0xC2B2AE3D27D4EB4F)) ^ np.uint64(fam)
    h ^= h >> np.uint64(29)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _insert(hi, lo, fam, slots, addr_hi, addr_lo, addr_fam, count):
    """Id of (hi, lo, fam), adding it if new. ``count`` is a 1-element array: ids handed out."""
    mask = slots.shape[0] - 1
    s = _slot(hi, lo, fam, mask)
    while True:
        ident = slots[s]
        if ident == _EMPTY:
            ident = np.uint32(count[0])
            slots[s] = ident
            addr_hi[ident] = hi
            addr_lo[ident] = lo
            addr_fam[ident] = fam
            count[0] += 1
            return ident
        if addr_hi[ident] == hi and addr_lo[ident] == lo and addr_fam[ident] == fam:
            return ident
        s = (s + 1) & mask


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def intern_pairs(hi, lo, fam, start, n, slots, addr_hi, addr_lo, addr_fam, count, out_ids):
    """Intern addresses ``start``..``n - 1``; rows with family 0 (no address) get id 0xFFFFFFFF.
    Returns the row it stopped at: ``n``, or an earlier row when the table is full (grow it and go on
    from there).

    Conversations alternate between two addresses, so the last two ids are checked before hashing."""
    last_a = _EMPTY
    last_b = _EMPTY
    room = addr_hi.shape[0]
    for i in range(start, n):
        f = fam[i]
        if f == 0:
            out_ids[i] = _EMPTY
            continue
        if count[0] + 1 > room:
            return i
        h, l = hi[i], lo[i]
        if last_a != _EMPTY and addr_lo[last_a] == l and addr_hi[last_a] == h and addr_fam[last_a] == f:
            ident = last_a
        elif last_b != _EMPTY and addr_lo[last_b] == l and addr_hi[last_b] == h and addr_fam[last_b] == f:
            ident = last_b
        else:
            ident = _insert(h, l, f, slots, addr_hi, addr_lo, addr_fam, count)
        out_ids[i] = ident
        if ident != last_a:
            last_b = last_a
            last_a = ident
    return n


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def intern_both_kernel(src_hi, src_lo, dst_hi, dst_lo, fam, start, n, slots, addr_hi, addr_lo, addr_fam, count,
                       src_ids, dst_ids):
    """:func:`intern_pairs` for the source and the destination of rows ``start``..``n - 1``."""
    last_a = _EMPTY
    last_b = _EMPTY
    room = addr_hi.shape[0]
    for i in range(start, n):
        f = fam[i]
        if f == 0:
            src_ids[i] = _EMPTY
            dst_ids[i] = _EMPTY
            continue
        if count[0] + 2 > room:
            return i
        for side in range(2):
            h = src_hi[i] if side == 0 else dst_hi[i]
            lo = src_lo[i] if side == 0 else dst_lo[i]
            if last_a != _EMPTY and addr_lo[last_a] == lo and addr_hi[last_a] == h and addr_fam[last_a] == f:
                ident = last_a
            elif last_b != _EMPTY and addr_lo[last_b] == lo and addr_hi[last_b] == h and addr_fam[last_b] == f:
                ident = last_b
            else:
                ident = _insert(h, lo, f, slots, addr_hi, addr_lo, addr_fam, count)
            if side == 0:
                src_ids[i] = ident
            else:
                dst_ids[i] = ident
            if ident != last_a:
                last_b = last_a
                last_a = ident
    return n


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _rehash(slots, addr_hi, addr_lo, addr_fam, count):
    mask = slots.shape[0] - 1
    for ident in range(count):
        s = _slot(addr_hi[ident], addr_lo[ident], addr_fam[ident], mask)
        while slots[s] != _EMPTY:
            s = (s + 1) & mask
        slots[s] = ident


TableArrays = namedtuple("TableArrays", ["slots", "addr_hi", "addr_lo", "addr_fam", "count"])


class AddressTable:
    """Unique addresses of one capture, their ids and their text."""

    def __init__(self, capacity: int = 1024):
        self.count = np.zeros(1, np.int64)
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        size = 1 << max(10, int(capacity - 1).bit_length())
        old = (getattr(self, "addr_hi", None), getattr(self, "addr_lo", None), getattr(self, "addr_fam", None))
        self.slots = np.full(2 * size, _EMPTY, np.uint32)
        self.addr_hi = np.zeros(size, np.uint64)
        self.addr_lo = np.zeros(size, np.uint64)
        self.addr_fam = np.zeros(size, np.uint8)
        n = int(self.count[0])
        if n and old[0] is not None:
            self.addr_hi[:n], self.addr_lo[:n], self.addr_fam[:n] = old[0][:n], old[1][:n], old[2][:n]
            _rehash(self.slots, self.addr_hi, self.addr_lo, self.addr_fam, n)

    def arrays(self) -> "TableArrays":
        """The table's arrays, for kernels that intern as they go (they stop when it is full)."""
        return TableArrays(self.slots, self.addr_hi, self.addr_lo, self.addr_fam, self.count)

    def grow(self) -> None:
        """Double the table (the kernels stop when it is full): it is sized by the addresses seen, not
        by the rows (2 per packet), which would be 50 MB for a million packets."""
        self._allocate(2 * self.addr_hi.shape[0])

    def intern(self, hi, lo, fam, n) -> np.ndarray:
        ids = np.empty(n, np.uint32)
        done = 0
        while done < n:
            done = intern_pairs(hi, lo, fam, done, n, self.slots, self.addr_hi, self.addr_lo, self.addr_fam,
                                self.count, ids)
            if done < n:
                self.grow()
        return ids

    def __len__(self) -> int:
        return int(self.count[0])

    def texts(self) -> list[str]:
        """Addresses as Wireshark prints them (dotted quad; RFC 5952 for IPv6), in id order."""
        n = len(self)
        hi, lo, fam = self.addr_hi[:n], self.addr_lo[:n], self.addr_fam[:n]
        v4 = fam == 4
        out = np.empty(n, dtype=object)
        if v4.any():
            value = (lo[v4] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            octets = [(value >> np.uint32(shift)) & np.uint32(0xFF) for shift in (24, 16, 8, 0)]
            out[v4] = [f"{a}.{b}.{c}.{d}" for a, b, c, d in zip(*(o.tolist() for o in octets))]
        for k in np.flatnonzero(~v4).tolist():
            # inet_ntop: RFC 5952 text with the dotted tail for IPv4-mapped addresses, as Wireshark
            packed = int(hi[k]).to_bytes(8, "big") + int(lo[k]).to_bytes(8, "big")
            out[k] = socket.inet_ntop(socket.AF_INET6, packed)
        return out.tolist()
