"""Hostile input: real captures cut and mutated at random never crash or hang the reader, and every
record is either a row or a counted skip (checked against the slow reference walkers in naive.py)."""
import gzip
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from analyzer import UnreadableCapture, open_capture

CORPUS = Path(__file__).parent / "data" / "corpus"
SEEDS_PCAP = [CORPUS / "arkime/wireshark-retrans.pcap", CORPUS / "zeek/tcp/reassembly.pcap",
              CORPUS / "pcapplusplus/PcapExamples/VlanPackets.pcap", CORPUS / "pcapplusplus/PcapExamples/sll2.pcap",
              CORPUS / "pcapplusplus/PcapExamples/nanosecs_big_endian.pcap"]
SEEDS_PCAPNG = [CORPUS / "gopacket/pcapng-suite/be/test202.pcapng", CORPUS / "gopacket/pcapng-suite/le/test201.pcapng",
                CORPUS / "pcapplusplus/PcapExamples/pcapng-example.pcapng",
                CORPUS / "gopacket/pcapng-suite/le/test902.pcapng"]
FUZZ = settings(max_examples=80, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


def _read(tmp_path, data: bytes, name: str):
    path = tmp_path / name
    path.write_bytes(data)
    try:
        cap = open_capture(path)
    except UnreadableCapture:
        return None
    return cap


def _check_invariants(cap, size: int):
    p = cap.packets
    assert p["frame"].to_list() == list(range(1, p.height + 1))
    with_payload = p.filter(pl.col("payload_offset").is_not_null())
    ends = (with_payload["payload_offset"] + with_payload["payload_caplen"].cast(pl.Int64)).to_numpy()
    assert (ends <= size).all() and (with_payload["payload_caplen"] <= with_payload["payload_len"]).all()
    # the side tables only reference existing frames
    assert cap.frame("tcp_sack")["frame"].is_in(p["frame"].implode()).all()
    r = cap.report
    assert (r.stop_offset is None) == (r.stop == "end of file")
    if r.stop_offset is not None:
        assert r.bytes_not_read == size - r.stop_offset


def _same_as_naive_pcap(cap, data):
    records, stop = naive.walk_pcap(data)
    p = cap.packets
    assert p.height == len(records)
    if records:
        assert p["caplen"].to_list() == [r[1] for r in records]
        assert p["ts_ns"].to_list() == [r[3] for r in records]
    assert (stop == "eof") == (cap.report.stop_offset is None)


@FUZZ
@given(seed=st.sampled_from(SEEDS_PCAP), data=st.data())
def test_truncated_pcap_keeps_every_complete_record(tmp_path, seed, data):
    raw = seed.read_bytes()
    cut = data.draw(st.integers(24, len(raw)))
    cap = _read(tmp_path, raw[:cut], "cut.pcap")
    _same_as_naive_pcap(cap, raw[:cut])
    _check_invariants(cap, cut)
    cap.close()


@FUZZ
@given(seed=st.sampled_from(SEEDS_PCAP), data=st.data())
def test_mutated_pcap_never_crashes_and_matches_the_reference(tmp_path, seed, data):
    raw = bytearray(seed.read_bytes())
    for _ in range(data.draw(st.integers(1, 12))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cap = _read(tmp_path, bytes(raw), "mut.pcap")
    if cap is None:  # the file header itself was destroyed: a clear error, nothing else
        return
    if cap.file_format.kind == "pcap":
        _same_as_naive_pcap(cap, bytes(raw))
    _check_invariants(cap, len(raw))
    cap.frame("tcp_segments")  # TCP analysis over damaged headers must not crash either
    cap.close()


@FUZZ
@given(seed=st.sampled_from(SEEDS_PCAPNG), data=st.data())
def test_mutated_or_cut_pcapng_matches_the_reference(tmp_path, seed, data):
    raw = bytearray(seed.read_bytes())
    for _ in range(data.draw(st.integers(0, 8))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    raw = bytes(raw[:data.draw(st.integers(12, len(raw)))])
    cap = _read(tmp_path, raw, "mut.pcapng")
    if cap is None:
        return
    records, stop, skipped = naive.walk_pcapng(raw)
    p = cap.packets
    assert p.height == len(records), (stop, cap.report)
    assert p["caplen"].to_list() == [r[1] for r in records]
    timed = [(k, r[3]) for k, r in enumerate(records) if r[3] is not None and r[4] == "packet"]
    ours = p["ts_ns"].to_list()
    assert all(ours[k] == ts for k, ts in timed)
    assert cap.report.skipped_records == skipped + (0 if stop == "eof" else 1)
    _check_invariants(cap, len(raw))
    cap.close()


@settings(max_examples=30, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(min_size=0, max_size=400))
def test_random_bytes_are_rejected_or_read(tmp_path, blob):
    for head in (b"", b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00" + bytes(16), b"\x0a\x0d\x0d\x0a"):
        cap = _read(tmp_path, head + blob, "rand.pcap")
        if cap is not None:
            _check_invariants(cap, len(head + blob))
            cap.close()


@FUZZ
@given(seed=st.sampled_from(SEEDS_PCAP), data=st.data())
def test_cut_gzip_stream_reads_what_arrived(tmp_path, seed, data):
    packed = gzip.compress(seed.read_bytes())
    cut = data.draw(st.integers(10, len(packed)))
    cap = _read(tmp_path, packed[:cut], "cut.pcap.gz")
    if cap is None:
        return
    _check_invariants(cap, len(cap.buf))
    cap.close()


def test_huge_claimed_lengths_do_not_allocate_or_hang(tmp_path):
    header = bytes.fromhex("d4c3b2a1020004000000000000000000ffffffff01000000")
    record = np.array([1, 0, 0xFFFFFFF0, 0xFFFFFFF0], dtype="<u4").tobytes()
    cap = _read(tmp_path, header + record * 3, "huge.pcap")
    assert cap.packets.height == 0 and "cannot be right" in cap.report.stop
    cap.close()
