"""The rocev2 decoder on hand-built packets: byte literals written from IBA vol. 1 §9.2-9.3 (BTH, RETH,
AETH, ImmDt, DETH, RDETH, XRCETH) and Annex A17 (UDP 4791, ICRC, CNP), one per opcode class, then
truncated and lying packets, random and mutated bytes (the kernel must never read past a message),
qp_pair/direction, the flows frame and the public helpers."""
from __future__ import annotations


import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st

from analyzer.decoders import rocev2, rocev2_kernels as k, rocev2_layout as L
from builders import ethernet, ipv4, ipv6, pcap_file, udp

ICRC = bytes.fromhex("a1b2c3d4")  # the ICRC is not checked: any 4 bytes
A, B = "10.0.0.1", "10.1.0.1"


def bth(opcode, flags=0x40, pkey=0xFFFF, byte4=0x00, dqp=0x000102, ackreq=False, psn=10):
    """IBA §9.2: OpCode, SE|M|PadCnt|TVer, P_Key, FECN|BECN|resv6, DestQP(24), A|resv7, PSN(24) — by hand."""
    return (bytes([opcode, flags]) + pkey.to_bytes(2, "big") + bytes([byte4]) + dqp.to_bytes(3, "big")
            + bytes([0x80 if ackreq else 0]) + psn.to_bytes(3, "big"))


def reth(va, rkey, dmalen):
    return va.to_bytes(8, "big") + rkey.to_bytes(4, "big") + dmalen.to_bytes(4, "big")


def aeth(syndrome, msn):
    return bytes([syndrome]) + msn.to_bytes(3, "big")


def frame(transport: bytes, *, src=A, dst=B, sport=0xC123, dport=4791, tos=0x00, udp_len=None):
    ip = ipv4(udp(transport, sport=sport, dport=dport, length=udp_len), proto=17, src=src, dst=dst)
    ip = ip[:1] + bytes([tos]) + ip[2:]
    return ethernet(ip)


def decode(read_capture, frames, caplens=None):
    """The rocev2_packets frame of a pcap of ``frames`` (``caplens``: cut records to that many bytes)."""
    recs = []
    for i, f in enumerate(frames):
        cut = f if caplens is None or caplens[i] is None else f[:caplens[i]]
        recs.append((1_700_000_000, i * 1000, cut, len(f)))
    return read_capture(pcap_file(recs, nanosecond=True)).frame("rocev2_packets")


def one(read_capture, transport, **kw) -> dict:
    out = decode(read_capture, [frame(transport, **kw)])
    assert out.height == 1
    return out.row(0, named=True)


NULLS = ("reth_va", "reth_rkey", "reth_dma_len", "immdt", "aeth_syndrome", "aeth_kind", "aeth_credit",
         "aeth_rnr_timer", "aeth_nak_code", "aeth_msn", "deth_qkey", "deth_src_qp")


def assert_only(row, *present):
    for name in NULLS:
        if name not in present:
            assert row[name] is None, name


# -- RC sends -------------------------------------------------------------------------------------------

def test_rc_send_first_every_bth_field(read_capture):
    r = one(read_capture, bth(0x00, flags=0x40, pkey=0x8001, dqp=0xABCDEF, psn=0xFEDCBA) + b"x" * 8 + ICRC)
    assert (r["opcode"], r["opcode_name"], r["transport"]) == (0, "Reliable Connection (RC) - SEND First", "RC")
    assert (r["se"], r["migreq"], r["pad_count"], r["tver"], r["pkey"]) == (False, True, 0, 0, 0x8001)
    assert (r["fecn"], r["becn"], r["dest_qp"], r["ackreq"], r["psn"]) == (False, False, 0xABCDEF, False, 0xFEDCBA)
    assert (r["payload_len"], r["icrc_present"], r["status"]) == (8, True, "ok")
    assert (r["sport"], r["dport"], r["src"], r["dst"]) == (0xC123, 4791, A, B)
    assert_only(r)


