"""The pause_frames frame (analyzer/mac_control.py): hand-built 802.3x PAUSE and 802.1Qbb PFC frames from
the specifications' layouts, truncated and unknown ones, link speeds, and field-by-field agreement with
tshark's MAC Control dissector on hand-built and generated captures."""
import struct

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import mac_control as mc
from builders import block, epb, option, pcap_file, shb
from rocev2_captures import rocev2_capture
from tshark_ref import as_hex_int, as_int, have_tshark, tshark_fields

MACC_DST = bytes.fromhex("0180c2000001")  # the MAC Control multicast address (802.3 Annex 31B)
PORT = bytes.fromhex("02005e10000a")
ETH_MIN = 60  # a minimum frame without its FCS: MAC Control frames are padded to it


def frame(body: bytes, src=PORT, dst=MACC_DST, vlan: int | None = None) -> bytes:
    """Ethernet II carrying MAC Control ``body`` (opcode onwards), padded to the minimum size."""
    tag = struct.pack(">HH", 0x8100, vlan) if vlan is not None else b""
    f = dst + src + tag + struct.pack(">H", 0x8808) + body
    return f + b"\0" * (ETH_MIN - len(f))


def pause(quanta: int) -> bytes:
    return struct.pack(">HH", 0x0001, quanta)


def pfc(enable: int, times: list[int]) -> bytes:
    return struct.pack(">HH8H", 0x0101, enable, *times)


T0 = 1_700_000_000  # seconds
PFC_TIMES = [0x0100, 0x0101, 0x0102, 0x0103, 0x0104, 0x0105, 0x0106, 0xFFFF]

# (data, caplen cut) in capture order; the expectations below follow this list
FRAMES = [
    frame(pause(0xFFFF)),                                   # 1 PAUSE: every priority, the longest pause
    frame(pause(0)),                                        # 2 PAUSE resume
    frame(pfc(0x08, [0, 0, 0, 0x2000, 0, 0, 0, 0])),        # 3 PFC priority 3 only (RoCE's usual class)
    frame(pfc(0x81, PFC_TIMES)),                            # 4 priorities 0 and 7
    frame(pfc(0xFF, PFC_TIMES)),                            # 5 all eight
    frame(pfc(0x00, PFC_TIMES)),                            # 6 none enabled: times ignored
    frame(pfc(0x28, [9, 9, 9, 0, 9, 7, 9, 9])),             # 7 priority 3 resumed, 5 paused
    frame(pfc(0x08, [0, 0, 0, 0x0400, 0, 0, 0, 0]), vlan=(3 << 13) | 100),  # 8 VLAN-tagged PFC
    frame(struct.pack(">HI", 0x0002, 0x12345678)),          # 9 other opcode (EPON GATE)
]
CUT = {10: (frame(pfc(0xFF, PFC_TIMES)), 14 + 10),          # 10 PFC cut after time[2]
       11: (frame(pause(0x1234)), 14 + 3),                  # 11 PAUSE cut inside pause_time
       12: (frame(pause(0x1234)), 14 + 1)}                  # 12 cut inside the opcode


def _records():
    recs = [(T0, k * 1000, data) for k, data in enumerate(FRAMES)]
    for n, (data, cut) in sorted(CUT.items()):
        recs.append((T0, (n - 1) * 1000, data[:cut], len(data)))
    return recs


@pytest.fixture
def hand_built(read_capture):
    return read_capture(pcap_file(_records(), nanosecond=True), name="macc.pcap")


def _row(f: pl.DataFrame, n: int) -> dict:
    return f.filter(pl.col("frame") == n).row(0, named=True)


def _quanta(r: dict) -> list:
    return [r[f"quanta_p{p}"] for p in range(8)]


def _until(r: dict) -> list:
    return [r[f"paused_until_p{p}_ns"] for p in range(8)]


def _ns(quanta: int, bps: int = mc.DEFAULT_LINK_BPS) -> int:
    return quanta * 512 * 1_000_000_000 // bps


def test_schema_and_one_row_per_mac_control_frame(hand_built):
    f = hand_built.frame("pause_frames")
    assert f.columns == [c.name for c in mc.PAUSE_FRAME_COLUMNS]
    assert f["frame"].to_list() == list(range(1, 13))
    assert f.schema["kind"] == pl.Enum(["pause", "pfc", "other"]) and f.schema["status"] == pl.Enum(["ok", "truncated"])
    assert f.schema["quanta_p3"] == pl.UInt16 and f.schema["paused_until_p3_ns"] == pl.Int64
    assert f["link_bps"].unique().to_list() == [mc.DEFAULT_LINK_BPS] == [100_000_000_000]  # a pcap has no if_speed
    assert (f["src_mac"] == "02:00:5e:10:00:0a").all() and (f["dst_mac"] == "01:80:c2:00:00:01").all()


