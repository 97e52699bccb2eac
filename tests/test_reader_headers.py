"""Link-layer, network and transport header decoding, one byte-literal fixture per path."""
import struct

import pytest

from builders import (ethernet, icmp, ipv4, ipv6, ipv6_ext, ipv6_frag, opt_mss, opt_sack, opt_sack_perm, opt_ts,
                      opt_wscale, pcap_file, tcp, udp)

UDP4 = ipv4(udp(b"q" * 12), proto=17)
TCP4 = ipv4(tcp(b"hello", seq=7, ack=9, flags=0x18, window=1234))


def one(read_capture, data, linktype=1, wire_len=None):
    rec = (1, 0, data) if wire_len is None else (1, 0, data, wire_len)
    cap = read_capture(pcap_file([rec], linktype=linktype))
    return cap.packets.row(0, named=True)


def test_ethernet_ipv4_tcp_fields(read_capture):
    r = one(read_capture, ethernet(TCP4))
    assert (r["src"], r["dst"], r["ip_proto"], r["sport"], r["dport"]) == ("10.0.0.1", "10.0.0.2", 6, 1234, 80)
    assert (r["seq"], r["ack"], r["tcp_flags"], r["window"], r["payload_len"]) == (7, 9, 0x18, 1234, 5)
    assert r["l4_hdr_len"] == 20 and r["payload_offset"] == 24 + 16 + 14 + 20 + 20
    assert r["ethertype"] == 0x0800 and r["parse_status"] == "ok" and r["vlan"] is None


def test_payload_offset_points_at_the_payload_bytes(read_capture):
    cap = read_capture(pcap_file([(1, 0, ethernet(TCP4))]))
    r = cap.packets.row(0, named=True)
    assert cap.bytes_at(r["payload_offset"], r["payload_len"]) == b"hello"


@pytest.mark.parametrize("vlans,tpid", [((5,), 0x8100), ((100, 200), 0x88A8), ((7, 8, 9), 0x9100)])
def test_vlan_tags_stacked(read_capture, vlans, tpid):
    r = one(read_capture, ethernet(UDP4, vlans=vlans, outer_tpid=tpid))
    assert r["vlan"] == vlans[-1] and r["dport"] == 53 and r["ethertype"] == 0x0800


def test_llc_snap_and_plain_802_3(read_capture):
    snap = bytes([2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]) + struct.pack(">H", 8 + len(UDP4)) + \
        b"\xaa\xaa\x03\x00\x00\x00\x08\x00" + UDP4
    assert one(read_capture, snap)["dport"] == 53
    stp = bytes(12) + struct.pack(">H", 38) + b"\x42\x42\x03" + bytes(35)
    assert one(read_capture, stp)["parse_status"] == "not_ip"


def test_pppoe_and_mpls(read_capture):
    pppoe = ethernet(struct.pack(">BBHHH", 0x11, 0, 1, len(UDP4) + 2, 0x0021) + UDP4, ethertype=0x8864)
    assert one(read_capture, pppoe)["dport"] == 53
    mpls = ethernet(struct.pack(">I", (100 << 12) | 0x40) + struct.pack(">I", (200 << 12) | 0x140) + UDP4,
                    ethertype=0x8847)
    assert one(read_capture, mpls)["dport"] == 53


def test_arp_is_not_ip(read_capture):
    assert one(read_capture, ethernet(bytes(28), ethertype=0x0806))["parse_status"] == "not_ip"


@pytest.mark.parametrize("header", [
    struct.pack("<I", 2), struct.pack(">I", 2), struct.pack("<I", 30), struct.pack("<I", 10),
])
def test_null_loopback_either_byte_order(read_capture, header):
    payload = UDP4 if header in (struct.pack("<I", 2), struct.pack(">I", 2)) else ipv6(udp(b"x"), nh=17)
    r = one(read_capture, header + payload, linktype=0)
    assert r["dport"] == 53 and r["parse_status"] == "ok"


def test_openbsd_loop_is_network_order(read_capture):
    assert one(read_capture, struct.pack(">I", 24) + ipv6(udp(), nh=17), linktype=108)["src"] == "2001:db8::1"


@pytest.mark.parametrize("linktype", [101, 12, 14, 228])
def test_raw_ipv4_linktypes(read_capture, linktype):
    assert one(read_capture, UDP4, linktype=linktype)["dport"] == 53


def test_raw_ipv6_linktype_229_and_version_mismatch(read_capture):
    assert one(read_capture, ipv6(udp(), nh=17), linktype=229)["dport"] == 53
    assert one(read_capture, UDP4, linktype=229)["parse_status"] == "bad_l3"