def test_rc_send_middle_and_last_with_pad_ackreq_and_flags(read_capture):
    mid = one(read_capture, bth(0x01, flags=0x0F) + b"m" * 16 + ICRC)  # TVer 15, M clear
    assert (mid["opcode_name"], mid["tver"], mid["migreq"], mid["payload_len"]) == (
        "Reliable Connection (RC) - SEND Middle", 15, False, 16)
    last = one(read_capture, bth(0x02, flags=0x60, byte4=0xC0, ackreq=True) + b"abcdef\0\0" + ICRC)  # PadCnt 2
    assert (last["pad_count"], last["payload_len"], last["ackreq"], last["fecn"], last["becn"]) == (2, 6, True, True, True)


def test_rc_send_only_and_with_immediate(read_capture):
    only = one(read_capture, bth(0x04) + b"p" * 4 + ICRC)
    assert only["opcode_name"] == "Reliable Connection (RC) - SEND Only" and only["payload_len"] == 4
    imm = one(read_capture, bth(0x05, flags=0xC0) + bytes.fromhex("deadbeef") + b"p" * 4 + ICRC)
    assert (imm["se"], imm["immdt"], imm["payload_len"]) == (True, 0xDEADBEEF, 4)
    assert_only(imm, "immdt")
    last_imm = one(read_capture, bth(0x03) + bytes.fromhex("00000007") + ICRC)
    assert (last_imm["immdt"], last_imm["payload_len"]) == (7, 0)


# -- RDMA WRITE / READ ----------------------------------------------------------------------------------

def test_rdma_write_first_and_only_with_reth(read_capture):
    r = one(read_capture, bth(0x06) + reth(0x00007F0000001000, 0x1234, 8192) + b"w" * 16 + ICRC)
    assert (r["reth_va"], r["reth_rkey"], r["reth_dma_len"], r["payload_len"]) == (0x00007F0000001000, 0x1234, 8192, 16)
    assert_only(r, "reth_va", "reth_rkey", "reth_dma_len")
    big = one(read_capture, bth(0x0A) + reth(0xFFFFFFFFFFFFFFF0, 0xFFFFFFFF, 0xFFFFFFFF) + b"w" * 4 + ICRC)
    assert (big["reth_va"], big["reth_rkey"], big["reth_dma_len"]) == (0xFFFFFFFFFFFFFFF0, 0xFFFFFFFF, 0xFFFFFFFF)
    imm = one(read_capture, bth(0x0B) + reth(0x10, 0x20, 4) + bytes.fromhex("01020304") + b"w" * 4 + ICRC)
    assert (imm["reth_va"], imm["immdt"], imm["payload_len"]) == (0x10, 0x01020304, 4)
    mid = one(read_capture, bth(0x07) + b"w" * 8 + ICRC)
    assert mid["reth_va"] is None and mid["payload_len"] == 8
    last_imm = one(read_capture, bth(0x09) + bytes.fromhex("0000abcd") + b"w" * 8 + ICRC)
    assert last_imm["immdt"] == 0xABCD and last_imm["reth_va"] is None


def test_rdma_read_request_and_responses(read_capture):
    req = one(read_capture, bth(0x0C, ackreq=True) + reth(0x7000, 0x99, 65536) + ICRC)
    assert (req["opcode_name"], req["reth_dma_len"], req["payload_len"]) == (
        "Reliable Connection (RC) - RDMA READ Request", 65536, 0)
    first = one(read_capture, bth(0x0D) + aeth(0x1F, 5) + b"r" * 12 + ICRC)
    assert (first["aeth_syndrome"], first["aeth_kind"], first["aeth_credit"], first["aeth_msn"], first["payload_len"]) == (
        0x1F, "ack", 31, 5, 12)
    mid = one(read_capture, bth(0x0E) + b"r" * 12 + ICRC)
    assert mid["aeth_syndrome"] is None and mid["payload_len"] == 12
    for op in (0x0F, 0x10):
        r = one(read_capture, bth(op) + aeth(0x00, 0xFFFFFF) + b"r" * 4 + ICRC)
        assert (r["aeth_msn"], r["payload_len"]) == (0xFFFFFF, 4)


# -- ACK / NAK / RNR NAK ---------------------------------------------------------------------------------