def test_pause_pauses_every_priority(hand_built):
    f = hand_built.frame("pause_frames")
    r = _row(f, 1)
    assert (r["opcode"], r["kind"], r["class_enable"], r["status"]) == (1, "pause", 0xFF, "ok")
    assert _quanta(r) == [0xFFFF] * 8
    ts = T0 * 10**9
    assert _until(r) == [ts + 335_539] * 8 == [ts + _ns(0xFFFF)] * 8  # 65535 x 5.12 ns at 100 Gb/s
    resume = _row(f, 2)
    assert _quanta(resume) == [0] * 8 and _until(resume) == [resume["ts_ns"]] * 8


@pytest.mark.parametrize("n,enable,quanta", [
    (3, 0x08, [None, None, None, 0x2000, None, None, None, None]),
    (4, 0x81, [0x0100, None, None, None, None, None, None, 0xFFFF]),
    (5, 0xFF, PFC_TIMES),
    (6, 0x00, [None] * 8),
    (7, 0x28, [None, None, None, 0, None, 7, None, None]),
    (8, 0x08, [None, None, None, 0x0400, None, None, None, None]),
])
def test_pfc_class_enable_vector_selects_the_times(hand_built, n, enable, quanta):
    r = _row(hand_built.frame("pause_frames"), n)
    assert (r["opcode"], r["kind"], r["class_enable"], r["status"]) == (0x0101, "pfc", enable, "ok")
    assert _quanta(r) == quanta
    assert _until(r) == [None if q is None else r["ts_ns"] + _ns(q) for q in quanta]


def test_vlan_tagged_pfc_is_read_and_its_tag_kept_in_packets(hand_built):
    p = hand_built.packets.filter(pl.col("frame") == 8).row(0, named=True)
    assert (p["ethertype"], p["vlan"], p["parse_status"]) == (0x8808, 100, "not_ip")
    assert hand_built.bytes_at(p["payload_offset"], 2) == b"\x01\x01"
    assert _row(hand_built.frame("pause_frames"), 8)["src_mac"] == "02:00:5e:10:00:0a"


def test_other_opcode_is_kept_undecoded(hand_built):
    r = _row(hand_built.frame("pause_frames"), 9)
    assert (r["opcode"], r["kind"], r["class_enable"], r["status"]) == (2, "other", None, "ok")
    assert _quanta(r) == [None] * 8 and _until(r) == [None] * 8


def test_truncated_frames_are_counted_with_what_was_captured(hand_built):
    f = hand_built.frame("pause_frames")
    assert f.filter(pl.col("status") == "truncated")["frame"].to_list() == [10, 11, 12]
    cut_pfc = _row(f, 10)  # 10 bytes: opcode, enable vector, time[0..2]
    assert (cut_pfc["kind"], cut_pfc["class_enable"]) == ("pfc", 0xFF)
    assert _quanta(cut_pfc) == PFC_TIMES[:3] + [None] * 5
    cut_pause = _row(f, 11)
    assert (cut_pause["opcode"], cut_pause["kind"], cut_pause["class_enable"]) == (1, "pause", None)
    assert _quanta(cut_pause) == [None] * 8
    no_opcode = _row(f, 12)
    assert (no_opcode["opcode"], no_opcode["kind"], no_opcode["src_mac"]) == (None, "other", "02:00:5e:10:00:0a")


def test_info_reports_the_truncated_frames(hand_built):
    from analyzer.summary import summarize

    assert summarize(hand_built)["decode_damage"] == {"pause_frames": {"truncated": 3}}


def test_no_mac_control_gives_an_empty_frame(read_capture):
    ip = bytes.fromhex("450000140001000040060000") + bytes([10, 0, 0, 1, 10, 0, 0, 2])
    cap = read_capture(pcap_file([(T0, 0, MACC_DST + PORT + b"\x08\x00" + ip)]))
    f = cap.frame("pause_frames")
    assert f.height == 0 and f.columns == [c.name for c in mc.PAUSE_FRAME_COLUMNS]


def _pcapng(speed_bps: int | None, records: list[bytes], linktype=1) -> bytes:
    opts = option(9, bytes([9]))  # nanoseconds
    if speed_bps is not None:
        opts += option(8, struct.pack("<Q", speed_bps))  # if_speed
    idb = block(1, struct.pack("<HHI", linktype, 0, 0) + opts + struct.pack("<HH", 0, 0))
    epbs = b"".join(epb(0, T0 * 10**9 + 1000 * k, d) for k, d in enumerate(records))
    return shb() + idb + epbs


