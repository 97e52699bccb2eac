"""TCP connections and segment analysis on scripted conversations (byte-exact pcaps)."""
import polars as pl
import pytest

from analyzer.tcp import analysis as an
from builders import (ack_step as ack, data_step as data, handshake, opt_mss, opt_sack, opt_sack_perm, opt_wscale,
                      tcp_conversation)
from tcp_scenarios import sack_bif_steps, stale_ack_rst_steps

US = 1_000  # ns


def analyzed(read_capture, steps, **kw):
    cap = read_capture(tcp_conversation(steps, **kw))
    return cap, cap.frame("tcp_segments"), cap.frame("connections")


def flags_of(seg, frame):
    bits = seg.filter(pl.col("frame") == frame)["analysis"][0]
    return {name for bit, name in an.FLAG_NAMES.items() if bits & bit}


def test_full_connection_sf_history_and_handshake_rtt(read_capture):
    steps = handshake(0, rtt=40 * US) + [
        data(100 * US, True), ack(120 * US, False), data(200 * US, False, b"y" * 300), ack(220 * US, True),
        {"t": 300 * US, "from_client": True, "flags": 0x11}, {"t": 320 * US, "from_client": False, "flags": 0x11},
        ack(340 * US, True),
    ]
    cap, seg, conns = analyzed(read_capture, steps)
    c = conns.row(0, named=True)
    assert (c["conn_state"], c["client"], c["server"], c["server_port"], c["client_by"]) == \
        ("SF", "10.0.0.1", "10.0.0.2", 445, "syn")
    assert c["history"] == "ShADadFf"
    assert (c["rtt_client_server_ns"], c["rtt_server_client_ns"], c["handshake_rtt_ns"]) == (20 * US, 20 * US, 40 * US)
    assert (c["client_packets"], c["server_packets"], c["client_bytes"], c["server_bytes"]) == (6, 4, 100, 300)
    assert c["saw_start"] and c["saw_end"]
    assert seg["from_client"].to_list() == [True, False, True, True, False, False, True, True, False, True]
    assert seg.filter(pl.col("frame") == 4)["seq_rel"][0] == 1
    assert all(flags_of(seg, f) == set() for f in range(1, 11))


@pytest.mark.parametrize("steps,state", [
    ([{"t": 0, "from_client": True, "flags": 0x02}], "S0"),
    ([{"t": 0, "from_client": True, "flags": 0x02}, {"t": 10, "from_client": False, "flags": 0x14}], "REJ"),
    (handshake() + [data(50_000, True)], "S1"),
    (handshake() + [{"t": 50_000, "from_client": True, "flags": 0x14}], "RSTO"),
    (handshake() + [{"t": 50_000, "from_client": False, "flags": 0x14}], "RSTR"),
    ([data(0, True), data(10, False)], "OTH"),
])
def test_zeek_conn_states(read_capture, steps, state):
    _, _, conns = analyzed(read_capture, steps)
    assert conns["conn_state"].to_list() == [state]


def test_client_by_port_when_no_syn(read_capture):
    steps = [data(0, False), data(10, True)]  # the server (port 445) speaks first
    _, seg, conns = analyzed(read_capture, steps)
    c = conns.row(0, named=True)
    assert (c["client"], c["server_port"], c["client_by"]) == ("10.0.0.1", 445, "port")
    assert seg["from_client"].to_list() == [False, True]


def test_reused_ports_start_a_new_connection(read_capture):
    first = handshake(0) + [{"t": 100 * US, "from_client": True, "flags": 0x14}]
    cap1 = tcp_conversation(first)
    cap2 = tcp_conversation(handshake(10**9), client_isn=777)
    from builders import pcap_file  # noqa: F401 - records are concatenated below
    body = cap1 + cap2[24:]  # same 4-tuple, new ISN
    cap = read_capture(body)
    seg = cap.frame("tcp_segments")
    assert seg["conn"].to_list() == [0, 0, 0, 0, 1, 1, 1]
    assert flags_of(seg, 5) == {"reused_ports"}
    assert cap.frame("connections")["conn_state"].to_list() == ["RSTO", "S1"]


def test_retransmission_after_timeout_and_rto(read_capture):
    steps = handshake() + [data(100 * US, True, seq=1), data(200_100 * US, True, seq=1)]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 5) == {"retransmission"}
    row = seg.filter(pl.col("frame") == 5).row(0, named=True)
    assert (row["rto_ns"], row["rto_frame"]) == (200 * 1000 * US, 4)


