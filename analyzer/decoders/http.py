"""HTTP/1.x messages (RFC 9112), as the carrier of SPNEGO ``Negotiate`` authentication (RFC 4559).

Transport: TCP ports 80 and 8080, framed by ``analyzer.tcp.tcp_messages(cap, "http", ...)``
(``analyzer/tcp/framing_http.py``: start line and header fields up to the empty line, then the body
by RFC 9112 §6.3). TLS (443) is out of reach; HTTP/2 (RFC 9113) on these ports is not decoded: its
connection preface reads as a ``PRI * HTTP/2.0`` request, the binary frames after it are not framed
(the direction is resynchronised and given up, counted in the direction stats).

A row of ``http_messages`` is one request or response: the start line (method, request-target and
version, §3; version, status code and reason phrase, §4), the fields Host, Content-Length,
Transfer-Encoding (chunked), the scheme of Authorization (RFC 9110 §11.6.2) and of the first
WWW-Authenticate field (§11.6.1) with the count of WWW-Authenticate fields, and the size of the
``Negotiate`` token (base64, RFC 4559 §4) either carries. ``request_frame`` of a response is the first
frame of the request it answers: responses answer requests in order on a connection (RFC 9112 §9.3.2),
1xx interim responses answer none. A message that breaks the grammar keeps the fields read before the
problem and says which in ``decode_error`` (``truncated``: the bytes end before the empty line, a
snapshot length or the end of the capture; ``bad start line``, ``bad version``, ``bad status code``,
``bad field``: a line without a colon or with whitespace before it, §5.1; ``too many fields``: more
than :data:`MAX_HTTP_FIELDS`; ``bad content-length``; ``bad base64``: a Negotiate token that is not
base64, RFC 4648 §4).

The Negotiate tokens go to ``analyzer.decoders.kerberos_ap`` as the ``http`` carrier
(:func:`negotiate_token_sets`): one message set row per token, carrying the HTTP message's columns,
its bytes the base64-decoded token; ``kerberos_ap`` decodes the Kerberos inside.

No ``http_transactions``: the transaction detectors (herd, retry_storm, conn_churn, saturation) would
read HTTP with rules made for DNS, Kerberos, LDAP and SMB2 (every Negotiate authentication starts with
a 401 that a transaction frame would count as an error; one-request connections read as churn); see
the module's tests for what the messages frame gives instead (``request_frame``, ``status_code``).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from ..capture import frame_builder
from ..message_set import MessageSet
from ..messages import FRAMING_BATCH_BYTES, KEPT_COLUMNS, protocol_message_sets
from ..tcp import connection_batches, tcp_messages
from ..schema import FRAMES, Column, column, empty_frame
from . import ber
from .kerberos_ap import register_token_source
from .http_kernels import (  # noqa: F401  (MAX_HTTP_FIELDS is public here too)
    BAD_BASE64, BAD_FIELD, BAD_LENGTH, BAD_START, BAD_STATUS, BAD_VERSION, I_CHUNKED, I_CODE,
    I_CONTENT_LENGTH, I_ERROR, I_FIELDS, I_HEADER_LEN, I_KIND, I_MAJOR, I_MINOR, I_TOKEN_AT,
    I_TOKEN_LEN, I_WWW_COUNT, KIND_REQUEST, MAX_HTTP_FIELDS, MAX_TEXT, N_INTS, N_STRS, OK,
    TOO_MANY_FIELDS, TRUNCATED)
from .protocol import Protocol

PROTOCOL = Protocol(
    name="http", title="HTTP", spec="RFC 9112", tcp_ports=(80, 8080), tcp_framing="http",
    frames=("http_messages",), transactions=None,
    requests_noun="HTTP requests",  # services: info's port table names 80 and 8080 already (summary.OTHER_SERVICES)
)

DECODE_ERRORS = {TRUNCATED: "truncated", BAD_START: "bad start line", BAD_VERSION: "bad version",
                 BAD_STATUS: "bad status code", BAD_FIELD: "bad field", TOO_MANY_FIELDS: "too many fields",
                 BAD_LENGTH: "bad content-length", BAD_BASE64: "bad base64"}

MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + (
    column("is_request", np.bool_, "a request (request-line, RFC 9112 §3) rather than a response (status-line, "
         "§4)"),
    column("method", object, "request method (§3.1; RFC 9110 §9); tshark http.request.method", polars=pl.String),
    column("target", object, "request-target (§3.2), at most 2048 bytes kept; tshark http.request.uri",
         polars=pl.String),
    column("version", object, "HTTP-version (§2.3), e.g. HTTP/1.1; tshark http.request.version / "
         "http.response.version", polars=pl.String),
    column("status_code", np.uint16, "response status code (§4; RFC 9110 §15); tshark http.response.code"),
    column("reason", object, "reason-phrase (§4); tshark http.response.phrase", polars=pl.String),
    column("host", object, "Host field value (RFC 9110 §7.2); tshark http.host", polars=pl.String),
    column("content_length", np.int64, "Content-Length (RFC 9110 §8.6); tshark http.content_length_header"),
    column("chunked", np.bool_, "Transfer-Encoding names chunked (RFC 9112 §7.1)"),
    column("header_length", np.uint32, "bytes from the start line to the empty line, inclusive (§2.1); null "
         "when truncated"),
    column("fields", np.uint16, "header field lines (obs-fold continuations not counted)"),
    column("authorization", object, "scheme of the Authorization field (RFC 9110 §11.6.2): Negotiate, Basic, "
         "NTLM ...; tshark http.authorization (its first word)", polars=pl.String),
    column("www_authenticate", object, "scheme of the first WWW-Authenticate field (RFC 9110 §11.6.1); tshark "
         "http.www_authenticate (its first word)", polars=pl.String),
    column("www_authenticate_fields", np.uint16, "WWW-Authenticate field lines in the response"),
    column("negotiate_token_length", np.int32, "bytes of the base64-decoded Negotiate token of Authorization or "
         "WWW-Authenticate (RFC 4559 §4), null when none (a bare 'Negotiate' challenge has none)"),
    column("request_frame", np.uint32, "responses: frame_first of the request this answers (in order on the "
         "connection, RFC 9112 §9.3.2; 1xx interim responses: null)"),
    column("decode_error", object, "null when the message decoded, else why not (see the module docstring)",
         polars=pl.String),
)
FRAMES.setdefault("http_messages", MESSAGE_COLUMNS)  # descriptions for ``herdscope export``

# Bytes of each message the first framing copies (analyzer.tcp copies up to 64 KiB of each, bodies
# included, by default: 214 MB on the 1M-packet synthetic capture). The decoder reads only the header
# block, so a message whose empty line lies within this prefix decodes the same; the connections of
# the others are framed again with the default copy (see _decoded_capture).
HEADER_COPY_BYTES = 4096

_NO_BYTES = np.zeros(0, np.uint8)
_STR_NAMES = ("method", "target", "reason", "host", "authorization", "www_authenticate")
_INT_COLUMNS = {"status_code": (I_CODE, pl.UInt16), "content_length": (I_CONTENT_LENGTH, pl.Int64),
                "header_length": (I_HEADER_LEN, pl.UInt32), "fields": (I_FIELDS, pl.UInt16),
                "www_authenticate_fields": (I_WWW_COUNT, pl.UInt16)}


def _kernel(ms: MessageSet):
    """(rows, ints, spans, arena, token buffer, token offsets, token lengths) of one message set."""
    from .http_kernels import base64_decode, decode_all  # lazy: Numba kernels, only with HTTP messages

    offsets = ms.frame["offset"].to_numpy().astype(np.int64)
    lengths = ms.frame["length"].to_numpy().astype(np.int64)
    n = offsets.shape[0]
    if n and (offsets.min() < 0 or (offsets + lengths).max() > ms.buf.shape[0]):
        raise ValueError("message set offsets/lengths outside its buffer")
    ints = np.empty((N_INTS, n), np.int64)
    spans = np.empty((2 * N_STRS, n), np.int64)
    # every string is a disjoint part of its message, escaped at most 4x, at most MAX_TEXT source bytes
    arena = np.empty(int(4 * np.minimum(lengths, N_STRS * MAX_TEXT).sum()) + 16, np.uint8)
    used = decode_all(ms.buf, offsets, lengths, ints, spans, arena)
    has_token = ints[I_TOKEN_AT] != ber.NULL
    t_start = ints[I_TOKEN_AT][has_token]
    t_len = ints[I_TOKEN_LEN][has_token]
    tokens = np.empty(int(t_len.sum() * 3 // 4) + 16, np.uint8)
    t_at = np.empty(t_start.shape[0], np.int64)
    t_out = np.empty(t_start.shape[0], np.int64)
    t_used = base64_decode(ms.buf, t_start, t_len, tokens, t_at, t_out)
    tok_len = np.full(n, ber.NULL, np.int64)
    tok_at = np.full(n, -1, np.int64)
    tok_len[has_token] = np.where(t_out >= 0, t_out, ber.NULL)
    tok_at[has_token] = t_at
    bad = np.zeros(n, np.bool_)
    bad[has_token] = t_out < 0
    ints[I_ERROR] = np.where(bad & (ints[I_ERROR] == OK), BAD_BASE64, ints[I_ERROR])
    ints[I_TOKEN_LEN] = tok_len
    ints[I_TOKEN_AT] = tok_at
    return np.arange(n, dtype=np.int64), ints, spans, arena[:used], tokens[:t_used]


def _decoded(ints, spans, arena) -> pl.DataFrame:
    major, minor = ints[I_MAJOR], ints[I_MINOR]
    return pl.DataFrame([
        pl.Series("is_request", ints[I_KIND] == KIND_REQUEST),
        *ber.string_columns(_STR_NAMES, arena, spans),
        pl.Series("_major", major), pl.Series("_minor", minor),
        *[ber.int_column(name, ints[k], dtype) for name, (k, dtype) in _INT_COLUMNS.items()],
        pl.Series("chunked", ints[I_CHUNKED] == 1),
        ber.int_column("negotiate_token_length", ints[I_TOKEN_LEN], pl.Int32),
        pl.Series("decode_error", ints[I_ERROR]).replace_strict(DECODE_ERRORS, default=None,
                                                                return_dtype=pl.String),
    ]).with_columns(
        pl.when(pl.col("_major") >= 0).then(pl.format("HTTP/{}.{}", "_major", "_minor")).alias("version"))


def _answered_requests(frame: pl.DataFrame) -> pl.Series:
    """request_frame: per connection, the k-th final response answers the k-th request (§9.3.2)."""
    f = frame.with_row_index("_row")
    final = ~pl.col("is_request") & ~pl.col("status_code").is_between(100, 199).fill_null(False)
    req = f.filter(pl.col("is_request")).sort("ts_first_ns", "frame_first", "_row").with_columns(
        pl.int_range(pl.len()).over("flow").alias("_k")).select("flow", "_k", pl.col("frame_first").alias("_req"))
    resp = f.filter(final).sort("ts_first_ns", "frame_first", "_row").with_columns(
        pl.int_range(pl.len()).over("flow").alias("_k")).select("_row", "flow", "_k")
    paired = resp.join(req, on=["flow", "_k"], how="inner")
    out = f.select("_row").join(paired.select("_row", "_req"), on="_row", how="left", maintain_order="left")
    return out["_req"].cast(pl.UInt32).alias("request_frame")


def _decode(sets: list[MessageSet]):
    """(http_messages, the Negotiate token sets) of these message sets."""
    sets = [ms for ms in sets if ms.height]
    return _assemble(sets, [_kernel(ms) for ms in sets])


def _assemble(sets: list[MessageSet], parts: list[tuple]):
    """(http_messages, token sets) from each set's :func:`_kernel` output, whose first item says
    which of the set's rows its columns are."""
    if not sets:
        return empty_frame(MESSAGE_COLUMNS), []
    base, ints, spans, arena = ber.stack_sets(sets, [p[:4] for p in parts])
    frame = pl.concat([base, _decoded(ints, spans, arena)], how="horizontal")
    frame = frame.with_columns(_answered_requests(frame)).select([c.name for c in MESSAGE_COLUMNS])
    tokens = []
    for ms, (rows, p_ints, _, _, tbuf) in zip(sets, parts):
        keep = p_ints[I_TOKEN_LEN] != ber.NULL
        if keep.any():
            carriers = ms.frame[rows[keep]].with_columns(
                pl.Series("offset", p_ints[I_TOKEN_AT][keep]),
                pl.Series("length", p_ints[I_TOKEN_LEN][keep].astype(np.uint32)))
            tokens.append(MessageSet(carriers, tbuf))
    return frame, tokens


