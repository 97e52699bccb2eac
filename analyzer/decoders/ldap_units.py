"""LDAP kernels, pass 1: where the LDAPMessages of each framed message are (plain, several in a
CLDAP datagram, or inside a SASL buffer, RFC 4422 §3.7, whose GSS-API wrap token is opened when it is
integrity-only: RFC 4121 §4.2.6.2, RFC 1964 §1.2.2). :func:`count_units` sizes the output,
:func:`fill_units` fills it; both walk with :func:`_split`, so they agree."""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import ldap_layout as L
from .ber import OK, helper, read_tlv
from .ldap_layout import APP0, K_LDAP, K_SASL, K_SASL_LDAP, K_SEALED, K_TLS, KRB5_OID, NO, OID_TAG, SEQ, YES, ZERO


@helper
def _u16(buf, p):
    return (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])


@helper
def _gss_payload(buf, s, e):
    """The GSS-API token of a SASL buffer in ``[s, e)`` → (kind, data start, data end): the plaintext
    of an integrity-only Kerberos wrap token (K_SASL_LDAP), K_SEALED for a confidential one, K_SASL
    for anything else."""
    n = e - s
    # RFC 4121 §4.2.6.2: TOK_ID 05 04, Flags, Filler FF, EC, RRC, SND_SEQ (16 octets), then
    # {data | filler | checksum(EC octets)} rotated right by RRC octets (§4.2.5)
    if (n >= L.WRAP_HEADER and buf[s] == L.WRAP_TOK_ID_0 and buf[s + 1] == L.WRAP_TOK_ID_1
            and buf[s + L.WRAP_FILLER] == L.WRAP_FILLER_OCTET):
        if buf[s + L.WRAP_FLAGS] & L.WRAP_FLAG_SEALED:
            return K_SEALED, s, e
        ec = _u16(buf, s + L.WRAP_EC)
        rrc = _u16(buf, s + L.WRAP_RRC)
        body = n - L.WRAP_HEADER
        if body <= ec:
            return K_SASL, s, e
        rrc = rrc % body
        if rrc > ec:
            return K_SASL, s, e  # data wraps around the end of the buffer; not opened
        ds = s + L.WRAP_HEADER + rrc
        return K_SASL_LDAP, ds, ds + body - ec
    # RFC 1964 §1.2.2: [APPLICATION 0] { krb5 OID, TOK_ID 02 01, SGN_ALG, SEAL_ALG, FF FF, SND_SEQ[8],
    # SGN_CKSUM[8 or 20], confounder[8], data, padding }
    if n >= 2 and buf[s] == L.GSS_TOKEN_TAG:
        t, cs, ce, st = read_tlv(buf, s, e, e)
        if st != OK or t != APP0:
            return K_SASL, s, e
        t, os_, oe, st = read_tlv(buf, cs, ce, e)
        if st != OK or t != OID_TAG or oe - os_ != KRB5_OID.shape[0]:
            return K_SASL, s, e
        for k in range(KRB5_OID.shape[0]):
            if buf[os_ + k] != KRB5_OID[k]:
                return K_SASL, s, e
        p = oe
        if ce - p < L.MIC1964_HEADER or buf[p] != L.MIC1964_TOK_ID_0 or buf[p + 1] != L.MIC1964_TOK_ID_1:
            return K_SASL, s, e
        if not (buf[p + L.MIC1964_SEAL_ALG] == L.MIC1964_NO_SEAL
                and buf[p + L.MIC1964_SEAL_ALG + 1] == L.MIC1964_NO_SEAL):
            return K_SEALED, s, e
        sgn_alg = _u16(buf, p + L.MIC1964_SGN_ALG)
        cksum = L.MIC1964_CKSUM_DES3 if sgn_alg == L.SGN_ALG_HMAC_SHA1_DES3_KD else L.MIC1964_CKSUM
        ds = p + L.MIC1964_HEADER + L.MIC1964_SND_SEQ + cksum + L.MIC1964_CONFOUNDER
        if ds >= ce:
            return K_SASL, s, e
        return K_SASL_LDAP, ds, ce
    return K_SASL, s, e


@helper
def _split(buf, s, mend, fill, base, u_start, u_end, u_kind):
    """Units of the framed message ``[s, mend)``; written at ``base`` when ``fill``. Returns the count."""
    if mend <= s:
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = K_LDAP
        return 1
    b0 = buf[s]
    count = 0
    if b0 == L.SEQUENCE_OCTET:
        p = s
        while p < mend:
            t, cs, ce, st = read_tlv(buf, p, mend, mend)
            if count > 0 and (st != OK or t != SEQ):
                # bytes after the last LDAPMessage: give them their own (failing) row
                if fill:
                    u_start[base + count] = p
                    u_end[base + count] = mend
                    u_kind[base + count] = K_LDAP
                return count + 1
            if fill:
                u_start[base + count] = p
                u_end[base + count] = ce if st == OK else mend
                u_kind[base + count] = K_LDAP
            count += 1
            if st != OK:
                return count
            p = ce
        return count
    if L.TLS_CONTENT_FIRST <= b0 <= L.TLS_CONTENT_LAST and mend - s >= 2 and buf[s + 1] == L.TLS_VERSION_MAJOR:
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = K_TLS
        return 1
    if mend - s >= L.SASL_LENGTH_SIZE:  # SASL buffer: 4-octet length (RFC 4422 §3.7)
        length = (np.int64(buf[s]) << 24) | (np.int64(buf[s + 1]) << 16) | (np.int64(buf[s + 2]) << 8) \
            | np.int64(buf[s + 3])
        e = min(mend, s + L.SASL_LENGTH_SIZE + length)
        kind, ds, de = _gss_payload(buf, s + L.SASL_LENGTH_SIZE, e)
        if kind == K_SASL_LDAP:
            p = ds
            while p < de and count < L.MAX_SASL_UNITS:
                t, cs, ce, st = read_tlv(buf, p, de, de)
                if st != OK or t != SEQ:
                    if count == 0:
                        kind = K_SASL  # not LDAP inside after all
                        break
                    if de - p <= L.PADDING_MAX:
                        return count  # RFC 1964 / RFC 4121 padding
                    if fill:
                        u_start[base + count] = p
                        u_end[base + count] = de
                        u_kind[base + count] = K_SASL_LDAP
                    return count + 1
                if fill:
                    u_start[base + count] = p
                    u_end[base + count] = ce
                    u_kind[base + count] = K_SASL_LDAP
                count += 1
                p = ce
            if count > 0:
                return count
        if fill:
            u_start[base] = s
            u_end[base] = mend
            u_kind[base] = kind
        return 1
    if fill:
        u_start[base] = s
        u_end[base] = mend
        u_kind[base] = K_LDAP
    return 1


@njit(cache=True)
def count_units(buf, offsets, lengths, counts):
    dummy = np.empty(0, np.int64)
    for i in range(offsets.shape[0]):
        counts[i] = _split(buf, offsets[i], offsets[i] + lengths[i], NO, ZERO, dummy, dummy, dummy)


@njit(cache=True)
def fill_units(buf, offsets, lengths, first, u_start, u_end, u_kind, u_msg):
    for i in range(offsets.shape[0]):
        n = _split(buf, offsets[i], offsets[i] + lengths[i], YES, first[i], u_start, u_end, u_kind)
        for k in range(n):
            u_msg[first[i] + k] = i
