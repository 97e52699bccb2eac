"""The packets frame against tshark 4.0's dissection, field by field, on every corpus capture.

Compared per frame: the frame count, timestamp (ns), captured and wire lengths, addresses, the DSCP and
ECN codepoints of the (outer) IP header, ports, IP protocol, TCP sequence/acknowledgment numbers
(absolute), flags, raw window and payload length, and the UDP length. The corpus has few ECN marks, so
the same comparison also runs on generated RoCEv2 captures (ECT(0) and CE marks, IPv6 traffic class). Where herdscope and Wireshark differ on purpose, the rows are excluded by a rule that
says why (see ``_deliberate``), and the rule itself is tested to exclude only what it should.
"""
from pathlib import Path

import polars as pl
import pytest

from analyzer import UnreadableCapture, open_capture
from tshark_ref import as_hex_int, as_int, corpus_files, epoch_to_ns, have_tshark, tshark_run

CORPUS = Path(__file__).parent / "data" / "corpus"
pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not have_tshark(), reason="tshark not installed")]

FIELDS = ["frame.number", "frame.time_epoch", "frame.cap_len", "frame.len", "ip.src", "ip.dst", "ipv6.src",
          "ipv6.dst", "tcp.srcport", "tcp.dstport", "udp.srcport", "udp.dstport", "tcp.seq_raw", "tcp.ack_raw",
          "tcp.flags", "tcp.window_size_value", "tcp.len", "udp.length", "ip.proto", "ip.dsfield.dscp",
          "ip.dsfield.ecn", "ipv6.tclass.dscp", "ipv6.tclass.ecn"]

# Files whose packets tshark cannot fully read, with what tshark says (the rows before the damage
# are still compared).
TSHARK_DAMAGED = {"gopacket/pcapng-suite/le/test901.pcapng", "dpkt/truncated_dns_2.pcap",
                  "suricata-verify/http-mime-truncated/input.pcap"}


def _reference(path: Path) -> pl.DataFrame:
    run = tshark_run(path, FIELDS, occurrence="a", aggregator="|")
    ref = run.frame
    first = {f: pl.col(f).str.split("|").list.first() for f in FIELDS}
    return ref.with_columns(
        as_int(first["frame.number"]).alias("frame"),
        epoch_to_ns(first["frame.time_epoch"]).alias("t_ts"),
        as_int(first["frame.cap_len"]).alias("t_caplen"), as_int(first["frame.len"]).alias("t_len"),
        pl.coalesce(first["ip.src"], first["ipv6.src"]).alias("t_src"),
        pl.coalesce(first["ip.dst"], first["ipv6.dst"]).alias("t_dst"),
        as_int(pl.coalesce(first["ip.dsfield.dscp"], first["ipv6.tclass.dscp"])).alias("t_dscp"),
        as_int(pl.coalesce(first["ip.dsfield.ecn"], first["ipv6.tclass.ecn"])).alias("t_ecn"),
        # tunnels and ICMP quotes put several IP layers in one frame: count them
        (pl.concat_str([pl.col("ip.src").fill_null(""), pl.col("ipv6.src").fill_null("")], separator="|")
         .str.split("|").list.eval(pl.element().filter(pl.element() != "")).list.len()).alias("t_ip_layers"),
        as_int(pl.coalesce(first["tcp.srcport"], first["udp.srcport"])).alias("t_sport"),
        as_int(pl.coalesce(first["tcp.dstport"], first["udp.dstport"])).alias("t_dport"),
        as_int(first["tcp.seq_raw"]).alias("t_seq"), as_int(first["tcp.ack_raw"]).alias("t_ack"),
        as_hex_int(first["tcp.flags"]).alias("t_flags"), as_int(first["tcp.window_size_value"]).alias("t_win"),
        as_int(first["tcp.len"]).alias("t_tcplen"), as_int(first["udp.length"]).alias("t_udplen"),
    ).select(pl.col("frame"), pl.col("^t_.*$"))


def _joined(path: Path) -> tuple[pl.DataFrame, int, int]:
    with open_capture(path) as cap:
        ours = cap.packets.select(
            "frame", "ts_ns", "caplen", "wirelen", pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String),
            "sport", "dport", "ip_proto", "seq", "ack", "tcp_flags", "window", "payload_len", "parse_status",
            "frag_offset", "ip_flags", "icmp_type", "iface", "dscp", "ecn")
    ref = _reference(path)
    return ours.join(ref, on="frame", how="inner"), ours.height, ref.height


def _deliberate() -> pl.Expr:
    """Rows where the transport fields are not comparable, on purpose."""
    return (
        # tunnels (GRE, GTP, IP-in-IP) and ICMP errors: tshark's first transport header is the inner one,
        # herdscope does not decapsulate
        (pl.col("t_ip_layers") > 1) | pl.col("icmp_type").is_not_null()
        # IP fragments: tshark shows the reassembled datagram's ports on the last fragment
        | (pl.col("frag_offset").fill_null(0) > 0) | ((pl.col("ip_flags").fill_null(0) & 1) == 1)
    )


def _files():
    return sorted(r["file"] for r in corpus_files())


@pytest.mark.parametrize("rel", _files())
def test_packets_match_tshark(rel):
    path = CORPUS / rel
    try:
        j, ours_n, ref_n = _joined(path)
    except UnreadableCapture:
        pytest.skip("not a capture herdscope reads (reported as unreadable)")
    _agree(rel, j, ours_n, ref_n)


