"""Reading a capture in part (``read_tables(kept=)``, what a partition's worker does): the records
left out are walked but not decoded, and the rows kept are the whole reading's, whatever the chunk
size, the format, the address table's growth or the damage at the end."""
import numpy as np
import polars as pl
import pytest

from analyzer.ingest import read_tables
from builders import custom_block, epb, ethernet, idb, ipv4, ipv6, pcap_file, shb, tcp, udp


def _packet(k: int) -> bytes:
    if k % 5 == 0:
        return ethernet(ipv6(udp(b"q" * (k % 9)), nh=17, src=f"2001:db8::{k:x}"), ethertype=0x86DD)
    return ethernet(ipv4(tcp(b"x" * (k % 13), seq=k), src=f"10.{k // 65536 % 256}.{k // 256 % 256}.{k % 256}"))


def _pcap(n: int) -> bytes:
    return pcap_file([(1_700_000_000 + k // 1000, k % 1000, _packet(k)) for k in range(n)])


def _pcapng(n: int) -> bytes:
    body = shb() + idb(1) + idb(1, tsresol=9)
    for k in range(n):
        body += custom_block() if k % 17 == 3 else epb(k % 2, 1_000_000 + k, _packet(k))
    return body


CAPTURES = {
    "pcap": _pcap(300),
    # more distinct addresses than the address table's first allocation: it grows in mid-chunk
    "pcap, table grows": _pcap(3000),
    "pcapng, two interfaces, custom blocks": _pcapng(300),
    "pcap cut in a record": _pcap(200)[:-7],
}


def _masks(records: int, seed: int):
    rng = np.random.default_rng(seed)
    yield "random", rng.random(records) < 0.3, rng.random(records) < 0.8
    yield "all", np.ones(records, bool), np.ones(records, bool)
    yield "none", np.zeros(records, bool), np.ones(records, bool)
    yield "shorter than the file", np.ones(records // 2, bool), np.ones(records // 3, bool)


def _texts(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col(c).cast(pl.String) for c in ("src", "dst", "inner_src", "inner_dst")
                              if c in frame.columns)


@pytest.mark.parametrize("name", list(CAPTURES))
@pytest.mark.parametrize("chunk_records", [4, 97, 1 << 20])
def test_a_part_read_is_the_whole_reading_restricted(tmp_path, name, chunk_records):
    path = tmp_path / ("t.pcapng" if "pcapng" in name else "t.pcap")
    path.write_bytes(CAPTURES[name])
    data, whole = read_tables(path)
    data.close()
    records = whole.report.records
    for label, keep, timed in _masks(records, seed=len(name) + chunk_records):
        data, part = read_tables(path, chunk_records=chunk_records, kept=(keep, timed))
        data.close()
        rows = np.zeros(records, bool)
        rows[:len(keep)] = keep
        expected = whole.packets.filter(pl.Series(rows))
        assert _texts(part.packets).drop("parse_status").equals(_texts(expected).drop("parse_status")), label
        assert part.packets["parse_status"].cast(pl.String).equals(expected["parse_status"].cast(pl.String))
        at = np.zeros(records, bool)
        at[:len(timed)] = timed
        assert part.times.equals(whole.packets.select("frame", "ts_ns").filter(pl.Series(at))), label
        assert part.tcp_sack.equals(whole.tcp_sack.join(expected.select("frame"), on="frame", how="semi"))
        assert _texts(part.icmp_errors).equals(_texts(whole.icmp_errors.join(expected.select("frame"), on="frame",
                                                                               how="semi")))
        # the walk is the whole file's: its records, counts and where it stopped
        assert (part.report.records, part.report.counts, part.report.stop) == \
            (records, whole.report.counts, whole.report.stop), label
        kept_status = expected["parse_status"].cast(pl.String).value_counts()
        assert part.report.parse_status == dict(kept_status.iter_rows()), label


def test_a_part_of_nothing_is_an_empty_frame_of_the_same_schema(tmp_path):
    path = tmp_path / "t.pcap"
    path.write_bytes(CAPTURES["pcap"])
    data, whole = read_tables(path)
    data.close()
    data, part = read_tables(path, kept=(np.zeros(0, bool), np.zeros(0, bool)))
    data.close()
    assert part.packets.height == 0 and part.times.height == 0
    assert part.packets.drop("src", "dst").schema == whole.packets.drop("src", "dst").schema


def test_a_capture_read_with_some_packet_columns_holds_those_and_builds_nothing(tmp_path):
    """What a partitioned scan's caller reads (detectors.scan_command.CALLER_PACKET_COLUMNS): the
    columns asked for and those the reader needs, the same rows as a whole reading; a frame asked of
    it is a clear error, not a missing column deep in a builder."""
    from analyzer.capture import open_captures
    from analyzer.ingest import READ_COLUMNS

    path = tmp_path / "t.pcap"
    path.write_bytes(CAPTURES["pcap"])
    whole = open_captures([path])
    narrow = open_captures([path], packet_columns=("sport", "caplen"))
    expected = [c for c in whole.packets.columns if c in {"sport", "caplen", *READ_COLUMNS}]
    assert narrow.packets.columns == expected and len(expected) < len(whole.packets.columns)
    assert narrow.packets.equals(whole.packets.select(expected))
    assert narrow.frame("interfaces").equals(whole.frame("interfaces"))
    with pytest.raises(RuntimeError, match="only the packet columns"):
        narrow.frame("connections")
    whole.close()
    narrow.close()
