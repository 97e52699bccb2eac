"""The caller of a run in partitions reads a file chunk by chunk, keeping of each only what the run reads
of it (issue 13: reading a 100M-packet capture whole held 6.3 GB in the calling process).

``analyzer.partitions.CallerChunks`` is the reduction ``read_tables(reduce=...)`` hands each chunk of
packets to; what it keeps must be what the whole reading gives once decided and narrowed: the same
partition of every packet, the same extracted rows (a scan's DNS payload locations, info's tally), the
same span and silences, the same packet count and interfaces (the effective resolution is sampled as
the packets are read, ``analyzer.resolution.TickSampler``, the same however they are cut into chunks).
Small chunks make the samples' few thousand packets many chunks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyzer.capture import open_captures
from analyzer.kernels.silences import KEEP_EVERY_TIME, SPAN_ONLY_NS, thinned_times
from analyzer.partitions import CallerChunks, partition_ids, read_part
from analyzer.resolution import SAMPLE_DIFFERENCES, TickSampler, effective_resolution
from analyzer.summary import PARTITIONED_PACKET_COLUMNS, damage_frames, merged_tally, packet_tally, protocols
from detectors.incidents_evidence import dns_payloads
from detectors.scan_command import CALLER_PACKET_COLUMNS

SAMPLES = Path(__file__).parent.parent / "samples"
CAPTURES = ["smb2-break-queue.pcap", "nfs4-delegation-recall.pcap", "krb5-as-tgs-herd.pcapng",
            "dns-retry-storm.pcapng", "tcp-incast.pcap", "eval/dns-herd-dnsmasq-50.pcap"]
SILENCE_NS = 200_000_000  # a silence a caller's detector reads: more rows kept than the span's two


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("chunk_records", [97, 1 << 20])
def test_a_chunked_reading_keeps_what_the_whole_one_gives_once_decided(name, chunk_records):
    path = SAMPLES / name
    with open_captures([path], packet_columns=CALLER_PACKET_COLUMNS) as whole:
        ids = partition_ids(whole, 3)
        payloads = dns_payloads(whole.packets)
        reads = [read_part(whole, None, k) for k in range(3)]
        times = thinned_times(whole.packets.select("frame", "ts_ns"), KEEP_EVERY_TIME)
        count, interfaces, pieces = whole.packet_count, whole.frame("interfaces"), whole.pieces
    chunks = CallerChunks(SILENCE_NS, dns_payloads)
    with open_captures([path], packet_columns=CALLER_PACKET_COLUMNS, reduce=chunks,
                       chunk_records=chunk_records) as cap:
        assert np.array_equal(partition_ids(cap, 3), ids)
        assert chunks.chunks == [] and chunks.decision is None  # the pairs let go of
        with pytest.raises(ValueError, match="decided already"):
            partition_ids(cap, 3)  # handed over once: the caller's is the only copy
        assert chunks.take_extracted().equals(payloads)
        assert _span_and_silences(cap.packets) == _span_and_silences(times)
        assert cap.packet_count == count and cap.pieces == pieces
        assert cap.frame("interfaces").equals(interfaces)
        part = read_part(cap, None, 1)
        assert part.address_types == reads[1].address_types
        with pytest.raises(RuntimeError):
            cap.frame("connections")  # nothing can be built of what a reduction kept


def _span_and_silences(times: pl.DataFrame):
    """What a detector reads of thinned packet times (``analyzer.kernels.silences``: the rows kept may
    differ, these do not): the first and last time, and each silence of at least SILENCE_NS with the
    frames either side."""
    times = times.sort("ts_ns", maintain_order=True)
    gaps = times.with_columns(pl.col("ts_ns").shift(1).alias("before"), pl.col("frame").shift(1).alias("frame_before"))
    gaps = gaps.filter(pl.col("ts_ns") - pl.col("before") >= SILENCE_NS)
    return times["ts_ns"].min(), times["ts_ns"].max(), gaps.rows()


def test_several_files_are_not_read_chunk_by_chunk():
    files = [SAMPLES / "tcp-incast.pcap", SAMPLES / "smb2-break-queue.pcap"]
    with pytest.raises(ValueError, match="of one file"):
        open_captures(files, packet_columns=CALLER_PACKET_COLUMNS, reduce=CallerChunks(SPAN_ONLY_NS))


def test_the_tick_sample_is_the_same_however_the_packets_are_cut():
    """Two interfaces interleaved, the fine one with more differences than the sample holds: fed at
    once and in chunks of random sizes, the same sample, counts and tick; the sample at most twice
    SAMPLE_DIFFERENCES, every s-th difference for a power of two s."""
    rng = np.random.default_rng(7)
    n = 3 * SAMPLE_DIFFERENCES + 12345
    ts = np.cumsum(rng.integers(0, 3000, n)).astype(np.int64)
    iface = (rng.random(n) < 0.2).astype(np.uint16)
    ts[iface == 1] = ts[iface == 1] // 10_000 * 10_000  # a 10 µs clock
    keep = rng.random(n) > 0.01  # a few records without a packet time
    whole = TickSampler()
    whole.add(ts, iface, keep)
    cut = TickSampler()
    edges = np.unique(np.r_[0, rng.integers(0, n, 40), n])
    for lo, hi in zip(edges, edges[1:]):
        cut.add(ts[lo:hi], iface[lo:hi], keep[lo:hi])
    for k in (0, 1):
        assert whole.count[k] == cut.count[k] and whole.stride[k] == cut.stride[k]
        assert np.array_equal(np.concatenate(whole.kept[k]), np.concatenate(cut.kept[k]))
        d = np.diff(ts[keep & (iface == k)])
        nonzero = d[d != 0]
        assert whole.count[k] == nonzero.shape[0]
        assert np.array_equal(np.concatenate(whole.kept[k]), nonzero[::whole.stride[k]])
        assert np.concatenate(whole.kept[k]).shape[0] <= 2 * SAMPLE_DIFFERENCES
        assert all(a.base is None for a in cut.kept[k])  # copies: a view would keep its chunk's differences
        stride = whole.stride[k]  # the least power of two leaving at most twice SAMPLE_DIFFERENCES
        assert stride & (stride - 1) == 0 and (stride == 1 or -(-whole.count[k] // (stride // 2)) > 2 * SAMPLE_DIFFERENCES)
    assert whole.stride[0] >= 2 and whole.stride[1] == 1
    out = cut.resolution(np.array([0, 1, 2], np.uint16), np.array([1.0, 1.0, 1000.0]))
    assert out["effective_resolution_ns"].tolist() == [1.0, 10_000.0, 1000.0]
    status = pl.Series(np.where(keep, "ok", "not_packet"), dtype=pl.Enum(["ok", "not_packet"]))
    at_once = effective_resolution(pl.DataFrame({"ts_ns": ts, "iface": iface, "parse_status": status}),
                                   np.array([0, 1, 2], np.uint16), np.array([1.0, 1.0, 1000.0]))
    assert all(np.array_equal(at_once[c], out[c]) for c in out)


def test_a_tally_adds_bytes_beyond_four_gigabytes_and_chunks_add_up_to_the_whole():
    """The byte sums are 64-bit: before, info of a 6.2 GB capture in partitions said 1.9 GB (a 32-bit sum
    of the captured lengths wrapped). The chunks' tallies, merged, are the whole capture's."""
    with open_captures([SAMPLES / "dns-retry-storm.pcapng"], packet_columns=PARTITIONED_PACKET_COLUMNS) as cap:
        packets = cap.packets
    big = packets.with_columns(pl.lit(1 << 31, pl.UInt32).alias("caplen"), pl.lit(1 << 31, pl.UInt32).alias("wirelen"))
    assert int(merged_tally(packet_tally(big))["bytes"].sum()) == packets.height << 31
    whole = merged_tally(packet_tally(packets))
    chunks = merged_tally(pl.concat([packet_tally(packets.slice(k, 50)) for k in range(0, packets.height, 50)]))
    key = ["iface", "ip_proto", "port"]
    assert chunks.sort(key).equals(whole.sort(key))
    assert protocols(packets) == protocols(packets, chunks) and damage_frames(chunks) == damage_frames(whole)