def test_fast_retransmission_after_duplicate_acks(read_capture):
    steps = handshake(rtt=10 * US) + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101), data(102 * US, True, seq=201),
        ack(110 * US, False, ack=101), ack(111 * US, False, ack=101), ack(112 * US, False, ack=101),
        ack(113 * US, False, ack=101), data(120 * US, True, seq=101),
    ]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 7) == set()
    assert flags_of(seg, 8) == {"duplicate_ack"} and flags_of(seg, 10) == {"duplicate_ack"}
    assert seg.filter(pl.col("frame").is_in([8, 9, 10]))["dupack_num"].to_list() == [1, 2, 3]
    assert seg.filter(pl.col("frame") == 8)["dupack_frame"][0] == 7
    assert flags_of(seg, 11) == {"fast_retransmission"}


def test_spurious_retransmission(read_capture):
    steps = handshake() + [data(100 * US, True, seq=1), ack(120 * US, False, ack=101),
                           data(500 * US, True, seq=1)]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 6) == {"spurious_retransmission"}


def test_out_of_order_uses_the_handshake_rtt_as_threshold(read_capture):
    steps = handshake(rtt=1000 * US) + [
        data(2000 * US, True, seq=101), data(2100 * US, True, seq=1),  # 0.1 ms later: out of order
    ]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 4) == {"lost_segment"}
    assert flags_of(seg, 5) == {"out_of_order"}


def test_ooo_threshold_parameter_for_fast_paths(read_capture):
    from analyzer.tcp import analyze_segments
    steps = [data(0, True, seq=101), data(50 * US, True, seq=1)]  # no handshake: 3 ms default
    cap = read_capture(tcp_conversation(steps))
    seg, _ = analyze_segments(cap)
    assert flags_of(seg, 2) == {"out_of_order"}
    seg, _ = analyze_segments(cap, an.Params(ooo_threshold_ns=20 * US))
    assert flags_of(seg, 2) == {"retransmission"}


def test_acked_unseen_segment(read_capture):
    steps = handshake() + [data(100 * US, True, seq=1), ack(120 * US, False, ack=301)]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 5) == {"ack_lost_segment"}


def test_zero_window_probe_and_ack_and_window_update(read_capture):
    steps = handshake() + [
        data(100 * US, True, seq=1), ack(120 * US, False, ack=101, window=0),
        data(300 * US, True, payload=b"z", seq=101), ack(310 * US, False, ack=101, window=0),
        ack(900 * US, False, ack=101, window=8192),
    ]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 5) == {"zero_window"}
    assert flags_of(seg, 6) == {"zero_window_probe"}
    assert flags_of(seg, 7) == {"zero_window_probe_ack", "zero_window"}
    assert flags_of(seg, 8) == {"window_update"}


def test_window_full_with_scaling(read_capture):
    steps = handshake(client_opts=opt_wscale(2), server_opts=opt_wscale(2)) + [
        ack(50 * US, False, ack=1, window=100),  # 100 << 2 = 400 bytes
        data(100 * US, True, payload=b"a" * 400, seq=1),
    ]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 5) == {"window_full"}
    assert seg.filter(pl.col("frame") == 4)["window_size"][0] == 400


def test_window_size_unknown_without_syn(read_capture):
    _, seg, _ = analyzed(read_capture, [data(0, True, window=100)])
    assert seg["window_size"].to_list() == [None]


def test_keep_alive_and_ack(read_capture):
    steps = handshake() + [data(100 * US, True, seq=1), ack(120 * US, False, ack=101),
                           data(10**10, True, payload=b"\0", seq=100), ack(10**10 + 20 * US, False, ack=101)]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 6) == {"keep_alive"}
    assert flags_of(seg, 7) == {"keep_alive_ack"}


