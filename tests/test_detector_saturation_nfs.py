"""detectors/saturation.py on NFS (nfs_transactions) and detectors/saturation_slots.py (NFSv4.1 slot use,
RFC 8881 §2.10.6.1, §18.46.3): the recorded nfs-ganesha ramp (samples/realkit/scen_nfs_saturation.py)
found and its twin quiet, against the clients' own logs; constructed SEQUENCE rows (slot tables full,
lowered target, slots spare, hostile input) for the slot module; a constructed NFSv4.1 ramp end to end;
and the recording client's sessions (samples/realkit/nfs_session.py) against a fake server on loopback
that answers out of order and lowers its target_highest_slotid.

The constructed sessions come from a small FCFS queue simulation (``test_detector_saturation.simulate``):
each session's workers are closed-loop clients, and each request takes the lowest free slot of its
session, as a client does (RFC 8881 §2.10.6.1), so the slot counts asserted follow from the schedule."""
from __future__ import annotations

import tomllib
from pathlib import Path

import polars as pl
import pytest

from detectors import saturation, saturation_slots
from detectors.base import SEVERITY_RANK
from fakes import MS, S, T0, FakeCapture, transaction_frame
from test_detector_saturation import simulate

ROOT = Path(__file__).parent.parent
# the recordings: samples/ once the lead has moved them, else the helper's recording directory
RECORDED = [d for d in (ROOT / "samples",) if (d / "nfs41-saturation.pcap").exists()]
SERVER = "10.0.0.49"


# -- constructed NFSv4.1 sessions ---------------------------------------------------------------------
def sessions_ramp(steps=(1, 2, 4, 8, 12), step_ns=2 * S, slots=4, servers=2, service_ns=4 * MS, think_ns=0):
    """Closed-loop ramp: sessions join in STEPS, each with SLOTS workers (one outstanding request each)
    against a server of SERVERS workers. Returns [(session address, t, latency)]."""
    end = T0 + len(steps) * step_ns
    closed = {}
    for i in range(max(steps)):
        first = next(k for k, n in enumerate(steps) if n > i)
        for w in range(slots):
            closed[f"10.0.1.{i + 1}/{w}"] = (T0 + first * step_ns + i * 10_000 + w * 1_000, end, think_ns)
    return [(c.split("/")[0], t, lat) for c, t, lat in simulate([], servers, service_ns, closed)]


def with_slots(rows):
    """Each request on the lowest slot of its session free at its send time (RFC 8881 §2.10.6.1)."""
    out, busy_until = [], {}
    for c, t, lat in sorted(rows, key=lambda r: r[1]):
        table = busy_until.setdefault(c, [])
        slot = next((k for k, until in enumerate(table) if until <= t), None)
        if slot is None:
            slot = len(table)
            table.append(0)
        table[slot] = t + lat
        out.append((c, t, lat, slot))
    return out


def sequence_messages(rows, highest: int, target: int | None = None, port: int = 2049) -> pl.DataFrame:
    """nfs_messages SEQUENCE rows (one call and one reply per request) for (session, t, latency, slot)
    rows: the call's sessionid / slotid, the reply's server highest_slotid (and target_highest_slotid)."""
    out = []
    for k, (c, t, lat, slot) in enumerate(rows):
        sid = f"{int(c.rsplit('.', 1)[1]):032x}"
        call_frame = 2 * k + 1
        out.append(dict(operation="SEQUENCE", msg_type="CALL", is_callback=False, sessionid=sid, slotid=slot,
                        highest_slotid=slot, call_frame=call_frame, frame_last=call_frame, ts_first_ns=t,
                        ts_last_ns=t, src=c, dst=SERVER, sport=700, dport=port, target_highest_slotid=None))
        out.append(dict(operation="SEQUENCE", msg_type="REPLY", is_callback=False, sessionid=sid, slotid=slot,
                        highest_slotid=highest, call_frame=call_frame, frame_last=call_frame + 1,
                        ts_first_ns=t + lat, ts_last_ns=t + lat, src=SERVER, dst=c, sport=port, dport=700,
                        target_highest_slotid=target))
    frame = pl.DataFrame(out, schema_overrides={"slotid": pl.UInt32, "highest_slotid": pl.UInt32,
                                                "target_highest_slotid": pl.UInt32, "call_frame": pl.UInt32,
                                                "frame_last": pl.UInt32, "ts_first_ns": pl.Int64,
                                                "ts_last_ns": pl.Int64, "dport": pl.UInt16, "sport": pl.UInt16})
    return frame if target is not None else frame.drop("target_highest_slotid")


