"""Numba kernels of the HTTP/1.x decoder (:mod:`analyzer.decoders.http`): the start line and header
fields of each framed message (RFC 9112 §2-§5), and base64 (RFC 4648 §4) of the Negotiate tokens.

Every read is bounded by the message's available bytes (``offset + length``); a message whose bytes end
before the empty line is ``truncated``, one whose start line or fields break the grammar gets the first
problem's code and keeps the fields read before it. Strings are written escaped (``text.put_escaped``)
into one arena; at most :data:`MAX_TEXT` source bytes of each (a 10 kB URI keeps its first 2 kB).
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from .text import put_escaped

NULL = np.iinfo(np.int64).min  # "absent" in the int64 field vectors (as ber.NULL)
MAX_TEXT = 2048  # source bytes kept of one string field (target, reason, Host ...)
MAX_HTTP_FIELDS = 1024  # header field lines read per message (Apache's LimitRequestFields is 100)

# decode_error codes (names in http.DECODE_ERRORS)
OK, TRUNCATED, BAD_START, BAD_VERSION, BAD_STATUS, BAD_FIELD, TOO_MANY_FIELDS, BAD_LENGTH, BAD_BASE64 = range(9)

# int field vector (rows of ``ints``)
I_KIND, I_MAJOR, I_MINOR, I_CODE, I_CONTENT_LENGTH, I_CHUNKED, I_HEADER_LEN, I_FIELDS, I_WWW_COUNT, \
    I_TOKEN_AT, I_TOKEN_LEN, I_ERROR = range(12)
N_INTS = 12
# string slots (rows 2k, 2k+1 of ``spans``: arena start, length; -1 = null)
S_METHOD, S_TARGET, S_REASON, S_HOST, S_AUTH, S_WWW = range(6)
N_STRS = 6
KIND_REQUEST, KIND_RESPONSE = 1, 2

_HOST = np.frombuffer(b"host", np.uint8)
_CONTENT_LENGTH = np.frombuffer(b"content-length", np.uint8)
_TRANSFER_ENCODING = np.frombuffer(b"transfer-encoding", np.uint8)
_AUTHORIZATION = np.frombuffer(b"authorization", np.uint8)
_WWW_AUTHENTICATE = np.frombuffer(b"www-authenticate", np.uint8)
_NEGOTIATE = np.frombuffer(b"negotiate", np.uint8)
_CHUNKED = np.frombuffer(b"chunked", np.uint8)

# RFC 4648 §4 alphabet -> value; 64 for '=', 255 for anything else
_B64 = np.full(256, 255, np.uint8)
for _k, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _k
_B64[ord("=")] = 64


@njit(cache=True, _nrt=False)
def _ci_eq(buf, s, n, pat):
    """buf[s:s+n] equals the lower-case ASCII ``pat``, ignoring case."""
    if n != pat.shape[0]:
        return False
    for k in range(n):
        b = buf[s + k]
        if 0x41 <= b <= 0x5A:
            b += 0x20
        if b != pat[k]:
            return False
    return True


@njit(cache=True, _nrt=False)
def _contains_ci(buf, s, n, pat):
    for y in range(s, s + n - pat.shape[0] + 1):
        if _ci_eq(buf, y, pat.shape[0], pat):
            return True
    return False


@njit(cache=True, _nrt=False)
def _is_tchar(b):
    """RFC 9110 §5.6.2 tchar."""
    return ((0x30 <= b <= 0x39) or (0x41 <= b <= 0x5A) or (0x61 <= b <= 0x7A)
            or b in (0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E))


@njit(cache=True, _nrt=False)
def _version(buf, s, n):
    """(major, minor) of "HTTP/d.d" at buf[s:s+n], or (-1, -1)."""
    if (n == 8 and buf[s] == 0x48 and buf[s + 1] == 0x54 and buf[s + 2] == 0x54 and buf[s + 3] == 0x50
            and buf[s + 4] == 0x2F and 0x30 <= buf[s + 5] <= 0x39 and buf[s + 6] == 0x2E
            and 0x30 <= buf[s + 7] <= 0x39):
        return np.int64(buf[s + 5] - 0x30), np.int64(buf[s + 7] - 0x30)
    return np.int64(-1), np.int64(-1)


@njit(cache=True, _nrt=False)
def _put(arena, pos, spans, slot, i, buf, s, n):
    """Write buf[s:s+n] (at most MAX_TEXT bytes) escaped into the arena as string slot ``slot`` of row i."""
    n = min(n, MAX_TEXT)
    q = put_escaped(arena, pos, buf, s, n)
    if q < 0:
        return pos  # cannot happen: the arena has room for every byte escaped
    spans[2 * slot, i] = pos
    spans[2 * slot + 1, i] = q - pos
    return q


@njit(cache=True)
def decode_all(buf, offsets, lengths, ints, spans, arena):
    """Decode every message i (buf[offsets[i]:offsets[i]+lengths[i]]) into ints[:, i] and string
    slots spans[:, i] (arena bytes). Returns the arena bytes used."""
    pos = np.int64(0)
    for i in range(offsets.shape[0]):
        for k in range(N_INTS):
            ints[k, i] = NULL
        for k in range(2 * N_STRS):
            spans[k, i] = -1
        pos = _decode_one(buf, offsets[i], offsets[i] + lengths[i], i, ints, spans, arena, pos)
    return pos


@njit(cache=True)
def _decode_one(buf, s, e, i, ints, spans, arena, pos):
    err = OK
    # the start line (RFC 9112 §3, §4)
    le = s
    while le < e and buf[le] != 0x0A:
        le += 1
    if le >= e:
        ints[I_ERROR, i] = TRUNCATED
        return pos
    lend = le - 1 if le > s and buf[le - 1] == 0x0D else le  # the line without CR LF
    sp1 = s
    while sp1 < lend and buf[sp1] != 0x20:
        sp1 += 1
    if sp1 - s == 8 and buf[s] == 0x48 and buf[s + 1] == 0x54 and buf[s + 2] == 0x54 and buf[s + 3] == 0x50 \
            and buf[s + 4] == 0x2F:  # status-line = HTTP-version SP status-code SP [ reason-phrase ]
        ints[I_KIND, i] = KIND_RESPONSE
        ma, mi = _version(buf, s, 8)
        if ma < 0:
            err = BAD_VERSION
        else:
            ints[I_MAJOR, i], ints[I_MINOR, i] = ma, mi
        c = sp1 + 1
        if c + 3 <= lend and 0x31 <= buf[c] <= 0x35 and 0x30 <= buf[c + 1] <= 0x39 and 0x30 <= buf[c + 2] <= 0x39 \
                and (c + 3 == lend or buf[c + 3] == 0x20):
            ints[I_CODE, i] = (buf[c] - 0x30) * 100 + (buf[c + 1] - 0x30) * 10 + (buf[c + 2] - 0x30)
            r = min(c + 4, lend)
            pos = _put(arena, pos, spans, S_REASON, i, buf, r, lend - r)
        elif err == OK:
            err = BAD_STATUS
    else:  # request-line = method SP request-target SP HTTP-version
        ints[I_KIND, i] = KIND_REQUEST
        ok = sp1 > s and sp1 < lend
        for k in range(s, sp1):
            if not _is_tchar(buf[k]):
                ok = False
        if ok:
            pos = _put(arena, pos, spans, S_METHOD, i, buf, s, sp1 - s)
            sp2 = lend
            while sp2 > sp1 + 1 and buf[sp2 - 1] != 0x20:
                sp2 -= 1
            if sp2 - 1 > sp1 + 1:  # a target and a version
                pos = _put(arena, pos, spans, S_TARGET, i, buf, sp1 + 1, sp2 - 1 - (sp1 + 1))
                ma, mi = _version(buf, sp2, lend - sp2)
                if ma < 0:
                    err = BAD_VERSION
                else:
                    ints[I_MAJOR, i], ints[I_MINOR, i] = ma, mi
            else:
                err = BAD_START
        else:
            err = BAD_START
    # header fields (RFC 9112 §5): field-name ":" OWS field-value OWS, up to the empty line
    x = le + 1
    nfields = 0
    www = 0
    header_end = np.int64(-1)
    cl = np.int64(-1)
    chunked = 0
    while x < e:
        y = x
        while y < e and buf[y] != 0x0A:
            y += 1
        if y >= e:
            break  # the bytes end inside a field line
        yend = y - 1 if y > x and buf[y - 1] == 0x0D else y
        if yend == x:
            header_end = y + 1
            break
        nxt = y + 1
        if buf[x] == 0x20 or buf[x] == 0x09:  # obs-fold (§5.2): continues the previous field's value
            x = nxt
            continue
        nfields += 1
        if nfields > MAX_HTTP_FIELDS:
            if err == OK:
                err = TOO_MANY_FIELDS
            x = nxt
            continue
        colon = x
        while colon < yend and buf[colon] != 0x3A:
            colon += 1
        name_ok = colon < yend and colon > x
        for k in range(x, colon):
            if not _is_tchar(buf[k]):
                name_ok = False  # also whitespace before the colon (§5.1: must be rejected)
        if not name_ok:
            if err == OK:
                err = BAD_FIELD
            x = nxt
            continue
        vs, ve = colon + 1, yend
        while vs < ve and (buf[vs] == 0x20 or buf[vs] == 0x09):
            vs += 1
        while ve > vs and (buf[ve - 1] == 0x20 or buf[ve - 1] == 0x09):
            ve -= 1
        nlen = colon - x
        if _ci_eq(buf, x, nlen, _HOST):
            if spans[2 * S_HOST + 1, i] < 0:
                pos = _put(arena, pos, spans, S_HOST, i, buf, vs, ve - vs)
        elif _ci_eq(buf, x, nlen, _CONTENT_LENGTH):
            v = np.int64(0)
            good = 1 <= ve - vs <= 18
            for k in range(vs, ve):
                if 0x30 <= buf[k] <= 0x39:
                    v = v * 10 + (buf[k] - 0x30)
                else:
                    good = False
            if good and (cl < 0 or cl == v):
                cl = v
            else:
                cl = -2
        elif _ci_eq(buf, x, nlen, _TRANSFER_ENCODING):
            if _contains_ci(buf, vs, ve - vs, _CHUNKED):
                chunked = 1
        elif _ci_eq(buf, x, nlen, _AUTHORIZATION) or _ci_eq(buf, x, nlen, _WWW_AUTHENTICATE):
            is_www = nlen == _WWW_AUTHENTICATE.shape[0]
            t = vs
            while t < ve and _is_tchar(buf[t]):
                t += 1
            slot = S_WWW if is_www else S_AUTH
            if is_www:
                www += 1
            if spans[2 * slot + 1, i] < 0:
                pos = _put(arena, pos, spans, slot, i, buf, vs, t - vs)
            if _ci_eq(buf, vs, t - vs, _NEGOTIATE) and ints[I_TOKEN_AT, i] == NULL:
                ts = t
                while ts < ve and buf[ts] == 0x20:
                    ts += 1
                if ts < ve:  # token68 (RFC 9110 §11.2; RFC 4559 §4)
                    ints[I_TOKEN_AT, i] = ts
                    ints[I_TOKEN_LEN, i] = ve - ts
        x = nxt
    ints[I_FIELDS, i] = nfields
    ints[I_WWW_COUNT, i] = www
    ints[I_CHUNKED, i] = chunked
    if cl >= 0:
        ints[I_CONTENT_LENGTH, i] = cl
    elif cl == -2 and err == OK:
        err = BAD_LENGTH
    if header_end < 0:
        err = TRUNCATED
    else:
        ints[I_HEADER_LEN, i] = header_end - s
    ints[I_ERROR, i] = err
    return pos


@njit(cache=True)
def base64_decode(buf, starts, lens, out, out_at, out_len):
    """Decode each token buf[starts[j]:starts[j]+lens[j]] (RFC 4648 §4, padding optional) into
    ``out``; out_at/out_len its place, out_len -1 when it is not base64. Returns bytes written."""
    pos = np.int64(0)
    for j in range(starts.shape[0]):
        s, n = starts[j], lens[j]
        acc = 0
        bits = 0
        at = pos
        ok = True
        pad = 0
        for k in range(s, s + n):
            v = _B64[buf[k]]
            if v == 255 or (v != 64 and pad):
                ok = False
                break
            if v == 64:
                pad += 1
                continue
            acc = ((acc << 6) | v) & 0xFFFFFF
            bits += 6
            if bits >= 8:
                bits -= 8
                out[pos] = (acc >> bits) & 0xFF
                pos += 1
        if pad > 2 or (n - pad) % 4 == 1:
            ok = False
        if ok:
            out_at[j], out_len[j] = at, pos - at
        else:
            out_at[j], out_len[j] = at, -1
            pos = at
    return pos
