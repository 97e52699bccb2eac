"""Side tables for the few packets that carry variable-length detail: SACK blocks (RFC 2018) and
the datagram quoted by an ICMP/ICMPv6 error (RFC 792, RFC 4443 §2.4 c). Both run only over the
packets the header decoder flagged, so the packets frame stays fixed-width.
"""
import numpy as np

from ..jit import njit
from .wire import next_tcp_option, u16be, u32be

IPPROTO_TCP = 6
IPPROTO_UDP = 17

# ICMP types that quote the offending datagram.
ICMP_ERROR_TYPES = (3, 4, 5, 11, 12)  # unreachable, source quench, redirect, time exceeded, param
ICMPV6_ERROR_TYPES = (1, 2, 3, 4)  # unreachable, packet too big, time exceeded, parameter problem


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def sack_blocks(buf, tcp_hdr_start, tcp_hdr_end, frame, out_frame, out_block, out_left, out_right):
    """SACK option blocks of the given segments; returns the number of rows written.

    ``tcp_hdr_start``/``tcp_hdr_end`` bound each segment's captured TCP header. The output arrays
    must hold the sum of the header decoder's ``sack_blocks`` counts.
    """
    k = 0
    capacity = out_frame.shape[0]
    for j in range(tcp_hdr_start.shape[0]):
        p = tcp_hdr_start[j] + 20
        end = tcp_hdr_end[j]
        while True:
            kind, olen, nxt = next_tcp_option(buf, p, end)
            if kind < 0:
                break
            if kind == 5:
                for b in range((olen - 2) // 8):
                    if k >= capacity:
                        return k
                    out_frame[k] = frame[j]
                    out_block[k] = b
                    out_left[k] = u32be(buf, p + 2 + 8 * b)
                    out_right[k] = u32be(buf, p + 6 + 8 * b)
                    k += 1
            p = nxt
    return k


@njit(cache=True)
def _u64be(buf, off):
    return (np.uint64(u32be(buf, off)) << np.uint64(32)) | np.uint64(u32be(buf, off + 4))


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def icmp_quotes(buf, start, end, hi, lo, fam, proto, sport, dport):
    """The quoted datagram's addresses, protocol and ports, for ICMP errors whose quote starts at
    ``start[j]`` and whose captured bytes end at ``end[j]``. Family 0 = quote unreadable."""
    for j in range(start.shape[0]):
        p = start[j]
        e = end[j]
        fam[2 * j] = 0
        fam[2 * j + 1] = 0
        proto[j] = 0
        sport[j] = 0
        dport[j] = 0
        if e - p < 1:
            continue
        version = buf[p] >> 4
        l4 = np.int64(-1)
        if version == 4 and e - p >= 20:
            ihl = np.int64(buf[p] & 0x0F) * 4
            proto[j] = buf[p + 9]
            hi[2 * j] = 0
            lo[2 * j] = np.uint64(0x0000FFFF00000000) | np.uint64(u32be(buf, p + 12))
            hi[2 * j + 1] = 0
            lo[2 * j + 1] = np.uint64(0x0000FFFF00000000) | np.uint64(u32be(buf, p + 16))
            fam[2 * j] = 4
            fam[2 * j + 1] = 4
            if ihl >= 20 and (u16be(buf, p + 6) & 0x1FFF) == 0:
                l4 = p + ihl
        elif version == 6 and e - p >= 40:
            proto[j] = buf[p + 6]
            hi[2 * j] = _u64be(buf, p + 8)
            lo[2 * j] = _u64be(buf, p + 16)
            hi[2 * j + 1] = _u64be(buf, p + 24)
            lo[2 * j + 1] = _u64be(buf, p + 32)
            fam[2 * j] = 6
            fam[2 * j + 1] = 6
            l4 = p + 40
        if l4 >= 0 and e - l4 >= 4 and (proto[j] == IPPROTO_TCP or proto[j] == IPPROTO_UDP):
            sport[j] = u16be(buf, l4)
            dport[j] = u16be(buf, l4 + 2)
