"""HTTP/1.x decoder (analyzer.decoders.http): byte-literal messages (RFC 9112 §3-§5), the Negotiate
tokens (RFC 4559) handed to kerberos_ap, response-to-request pairing, malformed and random input."""
from __future__ import annotations

import base64
import random

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.decoders import http, kerberos_ap
from analyzer.decoders.http_kernels import MAX_HTTP_FIELDS, MAX_TEXT
from builders import ap_req, ticket, tlv
from fakes import message_set

KRB5_OID = bytes.fromhex("06092a864886f712010202")  # 1.2.840.113554.1.2.2 (RFC 1964 §1)


def gss_krb5(token_id: bytes, message: bytes) -> bytes:
    """An RFC 2743 §3.1 InitialContextToken: [APPLICATION 0] krb5 OID, TOK_ID, Kerberos message."""
    return tlv(0x60, KRB5_OID + token_id + message)


def decode(*messages: bytes, **kw) -> pl.DataFrame:
    kw.setdefault("transport", "tcp")
    kw.setdefault("dport", 80)
    return http.decode_messages([message_set(list(messages), **kw)])


def row(message: bytes, **kw) -> dict:
    out = decode(message, **kw)
    assert out.height == 1
    return out.row(0, named=True)


REQ = (b"GET /private/index.html?q=1 HTTP/1.1\r\nHost: web.corp.example\r\nUser-Agent: curl/7.88.1\r\n"
       b"Accept: */*\r\n\r\n")


def test_request_every_field():
    r = row(REQ)
    assert r["is_request"] is True and r["decode_error"] is None
    assert (r["method"], r["target"], r["version"]) == ("GET", "/private/index.html?q=1", "HTTP/1.1")
    assert r["host"] == "web.corp.example" and r["fields"] == 3 and r["header_length"] == len(REQ)
    assert r["status_code"] is None and r["reason"] is None and r["content_length"] is None
    assert r["authorization"] is None and r["negotiate_token_length"] is None and r["request_frame"] is None


def test_response_every_field():
    m = (b"HTTP/1.1 401 Unauthorized\r\nDate: Tue, 01 Dec 2026 17:54:29 GMT\r\nWWW-Authenticate: Negotiate\r\n"
         b"WWW-Authenticate: Basic realm=\"x\"\r\nContent-Length: 381\r\nContent-Type: text/html\r\n\r\n")
    r = row(m + b"<html>", from_client=[False])
    assert r["is_request"] is False and r["decode_error"] is None
    assert (r["version"], r["status_code"], r["reason"]) == ("HTTP/1.1", 401, "Unauthorized")
    assert r["www_authenticate"] == "Negotiate" and r["www_authenticate_fields"] == 2
    assert r["content_length"] == 381 and r["chunked"] is False and r["header_length"] == len(m)
    assert r["negotiate_token_length"] is None  # a bare challenge carries no token


def test_status_line_without_reason_and_http10():
    r = row(b"HTTP/1.0 204\r\n\r\n")
    assert (r["version"], r["status_code"], r["reason"], r["decode_error"]) == ("HTTP/1.0", 204, "", None)


def test_field_names_case_insensitive_and_ows_trimmed():
    r = row(b"POST /x HTTP/1.1\r\nhOsT:\t a.example \r\ncontent-LENGTH:  12 \r\nTRANSFER-encoding: gzip, Chunked\r\n\r\n")
    assert (r["host"], r["content_length"], r["chunked"]) == ("a.example", 12, True)


def test_obs_fold_continues_a_field():
    r = row(b"GET / HTTP/1.1\r\nX-Long: a\r\n  b\r\nHost: h\r\n\r\n")
    assert r["decode_error"] is None and r["fields"] == 2 and r["host"] == "h"


def test_bare_lf_line_ends():
    r = row(b"GET / HTTP/1.1\nHost: h\n\n")
    assert r["decode_error"] is None and r["host"] == "h" and r["header_length"] == 24


def test_negotiate_token_decoded_for_kerberos_ap():
    msg = gss_krb5(b"\x01\x00", ap_req(ticket("CORP.EXAMPLE", ("HTTP", "web.corp.example"), 18, 2)))
    token = base64.b64encode(msg)
    req = b"GET /private/ HTTP/1.1\r\nHost: web\r\nAuthorization: Negotiate " + token + b"\r\n\r\n"
    sets = [message_set([REQ, req], transport="tcp", dport=80, frames=[3, 7])]
    out = http.decode_messages(sets)
    assert out["authorization"].to_list() == [None, "Negotiate"]
    assert out["negotiate_token_length"].to_list() == [None, len(msg)]
    (tok,) = http.token_sets(sets)
    assert tok.height == 1 and tok.message_bytes(0) == msg
    assert tok.frame["frame_first"].to_list() == [7]
    ap = kerberos_ap.decode_tokens("http", [tok])
    r = ap.row(0, named=True)
    assert (r["carrier"], r["frame"], r["message"], r["mech"]) == ("http", 7, "ap_req", "krb5")
    assert (r["realm"], r["sname"], r["ticket_etype"], r["ticket_kvno"]) == ("CORP.EXAMPLE", "HTTP/web.corp.example", 18, 2)