@pytest.mark.parametrize("name", ["25G", "400G", "800G"])
def test_if_speed_sets_the_pause_time(read_capture, name):
    bps = mc.LINK_SPEEDS_BPS[name]
    cap = read_capture(_pcapng(bps, [frame(pfc(0x08, [0, 0, 0, 1000, 0, 0, 0, 0]))]), name="s.pcapng")
    assert cap.frame("interfaces")["speed_bps"].to_list() == [bps]
    r = cap.frame("pause_frames").row(0, named=True)
    assert r["link_bps"] == bps
    assert r["paused_until_p3_ns"] - r["ts_ns"] == 1000 * 512 * 10**9 // bps  # 25G: 20.48 us


def test_without_if_speed_the_default_is_used(read_capture):
    cap = read_capture(_pcapng(None, [frame(pause(100))]), name="n.pcapng")
    assert cap.frame("interfaces")["speed_bps"].to_list() == [None]
    r = cap.frame("pause_frames").row(0, named=True)
    assert r["link_bps"] == mc.DEFAULT_LINK_BPS and r["paused_until_p0_ns"] - r["ts_ns"] == 512  # 100 x 5.12 ns


def test_linux_cooked_capture_gives_the_sender(read_capture):
    # LINUX_SLL (113): packet type 4 (sent by us), ARPHRD_ETHER, address length 6, address, protocol
    sll = struct.pack(">HHH", 4, 1, 6) + PORT + b"\0\0" + struct.pack(">H", 0x8808)
    cap = read_capture(pcap_file([(T0, 0, sll + pfc(0x08, [0, 0, 0, 7, 0, 0, 0, 0]))], linktype=113))
    r = cap.frame("pause_frames").row(0, named=True)
    assert (r["src_mac"], r["dst_mac"], r["kind"], r["quanta_p3"], r["status"]) == (
        "02:00:5e:10:00:0a", None, "pfc", 7, "ok")


def test_names_speeds_and_quantum():
    assert list(mc.LINK_SPEEDS_BPS) == ["10G", "25G", "40G", "50G", "100G", "200G", "400G", "800G"]
    assert mc.DEFAULT_LINK_BPS == mc.LINK_SPEEDS_BPS["100G"] and mc.PAUSE_QUANTUM_BITS == 512


def test_a_detector_can_require_pause_frames_and_export_writes_it(hand_built, tmp_path):
    from analyzer.export import export_frames
    from detectors.base import CaptureView

    view = CaptureView(hand_built, "test", ("pause_frames",))
    assert view.frame("pause_frames").height == 12
    assert "pause_frames" in hand_built.frame_names()
    written = export_frames(hand_built, str(tmp_path), ["pause_frames"])
    assert written[0][0] == "pause_frames" and written[0][2] == 12
    back = pl.read_parquet(tmp_path / "pause_frames.parquet")
    assert back["quanta_p3"].to_list() == hand_built.frame("pause_frames")["quanta_p3"].to_list()
    import json
    schema = json.loads((tmp_path / "schema.json").read_text())["pause_frames"]
    assert "512 bit times" in schema["quanta_p0"]["description"]


@settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_mac_control_frames_never_crash(read_capture, data):
    """Random opcodes, enable vectors and times, random cuts, three link types: one row per frame, and
    every time that is there is consistent."""
    recs = []
    for k in range(data.draw(st.integers(1, 6))):
        body = data.draw(st.binary(min_size=0, max_size=24))
        if data.draw(st.booleans()):
            body = data.draw(st.sampled_from([b"\x00\x01", b"\x01\x01"])) + body
        f = frame(body, vlan=data.draw(st.sampled_from([None, 5])))
        recs.append((T0, k, f[:data.draw(st.integers(14, len(f)))], len(f)))
    linktype = data.draw(st.sampled_from([1, 113, 276]))
    if linktype != 1:  # the same MAC Control bytes behind a cooked header (SLL: 16 bytes, SLL2: 20)
        head = (struct.pack(">HHH", 0, 1, 6) + PORT + b"\0\0" if linktype == 113
                else b"\0\0\0\0\0\0\0\0\0\1\0\6" + PORT + b"\0\0")
        recs = [(s_, f_, (head + d[12:] if linktype == 113 else d[12:14] + head[2:] + d[14:]), w) for s_, f_, d, w in recs]
    cap = read_capture(pcap_file(recs, linktype=linktype, nanosecond=True), name="fuzz.pcap")
    f = cap.frame("pause_frames")
    assert f.height == cap.packets.filter(pl.col("ethertype") == 0x8808).height
    assert f["status"].is_not_null().all() and f["link_bps"].is_not_null().all()
    assert (f["src_mac"] == "02:00:5e:10:00:0a").all()  # Ethernet, SLL and SLL2 all name the sender
    for p in range(8):
        q, u = pl.col(f"quanta_p{p}"), pl.col(f"paused_until_p{p}_ns")
        assert f.filter(q.is_null() != u.is_null()).height == 0
        assert f.filter(u.is_not_null() & ((u < pl.col("ts_ns")) | (u - pl.col("ts_ns") > 335_539))).height == 0
    assert f.filter((pl.col("kind") == "pfc") & (pl.col("status") == "ok") & pl.col("class_enable").is_null()).height == 0


