"""Numba kernels that find the security tokens in carrier messages (for :mod:`.kerberos_ap`).

Each walks the carrier's message set ``(buf, offsets, lengths, wire_lengths)`` and writes, per token
found, the message's index, the token's start and available length in ``buf`` and a status (OK,
TRUNCATED: the token runs past the captured bytes, clipped; BAD_LENGTH: past the message on the wire
or into the fixed part of its structure). A carrier message whose own structure is damaged before its
token is located gives no token: its decoder's frame counts that damage.

- SMB2 (MS-SMB2 2.2.5 / 2.2.6): every SESSION_SETUP request and response of a compound chain
  (NextCommand walked with ``smb2_kernel.next_element``, the same checks as the SMB2 decoder),
  SecurityBufferOffset (from the SMB2 header) and SecurityBufferLength. A response whose status is an
  error other than STATUS_MORE_PROCESSING_REQUIRED has an ERROR body (2.2.2): no buffer.
- LDAP (RFC 4511 §4.2, §4.2.2): bindRequest with the sasl choice: SaslCredentials.credentials;
  bindResponse: serverSaslCreds [7].
- KDC (RFC 4120 §5.4.1, §5.2.7): the padata-value of the PA-TGS-REQ (type 1) PA-DATA of a TGS-REQ.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import ber
from . import kerberos_layout as KL
from . import ldap_layout as LL
from . import smb2_layout as SL
from . import smb2_tables as ST
from .ber import BAD_LENGTH, OK, TRUNCATED, helper, read_int, read_tlv, read_tlv_partial
from .ntstatus import STATUS_MORE_PROCESSING_REQUIRED
from .smb2_kernel import SEVERITY_ERROR, SEVERITY_SHIFT, next_element

APP_TGS_REQ = ber.app(KL.TGS_REQ)
APP_BIND_REQUEST = ber.app(LL.BIND_REQUEST)
APP_BIND_RESPONSE = ber.app(LL.BIND_RESPONSE)
C1 = ber.ctx(1)
C2 = ber.ctx(2)
C3 = ber.ctx(3)
C4 = ber.ctx(4)
SEQ = ber.SEQUENCE
INT = ber.INTEGER
OCTETS = ber.OCTET_STRING
MAX_SMB2_CHAIN = 4096  # compound elements walked per NBSS message (each at least a 64-byte header anyway)


@helper
def _u16(buf, p):
    return np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)


@helper
def _u32(buf, p):
    return _u16(buf, p) | (_u16(buf, p + 2) << 16)


@helper
def _put(out, k, fill, msg, start, length, status):
    if fill:
        out[0, k] = msg
        out[1, k] = start
        out[2, k] = length
        out[3, k] = status
    return k + 1


@helper
def _clip(start, end, avail_end, wire_end, status):
    """Token ``[start, end)`` against the available bytes and the wire: (start, length, status); an
    empty token (nothing of it captured) starts at ``avail_end``."""
    if end > wire_end:
        status = BAD_LENGTH
    elif end > avail_end:
        status = TRUNCATED
    if start >= avail_end or end <= start:
        return min(start, avail_end), np.int64(0), status
    return start, min(end, avail_end) - start, status


@njit(cache=True)
def smb2_tokens(buf, offsets, lengths, wires, out, fill):
    """SESSION_SETUP security buffers (module doc). ``out``: (4, capacity) int64 rows msg, start,
    length, status, written when ``fill``. Returns the number of tokens."""
    k = 0
    for i in range(offsets.shape[0]):
        start = offsets[i]
        mend = start + lengths[i]
        wend = start + max(wires[i], lengths[i])
        pos = start
        for _ in range(MAX_SMB2_CHAIN):
            if mend - pos < SL.HEADER or buf[pos] != SL.PROTOCOL_SMB2 or buf[pos + 1] != SL.PROTOCOL_S \
                    or buf[pos + 2] != SL.PROTOCOL_M or buf[pos + 3] != SL.PROTOCOL_B:
                break
            nxt = next_element(buf, pos, mend, wend)
            e_avail = mend if nxt <= 0 else nxt
            e_wire = wend if nxt <= 0 else nxt
            if _u16(buf, pos + SL.HDR_COMMAND) == ST.SESSION_SETUP:
                resp = (_u32(buf, pos + SL.HDR_FLAGS) & ST.FLAGS_SERVER_TO_REDIR) != 0
                body = pos + SL.HEADER
                if resp:
                    status = _u32(buf, pos + SL.HDR_STATUS)
                    severe = (status >> SEVERITY_SHIFT) == SEVERITY_ERROR and status != STATUS_MORE_PROCESSING_REQUIRED
                    fixed = SL.SS_RESP_SIZE
                    o_off = SL.SS_RESP_SECURITY_OFFSET
                    o_len = SL.SS_RESP_SECURITY_LENGTH
                else:
                    severe = False
                    fixed = SL.SS_REQ_SIZE
                    o_off = SL.SS_REQ_SECURITY_OFFSET
                    o_len = SL.SS_REQ_SECURITY_LENGTH
                if not severe and body + fixed <= e_avail:
                    off = _u16(buf, body + o_off)
                    n = _u16(buf, body + o_len)
                    if n > 0:
                        ts = pos + off
                        st = OK
                        if off < SL.HEADER + fixed:
                            st = BAD_LENGTH
                            ts = body + fixed
                        ts, length, st = _clip(ts, pos + off + n, e_avail, e_wire, st)
                        k = _put(out, k, fill, i, ts, length, st)
            if nxt <= 0:
                break
            pos = nxt
    return k


@njit(cache=True)
def ldap_tokens(buf, offsets, lengths, wires, out, fill):
    """SASL bind credentials and serverSaslCreds (module doc); as :func:`smb2_tokens`."""
    k = 0
    for i in range(offsets.shape[0]):
        s = offsets[i]
        mend = s + lengths[i]
        t, cs, ce, st = read_tlv_partial(buf, s, mend, mend)
        if st != OK or t != SEQ:
            continue
        t, ms, me, st = read_tlv(buf, cs, ce, mend)  # messageID
        if st != OK or t != INT:
            continue
        t, os_, oe, st = read_tlv_partial(buf, me, ce, mend)
        if st != OK:
            continue
        if t == APP_BIND_REQUEST:
            t, vs, ve, st = read_tlv(buf, os_, oe, mend)  # version
            if st != OK or t != INT:
                continue
            t, ns, ne, st = read_tlv(buf, ve, oe, mend)  # name
            if st != OK or t != OCTETS:
                continue
            t, as_, ae, st = read_tlv_partial(buf, ne, oe, mend)
            if st != OK or t != LL.SASL_CREDENTIALS:
                continue
            t, xs, xe, st = read_tlv(buf, as_, ae, mend)  # mechanism
            if st != OK or t != OCTETS or xe >= ae:
                continue
            p = xe
            end = ae
            request = True
        elif t == APP_BIND_RESPONSE:
            request = False
            p = os_
            end = oe
            ok = True
            for want in (ber.ENUMERATED, OCTETS, OCTETS):  # resultCode, matchedDN, diagnosticMessage
                t, fs, fe, st = read_tlv(buf, p, end, mend)
                if st != OK or t != want:
                    ok = False
                    break
                p = fe
            if not ok or p >= end:
                continue
            t, fs, fe, st = read_tlv_partial(buf, p, end, mend)
            if st == OK and t == LL.REFERRAL:
                p = fe
            if p >= end:
                continue
        else:
            continue
        # the token: credentials OCTET STRING / serverSaslCreds [7] IMPLICIT OCTET STRING; content past
        # the captured bytes (TRUNCATED) or past its enclosing TLV (BAD_LENGTH) comes clipped
        t, ts, te, st = read_tlv(buf, p, end, mend)
        if t != (OCTETS if request else LL.SERVER_SASL_CREDS) or ts <= p:
            continue
        if st == OK or st == TRUNCATED or st == BAD_LENGTH:
            k = _put(out, k, fill, i, ts, te - ts, st)
    return k


@njit(cache=True)
def kdc_tokens(buf, offsets, lengths, wires, out, fill):
    """The PA-TGS-REQ AP-REQ of each TGS-REQ (module doc); as :func:`smb2_tokens`."""
    k = 0
    for i in range(offsets.shape[0]):
        s = offsets[i]
        mend = s + lengths[i]
        t, cs, ce, st = read_tlv_partial(buf, s, mend, mend)
        if st != OK or t != APP_TGS_REQ:
            continue
        t, qs, qe, st = read_tlv_partial(buf, cs, ce, mend)
        if st != OK or t != SEQ:
            continue
        p = qs
        while p < qe:
            t, fs, fe, st = read_tlv_partial(buf, p, qe, mend)
            if st != OK:
                break
            p = fe
            if t == C4:
                break  # req-body: padata [3] comes before it
            if t != C3:
                continue
            t, ls, le, st = read_tlv_partial(buf, fs, fe, mend)
            if st != OK or t != SEQ:
                break
            q = ls
            while q < le:
                t, ps, pe, st = read_tlv_partial(buf, q, le, mend)
                if st != OK or t != SEQ:
                    break
                q = pe
                ptype = np.int64(-1)
                vs = np.int64(-1)
                ve = np.int64(-1)
                vst = OK
                r = ps
                while r < pe:
                    t, xs, xe, st = read_tlv_partial(buf, r, pe, mend)
                    if st != OK:
                        break
                    r = xe
                    if t == C1:
                        t2, is_, ie, st = read_tlv(buf, xs, xe, mend)
                        if st == OK and t2 == INT:
                            v, st = read_int(buf, is_, ie)
                            if st == OK:
                                ptype = v
                    elif t == C2:
                        t2, vs, ve, vst = read_tlv(buf, xs, xe, mend)
                        if t2 != OCTETS or vs <= xs:
                            vs = np.int64(-1)
                if ptype == KL.PA_TGS_REQ and vs >= 0:
                    st = vst if vst == TRUNCATED or vst == BAD_LENGTH else OK
                    k = _put(out, k, fill, i, vs, ve - vs, st)
                    break
            break
    return k


@njit(cache=True)
def copy_tokens(buf, start, length, at, out):
    """Token j's bytes ``buf[start[j]:start[j] + length[j]]`` to ``out[at[j]:]`` (the caller checks
    that every token lies inside ``buf`` and ``at`` is the running sum of ``length``)."""
    for j in range(start.shape[0]):
        out[at[j]:at[j] + length[j]] = buf[start[j]:start[j] + length[j]]
