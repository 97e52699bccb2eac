"""toctou on tiny constructed SMB2 and LDAP transaction frames: realised races (lost update, stale use,
conflict the server caught), near misses, probability-only windows, resolution and client identity;
plus the synthetic capture's labelled check-then-use window."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.decoders import ldap
from analyzer.messages import TRANSPORTS
from analyzer.decoders.smb2_pairing import TRANSACTION_COLUMNS as SMB_TX
from analyzer.schema import polars_type
from detectors import toctou as tt
from detectors.base import FINDINGS_SCHEMA
from detectors.toctou_events import entries_in_windows
from fakes import FakeCapture
from synthetic import synthetic_detect, synthetic_labels

US = 1_000
MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S
SRV = "10.0.0.45"
SHARE = "\\\\10.0.0.45\\data"
CFG = SHARE + "\\config.json"
DC = "10.0.0.89"
DN = "cn=uid-pool,ou=counters,dc=corp,dc=example"


# -- SMB2 builders ----------------------------------------------------------------------------------------

_frame_no = [100]


def smb(client, op, t, *, port=None, flow=None, path=CFG, dt=300 * US, status="STATUS_SUCCESS", fid=None, **extra):
    _frame_no[0] += 2
    answered = status is not None
    row = dict(protocol="smb2", transport="tcp", flow=flow if flow is not None else int(client.split(".")[-1]),
               client=client, client_port=port or 40000 + int(client.split(".")[-1]), server=SRV, server_port=445,
               operation=op, resource=path, request_frame=_frame_no[0],
               response_frame=_frame_no[0] + 1 if answered else None, request_ts_ns=T0 + t,
               response_ts_ns=T0 + t + dt if answered else None, latency_ns=dt if answered else None,
               status=status, is_error=answered and status != "STATUS_SUCCESS", answered=answered, share=SHARE,
               path=path, fid_persistent=(fid or (hash((client, t)) & 0xFFFF, 1))[0],
               fid_volatile=(fid or (0, 1))[1], chain_index=0, pending_by_design=False, expects_response=True)
    row.update(extra)
    return row


def smb_capture(rows, *, resolution_ns=1.0, duration=None):
    schema = {c.name: polars_type(c) for c in SMB_TX}
    txf = pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema)
    last = duration if duration is not None else max(r["request_ts_ns"] for r in rows) - T0 + S
    packets = pl.DataFrame({"frame": [1, 99999], "ts_ns": [T0, T0 + last]},
                           schema={"frame": pl.UInt32, "ts_ns": pl.Int64})
    return FakeCapture(resolution_ns=resolution_ns, smb2_transactions=txf, packets=packets,
                       ldap_transactions=ldap_frame([])[0], ldap_messages=ldap_frame([])[1])


def check_open(client, t, **kw):
    kw.setdefault("share_access", 7)
    return smb(client, "CREATE", t, create_disposition="OPEN", create_action="OPENED", **kw)


def overwrite(client, t, **kw):
    return smb(client, "CREATE", t, create_disposition="OVERWRITE", create_action="OVERWRITTEN", share_access=7, **kw)


def rename_over(client, t, target="config.json", **kw):
    return smb(client, "SET_INFO", t, path=SHARE + "\\config.json.tmp", info_class_name="FileRenameInformation",
               target_name=target, **kw)


# -- LDAP builders ----------------------------------------------------------------------------------------

def _ptype(c):
    """The Polars type of a decoder schema column (analyzer.schema.Column)."""
    if c.polars is not None:
        return c.polars
    if c.name == "transport":
        return TRANSPORTS
    if c.dtype is object:
        return pl.String
    return pl.from_numpy(np.zeros(1, c.dtype)).to_series().dtype


def ldap_frame(rows):
    tx_schema = {c.name: _ptype(c) for c in ldap.TRANSACTION_COLUMNS}
    msg_schema = {c.name: _ptype(c) for c in ldap.MESSAGE_COLUMNS}
    txf = pl.DataFrame([{k: r.get(k) for k in tx_schema} for r in rows], schema=tx_schema)
    msgs = []
    for r in rows:
        if r.get("changes") is not None or r.get("controls") is not None:
            msgs.append(dict(transport="tcp", flow=r["flow"], message_id=r["message_id"], op=r["operation"],
                             frame_last=r["request_frame"], ts_last_ns=r["request_ts_ns"], dn=r["dn"],
                             changes=r.get("changes"), controls=r.get("controls")))
        for k, dn in enumerate(r.get("entry_dns", [])):
            msgs.append(dict(transport="tcp", flow=r["flow"], message_id=r["message_id"], op="searchResEntry",
                             frame_last=r["request_frame"] + 1, ts_last_ns=r["request_ts_ns"] + 10 * US + k, dn=dn))
    msgf = pl.DataFrame([{k: m.get(k) for k in msg_schema} for m in msgs], schema=msg_schema)
    return txf, msgf


_mid = [0]


def lreq(client, op, t, *, dn=DN, status="success", dt=400 * US, port=None, **extra):
    _mid[0] += 1
    _frame_no[0] += 2
    answered = status is not None
    row = dict(protocol="ldap", transport="tcp", flow=int(client.split(".")[-1]), client=client,
               client_port=port or 50000 + int(client.split(".")[-1]), server=DC, server_port=389, operation=op,
               resource=dn, request_frame=_frame_no[0], response_frame=_frame_no[0] + 1 if answered else None,
               request_ts_ns=T0 + t, response_ts_ns=T0 + t + dt if answered else None,
               latency_ns=dt if answered else None, status=status, answered=answered,
               is_error=answered and status not in ("success", "compareTrue", "compareFalse"),
               message_id=_mid[0], dn=dn, expects_response=True, entries=0)
    row.update(extra)
    return row


def read(client, t, attrs="gidNumber", **kw):
    return lreq(client, "searchRequest", t, scope="baseObject", filter="(objectClass=posixGroup)", attributes=attrs,
                entries=1, entry_dns=[kw.pop("dn", DN)], **kw)


def write(client, t, changes="replace(gidNumber)", **kw):
    return lreq(client, "modifyRequest", t, changes=changes, **kw)


def ldap_capture(rows, *, resolution_ns=1.0, duration=None):
    txf, msgf = ldap_frame(rows)
    last = duration if duration is not None else max(r["request_ts_ns"] for r in rows) - T0 + S
    packets = pl.DataFrame({"frame": [1, 99999], "ts_ns": [T0, T0 + last]},
                           schema={"frame": pl.UInt32, "ts_ns": pl.Int64})
    empty = pl.DataFrame(schema={c.name: polars_type(c) for c in SMB_TX})
    return FakeCapture(resolution_ns=resolution_ns, ldap_transactions=txf, ldap_messages=msgf,
                       smb2_transactions=empty, packets=packets)


def loud(f):
    return f.filter(pl.col("severity").is_in(["medium", "high", "critical"]))


def races(f):
    """The realised races (race_exposure summarises the windows that did not race)."""
    return f.filter(pl.col("kind") != "race_exposure")


# -- SMB2 ---------------------------------------------------------------------------------------------------

def test_smb_lost_update_fires_with_window_clients_and_evidence():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = [check_open(a, 0), smb(a, "QUERY_INFO", 1 * MS, info_class_name="FileStandardInformation"),
            overwrite(b, 150 * MS), smb(b, "WRITE", 152 * MS, file_offset=0, io_length=26),
            rename_over(a, 400 * MS)]
    f = tt.detect(smb_capture(rows), tt.Params())
    assert f.schema == FINDINGS_SCHEMA
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "lost_update" and r["severity"] == "medium"
    assert r["client"] == a and r["server"] == SRV and r["resource"] == CFG and r["clients"] == 2
    assert r["start_ns"] == T0 + 1 * MS and r["value"] == pytest.approx(399.0)  # from the latest check
    e = r["explanation"]
    assert f"client {a} checked {CFG} (QUERY_INFO FileStandardInformation" in e
    assert f"{b}'s CREATE (OVERWRITE)" in e and "and 1 more change by 1 client(s)" in e
    assert "SET_INFO FileRenameInformation -> config.json" in e and "a lost update" in e
    frames = set(r["evidence_frames"])
    assert {rows[1]["request_frame"], rows[2]["request_frame"], rows[4]["request_frame"]} <= frames


def test_smb_near_misses_are_silent():
    a, b = "10.0.4.1", "10.0.4.2"
    # the other client's change lands after the use
    after = [check_open(a, 0), rename_over(a, 400 * MS), overwrite(b, 500 * MS)]
    f = tt.detect(smb_capture(after), tt.Params())
    assert races(f).height == 0 and loud(f).height == 0
    # (the window that did not race is summarised: B changes config.json once in the capture's 1.5 s)
    assert f["kind"].to_list() == ["race_exposure"] and f["severity"][0] == "low"
    # ... or before the check
    before = [overwrite(b, 0), check_open(a, 100 * MS), rename_over(a, 400 * MS)]
    assert races(tt.detect(smb_capture(before), tt.Params())).height == 0
    # ... or it failed (sharing violation): nothing changed
    failed = [check_open(a, 0), overwrite(b, 150 * MS, status="STATUS_SHARING_VIOLATION"), rename_over(a, 400 * MS)]
    assert tt.detect(smb_capture(failed), tt.Params()).height == 0
    # ... or the same client changed it (its own update)
    own = [check_open(a, 0), overwrite(a, 150 * MS), rename_over(a, 400 * MS)]
    assert tt.detect(smb_capture(own), tt.Params()).height == 0
    # ... or the use comes later than max_window_ns after the check
    late = [check_open(a, 0), overwrite(b, 150 * MS), rename_over(a, 400 * MS)]
    assert tt.detect(smb_capture(late), tt.Params(max_window_ns=300 * MS)).height == 0


def test_smb_writes_to_disjoint_ranges_do_not_conflict():
    a, b = "10.0.4.1", "10.0.4.2"
    f1 = (1, 1)
    base = [check_open(a, 0, fid=f1), smb(a, "READ", 1 * MS, fid=f1, file_offset=0, io_length=4096)]
    disjoint = base + [smb(b, "WRITE", 50 * MS, fid=(2, 2), file_offset=8192, io_length=4096),
                       smb(a, "WRITE", 100 * MS, fid=f1, file_offset=0, io_length=4096)]
    assert races(tt.detect(smb_capture(disjoint), tt.Params())).height == 0
    overlap = base + [smb(b, "WRITE", 50 * MS, fid=(2, 2), file_offset=1000, io_length=100),
                      smb(a, "WRITE", 100 * MS, fid=f1, file_offset=0, io_length=4096)]
    f = races(tt.detect(smb_capture(overlap), tt.Params()))
    assert f["kind"].to_list() == ["lost_update"] and "READ" in f["explanation"][0]


def test_smb_stale_use_after_an_attribute_check_is_low():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = [check_open(a, 0), smb(a, "CLOSE", 200 * US), overwrite(b, 4 * MS),
            smb(b, "WRITE", 5 * MS, file_offset=0, io_length=7300), check_open(a, 9 * MS)]
    f = tt.detect(smb_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["stale_use"] and f["severity"].to_list() == ["low"]
    assert "opened it again for use" in f["explanation"][0]
    assert tt.detect(smb_capture(rows), tt.Params(stale_use_severity="medium"))["severity"][0] == "medium"
    # a client that read the content re-reads it afresh: not a stale use
    reread = [check_open(a, 0), smb(a, "READ", 1 * MS, file_offset=0, io_length=100), overwrite(b, 4 * MS),
              check_open(a, 9 * MS)]
    assert tt.detect(smb_capture(reread), tt.Params()).height == 0
    # a re-open a long time later is just another access
    assert tt.detect(smb_capture(rows[:4] + [check_open(a, 3 * S)]), tt.Params()).height == 0


def test_smb_failed_stale_write_is_conflict_detected():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = [check_open(a, 0, status="STATUS_OBJECT_NAME_NOT_FOUND"),
            smb(b, "CREATE", 50 * MS, create_disposition="CREATE", create_action="CREATED"),
            smb(a, "CREATE", 100 * MS, create_disposition="CREATE", status="STATUS_OBJECT_NAME_COLLISION")]
    f = tt.detect(smb_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["conflict_detected"] and f["severity"].to_list() == ["informational"]
    assert "STATUS_OBJECT_NAME_COLLISION" in f["explanation"][0]


def test_smb_paths_match_case_insensitively_and_by_rename_target():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = [check_open(a, 0, path=SHARE + "\\Config.JSON"), overwrite(b, 150 * MS, path="\\\\fs01\\data\\config.json",
                                                                     share="\\\\fs01\\data"),
            rename_over(a, 400 * MS, target="\\config.json")]
    f = tt.detect(smb_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["lost_update"]


def test_repeated_lost_updates_on_one_resource_are_high():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = []
    for k in range(5):
        t = k * S
        rows += [check_open(a, t), overwrite(b, t + 150 * MS), rename_over(a, t + 400 * MS)]
    f = tt.detect(smb_capture(rows), tt.Params())
    assert f.height == 5 and set(f["severity"]) == {"high"}
    assert "(5 on this resource in the capture)" in f["explanation"][0]
    assert set(tt.detect(smb_capture(rows), tt.Params(high_repeats=6))["severity"]) == {"medium"}


def test_order_within_the_timestamp_resolution_caps_at_low():
    a, b = "10.0.4.1", "10.0.4.2"
    rows = [check_open(a, 0), overwrite(b, 1 * US), rename_over(a, 400 * MS)]
    f = tt.detect(smb_capture(rows, resolution_ns=1000.0), tt.Params())
    assert f["kind"].to_list() == ["lost_update"] and f["severity"].to_list() == ["low"]
    assert "timestamp resolution" in f["explanation"][0]
    assert tt.detect(smb_capture(rows, resolution_ns=1.0), tt.Params())["severity"][0] == "medium"


def test_share_mode_protected_window_has_no_exposure():
    a, b = "10.0.4.1", "10.0.4.2"
    f1 = (5, 5)
    rows = []
    for k in range(10):  # A checks and writes under one open that denies write sharing; B writes between rounds
        t = k * S
        rows += [check_open(a, t, fid=f1, share_access=1), smb(a, "WRITE", t + 300 * MS, fid=f1, file_offset=0,
                                                              io_length=10),
                 smb(b, "WRITE", t + 600 * MS, fid=(9, 9), file_offset=0, io_length=10)]
    assert tt.detect(smb_capture(rows), tt.Params(min_report_probability=0.0)).height == 0


# -- LDAP ---------------------------------------------------------------------------------------------------

def test_ldap_lost_update_fires():
    a, b = "10.0.3.1", "10.0.3.2"
    rows = [read(b, 0), read(a, 2 * MS), write(b, 31 * MS), write(a, 33 * MS)]
    f = races(tt.detect(ldap_capture(rows), tt.Params()))
    assert f.height == 1
    r = f.row(0, named=True)
    assert r["kind"] == "lost_update" and r["severity"] == "medium" and r["client"] == a and r["server"] == DC
    assert r["resource"] == DN and r["start_ns"] == T0 + 2 * MS and r["value"] == pytest.approx(31.0)
    assert f"{b}'s modify replace(gidNumber)" in r["explanation"]


def test_ldap_write_of_attributes_the_check_did_not_read_is_no_race():
    a, b = "10.0.3.1", "10.0.3.2"
    rows = [read(a, 0, attrs="cn,mail"), write(b, 10 * MS), write(a, 30 * MS)]
    assert tt.detect(ldap_capture(rows), tt.Params()).height == 0  # not even a window
    # the other client changed another attribute than the one written: no conflict
    rows = [read(a, 0), write(b, 10 * MS, changes="replace(description)"), write(a, 30 * MS)]
    assert races(tt.detect(ldap_capture(rows), tt.Params())).height == 0
    # a search that asks for all attributes reads what is written
    rows = [read(a, 0, attrs=None), write(b, 10 * MS), write(a, 30 * MS)]
    assert races(tt.detect(ldap_capture(rows), tt.Params()))["kind"].to_list() == ["lost_update"]


def test_ldap_entries_returned_by_a_subtree_search_are_checked():
    a, b = "10.0.3.1", "10.0.3.2"
    user = "CN=Ann,OU=Users,DC=corp,DC=example"
    s = lreq(a, "searchRequest", 0, dn="DC=corp,DC=example", scope="wholeSubtree", filter="(uid=ann)",
             attributes="telephoneNumber", entries=1, entry_dns=[user])
    rows = [s, write(b, 10 * MS, dn="cn=ann, ou=users, dc=corp, dc=example", changes="replace(telephoneNumber)"),
            write(a, 30 * MS, dn=user, changes="replace(telephoneNumber)")]
    f = tt.detect(ldap_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["lost_update"] and f["resource"][0] == user


def test_ldap_conditional_modify_is_caught_or_verified():
    a, b = "10.0.3.1", "10.0.3.2"
    tas = "delete(gidNumber),add(gidNumber)"
    refused = [read(a, 0), write(b, 10 * MS, changes=tas), write(a, 30 * MS, changes=tas, status="noSuchAttribute")]
    f = tt.detect(ldap_capture(refused), tt.Params())
    assert f["kind"].to_list() == ["conflict_detected"] and f["severity"].to_list() == ["informational"]
    assert "noSuchAttribute" in f["explanation"][0]
    verified = [read(a, 0), write(b, 10 * MS, changes=tas), write(a, 30 * MS, changes=tas)]
    assert tt.detect(ldap_capture(verified), tt.Params()).height == 0
    asserted = [read(a, 0), write(b, 10 * MS), write(a, 30 * MS, controls="1.3.6.1.1.12")]
    assert tt.detect(ldap_capture(asserted), tt.Params()).height == 0


def test_ldap_compare_then_delete():
    a, b = "10.0.3.1", "10.0.3.2"
    rows = [lreq(a, "compareRequest", 0, attributes="member", status="compareTrue"),
            write(b, 10 * MS, changes="delete(member)"), lreq(a, "delRequest", 30 * MS)]
    f = tt.detect(ldap_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["lost_update"] and "delRequest" not in f["explanation"][0]


def test_probability_only_windows():
    a, b = "10.0.3.1", "10.0.3.2"
    rows = []
    # A reads then writes the counter 20 times with a 50 ms window; B changes it 10 times, always
    # outside A's windows: no realised race, but a measurable chance per window
    for k in range(20):
        t = k * 500 * MS
        rows += [read(a, t), write(a, t + 50 * MS)]
        if k % 2:
            rows.append(write(b, t + 250 * MS, changes="replace(gidNumber)"))
    duration = 10 * S
    f = tt.detect(ldap_capture(rows, duration=duration), tt.Params())
    assert f["kind"].to_list() == ["race_exposure"]
    r = f.row(0, named=True)
    p = 1 - math.exp(-(10 / 10.0) * 0.05)   # 10 changes by others in 10 s, 50 ms windows
    assert r["value"] == pytest.approx(p, rel=1e-3) and r["severity"] == "informational" and r["client"] == a
    assert "none seen" in r["explanation"] and r["metric"] == "race_probability"
    assert tt.detect(ldap_capture(rows, duration=duration), tt.Params(low_probability=0.04))["severity"][0] == "low"
    flagged = tt.detect(ldap_capture(rows, duration=duration), tt.Params(low_probability=0.01, high_probability=0.04))
    assert flagged["severity"].to_list() == ["medium"]
    assert tt.detect(ldap_capture(rows, duration=duration), tt.Params(min_report_probability=0.1)).height == 0


def test_clients_sharing_an_address_are_told_apart_by_port():
    host = "10.0.3.1"
    # two processes on one host, each with its own connection and requests outstanding at once
    p1 = dict(port=50001)
    p2 = dict(port=50002)
    rows = [read(host, 0, **p1), read(host, 100 * US, **p2), write(host, 31 * MS, **p2),
            write(host, 33 * MS, **p1)]
    for r, flow in zip(rows, (1, 2, 2, 1)):
        r["flow"] = flow
    f = races(tt.detect(ldap_capture(rows), tt.Params()))
    assert f["kind"].to_list() == ["lost_update"]
    assert f["client"][0] == "10.0.3.1:50001" and f["client_identity"][0] == "address+port"


def test_responses_not_captured_is_informational():
    rows = [lreq("10.0.3.1", "searchRequest", k * MS, scope="baseObject", status=None) for k in range(25)]
    f = tt.detect(ldap_capture(rows), tt.Params())
    assert f["kind"].to_list() == ["vantage"] and f["severity"].to_list() == ["informational"]


def test_empty_inputs():
    assert tt.detect(FakeCapture(), tt.Params()).height == 0
    f = tt.detect(ldap_capture([read("10.0.3.1", 0)]), tt.Params())
    assert f.height == 0 and f.schema == FINDINGS_SCHEMA


# -- synthetic capture -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_synthetic_toctou_label_is_found(synthetic_capture):
    out = synthetic_capture
    labels = synthetic_labels(out, tt.NAME)
    assert labels
    f = synthetic_detect(out, tt)
    for lab in labels:
        hit = f.filter((pl.col("start_ns") - lab["start_ns"]).abs() < 5 * MS)
        assert hit.height == 1, f.select("start_ns", "kind", "explanation").to_dicts()
        h = hit.row(0, named=True)
        # the label's "use" re-opens the checked file after the other client overwrote it
        assert h["kind"] == "stale_use" and h["client"] == lab["parameters"]["checker"]
        assert lab["parameters"]["modifier"] in h["explanation"]
        assert h["resource"].lower() == lab["resource"].lower()
    assert loud(f).height == 0  # the rest of the synthetic traffic is ordinary


# -- odd input never raises -------------------------------------------------------------------------------

def test_nulls_in_any_column_never_raise():
    from analyzer import open_capture

    for sample, names in (("smb2-toctou.pcap", ("smb2_transactions",)),
                          ("ldap-toctou.pcapng", ("ldap_transactions", "ldap_messages"))):
        with open_capture(ROOT / "samples" / sample) as cap:
            frames = {n: cap.frame(n) for n in ("smb2_transactions", "ldap_transactions", "ldap_messages")}
            packets = cap.packets.select("frame", "ts_ns")
        for name in names:
            for col in frames[name].columns:
                broken = dict(frames)
                broken[name] = frames[name].with_columns(pl.lit(None, frames[name].schema[col]).alias(col))
                f = tt.detect(FakeCapture(packets=packets, **broken), tt.Params())
                assert f.schema == FINDINGS_SCHEMA, (name, col)


def test_smb3_multichannel_session_is_one_client_and_its_own_handle_is_never_stale():
    """zeek/smb/smb3_multichannel.pcap, frames 1003/1049/1053 (all SessionId 0x00001c0010000049, tree
    1): one SMB 3 session on two connections of one host (ports 57095 and 57093, outstanding at once).
    On 57095 a CREATE (OPEN) gets NAME_NOT_FOUND, on 57093 a CREATE (OVERWRITE_IF) creates the file,
    and a SET_INFO on 57095 goes through the handle that create returned: no race (was a medium
    lost_update, the two channels taken for two clients)."""
    host, sid, handle = "172.17.0.184", 0x00001C0010000049, (0x51, 0x52)
    ch1, ch2 = dict(port=57095, flow=1, session_id=sid), dict(port=57093, flow=2, session_id=sid)
    path = SHARE + "\\14twain_32.enc"
    base = [smb(host, "READ", 0, path=SHARE + "\\other", dt=5 * MS, **ch1),  # overlap: port-split identity
            smb(host, "READ", 1 * MS, path=SHARE + "\\other2", dt=5 * MS, **ch2)]
    probe = smb(host, "CREATE", 10 * MS, path=path, status="STATUS_OBJECT_NAME_NOT_FOUND", create_disposition="OPEN",
                **ch1)
    create = smb(host, "CREATE", 90 * MS, path=path, create_disposition="OVERWRITE_IF", create_action="CREATED",
                 share_access=7, fid=handle, **ch2)
    use = smb(host, "SET_INFO", 93 * MS, path=path, info_class_name="FileAllocationInformation", fid=handle, **ch1)
    rows = [*base, probe, create, use]
    assert races(tt.detect(smb_capture(rows), tt.Params())).height == 0
    # each rule alone clears it: distinct sessions but the use goes through the creator's handle ...
    other = [{**r, "session_id": sid + (r is create)} for r in rows]
    assert races(tt.detect(smb_capture(other), tt.Params())).height == 0
    # ... one session on two channels, through a handle of its own
    own = [*rows[:-1], {**use, "fid_persistent": 0x99, "fid_volatile": 0x98}]
    assert races(tt.detect(smb_capture(own), tt.Params())).height == 0
    # and the same interleaving by two sessions through different handles is the lost update
    both = [{**r, "session_id": sid + (r is create)} for r in own]
    f = races(tt.detect(smb_capture(both), tt.Params()))
    assert f["kind"].to_list() == ["lost_update"] and f["client"][0] == f"{host}:57095"


def test_other_clients_are_counted_up_to_max_counted_clients():
    """The other clients of a realised race are counted up to ``max_counted_clients`` (16 by default,
    a documented parameter, no longer a silent cap inside the scan): 20 writers inside one window give
    clients = 1 + 16 and "by 16 client(s)"; a larger cap counts all 20, a smaller one fewer; the cap
    changes nothing else about the findings."""
    a = "10.0.4.1"
    writers = [f"10.0.5.{k}" for k in range(1, 21)]
    rows = [check_open(a, 0), *[overwrite(w, (10 + k) * MS) for k, w in enumerate(writers)], rename_over(a, 400 * MS)]
    cap = smb_capture(rows)

    def lost(**kw):
        f = tt.detect(cap, tt.Params(**kw))
        return f, f.filter(pl.col("kind") == "lost_update").row(0, named=True)

    default, r = lost()
    assert tt.Params().max_counted_clients == 16
    assert r["clients"] == 1 + 16 and "and 19 more changes by 16 client(s)" in r["explanation"]
    wide, w = lost(max_counted_clients=64)
    assert w["clients"] == 1 + 20 and "and 19 more changes by 20 client(s)" in w["explanation"]
    narrow, n = lost(max_counted_clients=1)
    assert n["clients"] == 2 and "by 1 client(s)" in n["explanation"]
    same = ["finding_id", "kind", "severity", "start_ns", "end_ns", "value", "threshold", "evidence_frames"]
    assert default.select(same).equals(wide.select(same)) and default.select(same).equals(narrow.select(same))


# -- a search's entries, found by time within its message id --------------------------------------

KEYS = ["_t", "flow", "message_id"]
# (flow, message id, request time, response time or None): few of each, so ids repeat, and windows overlap
SEARCHES = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 40),
                              st.none() | st.integers(0, 40)), max_size=25)
ENTRIES = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 40)), max_size=40)


def _search_frame(rows) -> pl.DataFrame:
    return pl.DataFrame({"_r": pl.Series(range(len(rows)), dtype=pl.UInt32), "_t": ["tcp"] * len(rows),
                         "flow": [r[0] for r in rows], "message_id": [r[1] for r in rows],
                         "ts": [r[2] for r in rows], "resp_ts": [r[3] for r in rows]},
                        schema_overrides={"_t": pl.String, "flow": pl.Int64, "message_id": pl.Int64, "ts": pl.Int64,
                                          "resp_ts": pl.Int64})


def _entry_frame(rows) -> pl.DataFrame:
    return pl.DataFrame({"_t": ["tcp"] * len(rows), "flow": [r[0] for r in rows], "message_id": [r[1] for r in rows],
                         "_ets": [r[2] for r in rows], "_edn": [f"cn=e{k}" for k in range(len(rows))]},
                        schema_overrides={"_t": pl.String, "flow": pl.Int64, "message_id": pl.Int64,
                                          "_ets": pl.Int64, "_edn": pl.String})


@settings(max_examples=300, deadline=None)
@given(searches=SEARCHES, entries=ENTRIES)
def test_a_searchs_entries_are_those_of_its_message_id_within_its_window(searches, entries):
    """The rule is the inner join on the keys filtered by time (every search whose window holds the
    entry, overlapping windows of one id included); the as-of runs give exactly its rows."""
    s, e = _search_frame(searches), _entry_frame(entries)
    want = s.join(e, on=KEYS, how="inner").filter(
        (pl.col("_ets") >= pl.col("ts")) & (pl.col("_ets") <= pl.col("resp_ts").fill_null(pl.col("_ets"))))
    got = entries_in_windows(s, e, KEYS)
    assert sorted(got.rows()) == sorted(want.select("_r", "_ets", "_edn").rows())


def test_a_message_id_reused_by_every_search_of_a_connection_pairs_each_entry_once():
    """A client that numbers every search 1 on a long connection: 3,000 searches of 4 entries each,
    one after the other. Joined on the keys first, that was 3,000 x 12,000 rows before the time filter
    (36M); the answer, and the rows made, are 12,000."""
    n, per = 3_000, 4
    searches = [(0, 1, 10 * k, 10 * k + 9) for k in range(n)]
    entries = [(0, 1, 10 * k + 1 + j) for k in range(n) for j in range(per)]
    got = entries_in_windows(_search_frame(searches), _entry_frame(entries), KEYS)
    assert got.height == n * per
    assert got.group_by("_r").len()["len"].unique().to_list() == [per]
    assert (got["_ets"] // 10 == got["_r"].cast(pl.Int64)).all()  # each entry with its own search
