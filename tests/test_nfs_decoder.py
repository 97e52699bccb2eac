"""NFS bodies of the nfs decoder: NFSv3 (RFC 1813) handles, names and status, MOUNT, NFSv4 COMPOUND
(RFC 7530, RFC 8881) operations with per-operation status, OPEN/LOCK*/DELEGRETURN/SEQUENCE fields,
CB_COMPOUND on the fore channel, path resolution from handles and names seen earlier."""
from __future__ import annotations

import zlib

import polars as pl
import pytest

import rpc_builders as b
from rpc_builders import SERVER, call, record, reply, tcp_capture, u32, udp_capture

FH_ROOT, FH_DIR, FH_FILE = b"root-handle-0001", b"dir-handle-000002", b"file-handle-00003"
SESSION = bytes(range(16))
OPEN_SID = b.stateid(1, b"open-state12")
DELEG_SID = b.stateid(1, b"deleg-state1")


def frames(read_capture, data):
    cap = read_capture(data)
    return cap.frame("nfs_messages"), cap.frame("nfs_transactions")


def test_nfs3_lookup_handles_names_status_and_paths(read_capture):
    """MNT names the export root, LOOKUPs walk down from it, GETATTR on the result has the path."""
    m, tx = frames(read_capture, udp_capture([
        (True, call(1, 100005, 3, 1, b.opaque("/export"))),
        (False, reply(1, u32(0) + b.opaque(FH_ROOT) + u32(1) + u32(1))),  # fhstatus3, auth flavours
        (True, call(2, 100003, 3, 3, b.diropargs(FH_ROOT, "ckpt"))),
        (False, reply(2, b.lookup3_ok(FH_DIR))),
        (True, call(3, 100003, 3, 3, b.diropargs(FH_DIR, "step-100.pt"))),
        (False, reply(3, b.lookup3_ok(FH_FILE))),
        (True, call(4, 100003, 3, 1, b.opaque(FH_FILE))),
        (False, reply(4, u32(0))),
        (True, call(5, 100003, 3, 3, b.diropargs(FH_DIR, "missing"))),
        (False, reply(5, u32(2) + u32(0))),  # NFS3ERR_NOENT, no dir attributes
        (True, call(6, 100003, 3, 6, b.opaque(FH_FILE) + b.u64(4096) + u32(8192))),
    ], server=("10.0.0.2", 2049)))
    lookups = m.filter(pl.col("operation") == "LOOKUP")
    assert lookups.filter(pl.col("msg_type") == "CALL")["name"].to_list() == ["ckpt", "step-100.pt", "missing"]
    assert lookups["fh_hash"].to_list()[:4] == [zlib.crc32(FH_ROOT), zlib.crc32(FH_DIR), zlib.crc32(FH_DIR),
                                                zlib.crc32(FH_FILE)]
    assert lookups["fh"][0] == FH_ROOT.hex()
    t = tx.sort("request_frame")
    assert t["operation"].to_list() == ["MOUNT MNT", "LOOKUP", "LOOKUP", "GETATTR", "LOOKUP", "READ"]
    assert t["resource"].to_list() == ["/export", "/export/ckpt", "/export/ckpt/step-100.pt",
                                       "/export/ckpt/step-100.pt", "/export/ckpt/missing", "/export/ckpt/step-100.pt"]
    assert t["status"].to_list() == ["MNT3_OK", "NFS3_OK", "NFS3_OK", "NFS3_OK", "NFS3ERR_NOENT", None]
    assert t["is_error"].to_list() == [False, False, False, False, True, False]
    assert (t["offset"][5], t["length"][5], t["answered"][5]) == (4096, 8192, False)


def test_paths_without_the_mount_start_at_the_root_handle(read_capture):
    _, tx = frames(read_capture, udp_capture([
        (True, call(2, 100003, 3, 9, b.diropargs(FH_ROOT, "d") + u32(0) * 6)),  # MKDIR, empty sattr3
        (False, reply(2, u32(0) + u32(1) + b.opaque(FH_DIR))),
        (True, call(3, 100003, 3, 8, b.diropargs(FH_DIR, "f") + u32(0))),  # CREATE UNCHECKED
        (False, reply(3, u32(0) + u32(1) + b.opaque(FH_FILE))),
        (True, call(4, 100003, 3, 12, b.diropargs(FH_DIR, "f"))),  # REMOVE
    ]))
    root = f"fh:{zlib.crc32(FH_ROOT):08x}"
    assert tx.sort("request_frame")["resource"].to_list() == [f"{root}/d", f"{root}/d/f", f"{root}/d/f"]


