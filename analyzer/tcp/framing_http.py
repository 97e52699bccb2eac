"""HTTP/1.x message framing for :mod:`analyzer.tcp.framing` (its ``"http"`` framing).

RFC 9112: a message is a start line and header fields up to an empty line (§2.1), then a body whose
length §6.3 decides: none for 1xx, 204 and 304 responses and for requests without Content-Length or
Transfer-Encoding; chunked (§7.1) when Transfer-Encoding names it; else Content-Length; a response with
neither runs to the end of the stream (close-delimited). These kernels read the reassembled stream
through :mod:`.stream_bytes` (``byte_at``, ``read_be``, ``captured_until``), every byte checked;
every loop has a bound below, so a hostile stream cannot make framing walk forever.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from .stream_bytes import byte_at, captured_until, locate, read_be

# Bounds:
MAX_HTTP_HEADER = 64 << 10  # longest header block taken as plausible (start line to the empty line)
MAX_HTTP_METHOD = 20  # longest method token taken as a request line ("VERSION-CONTROL", RFC 3253, is 15)
MAX_HTTP_CHUNKS = 1 << 20  # most chunks walked in one chunked body (RFC 9112 §7.1)
MAX_HTTP_CHUNK_LINE = 4096  # longest chunk-size line with its extensions
MAX_HTTP_LENGTH_DIGITS = 18  # Content-Length digits read (int64); more: an invalid length
MAX_HTTP_SIZE_DIGITS = 15  # chunk-size hex digits read (int64)
HTTP_REQUEST_LINE, HTTP_STATUS_LINE = 1, 2  # what http_start found
_HTTP_CONTENT_LENGTH = np.frombuffer(b"content-length:", np.uint8)
_HTTP_TRANSFER_ENCODING = np.frombuffer(b"transfer-encoding:", np.uint8)
_HTTP_CHUNKED = np.frombuffer(b"chunked", np.uint8)


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _ci_at(buf, p_start, p_avail, p_off, lo, hi, x, pat):
    """The stream bytes at x equal ``pat`` (lower-case ASCII), ignoring ASCII case."""
    for k in range(pat.shape[0]):
        b = byte_at(buf, p_start, p_avail, p_off, lo, hi, x + k)
        if 0x41 <= b <= 0x5A:
            b += 0x20
        if b != pat[k]:
            return False
    return True


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def http_start(buf, p_start, p_avail, p_off, lo, hi, pos):
    """HTTP_STATUS_LINE when "HTTP/d.d SP" starts at pos (RFC 9112 §4; HTTP-name is case-sensitive,
    §2.3), HTTP_REQUEST_LINE when a method (upper-case letters, '-', '_'), a space and a visible byte
    do (§3), else 0."""
    if read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 5) == 0x485454502F:  # "HTTP/"
        d1 = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 5)
        dot = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 6)
        d2 = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 7)
        sp = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 8)
        ok = 0x30 <= d1 <= 0x39 and dot == 0x2E and 0x30 <= d2 <= 0x39 and sp == 0x20
        return HTTP_STATUS_LINE if ok else 0
    n = 0
    b = np.int64(-1)
    while n <= MAX_HTTP_METHOD:
        b = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + n)
        if not (0x41 <= b <= 0x5A or b == 0x2D or b == 0x5F):
            break
        n += 1
    if 1 <= n <= MAX_HTTP_METHOD and b == 0x20:
        t = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + n + 1)
        return HTTP_REQUEST_LINE if 0x21 <= t < 0x7F else 0
    return 0


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _http_line_end(buf, p_start, p_avail, p_off, lo, hi, x, limit):
    """Position just after the LF ending the line at x (at most ``limit`` bytes), or -1 (a byte
    missing first). Scans each piece's bytes in place: one piece lookup per piece, not per byte."""
    stop = x + limit
    while x < stop:
        k = locate(p_start, lo, hi, x)
        if k < lo or x >= p_avail[k]:
            return -1
        y = min(p_avail[k], stop)
        base = p_off[k] - p_start[k]
        for z in range(x, y):
            if buf[base + z] == 0x0A:
                return z + 1
        x = y
    return -1


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _http_chunked(buf, p_start, p_avail, p_off, lo, hi, x, end):
    """Where a chunked body starting at x ends (RFC 9112 §7.1: chunk-size lines, data and CRLF, the
    last chunk, trailer fields, an empty line); where the walk stopped when a size line is missing or
    malformed (the next message then has to look like one, or framing resynchronises)."""
    for _ in range(MAX_HTTP_CHUNKS):
        size = np.int64(0)
        nd = 0
        while nd <= MAX_HTTP_SIZE_DIGITS:
            b = byte_at(buf, p_start, p_avail, p_off, lo, hi, x + nd)
            if 0x30 <= b <= 0x39:
                v = b - 0x30
            elif 0x61 <= (b | 0x20) <= 0x66 and b >= 0:
                v = (b | 0x20) - 0x61 + 10
            else:
                break
            size = size * 16 + v
            nd += 1
        if nd == 0 or nd > MAX_HTTP_SIZE_DIGITS:
            return x
        nxt = _http_line_end(buf, p_start, p_avail, p_off, lo, hi, x + nd, MAX_HTTP_CHUNK_LINE)
        if nxt < 0:
            return x
        x = nxt
        if size == 0:  # trailer section up to an empty line
            while x < end:
                nxt = _http_line_end(buf, p_start, p_avail, p_off, lo, hi, x, MAX_HTTP_HEADER)
                if nxt < 0:
                    return x
                blank = nxt - x == 1 or (nxt - x == 2 and byte_at(buf, p_start, p_avail, p_off, lo, hi, x) == 0x0D)
                x = nxt
                if blank:
                    return x
            return x
        x += size + 2  # the chunk's data and its CRLF
        if x >= end:
            return x
    return x


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def http_message(buf, p_start, p_avail, p_off, lo, hi, pos, end):
    """Stream bytes of the HTTP/1.x message starting at pos, or -1 when none starts there (or its
    header block has a hole or exceeds MAX_HTTP_HEADER). Body length by RFC 9112 §6.3: none for
    1xx, 204 and 304 responses; chunked; Content-Length; a response with neither runs to the end of
    the stream, a request with neither has no body. A response to HEAD that carries Content-Length is
    framed as if it had that body (the framing sees one direction): the next response is then found by
    resynchronisation."""
    kind = http_start(buf, p_start, p_avail, p_off, lo, hi, pos)
    if kind == 0:
        return np.int64(-1)
    status = np.int64(-1)
    if kind == HTTP_STATUS_LINE:
        status = np.int64(0)
        for k in range(3):
            b = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 9 + k)
            status = status * 10 + (b - 0x30) if 0x30 <= b <= 0x39 else np.int64(-1000)
    content_length = np.int64(-1)  # -1: none, -2: invalid
    chunked = False
    x = pos
    header_end = np.int64(-1)
    first = True
    while x < pos + MAX_HTTP_HEADER:
        nxt = _http_line_end(buf, p_start, p_avail, p_off, lo, hi, x, pos + MAX_HTTP_HEADER - x)
        if nxt < 0:
            if captured_until(p_start, p_avail, lo, hi, x, end) >= end and end > x:
                return end - pos  # the stream (capture) ends inside the header block: a cut message
            return np.int64(-1)
        if not first:
            if nxt - x == 1 or (nxt - x == 2 and byte_at(buf, p_start, p_avail, p_off, lo, hi, x) == 0x0D):
                header_end = nxt
                break
            if _ci_at(buf, p_start, p_avail, p_off, lo, hi, x, _HTTP_CONTENT_LENGTH):
                y = x + _HTTP_CONTENT_LENGTH.shape[0]
                while byte_at(buf, p_start, p_avail, p_off, lo, hi, y) in (0x20, 0x09):
                    y += 1
                v = np.int64(0)
                nd = 0
                b = byte_at(buf, p_start, p_avail, p_off, lo, hi, y)
                while 0x30 <= b <= 0x39 and nd <= MAX_HTTP_LENGTH_DIGITS:
                    v = v * 10 + (b - 0x30)
                    nd += 1
                    b = byte_at(buf, p_start, p_avail, p_off, lo, hi, y + nd)
                valid = 1 <= nd <= MAX_HTTP_LENGTH_DIGITS and (content_length < 0 or content_length == v)
                content_length = v if valid and content_length != -2 else np.int64(-2)
            elif _ci_at(buf, p_start, p_avail, p_off, lo, hi, x, _HTTP_TRANSFER_ENCODING):
                for y in range(x + _HTTP_TRANSFER_ENCODING.shape[0], nxt - _HTTP_CHUNKED.shape[0] + 1):
                    if _ci_at(buf, p_start, p_avail, p_off, lo, hi, y, _HTTP_CHUNKED):
                        chunked = True
        first = False
        x = nxt
    if header_end < 0:
        return np.int64(-1)
    if kind == HTTP_STATUS_LINE and (100 <= status < 200 or status == 204 or status == 304):
        return header_end - pos
    if chunked:  # Transfer-Encoding overrides Content-Length (§6.3 item 3)
        return _http_chunked(buf, p_start, p_avail, p_off, lo, hi, header_end, end) - pos
    if content_length >= 0:
        return header_end - pos + content_length
    if kind == HTTP_STATUS_LINE and content_length == -1:
        return max(end, header_end) - pos  # close-delimited (§6.3 item 8)
    return header_end - pos  # a request without a length has no body (§6.3 item 7); an invalid length: none either
