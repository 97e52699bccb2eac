"""DNS decoder: byte-literal messages (RFC 1035 §4.1, RFC 6891, RFC 2308), hostile variants, random
input (Hypothesis), and query/response pairing on small constructed message sets."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import builders as b
from builders import (dns_header as header, dns_name as name, dns_opt as opt, dns_query as query,
                      dns_question as question, dns_response as response, dns_rr as rr, dns_soa as soa)
from analyzer.messages import KEPT_COLUMNS
from analyzer import open_capture
from analyzer.decoders import dns
from analyzer.decoders import dns_kernels as k
from analyzer.decoders.common import COMMON_NAMES
from analyzer.messages import MESSAGE_COLUMNS, TRANSPORTS, MessageSet

CORPUS = Path(__file__).parent / "data" / "corpus"
S = 1_000_000_000  # one second in ns

# --- message sets ----------------------------------------------------------------------------------


def mset(messages, transport="udp", addresses=("10.0.0.1", "10.0.0.53")) -> MessageSet:
    """A message set over one buffer. ``messages``: bytes, or dicts with ``data`` and any of frame, ts
    (seconds), src/dst, sport/dport (a query goes client→server unless given), wire_length."""
    rows, buf = [], bytearray()
    for n, m in enumerate(messages, start=1):
        m = {"data": m} if isinstance(m, (bytes, bytearray)) else dict(m)
        data = bytes(m["data"])
        is_response = len(data) > 2 and data[2] & 0x80
        client, server = addresses
        src, dst = (server, client) if is_response else (client, server)
        sport, dport = (53, 40000) if is_response else (40000, 53)
        ts = int(m.get("ts", n) * S)
        rows.append({
            "transport": transport, "flow": 0, "from_client": not is_response,
            "src": m.get("src", src), "dst": m.get("dst", dst),
            "sport": m.get("sport", sport), "dport": m.get("dport", dport),
            "frame_first": m.get("frame", n), "frame_last": m.get("frame", n),
            "ts_first_ns": ts, "ts_last_ns": ts, "offset": len(buf), "length": len(data),
            "wire_length": m.get("wire_length", len(data)),
            "complete": m.get("wire_length", len(data)) == len(data),
        })
        buf += data + b"\xee" * 3  # junk between messages: nothing may read past a message
    schema = {c.name: pl.Series(np.empty(0, c.dtype)).dtype for c in MESSAGE_COLUMNS
              if c.dtype is not object}
    schema |= {"transport": TRANSPORTS, "src": pl.String, "dst": pl.String}
    frame = pl.DataFrame(rows, schema=schema).select([c.name for c in MESSAGE_COLUMNS])
    return MessageSet(frame, np.frombuffer(bytes(buf), np.uint8))


def decode(*messages, **kw) -> pl.DataFrame:
    return dns.decode_messages([mset(messages, **kw)])


def one(data: bytes) -> dict:
    frame = decode(data)
    assert frame.height == 1
    return frame.row(0, named=True)


# --- header, question, answers ---------------------------------------------------------------------


def test_query_fields():
    r = one(query("www.Example.COM", qtype=28, ident=0xBEEF))
    assert (r["id"], r["qr"], r["opcode"], r["opcode_name"], r["rd"]) == (0xBEEF, False, 0, "QUERY", True)
    assert (r["aa"], r["tc"], r["ra"], r["z"], r["ad"], r["cd"]) == (False,) * 6
    assert (r["qdcount"], r["ancount"], r["nscount"], r["arcount"]) == (1, 0, 0, 0)
    assert (r["qname"], r["qtype"], r["qtype_name"], r["qclass"]) == ("www.Example.COM", 28, "AAAA", 1)
    assert (r["rcode"], r["rcode_name"]) == (0, "NOERROR")
    assert r["edns"] is False and r["edns_udp_size"] is None and r["edns_do"] is None
    assert r["answer_ttl_min"] is None and r["negative_ttl"] is None and r["decode_error"] is None


@pytest.mark.parametrize("bit,column", [(10, "aa"), (9, "tc"), (8, "rd"), (7, "ra"), (6, "z"), (5, "ad"),
                                        (4, "cd")])
def test_each_flag_bit(bit, column):
    r = one(header(flags=0x8000 | (1 << bit), qd=0))
    flags = {c: r[c] for c in ("aa", "tc", "rd", "ra", "z", "ad", "cd")}
    assert flags == {c: c == column for c in flags}
    assert r["qr"] is True


@pytest.mark.parametrize("opcode,label", [(0, "QUERY"), (1, "IQUERY"), (2, "STATUS"), (4, "NOTIFY"),
                                          (5, "UPDATE"), (6, "DSO"), (9, "OPCODE9")])
def test_opcodes(opcode, label):
    r = one(header(flags=opcode << 11, qd=0))
    assert (r["opcode"], r["opcode_name"]) == (opcode, label)


def test_answer_ttls_and_types():
    r = one(response("www.example.com", answers=[
        rr(5, 3600, name("web.example.com")), rr(1, 60, b"\x0a\0\0\1", owner=name("web.example.com")),
        rr(1, 120, b"\x0a\0\0\2", owner=name("web.example.com"))],
        additional=[rr(1, 5, b"\x0a\0\0\3", owner=name("ns.example.com"))]))
    assert (r["ancount"], r["arcount"], r["answer_ttl_min"], r["answers_of_qtype"]) == (3, 1, 60, 2)
    assert r["negative_ttl"] is None  # a positive answer
    assert r["decode_error"] is None


def test_any_counts_every_answer():
    r = one(response(qtype=255, answers=[rr(1), rr(28, rdata=bytes(16)), rr(15, rdata=b"\0\1" + name("mx"))]))
    assert (r["qtype_name"], r["answers_of_qtype"]) == ("ANY", 3)


@pytest.mark.parametrize("ttl,minimum,expected", [(3600, 900, 900), (300, 900, 300)])
def test_nxdomain_negative_ttl(ttl, minimum, expected):
    r = one(response("nope.example.com", rcode=3, authority=[soa(ttl, minimum, owner=name("example.com"))]))
    assert (r["rcode_name"], r["negative_ttl"], r["answer_ttl_min"]) == ("NXDOMAIN", expected, None)


def test_nodata_negative_ttl():
    r = one(response("example.com", qtype=28, authority=[soa(600, 300)]))
    assert r["negative_ttl"] == 300
    # a CNAME that leads nowhere is NODATA for the asked type too (RFC 2308 §2.2)
    r = one(response("www.example.com", qtype=28, answers=[rr(5, 50, name("x.example.com"))],
                     authority=[soa(600, 300, owner=name("example.com"))]))
    assert (r["answer_ttl_min"], r["answers_of_qtype"], r["negative_ttl"]) == (50, 0, 300)


def test_no_negative_ttl_for_referral_positive_or_error():
    referral = response("www.example.com", authority=[rr(2, 172800, name("ns1.example.com"),
                                                         owner=name("example.com"))])
    positive = response(answers=[rr(1, 60)], authority=[soa(600, 300)])
    servfail = response(rcode=2, authority=[soa(600, 300)])
    for data in (referral, positive, servfail):
        assert one(data)["negative_ttl"] is None


def test_first_soa_of_authority_only():
    r = one(response(rcode=3, answers=[], authority=[soa(100, 50), soa(10, 5)]))
    assert r["negative_ttl"] == 50
    r = one(response(rcode=3, additional=[soa(10, 5)]))  # not in the authority section
    assert r["negative_ttl"] is None


def test_edns_and_extended_rcode():
    r = one(response(rcode=7, additional=[opt(size=1232, ext_rcode=1, version=0, do=True)]))
    assert (r["edns"], r["edns_udp_size"], r["edns_version"], r["edns_do"]) == (True, 1232, 0, True)
    assert (r["rcode"], r["rcode_name"]) == (23, "BADCOOKIE")
    r = one(response(rcode=0, additional=[opt(size=4096, ext_rcode=1, version=1)]))
    assert (r["rcode"], r["rcode_name"], r["edns_version"], r["edns_do"]) == (16, "BADVERS", 1, False)
    r = one(query(edns=512))
    assert (r["edns"], r["edns_udp_size"], r["rcode"]) == (True, 512, 0)


def test_unknown_codes_are_named_rfc3597_style():
    r = one(response(qtype=65280, rcode=0, additional=[opt(ext_rcode=250)]))
    assert (r["qtype_name"], r["rcode"], r["rcode_name"]) == ("TYPE65280", 4000, "RCODE4000")


def test_no_question():
    r = one(header(flags=0x8181, qd=0))
    assert (r["qname"], r["qtype"], r["qtype_name"], r["answers_of_qtype"]) == (None, None, None, None)
    assert (r["rcode_name"], r["decode_error"]) == ("FORMERR", None)


def test_several_questions_first_is_kept():
    data = header(qd=3, an=1) + question("a.example") + question("b.example", 28) + question(b"\xc0\x0c", 16) \
        + rr(1, 77)
    r = one(data)
    assert (r["qname"], r["qtype"], r["answer_ttl_min"], r["decode_error"]) == ("a.example", 1, 77, None)


# --- names ------------------------------------------------------------------------------------------


def test_root_name():
    assert one(query(".", qtype=2))["qname"] == "<Root>"


def test_unprintable_bytes_escaped():
    # a '.' inside a label is shown as is (as Wireshark does); '\\', controls and non-ASCII as \xNN
    wire = b"\x03a.b\x04a\\\x00\xff\x03com\x00"
    assert one(header() + wire + b"\0\1\0\1")["qname"] == "a.b.a\\x5c\\x00\\xff.com"


def test_name_of_63_byte_labels_up_to_255():
    labels = [b"a" * 63, b"b" * 63, b"c" * 63, b"d" * 61]  # 4 + 63*3 + 61 + 1 = 255 octets
    wire = b"".join(bytes([len(x)]) + x for x in labels) + b"\0"
    assert len(wire) == 255
    r = one(header() + wire + b"\0\1\0\1")
    assert r["qname"] == ".".join(x.decode() for x in labels) and r["decode_error"] is None


def _read(buf: bytes, pos: int, end: int | None = None):
    """dns_kernels.read_name on a message that is all of ``buf``: (text, next position, error)."""
    arr = np.frombuffer(buf, np.uint8)
    arena = np.zeros(2048, np.uint8)
    end = len(buf) if end is None else end
    nxt, out, err = k.read_name(arr, 0, end, len(buf), pos, arena, 0)
    return (bytes(arena[:out]).decode() if err == 0 else None), nxt, err


def test_compression_pointer_to_an_earlier_name():
    msg = header() + name("example.com")  # at 12
    second = len(msg)
    msg += b"\x03www\xc0\x0c"  # www + pointer to 12
    third = len(msg)
    msg += b"\x02m1\xc0" + bytes([second])  # m1 -> www -> example.com
    assert _read(msg, second) == ("www.example.com", second + 6, 0)
    assert _read(msg, third) == ("m1.www.example.com", third + 5, 0)


@pytest.mark.parametrize("wire,error", [
    (b"\xc0\x0c", k.E_POINTER_LOOP),  # points at itself
    (b"\x01a\xc0\x0c", k.E_POINTER_LOOP),  # back to the start of its own run
    (b"\x01a\xc0\x0f", k.E_FORWARD_POINTER),  # past itself
    (b"\x01a\xff\xff", k.E_POINTER_OOB),  # past the message
    (b"\x41abc\x00", k.E_LABEL_TYPE),  # 01xxxxxx extended label
    (b"\x81abc\x00", k.E_LABEL_TYPE),  # 10xxxxxx reserved
    (b"\x05ab", k.E_TRUNCATED),  # label runs past the end
    (b"\x01a", k.E_TRUNCATED),  # no terminating root label
    (b"\x01a\xc0", k.E_TRUNCATED),  # half a pointer
])
def test_name_errors(wire, error):
    assert _read(header() + wire, 12)[2] == error


def test_backward_pointer_into_its_own_run_is_a_loop():
    # 18: pointer to 12; 12: "a", "b", then a pointer at 16 back to 14: before itself, but inside
    # the run that began at 12, so following it would go round for ever
    msg = header() + b"\x01a\x01b\xc0\x0e" + b"\xc0\x0c"
    assert _read(msg, 18)[2] == k.E_POINTER_LOOP


def test_overlapping_runs_are_caught():
    # 21: pointer to 14; 14: a 4-octet label that swallows 15..18, then at 19 a pointer to 12
    # (before the run start 14: allowed); 12: "x", then the label at 14 again and the pointer at 19
    # to 12, which is not before the run start 12 any more
    msg = header() + b"\x01x" + b"\x04abcd" + b"\xc0\x0c" + b"\xc0\x0e"
    assert _read(msg, 21)[2] == k.E_POINTER_LOOP


def test_name_longer_than_255_octets():
    wire = b"".join(b"\x3f" + b"x" * 63 for _ in range(4)) + b"\0"  # 257 octets
    assert _read(header() + wire, 12)[2] == k.E_NAME_TOO_LONG
    # also when the length comes from following pointers: 200 octets + a pointer to 200 more
    first = header() + b"".join(b"\x27" + b"y" * 39 for _ in range(5)) + b"\0"
    second = len(first)
    msg = first + b"".join(b"\x27" + b"z" * 39 for _ in range(2)) + b"\xc0\x0c"
    assert _read(msg, second)[2] == k.E_NAME_TOO_LONG


def test_pointer_work_is_bounded():
    # a ladder of pointers, each to the previous one: follows at most MAX_POINTERS hops, no hang
    msg = bytearray(header() + b"\x00")  # 12: root
    for _ in range(3000):
        msg += struct.pack(">H", 0xC000 | (len(msg) - 2 if len(msg) > 13 else 12))
    err = _read(bytes(msg), len(msg) - 2)[2]
    assert err == k.E_POINTER_LOOP


# --- malformed messages ----------------------------------------------------------------------------

MALFORMED = {
    "empty": (b"", "truncated header"),
    "11 bytes": (header()[:11], "truncated header"),
    "question name cut": (header() + b"\x07exam", "truncated question"),
    "question type cut": (header() + name("example.com") + b"\x00", "truncated question"),
    "pointer loop": (header() + b"\x01a\xc0\x0c\0\1\0\1", "pointer loop"),
    "forward pointer": (header() + b"\xc0\x10\0\1\0\1\x01a\x00", "forward pointer"),
    "pointer out of bounds": (header() + b"\xc3\x00\0\1\0\1", "pointer out of bounds"),
    "label type": (header() + b"\x41\x00\0\1\0\1", "bad label type"),
    "label length overflow": (header() + b"\x3fabc\0\1\0\1", "truncated question"),
    "name too long": (header() + b"".join(b"\x3f" + b"x" * 63 for _ in range(5)) + b"\0\0\1\0\1",
                      "name too long"),
    "absurd qdcount": (header(qd=65535) + question(), "truncated question"),
    "absurd ancount": (header(an=65535) + question() + rr(1, 9), "truncated rr"),
    "rr fixed part cut": (header(an=1) + question() + rr()[:8], "truncated rr"),
    "rdata cut": (header(an=2) + question() + rr(1, 40) + rr(1, 30)[:-2], "truncated rr"),
    "rr owner label type": (header(an=1) + question() + b"\x80" + rr()[2:], "bad label type"),
    "opt in answer": (header(flags=0x8180, an=1) + question() + opt(), "misplaced opt"),
    "opt in authority": (header(flags=0x8180, ns=1) + question() + opt(), "misplaced opt"),
    "two opts": (header(flags=0x8180, ar=2) + question() + opt(512) + opt(4096), "multiple opt"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed(case):
    data, error = MALFORMED[case]
    r = one(data)
    assert r["decode_error"] == error


def test_malformed_keeps_what_was_decoded():
    r = one(MALFORMED["rdata cut"][0])
    # the second RR's fixed part was read: its TTL counts (as tshark shows it), its RDATA is cut
    assert (r["id"], r["qname"], r["qtype"], r["answer_ttl_min"]) == (0x1234, "example.com", 1, 30)
    r = one(MALFORMED["two opts"][0])
    assert (r["edns"], r["edns_udp_size"]) == (True, 512)  # the first OPT counts
    r = one(MALFORMED["opt in answer"][0])
    assert r["edns"] is False and r["answer_ttl_min"] is None
    r = one(MALFORMED["11 bytes"][0])
    assert all(r[c] is None for c in ("id", "qr", "rcode", "qdcount", "edns", "qname"))
    r = one(MALFORMED["pointer loop"][0])
    assert (r["id"], r["qname"], r["qtype"]) == (0x1234, None, None)


def test_truncated_by_snapshot_length():
    data = response(answers=[rr(1, 60), rr(1, 30)])
    frame = decode({"data": data[:-3], "wire_length": len(data)})  # the last RDATA is cut
    r = frame.row(0, named=True)
    assert (r["complete"], r["wire_length"], r["answer_ttl_min"], r["decode_error"]) == (False, len(data), 30,
                                                                                       "truncated rr")


def test_pointer_into_the_uncaptured_part_is_truncation_not_out_of_bounds():
    data = header() + b"\x01a\xc0\x0c\0\1\0\1"
    arr = np.frombuffer(data, np.uint8)
    arena = np.zeros(64, np.uint8)
    # captured end 14 (the pointer is cut): truncated; wire end far away: a pointer to 12 is a loop
    assert k.read_name(arr, 0, 14, 1000, 12, arena, 0)[2] == k.E_TRUNCATED


# --- frames -----------------------------------------------------------------------------------------


def test_one_row_per_message_in_frame_order_and_schema():
    msgs = [{"data": query(ident=i), "frame": 10 - i} for i in range(5)] + [{"data": b"", "frame": 20}]
    frame = decode(*msgs)
    assert frame.height == 6
    assert frame["frame_last"].to_list() == [6, 7, 8, 9, 10, 20]
    assert frame["id"].to_list() == [4, 3, 2, 1, 0, None]
    assert frame.columns == [c.name for c in KEPT_COLUMNS + dns.DECODED_COLUMNS]
    marked = dns.mark_messages(frame)
    assert marked.columns == [c.name for c in dns.MESSAGE_COLUMNS]
    assert marked.schema["decode_error"] == dns.DECODE_ERROR_ENUM
    for c in dns.MESSAGE_COLUMNS + dns.TRANSACTION_COLUMNS:
        assert c.description and len(c.description) > 5


def test_several_sets_and_buffers():
    a = mset([query("a.example", ident=1), response("a.example", ident=1, answers=[rr(1, 5)])])
    c = mset([{"data": query("c.example", ident=3), "frame": 3}], transport="tcp")
    frame = dns.decode_messages([a, c, mset([])])
    assert frame["qname"].to_list() == ["a.example", "a.example", "c.example"]
    assert frame["transport"].to_list() == ["udp", "udp", "tcp"]


def test_tcp_messages_in_one_segment():
    """DNS over TCP: the framing hands over messages after their length prefix; several may share a
    segment (frame_last) and keep their stream order."""
    msgs = [{"data": query(f"q{i}.example", ident=i), "frame": 7, "sport": 5000, "dport": 53} for i in range(3)]
    frame = decode(*msgs, transport="tcp")
    assert frame["qname"].to_list() == ["q0.example", "q1.example", "q2.example"]
    assert frame["transport"].unique().to_list() == ["tcp"]


def test_arena_grows_for_escaped_names():
    # each name renders 4x its wire size (\xNN): more than the first arena holds
    wire = b"".join(b"\x3f" + b"\x01" * 63 for _ in range(3)) + b"\x3d" + b"\x02" * 61 + b"\0"
    data = header() + wire + b"\0\1\0\1"
    frame = decode(*[data] * 300)
    expected = ".".join(["\\x01" * 63] * 3 + ["\\x02" * 61])
    assert frame["qname"].to_list() == [expected] * 300


def test_offsets_outside_the_buffer_are_rejected():
    s = mset([query()])
    bad = MessageSet(s.frame.with_columns(pl.col("length") + 100), s.buf)
    with pytest.raises(ValueError):
        dns.decode_messages([bad])


def test_empty():
    frame = dns.decode_messages([])
    assert frame.height == 0 and frame.columns == [c.name for c in KEPT_COLUMNS + dns.DECODED_COLUMNS]
    assert dns.mark_messages(frame).columns == [c.name for c in dns.MESSAGE_COLUMNS]
    t = dns.pair_transactions(dns.mark_messages(frame))
    assert t.height == 0 and t.columns == [c.name for c in dns.TRANSACTION_COLUMNS]


def test_frames_from_a_capture(read_capture):
    def packet(ts, data, src, dst, sport, dport):
        return (ts, 0, b.ethernet(b.ipv4(b.udp(data, sport, dport), proto=17, src=src, dst=dst)))

    cap = read_capture(b.pcap_file([
        packet(100, query("x.example", ident=7), "10.1.1.1", "10.1.1.53", 3333, 53),
        packet(100, b"not dns", "10.1.1.1", "10.1.1.9", 3333, 80),
        packet(101, response("x.example", ident=7, answers=[rr(1, 42)]), "10.1.1.53", "10.1.1.1", 53, 3333),
    ]))
    m = cap.frame("dns_messages")
    assert m.columns == [c.name for c in dns.MESSAGE_COLUMNS]
    assert m["frame_last"].to_list() == [1, 3]
    t = cap.frame("dns_transactions")
    assert t.columns == [c.name for c in dns.TRANSACTION_COLUMNS]
    assert list(t.columns[:len(COMMON_NAMES)]) == list(COMMON_NAMES)
    r = t.row(0, named=True)
    assert (r["protocol"], r["client"], r["server"], r["operation"], r["resource"]) == (
        "dns", "10.1.1.1", "10.1.1.53", "A", "x.example")
    assert (r["latency_ns"], r["status"], r["answer_ttl_min"]) == (S, "NOERROR", 42)


def test_transactions_frame_asked_for_first(read_capture):
    data = b.pcap_file([
        (100, 0, b.ethernet(b.ipv4(b.udp(query(ident=9), 4444, 53), proto=17))),
        (100, 500, b.ethernet(b.ipv4(b.udp(response(ident=9), 53, 4444), proto=17, src="10.0.0.2", dst="10.0.0.1"))),
    ])
    first = read_capture(data, name="a.pcap")
    t = first.frame("dns_transactions")
    assert t.height == 1 and t["answered"].to_list() == [True]
    assert first.frame("dns_messages").height == 2
    second = read_capture(data, name="b.pcap")
    second.frame("dns_messages")
    assert second.frame("dns_transactions").equals(t)


def test_messages_and_transactions_is_one_pass_of_the_two():
    frame = decode(at(0, query()), at(0.1, query()), at(0.2, response()), at(0.3, response()), at(9, query("x")))
    m, t = dns.messages_and_transactions(frame)
    assert m.equals(dns.mark_messages(frame)) and t.equals(dns.pair_transactions(frame))


# --- random and mutated input ---------------------------------------------------------------------

ALLOWED_ERRORS = set(dns.DECODE_ERRORS)


def _check(batch: list[bytes]):
    frame = decode(*batch)
    assert frame.height == len(batch)
    assert set(frame["decode_error"].drop_nulls().to_list()) <= ALLOWED_ERRORS
    names = frame["qname"].drop_nulls()
    assert (names.str.len_bytes() <= 4 * 255).all()
    t = dns.pair_transactions(dns.mark_messages(frame))
    assert t.height <= frame.height


def _corpus_messages() -> list[bytes]:
    out = []
    for f in ("zeek/dns-edns-ecs.pcap", "tcpdump/dnssec.pcap", "tcpdump/edns-opts.pcap", "arkime/dns-error.pcap"):
        with open_capture(CORPUS / f) as cap:
            for s in dns.message_sets(cap):
                out += [s.message_bytes(i) for i in range(s.height)]
    return out


SEEDS = _corpus_messages() + [MALFORMED[c][0] for c in MALFORMED] + [
    response(rcode=3, authority=[soa()], additional=[opt(do=True)]), query(edns=1232)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40))
def test_random_bytes_never_raise(batch):
    _check(batch)


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.integers(0, 3))
        if op == 0 and data:  # overwrite a byte (counts, lengths, pointers ...)
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif op == 1 and data:  # cut
            del data[draw(st.integers(0, len(data) - 1)):]
        elif op == 2:  # insert a compression pointer somewhere
            at = draw(st.integers(0, len(data)))
            data[at:at] = struct.pack(">H", 0xC000 | draw(st.integers(0, 0x3FFF)))
        elif op == 3 and len(data) >= 12:  # absurd counts
            data[4 + 2 * draw(st.integers(0, 3)):][:2] = b"\xff\xff"
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), min_size=1, max_size=30))
def test_mutated_real_messages_never_raise(batch):
    _check(batch)


def test_seeds_decode_cleanly():
    frame = decode(*_corpus_messages())
    assert frame["decode_error"].null_count() == frame.height


# --- pairing ----------------------------------------------------------------------------------------


def txns(*messages, params=dns.Params(), transport="udp"):
    frame = dns.mark_messages(decode(*messages, transport=transport), params)
    return frame, dns.pair_transactions(frame, params)


def at(ts, data, **kw):
    return {"data": data, "ts": ts, **kw}


def test_simple_pair():
    m, t = txns(at(1.0, query()), at(1.25, response(answers=[rr(1, 60)])))
    assert t.height == 1
    r = t.row(0, named=True)
    assert (r["request_frame"], r["response_frame"], r["latency_ns"]) == (1, 2, S // 4)
    assert (r["status"], r["is_error"], r["answered"], r["retries"], r["duplicate_responses"]) == (
        "NOERROR", False, True, 0, 0)
    assert (r["client"], r["client_port"], r["server"], r["server_port"], r["transport"]) == (
        "10.0.0.1", 40000, "10.0.0.53", 53, "udp")
    assert m["retransmission"].to_list() == [False, None]
    assert m["duplicate_response"].to_list() == [None, False]
    assert m["unsolicited"].to_list() == [None, False]


def test_retransmission_joins_the_transaction():
    m, t = txns(at(0, query()), at(1, query()), at(3, query()), at(3.5, response()))
    assert m["retransmission"].to_list() == [False, True, True, None]
    r = t.row(0, named=True)
    assert t.height == 1 and (r["retries"], r["request_frame"], r["response_frame"]) == (2, 1, 4)
    assert r["latency_ns"] == int(3.5 * S)  # from the first query: what the client waited


def test_retransmission_window_from_the_first_query():
    # Wireshark's dns.retransmission_timer: 5 s after the transaction's first query
    m, t = txns(at(0, query()), at(2, query()), at(4, query()), at(6, query()), at(7, response()))
    assert m["retransmission"].to_list() == [False, True, True, False, None]
    assert t["answered"].to_list() == [False, True]
    assert t["retries"].to_list() == [2, 0]
    assert t["latency_ns"].to_list() == [None, S]


def test_duplicate_responses_however_late():
    m, t = txns(at(0, query()), at(0.1, response()), at(0.2, response()), at(30, response()))
    assert m["duplicate_response"].to_list() == [None, False, True, True]
    assert t["duplicate_responses"].to_list() == [3 - 1]


def test_unanswered():
    _, t = txns(at(0, query()))
    r = t.row(0, named=True)
    assert (r["answered"], r["response_frame"], r["latency_ns"], r["status"], r["is_error"], r["rcode"]) == (
        False, None, None, None, None, None)


def test_a_late_answer_is_the_answer_unless_a_timeout_is_set():
    # as tshark: dns.time 7.6 s for a lone query answered 7.6 s later (no limit by default)
    m, t = txns(at(0, query()), at(7.6, response()))
    assert t["latency_ns"].to_list() == [int(7.6 * S)]
    assert m["unsolicited"].to_list() == [None, False]
    m, t = txns(at(0, query()), at(6, response()), params=dns.Params(timeout_ns=5 * S))
    assert t["answered"].to_list() == [False]
    assert m["unsolicited"].to_list() == [None, True]
    m, t = txns(at(0, query()), at(6, response()), params=dns.Params(timeout_ns=10 * S))
    assert t["latency_ns"].to_list() == [6 * S]


def test_id_reuse_pairs_nearest():
    m, t = txns(at(0, query()), at(0.1, response(answers=[rr(1, 1)])), at(60, query()),
                at(60.2, response(answers=[rr(1, 2)])))
    assert t["request_frame"].to_list() == [1, 3]
    assert t["response_frame"].to_list() == [2, 4]
    assert t["answer_ttl_min"].to_list() == [1, 2]
    assert m["retransmission"].to_list() == [False, None, False, None]


def test_interleaved_transactions():
    m, t = txns(at(0, query("a.example", ident=1)), at(0.1, query("b.example", ident=2)),
                at(0.2, response("b.example", ident=2, rcode=3)), at(0.3, response("a.example", ident=1)),
                at(0.4, query("a.example", ident=1, flags=0x0100), sport=40001),
                at(0.5, response("a.example", ident=1, rcode=2), dport=40001))
    assert t.select("resource", "client_port", "status", "is_error", "latency_ns").rows() == [
        ("a.example", 40000, "NOERROR", False, int(0.3 * S)),
        ("b.example", 40000, "NXDOMAIN", False, int(0.1 * S)),
        ("a.example", 40001, "SERVFAIL", True, int(0.1 * S))]


def test_same_id_other_question_does_not_pair():
    m, t = txns(at(0, query("a.example")), at(0.1, response("b.example")))
    assert t["answered"].to_list() == [False]
    assert m["unsolicited"].to_list() == [None, True]
    m, t = txns(at(0, query("a.example", qtype=1)), at(0.1, response("a.example", qtype=28)))
    assert t["answered"].to_list() == [False]


def test_response_without_question_answers_the_open_query():
    formerr = header(flags=0x8181, qd=0)
    m, t = txns(at(0, query("a.example")), at(0.1, formerr))
    r = t.row(0, named=True)
    assert (r["answered"], r["status"], r["is_error"]) == (True, "FORMERR", True)
    assert m["unsolicited"].to_list() == [None, False]


def test_time_order_not_file_order():
    # the response is stored first but stamped later (arkime/dns-flags0110.pcap)
    m, t = txns(at(2.0, response(), frame=1), at(1.5, query(), frame=2))
    r = t.row(0, named=True)
    assert (r["request_frame"], r["response_frame"], r["latency_ns"]) == (2, 1, S // 2)


def test_queries_between_servers_on_port_53():
    m, t = txns(at(0, query(), sport=53, dport=53), at(0.1, response(), sport=53, dport=53))
    assert t["answered"].to_list() == [True]


@pytest.mark.parametrize("rcode,is_error", [(0, False), (3, False), (2, True), (5, True), (1, True), (4, True)])
def test_is_error(rcode, is_error):
    _, t = txns(at(0, query()), at(0.1, response(rcode=rcode)))
    assert t["is_error"].to_list() == [is_error]


def test_operation_is_opcode_name_for_non_queries():
    update = header(flags=5 << 11, qd=1) + question("zone.example", 6)
    _, t = txns(at(0, update), at(0.1, header(flags=0x8000 | 5 << 11, qd=1) + question("zone.example", 6)))
    assert t.select("operation", "resource", "answered").rows() == [("UPDATE", "zone.example", True)]


def test_truncated_answer_retried_over_tcp():
    udp = mset([at(0, query("big.example")), at(0.1, response("big.example", flags=0x8380))])
    tcp = mset([at(0.2, query("big.example", ident=0x9999), sport=41000, frame=3),
                at(0.3, response("big.example", ident=0x9999, answers=[rr(1, 5)]), dport=41000, frame=4)],
               transport="tcp")
    frame = dns.mark_messages(dns.decode_messages([udp, tcp]))
    t = dns.pair_transactions(frame)
    assert t.select("transport", "truncated", "tc_retry_frame", "answered").rows() == [
        ("udp", True, 3, True), ("tcp", False, None, True)]


def test_truncated_answer_without_retry():
    _, t = txns(at(0, query()), at(0.1, response(flags=0x8380)))
    assert t.select("truncated", "tc_retry_frame").rows() == [(True, None)]


def test_tcp_retry_from_another_client_does_not_count():
    udp = mset([at(0, query("big.example")), at(0.1, response("big.example", flags=0x8380))])
    tcp = mset([at(0.2, query("big.example"), frame=3)], transport="tcp", addresses=("10.0.0.2", "10.0.0.53"))
    t = dns.pair_transactions(dns.mark_messages(dns.decode_messages([udp, tcp])))
    assert t["tc_retry_frame"].to_list() == [None, None]


def test_messages_without_header_take_no_part():
    m, t = txns(at(0, b"\x12"), at(0.1, query()))
    assert m["retransmission"].to_list() == [None, False]
    assert t.height == 1


def test_kernels_compile_once():
    """Every buffer (capture bytes, reassembly buffers, constructed sets) reaches the kernels with one
    signature: a second one would double the cold compile time."""
    with open_capture(CORPUS / "zeek/dns-edns-ecs.pcap") as cap:  # capture buffer + fragment buffer
        frame = dns.decode_messages(dns.message_sets(cap))
    frame = pl.concat([frame.with_columns(pl.col("src", "dst").cast(pl.String)),
                       decode(query(), b"")])
    dns.pair_transactions(dns.mark_messages(frame))
    dns.pair_transactions(dns.mark_messages(decode(header(qd=0))))  # no question name at all
    assert len(k.decode_all.signatures) == 1
    assert len(k.assign_roles.signatures) == 1


# --- throughput ------------------------------------------------------------------------------------


def replicated_traffic(n_transactions: int, seed: int = 1) -> MessageSet:
    """Real query/response pairs of the corpus, replicated with fresh ids, clients and ports, in time
    order (a transaction every ~10 µs, answered after its real latency): a large realistic set."""
    pairs = []
    for f in ("zeek/dns-edns-ecs.pcap", "zeek/wikipedia.pcap", "tcpdump/dnssec.pcap", "zeek/dns/tm1t.pcap",
              "suricata-verify/smb2-07/20171220_smb_psexec_add_user.pcap", "tcpdump/edns-opts.pcap"):
        with open_capture(CORPUS / f) as cap:
            sets = dns.message_sets(cap)
            frames = {}
            for s in sets:
                for i in range(s.height):
                    frames[int(s.frame["frame_last"][i])] = s.message_bytes(i)
            t = cap.frame("dns_transactions").filter(pl.col("answered") & (pl.col("retries") == 0))
            for r in t.iter_rows(named=True):
                pairs.append((frames[r["request_frame"]], frames[r["response_frame"]], r["latency_ns"]))
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(pairs), n_transactions)
    ids = rng.integers(0, 65536, n_transactions)
    clients = rng.integers(0, 50_000, n_transactions)
    start = np.cumsum(rng.integers(1_000, 20_000, n_transactions))
    data, ts, is_q, who = [], [], [], []
    for j, p in enumerate(pick):
        q, a, lat = pairs[p]
        idb = struct.pack(">H", int(ids[j]))
        data += [idb + q[2:], idb + a[2:]]
        ts += [int(start[j]), int(start[j]) + int(lat)]
        is_q += [True, False]
        who += [int(clients[j])] * 2
    order = np.argsort(np.array(ts), kind="stable")
    data = [data[i] for i in order]
    ts, is_q, who = np.array(ts)[order], np.array(is_q)[order], np.array(who)[order]
    lens = np.array([len(d) for d in data], np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lens.astype(np.int64))[:-1]])
    addresses = [f"10.{c >> 16}.{(c >> 8) & 255}.{c & 255}" for c in range(50_000)] + ["192.0.2.53"]
    enum = pl.Enum(addresses)
    client = pl.Series(np.array(addresses, dtype=object)[who]).cast(enum)
    server = pl.Series(["192.0.2.53"] * len(data)).cast(enum)
    cport = (1024 + who % 60000).astype(np.uint16)
    n = len(data)
    frame = pl.DataFrame({
        "transport": pl.Series(["udp"] * n).cast(TRANSPORTS), "flow": who.astype(np.uint32), "from_client": is_q,
        "src": pl.select(pl.when(pl.lit(pl.Series(is_q))).then(pl.lit(client)).otherwise(pl.lit(server))).to_series(),
        "dst": pl.select(pl.when(pl.lit(pl.Series(is_q))).then(pl.lit(server)).otherwise(pl.lit(client))).to_series(),
        "sport": np.where(is_q, cport, 53).astype(np.uint16), "dport": np.where(is_q, 53, cport).astype(np.uint16),
        "frame_first": np.arange(1, n + 1, dtype=np.uint32), "frame_last": np.arange(1, n + 1, dtype=np.uint32),
        "ts_first_ns": ts, "ts_last_ns": ts, "offset": offsets, "length": lens, "wire_length": lens,
        "complete": np.ones(n, np.bool_),
    })
    return MessageSet(frame, np.frombuffer(b"".join(data), np.uint8))


@pytest.mark.slow
def test_throughput_on_replicated_real_messages():
    import time

    s = replicated_traffic(500_000)
    dns.messages_and_transactions(dns.decode_messages([MessageSet(s.frame.head(1000), s.buf)]))  # compile
    t0 = time.perf_counter()
    m = dns.decode_messages([s])
    t1 = time.perf_counter()
    m, t = dns.messages_and_transactions(m)
    t2 = time.perf_counter()
    print(f"\n{m.height} messages ({s.buf.size / 1e6:.0f} MB): decode {t1 - t0:.3f} s "
          f"({m.height / (t1 - t0) / 1e6:.2f} M msg/s), pairing {t2 - t1:.3f} s; {t.height} transactions, "
          f"{t['answered'].sum()} answered")
    # random ids and clients collide now and then (same client, port, id and question in flight)
    assert m.height == 1_000_000 and t.height > 499_000 and t["answered"].mean() > 0.999
    assert m.height / (t1 - t0) > 300_000  # a loose floor: CI machines vary


# --- text columns ----------------------------------------------------------------------------------


def test_arena_strings_views_equal_python_strings():
    """text.arena_strings hands Polars Arrow string views (inline up to 12 bytes, else prefix + offset):
    the values, nulls, comparisons and sorting are those of the same Python strings, whatever the
    length (the 12/13-byte boundary), order of the rows in the arena, or sharing of bytes."""
    from analyzer.decoders.text import arena_strings

    words = ["", "a", "example.com", "abcdefghijkl", "abcdefghijklm", "é€-long-enough-name.example.org",
             "abcdefghijklmnopqrstuvwxyz" * 4]
    raw = b"".join(w.encode() for w in words)
    arena = np.frombuffer(raw + raw, np.uint8)
    lengths = np.array([len(w.encode()) for w in words], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for start, valid in ((starts, None), (starts[::-1].copy() + len(raw), None),
                         (starts, np.array([k % 3 != 1 for k in range(len(words))]))):
        lens = lengths if start is starts else lengths[::-1].copy()
        expected = [w for w in (words if start is starts else words[::-1])]
        if valid is not None:
            expected = [w if v else None for w, v in zip(expected, valid)]
        got = arena_strings("s", arena, start, lens, valid)
        want = pl.Series("s", expected, dtype=pl.String)
        assert got.dtype == pl.String and got.to_list() == expected
        assert got.equals(want) and got.sort().equals(want.sort())
        assert (got == "abcdefghijklm").equals(want == "abcdefghijklm")
        assert got.str.starts_with("abcd").equals(want.str.starts_with("abcd"))
