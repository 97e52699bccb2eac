"""The "http" TCP framing (analyzer/tcp/framing_http.py): RFC 9112 message lengths over reassembled
streams, resynchronisation, and hostile streams (no hang, no crash)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.tcp import tcp_messages
from analyzer.tcp.framing_http import MAX_HTTP_HEADER
from builders import handshake, stream_steps, tcp_conversation

US = 1_000
SERVER = ("10.0.0.2", 80)


def framed(read_capture, steps):
    cap = read_capture(tcp_conversation(steps, server=SERVER))
    sets = tcp_messages(cap, "http", {80})
    return sets


def by_side(sets, from_client):
    out = []
    for ms in sets:
        f = ms.frame
        for k in range(ms.height):
            if f["from_client"][k] == from_client:
                out.append((ms.message_bytes(k), f["wire_length"][k], f["complete"][k]))
    return out


REQ1 = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
REQ2 = b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
REQ3 = b"PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
R_CL = b"HTTP/1.1 200 OK\r\nContent-Length: 2500\r\n\r\n" + b"x" * 2500
R_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\nA\r\n0123456789\r\n0\r\n\r\n"
R_204 = b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n"  # §6.3: 204 has no body whatever it says
R_304 = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n"
R_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
R_CLOSE = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end of the stream"


def test_requests_and_responses_with_every_length_rule(read_capture):
    client = REQ1 + REQ2 + REQ3
    server = R_CL + R_CHUNKED + R_204 + R_304 + R_100 + R_CLOSE
    steps = (handshake() + stream_steps(client, [len(REQ1) + 3, len(REQ1) + len(REQ2) + 40])
             + stream_steps(server, list(range(1000, len(server), 1000)) + [len(R_CL) + 7], server=True,
                            t0=400 * US))
    sets = framed(read_capture, steps)
    assert [m for m, _, _ in by_side(sets, True)] == [REQ1, REQ2, REQ3]
    responses = by_side(sets, False)
    assert [m for m, _, _ in responses] == [R_CL, R_CHUNKED, R_204, R_304, R_100, R_CLOSE]
    assert all(c for _, _, c in responses)
    assert sum(int(ms.stats["resyncs"].sum()) for ms in sets) == 0


def test_head_response_with_length_resynchronises(read_capture):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"  # answer to HEAD: no body follows
    nxt = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"  # 48 bytes
    server = head + nxt * 4
    cuts = [len(head) + k * len(nxt) for k in range(4)]
    steps = handshake() + stream_steps(b"HEAD / HTTP/1.1\r\n\r\n" + b"GET /x HTTP/1.1\r\n\r\n" * 4, []) \
        + stream_steps(server, cuts, server=True, t0=400 * US)
    sets = framed(read_capture, steps)
    resp = [m for m, _, _ in by_side(sets, False)]
    # framed as if the 100-byte body were there (the framing sees one direction): it swallows two
    # responses and ends inside the third; the fourth starts a segment and is found again
    assert resp == [server[:len(head) + 100], nxt]
    assert sum(int(ms.stats["resyncs"].sum()) for ms in sets) == 1


def test_gap_in_a_body_keeps_framing(read_capture):
    body = b"y" * 3000
    r1 = b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + body
    r2 = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    steps = (handshake() + stream_steps(b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", [])
             + stream_steps(r1 + r2, [1000, 2000, len(r1)], server=True, t0=400 * US, skip=(1,)))
    resp = by_side(framed(read_capture, steps), False)
    assert len(resp) == 2 and resp[0][2] is False and resp[1][0] == r2 and resp[1][2] is True
    assert resp[0][1] == len(r1)  # wire length from Content-Length


def test_capture_ending_inside_a_header(read_capture):
    cut = b"GET /long HTTP/1.1\r\nHost: h\r\nX-A: "
    sets = framed(read_capture, handshake() + stream_steps(cut, []))
    assert [m for m, _, _ in by_side(sets, True)] == [cut]


def test_hostile_streams(read_capture):
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\nabc"
    endless_header = b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * (MAX_HTTP_HEADER + 10) + b"\r\n\r\n"
    binary = bytes(range(256)) * 20
    chunk_bomb = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"fffffffffffffffffffffff\r\n"
    zero_chunks = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0;" + b"e" * 5000 + b"\r\n\r\n"
    for server_stream in (huge, endless_header, binary, chunk_bomb, zero_chunks):
        steps = handshake() + stream_steps(b"GET / HTTP/1.1\r\n\r\n", []) + stream_steps(
            server_stream, list(range(1400, len(server_stream), 1400)), server=True, t0=400 * US)
        sets = framed(read_capture, steps)
        resp = by_side(sets, False)
        assert len(resp) <= 1
        for m, wire, _ in resp:
            assert len(m) <= max(wire, len(m)) and server_stream.startswith(m)


def test_http2_preface_then_binary_frames(read_capture):
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    frames = bytes.fromhex("000000040000000000") + bytes(range(200))  # SETTINGS, then noise
    sets = framed(read_capture, handshake() + stream_steps(preface + frames, [len(preface)]))
    assert [m for m, _, _ in by_side(sets, True)] == [b"PRI * HTTP/2.0\r\n\r\n"]
    assert sum(int(ms.stats["skipped_bytes"].sum()) for ms in sets) == len(preface) + len(frames) - 18


def test_not_http_on_port_80_is_not_framed(read_capture):
    tls = bytes.fromhex("160301") + b"\x00\x50" + b"\x01" * 80
    sets = framed(read_capture, handshake() + stream_steps(tls + b"\x00" * 500, [85]))
    assert by_side(sets, True) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([REQ1, REQ2, REQ3, b"\r\n", b"0\r\n", b"Content-Length: 7\r\n", b"HTTP/1.1 200 ",
                                 b"zz", b"\xff\x00"]), min_size=1, max_size=12),
       st.lists(st.integers(1, 400), max_size=5))
def test_random_streams_never_raise(read_capture, parts, cuts):
    stream = b"".join(parts)
    sets = framed(read_capture, handshake() + stream_steps(stream, cuts))
    for m, wire, _ in by_side(sets, True):
        assert m in stream and len(m) <= wire + len(stream)
