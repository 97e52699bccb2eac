"""Tests of tests/tshark_ref.py (the tshark reference helper) and of the copied corpus.

The tshark tests check the helper against facts read straight from the capture bytes here (a
few lines of ``struct``), so they also pin down what tshark 4.0 prints.  Corpus checks need no
tshark.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import polars as pl
import pytest

import tshark_ref
from tshark_ref import (
    TsharkError,
    as_bool,
    as_flag,
    as_hex_int,
    as_int,
    as_list,
    cache_dir,
    corpus_files,
    epoch_to_ns,
    have_tshark,
    parse_epoch_ns,
    tshark_fields,
    tshark_run,
    tshark_version,
)

CORPUS = Path(__file__).parent / "data" / "corpus"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory: nothing is written to ~/.cache."""
    monkeypatch.setenv("HERDSCOPE_TSHARK_CACHE", str(tmp_path / "tshark-cache"))


def c(rel: str) -> Path:
    return CORPUS / rel


# ------------------------------------------------------------------ independent raw readers

def pcap_records(path: Path) -> list[tuple[int, int, bytes, int]]:
    """(seconds, subsecond field, captured bytes, original length) of a classic pcap."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    magic = data[:4]
    bo = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out, off = [], 24
    while off + 16 <= len(data):
        sec, sub, incl, orig = struct.unpack(bo + "IIII", data[off:off + 16])
        out.append((sec, sub, data[off + 16:off + 16 + incl], orig))
        off += 16 + incl
    return out


def pcap_is_ns(path: Path) -> bool:
    return path.read_bytes()[:4] in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


def pcapng_epb_times(path: Path) -> list[int]:
    """Raw 64-bit EPB timestamps (units of the interface's if_tsresol) of a one-section pcapng."""
    data = path.read_bytes()
    bo = "<" if data[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
    out, off = [], 0
    while off + 12 <= len(data):
        btype, blen = struct.unpack(bo + "II", data[off:off + 8])
        if btype == 6:
            hi, lo = struct.unpack(bo + "II", data[off + 12:off + 20])
            out.append((hi << 32) | lo)
        off += blen
    return out


# ------------------------------------------------------------------ basics

@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_version_is_a_tuple_of_ints():
    v = tshark_version()
    assert v and all(isinstance(x, int) for x in v)
    assert v >= (3, 0)


def test_helpers_do_not_need_tshark():
    s = pl.Series("x", ["1", None, "42"])
    assert as_int(s).to_list() == [1, None, 42]
    assert as_hex_int(pl.Series(["0x00000103", "0x0012", "ff", None])).to_list() == [259, 18, 255,
                                                                                     None]
    assert as_hex_int(pl.Series(["0xffffffffffffffff"]), dtype=pl.UInt64).to_list() == [2**64 - 1]
    assert as_bool(pl.Series(["1", "0", "True", "False", None])).to_list() == [True, False, True,
                                                                             False, None]
    assert as_list(pl.Series(["118,10", None])).to_list() == [["118", "10"], None]
    assert as_flag(pl.Series(["1", None, "1,1"])).to_list() == [True, False, True]
    with pytest.raises(Exception):
        as_int(pl.Series(["1,2"]))
    with pytest.raises(Exception):
        as_hex_int(pl.Series(["0xZZ"]))
    with pytest.raises(Exception):
        as_bool(pl.Series(["yes"]))


@pytest.mark.parametrize("text,ns", [
    ("1418145369.924505488", 1418145369924505488),
    ("1340954905.298858000", 1340954905298858000),
    ("1519128000.195312500", 1519128000195312500),
    ("4323283200.000000000", 4323283200000000000),  # 2107: beyond 32-bit seconds
    ("1.5", 1_500_000_000),
    ("7", 7_000_000_000),
    ("0.000000001", 1),
    ("-0.000000001", -1),
    ("1418145370.1000000000", 1418145371000000000),  # invalid nsec field 1e9, printed literally
    ("-1418145370.2147483648", -1418145372147483648),
])
def test_epoch_to_ns_is_exact(text, ns):
    assert parse_epoch_ns(text) == ns
    assert epoch_to_ns(pl.Series("t", [text])).to_list() == [ns]
    frame = pl.DataFrame({"frame.time_epoch": [text, None]})
    out = frame.with_columns(epoch_to_ns("frame.time_epoch"))
    assert out.schema["frame.time_epoch"] == pl.Int64
    assert out["frame.time_epoch"].to_list() == [ns, None]


@pytest.mark.parametrize("bad", ["", "abc", "12a.5", "1.2.3", "1e9", "0x10"])
def test_epoch_to_ns_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_epoch_ns(bad)
    with pytest.raises(Exception):
        epoch_to_ns(pl.Series([bad]))


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("HERDSCOPE_TSHARK_CACHE", "off")
    assert cache_dir() is None
    monkeypatch.setenv("HERDSCOPE_TSHARK_CACHE", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x"
    monkeypatch.delenv("HERDSCOPE_TSHARK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "herdscope-tshark"


def test_argument_checks():
    p = c("tcpdump/dns_udp.pcap")
    with pytest.raises(ValueError):
        tshark_ref._build_args(["frame.number", "frame.number"], None, False, None, "a", ",", ())
    with pytest.raises(TypeError):
        tshark_ref._build_args("frame.number", None, False, None, "a", ",", ())
    with pytest.raises(ValueError):
        tshark_ref._build_args(["frame.number"], None, False, None, "a", "\t", ())
    with pytest.raises(ValueError):
        tshark_ref._build_args(["frame.number"], None, False, None, "x", ",", ())
    args = tshark_ref._build_args(["tcp.seq"], "tcp", True,
                                  {"tcp.relative_sequence_numbers": False}, "f", "|", ())
    assert args[-2:] == ["-e", "tcp.seq"] and "-2" in args
    assert "tcp.relative_sequence_numbers:FALSE" in args and "occurrence=f" in args
    assert p.exists()


# ------------------------------------------------------------------ tshark, against raw bytes

@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
@pytest.mark.parametrize("rel", [
    "tcpdump/tcp-handshake-nano.pcap",                    # LE ns
    "pcapplusplus/PcapExamples/nanosecs_big_endian.pcap",  # BE ns
    "zeek/tcp/option-sack.pcap",                          # LE us
    "zeek/http/iso-download.pcap.gz",                     # gzip
])
def test_time_epoch_matches_file_timestamps(rel):
    path = c(rel)
    ref = tshark_fields(path, ["frame.number", "frame.time_epoch", "frame.len", "frame.cap_len"])
    ref = ref.with_columns(as_int("frame.number"), epoch_to_ns("frame.time_epoch"),
                           as_int("frame.len"), as_int("frame.cap_len"))
    raw = pcap_records(path)
    scale = 1 if pcap_is_ns(path) else 1000
    assert ref.height == len(raw)
    assert ref["frame.number"].to_list() == list(range(1, len(raw) + 1))
    assert ref["frame.time_epoch"].to_list() == [s * 1_000_000_000 + sub * scale
                                                 for s, sub, _, _ in raw]
    assert ref["frame.cap_len"].to_list() == [len(b) for _, _, b, _ in raw]
    assert ref["frame.len"].to_list() == [o for _, _, _, o in raw]


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_frame_and_columns_are_strings_with_nulls():
    ref = tshark_fields(c("tcpdump/tcp-handshake-nano.pcap"),
                        ["frame.number", "tcp.seq", "dns.id", "tcp.flags"])
    assert ref.columns == ["frame.number", "tcp.seq", "dns.id", "tcp.flags"]
    assert all(dt == pl.Utf8 for dt in ref.dtypes)
    assert ref["dns.id"].null_count() == ref.height == 3
    assert as_hex_int(ref["tcp.flags"]).to_list() == [0x02, 0x12, 0x10]  # SYN, SYN-ACK, ACK


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_sequence_numbers_relative_raw_and_pref():
    path = c("tcpdump/tcp-handshake-nano.pcap")  # Linux SLL (16 bytes) + IPv4 + TCP
    raw_seq, raw_ack = [], []
    for _, _, pkt, _ in pcap_records(path):
        ip = pkt[16:]
        tcp = ip[(ip[0] & 0x0F) * 4:]
        seq, ack = struct.unpack(">II", tcp[4:12])
        raw_seq.append(seq)
        raw_ack.append(ack)
    fields = ["tcp.seq", "tcp.seq_raw", "tcp.ack", "tcp.ack_raw"]
    rel = tshark_fields(path, fields).with_columns(*[as_int(f) for f in fields])
    assert rel["tcp.seq_raw"].to_list() == raw_seq
    assert rel["tcp.seq"].to_list() == [0, 0, 1]             # relative by default
    assert rel["tcp.ack"].to_list() == [0, 1, 1]             # SYN has no ACK flag -> 0
    assert rel["tcp.ack_raw"].to_list()[1:] == raw_ack[1:]
    absolute = tshark_fields(path, fields, prefs={"tcp.relative_sequence_numbers": False})
    absolute = absolute.with_columns(*[as_int(f) for f in fields])
    assert absolute["tcp.seq"].to_list() == raw_seq
    assert absolute["tcp.seq"].to_list() == absolute["tcp.seq_raw"].to_list()


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_tcp_len_is_payload_length_from_ip_header_even_when_cut():
    fields = ["frame.cap_len", "ip.len", "ip.hdr_len", "tcp.hdr_len", "tcp.len"]
    ref = tshark_fields(c("zeek/tcp/truncated-header.pcap"), fields, display_filter="tcp")
    ref = ref.with_columns(*[as_int(f) for f in fields])
    assert (ref["tcp.len"] == ref["ip.len"] - ref["ip.hdr_len"] - ref["tcp.hdr_len"]).all()
    row = tshark_fields(c("zeek/tcp/truncated-header.pcap"), fields,
                        display_filter="frame.number == 4").with_columns(
        *[as_int(f) for f in fields]).row(0, named=True)
    assert row["frame.cap_len"] == 54 and row["tcp.len"] == 84


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_power_of_two_tsresol_and_simple_packet_blocks():
    # if_tsresol = 0x88: units of 2^-8 s
    for rel in ("gopacket/pcapng-suite/le/test902.pcapng",
                "gopacket/pcapng-suite/be/test902.pcapng"):
        ref = tshark_fields(c(rel), ["frame.time_epoch"]).with_columns(
            epoch_to_ns("frame.time_epoch"))
        units = pcapng_epb_times(c(rel))
        assert ref["frame.time_epoch"].to_list() == [u * 1_000_000_000 // 256 for u in units]
        assert ref["frame.time_epoch"].to_list() == [1519128000195312500]
    # Simple Packet Blocks carry no timestamp: tshark leaves frame.time_epoch empty
    spb = tshark_fields(c("gopacket/pcapng-suite/le/test010.pcapng"),
                        ["frame.number", "frame.time_epoch", "frame.len"])
    assert spb.height == 4
    assert spb["frame.time_epoch"].null_count() == 4
    assert epoch_to_ns(spb["frame.time_epoch"]).null_count() == 4


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_custom_blocks_are_numbered_as_frames():
    ref = tshark_fields(c("gopacket/pcapng-suite/le/test018.pcapng"),
                        ["frame.number", "frame.encap_type", "frame.time_epoch", "frame.protocols"])
    assert ref.height == 8
    custom = ref.filter(pl.col("frame.encap_type").is_null())
    assert custom.height == 4
    assert custom["frame.time_epoch"].null_count() == 4
    assert set(custom["frame.protocols"]) == {"data"}


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_multi_section_interface_ids_are_section_local():
    ref = tshark_fields(c("gopacket/pcapng-suite/le/test201.pcapng"),
                        ["frame.number", "frame.interface_id", "frame.encap_type"])
    # 3 sections, 5 IDBs; the last packet uses IDB 1 of section 3 (NULL link type)
    assert ref["frame.interface_id"].to_list() == ["0", "0", "0", "1"]
    assert ref["frame.encap_type"].to_list()[-1] == "15"  # WTAP_ENCAP_NULL
    mixed = tshark_fields(c("gopacket/pcapng-suite/be/test202.pcapng"),
                          ["frame.number", "frame.interface_id"])
    assert mixed.height == 11  # BE and LE sections in one file, custom blocks numbered too


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_occurrence_and_aggregator():
    path = c("pcapplusplus/PcapExamples/VlanPackets.pcap")
    flt = "frame.number == 1"
    assert tshark_fields(path, ["vlan.id"], display_filter=flt)["vlan.id"].to_list() == ["118,10"]
    assert tshark_fields(path, ["vlan.id"], display_filter=flt, occurrence="f")[
        "vlan.id"].to_list() == ["118"]
    assert tshark_fields(path, ["vlan.id"], display_filter=flt, occurrence="l")[
        "vlan.id"].to_list() == ["10"]
    piped = tshark_fields(path, ["vlan.id"], display_filter=flt, aggregator="|")
    assert piped["vlan.id"].to_list() == ["118|10"]
    assert as_list(piped["vlan.id"], "|").to_list() == [["118", "10"]]
    smb = tshark_fields(c("zeek/smb/smb2-multiple-pdus.pcap"), ["smb2.cmd"])
    assert smb["smb2.cmd"].to_list() == ["5,17,6", "5,17,6"]  # compound CREATE+SET_INFO+CLOSE


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_filter_keeps_numbering_and_two_pass_fills_forward_references():
    path = c("tcpdump/dns_udp.pcap")
    one = tshark_fields(path, ["frame.number", "dns.id", "dns.response_in", "dns.response_to"])
    assert one["dns.response_in"].to_list() == [None, None]          # needs two passes
    assert one["dns.response_to"].to_list() == [None, "1"]
    assert as_hex_int(one["dns.id"]).to_list() == [0x5934, 0x5934]
    two = tshark_fields(path, ["frame.number", "dns.response_in"], two_pass=True)
    assert two["dns.response_in"].to_list() == ["2", None]
    only = tshark_fields(path, ["frame.number"], display_filter="dns.flags.response == 1")
    assert only["frame.number"].to_list() == ["2"]
    # flag fields: "1" when present, null otherwise
    rx = tshark_fields(c("zeek/tcp/option-sack.pcap"), ["tcp.analysis.retransmission"])
    assert set(rx["tcp.analysis.retransmission"].drop_nulls()) == {"1"}
    assert as_flag(rx["tcp.analysis.retransmission"]).sum() == 3


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_stderr_is_kept_for_cut_short_files():
    res = tshark_run(c("dpkt/truncated_dns_2.pcap"), ["frame.number", "dns.id"])
    assert res.returncode == 2
    assert res.frame.height == 1
    assert any("cut short in the middle of a packet" in w for w in res.warnings)
    assert not any(w.startswith("Running as user") for w in res.warnings)
    frame = tshark_fields(c("dpkt/truncated_dns_2.pcap"), ["frame.number"])
    assert frame.tshark_returncode == 2
    assert "cut short" in frame.tshark_stderr


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_unsupported_pcapng_section_is_reported():
    res = tshark_run(c("gopacket/pcapng-suite/le/test901.pcapng"), ["frame.number"])
    assert res.returncode != 0
    assert any("unknown SHB version 2.0" in w for w in res.warnings)


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_errors_raise_and_are_not_cached(tmp_path):
    path = c("tcpdump/dns_udp.pcap")
    with pytest.raises(TsharkError) as err:
        tshark_fields(path, ["frame.number", "no.such.field"])
    assert "aren't valid" in err.value.stderr
    with pytest.raises(TsharkError):
        tshark_fields(path, ["frame.number"], display_filter="bad filter ((")
    with pytest.raises(FileNotFoundError):
        tshark_fields(tmp_path / "missing.pcap", ["frame.number"])
    directory = cache_dir()
    assert directory is None or not list(directory.glob("*.json"))


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_empty_capture_gives_empty_frame():
    ref = tshark_fields(c("tcpdump/empty.pcap"), ["frame.number", "frame.time_epoch"])
    assert ref.height == 0 and ref.columns == ["frame.number", "frame.time_epoch"]


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_cache_hit_miss_and_invalidation(tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setenv("HERDSCOPE_TSHARK_CACHE", str(cache))
    src = c("zeek/tcp/option-sack.pcap")
    path = tmp_path / "copy.pcap"
    path.write_bytes(src.read_bytes())
    fields = ["frame.number", "tcp.analysis.retransmission"]
    first = tshark_run(path, fields)
    second = tshark_run(path, fields)
    assert not first.cached and second.cached
    assert first.frame.equals(second.frame) and first.stderr == second.stderr
    assert len(list(cache.glob("*.json"))) == 1
    # different arguments -> different entry
    assert not tshark_run(path, fields, two_pass=True).cached
    # touching the file invalidates
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not tshark_run(path, fields).cached
    # cache=False never reads nor writes
    before = sorted(p.name for p in cache.iterdir())
    assert not tshark_run(path, ["frame.len"], cache=False).cached
    assert sorted(p.name for p in cache.iterdir()) == before
    # disabled by environment
    monkeypatch.setenv("HERDSCOPE_TSHARK_CACHE", "off")
    assert not tshark_run(path, fields).cached


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark is not installed")
def test_analysis_flags_on_a_real_capture():
    fields = ["tcp.analysis.retransmission", "tcp.analysis.fast_retransmission",
              "tcp.analysis.spurious_retransmission", "tcp.analysis.duplicate_ack"]
    ref = tshark_fields(c("arkime/wireshark-retrans.pcap"), fields)
    counts = {f: int(as_flag(ref[f]).sum()) for f in fields}
    assert counts == {"tcp.analysis.retransmission": 47, "tcp.analysis.fast_retransmission": 14,
                      "tcp.analysis.spurious_retransmission": 5,
                      "tcp.analysis.duplicate_ack": 27}
    # duplicate_ack is added twice to the tree: "1,1" with occurrence='a', "1" with 'f'
    assert set(ref["tcp.analysis.duplicate_ack"].drop_nulls()) == {"1,1"}
    first = tshark_fields(c("arkime/wireshark-retrans.pcap"), ["tcp.analysis.duplicate_ack"],
                          occurrence="f")
    assert set(first["tcp.analysis.duplicate_ack"].drop_nulls()) == {"1"}


# ------------------------------------------------------------------ the copied corpus

PURPOSES = {"reader", "tcp", "dns", "kerberos", "ldap", "smb2", "normal", "malformed"}
SOURCES = {"zeek", "suricata-verify", "gopacket", "tcpdump", "arkime", "pcapplusplus", "dpkt"}


def test_corpus_sources_table_matches_files():
    rows = corpus_files()
    assert rows, "SOURCES.tsv is empty"
    listed = {r["file"] for r in rows}
    assert len(listed) == len(rows)
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
               if p.is_file() and p.parts[len(CORPUS.parts)] not in ("LICENSES", "zeek-baselines")
               and p.name not in ("SOURCES.tsv", "README.md")}
    assert listed == on_disk
    total = sum(c(r).stat().st_size for r in listed)
    assert total <= 13 * 1024 * 1024
    for r in rows:
        assert set(r["purposes"].split(",")) <= PURPOSES, r["file"]
        assert r["file"].split("/")[0] in SOURCES
        assert len(r["commit"]) == 40
        assert r["packets"].isdigit()
        if r["file"].endswith(".gz"):
            assert c(r["file"]).read_bytes()[:2] == b"\x1f\x8b"


def test_corpus_licences_and_baselines_exist():
    for source in SOURCES:
        assert (CORPUS / "LICENSES" / f"{source}.txt").stat().st_size > 200
    for r in corpus_files():
        marker = "Zeek baseline: zeek-baselines/"
        if marker in r["notes"]:
            rel = r["notes"].split(marker, 1)[1].split(" ", 1)[0].rstrip("/")
            folder = CORPUS / "zeek-baselines" / rel
            assert folder.is_dir(), rel
            assert list(folder.glob("*/SOURCE.txt")), rel


def test_corpus_purposes_are_all_covered():
    covered = set()
    for r in corpus_files():
        covered |= set(r["purposes"].split(","))
    assert covered == PURPOSES
    assert corpus_files("ldap") and all("ldap" in r["purposes"] for r in corpus_files("ldap"))
