"""The effective timestamp resolution: inferred from the timestamps, not taken from the header.

The motivating case (issue 10): a nanosecond-magic file whose timestamps tick in 10 ms steps
reported a "median 0.000 µs" handshake RTT and a tcp_stall finding "on a 1 ns RTT".
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyzer import open_capture
from analyzer.cli import ExitCode, main
from analyzer.resolution import (MIN_DIFFERENCES, capture_tick, effective_resolution, infer_tick, is_limited,
                                 limited_text)
from analyzer.schema import describe
from analyzer.summary import summarize
from builders import epb, ethernet, idb, ipv4, pcap_file, shb, udp
from detectors import run
from detectors.base import at_least_resolution, fmt_limited, fmt_ns, resolution_ns

SAMPLES = Path(__file__).parent.parent / "samples"
TICK = 10_000_000  # 10 ms


def rounded_copy(src: Path, dst: Path, tick_ns: int) -> Path:
    """``src`` (classic pcap, µs or ns, little-endian) rewritten as a nanosecond-magic pcap whose
    timestamps are truncated to multiples of ``tick_ns`` (a coarse clock behind a fine header)."""
    data = src.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    assert magic in (0xA1B2C3D4, 0xA1B23C4D)
    frac = 1 if magic == 0xA1B23C4D else 1000
    out = bytearray(struct.pack("<I", 0xA1B23C4D) + data[4:24])
    off = 24
    while off + 16 <= len(data):
        sec, sub, caplen, wirelen = struct.unpack("<IIII", data[off:off + 16])
        ns = (sec * 10**9 + sub * frac) // tick_ns * tick_ns
        out += struct.pack("<IIII", ns // 10**9, ns % 10**9, caplen, wirelen) + data[off + 16:off + 16 + caplen]
        off += 16 + caplen
    dst.write_bytes(bytes(out))
    return dst


@pytest.fixture(scope="module")
def coarse(tmp_path_factory):
    """samples/tcp-rto-blackout.pcap (ns; a 20.7 ms handshake RTT, an RTO finding) on a 10 ms clock."""
    return rounded_copy(SAMPLES / "tcp-rto-blackout.pcap", tmp_path_factory.mktemp("res") / "coarse.pcap", TICK)


@pytest.fixture(scope="module")
def nagle(tmp_path_factory):
    """samples/tcp-nagle-delayed-ack.pcap (ns; a sub-ms loopback handshake, a delayed-ACK finding) on
    a 10 ms clock: the handshake RTT measures 0."""
    return rounded_copy(SAMPLES / "tcp-nagle-delayed-ack.pcap", tmp_path_factory.mktemp("res") / "nagle.pcap", TICK)


# -- the inference ---------------------------------------------------------------------------------

def _jittered(n, step, rng, base=1_700_000_000 * 10**9):
    return base + np.cumsum(rng.integers(1, max(5_000_000, 4 * step), n)) // step * step


def test_genuine_nanosecond_and_microsecond_timestamps_keep_their_tick():
    rng = np.random.default_rng(1)
    assert infer_tick(np.diff(_jittered(5000, 1, rng))) == 1
    assert infer_tick(np.diff(_jittered(5000, 1000, rng))) == 1000
    # tiny samples of genuine data: with MIN_DIFFERENCES differences, chance alignment is negligible
    for seed in range(200):
        ts = _jittered(MIN_DIFFERENCES + 1, 1, np.random.default_rng(seed))
        assert infer_tick(np.diff(ts)) == 1


@pytest.mark.parametrize("tick", [10, 100_000, 4_000_000, TICK, 100_000_000, 1_000_000_000])
def test_coarse_clocks_are_found(tick):
    rng = np.random.default_rng(tick)
    ts = _jittered(2000, tick, rng)
    assert infer_tick(np.diff(ts)) == tick


def test_a_few_stray_timestamps_do_not_hide_the_tick():
    rng = np.random.default_rng(7)
    ts = _jittered(3000, TICK, rng)
    stray = rng.choice(len(ts), 5, replace=False)
    ts[stray] += rng.integers(1, TICK, 5)  # 5 packets from a ns clock: 10 differences off the tick
    assert infer_tick(np.diff(ts)) == TICK
    ts[rng.choice(len(ts), 100, replace=False)] += 3  # 3 % off the tick: not a 10 ms clock any more
    assert infer_tick(np.diff(ts)) < TICK


def test_too_few_timestamps_infer_nothing():
    ts = np.array([0, TICK, 3 * TICK, 7 * TICK])
    assert infer_tick(np.diff(ts)) is None
    # equal timestamps (Simple Packet Blocks repeat the previous time) are no evidence
    assert infer_tick(np.zeros(100, np.int64)) is None
    distinct = np.cumsum(np.random.default_rng(3).integers(1, 5, MIN_DIFFERENCES + 1)) * TICK
    assert infer_tick(np.diff(distinct)) == TICK and infer_tick(np.diff(distinct[:-1])) is None


def test_ticks_beyond_a_second_are_capped_and_hostile_values_do_not_crash():
    ts = np.arange(100, dtype=np.int64) * 60_000_000_000  # a packet a minute, exactly
    assert infer_tick(np.diff(ts)) == 1_000_000_000
    wild = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -5] * 10, np.int64)
    with np.errstate(over="ignore"):
        assert infer_tick(np.diff(wild)) >= 1


def test_interleaved_interfaces_are_inferred_separately():
    rng = np.random.default_rng(5)
    fine = _jittered(500, 1, rng)
    coarse_ts = _jittered(500, TICK, rng)
    ts = np.concatenate([fine, coarse_ts])
    iface = np.repeat(np.array([0, 1], np.uint16), 500)
    order = np.argsort(ts, kind="stable")  # time order, as a merged pcapng holds them
    packets = pl.DataFrame({"ts_ns": ts[order], "iface": iface[order],
                            "parse_status": pl.Series(["ok"] * 1000, dtype=pl.Enum(["ok", "not_packet"]))})
    out = effective_resolution(packets, np.array([0, 1, 2], np.uint16), np.array([1.0, 1.0, 1000.0]))
    assert out["effective_resolution_ns"].tolist() == [1.0, float(TICK), 1000.0]
    samples = out["effective_resolution_samples"].tolist()  # nonzero differences only
    assert samples[0] == 499 and MIN_DIFFERENCES <= samples[1] <= 499 and samples[2] == 0


def test_pcapng_interface_with_its_own_clock(read_capture, capsys):
    frame = ethernet(ipv4(udp(b"x"), proto=17))
    blocks = shb() + idb(tsresol=9, name="fast0") + idb(tsresol=6, name="slow1")
    rng = np.random.default_rng(11)
    t_fine = _jittered(40, 1, rng, base=10**18)
    t_coarse = _jittered(40, TICK, rng, base=10**18)
    for a, b in zip(t_fine, t_coarse):
        blocks += epb(0, int(a), frame) + epb(1, int(b) // 1000, frame)
    cap = read_capture(blocks, name="two.pcapng")
    ifaces = cap.frame("interfaces")
    assert ifaces["ts_resolution_ns"].to_list() == [1.0, 1000.0]
    assert ifaces["effective_resolution_ns"].to_list() == [1.0, float(TICK)]
    assert resolution_ns(cap) == TICK
    assert main(["info", cap.path]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    assert "#0 fast0 snaplen 0; #1 slow1 snaplen 0, timestamps tick in 10 ms" in out


def test_the_interfaces_frame_documents_both_resolutions():
    cols = describe("interfaces")
    assert "declares" in cols["ts_resolution_ns"] and "inferred" in cols["effective_resolution_ns"]
    assert "effective_resolution_samples" in cols


# -- the shared formatting ---------------------------------------------------------------------------

def test_limited_text_never_claims_precision_below_the_tick():
    assert fmt_limited(0, TICK) == "< 10 ms (the capture's timestamp tick)"
    assert fmt_limited(20_000_000, TICK) == "~20 ms (± the 10 ms timestamp tick)"
    assert fmt_limited(250_000_000, TICK) == "250 ms"
    assert fmt_limited(42_000, 1.0) == fmt_ns(42_000) and fmt_limited(None, TICK) == "n/a"
    assert not is_limited(5, 1.0) and is_limited(5, 1000.0) and not is_limited(10_000, 1000.0)
    assert limited_text(3, 1000.0, lambda n: f"{n}") == "< 1000.0 (the capture's timestamp tick)"


# -- on a real capture rewritten to a 10 ms clock ----------------------------------------------------

def test_sample_captures_keep_their_declared_resolution():
    for name, declared in (("dns-ttl-herd.pcap", 1000.0), ("smb2-break-queue.pcap", 1.0),
                           ("krb5-as-tgs-herd.pcapng", 1000.0)):
        with open_capture(SAMPLES / name) as cap:
            ifaces = cap.frame("interfaces")
            assert ifaces["effective_resolution_ns"].to_list() == [declared] == ifaces["ts_resolution_ns"].to_list()
            assert resolution_ns(cap) == declared


def test_coarse_ns_capture_gets_the_10ms_tick(coarse):
    with open_capture(coarse) as cap:
        ifaces = cap.frame("interfaces")
        assert ifaces["ts_resolution_ns"].to_list() == [1.0]
        assert ifaces["effective_resolution_ns"].to_list() == [float(TICK)]
        assert ifaces["effective_resolution_samples"][0] >= MIN_DIFFERENCES
        assert resolution_ns(cap) == TICK == capture_tick(ifaces)
        assert at_least_resolution(48_000, cap) == (TICK, True)
        s = summarize(cap)
    assert s["ts_resolution_ns"] == 1.0 and s["effective_resolution_ns"] == TICK
    assert s["interfaces"][0]["effective_resolution_ns"] == TICK
    assert s["tcp"]["handshake_rtt_ns"]["median"] == 2 * TICK  # 20.7 ms, truncated to the clock


def test_info_shows_both_resolutions_and_no_sub_tick_rtt(coarse, nagle, capsys):
    assert main(["info", str(nagle)]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long cells
    assert "nanoseconds declared, but the timestamps move in 10 ms ticks" in out
    assert "Handshake RTT: median < 10 ms (the capture's timestamp tick)" in out  # measured 0
    assert "0.000 µs" not in out
    assert main(["info", str(coarse)]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    assert "Handshake RTT: median ~20 ms (± the 10 ms timestamp tick)" in out and "20.000 ms" not in out
    assert main(["info", "--format", "json", str(nagle)]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["effective_resolution_ns"] == TICK and doc["ts_resolution_ns"] == 1.0
    assert doc["tcp"]["handshake_rtt_ns"]["median"] == 0  # the JSON keeps the measurement
    assert main(["info", str(SAMPLES / "tcp-nagle-delayed-ack.pcap")]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    assert "nanoseconds declared, nanoseconds effective" in out and "(the capture's timestamp tick)" not in out


def test_info_says_when_too_few_timestamps_to_tell(tmp_path, capsys):
    frame = ethernet(ipv4(udp(b"x"), proto=17))
    path = tmp_path / "three.pcap"
    path.write_bytes(pcap_file([(100, 0, frame), (100, 10_000_000, frame), (100, 30_000_000, frame)], nanosecond=True))
    assert main(["info", "--format", "json", str(path)]) == ExitCode.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["effective_resolution_ns"] == 1.0 and doc["effective_resolution_samples"] == 2
    assert main(["info", str(path)]) == ExitCode.OK
    out = " ".join(capsys.readouterr().out.split())
    assert f"effective tick cannot be told from 2 timestamp differences (at least {MIN_DIFFERENCES} needed)" in out


_DURATION = re.compile(r"(?<![\w.])([~<] ?)?(\d[\d,]*(?:\.\d+)?) (ns|µs|ms|s)\b")
_UNIT = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}


def _sub_tick_claims(text: str, tick: float) -> list[str]:
    """Durations written plainly (not "< x" or "~x") that are shorter than the tick."""
    return [m.group(0) for m in _DURATION.finditer(text)
            if not m.group(1) and float(m.group(2).replace(",", "")) * _UNIT[m.group(3)] < tick]


_RTT = re.compile(r"([~<] ?)?(\d[\d,]*(?:\.\d+)?) (ns|µs|ms|s)( \([^)]*tick\))? RTT\b")


def test_no_finding_claims_a_sub_tick_rtt(coarse, nagle, tmp_path):
    assert _sub_tick_claims("on a 1 ns RTT, p99 0 ns, waited 3 s", TICK) == ["1 ns", "0 ns"]
    herd = rounded_copy(SAMPLES / "dns-ttl-herd.pcap", tmp_path / "herd.pcap", TICK)
    seen_rtt = 0
    for path in (coarse, nagle, herd):
        with open_capture(path) as cap:
            found = run(cap)
        assert found.height, path  # the pathologies are still found on a coarse clock
        for text in found["explanation"].to_list():
            assert not _sub_tick_claims(text, TICK), text
            for m in _RTT.finditer(text):  # an RTT within ten ticks says it is limited by the tick
                seen_rtt += 1
                assert m.group(1) and m.group(4), text
    assert seen_rtt >= 1


def test_joined_files_keep_each_file_s_tick(coarse):
    from analyzer import open_captures

    with open_captures([coarse, SAMPLES / "smb2-break-queue.pcap"]) as cap:
        ifaces = cap.frame("interfaces").sort("iface")
        assert sorted(ifaces["effective_resolution_ns"].to_list()) == [1.0, float(TICK)]
        assert resolution_ns(cap) == TICK  # the coarsest interface limits what the joined capture shows


def test_long_captures_are_sampled_and_repeated_timestamps_do_not_starve_the_sample():
    rng = np.random.default_rng(9)
    status = pl.Enum(["ok", "not_packet"])
    for ts, tick in ((_jittered(300_000, TICK, rng), TICK), (_jittered(300_000, 1, rng), 1)):
        packets = pl.DataFrame({"ts_ns": ts, "iface": np.zeros(len(ts), np.uint16),
                                "parse_status": pl.Series(["ok"] * len(ts), dtype=status)})
        out = effective_resolution(packets, np.array([0], np.uint16), np.array([1.0]))
        assert out["effective_resolution_ns"][0] == float(tick)
        assert out["effective_resolution_samples"][0] == np.count_nonzero(np.diff(ts))  # all counted
    # 200,000 packets sharing 40 distinct 10 ms instants (Simple Packet Blocks repeat the time)
    ts = np.repeat(np.cumsum(rng.integers(1, 5, 40)) * TICK, 5000)
    packets = pl.DataFrame({"ts_ns": ts, "iface": np.zeros(len(ts), np.uint16),
                            "parse_status": pl.Series(["ok"] * len(ts), dtype=status)})
    out = effective_resolution(packets, np.array([0], np.uint16), np.array([1.0]))
    assert out["effective_resolution_samples"][0] == 39 and out["effective_resolution_ns"][0] == TICK
    # custom blocks (no packet time of their own) are left out
    with_custom = packets.with_columns(pl.Series(["ok", "not_packet"] * (len(ts) // 2), dtype=status)
                                       .alias("parse_status"))
    assert effective_resolution(with_custom, np.array([0], np.uint16),
                                np.array([1.0]))["effective_resolution_ns"][0] == TICK
