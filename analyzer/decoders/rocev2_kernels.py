"""RoCEv2 byte work: one Numba pass over the UDP payloads (BTH and every extended transport header).

Captures are hostile input and Numba does not bounds-check: every header is read only after checking
that it lies inside both the datagram (``wire``: the UDP length) and the captured bytes (``length``),
in that order:

- a header that does not fit in the datagram its own UDP length describes: ``S_BAD_LENGTH`` (as is
  a datagram too short for a BTH, or one with no room left for PadCnt pad bytes and the 4-byte ICRC;
  decided from the UDP length alone, so it wins over ``S_TRUNCATED``);
- a header inside the datagram but past the captured bytes (snapshot length): ``S_TRUNCATED``.

Fields of the headers read before the problem are kept. A payload cut by the snapshot length is not
a problem (headers-only captures are common): the lengths come from the UDP length.

Output: one int64 row per field (``F_*``), a column per message, with a ``present`` bit mask
(``P_*``): the decoder (:mod:`.rocev2`) turns each row into a column, null where the bit is clear.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import rocev2_layout as L

# status codes (index into rocev2.STATUSES)
S_OK, S_TRUNCATED, S_BAD_LENGTH = 0, 1, 2

# present bits
P_BTH, P_RETH, P_AETH, P_IMMDT, P_DETH, P_PAYLOAD = 1, 2, 4, 8, 16, 32

# output columns
(F_STATUS, F_PRESENT, F_OPCODE, F_FLAGS, F_PKEY, F_FECN_BECN, F_DEST_QP, F_ACKREQ, F_PSN, F_RETH_VA, F_RETH_RKEY,
 F_RETH_DMA_LEN, F_IMMDT, F_AETH_SYNDROME, F_AETH_MSN, F_DETH_QKEY, F_DETH_SRC_QP, F_PAYLOAD_LEN, F_ICRC,
 F_HEADER_LEN) = range(20)
N_FIELDS = 20

OPCODE_HEADERS = np.asarray(L.OPCODE_HEADERS, np.int64)  # opcode -> rocev2_layout.H_* bits (frozen by Numba)


@njit(cache=True, _nrt=False)
def _u16(buf, p):
    return np.int64(buf[p]) << 8 | np.int64(buf[p + 1])


@njit(cache=True, _nrt=False)
def _u24(buf, p):
    return np.int64(buf[p]) << 16 | np.int64(buf[p + 1]) << 8 | np.int64(buf[p + 2])


@njit(cache=True, _nrt=False)
def _u32(buf, p):
    return np.int64(buf[p]) << 24 | np.int64(buf[p + 1]) << 16 | np.int64(buf[p + 2]) << 8 | np.int64(buf[p + 3])


@njit(cache=True, _nrt=False)
def _u64(buf, p):
    # the bit pattern of a big-endian u64 in an int64 (the caller views the column as uint64)
    return (_u32(buf, p) << 32) | _u32(buf, p + 4)


@njit(cache=True, _nrt=False)
def _fits(pos, size, wire, avail):
    """S_OK when [pos, pos+size) is inside the datagram and the captured bytes."""
    if pos + size > wire:
        return S_BAD_LENGTH
    if pos + size > avail:
        return S_TRUNCATED
    return S_OK


@njit(cache=True)
def decode_all(buf, offset, length, wire_length, out):
    """Fill ``out`` (N_FIELDS × n int64, zeroed) for every message (``offset``/``length``/``wire_length``)."""
    n = offset.shape[0]
    table = OPCODE_HEADERS
    for i in range(n):
        base = offset[i]
        wire = wire_length[i]
        avail = min(length[i], wire)
        st = _fits(0, L.BTH_BYTES, wire, avail)
        if st != S_OK:
            out[F_STATUS, i] = st
            continue
        op = np.int64(buf[base + L.BTH_OPCODE])
        flags = np.int64(buf[base + L.BTH_FLAGS])
        out[F_OPCODE, i] = op
        out[F_FLAGS, i] = flags
        out[F_PKEY, i] = _u16(buf, base + L.BTH_PKEY)
        out[F_FECN_BECN, i] = buf[base + L.BTH_FECN_BECN]
        out[F_DEST_QP, i] = _u24(buf, base + L.BTH_DEST_QP)
        out[F_ACKREQ, i] = buf[base + L.BTH_ACKREQ]
        out[F_PSN, i] = _u24(buf, base + L.BTH_PSN)
        present = P_BTH
        h = table[op]
        pos = np.int64(L.BTH_BYTES)
        # extended headers in wire order (rocev2_layout.HEADER_ORDER); pos advances past every header
        # the opcode has, read or not, so it ends as the header bytes the opcode needs
        if h & L.H_RDETH:
            if st == S_OK:
                st = _fits(pos, L.RDETH_BYTES, wire, avail)
            pos += L.RDETH_BYTES
        if h & L.H_DETH:
            if st == S_OK:
                st = _fits(pos, L.DETH_BYTES, wire, avail)
            if st == S_OK:
                out[F_DETH_QKEY, i] = _u32(buf, base + pos + L.DETH_QKEY)
                out[F_DETH_SRC_QP, i] = _u24(buf, base + pos + L.DETH_SRC_QP)
                present |= P_DETH
            pos += L.DETH_BYTES
        if h & L.H_XRCETH:
            if st == S_OK:
                st = _fits(pos, L.XRCETH_BYTES, wire, avail)
            pos += L.XRCETH_BYTES
        if h & L.H_RETH:
            if st == S_OK:
                st = _fits(pos, L.RETH_BYTES, wire, avail)
            if st == S_OK:
                out[F_RETH_VA, i] = _u64(buf, base + pos + L.RETH_VA)
                out[F_RETH_RKEY, i] = _u32(buf, base + pos + L.RETH_RKEY)
                out[F_RETH_DMA_LEN, i] = _u32(buf, base + pos + L.RETH_DMA_LEN)
                present |= P_RETH
            pos += L.RETH_BYTES
        if h & L.H_ATOMICETH:
            if st == S_OK:
                st = _fits(pos, L.ATOMICETH_BYTES, wire, avail)
            pos += L.ATOMICETH_BYTES
        if h & L.H_AETH:
            if st == S_OK:
                st = _fits(pos, L.AETH_BYTES, wire, avail)
            if st == S_OK:
                out[F_AETH_SYNDROME, i] = buf[base + pos + L.AETH_SYNDROME]
                out[F_AETH_MSN, i] = _u24(buf, base + pos + L.AETH_MSN)
                present |= P_AETH
            pos += L.AETH_BYTES
        if h & L.H_ATOMICACKETH:
            if st == S_OK:
                st = _fits(pos, L.ATOMICACKETH_BYTES, wire, avail)
            pos += L.ATOMICACKETH_BYTES
        if h & L.H_IMMDT:
            if st == S_OK:
                st = _fits(pos, L.IMMDT_BYTES, wire, avail)
            if st == S_OK:
                out[F_IMMDT, i] = _u32(buf, base + pos)
                present |= P_IMMDT
            pos += L.IMMDT_BYTES
        if h & L.H_IETH:
            if st == S_OK:
                st = _fits(pos, L.IETH_BYTES, wire, avail)
            pos += L.IETH_BYTES
        if h & L.H_CNP:
            if st == S_OK:
                st = _fits(pos, L.CNP_RESERVED_BYTES, wire, avail)
            pos += L.CNP_RESERVED_BYTES
        # what is left: payload, PadCnt pad bytes, the ICRC (Annex A17.4.5), captured or not: from the
        # UDP length, so a packet whose headers the snapshot cut still has them. A datagram too short
        # for all of it is bad_length even when the snapshot cut it earlier.
        pad = (flags >> L.PADCNT_SHIFT) & L.PADCNT_MASK
        if wire < pos + pad + L.ICRC_BYTES:
            st = S_BAD_LENGTH
        else:
            out[F_ICRC, i] = 1
            out[F_PAYLOAD_LEN, i] = wire - pos - pad - L.ICRC_BYTES
            present |= P_PAYLOAD
        out[F_HEADER_LEN, i] = pos
        out[F_STATUS, i] = st
        out[F_PRESENT, i] = present


def allocate_output(n: int) -> np.ndarray:
    """The zeroed output: one contiguous int64 row per field (``out[F_PSN]`` is the PSN column)."""
    return np.zeros((N_FIELDS, n), np.int64)