def _v4_session():
    """A 4.1 client: open by name under PUTROOTFH, get a read delegation, lock, conflict, unlock."""
    seq = lambda n: b.op_sequence(SESSION, n, 0, 3)
    rseq = lambda n: b.res_sequence(SESSION, n, 0, 7, 5)
    return [
        (True, record(call(10, 100003, 4, 1, b.compound("open", 1, [
            seq(1), b.op_putrootfh(), b.op_lookup("ckpt"), b.op_open("model.bin", access=1), b.op_getfh(),
            b.op_getattr(0x10)])))),
        (False, record(reply(10, b.compound_res(0, "open", [
            rseq(1), b.res_plain(24), b.res_plain(15), b.res_open(OPEN_SID, deleg=1, deleg_sid=DELEG_SID),
            b.res_getfh(FH_FILE), b.res_getattr()])))),
        (True, record(call(11, 100003, 4, 1, b.compound("lock", 1, [
            seq(2), b.op_putfh(FH_FILE), b.op_lock(2, 0, 2**64 - 1, OPEN_SID)])))),
        (False, record(reply(11, b.compound_res(10010, "lock", [
            rseq(2), b.res_plain(22), b.res_lock_denied(12, 0, 100, 2, 0x9999, b"holder-owner")])))),
        (True, record(call(12, 100003, 4, 1, b.compound("", 1, [
            seq(3), b.op_putfh(b"stale-handle"), b.op_delegreturn(DELEG_SID)])))),
        (False, record(reply(12, b.compound_res(70, "", [rseq(3), b.res_plain(22, 70)])))),
    ]


def test_nfs4_compound_rows_and_per_operation_status(read_capture):
    m, _ = frames(read_capture, tcp_capture(_v4_session()))
    first = m.filter(pl.col("xid") == 10)
    calls, replies = first.filter(pl.col("msg_type") == "CALL"), first.filter(pl.col("msg_type") == "REPLY")
    ops = ["SEQUENCE", "PUTROOTFH", "LOOKUP", "OPEN", "GETFH", "GETATTR"]
    assert calls["operation"].to_list() == ops and replies["operation"].to_list() == ops
    assert calls["op_index"].to_list() == list(range(6)) and calls["op_count"].unique().to_list() == [6]
    assert calls["tag"].unique().to_list() == ["open"] and calls["minorversion"].unique().to_list() == [1]
    assert replies["status"].to_list() == ["NFS4_OK"] * 6 and m["decode_error"].null_count() == m.height
    o = calls.row(3, named=True)
    assert (o["name"], o["share_access"], o["share_deny"], o["open_type"], o["claim_type"], o["clientid"]) == \
        ("model.bin", 1, 0, "OPEN4_NOCREATE", "CLAIM_NULL", 0x1122)
    assert o["owner"] == b"open-owner-1".hex()
    r = replies.row(3, named=True)
    assert r["delegation_type"] == "OPEN_DELEGATE_READ" and r["stateid"] == b"open-state12".hex()
    s = calls.row(0, named=True)
    assert (s["sessionid"], s["sequenceid"], s["slotid"], s["highest_slotid"]) == (SESSION.hex(), 1, 0, 3)
    assert replies["highest_slotid"][0] == 7 and replies["target_highest_slotid"][0] == 5
    assert s["target_highest_slotid"] is None  # a call has none (RFC 8881 §18.46.1)
    assert replies["fh_hash"][4] == zlib.crc32(FH_FILE)
    lock = m.filter((pl.col("xid") == 11) & (pl.col("operation") == "LOCK"))
    c, r = lock.row(0, named=True), lock.row(1, named=True)
    assert (c["lock_type"], c["offset"], c["length"], c["owner"]) == ("WRITE_LT", 0, 2**64 - 1, b"lock-owner-1".hex())
    assert (r["status"], r["denied_offset"], r["denied_length"], r["denied_type"], r["clientid"], r["owner"]) == \
        ("NFS4ERR_DENIED", 0, 100, "WRITE_LT", 0x9999, b"holder-owner".hex())


def test_nfs4_transactions_keep_the_operations_that_matter(read_capture):
    _, tx = frames(read_capture, tcp_capture(_v4_session()))
    t = tx.sort("request_frame", "op_index")
    assert t["operation"].to_list() == ["LOOKUP", "OPEN", "LOCK", "DELEGRETURN"]
    assert t["resource"].to_list()[:3] == ["/ckpt", "/ckpt/model.bin", "/ckpt/model.bin"]
    assert t["status"].to_list() == ["NFS4_OK", "NFS4_OK", "NFS4ERR_DENIED", "NFS4ERR_STALE"]
    assert t["is_error"].to_list() == [False, False, True, True]
    o = t.row(1, named=True)
    assert (o["delegation_type"], o["sessionid"], o["slotid"], o["sequenceid"], o["highest_slotid"]) == \
        ("OPEN_DELEGATE_READ", SESSION.hex(), 0, 1, 7)
    lk = t.row(2, named=True)
    assert (lk["denied_owner"], lk["denied_clientid"], lk["denied_length"]) == (b"holder-owner".hex(), 0x9999, 100)
    assert t["stateid"][3] == b"deleg-state1".hex()