def test_linux_sll_and_sll2(read_capture):
    sll = struct.pack(">HHH8sH", 0, 1, 6, b"\2\0\0\0\0\1\0\0", 0x0800) + UDP4
    assert one(read_capture, sll, linktype=113)["dport"] == 53
    sll2 = struct.pack(">HHIHBB8s", 0x86DD, 0, 3, 1, 0, 6, b"\2\0\0\0\0\1\0\0") + ipv6(udp(), nh=17)
    assert one(read_capture, sll2, linktype=276)["dst"] == "2001:db8::2"
    sll_vlan = struct.pack(">HHH8sH", 0, 1, 6, bytes(8), 0x8100) + struct.pack(">HH", 42, 0x0800) + UDP4
    assert one(read_capture, sll_vlan, linktype=113)["vlan"] == 42


def test_nflog_payload_tlv(read_capture):
    prefix_tlv = struct.pack("<HH", 8, 10) + b"pfx\0"
    payload_tlv = struct.pack("<HH", 4 + len(UDP4), 9) + UDP4
    data = struct.pack(">BBH", 2, 0, 0) + prefix_tlv + payload_tlv + b"\0" * (-len(payload_tlv) % 4)
    assert one(read_capture, data, linktype=239)["dport"] == 53


def test_unsupported_linktype_keeps_a_row(read_capture):
    r = one(read_capture, b"\x00" * 40, linktype=147)
    assert r["parse_status"] == "unsupported_linktype" and r["frame"] == 1


def test_ipv4_options_are_skipped(read_capture):
    r = one(read_capture, ethernet(ipv4(udp(b"abc"), proto=17, options=b"\x94\x04\x00\x00")))
    assert r["dport"] == 53 and r["payload_len"] == 3 and r["payload_offset"] == 24 + 16 + 14 + 24 + 8