def nfs_capture(rows, highest: int, target: int | None = None) -> FakeCapture:
    tx = [dict(t=t, client=c, lat=lat, op="GETATTR", server=SERVER, server_port=2049, transport="tcp",
               flow=int(c.rsplit(".", 1)[1]), port=700 + int(c.rsplit(".", 1)[1]), frame=2 * k + 1)
          for k, (c, t, lat, _) in enumerate(rows)]
    return FakeCapture(nfs_transactions=transaction_frame(tx, protocol="nfs"),
                       nfs_messages=sequence_messages(rows, highest, target))


def period(start_ns: int, end_ns: int, protocol: str = "nfs") -> pl.DataFrame:
    return pl.DataFrame({"g": [0], "protocol": [protocol], "server": [SERVER], "server_port": [2049],
                         "start_ns": [start_ns], "end_ns": [end_ns]},
                        schema_overrides={"server_port": pl.Int32, "g": pl.Int64})


def steady_sessions(n_sessions: int, in_flight: int, dur_ns: int = 4 * S, lat_ns: int = 20 * MS):
    """N_SESSIONS sessions each keeping IN_FLIGHT requests outstanding back to back for DUR_NS."""
    rows = []
    for i in range(n_sessions):
        for w in range(in_flight):
            t = T0 + w * 1_000
            while t < T0 + dur_ns:
                rows.append((f"10.0.1.{i + 1}", t, lat_ns))
                t += lat_ns
    return with_slots(rows)


def test_slot_tables_full_are_told_exhausted():
    rows = steady_sessions(6, in_flight=8)
    cap = FakeCapture(nfs_messages=sequence_messages(rows, highest=7))
    out = saturation_slots.slot_use(cap, period(T0 + S, T0 + 3 * S), saturation.Params())
    assert out["slot_sessions"][0] == 6 and out["slot_max_in_use"][0] == 8 and out["slot_accepted"][0] == 8
    assert out["slot_sessions_full"][0] == 6
    text = out["slot_text"][0]
    assert "6 of the 6 sessions kept all 8 of their slots busy" in text and "highest_slotid 7" in text
    assert "exhausted" in text and "throttling" not in text


def test_a_lowered_target_is_the_server_throttling_through_slots():
    rows = steady_sessions(4, in_flight=2)
    cap = FakeCapture(nfs_messages=sequence_messages(rows, highest=1, target=0))
    text = saturation_slots.slot_use(cap, period(T0 + S, T0 + 3 * S), saturation.Params())["slot_text"][0]
    assert "exhausted" in text and "target_highest_slotid to 0" in text


def test_spare_slots_say_the_server_was_the_limit():
    rows = steady_sessions(5, in_flight=3)
    cap = FakeCapture(nfs_messages=sequence_messages(rows, highest=63))
    out = saturation_slots.slot_use(cap, period(T0 + S, T0 + 3 * S), saturation.Params())
    assert out["slot_max_in_use"][0] == 3 and out["slot_accepted"][0] == 64
    assert "never exhausted: at most 3 of 64 slots in use in any of the 5 sessions" in out["slot_text"][0]


def test_slots_outside_the_period_or_other_protocols_say_nothing():
    rows = steady_sessions(2, in_flight=2)
    cap = FakeCapture(nfs_messages=sequence_messages(rows, highest=1))
    late = saturation_slots.slot_use(cap, period(T0 + 10 * S, T0 + 12 * S), saturation.Params())
    assert late["slot_text"][0] is None
    ldap = saturation_slots.slot_use(cap, period(T0 + S, T0 + 3 * S, protocol="ldap"), saturation.Params())
    assert ldap["slot_text"][0] is None


def test_hostile_sequence_rows_are_quiet():
    p = saturation.Params()
    per = period(T0, T0 + S)
    # no nfs_messages frame, an empty one, one without the slot columns, nulls where the slots go
    assert saturation_slots.slot_use(FakeCapture(), per, p)["slot_text"][0] is None
    msgs = sequence_messages(steady_sessions(1, 1, dur_ns=S), highest=0)
    assert saturation_slots.slot_use(FakeCapture(nfs_messages=msgs.head(0)), per, p)["slot_text"][0] is None
    assert saturation_slots.slot_use(FakeCapture(nfs_messages=msgs.drop("slotid")), per, p)["slot_text"][0] is None
    nulls = msgs.with_columns(pl.lit(None, pl.String).alias("sessionid"))
    assert saturation_slots.slot_use(FakeCapture(nfs_messages=nulls), per, p)["slot_text"][0] is None
    # replies before their calls (clock steps) are dropped, not negative intervals
    back = msgs.with_columns(pl.when(pl.col("msg_type") == "REPLY").then(pl.col("ts_last_ns") - 10 * S)
                             .otherwise(pl.col("ts_last_ns")).alias("ts_last_ns"))
    assert saturation_slots.slot_use(FakeCapture(nfs_messages=back), per, p)["slot_text"][0] is None


