"""Unordered address pairs of a capture's packets, in one pass: what deciding its server partitions
reads (``analyzer.partitions.partition_of_packets``).

Each packet's two address codes (in the capture's address Enum) are keyed as (lower, higher); an
open-addressing hash table (linear probing, load at most 1/2, doubled when it fills) numbers the
pairs in first-seen order, and per pair the kernel adds up its packets, whether each of the two
addresses used a decoder's port in them, and whether each was sent a TCP SYN (without ACK) in them.
The caller keeps one pair number per packet (4 bytes) instead of a frame of keys, a group-by and a
join (about 66 bytes a packet at their peak, with the allocator's retention after them), and adds the
packets a slice at a time (:class:`PairTable`), so that the kernel's inputs (address codes, ports
served, SYNs: ~12 bytes a packet) are those of a slice, not of the capture.
"""
import numpy as np

from ..jit import njit

NO_PAIR = np.uint32(0xFFFFFFFF)  # a packet without two addresses (PAUSE frames, ARP)
_FIRST_SLOTS = 1 << 12


@njit(cache=True, inline="always")
def _slot(key, mask):
    h = key * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(31)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def _grown(slots, pair_key):
    """The table at twice its size, every pair found again at its new slot."""
    grown = np.full(slots.shape[0] * 2, NO_PAIR, np.uint32)
    mask = grown.shape[0] - 1
    for s in range(slots.shape[0]):
        pair = slots[s]
        if pair != NO_PAIR:
            t = _slot(pair_key[pair], mask)
            while grown[t] != NO_PAIR:
                t = (t + 1) & mask
            grown[t] = pair
    return grown


class PairTable:
    """The pairs of packets added slice by slice (:meth:`add`): what :func:`add_pairs` keeps between
    calls, so that a capture's pairs are found without its per-packet inputs in memory at once."""

    def __init__(self):
        self.slots = np.full(_FIRST_SLOTS, NO_PAIR, np.uint32)
        room = _FIRST_SLOTS // 2
        self.pair_key = np.empty(room, np.uint64)
        self.packets = np.zeros(room, np.int64)
        self.lo_serves, self.hi_serves = np.zeros(room, np.bool_), np.zeros(room, np.bool_)
        self.lo_syn, self.hi_syn = np.zeros(room, np.bool_), np.zeros(room, np.bool_)
        self.count = 0

    def add(self, src, dst, has_addresses, src_serves, dst_serves, syn, pair_of) -> None:
        """Add these packets (arrays of equal length, as :func:`add_pairs` reads them), their pairs'
        numbers written to ``pair_of`` (uint32, their length)."""
        (self.slots, self.pair_key, self.packets, self.lo_serves, self.hi_serves, self.lo_syn, self.hi_syn,
         self.count) = add_pairs(src, dst, has_addresses, src_serves, dst_serves, syn, pair_of, self.slots,
                                 self.pair_key, self.packets, self.lo_serves, self.hi_serves, self.lo_syn,
                                 self.hi_syn, self.count)

    def pairs(self) -> tuple[np.ndarray, ...]:
        """Per pair (in first-seen order): lower code, higher code, packets, whether the lower and the
        higher address used a decoder's port in them, and whether each was sent a SYN."""
        n = self.count
        keys = self.pair_key[:n]
        return ((keys >> np.uint64(32)).astype(np.uint32), (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                self.packets[:n].copy(), self.lo_serves[:n].copy(), self.hi_serves[:n].copy(),
                self.lo_syn[:n].copy(), self.hi_syn[:n].copy())


@njit(cache=True)
def add_pairs(src, dst, has_addresses, src_serves, dst_serves, syn, pair_of, slots, pair_key, packets,
              lo_serves, hi_serves, lo_syn, hi_syn, count):
    """Per packet (arrays of equal length: address codes, whether it has both, whether its source and
    destination port is a decoder's, whether it opens a TCP connection): its pair's number, written to
    ``pair_of`` (:data:`NO_PAIR` without addresses), the table (``slots`` over ``pair_key``) and the
    per-pair arrays (packets, whether the lower and the higher address used a decoder's port in them,
    an address that is both ends serving when either port does, and whether each was sent a SYN) of the
    ``count`` pairs so far updated. Returns the table, the per-pair arrays (grown when they filled) and
    the count."""
    n = src.shape[0]
    room = pair_key.shape[0]
    for i in range(n):
        if not has_addresses[i]:
            pair_of[i] = NO_PAIR
            continue
        a, b = np.uint64(src[i]), np.uint64(dst[i])
        lo, hi = (a, b) if a <= b else (b, a)
        key = (lo << np.uint64(32)) | hi
        mask = slots.shape[0] - 1
        s = _slot(key, mask)
        while slots[s] != NO_PAIR and pair_key[slots[s]] != key:
            s = (s + 1) & mask
        pair = slots[s]
        if pair == NO_PAIR:
            if count == room:  # keep the load at most 1/2: grow the table and the per-pair arrays
                room *= 2
                pair_key = _resized(pair_key, room)
                packets = _resized(packets, room)
                lo_serves = _resized(lo_serves, room)
                hi_serves = _resized(hi_serves, room)
                lo_syn = _resized(lo_syn, room)
                hi_syn = _resized(hi_syn, room)
                slots = _grown(slots, pair_key)
                mask = slots.shape[0] - 1
                s = _slot(key, mask)
                while slots[s] != NO_PAIR:
                    s = (s + 1) & mask
            pair = np.uint32(count)
            slots[s] = pair
            pair_key[pair] = key
            count += 1
        pair_of[i] = pair
        packets[pair] += 1
        if a == b:
            either = src_serves[i] or dst_serves[i]
            lo_serves[pair] |= either
            hi_serves[pair] |= either
            lo_syn[pair] |= syn[i]
            hi_syn[pair] |= syn[i]
        elif a < b:
            lo_serves[pair] |= src_serves[i]
            hi_serves[pair] |= dst_serves[i]
            hi_syn[pair] |= syn[i]
        else:
            lo_serves[pair] |= dst_serves[i]
            hi_serves[pair] |= src_serves[i]
            lo_syn[pair] |= syn[i]
    return slots, pair_key, packets, lo_serves, hi_serves, lo_syn, hi_syn, count


@njit(cache=True)
def _resized(values, size):
    out = np.zeros(size, values.dtype)
    out[:values.shape[0]] = values
    return out