def test_ack_rtt_bytes_in_flight_and_karn(read_capture):
    steps = handshake() + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101), ack(150 * US, False, ack=201),
        data(200 * US, True, seq=201), data(400_000 * US, True, seq=201), ack(400_050 * US, False, ack=301),
    ]
    _, seg, _ = analyzed(read_capture, steps)
    rows = {r["frame"]: r for r in seg.iter_rows(named=True)}
    assert (rows[4]["bytes_in_flight"], rows[5]["bytes_in_flight"]) == (100, 200)
    assert (rows[6]["acks_frame"], rows[6]["ack_rtt_ns"], rows[6]["rtt_ns"]) == (5, 49 * US, 49 * US)
    assert flags_of(seg, 8) == {"retransmission"}
    # Wireshark times the ACK from the first copy; Karn's rule gives no sample
    assert rows[9]["acks_frame"] == 7 and rows[9]["ack_rtt_ns"] == 399_850 * US and rows[9]["rtt_ns"] is None


def test_sacked_retransmission_and_pipe(read_capture):
    steps = handshake(client_opts=opt_sack_perm(), server_opts=opt_sack_perm()) + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101), data(102 * US, True, seq=201),
        ack(150 * US, False, ack=1, options=b"\x01\x01" + opt_sack((5101, 5201))),  # 2nd segment SACKed
        data(300 * US, True, seq=301),
        data(400_000 * US, True, seq=101),  # retransmits SACKed data: spurious by SACK
    ]
    cap, seg, _ = analyzed(read_capture, steps, client_isn=5000)
    assert flags_of(seg, 9) == {"retransmission", "sacked_retransmission"}
    r = seg.filter(pl.col("frame") == 8).row(0, named=True)
    # 400 bytes unacknowledged, 100 of them SACKed by the receiver's latest segment
    assert (r["bytes_in_flight"], r["pipe_bytes"]) == (300, 300)


def test_bytes_in_flight_subtract_the_receivers_latest_sack_option(read_capture):
    """Wireshark 4.0 subtracts from the unacknowledged span the SACK blocks of the receiver's latest
    segment only (a segment without SACK clears them), and at most its first three blocks; pipe_bytes
    subtracts every SACKed byte still above the cumulative ACK."""
    _, seg, _ = analyzed(read_capture, sack_bif_steps(), client_isn=5000)
    rows = {r["frame"]: r for r in seg.iter_rows(named=True)}
    assert [rows[f]["bytes_in_flight"] for f in (8, 10, 12, 13, 15)] == [300, 300, 600, 700, 500]
    assert [rows[f]["pipe_bytes"] for f in (8, 10, 12, 15)] == [300, 300, 400, 450]
    assert all(flags_of(seg, f) & {"retransmission", "lost_segment"} == set() for f in range(1, 16))


def test_resent_syn_after_a_stale_ack_and_rst_restarts_the_sequence_analysis(read_capture):
    """The RST's sequence number (the stale ACK's) must not count as sent data: the resent SYN restores
    the highest contiguous sequence number (Wireshark issue 17616), so the data after the handshake is
    no retransmission; the SYN/ACK rebases the server's sequence numbers, guessed from the stale ACK,
    and is flagged reused_ports (issue 16944). One connection throughout, as tcp.stream."""
    _, seg, conns = analyzed(read_capture, stale_ack_rst_steps())
    assert conns.height == 1 and seg["conn"].unique().to_list() == [0]
    assert flags_of(seg, 4) == {"retransmission"}
    assert flags_of(seg, 5) == {"reused_ports", "lost_segment"}
    assert seg.filter(pl.col("frame") == 5)["seq_rel"][0] == 0
    assert seg.filter(pl.col("frame") == 6)["ack_rel"][0] == 1
    for f in (7, 9, 11):
        assert not flags_of(seg, f) & {"retransmission", "fast_retransmission", "out_of_order"}, f
    assert seg.filter(pl.col("frame") == 7)["bytes_in_flight"][0] == 100


def test_mss_and_options_per_side(read_capture):
    steps = handshake(client_opts=opt_mss(1460) + opt_sack_perm() + opt_wscale(7), server_opts=opt_mss(8960))
    _, _, conns = analyzed(read_capture, steps)
    c = conns.row(0, named=True)
    assert (c["client_mss"], c["server_mss"], c["client_wscale"], c["server_wscale"]) == (1460, 8960, 7, None)
    assert (c["client_sack_perm"], c["server_sack_perm"]) == (True, False)