# --- against tshark -----------------------------------------------------------------------------

TSHARK_FIELDS = ["frame.number", "eth.src", "eth.dst", "macc.opcode", "macc.pause_time", "macc.cbfc.enbv",
                 *(f"macc.cbfc.enbv.c{p}" for p in range(8)), *(f"macc.cbfc.pause_time.c{p}" for p in range(8))]


def _agree_with_tshark(path, f: pl.DataFrame) -> int:
    ref = tshark_fields(path, TSHARK_FIELDS, display_filter="macc")
    ref = ref.with_columns(as_int("frame.number").cast(pl.UInt32).alias("frame"),
                           as_hex_int("macc.opcode"), as_int("macc.pause_time"), as_hex_int("macc.cbfc.enbv"),
                           *(as_int(f"macc.cbfc.pause_time.c{p}") for p in range(8)))
    j = f.join(ref, on="frame", how="inner")
    # tshark shows no MAC Control layer for a frame cut inside its opcode; every other one is in both
    assert set(ref["frame"]) <= set(f["frame"])
    missing = f.join(ref, on="frame", how="anti")
    assert (missing["status"] == "truncated").all() and missing["opcode"].is_null().all()
    # truncated frames: what tshark could still read (it reads the eight PFC times as one block)
    cut = j.filter(pl.col("status") == "truncated")
    assert (cut["src_mac"] == cut["eth.src"]).all() and (cut["opcode"].cast(pl.Int64) == cut["macc.opcode"]).all()
    with_enable = cut.filter(pl.col("macc.cbfc.enbv").is_not_null())
    assert (with_enable["class_enable"].cast(pl.Int64) == with_enable["macc.cbfc.enbv"] % 256).all()
    ok = j.filter(pl.col("status") == "ok")
    assert (ok["src_mac"] == ok["eth.src"]).all() and (ok["dst_mac"] == ok["eth.dst"]).all()
    assert (ok["opcode"].cast(pl.Int64) == ok["macc.opcode"]).all()
    pause_rows = ok.filter(pl.col("kind") == "pause")
    for p in range(8):
        assert (pause_rows[f"quanta_p{p}"].cast(pl.Int64) == pause_rows["macc.pause_time"]).all()
    pfc_rows = ok.filter(pl.col("kind") == "pfc")
    assert (pfc_rows["class_enable"].cast(pl.Int64) == pfc_rows["macc.cbfc.enbv"] % 256).all()
    for p in range(8):
        enabled = pfc_rows.filter((pl.col("macc.cbfc.enbv") // (1 << p)) % 2 == 1)
        assert (enabled[f"quanta_p{p}"].cast(pl.Int64) == enabled[f"macc.cbfc.pause_time.c{p}"]).all()
        assert pfc_rows.filter((pl.col("macc.cbfc.enbv") // (1 << p)) % 2 == 0)[f"quanta_p{p}"].is_null().all()
    return ok.height


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark not installed")
def test_hand_built_agrees_with_tshark(hand_built):
    assert _agree_with_tshark(hand_built.path, hand_built.frame("pause_frames")) == 9


@pytest.mark.tshark
@pytest.mark.skipif(not have_tshark(), reason="tshark not installed")
@pytest.mark.parametrize("scenario,scale,kind", [("rocev2-pfc-storm", 0.1, "pfc"), ("rocev2-incast", 0.1, "pfc"),
                                                 ("rocev2-healthy", 0.2, "pause")])
def test_generated_agree_with_tshark(scenario, scale, kind):
    from analyzer import open_capture

    path = rocev2_capture(scenario, scale=scale)
    with open_capture(path) as cap:
        f = cap.frame("pause_frames")
        assert f.filter(pl.col("kind") == kind).height > 0
        assert _agree_with_tshark(path, f) == f.height  # generated frames are whole