def test_ack_with_credit_count(read_capture):
    r = one(read_capture, bth(0x11, flags=0x40) + aeth(0x05, 0x000102) + ICRC)
    assert (r["opcode_name"], r["aeth_kind"], r["aeth_credit"], r["aeth_msn"], r["payload_len"]) == (
        "Reliable Connection (RC) - Acknowledge", "ack", 5, 0x102, 0)
    assert r["aeth_rnr_timer"] is None and r["aeth_nak_code"] is None
    assert rocev2.credit_wqes(r["aeth_credit"]) == 6  # Table 43: code 5 = 6 WQEs


def test_rnr_nak_timer(read_capture):
    r = one(read_capture, bth(0x11) + aeth(0x2C, 3) + ICRC)
    assert (r["aeth_kind"], r["aeth_rnr_timer"], r["aeth_credit"], r["aeth_nak_code"]) == ("rnr_nak", 12, None, None)
    assert rocev2.rnr_delay_ns(r["aeth_rnr_timer"]) == 640_000  # Table 45: 0.64 ms


@pytest.mark.parametrize("syndrome,code", [(0x60, 0), (0x61, 1), (0x62, 2), (0x63, 3)])
def test_nak_codes(read_capture, syndrome, code):
    r = one(read_capture, bth(0x11) + aeth(syndrome, 9) + ICRC)
    assert (r["aeth_kind"], r["aeth_nak_code"], r["aeth_credit"], r["aeth_rnr_timer"]) == ("nak", code, None, None)


def test_reserved_syndrome_type(read_capture):
    r = one(read_capture, bth(0x11) + aeth(0x45, 9) + ICRC)
    assert (r["aeth_kind"], r["aeth_credit"], r["aeth_rnr_timer"], r["aeth_nak_code"]) == ("reserved", None, None, None)


# -- CNP, UD, RD, XRC, unknown ----------------------------------------------------------------------------

def test_cnp(read_capture):
    r = one(read_capture, bth(0x81, flags=0x00, byte4=0x40, dqp=0x51, psn=0) + b"\0" * 16 + ICRC)
    assert (r["opcode_name"], r["transport"], r["becn"], r["fecn"], r["dest_qp"]) == ("CNP", "CNP", True, False, 0x51)
    assert (r["payload_len"], r["icrc_present"], r["status"]) == (0, True, "ok")
    assert_only(r)
    short = one(read_capture, bth(0x81, byte4=0x40) + b"\0" * 10 + ICRC)  # 16 reserved bytes do not fit
    assert short["status"] == "bad_length"


def test_ud_send_only_decodes_deth(read_capture):
    deth = bytes.fromhex("80010000") + b"\0" + (0x000001).to_bytes(3, "big")  # Q_Key, reserved, source QP 1
    r = one(read_capture, bth(0x64, dqp=0x1) + deth + b"u" * 8 + ICRC)
    assert (r["transport"], r["opcode_name"], r["deth_qkey"], r["deth_src_qp"], r["payload_len"]) == (
        "UD", "Unreliable Datagram (UD) - SEND only", 0x80010000, 1, 8)
    imm = one(read_capture, bth(0x65) + deth + bytes.fromhex("cafef00d") + b"u" * 4 + ICRC)
    assert (imm["deth_src_qp"], imm["immdt"], imm["payload_len"]) == (1, 0xCAFEF00D, 4)


def test_rd_and_xrc_headers_are_skipped_by_size(read_capture):
    rdeth, deth = bytes.fromhex("00000007"), bytes.fromhex("11223344") + b"\0" + bytes.fromhex("000042")
    rd = one(read_capture, bth(0x44) + rdeth + deth + b"d" * 8 + ICRC)  # RD SEND Only
    assert (rd["transport"], rd["deth_qkey"], rd["deth_src_qp"], rd["payload_len"]) == ("RD", 0x11223344, 0x42, 8)
    rd_ack = one(read_capture, bth(0x51) + rdeth + aeth(0x60, 1) + ICRC)  # RD Acknowledge: RDETH, AETH
    assert (rd_ack["aeth_kind"], rd_ack["deth_qkey"], rd_ack["payload_len"]) == ("nak", None, 0)
    xrc = one(read_capture, bth(0xA6) + bytes.fromhex("00000099") + reth(1, 2, 3) + b"x" * 4 + ICRC)
    assert (xrc["transport"], xrc["reth_va"], xrc["reth_dma_len"], xrc["payload_len"]) == ("other", 1, 3, 4)
    uc = one(read_capture, bth(0x2A) + reth(5, 6, 7) + ICRC)  # UC RDMA WRITE Only
    assert (uc["transport"], uc["reth_rkey"], uc["payload_len"]) == ("UC", 6, 0)