def test_dsack_marks_the_ack_and_the_spurious_retransmission(read_capture):
    """RFC 2883: an ACK whose first SACK block lies below its cumulative ACK (4.1.1), or inside its
    second block (4.1.2), reports a duplicate: the retransmission it covers was spurious."""
    steps = handshake(client_opts=opt_sack_perm(), server_opts=opt_sack_perm()) + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101),
        data(30_000 * US, True, seq=1),  # 6: resent although it had arrived
        ack(30_100 * US, False, ack=201, options=b"\x01\x01" + opt_sack((5001, 5101))),  # 7: D-SACK below ACK
        data(30_200 * US, True, seq=201), data(30_201 * US, True, seq=301), data(30_202 * US, True, seq=401),
        data(60_000 * US, True, seq=301),  # 11: resent
        # 12: D-SACK of 301-401 inside the second block 301-501 (201-301 still missing)
        ack(60_100 * US, False, ack=201, options=b"\x01\x01" + opt_sack((5301, 5401), (5301, 5501))),
        ack(60_200 * US, False, ack=501),
    ]
    _, seg, _ = analyzed(read_capture, steps, client_isn=5000)
    assert "dsacked_retransmission" in flags_of(seg, 6) and "dsack" in flags_of(seg, 7)
    assert "dsacked_retransmission" not in flags_of(seg, 4)  # the original is not the duplicate
    assert "dsack" in flags_of(seg, 12) and "dsacked_retransmission" in flags_of(seg, 11)
    assert "dsacked_retransmission" not in flags_of(seg, 9) and "dsack" not in flags_of(seg, 13)
    # an ordinary SACK block above the ACK is no D-SACK
    plain = handshake(client_opts=opt_sack_perm(), server_opts=opt_sack_perm()) + [
        data(100 * US, True, seq=1), data(101 * US, True, seq=101),
        ack(150 * US, False, ack=1, options=b"\x01\x01" + opt_sack((5101, 5201))),
    ]
    _, seg, _ = analyzed(read_capture, plain, client_isn=5000)
    assert all("dsack" not in flags_of(seg, f) for f in range(1, 7))


def test_time_going_backwards_is_never_within_a_window(read_capture):
    """Wireshark takes the time since the last duplicate ACK (and since the highest segment) as an
    unsigned number: a duplicate ACK stamped after the resent segment (but written before it) does not
    make a fast retransmission; the resend 0.5 ms after the highest segment is out-of-order
    (tests/test_tcp_conformance.py checks the same capture against tshark)."""
    ms = 1_000 * US
    steps = handshake(0, rtt=30 * ms) + [
        data(31 * ms, False), ack(32 * ms, False, ack=1), ack(40 * ms + 600 * US, False, ack=1),
        data(40 * ms, True, b"x" * 2, ack=101), data(40 * ms + 500 * US, True, b"x" * 126, seq=1, ack=101),
    ]
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 6) == {"duplicate_ack"}
    assert flags_of(seg, 8) == {"out_of_order"}
    # in time order the same resend is a fast retransmission (two duplicate ACKs, within 20 ms)
    steps[5]["t"] = 39 * ms
    _, seg, _ = analyzed(read_capture, steps)
    assert flags_of(seg, 8) == {"fast_retransmission"}


@pytest.mark.parametrize("name", ["tcp-incast.pcap", "smb2-break-queue.pcap"])
def test_the_analysis_builds_only_the_planned_columns_with_the_whole_builds_values(name):
    """Capture.plan_columns (a scan says what its readers declare): tcp_segments holds those and what is
    built from it (payload segments, client SYNs), each the same as the whole build's; the kernel's other
    outputs are single slots; connections is whole."""
    from pathlib import Path

    from analyzer import open_capture

    path = Path(__file__).parent.parent / "samples" / name
    with open_capture(path) as whole:
        segments, connections = whole.frame("tcp_segments"), whole.frame("connections")
    with open_capture(path) as planned:
        planned.plan_columns({"tcp_segments": ("rtt_ns", "window", "frame")})
        seg = planned.frame("tcp_segments")
        assert seg.columns == ["frame", "ts_ns", "tcp_flags", "window", "conn", "from_client", "seglen", "rtt_ns"]
        assert seg.equals(segments.select(seg.columns)) and seg.height > 100 and seg["rtt_ns"].null_count() < seg.height
        assert planned.frame("connections").equals(connections)
    out = an.allocate_analysis(1000, ["rtt_ns"])
    assert [f for f in out._fields if len(getattr(out, f)) == 1000] == ["flags", "rtt_ns"]
    assert all(len(getattr(out, f)) == 1 for f in out._fields if f not in ("flags", "rtt_ns"))
