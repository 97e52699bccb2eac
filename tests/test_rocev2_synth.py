"""samples/rocev2_synth.py and samples/rocekit (issue 16): encoders against known vectors, the RC
transport's behaviour in the captures, the labels, determinism, and tshark dissecting every packet
without a malformed or error-level expert item while agreeing field by field with the generator."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "samples")
if SAMPLES not in sys.path:
    sys.path.insert(0, SAMPLES)

from rocekit import wire  # noqa: E402
from rocekit.catalog import SCENARIOS  # noqa: E402
from rocekit.fabric import TRUTH_FIELDS  # noqa: E402
from rocekit.writer import write  # noqa: E402

TSHARK = shutil.which("tshark")
# small scales keep the suite quick; the ACK-timeout scenario needs its 300 ms (the timer is 67 ms)
SCALE = {"rocev2-ack-timeout": 1.0, "rocev2-ack-timeout-healthy": 1.0}
DEFAULT_SCALE = 0.25
F = {k: i for i, k in enumerate(TRUTH_FIELDS)}

_built: dict = {}


def built(name: str, tmp_path_factory):
    """Each scenario built and written once per session."""
    if name not in _built:
        b = SCENARIOS[name](1, SCALE.get(name, DEFAULT_SCALE))
        path = str(tmp_path_factory.mktemp("rocev2") / f"{name}.pcapng")
        write(b, path, 1)
        _built[name] = (b, path)
    return _built[name]


# ---- encoders ------------------------------------------------------------------------------------
def test_icrc_matches_a_connectx_capture():
    # a CNP captured on a ConnectX-4 Lx (scapy's test/contrib/roce.uts): ICRC 82 fd 00 2a
    f = bytes.fromhex("e41d2dab2bc2 7cfe90643b32 0800"                       # Ethernet
                      "45c2003c718c4000401191610a0011010a001201"              # IPv4, DSCP 48 ECT(0)
                      "000012b700280000"                                      # UDP 0 -> 4791, no checksum
                      "8100ffff4000011800000000" + "00" * 16 + "82fd002a")    # BTH (CNP), reserved, ICRC
    assert wire.icrc(f[14:42], False, f[42:-4]) == f[-4:]
    # the masked fields really are masked: TOS/TTL/checksums/FECN-BECN do not change it ...
    g = bytearray(f)
    g[15] ^= 0x03
    g[22] = 7
    g[46] ^= 0xC0
    assert wire.icrc(bytes(g[14:42]), False, bytes(g[42:-4])) == f[-4:]
    # ... and an invariant one does
    g[50] ^= 1
    assert wire.icrc(bytes(g[14:42]), False, bytes(g[42:-4])) != f[-4:]


def test_constants_and_helpers():
    assert wire.ack_timeout_ns(14) == 4096 * 2 ** 14 == 67_108_864
    assert wire.ack_timeout_ns(0) == 0
    assert wire.quanta_ns(0xFFFF, wire.LINK_SPEEDS_BPS["100G"]) == 0xFFFF * 512 // 100
    assert wire.quanta_ns(1, wire.LINK_SPEEDS_BPS["10G"]) == 51
    assert wire.RNR_DELAY_US[12] == 640 and wire.RNR_DELAY_US[0] == 655360 and len(wire.RNR_DELAY_US) == 32
    assert wire.credit_code(5) == 4 and wire.credit_code(6) == 5 and wire.credit_code(10 ** 6) == 30
    for a, b in ((0x11, 0x23), (0x4A1, 0x77)):
        p = wire.udp_sport(a, b)
        assert p == wire.udp_sport(b, a) and 0xC000 <= p <= 0xFFFF
    b = wire.bth(wire.WRITE_FIRST, 0xABCDEF, 0x123456, ackreq=True, padcnt=2, becn=True)
    assert b == bytes([0x06, 0x60, 0xFF, 0xFF, 0x40, 0xAB, 0xCD, 0xEF, 0x80, 0x12, 0x34, 0x56])
    pfc = wire.pfc_frame(b"\x02\0\0\0\0\x01", {3: 0xFFFF})
    assert len(pfc) == 60 and pfc[:6] == wire.MAC_CONTROL_DST and pfc[12:18] == bytes.fromhex("880801010008")
    assert pfc[18 + 6:20 + 6] == b"\xff\xff"


def test_deterministic(tmp_path):
    a, b = SCENARIOS["rocev2-rnr-loop"](7, 0.3), SCENARIOS["rocev2-rnr-loop"](7, 0.3)
    write(a, str(tmp_path / "a.pcapng"), 7)
    write(b, str(tmp_path / "b.pcapng"), 7)
    assert (tmp_path / "a.pcapng").read_bytes() == (tmp_path / "b.pcapng").read_bytes()
    c = SCENARIOS["rocev2-rnr-loop"](8, 0.3)
    write(c, str(tmp_path / "c.pcapng"), 8)
    assert (tmp_path / "c.pcapng").read_bytes() != (tmp_path / "a.pcapng").read_bytes()


def test_every_frame_carries_its_icrc(tmp_path_factory):
    b, _ = built("rocev2-healthy", tmp_path_factory)
    cap = b.fab.cap
    for r in cap.truth:
        f = cap.frames[r[F["frame"]]]
        v6 = f[12:14] == b"\x86\xdd"
        l3 = 40 if v6 else 20
        assert wire.icrc(f[14:14 + l3 + 8], v6, f[14 + l3 + 8:-4]) == f[-4:]


# ---- transport behaviour ---------------------------------------------------------------------------
def _rows(b):
    return b.fab.cap.truth


def test_go_back_n_resends_from_the_naked_psn(tmp_path_factory):
    b, _ = built("rocev2-gbn-storm", tmp_path_factory)
    rows = _rows(b)
    naks = [r for r in rows if r[F["opcode"]] == wire.ACKNOWLEDGE
            and r[F["syndrome"]] == wire.AETH_NAK | wire.NAK_PSN_SEQ_ERROR]
    assert naks, "losses must produce NAKs"
    lab = b.labels
    assert lab and all(l["detector"] == "gbn_retransmission" for l in lab)
    for l in lab:
        assert l["parameters"]["retransmitted"] > l["parameters"]["lost"] > 0
    checked = 0
    for n in naks:
        # packets already in flight still arrive after the NAK; the first one that goes back (PSN not
        # above the NAKed one) is the resend, and it starts exactly at the NAKed PSN (go back N)
        later = [r for r in rows if r[F["ts"]] > n[F["ts"]] and r[F["src"]] == n[F["dst"]]
                 and r[F["sport"]] == n[F["sport"]] and r[F["opcode"]] in wire.HAS_PAYLOAD
                 and r[F["psn"]] <= n[F["psn"]]]
        if later:
            assert later[0][F["psn"]] == n[F["psn"]] and later[0][F["retransmit"]]
            checked += 1
    assert checked >= len(naks) // 2
    bh, _ = built("rocev2-gbn-storm-healthy", tmp_path_factory)
    assert not bh.labels and not any(r[F["retransmit"]] for r in _rows(bh))
    assert not any(r[F["syndrome"]] >= 0 and r[F["syndrome"]] & wire.AETH_TYPE_MASK == wire.AETH_NAK
                   for r in _rows(bh))


def test_ack_timeout_drives_the_retransmission(tmp_path_factory):
    b, _ = built("rocev2-ack-timeout", tmp_path_factory)
    (l,) = b.labels
    p = l["parameters"]
    assert p["trigger"] == "timeout" and p["ack_timeout"] >= 1 and p["nak_seq"] == 0 and p["lost"] > 0
    rows = _rows(b)
    rtx = [r for r in rows if r[F["retransmit"]]]
    assert rtx
    # the first resend comes one ACK timeout after the flap, not a fabric RTT after it
    assert rtx[0][F["ts"]] - l["start_ns"] >= wire.ack_timeout_ns(p["timeout_exp"]) * 0.9
    bh, _ = built("rocev2-ack-timeout-healthy", tmp_path_factory)
    assert not bh.labels and not any(r[F["retransmit"]] for r in _rows(bh))


def test_rnr_retries_wait_the_timer(tmp_path_factory):
    b, _ = built("rocev2-rnr-loop", tmp_path_factory)
    (l,) = b.labels
    p = l["parameters"]
    assert p["rnr_naks"] >= 3
    rows = _rows(b)
    rnr = [r for r in rows if r[F["opcode"]] == wire.ACKNOWLEDGE and r[F["syndrome"]] >= 0
           and r[F["syndrome"]] & wire.AETH_TYPE_MASK == wire.AETH_RNR_NAK]
    assert len(rnr) == p["rnr_naks"]
    assert all(r[F["syndrome"]] & wire.AETH_VALUE_MASK == p["rnr_timer_code"] for r in rnr)
    for n in rnr:
        again = [r for r in rows if r[F["ts"]] > n[F["ts"]] and r[F["dst"]] == n[F["src"]]
                 and r[F["psn"]] == n[F["psn"]] and r[F["opcode"]] in wire.HAS_PAYLOAD]
        if again:
            assert again[0][F["ts"]] - n[F["ts"]] >= p["rnr_delay_ns"]
    bh, _ = built("rocev2-rnr-loop-healthy", tmp_path_factory)
    assert not bh.labels
    assert not any(r[F["syndrome"]] >= 0 and r[F["syndrome"]] & wire.AETH_TYPE_MASK == wire.AETH_RNR_NAK
                   for r in _rows(bh))


def test_pfc_storm_spreads_upstream(tmp_path_factory):
    b, _ = built("rocev2-pfc-storm", tmp_path_factory)
    (l,) = b.labels
    ports = [d["port"] for d in l["parameters"]["ports"]]
    assert ports[0] == "h10->leaf1"
    assert ports.index("leaf1->spine0") < ports.index("spine0->leaf0") < min(
        ports.index(p) for p in ports if p.startswith("leaf0->h"))
    bh, _ = built("rocev2-pfc-storm-healthy", tmp_path_factory)
    assert not bh.labels and not bh.fab.cap.pauses


def test_incast_and_ignored_cnps(tmp_path_factory):
    inc, _ = built("rocev2-incast", tmp_path_factory)
    (l,) = inc.labels
    p = l["parameters"]
    assert p["kind"] == "incast" and p["cnps"] > 0 and p["ce_marked"] > 0
    assert p["sender_rate_min_bps"] < wire.LINK_SPEEDS_BPS["100G"]
    cnps = [r for r in _rows(inc) if r[F["opcode"]] == wire.CNP]
    assert all(r[F["becn"]] and r[F["psn"]] == 0 for r in cnps)
    assert {r[F["src"]] for r in cnps} == {"h10"}
    h, _ = built("rocev2-incast-healthy", tmp_path_factory)
    assert not h.labels and not any(r[F["ecn"]] == wire.ECN_CE for r in _rows(h))
    ign, _ = built("rocev2-cnp-ignored", tmp_path_factory)
    (li,) = ign.labels
    q = li["parameters"]
    assert q["kind"] == "cnp_no_slowdown" and q["cnps"] > 0
    assert q["sender_rate_min_bps"] == wire.LINK_SPEEDS_BPS["100G"]
    twin, _ = built("rocev2-cnp-ignored-healthy", tmp_path_factory)
    ce_twin = sum(r[F["ecn"]] == wire.ECN_CE for r in _rows(twin)) / len(_rows(twin))
    assert q["ce_fraction"] > ce_twin


def test_labels_file(tmp_path_factory):
    _, path = built("rocev2-rnr-loop", tmp_path_factory)
    labels = json.load(open(path + ".labels.json"))
    assert labels and labels[0]["protocol"] == "rocev2" and labels[0]["server_port"] == 4791
    assert labels[0]["parameters"]["generated"] is True
    assert labels[0]["start_ns"] > 1_700_000_000 * 10 ** 9
    b, path = built("rocev2-pfc-storm", tmp_path_factory)
    (l,) = json.load(open(path + ".labels.json"))
    epoch = l["start_ns"] - b.labels[0]["start_ns"]            # the capture's epoch offset
    assert epoch > 1_700_000_000 * 10 ** 9
    for d, rel in zip(l["parameters"]["ports"], b.labels[0]["parameters"]["ports"]):
        assert d["first_at_ns"] == rel["first_at_ns"] + epoch          # nested timestamps are absolute too
    assert l["parameters"]["pause_ns"] == b.labels[0]["parameters"]["pause_ns"]   # durations are not shifted


# ---- tshark ----------------------------------------------------------------------------------------
TS_FIELDS = ("frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
             "infiniband.bth.a", "infiniband.bth.padcnt", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
             "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.immdt",
             "udp.srcport", "udp.dstport", "ip.dsfield.ecn", "ipv6.tclass.ecn", "infiniband.invariant.crc",
             "macc.opcode", "macc.pause_time", "macc.cbfc.enbv", "macc.cbfc.pause_time.c3")


def _tshark(path, *args):
    r = subprocess.run([TSHARK, "-n", "-r", path, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _int(s):
    return int(s, 0) if s else -1


@pytest.mark.skipif(TSHARK is None, reason="tshark not installed")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_tshark_dissects_and_agrees(name, tmp_path_factory):
    b, path = built(name, tmp_path_factory)
    cap = b.fab.cap
    assert _tshark(path, "-Y", "_ws.malformed || _ws.expert.severity >= error") == ""
    out = _tshark(path, "-T", "fields", "-E", "separator=\t", "-E", "occurrence=f",
                  *sum((["-e", f] for f in TS_FIELDS), []))
    lines = [l.split("\t") for l in out.splitlines()]
    assert len(lines) == len(cap.ts)
    order = np.argsort(np.asarray(cap.ts), kind="stable")
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    col = {f: i for i, f in enumerate(TS_FIELDS)}
    seen = 0
    for r in cap.truth:
        row = lines[pos[r[F["frame"]]]]
        g = lambda f: row[col[f]]  # noqa: E731
        assert _int(g("infiniband.bth.opcode")) == r[F["opcode"]]
        assert _int(g("infiniband.bth.destqp")) == r[F["dqpn"]]
        assert _int(g("infiniband.bth.psn")) == r[F["psn"]]
        assert (g("infiniband.bth.a") in ("1", "True")) == bool(r[F["ackreq"]])
        assert _int(g("infiniband.bth.padcnt")) == wire.pad_payload(r[F["paylen"]])
        assert _int(g("udp.dstport")) == wire.ROCEV2_PORT and _int(g("udp.srcport")) == r[F["sport"]]
        ecn = g("ip.dsfield.ecn") or g("ipv6.tclass.ecn")
        assert _int(ecn) == r[F["ecn"]]
        if r[F["syndrome"]] >= 0:
            assert _int(g("infiniband.aeth.syndrome")) == r[F["syndrome"]]
            assert _int(g("infiniband.aeth.msn")) == r[F["msn"]]
        if r[F["va"]] >= 0:
            assert _int(g("infiniband.reth.va")) == r[F["va"]]
            assert _int(g("infiniband.reth.r_key")) == r[F["rkey"]]
            assert _int(g("infiniband.reth.dmalen")) == r[F["dmalen"]]
        if r[F["imm"]] >= 0:
            assert int(g("infiniband.immdt"), 16) == r[F["imm"]]      # tshark prints ImmDt as bare hex
        frame = cap.frames[r[F["frame"]]]
        if r[F["opcode"]] != wire.CNP:   # Wireshark 4.0 shows a CNP as "Unknown (129)" and its ICRC as data
            assert _int(g("infiniband.invariant.crc")) == int.from_bytes(frame[-4:], "big")
        seen += 1
    assert seen == len(cap.truth) and seen > 0
    macc = [l for l in lines if l[col["macc.opcode"]]]
    pfc = [l for l in macc if _int(l[col["macc.opcode"]]) == wire.OPCODE_PFC]
    assert len(pfc) == len(cap.pauses)
    for l, (_t, _port, _mac, prio, quanta) in zip(pfc, cap.pauses):
        assert _int(l[col["macc.cbfc.enbv"]]) == 1 << prio
        assert _int(l[col["macc.cbfc.pause_time.c3"]]) == quanta
    if name == "rocev2-healthy":
        pause = [l for l in macc if _int(l[col["macc.opcode"]]) == wire.OPCODE_PAUSE]
        assert [_int(l[col["macc.pause_time"]]) for l in pause] == [0x200, 0x200, 0]


# ---- one transmitter per port -------------------------------------------------------------------
LOSSLESS = ("rocev2-healthy", "rocev2-pfc-storm", "rocev2-pfc-storm-healthy", "rocev2-incast",
            "rocev2-cnp-ignored", "rocev2-cnp-ignored-healthy", "rocev2-rnr-loop")


@pytest.mark.parametrize("name", ["rocev2-pfc-storm", "rocev2-cnp-ignored", "rocev2-incast"])
def test_a_last_hop_link_never_sends_faster_than_its_line_rate(name, tmp_path_factory):
    """Each RoCE frame is recorded on the link from the last switch to its destination host; on one
    link, a frame starts only after the previous one has been serialised (a paused port that is
    woken twice must not run two transmit chains: generator version 2)."""
    b, _ = built(name, tmp_path_factory)
    cap, rate = b.fab.cap, b.fab.p.rate_bps
    last: dict[str, tuple[int, int]] = {}
    for r in cap.truth:
        t, dst, size = r[F["ts"]], r[F["dst"]], len(cap.frames[r[F["frame"]]])
        if dst in last:
            t0, size0 = last[dst]
            assert t - t0 >= size0 * 8 * 1_000_000_000 // rate, (name, r[F["frame"]])
        last[dst] = (t, size)


@pytest.mark.parametrize("name", LOSSLESS)
def test_no_nak_without_a_drop(name, tmp_path_factory):
    """A lossless fabric that dropped nothing delivers in order: no PSN sequence error NAK."""
    b, _ = built(name, tmp_path_factory)
    assert not b.fab.drops
    assert not any(r[F["opcode"]] == wire.ACKNOWLEDGE and r[F["syndrome"]] == wire.AETH_NAK | wire.NAK_PSN_SEQ_ERROR
                   for r in _rows(b)), name