def test_atomic_and_invalidate_headers(read_capture):
    cmp_swap = one(read_capture, bth(0x13) + b"\1" * 28 + ICRC)
    assert (cmp_swap["payload_len"], cmp_swap["reth_va"]) == (0, None)
    atomic_ack = one(read_capture, bth(0x12) + aeth(0x1F, 2) + b"\2" * 8 + ICRC)
    assert (atomic_ack["aeth_msn"], atomic_ack["payload_len"]) == (2, 0)
    inv = one(read_capture, bth(0x17) + bytes.fromhex("00001234") + b"i" * 8 + ICRC)
    assert inv["payload_len"] == 8 and inv["immdt"] is None


def test_unknown_opcode_is_bth_only(read_capture):
    r = one(read_capture, bth(0xC0) + b"v" * 20 + ICRC)
    assert (r["opcode_name"], r["transport"], r["payload_len"], r["status"]) == ("Unknown (192)", "other", 20, "ok")
    assert_only(r)


# -- truncated and lying packets ---------------------------------------------------------------------------

ETH_IP_UDP = 14 + 20 + 8


def test_truncated_after_bth(read_capture):
    f = frame(bth(0x06) + reth(1, 2, 3) + b"w" * 64 + ICRC)
    out = decode(read_capture, [f], caplens=[ETH_IP_UDP + 12])  # snapshot length cut after the BTH
    r = out.row(0, named=True)
    assert (r["status"], r["opcode"], r["psn"], r["reth_va"]) == ("truncated", 6, 10, None)
    assert (r["payload_len"], r["icrc_present"]) == (64, True)  # from the UDP length: the datagram has them


def test_payload_cut_by_snaplen_is_ok(read_capture):
    f = frame(bth(0x06) + reth(1, 2, 3) + b"w" * 64 + ICRC)
    r = decode(read_capture, [f], caplens=[ETH_IP_UDP + 28 + 5]).row(0, named=True)
    assert (r["status"], r["reth_dma_len"], r["payload_len"], r["icrc_present"]) == ("ok", 3, 64, True)


def test_bth_cut_by_snaplen(read_capture):
    f = frame(bth(0x04) + b"x" * 8 + ICRC)
    r = decode(read_capture, [f], caplens=[ETH_IP_UDP + 7]).row(0, named=True)
    assert (r["status"], r["opcode"], r["dest_qp"], r["sport"]) == ("truncated", None, None, 0xC123)


def test_info_counts_the_damaged_packets_it_kept(read_capture):
    """Damage is a counted, reported skip: ``info`` (summary.decode_damage) names the rows kept with a
    status other than ok, per frame and status; a capture without RoCEv2 decodes none of it."""
    import io

    from analyzer.render import console, print_summary
    from analyzer.summary import summarize

    lying = frame(bth(0x0C) + reth(1, 2, 3) + ICRC, udp_len=8 + 12 + 8)
    good = frame(bth(0x04) + b"abcd" + ICRC)
    recs = [(1_700_000_000, 0, lying, len(lying)), (1_700_000_000, 1000, good, len(good)),
            (1_700_000_000, 2000, good[:50], len(good))]  # the snapshot length cut the last BTH
    s = summarize(read_capture(pcap_file(recs, nanosecond=True)))
    assert s["decode_damage"] == {"rocev2_packets": {"truncated": 1, "bad_length": 1}}
    text = io.StringIO()
    print_summary(s, console(text))
    assert "rocev2_packets: truncated 1, bad length 1 (kept as rows" in " ".join(text.getvalue().split())
    dns = ethernet(ipv4(udp(b"\0" * 12, sport=5353, dport=53), proto=17))
    assert summarize(read_capture(pcap_file([(1_700_000_000, 0, dns, len(dns))])))["decode_damage"] == {}