# Generated RoCEv2 captures (tests/rocev2_captures.py): incast has CE marks next to ECT(0), healthy has
# IPv6 hosts (traffic class); CNPs are sent with DSCP 48, data with DSCP 26.
ROCEV2_SCENARIOS = ("rocev2-incast", "rocev2-healthy")


@pytest.mark.parametrize("scenario", ROCEV2_SCENARIOS)
def test_generated_rocev2_matches_tshark(scenario):
    from rocev2_captures import rocev2_capture  # noqa: E402 (tests/ on sys.path)

    j, ours_n, ref_n = _joined(rocev2_capture(scenario))
    _agree(scenario, j, ours_n, ref_n)
    ip = j.filter(pl.col("t_ecn").is_not_null())
    assert ip.height > 0.9 * j.height
    # the codepoints that matter here are there, so the comparison above compared something
    assert 2 in ip["ecn"].unique().to_list(), "ECT(0)"
    if scenario == "rocev2-incast":
        assert ip.filter(pl.col("ecn") == 3).height > 0, "CE marks"
        assert {26, 48} <= set(ip["dscp"].unique().to_list()), "data and CNP DSCPs"
    else:
        assert j.filter(pl.col("src").str.contains(":") & pl.col("t_ecn").is_not_null()).height > 0, "IPv6"


def test_hand_built_dscp_ecn_match_tshark(tmp_path):
    """Every ECN codepoint under several DSCPs, IPv4 TOS and IPv6 traffic class (with a flow label next
    to it), and a frame without IP (null), by value and against tshark."""
    import struct

    from builders import ethernet, ipv4, ipv6, pcap_file, udp

    tos = [(dscp << 2) | ecn for dscp in (0, 10, 26, 46, 48, 63) for ecn in range(4)]
    frames = []
    for t in tos:
        v4 = ipv4(udp(b"x" * 8, sport=4791, dport=4791), proto=17)
        frames.append(ethernet(v4[:1] + bytes([t]) + v4[2:]))
        v6 = ipv6(udp(b"x" * 8, sport=4791, dport=4791), nh=17)
        frames.append(ethernet(struct.pack(">I", 0x60000000 | t << 20 | 0xABCDE) + v6[4:], ethertype=0x86DD))
    frames.append(ethernet(b"\0" * 28, ethertype=0x0806))  # ARP
    path = tmp_path / "dsfield.pcap"
    path.write_bytes(pcap_file([(1, k, f) for k, f in enumerate(frames)]))
    j, ours_n, ref_n = _joined(path)
    _agree("dsfield.pcap", j, ours_n, ref_n)
    expected = [(t >> 2, t & 3) for t in tos for _ in (4, 6)] + [(None, None)]
    assert list(zip(j.sort("frame")["dscp"], j.sort("frame")["ecn"])) == expected


def _agree(rel: str, j: pl.DataFrame, ours_n: int, ref_n: int) -> None:
    if rel not in TSHARK_DAMAGED:
        assert ours_n == ref_n, "frame count"
    # times: tshark leaves Simple Packet Blocks and custom blocks without a time; tshark's text for
    # invalid (>= 1 s) fractions is not a number (timestamp_invalid_*.pcap)
    timed = j.filter(pl.col("t_ts").is_not_null() & ~pl.lit(Path(rel).name.startswith("timestamp_invalid")))
    assert timed.filter(pl.col("ts_ns") != pl.col("t_ts")).height == 0, "timestamps"
    assert j.filter((pl.col("caplen") != pl.col("t_caplen")) | (pl.col("wirelen") != pl.col("t_len"))).height == 0
    decoded = j.filter(pl.col("parse_status") != "unsupported_linktype")
    assert decoded.filter(pl.col("src").ne_missing(pl.col("t_src")) | pl.col("dst").ne_missing(pl.col("t_dst"))).height == 0
    ds = decoded.filter(pl.col("dscp").cast(pl.Int64).ne_missing(pl.col("t_dscp"))
                        | pl.col("ecn").cast(pl.Int64).ne_missing(pl.col("t_ecn")))
    assert ds.height == 0, ds.select("frame", "parse_status", "dscp", "t_dscp", "ecn", "t_ecn").head(5).to_dicts()
    comparable = decoded.filter(~_deliberate())
    bad = comparable.filter(
        pl.col("sport").cast(pl.Int64).ne_missing(pl.col("t_sport"))
        | pl.col("dport").cast(pl.Int64).ne_missing(pl.col("t_dport"))
        | pl.col("seq").cast(pl.Int64).ne_missing(pl.col("t_seq"))
        | pl.col("ack").cast(pl.Int64).ne_missing(pl.col("t_ack"))
        | pl.col("tcp_flags").cast(pl.Int64).ne_missing(pl.col("t_flags"))
        | pl.col("window").cast(pl.Int64).ne_missing(pl.col("t_win"))
        | (pl.col("t_tcplen").is_not_null() & (pl.col("payload_len").cast(pl.Int64) != pl.col("t_tcplen")))
        | (pl.col("t_udplen").is_not_null() & (pl.col("parse_status") == "ok")
           & (pl.col("payload_len").cast(pl.Int64) != pl.col("t_udplen") - 8))
    )
    assert bad.height == 0, bad.head(5).to_dicts()


def test_the_deliberate_rule_excludes_little():
    """The exclusions above cover tunnels, ICMP quotes and fragments only: a small share of packets."""
    total = excluded = 0
    for rel in _files():
        try:
            j, _, _ = _joined(CORPUS / rel)
        except UnreadableCapture:
            continue
        total += j.height
        excluded += j.filter(_deliberate()).height
    assert total > 10000 and excluded / total < 0.2
