"""UDP message sets: whole datagrams, and IPv4/IPv6 fragments reassembled (big Kerberos tickets and
EDNS answers fragment), out of order, overlapping, or with a piece missing."""
from analyzer.messages import udp_messages
from builders import ipv4, ipv6, ipv6_frag, pcap_file, udp
from builders import enc_data, kdc_req, pa


def _v4_fragments(datagram: bytes, ident: int, cut: int, src="10.0.0.1", dst="10.0.0.2"):
    """Two IPv4 fragments of a UDP datagram (header included) split at ``cut`` (a multiple of 8)."""
    first = ipv4(datagram[:cut], proto=17, src=src, dst=dst, ident=ident, flags_frag=0x2000)
    second = ipv4(datagram[cut:], proto=17, src=src, dst=dst, ident=ident, flags_frag=cut // 8)
    return first, second


def _sets(read_capture, records, linktype=101):
    cap = read_capture(pcap_file(records, linktype=linktype))
    return cap, udp_messages(cap, {88, 53})


def test_whole_datagrams_index_the_capture_buffer(read_capture):
    cap, (ms,) = _sets(read_capture, [(1, 0, ipv4(udp(b"query", sport=5000, dport=88), proto=17)),
                                      (1, 5, ipv4(udp(b"answer!", sport=88, dport=5000), proto=17,
                                                  src="10.0.0.2", dst="10.0.0.1"))])
    assert ms.buf is cap.buf
    assert [ms.message_bytes(k) for k in range(2)] == [b"query", b"answer!"]
    f = ms.frame
    assert f["from_client"].to_list() == [True, False] and f["flow"].n_unique() == 1
    assert f["complete"].all()


def test_ipv4_fragments_out_of_order_reassemble(read_capture):
    payload = bytes(range(256)) * 8
    first, second = _v4_fragments(udp(payload, sport=5000, dport=88), ident=7, cut=1480)
    cap, sets = _sets(read_capture, [(1, 100, second), (1, 200, first)])  # last fragment first
    (ms,) = sets
    row = ms.frame.row(0, named=True)
    assert ms.message_bytes(0) == payload
    assert (row["complete"], row["frame_first"], row["frame_last"], row["sport"], row["dport"]) == \
        (True, 1, 2, 5000, 88)


def test_fragmented_kerberos_request_decodes(read_capture):
    from analyzer.decoders import kerberos

    request = kdc_req(10, cname=("bob",), realm="CORP.EXAMPLE", padata=[pa(2, enc_data(18, None, b"\x00" * 1400))])
    first, second = _v4_fragments(udp(request, sport=50000, dport=88), ident=99, cut=1200)
    cap = read_capture(pcap_file([(1, 0, first), (1, 10, second)], linktype=101))
    m = kerberos.decode_messages(kerberos.message_sets(cap))
    r = m.row(0, named=True)
    assert m.height == 1 and r["decode_error"] is None
    assert (r["message"], r["realm"], r["cname"]) == ("AS-REQ", "CORP.EXAMPLE", "bob")
    assert (r["frame_first"], r["frame_last"]) == (1, 2)


def test_missing_fragment_gives_an_incomplete_message(read_capture):
    payload = b"x" * 3000
    datagram = udp(payload, sport=5000, dport=88)
    pieces = [ipv4(datagram[a:a + 1000], proto=17, ident=5, flags_frag=(0x2000 if a + 1000 < len(datagram) else 0) | a // 8)
              for a in range(0, len(datagram), 1000)]
    cap, (ms,) = _sets(read_capture, [(1, k, p) for k, p in enumerate(pieces) if k != 1])  # lose the middle one
    row = ms.frame.row(0, named=True)
    assert (row["complete"], row["length"], row["wire_length"]) == (False, 1000 - 8, len(payload))
    assert ms.message_bytes(0) == payload[:992]


def test_overlapping_fragments_first_copy_wins(read_capture):
    datagram = udp(b"A" * 64, sport=5000, dport=88)
    first = ipv4(datagram[:48], proto=17, ident=3, flags_frag=0x2000)
    rewrite = ipv4(b"B" * 16, proto=17, ident=3, flags_frag=0x2000 | 32 // 8)  # overlaps bytes 32..48
    last = ipv4(datagram[48:], proto=17, ident=3, flags_frag=48 // 8)
    _, (ms,) = _sets(read_capture, [(1, 0, first), (1, 1, rewrite), (1, 2, last)])
    assert ms.message_bytes(0) == b"A" * 64


def test_ipv6_fragments_reassemble(read_capture):
    payload = b"6" * 2000
    datagram = udp(payload, sport=5353, dport=53)
    a = ipv6(ipv6_frag(17, 0, True, 0xBEEF) + datagram[:1232], nh=44)
    b = ipv6(ipv6_frag(17, 1232, False, 0xBEEF) + datagram[1232:], nh=44)
    _, (ms,) = _sets(read_capture, [(1, 0, a), (1, 1, b)])
    assert ms.message_bytes(0) == payload and ms.frame["dport"].to_list() == [53]


def test_fragments_of_other_ports_are_left_out(read_capture):
    first, second = _v4_fragments(udp(b"z" * 2000, sport=4000, dport=9999), ident=1, cut=1480)
    _, sets = _sets(read_capture, [(1, 0, first), (1, 1, second)])
    assert sets == []


def test_progress_bar_on_request_reads_every_chunk(read_capture):
    cap = read_capture(pcap_file([(1, 0, ipv4(udp(b"q", sport=1, dport=53), proto=17))] * 50, linktype=101),
                       progress=True, chunk_records=8)
    assert cap.packets["frame"].to_list() == list(range(1, 51))