def _only_rows(part: tuple, rows: np.ndarray) -> tuple:
    """A :func:`_kernel` output restricted to these of its rows."""
    u, ints, spans, arena, tbuf = part
    return u[rows], ints[:, rows], spans[:, rows], arena, tbuf


def _decode_capture(cap):
    """``_decode(message_sets(cap))`` without copying every message's body, nor every message's header
    at once: framed first copying ``header_copy_bytes`` of each message, :data:`FRAMING_BATCH_BYTES`
    of the connections' payload at a time; a message whose header block was not within them (no
    empty line, the copy full) has its connection framed again as :func:`message_sets` frames it,
    and that connection's rows come from there. Each connection is framed on its own (so its messages
    are the same either way, analyzer.tcp.tcp_messages) and the decoder reads nothing past the empty
    line, so the result is the same by construction; message and token order is by time with a set's
    row order breaking ties, and ties are within one direction, which comes whole from one framing."""
    header_copy_bytes = HEADER_COPY_BYTES
    first, parts = [], []
    for batch in connection_batches(cap, set(PROTOCOL.tcp_ports), FRAMING_BATCH_BYTES):
        for ms in tcp_messages(cap, PROTOCOL.tcp_framing, set(PROTOCOL.tcp_ports), client_side=PROTOCOL.client_side,
                               max_copy=header_copy_bytes, only_conns=batch):
            if ms.height:
                parts.append(_kernel(ms))
                first.append(dataclasses.replace(ms, buf=_NO_BYTES))  # decoded: its copies are not read again
    again = [np.flatnonzero((p[1][I_HEADER_LEN] == ber.NULL)
                            & (ms.frame["length"].to_numpy() >= header_copy_bytes)) for ms, p in zip(first, parts)]
    redo = pl.concat([ms.frame["flow"][rows] for ms, rows in zip(first, again)]).unique() if first else None
    if redo is None or redo.len() == 0:
        return _assemble(first, parts)
    kept = [np.flatnonzero(~ms.frame["flow"].is_in(redo.implode()).to_numpy()) for ms in first]
    whole = [ms for ms in protocol_message_sets(cap, PROTOCOL, only_conns=redo) if ms.height]
    return _assemble(first + whole, [_only_rows(p, rows) for p, rows in zip(parts, kept)]
                     + [_kernel(ms) for ms in whole])