def test_constructed_nfs41_ramp_is_saturation_with_full_slot_tables():
    rows = with_slots(sessions_ramp())
    assert max(r[3] for r in rows) == 3                     # 4 workers per session: slots 0-3
    f = saturation.detect(nfs_capture(rows, highest=3))
    assert f.height == 1 and f["resource"][0] == f"{SERVER}:2049 GETATTR"
    assert SEVERITY_RANK[f["severity"][0]] >= SEVERITY_RANK["medium"]
    text = f["explanation"][0]
    # closed-loop workers one per slot: past the knee every session has all 4 slots outstanding
    assert "kept all 4 of their slots busy" in text and "highest_slotid 3" in text and "exhausted" in text


def test_constructed_nfs41_ramp_without_sequence_rows_still_found():
    rows = with_slots(sessions_ramp())
    cap = nfs_capture(rows, highest=3)
    cap.set_frame("nfs_messages", cap.frame("nfs_messages").head(0))
    f = saturation.detect(cap)
    assert f.height == 1 and "slots" not in f["explanation"][0]


# -- the recorded ganesha ramp ------------------------------------------------------------------------
def _manifest(d: Path) -> dict[str, dict]:
    entries = tomllib.loads((d / "MANIFEST.toml").read_text())["capture"]
    return {e["file"]: e for e in entries if e["scenario"] == "nfs41-saturation"}


