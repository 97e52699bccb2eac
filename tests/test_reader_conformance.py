"""The packets frame against tshark 4.0's dissection, field by field, on every corpus capture.

Compared per frame: the frame count, timestamp (ns), captured and wire lengths, addresses, ports, IP
protocol, TCP sequence/acknowledgment numbers (absolute), flags, raw window and payload length, and
the UDP length. Where herdscope and Wireshark differ on purpose, the rows are excluded by a rule that
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
          "tcp.flags", "tcp.window_size_value", "tcp.len", "udp.length", "ip.proto"]

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
            "frag_offset", "ip_flags", "icmp_type", "iface")
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
    if rel not in TSHARK_DAMAGED:
        assert ours_n == ref_n, "frame count"
    # times: tshark leaves Simple Packet Blocks and custom blocks without a time; tshark's text for
    # invalid (>= 1 s) fractions is not a number (timestamp_invalid_*.pcap)
    timed = j.filter(pl.col("t_ts").is_not_null() & ~pl.lit(Path(rel).name.startswith("timestamp_invalid")))
    assert timed.filter(pl.col("ts_ns") != pl.col("t_ts")).height == 0, "timestamps"
    assert j.filter((pl.col("caplen") != pl.col("t_caplen")) | (pl.col("wirelen") != pl.col("t_len"))).height == 0
    decoded = j.filter(pl.col("parse_status") != "unsupported_linktype")
    assert decoded.filter(pl.col("src").ne_missing(pl.col("t_src")) | pl.col("dst").ne_missing(pl.col("t_dst"))).height == 0
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