def test_www_authenticate_token_and_unpadded_base64():
    raw = bytes(range(200))
    b64 = base64.b64encode(raw).rstrip(b"=")
    r = row(b"HTTP/1.1 200 OK\r\nWWW-Authenticate: negotiate " + b64 + b"\r\nContent-Length: 0\r\n\r\n")
    assert r["www_authenticate"] == "negotiate" and r["negotiate_token_length"] == 200


def test_other_schemes_have_no_token():
    r = row(b"GET / HTTP/1.1\r\nAuthorization: Basic dXNlcjpwdw==\r\n\r\n")
    assert r["authorization"] == "Basic" and r["negotiate_token_length"] is None and r["decode_error"] is None


def test_request_frame_in_order_and_interim_responses():
    msgs = [b"GET /a HTTP/1.1\r\n\r\n", b"GET /b HTTP/1.1\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            b"GET /c HTTP/1.1\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
    out = decode(*msgs, flows=[0, 0, 0, 0, 0, 1, 1], from_client=[True, True, False, False, False, True, False],
                 frames=[10, 11, 12, 13, 14, 20, 21])
    assert out["request_frame"].to_list() == [None, None, None, 10, 11, None, 20]


@pytest.mark.parametrize("data, reason", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n", "truncated"),  # no empty line: cut by the snapshot length
    (b"GET / HTTP/1.1", "truncated"),
    (b"GET /\r\n\r\n", "bad start line"),  # HTTP/0.9-style: no version
    (b"G(T / HTTP/1.1\r\n\r\n", "bad start line"),  # not a token
    (b"GET / HTTX/1.1\r\n\r\n", "bad version"),
    (b"HTTP/1.1 99 Low\r\n\r\n", "bad status code"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "bad status code"),
    (b"HTTP/1.1 200 OK\r\nHost : x\r\n\r\n", "bad field"),  # whitespace before the colon (§5.1)
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad field"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n", "bad content-length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "bad content-length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1234567890123456789\r\n\r\n", "bad content-length"),
    (b"GET / HTTP/1.1\r\nAuthorization: Negotiate YII*gg==\r\n\r\n", "bad base64"),
    (b"GET / HTTP/1.1\r\nAuthorization: Negotiate Y\r\n\r\n", "bad base64"),  # 6 bits are no byte
])
def test_malformed(data, reason):
    assert row(data)["decode_error"] == reason


def test_malformed_keeps_what_was_read():
    r = row(b"HTTP/1.1 503 Busy\r\nContent-Length: 5\r\nbad line\r\n\r\n")
    assert (r["status_code"], r["reason"], r["content_length"], r["decode_error"]) == (503, "Busy", 5, "bad field")
    r = row(b"GET / HTTP/1.1\r\nAuthorization: Negotiate !!!!\r\nHost: h\r\n\r\n")
    assert r["host"] == "h" and r["negotiate_token_length"] is None and r["decode_error"] == "bad base64"


def test_too_many_fields():
    m = b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HTTP_FIELDS + 1) + b"Host: late\r\n\r\n"
    r = row(m)
    assert r["decode_error"] == "too many fields" and r["header_length"] == len(m)


def test_long_and_unprintable_text_is_escaped_and_bounded():
    target = b"/" + b"a" * (3 * MAX_TEXT)
    r = row(b"GET " + target + b" HTTP/1.1\r\nHost: h\xff\x01\\\r\n\r\n")
    assert len(r["target"]) == MAX_TEXT and r["host"] == "h\\xff\\x01\\x5c"


def test_several_sets_and_empty():
    a = message_set([REQ], transport="tcp", dport=80, ts=[2_000_000_000])
    b = message_set([b"HTTP/1.1 200 OK\r\n\r\n"], transport="tcp", dport=80, from_client=[False], ts=[1_000_000_000])
    out = http.decode_messages([a, b])
    assert out["is_request"].to_list() == [False, True]  # in time order
    empty = http.decode_messages([])
    assert empty.height == 0 and empty.columns == [c.name for c in http.MESSAGE_COLUMNS]
    assert http.token_sets([]) == []