@pytest.mark.skipif(not RECORDED, reason="nfs41-saturation not recorded")
def test_real_ganesha_ramp_found_against_the_clients_logs():
    from analyzer import open_capture

    d = RECORDED[0]
    entry = _manifest(d)["nfs41-saturation.pcap"]
    m, exp = entry["measured"], entry["expect"][0]
    cap = open_capture(d / "nfs41-saturation.pcap")
    f = saturation.detect(cap)
    assert f.height == 1 and SEVERITY_RANK[f["severity"][0]] >= SEVERITY_RANK[exp["min_severity"]]
    assert f["resource"][0] == exp["resource"] and f["server"][0] == exp["server"]
    t_first = cap.packets["ts_ns"].min()
    assert abs((f["start_ns"][0] - t_first) / 1e9 - exp["start_s"]) <= exp["tolerance_s"]
    # the past-the-knee latency factor against the clients' own: median latency of the steps past the
    # knee over that of the steps before it (windows and steps cut the ramp differently: within 3x)
    lat = m["step_latency_median_ms"]
    k = m["step_sessions"].index(m["knee_sessions"])
    truth = sorted(lat[k + 1:] or lat[k:])[len(lat[k + 1:] or lat[k:]) // 2] / sorted(lat[:k])[len(lat[:k]) // 2]
    assert truth / 3 <= f["value"][0] <= truth * 3
    text = f["explanation"][0]
    granted = m["slots_granted"]
    assert "NFSv4.1 session slots" in text and f"highest_slotid {granted - 1}" in text
    # the clients' logs: the median session had all its slots busy this share of each step from the knee on
    # (steps and the detector's windows cut the ramp differently: clear cases only, either way near 0.5)
    full = m["slots_all_busy_share_from_knee"]
    assert f"all {granted} of their slots" in text or f"of {granted} slots" in text
    if full >= 0.65:
        assert f"kept all {granted} of their slots busy" in text and "exhausted" in text
    elif full <= 0.35:
        assert "the slot tables were exhausted" not in text


@pytest.mark.skipif(not RECORDED, reason="nfs41-saturation not recorded")
def test_real_ganesha_twin_is_quiet():
    from analyzer import open_capture

    assert saturation.detect(open_capture(RECORDED[0] / "nfs41-saturation-healthy.pcap")).height == 0


@pytest.mark.skipif(not RECORDED, reason="nfs41-saturation not recorded")
def test_real_ganesha_proof_draws_the_slots():
    from analyzer import open_capture
    from dashboards.proofs.base import proof_charts

    cap = open_capture(RECORDED[0] / "nfs41-saturation.pcap")
    f = saturation.detect(cap)
    charts = proof_charts(cap, f.row(0, named=True), f)
    titles = [str(c.to_dict().get("title", "")) for c, _ in charts]
    assert len(charts) == 3 and "NFSv4.1 session slots in use over time: 16 sessions" in titles[2]


# -- the recording client's sessions (samples/realkit/nfs_session.py) ---------------------------------
def _fake_nfs41_server(listener, held: int, target_after: int | None, done):
    """Answer SEQUENCE, PUTFH, GETATTR COMPOUNDs (RFC 5531 reply header, RFC 8881 SEQUENCE4resok): gather
    HELD calls (fewer when no more come for 0.2 s), then reply to them newest first (out of order: the
    client must match replies by xid); echo each call's slot and sequenceid; from the second
    batch on, say target_highest_slotid TARGET_AFTER."""
    import socket
    import struct

    conn, _ = listener.accept()
    buf, batch, batches = b"", [], 0

    def reply(call: bytes, target: int) -> bytes:
        xid = call[:4]
        p = 24
        for _ in range(2):                               # credential, verifier
            p += 8 + (struct.unpack_from(">I", call, p + 4)[0] + 3) // 4 * 4
        p += 4 + (struct.unpack_from(">I", call, p)[0] + 3) // 4 * 4 + 8   # tag, minorversion, count
        assert struct.unpack_from(">I", call, p)[0] == 53   # SEQUENCE first
        sid = call[p + 4:p + 20]
        seq, slot = struct.unpack_from(">II", call, p + 20)
        body = (xid + struct.pack(">IIIII", 1, 0, 0, 0, 0) + struct.pack(">III", 0, 0, 3)
                + struct.pack(">II", 53, 0) + sid + struct.pack(">IIIII", seq, slot, 3, target, 0)
                + struct.pack(">II", 22, 0) + struct.pack(">IIII", 9, 0, 0, 0))
        return struct.pack(">I", 0x80000000 | len(body)) + body

    conn.settimeout(0.2)
    while not done.is_set():
        try:
            chunk = conn.recv(65536)
        except socket.timeout:     # a batch short of HELD (the last calls): answer it
            chunk = b""
            held_now = len(batch) or held
        except OSError:
            break
        else:
            if not chunk:
                break
            held_now = held
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + (struct.unpack_from(">I", buf)[0] & 0x7FFFFFFF):
            n = struct.unpack_from(">I", buf)[0] & 0x7FFFFFFF
            batch.append(buf[4:4 + n])
            buf = buf[4 + n:]
        if batch and len(batch) >= held_now:
            target = 3 if batches == 0 or target_after is None else target_after
            for call in reversed(batch):
                conn.sendall(reply(call, target))
            batch, batches = [], batches + 1
    conn.close()


def _session_against_fake(held: int, target_after: int | None, callers: int, calls_each: int):
    import socket
    import sys
    import threading

    sys.path.insert(0, str(ROOT / "samples"))
    from realkit.nfs_session import Nfs41Session, SlotTable

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    done = threading.Event()
    srv = threading.Thread(target=_fake_nfs41_server, args=(listener, held, target_after, done), daemon=True)
    srv.start()
    s = Nfs41Session("127.0.0.1", "127.0.0.1", "t", slots=4, port=listener.getsockname()[1])
    s.connect()
    s.sessionid, s.slots = b"S" * 16, SlotTable(granted=4)
    statuses = []

    def caller():
        for _ in range(calls_each):
            statuses.append(s.getattr(b"\x01" * 8))
    threads = [threading.Thread(target=caller) for _ in range(callers)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    done.set()
    s.close()
    listener.close()
    return s, statuses


def test_session_keeps_requests_in_flight_on_its_slots_and_matches_replies_by_xid():
    # 8 callers, 4 slots: 4 calls at a time reach the server, answered newest first
    s, statuses = _session_against_fake(held=4, target_after=None, callers=8, calls_each=2)
    assert statuses == [0] * 16 and len(s.log) == 16
    assert s.slots.max_in_use == 4 and {r["slot"] for r in s.log} == {0, 1, 2, 3}
    for slot in range(4):   # each slot's sequenceids run 1, 2, 3 ... in send order (RFC 8881 §2.10.6.1)
        seqs = [r["sequenceid"] for r in sorted(s.log, key=lambda r: r["t_send"]) if r["slot"] == slot]
        assert seqs == list(range(1, len(seqs) + 1))
    assert sum(r["wait_slot_s"] > 0.0 for r in s.log) >= 1   # some callers waited for a free slot


def test_session_uses_only_the_slots_the_servers_target_allows():
    # the first batch of 4 is answered with target_highest_slotid 3, later ones with 1: slots 0-1 only
    s, statuses = _session_against_fake(held=2, target_after=1, callers=4, calls_each=4)
    assert statuses == [0] * 16
    # slots 2 and 3 are usable only until the second batch's replies lower the target, and are freed only by
    # the first batch's replies or by those: each is taken at most twice (its sequenceid at most 2), however
    # the threads were scheduled (send times are no proof of the order the slots were taken in); a client
    # that ignored the target would spread the 16 calls over all 4 slots
    high = [r for r in s.log if r["slot"] > 1]
    assert len(high) <= 4 and all(r["sequenceid"] <= 2 for r in high)
    assert sum(r["slot"] <= 1 for r in s.log) >= 12