def test_bad_lengths(read_capture):
    # the UDP length says 8 bytes of RETH where 16 are needed (the bytes are there: the length lies)
    lying = frame(bth(0x0C) + reth(1, 2, 3) + ICRC, udp_len=8 + 12 + 8)
    # an ACK with no room for the ICRC; PadCnt 3 with 2 bytes before the ICRC; a datagram shorter than a BTH
    no_icrc = frame(bth(0x11) + aeth(0, 1))
    pad = frame(bth(0x04, flags=0x70) + b"ab" + ICRC[:2])
    tiny = frame(b"\x04\x40\xff\xff\x00\x00")
    out = decode(read_capture, [lying, no_icrc, pad, tiny])
    assert out["status"].to_list() == ["bad_length"] * 4
    assert out["opcode"].to_list() == [0x0C, 0x11, 0x04, None]
    assert out["reth_va"][0] is None and out["aeth_syndrome"][1] == 0 and out["payload_len"].null_count() == 4


# -- ECN, qp_pair, direction, IPv6 ---------------------------------------------------------------------------

def test_ecn_comes_from_the_packets_frame(read_capture):
    out = decode(read_capture, [frame(bth(0x04) + b"x" * 4 + ICRC, tos=0x68 | 3),
                                frame(bth(0x04) + b"x" * 4 + ICRC, tos=0x68 | 2),
                                frame(bth(0x04) + b"x" * 4 + ICRC, tos=0x01)])
    assert out["ecn"].to_list() == [3, 2, 1]


def test_qp_pair_and_direction_both_ways_and_ipv6(read_capture):
    send = frame(bth(0x04, dqp=0x381) + b"x" * 4 + ICRC, src=A, dst=B, sport=0xC001)
    ack = frame(bth(0x11, dqp=0x2E1) + aeth(0x1F, 1) + ICRC, src=B, dst=A, sport=0xC001)
    other = frame(bth(0x11, dqp=0x2E2) + aeth(0x1F, 1) + ICRC, src=A, dst=B, sport=0xC002)  # no request seen
    t6 = bth(0x0C, dqp=0x7) + reth(1, 2, 3) + ICRC
    v6 = ethernet(ipv6(udp(t6, sport=0xC003, dport=4791), nh=17), ethertype=0x86DD)
    out = decode(read_capture, [ack, send, other, v6])
    assert out["qp_pair"][0] == out["qp_pair"][1] != out["qp_pair"][2]
    assert out["direction"].to_list()[:2] == ["responder", "requester"]
    assert out["direction"][2] in ("requester", "responder")
    assert (out["src"][3], out["opcode"][3], out["reth_dma_len"][3], out["direction"][3]) == ("2001:db8::1", 0x0C, 3, "requester")


def test_not_rocev2_port_is_ignored(read_capture):
    out = decode(read_capture, [frame(bth(0x04) + ICRC, dport=4792, sport=1000)])
    assert out.height == 0 and set(out.columns) == {c.name for c in rocev2.PACKET_COLUMNS}


# -- flows -------------------------------------------------------------------------------------------------