def test_schema_matches_columns():
    out = decode(REQ)
    assert out.columns == [c.name for c in http.MESSAGE_COLUMNS]
    assert out.schema["status_code"] == pl.UInt16 and out.schema["request_frame"] == pl.UInt32


def test_declaration():
    p = http.PROTOCOL
    assert p.tcp_framing == "http" and set(p.tcp_ports) == {80, 8080} and p.transactions is None
    assert "http" in kerberos_ap.token_sources()


# --- hostile input ------------------------------------------------------------------------------------

SAMPLES = [REQ, b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Negotiate oXcwdaADCgEC\r\n\r\n",
           b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6))
def test_random_bytes_never_raise(messages):
    out = decode(*messages)
    assert out.height == len(messages)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 8))
def test_mutations_never_raise(seed, n):
    rng = random.Random(seed)
    msgs = []
    for _ in range(n):
        m = bytearray(rng.choice(SAMPLES))
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(3)
            k = rng.randrange(len(m)) if m else 0
            if op == 0 and m:
                m[k] = rng.randrange(256)
            elif op == 1:
                m[k:k] = bytes([rng.choice(b"\r\n: \t=")]) * rng.randrange(1, 4)
            elif m:
                del m[k:k + rng.randrange(1, 8)]
        msgs.append(bytes(m))
    out = decode(*msgs)
    assert out.height == n
    assert set(out["decode_error"].drop_nulls().to_list()) <= set(http.DECODE_ERRORS.values())


@pytest.mark.parametrize("copy_bytes, batch_bytes", [(1, 1 << 30), (100, 1), (130, 1 << 30), (300, 2000),
                                                     (4096, 1), (4096, 5000)])
def test_header_prefix_framing_is_the_whole_framing(monkeypatch, copy_bytes, batch_bytes):
    """http_messages and the Negotiate tokens are the same whether each message is copied whole or only
    its first bytes, the connections of a header longer than them framed again, and whether the
    connections are framed at once or in batches of ``batch_bytes`` of payload, down to one connection
    at a time (http._decode_capture)."""
    from pathlib import Path
    from analyzer import open_capture
    from analyzer.tcp import connection_batches
    root = Path(__file__).parent.parent
    monkeypatch.setattr(http, "HEADER_COPY_BYTES", copy_bytes)
    monkeypatch.setattr(http, "FRAMING_BATCH_BYTES", batch_bytes)
    for path in (root / "samples" / "krb5-http-replay.pcapng", root / "samples" / "eval" / "krb5-http-cached-token.pcap"):
        with open_capture(path) as cap:
            whole = http.message_sets(cap)
            want_frame, want_tokens = http.decode_messages(whole), http.token_sets(whole)
            got_frame, got_tokens = cap.frame("http_messages"), http.negotiate_token_sets(cap)
            assert got_frame.equals(want_frame)
            want_ap = kerberos_ap.decode_tokens("http", want_tokens)
            assert want_ap.height > 0 and kerberos_ap.decode_tokens("http", got_tokens).equals(want_ap)
            batches = connection_batches(cap, set(http.PROTOCOL.tcp_ports), batch_bytes)
            if batch_bytes >= 1 << 30:
                assert len(batches) == 1
            elif batch_bytes == 1:
                assert all(len(b) == 1 for b in batches)
            assert sorted(np.concatenate(batches).tolist()) == sorted(set(whole[0].frame["flow"].to_list()))


def test_framing_in_batches_on_a_capture_of_many_connections(monkeypatch, synthetic_capture):
    """The synthetic capture's web traffic (thousands of HTTP connections), framed a few at a time
    (:data:`http.FRAMING_BATCH_BYTES` of payload each) and at once: the same messages (and tokens, of
    which it has none: the samples' test above has them)."""
    from analyzer import open_capture
    from analyzer.tcp import connection_batches

    def decoded(batch_bytes):
        monkeypatch.setattr(http, "FRAMING_BATCH_BYTES", batch_bytes)
        with open_capture(synthetic_capture) as cap:
            batches = connection_batches(cap, set(http.PROTOCOL.tcp_ports), batch_bytes)
            tokens = [(frame, bytes(ms.buf[offset:offset + length])) for ms in http.negotiate_token_sets(cap)
                      for frame, offset, length in ms.frame.select("frame_last", "offset", "length").iter_rows()]
            return len(batches), cap.frame("http_messages"), sorted(tokens)

    n_whole, whole, whole_tokens = decoded(1 << 40)
    n_parts, parts, parts_tokens = decoded(200_000)
    assert n_whole == 1 and n_parts > 10 and whole.height > 1000
    assert parts.equals(whole) and parts_tokens == whole_tokens