def decode_messages(sets: list[MessageSet]) -> pl.DataFrame:
    """HTTP message sets (framed TCP messages) → http_messages, one row per message, in time order."""
    return _decode(sets)[0]


def token_sets(sets: list[MessageSet]) -> list[MessageSet]:
    """The Negotiate tokens of these HTTP message sets as message sets: one row per token with the
    columns of the HTTP message carrying it (frame_first, flow, from_client ...), offset/length its
    base64-decoded bytes in the set's own buffer."""
    return _decode(sets)[1]


def message_sets(cap) -> list[MessageSet]:
    """HTTP message sets of a capture (TCP 80, 8080, framed by RFC 9112)."""
    return protocol_message_sets(cap, PROTOCOL)


def _decoded_capture(cap):
    return cap.memo("http_decoded", lambda: _decode_capture(cap))


def negotiate_token_sets(cap) -> list[MessageSet]:
    """kerberos_ap's ``http`` carrier: the Negotiate tokens of the capture's HTTP messages."""
    return _decoded_capture(cap)[1]


@frame_builder("http_messages")
def _build_messages(cap) -> pl.DataFrame:
    return _decoded_capture(cap)[0]


register_token_source("http", negotiate_token_sets)  # kerberos_ap decodes the Kerberos inside the tokens