def test_flows_count_messages_resends_naks_cnps_and_ecn(read_capture):
    def req(op, psn, tos=0x68 | 2, ackreq=False):
        return frame(bth(op, dqp=0x381, psn=psn, ackreq=ackreq) + b"d" * 8 + ICRC, sport=0xC001, tos=tos)

    def resp(t, tos=0x68 | 2):
        return frame(t, src=B, dst=A, sport=0xC001, tos=tos)

    frames = [req(0x00, 100), req(0x01, 101, tos=0x68 | 3), req(0x02, 102, ackreq=True),
              resp(bth(0x11, dqp=0x2E1, psn=100) + aeth(0x60, 0) + ICRC),  # NAK: PSN sequence error
              req(0x01, 101), req(0x02, 102, ackreq=True),  # go-back-N resend
              resp(bth(0x81, flags=0, byte4=0x40, dqp=0x2E1, psn=0) + b"\0" * 16 + ICRC, tos=0xC0 | 2),
              resp(bth(0x11, dqp=0x2E1, psn=102) + aeth(0x2C, 0) + ICRC),  # RNR NAK
              req(0x04, 103, ackreq=True),
              resp(bth(0x11, dqp=0x2E1, psn=103) + aeth(0x1F, 1) + ICRC)]
    with_cap = read_capture(pcap_file([(1_700_000_000, i * 1000, f) for i, f in enumerate(frames)], nanosecond=True))
    fl = with_cap.frame("rocev2_flows")
    assert fl.height == 2
    rq = fl.filter(pl.col("direction") == "requester").row(0, named=True)
    rs = fl.filter(pl.col("direction") == "responder").row(0, named=True)
    assert (rq["src"], rq["dst"], rq["dest_qp"], rq["packets"], rq["messages"]) == (A, B, 0x381, 6, 2)
    assert (rq["psn_first"], rq["psn_last"], rq["psn_distinct"], rq["retransmitted_psns"]) == (100, 103, 4, 2)
    assert (rq["payload_bytes"], rq["cnps"], rq["ce_packets"], rq["ect_packets"], rq["acks"]) == (48, 1, 1, 5, 0)
    assert (rs["packets"], rs["acks"], rs["naks_psn_seq"], rs["rnr_naks"], rs["cnps"], rs["messages"]) == (4, 1, 1, 1, 0, 0)
    assert (rs["psn_first"], rs["psn_last"], rs["psn_distinct"], rs["retransmitted_psns"]) == (100, 103, 3, 0)
    assert rq["first_ns"] < rs["first_ns"] and rq["qp_pair"] == rs["qp_pair"]


def test_flows_unwrap_the_24_bit_psn_in_capture_order(read_capture):
    """IBA PSNs are 24 bits, compared modulo 2^24: a flow crossing 0xFFFFFF -> 0 with a go-back-N resend
    across the wrap, and a sparse one (a mirror sampling the QP: steps of 0x600000 < 2^23) that goes
    round three laps and meets its first PSN again. Distinct PSNs, messages and resends count unwrapped
    PSNs (a PSN of the next lap is new, not a resend); psn_first/psn_last stay the wire values."""
    def req(op, psn, sport=0xC001, dqp=0x381):
        return frame(bth(op, dqp=dqp, psn=psn) + b"d" * 8 + ICRC, sport=sport)

    top = L.PSN_MASK
    crossing = [req(0x00, top - 1), req(0x01, top), req(0x02, 0), req(0x04, 1),  # SEND First, Middle, Last; Only
                frame(bth(0x11, dqp=0x2E1, psn=top) + aeth(0x60, 0) + ICRC, src=B, dst=A, sport=0xC001),  # NAK
                req(0x01, top), req(0x02, 0), req(0x04, 1)]  # go-back-N from 0xFFFFFF, back across the wrap
    sparse = [req(0x04, (k * 0x600000) & top, sport=0xC002, dqp=0x382) for k in range(9)]  # 8 steps: 3 laps
    cap = read_capture(pcap_file([(1_700_000_000, i * 1000, f) for i, f in enumerate(crossing + sparse)],
                                 nanosecond=True))
    fl = cap.frame("rocev2_flows").filter(pl.col("direction") == "requester")
    wrap = fl.filter(pl.col("dest_qp") == 0x381).row(0, named=True)
    assert (wrap["packets"], wrap["psn_distinct"], wrap["retransmitted_psns"], wrap["messages"]) == (7, 4, 3, 2)
    assert (wrap["psn_first"], wrap["psn_last"]) == (top - 1, 1)  # as on the wire: psn_last < psn_first
    laps = fl.filter(pl.col("dest_qp") == 0x382).row(0, named=True)
    assert (laps["packets"], laps["psn_distinct"], laps["retransmitted_psns"], laps["messages"]) == (9, 9, 0, 9)
    assert (laps["psn_first"], laps["psn_last"]) == (0, 0)  # 3 x 2^24 later: raw PSNs would count a resend
    raw = cap.frame("rocev2_packets").filter(pl.col("dest_qp") == 0x382)["psn"]
    assert raw.n_unique() == 8  # what the raw 24-bit values alone would have said

    rows = pl.DataFrame({"k": [1, 1, 1, 1, 2, 1, 2], "psn": [top, 0, 5, top - 2, 7, 3, 6],
                         "cnp": [False, False, False, False, False, True, False]})
    unwrapped = rocev2.unwrap_psn(rows, pl.col("k"), ~pl.col("cnp")).to_list()
    # a step back across the wrap is the lap before; a CNP row is skipped (null) and its PSN ignored
    assert unwrapped == [top, top + 1, top + 6, top - 2, 7, None, 6]


