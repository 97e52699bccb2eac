"""Capture file formats from byte literals: classic pcap and pcapng, well-formed and damaged."""
import gzip
import struct

import pytest

from builders import (custom_block, epb, ethernet, idb, ipv4, packet_block, pcap_file, shb, spb, tcp,
                      udp, block)

PKT = ethernet(ipv4(udp(b"x" * 10), proto=17))


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("nanosecond", [False, True])
def test_pcap_byte_orders_and_resolutions(read_capture, big_endian, nanosecond):
    frac = 123456789 if nanosecond else 123456
    data = pcap_file([(1700000000, frac, PKT), (1700000001, 5, PKT)], big_endian=big_endian,
                     nanosecond=nanosecond)
    cap = read_capture(data)
    p = cap.packets
    assert p["frame"].to_list() == [1, 2]
    scale = 1 if nanosecond else 1000
    assert p["ts_ns"].to_list() == [1700000000 * 10**9 + frac * scale, 1700000001 * 10**9 + 5 * scale]
    assert p["src"].to_list() == ["10.0.0.1", "10.0.0.1"]
    assert cap.report.clean
    assert cap.frame("interfaces")["ts_resolution_ns"].to_list() == [1.0 if nanosecond else 1000.0]


def test_pcap_modified_kuznetzov_header(read_capture):
    cap = read_capture(pcap_file([(1, 0, PKT), (2, 0, PKT)], kuznetzov=True))
    assert cap.packets.height == 2 and cap.packets["dport"].to_list() == [53, 53]


def test_pcap_wire_length_and_caplen(read_capture):
    cap = read_capture(pcap_file([(1, 0, PKT[:34], len(PKT))]))
    row = cap.packets.row(0, named=True)
    assert (row["caplen"], row["wirelen"]) == (34, len(PKT))
    assert row["parse_status"] == "truncated_l4"  # the UDP header was cut by the snapshot length


def test_pcap_truncated_last_record_is_reported_not_lost(read_capture):
    whole = pcap_file([(1, 0, PKT), (2, 0, PKT), (3, 0, PKT)])
    cap = read_capture(whole[:-5])
    assert cap.packets.height == 2
    assert cap.report.stop_offset == 24 + 2 * (16 + len(PKT))
    assert cap.report.bytes_not_read == 16 + len(PKT) - 5
    assert cap.report.skipped_records == 1


def test_pcap_truncated_record_header(read_capture):
    cap = read_capture(pcap_file([(1, 0, PKT)]) + b"\x01\x02\x03")
    assert cap.packets.height == 1 and cap.report.bytes_not_read == 3


def test_pcap_bogus_record_length_stops_with_report(read_capture):
    good = pcap_file([(1, 0, PKT)])
    bogus = struct.pack("<IIII", 2, 0, 0x7FFFFFFF, 0x7FFFFFFF) + b"\0" * 64
    cap = read_capture(good + bogus)
    assert cap.packets.height == 1
    assert "cannot be right" in cap.report.stop


def test_timestamps_going_backwards_are_kept_and_counted(read_capture):
    cap = read_capture(pcap_file([(5, 0, PKT), (3, 0, PKT), (4, 0, PKT)]))
    assert cap.packets["ts_ns"].to_list() == [5 * 10**9, 3 * 10**9, 4 * 10**9]
    assert cap.report.counts["timestamps_backwards"] == 1


def test_empty_pcap_has_no_packets(read_capture):
    cap = read_capture(pcap_file([]))
    assert cap.packets.height == 0 and cap.report.clean


@pytest.mark.parametrize("order", ["<", ">"])
def test_pcapng_basic_blocks(read_capture, order):
    data = (shb(order) + idb(1, 65535, o=order) + epb(0, 1_700_000_000_000_001, PKT, o=order)
            + spb(PKT, o=order) + packet_block(0, 1_700_000_000_000_002, PKT, o=order))
    cap = read_capture(data, "t.pcapng")
    p = cap.packets
    assert p.height == 3
    assert p["ts_ns"].to_list() == [1_700_000_000_000_001_000] * 2 + [1_700_000_000_000_002_000]
    assert cap.report.counts["simple_packet_blocks_without_timestamp"] == 1
    assert cap.report.format.startswith("pcapng")


def test_pcapng_tsresol_decimal_power_of_two_and_offset(read_capture):
    data = (shb() + idb(1, tsresol=9) + idb(1, tsresol=0x80 | 20) + idb(1, tsresol=3, tsoffset=1000)
            + epb(0, 1_500_000_000_123_456_789, PKT) + epb(1, (3 << 20) + (1 << 19), PKT)
            + epb(2, 2500, PKT))
    cap = read_capture(data, "t.pcapng")
    assert cap.packets["ts_ns"].to_list() == [1_500_000_000_123_456_789, 3_500_000_000, 1002_500_000_000]
    res = cap.frame("interfaces")["ts_resolution_ns"].to_list()
    assert res[0] == 1.0 and res[1] == pytest.approx(1e9 / 2**20) and res[2] == 1e6


def test_pcapng_multiple_sections_and_byte_orders(read_capture):
    data = (shb("<") + idb(1, o="<") + epb(0, 10, PKT, o="<")
            + shb(">") + idb(101, o=">") + idb(1, o=">") + epb(1, 20, PKT, o=">") + epb(0, 30, ipv4(udp(), proto=17), o=">"))
    cap = read_capture(data, "t.pcapng")
    p = cap.packets
    assert p["iface"].to_list() == [0, 2, 1]  # section 2's interface 1 is the third IDB of the file
    assert p["parse_status"].to_list() == ["ok", "ok", "ok"]
    ifaces = cap.frame("interfaces")
    assert ifaces["section"].to_list() == [0, 1, 1] and ifaces["linktype"].to_list() == [1, 101, 1]
    assert cap.report.counts["sections"] == 2