def test_ipv4_fragments(read_capture):
    first = ipv4(udp(b"a" * 32, length=8 + 64), proto=17, ident=77, flags_frag=0x2000)
    later = ipv4(b"b" * 32, proto=17, ident=77, flags_frag=(40 // 8))
    cap = read_capture(pcap_file([(1, 0, ethernet(first)), (2, 0, ethernet(later))]))
    a, b = cap.packets.rows(named=True)
    assert (a["ip_id"], a["ip_flags"] & 1, a["frag_offset"], a["dport"], a["payload_len"]) == (77, 1, 0, 53, 32)
    assert (b["parse_status"], b["frag_offset"], b["dport"], b["payload_len"]) == ("fragment", 40, None, 32)


def test_ethernet_padding_is_not_payload(read_capture):
    r = one(read_capture, ethernet(ipv4(tcp(b""))) + b"\0" * 6)
    assert r["payload_len"] == 0


def test_ip_length_beyond_the_frame_is_clamped_like_wireshark(read_capture):
    r = one(read_capture, ethernet(ipv4(tcp(b"x" * 10), total_len=400)))
    assert r["payload_len"] == 10


def test_snaplen_cut_keeps_wire_lengths(read_capture):
    full = ethernet(ipv4(tcp(b"x" * 1000)))
    r = one(read_capture, full[:80], wire_len=len(full))
    assert r["parse_status"] == "ok" and r["payload_len"] == 1000 and r["caplen"] == 80


@pytest.mark.parametrize("cut,status", [(10, "truncated_l2"), (14 + 12, "truncated_l3"),
                                        (14 + 20 + 10, "truncated_l4")])
def test_truncation_at_each_layer(read_capture, cut, status):
    full = ethernet(TCP4)
    assert one(read_capture, full[:cut], wire_len=len(full))["parse_status"] == status


def test_bad_ip_and_tcp_headers(read_capture):
    bad_ihl = bytearray(TCP4)
    bad_ihl[0] = 0x43
    assert one(read_capture, ethernet(bytes(bad_ihl)))["parse_status"] == "bad_l3"
    bad_doff = bytearray(ethernet(TCP4))
    bad_doff[14 + 20 + 12] = 0x30
    assert one(read_capture, bytes(bad_doff))["parse_status"] == "bad_l4"


def test_ipv6_extension_headers_walked(read_capture):
    ext = ipv6_ext(43, b"\0" * 6) + ipv6_ext(60, b"\0" * 14) + ipv6_ext(6, b"\0" * 6)
    r = one(read_capture, ethernet(ipv6(tcp(b"zz"), nh=0, ext=ext), ethertype=0x86DD))
    assert (r["ip_proto"], r["dport"], r["payload_len"]) == (6, 80, 2)
    assert r["src"] == "2001:db8::1" and r["ttl"] == 64


def test_ipv6_ah_header(read_capture):
    ah = struct.pack(">BBHII", 17, 4, 0, 1, 1) + b"\0" * 12  # length 4 → (4+2)*4 = 24 bytes
    r = one(read_capture, ipv6(ah + udp(b"x"), nh=51), linktype=229)
    assert r["dport"] == 53 and r["payload_len"] == 1


def test_ipv6_fragments(read_capture):
    first = ipv6(ipv6_frag(17, 0, True, 0xABCDEF01) + udp(b"a" * 16, length=40), nh=44)
    later = ipv6(ipv6_frag(17, 24, False, 0xABCDEF01) + b"b" * 16, nh=44)
    cap = read_capture(pcap_file([(1, 0, first), (2, 0, later)], linktype=101))
    a, b = cap.packets.rows(named=True)
    assert (a["ip_id"], a["ip_flags"], a["dport"], a["ip_proto"]) == (0xABCDEF01, 1, 53, 17)
    assert (b["parse_status"], b["frag_offset"], b["ip_proto"]) == ("fragment", 24, 17)


def test_ipv6_addresses_render_like_wireshark(read_capture):
    r = one(read_capture, ipv6(udp(), nh=17, src="fe80::a667:6ff:fef7:ec54", dst="::ffff:10.1.2.3"), linktype=101)
    assert (r["src"], r["dst"]) == ("fe80::a667:6ff:fef7:ec54", "::ffff:10.1.2.3")


def test_ipv4_and_mapped_ipv6_stay_distinct(read_capture):
    cap = read_capture(pcap_file([(1, 0, ipv4(udp(), proto=17, src="10.1.2.3")),
                                  (2, 0, ipv6(udp(), nh=17, src="::ffff:10.1.2.3"))], linktype=101))
    assert cap.packets["src"].to_list() == ["10.1.2.3", "::ffff:10.1.2.3"]


def test_tcp_options(read_capture):
    syn = tcp(flags=0x02, options=opt_mss(1460) + opt_sack_perm() + opt_ts(100, 0) + b"\x01" + opt_wscale(7))
    r = one(read_capture, ethernet(ipv4(syn)))
    assert (r["mss"], r["wscale"], r["sack_perm"], r["ts_val"], r["ts_ecr"]) == (1460, 7, True, 100, 0)
    plain = one(read_capture, ethernet(ipv4(tcp())))
    assert (plain["mss"], plain["wscale"], plain["ts_val"], plain["sack_perm"]) == (None, None, None, False)


def test_sack_blocks_side_table(read_capture):
    seg = tcp(flags=0x10, options=b"\x01\x01" + opt_sack((100, 200), (300, 400), (4294967000, 5)))
    cap = read_capture(pcap_file([(1, 0, ethernet(ipv4(tcp()))), (2, 0, ethernet(ipv4(seg)))]))
    assert cap.packets["sack_blocks"].to_list() == [0, 3]
    sack = cap.frame("tcp_sack")
    assert sack.rows() == [(2, 0, 100, 200), (2, 1, 300, 400), (2, 2, 4294967000, 5)]


def test_malformed_tcp_option_stops_option_parsing(read_capture):
    seg = tcp(flags=0x02, options=opt_mss(1200) + b"\x03\x09\x07\x00")  # window scale claims 9 bytes
    r = one(read_capture, ethernet(ipv4(seg)))
    assert r["mss"] == 1200 and r["wscale"] is None and r["parse_status"] == "ok"


def test_udp_bad_length(read_capture):
    r = one(read_capture, ethernet(ipv4(udp(b"abcd", length=3), proto=17)))
    assert r["parse_status"] == "bad_l4" and r["payload_len"] == 4


def test_icmp_unreachable_quotes_the_datagram(read_capture):
    quoted = ipv4(udp(b"dnsquery", sport=40000, dport=53), proto=17, src="10.0.0.2", dst="10.0.0.9")
    err = ipv4(icmp(3, 3, payload=quoted[:28]), proto=1, src="10.0.0.9", dst="10.0.0.2")
    cap = read_capture(pcap_file([(1, 0, ethernet(err))]))
    r = cap.packets.row(0, named=True)
    assert (r["icmp_type"], r["icmp_code"], r["sport"]) == (3, 3, None)
    q = cap.frame("icmp_errors").row(0, named=True)
    assert (q["frame"], q["inner_src"], q["inner_dst"], q["inner_proto"], q["inner_sport"], q["inner_dport"]) == \
        (1, "10.0.0.2", "10.0.0.9", 17, 40000, 53)


def test_icmpv6_unreachable_and_echo(read_capture):
    quoted = ipv6(udp(sport=1111, dport=88), nh=17, src="2001:db8::5", dst="2001:db8::6")
    err = ipv6(icmp(1, 4, payload=quoted[:48]), nh=58)
    echo = ipv6(icmp(128, 0), nh=58)
    cap = read_capture(pcap_file([(1, 0, err), (2, 0, echo)], linktype=101))
    assert cap.packets["icmp_type"].to_list() == [1, 128]
    assert cap.frame("icmp_errors").select("inner_dst", "inner_dport").rows() == [("2001:db8::6", 88)]


def test_other_ip_protocols_keep_ip_payload(read_capture):
    r = one(read_capture, ethernet(ipv4(b"\0" * 16, proto=47)))
    assert (r["parse_status"], r["ip_proto"], r["payload_len"], r["sport"]) == ("ip_other", 47, 16, None)