# -- hostile bytes: no crash, and nothing read past a message ------------------------------------------------

def _run(buf, offset, length, wire):
    out = k.allocate_output(len(offset))
    b = buf.view()
    b.flags.writeable = False
    k.decode_all(b, np.asarray(offset, np.int64), np.asarray(length, np.int64), np.asarray(wire, np.int64), out)
    return out


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=80), st.integers(0, 100), st.integers(0, 100), st.binary(min_size=8, max_size=8))
def test_random_bytes_never_read_past_the_message(data, cut, wire, tail):
    length = min(cut, len(data))
    msg = data[:length]
    # the same message followed by two different tails must decode the same: no byte past it is read
    a = _run(np.frombuffer(msg + tail, np.uint8), [0], [length], [wire])
    b = _run(np.frombuffer(msg + bytes(x ^ 0xFF for x in tail), np.uint8), [0], [length], [wire])
    assert (a == b).all()
    row = a[:, 0]
    assert row[k.F_STATUS] in (k.S_OK, k.S_TRUNCATED, k.S_BAD_LENGTH)
    if row[k.F_STATUS] != k.S_BAD_LENGTH and row[k.F_PRESENT] & k.P_BTH:
        pad = (row[k.F_FLAGS] >> 4) & 3
        assert row[k.F_HEADER_LEN] + row[k.F_PAYLOAD_LEN] + pad + L.ICRC_BYTES == wire and row[k.F_ICRC] == 1


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0x00, 0x05, 0x06, 0x0B, 0x0C, 0x0D, 0x11, 0x12, 0x13, 0x44, 0x51, 0x64, 0x65, 0x81, 0xA6]),
       st.binary(min_size=0, max_size=60), st.integers(-8, 8))
def test_every_opcode_with_lying_lengths(opcode, body, skew):
    msg = bth(opcode) + body
    wire = max(len(msg) + skew, 0)
    out = _run(np.frombuffer(msg, np.uint8), [0], [len(msg)], [wire])[:, 0]
    need = L.BTH_BYTES + sum(size for bit, size in L.HEADER_ORDER if L.OPCODE_HEADERS[opcode] & bit)
    if wire < need + L.ICRC_BYTES:
        assert out[k.F_STATUS] == k.S_BAD_LENGTH
    elif len(msg) < need:
        assert out[k.F_STATUS] == k.S_TRUNCATED
    else:
        assert out[k.F_STATUS] == k.S_OK and out[k.F_HEADER_LEN] == need


# -- helpers -----------------------------------------------------------------------------------------------

def test_helpers():
    assert rocev2.is_request(0x04) and rocev2.is_request(0x0C) and rocev2.is_request(0x64)
    assert not rocev2.is_request(0x11) and not rocev2.is_request(0x0D) and not rocev2.is_request(L.CNP)
    assert rocev2.is_request(np.array([0x00, 0x11])).tolist() == [True, False]
    assert pl.DataFrame({"opcode": [0, 17, 129]}).select(rocev2.is_request(pl.col("opcode")))["opcode"].to_list() == [
        True, False, False]
    assert [rocev2.ends_message(o) for o in (0x00, 0x01, 0x02, 0x04, 0x08, 0x0C, 0x0E, 0x10, 0x11)] == [
        False, False, True, True, True, True, False, True, False]
    assert rocev2.rnr_delay_ns(0) == 655_360_000 and rocev2.rnr_delay_ns(1) == 10_000
    assert rocev2.rnr_delay_ns(25) == 61_440_000  # the specification's value, not Linux's 61410 typo
    assert rocev2.rnr_delay_ns(np.array([12, 31])).tolist() == [640_000, 491_520_000]
    assert rocev2.ack_timeout_ns(0) == 0 and rocev2.ack_timeout_ns(1) == 8192
    assert rocev2.ack_timeout_ns(14) == 4096 * 2 ** 14  # 67.1 ms, the common default
    assert rocev2.credit_wqes(0) == 0 and rocev2.credit_wqes(30) == 32768 and rocev2.credit_wqes(31) is None
    assert rocev2.credit_wqes(np.array([5, 31])).tolist() == [6, -1]


