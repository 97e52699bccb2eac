"""Reassembly and message framing on scripted TCP streams."""
import struct

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.tcp import tcp_messages
from builders import handshake, tcp_conversation

US = 1_000


def dns_framed(body: bytes) -> bytes:
    return struct.pack(">H", len(body)) + body


def dns_body(k: int, size: int = 20) -> bytes:
    """A plausible DNS header (id k, one question) plus filler, so resynchronisation can spot it."""
    return struct.pack(">HHHHHH", k, 0x0100, 1, 0, 0, 0) + bytes([k % 251]) * (size - 12)


def nbss(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def smb2_like(k: int, size: int = 70) -> bytes:
    return b"\xfeSMB" + bytes([k % 256]) * (size - 4)


def stream_steps(stream: bytes, cuts, order=None, server=False, t0=100 * US, dup=()):
    """Steps sending ``stream`` cut at ``cuts`` (client to server unless server=True)."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(stream))), len(stream)]
    pieces = [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
    order = order or list(range(len(pieces)))
    steps = []
    t = t0
    for idx in list(order) + list(dup):
        a, b = pieces[idx]
        steps.append({"t": t, "from_client": not server, "data": stream[a:b], "seq": 1 + a, "flags": 0x18})
        t += 10 * US
    return steps


def messages(read_capture, steps, framing, ports, **kw):
    cap = read_capture(tcp_conversation(steps, **kw))
    sets = tcp_messages(cap, framing, ports)
    return cap, sets


def bodies(sets):
    return [s.message_bytes(k) for s in sets for k in range(s.height)]


def test_several_messages_per_segment_and_one_message_over_many(read_capture):
    msgs = [dns_body(k, 20 + 40 * k) for k in range(5)]
    stream = b"".join(dns_framed(m) for m in msgs)
    steps = handshake() + stream_steps(stream, [3, 30, 31, 150, 151, 152, 400])
    cap, sets = messages(read_capture, steps, "length16", {445})
    assert bodies(sets) == msgs
    f = sets[0].frame
    assert f["complete"].all() and f["from_client"].all()
    assert f["frame_first"].to_list()[0] == 4  # the segment carrying its length prefix
    assert (f["frame_last"] >= f["frame_first"]).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(12, 300), min_size=1, max_size=8), data=st.data())
def test_property_reordered_and_duplicated_segments_reassemble(read_capture, sizes, data):
    msgs = [dns_body(k, n) for k, n in enumerate(sizes)]
    stream = b"".join(dns_framed(m) for m in msgs)
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=12))
    n_pieces = len(set(cuts)) + 1
    order = data.draw(st.permutations(range(n_pieces)))
    dup = data.draw(st.lists(st.integers(0, n_pieces - 1), max_size=4))
    steps = handshake() + stream_steps(stream, cuts, order=order, dup=dup)
    _, sets = messages(read_capture, steps, "length16", {445})
    assert bodies(sets) == msgs


def test_first_copy_wins_and_conflicts_are_counted(read_capture):
    msg = dns_body(1, 40)
    stream = dns_framed(msg)
    altered = bytearray(stream)
    altered[20] ^= 0xFF
    steps = handshake() + stream_steps(stream, []) + [
        {"t": 900 * US, "from_client": True, "data": bytes(altered), "seq": 1, "flags": 0x18}]
    _, sets = messages(read_capture, steps, "length16", {445})
    assert bodies(sets) == [msg]
    assert sets[0].stats["conflict_bytes"].sum() == 1 and sets[0].stats["duplicate_bytes"].sum() == len(stream)


def test_gap_inside_a_message_keeps_framing_in_step(read_capture):
    msgs = [dns_body(k, 200) for k in range(3)]
    stream = b"".join(dns_framed(m) for m in msgs)
    # drop bytes 50..150 (inside the first message): its length prefix says where the next one starts
    steps = handshake() + stream_steps(stream, [50, 150], order=[0, 2])
    _, sets = messages(read_capture, steps, "length16", {445})
    f = sets[0].frame
    assert f.height == 3
    assert f["complete"].to_list() == [False, True, True]
    assert f["length"][0] == 48 and f["wire_length"][0] == 200
    assert bodies(sets)[1:] == msgs[1:]
    assert sets[0].stats["hole_bytes"].sum() == 100


def test_lost_header_resynchronises_at_the_next_message_start(read_capture):
    msgs = [smb2_like(k, 100) for k in range(4)]
    stream = b"".join(nbss(m) for m in msgs)
    # lose the segment holding message 1's header (bytes 104..110), messages 2 and 3 are found again
    cuts = [104, 110, 208, 312]
    steps = handshake() + stream_steps(stream, cuts, order=[0, 2, 3, 4])
    _, sets = messages(read_capture, steps, "nbss", {445})
    got = bodies(sets)
    assert got[0] == msgs[0] and got[-2:] == msgs[2:]
    assert sets[0].stats["resyncs"].sum() == 1


def test_capture_starting_mid_stream_finds_the_first_message_boundary(read_capture):
    msgs = [smb2_like(k, 100) for k in range(3)]
    stream = b"".join(nbss(m) for m in msgs)
    steps = stream_steps(stream, [60, 104, 208], order=[1, 2, 3], t0=0)  # no SYN, first piece missing
    _, sets = messages(read_capture, steps, "nbss", {445})
    assert bodies(sets) == msgs[1:]


def test_snaplen_cut_segments_give_incomplete_messages_and_framing_goes_on(read_capture):
    msgs = [smb2_like(k, 1000) for k in range(2)]
    stream = b"".join(nbss(m) for m in msgs)
    steps = handshake() + stream_steps(stream, [1004])
    for s in steps[3:]:
        s["caplen"] = 14 + 20 + 20 + 64  # headers plus 64 bytes of payload
    _, sets = messages(read_capture, steps, "nbss", {445})
    f = sets[0].frame
    assert f["wire_length"].to_list() == [1000, 1000]
    assert f["length"].to_list() == [60, 60] and not f["complete"].any()
    assert bodies(sets)[1] == msgs[1][:60]


def test_max_copy_limits_what_is_copied_not_what_is_known(read_capture):
    big = smb2_like(7, 200_000)
    steps = handshake() + stream_steps(nbss(big), list(range(1400, 200_004, 1400)))
    cap = read_capture(tcp_conversation(steps))
    (ms,) = tcp_messages(cap, "nbss", {445}, max_copy=512)
    row = ms.frame.row(0, named=True)
    assert (row["length"], row["wire_length"], row["complete"]) == (512, 200_000, True)
    assert ms.message_bytes(0) == big[:512]


def test_keepalives_are_skipped_and_both_directions_framed(read_capture):
    req, resp = smb2_like(1), smb2_like(2)
    client = b"\x85\x00\x00\x00" + nbss(req)
    steps = handshake() + stream_steps(client, []) + stream_steps(nbss(resp), [], server=True, t0=500 * US)
    _, sets = messages(read_capture, steps, "nbss", {445})
    f = sets[0].frame.sort("frame_first")
    assert bodies(sets) == [req, resp]
    assert f["from_client"].to_list() == [True, False]
    assert f["src"].cast(pl.String).to_list() == ["10.0.0.1", "10.0.0.2"]


def test_record_mark_and_ber_framings(read_capture):
    krb = b"\x6a\x05" + b"\x30\x03\x02\x01\x05"
    rm = struct.pack(">I", len(krb)) + krb
    steps = handshake() + stream_steps(rm * 2, [3, 9])
    _, sets = messages(read_capture, steps, "record_mark", {445})
    assert bodies(sets) == [krb, krb]
    ldap = b"\x30\x0c\x02\x01\x01\x60\x07\x02\x01\x03\x04\x00\x80\x00"
    long_form = b"\x30\x81\x0c" + ldap[2:]
    steps = handshake() + stream_steps(ldap + long_form, [5])
    _, sets = messages(read_capture, steps, "ber", {445})
    assert bodies(sets) == [ldap, long_form]


def test_ber_framing_passes_tls_and_sasl_buffers_through_whole(read_capture):
    tls = b"\x16\x03\x01\x00\x05" + b"hello"
    sasl = struct.pack(">I", 6) + b"secret"
    steps = handshake() + stream_steps(tls + sasl, [7])
    _, sets = messages(read_capture, steps, "ber", {445})
    assert bodies(sets) == [tls, sasl]


def test_no_connections_on_the_ports_means_no_messages(read_capture):
    steps = handshake() + stream_steps(dns_framed(dns_body(1)), [])
    cap = read_capture(tcp_conversation(steps))
    assert tcp_messages(cap, "length16", {53}) == []


def test_many_messages_in_one_segment_past_the_copy_room(read_capture):
    """One large (TSO/GRO-sized) segment holding many SMB2 messages: more bytes to copy than the first
    guess of room (max_copy per segment) and more messages than two per segment; all are framed."""
    msgs = [smb2_like(k, 3000) for k in range(20)]
    stream = b"".join(nbss(m) for m in msgs)
    steps = handshake() + stream_steps(stream, [])
    _, sets = messages(read_capture, steps, "nbss", {445})
    assert bodies(sets) == msgs
    tiny = [dns_body(k, 12) for k in range(300)]  # 14 bytes each on the wire, 300 in one segment
    _, sets = messages(read_capture, handshake() + stream_steps(b"".join(dns_framed(m) for m in tiny), []),
                       "length16", {445})
    assert bodies(sets) == tiny