def test_cb_recall_on_the_fore_channel(read_capture):
    """RFC 8881 §2.10.3.1: the server's CB_COMPOUND on the client's connection; the client answers."""
    cb_prog = 0x40000000
    msgs = _v4_session()[:2] + [
        (False, record(call(77, cb_prog, 1, 1, b.cb_compound("", 1, 0, [
            b.cb_op_sequence(SESSION, 1, 0, 0), b.cb_op_recall(DELEG_SID, FH_FILE)])))),
        (True, record(reply(77, b.compound_res(0, "", [
            b.res_sequence(SESSION, 1, 0, 0, 0)[:0] + u32(11) + u32(0) + SESSION + u32(1) + u32(0) + u32(0) + u32(0),
            b.res_plain(4)])))),
    ]
    m, tx = frames(read_capture, tcp_capture(msgs))
    cb = m.filter(pl.col("xid") == 77)
    assert cb["operation"].to_list() == ["CB_SEQUENCE", "CB_RECALL"] * 2
    assert cb["is_callback"].all() and cb["from_client"].to_list() == [True, True, False, False]
    assert cb["status"].to_list()[2:] == ["NFS4_OK", "NFS4_OK"]
    assert cb["stateid"][1] == b"deleg-state1".hex() and cb["fh_hash"][1] == zlib.crc32(FH_FILE)
    rec = tx.filter(pl.col("operation") == "CB_RECALL").row(0, named=True)
    assert (rec["client"], rec["server"], rec["answered"], rec["is_callback"]) == (SERVER[0], "10.0.0.1", True, True)
    assert rec["resource"] == "/ckpt/model.bin" and rec["sessionid"] == SESSION.hex()


@pytest.mark.parametrize("cut", range(44, 140, 7))
def test_truncated_compounds_keep_the_rows_before_the_damage(read_capture, cut):
    msg = call(10, 100003, 4, 1, b.compound("t", 1, [b.op_sequence(SESSION, 1, 0, 0), b.op_putfh(FH_FILE),
                                                    b.op_lookup("x"), b.op_getfh()]))
    m, _ = frames(read_capture, udp_capture([(True, msg[:cut])]))
    assert m.height >= 1 and m["decode_error"].drop_nulls().to_list() == ["truncated"]


def test_absurd_operation_counts_are_refused(read_capture):
    msg = call(10, 100003, 4, 1, b.opaque("t") + u32(0) + u32(1_000_000) + b.op_putrootfh())
    m, _ = frames(read_capture, udp_capture([(True, msg)]))
    assert m.height == 1 and m["decode_error"][0] == "too many ops"


def test_an_operation_not_walked_stops_the_compound(read_capture):
    msg = call(10, 100003, 4, 1, b.compound("t", 0, [b.op_putrootfh(), u32(47) + b"\0" * 8, b.op_getfh()]))
    m, _ = frames(read_capture, udp_capture([(True, msg)]))
    assert m["operation"].to_list() == ["PUTROOTFH", "GETDEVICEINFO"]
    assert m["decode_error"].to_list() == [None, "op not decoded"]


def _nlm_lock(fh: bytes, owner: bytes, offset: int, length: int) -> bytes:
    """nlm4_lock (XNFS ch. 10): caller_name, fh, oh, svid, l_offset, l_len."""
    return b.opaque("node7") + b.opaque(fh) + b.opaque(owner) + u32(4242) + b.u64(offset) + b.u64(length)


def test_nlm4_lock_denied_and_test_holder(read_capture):
    nlm = ("10.0.0.2", 32803)
    cookie = b.opaque(b"\x01\x02")
    m, tx = frames(read_capture, udp_capture([
        (True, call(1, 100021, 4, 2, cookie + u32(0) + u32(1) + _nlm_lock(FH_FILE, b"owner-a", 0, 100)
                    + u32(0) + u32(3))),  # LOCK: block false, exclusive, lock, reclaim, state
        (False, reply(1, cookie + u32(1))),  # NLM4_DENIED
        (True, call(2, 100021, 4, 1, cookie + u32(1) + _nlm_lock(FH_FILE, b"owner-a", 0, 100))),  # TEST
        (False, reply(2, cookie + u32(1) + u32(1) + u32(99) + b.opaque(b"holder") + b.u64(10) + b.u64(20))),
        (True, call(3, 100021, 4, 4, cookie + _nlm_lock(FH_FILE, b"owner-a", 0, 100))),  # UNLOCK
        (False, reply(3, cookie + u32(0))),
    ], server=nlm))
    calls = m.filter(pl.col("msg_type") == "CALL")
    assert calls["operation"].to_list() == ["NLM LOCK", "NLM TEST", "NLM UNLOCK"]
    assert calls["fh_hash"].to_list() == [zlib.crc32(FH_FILE)] * 3 and calls["owner"][0] == b"owner-a".hex()
    assert calls["lock_type"].to_list() == ["WRITE_LT", "WRITE_LT", None]
    assert (calls["offset"][0], calls["length"][0]) == (0, 100)
    test = m.filter((pl.col("msg_type") == "REPLY") & (pl.col("xid") == 2)).row(0, named=True)
    assert (test["status"], test["denied_type"], test["denied_offset"], test["denied_length"], test["owner"]) == \
        ("NLM4_DENIED", "WRITE_LT", 10, 20, b"holder".hex())
    t = tx.sort("request_frame")
    assert t["status"].to_list() == ["NLM4_DENIED", "NLM4_DENIED", "NLM4_GRANTED"]
    assert t["is_error"].to_list() == [True, True, False]