def test_chunked_decoding_gives_the_same_frame(read_capture, monkeypatch):
    frames = [frame(bth(op, psn=i) + reth(i, i, i) + ICRC) if op == 0x0C else frame(bth(op, psn=i) + b"x" * 4 + ICRC)
              for i, op in enumerate((0x00, 0x01, 0x02, 0x0C, 0x04))]
    pcap = pcap_file([(1_700_000_000, i, f) for i, f in enumerate(frames)], nanosecond=True)
    whole = read_capture(pcap, name="a.pcap").frame("rocev2_packets")
    monkeypatch.setattr(rocev2, "DECODE_CHUNK_ROWS", 2)
    chunked = read_capture(pcap, name="b.pcap").frame("rocev2_packets")
    assert chunked.equals(whole) and whole["psn"].to_list() == [0, 1, 2, 3, 4]


def test_message_direction_orients_requests_as_the_client(read_capture):
    from analyzer.messages import protocol_message_sets
    frames = [frame(bth(0x0C) + reth(1, 2, 3) + ICRC), frame(bth(0x10) + aeth(0x1F, 1) + b"r" * 4 + ICRC, src=B, dst=A),
              frame(bth(0x81, byte4=0x40) + b"\0" * 16 + ICRC, src=B, dst=A), frame(b"", src=B, dst=A)]
    cap = read_capture(pcap_file([(1_700_000_000, i, f) for i, f in enumerate(frames)], nanosecond=True))
    (ms,) = protocol_message_sets(cap, rocev2.PROTOCOL)
    assert ms.frame["from_client"].to_list() == [True, False, False, False]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=0, max_size=60), st.integers(0, 80), st.integers(-4, 40)), min_size=1,
                max_size=6))
def test_random_datagrams_through_the_frames_never_raise(tmp_path_factory, packets):
    from analyzer import open_capture
    recs = []
    for i, (body, cut, udp_skew) in enumerate(packets):
        f = frame(body, udp_len=max(8 + len(body) + udp_skew, 0) if udp_skew else None)
        recs.append((1_700_000_000, i, f[:ETH_IP_UDP + cut], len(f)))
    path = tmp_path_factory.mktemp("fuzz") / "f.pcap"
    path.write_bytes(pcap_file(recs, nanosecond=True))
    with open_capture(path) as cap:
        p, fl = cap.frame("rocev2_packets"), cap.frame("rocev2_flows")
    assert set(p["status"].to_list()) <= set(rocev2.STATUSES)
    assert p.filter(pl.col("status") == "ok")["payload_len"].null_count() == 0
    assert fl["packets"].sum() == p["opcode"].is_not_null().sum() if fl.height else True


def test_a_flows_payload_bytes_are_summed_beyond_four_gibibytes(read_capture):
    """Polars sums UInt32 in 32 bits: three 2 GiB payloads (a flow at 100 Gb/s passes 4 GiB in 0.35 s)
    must add up to 6 GiB, not wrap to 2."""
    frames = [frame(bth(0x04, dqp=0x2E1, psn=psn) + b"\0" * 16 + ICRC, src=A, dst=B) for psn in range(3)]
    cap = read_capture(pcap_file([(1_700_000_000, i * 1000, f) for i, f in enumerate(frames)], nanosecond=True))
    packets = cap.frame("rocev2_packets").with_columns(pl.lit(1 << 31, pl.UInt32).alias("payload_len"))
    assert rocev2.flows(packets)["payload_bytes"].to_list() == [3 << 31]