def test_pcapng_interface_name(read_capture):
    cap = read_capture(shb() + idb(1, name="eth0") + epb(0, 1, PKT), "t.pcapng")
    assert cap.frame("interfaces")["name"].to_list() == ["eth0"]


def test_pcapng_skips_and_counts_non_packet_blocks(read_capture):
    nrb = block(4, b"\0\0\0\0")
    isb = block(5, b"\0" * 12)
    dsb = block(10, b"\0" * 8)
    unknown = block(0x12345, b"abcd")
    data = shb() + idb(1) + nrb + isb + dsb + unknown + epb(0, 1, PKT)
    cap = read_capture(data, "t.pcapng")
    assert cap.packets.height == 1
    c = cap.report.counts
    assert (c["name_resolution_blocks"], c["interface_statistics_blocks"], c["decryption_secrets_blocks"],
            c["unknown_blocks"]) == (1, 1, 1, 1)


def test_pcapng_custom_blocks_are_numbered_like_wireshark(read_capture):
    data = shb() + idb(1) + custom_block() + epb(0, 1, PKT) + custom_block(copy=False) + epb(0, 2, PKT)
    cap = read_capture(data, "t.pcapng")
    p = cap.packets
    assert p["frame"].to_list() == [1, 2, 3, 4]
    assert p["parse_status"].to_list() == ["not_packet", "ok", "not_packet", "ok"]
    assert p["caplen"][0] == 8  # block body after the Private Enterprise Number, padded (as tshark)


def test_pcapng_packet_for_undescribed_interface_is_skipped_and_counted(read_capture):
    cap = read_capture(shb() + idb(1) + epb(3, 1, PKT) + epb(0, 2, PKT), "t.pcapng")
    assert cap.packets.height == 1
    assert cap.report.counts["unknown_interface"] == 1 and cap.report.skipped_records == 1


def test_pcapng_caplen_larger_than_block_is_skipped_and_walk_goes_on(read_capture):
    bad = bytearray(epb(0, 1, PKT))
    struct.pack_into("<I", bad, 20, 5000)  # caplen far beyond the block
    cap = read_capture(shb() + idb(1) + bytes(bad) + epb(0, 2, PKT), "t.pcapng")
    assert cap.packets.height == 1 and cap.report.counts["caplen_exceeds_block"] == 1


@pytest.mark.parametrize("damage", ["length_not_multiple_of_4", "trailer_mismatch", "length_too_small"])
def test_pcapng_bogus_block_length_stops_with_report(read_capture, damage):
    good = shb() + idb(1) + epb(0, 1, PKT)
    bad = bytearray(epb(0, 2, PKT))
    if damage == "length_not_multiple_of_4":
        struct.pack_into("<I", bad, 4, len(bad) - 2)
    elif damage == "trailer_mismatch":
        struct.pack_into("<I", bad, len(bad) - 4, 8)
    else:
        struct.pack_into("<I", bad, 4, 8)
    cap = read_capture(good + bytes(bad) + epb(0, 3, PKT), "t.pcapng")
    assert cap.packets.height == 1
    assert cap.report.stop_offset == len(good)
    assert cap.report.bytes_not_read == len(bad) + len(epb(0, 3, PKT))


def test_pcapng_block_running_past_end_is_truncation(read_capture):
    data = shb() + idb(1) + epb(0, 1, PKT)
    cap = read_capture(data[:-7], "t.pcapng")
    assert cap.packets.height == 0 and "cut short" in cap.report.stop


def test_pcapng_bad_idb_option_length_is_counted(read_capture):
    bad_idb = bytearray(idb(1, tsresol=9))
    struct.pack_into("<H", bad_idb, 18, 200)  # if_tsresol option claims 200 bytes
    cap = read_capture(shb() + bytes(bad_idb) + epb(0, 5, PKT), "t.pcapng")
    assert cap.report.counts["bad_block_options"] == 1
    assert cap.packets["ts_ns"].to_list() == [5000]  # default resolution (µs) applies


def test_gzip_compressed_capture_reads_like_the_original(read_capture):
    raw = pcap_file([(1, 0, PKT), (2, 0, ethernet(ipv4(tcp(b"abc"))))])
    plain = read_capture(raw, "a.pcap").packets
    cap = read_capture(gzip.compress(raw), "a.pcap.gz")
    assert cap.report.gzip
    assert cap.packets.drop("payload_offset").equals(plain.drop("payload_offset"))


def test_truncated_gzip_keeps_what_decompressed(read_capture):
    raw = pcap_file([(k, 0, PKT) for k in range(200)])
    cap = read_capture(gzip.compress(raw)[:-40], "cut.pcap.gz")
    assert 0 < cap.packets.height < 200
    assert cap.report.stop_offset is not None


@pytest.mark.parametrize("content,message", [
    (b"", "empty file"),
    (b"hello world, this is not a capture at all", "not a pcap or pcapng"),
    (b"\x1f\x8bnot really gzip", "gzip"),
])
def test_non_captures_raise_clear_errors(tmp_path, content, message):
    from analyzer import UnreadableCapture, open_capture

    path = tmp_path / "x.pcap"
    path.write_bytes(content)
    with pytest.raises(UnreadableCapture, match=message):
        open_capture(path)


def test_small_chunks_give_the_same_frame(read_capture):
    data = pcap_file([(k, k, ethernet(ipv4(tcp(b"x" * k, seq=k), src=f"10.0.{k % 7}.1"))) for k in range(100)])
    whole = read_capture(data, "a.pcap").packets
    chunked = read_capture(data, "b.pcap", chunk_records=7).packets
    assert chunked.equals(whole)
