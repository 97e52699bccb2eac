"""SMB2/3 decoder (analyzer.decoders.smb2): byte-literal fixtures for every command and break form,
compounds, transform/compression/SMB1 recognition, malformed variants, a Hypothesis test, and the
pairing of transactions and breaks on small constructed exchanges.

Every fixture is spelled out with ``struct`` in the layout of its MS-SMB2 section, so a test reads
as the spec does.
"""
from __future__ import annotations

import struct

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.schema import polars_type
from analyzer.decoders import smb2
from analyzer.decoders import smb2_kernel as kern
from analyzer.decoders.smb2_pairing import Params, break_frame, pair_transactions
from analyzer.messages import TRANSPORTS, MessageSet

# --- builders (MS-SMB2 2.2.1 ff.) -----------------------------------------------------------------

SERVER_TO_REDIR, ASYNC, RELATED, SIGNED, DFS, REPLAY = 0x1, 0x2, 0x4, 0x8, 0x10000000, 0x20000000
UNSOLICITED = 0xFFFFFFFFFFFFFFFF
ALL_ONES_FID = (UNSOLICITED, UNSOLICITED)


def u16(s: str) -> bytes:
    return s.encode("utf-16le")


def header(cmd, mid, *, flags=0, status=0, nxt=0, tid=1, sid=0x1122334455667788, credits=1, charge=1,
           async_id=None, signature=b"\0" * 16):
    """MS-SMB2 2.2.1.1 (async, when async_id is given) / 2.2.1.2 (sync)."""
    if async_id is not None:
        flags |= ASYNC
        tail = struct.pack("<Q", async_id)
    else:
        tail = struct.pack("<II", 0xFEFF, tid)
    return (struct.pack("<4sHHIHHIIQ", b"\xfeSMB", 64, charge, status, cmd, credits, flags, nxt, mid)
            + tail + struct.pack("<Q", sid) + signature)


def resp(cmd, mid, status=0, **kw):
    return header(cmd, mid, flags=SERVER_TO_REDIR | kw.pop("flags", 0), status=status, **kw)


def error_body():
    return struct.pack("<HBBI", 9, 0, 0, 0) + b"\0"  # 2.2.2


def fid(p, v):
    return struct.pack("<QQ", p, v)


def create_context(name: bytes, data: bytes, last=True) -> bytes:
    """2.2.13.2: Next, NameOffset, NameLength, Reserved, DataOffset, DataLength, name, pad, data."""
    name_off = 16
    data_off = (name_off + len(name) + 7) // 8 * 8
    body = bytearray(struct.pack("<IHHHHI", 0, name_off, len(name), 0, data_off if data else 0, len(data)))
    body += name + b"\0" * (data_off - name_off - len(name)) + data
    body += b"\0" * (-len(body) % 8)
    if not last:
        struct.pack_into("<I", body, 0, len(body))
    return bytes(body)


def contexts(*items) -> bytes:
    return b"".join(create_context(n, d, last=(k == len(items) - 1)) for k, (n, d) in enumerate(items))


def lease_v1(key: bytes, state: int, flags=0) -> bytes:
    return key + struct.pack("<IIQ", state, flags, 0)  # 2.2.13.2.8


def lease_v2(key: bytes, state: int, parent: bytes, epoch: int, flags=4) -> bytes:
    return key + struct.pack("<IIQ", state, flags, 0) + parent + struct.pack("<HH", epoch, 0)  # 2.2.13.2.10


KEY = bytes(range(16))
KEY_GUID = "03020100-0504-0706-0809-0a0b0c0d0e0f"  # Wireshark's FT_GUID rendering
PARENT = bytes(range(16, 32))


def create_request(name: str, *, oplock=9, access=0x12019F, attrs=0x80, share=7, disposition=1,
                   options=0x40, ctx=b"") -> bytes:
    """2.2.13: the name at 0x78 (64 + 56), contexts 8-aligned after it."""
    n = u16(name)
    name_off = 64 + 56
    buf = n + b"\0" * (-len(n) % 8) if n else b"\0" * 8
    ctx_off = name_off + len(buf) if ctx else 0
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, oplock, 2, 0, 0, access, attrs, share, disposition,
                       options, name_off, len(n), ctx_off, len(ctx)) + buf + ctx


def create_response(p, v, *, oplock=9, action=1, eof=1234, attrs=0x20, ctx=b"") -> bytes:
    """2.2.14: contexts right after the 88-byte fixed part."""
    ctx_off = 64 + 88 if ctx else 0
    return struct.pack("<HBBIQQQQQQII", 89, oplock, 0, action, 1, 2, 3, 4, 4096, eof, attrs, 0) + fid(p, v) + \
        struct.pack("<II", ctx_off, len(ctx)) + ctx


def chain(*elements: bytes) -> bytes:
    """A compound (2.2.1.2 NextCommand): each element padded to 8 bytes, NextCommand patched in."""
    out = bytearray()
    for k, el in enumerate(elements):
        el = bytearray(el)
        if k < len(elements) - 1:
            el += b"\0" * (-len(el) % 8)
            struct.pack_into("<I", el, 20, len(el))
        out += el
    return bytes(out)


def message_set(messages, *, frames=None, ts=None, flows=None, from_client=None, wire=None):
    """A MessageSet over the concatenated messages: frame i+1 at i ms unless given."""
    n = len(messages)
    frames = frames or list(range(1, n + 1))
    ts = ts or [f * 1_000_000 for f in frames]
    flows = flows or [0] * n
    from_client = from_client if from_client is not None else [
        not (len(m) >= 20 and m[0] == 0xFE and struct.unpack_from("<I", m, 16)[0] & 1) for m in messages]
    offsets = np.cumsum([0] + [len(m) for m in messages[:-1]]).tolist() if n else []
    client = [f"10.0.0.{10 + fl}" for fl in flows]
    cport = [50000 + fl for fl in flows]
    frame = pl.DataFrame({
        "transport": pl.Series(["tcp"] * n).cast(TRANSPORTS),
        "flow": pl.Series(flows, dtype=pl.UInt32),
        "from_client": pl.Series(from_client, dtype=pl.Boolean),
        "src": [c if fc else "10.0.0.1" for c, fc in zip(client, from_client)],
        "dst": ["10.0.0.1" if fc else c for c, fc in zip(client, from_client)],
        "sport": pl.Series([p if fc else 445 for p, fc in zip(cport, from_client)], dtype=pl.UInt16),
        "dport": pl.Series([445 if fc else p for p, fc in zip(cport, from_client)], dtype=pl.UInt16),
        "frame_first": pl.Series(frames, dtype=pl.UInt32), "frame_last": pl.Series(frames, dtype=pl.UInt32),
        "ts_first_ns": pl.Series(ts, dtype=pl.Int64), "ts_last_ns": pl.Series(ts, dtype=pl.Int64),
        "offset": pl.Series(offsets, dtype=pl.Int64),
        "length": pl.Series([len(m) for m in messages], dtype=pl.UInt32),
        "wire_length": pl.Series(wire or [len(m) for m in messages], dtype=pl.UInt32),
        "complete": pl.Series([True] * n if wire is None else [w == len(m) for w, m in zip(wire, messages)]),
    })
    buf = np.frombuffer(b"".join(messages) or b"\0", np.uint8).copy()
    return MessageSet(frame, buf)


def decode(*messages, **kw) -> pl.DataFrame:
    return smb2.decode_messages([message_set(list(messages), **kw)])


def one(*messages, **kw) -> dict:
    df = decode(*messages, **kw)
    assert df.height == 1, df
    return df.row(0, named=True)


# --- header ------------------------------------------------------------------------------------------

def test_sync_request_header():
    sig = bytes(range(1, 17))
    r = one(header(13, 42, flags=SIGNED | DFS | REPLAY | 0x30, tid=7, sid=0xAABBCCDD00000005, credits=31,
                   charge=2, signature=sig) + struct.pack("<HH", 4, 0))
    assert r["kind"] == "smb2" and r["command"] == "ECHO" and r["command_code"] == 13
    assert r["is_response"] is False and r["status"] is None and r["status_code"] is None
    assert r["message_id"] == 42 and r["tree_id"] == 7 and r["async_id"] is None
    assert r["session_id"] == 0xAABBCCDD00000005
    assert r["credit_charge"] == 2 and r["credit_request"] == 31 and r["credit_grant"] is None
    assert r["channel_sequence"] == 0
    assert r["is_signed"] and r["has_signature"] and r["is_dfs"] and r["is_replay"] and r["priority"] == 3
    assert not r["is_async"] and not r["is_related"]
    assert r["structure_size"] == 4 and r["decode_error"] is None
    assert r["chain_index"] == 0 and r["chain_offset"] == 0


def test_async_response_header_and_unknown_status():
    r = one(resp(8, 9, status=0x103, async_id=0x1234567890ABCDEF, credits=5) + error_body())
    assert r["is_response"] and r["is_async"] and r["async_id"] == 0x1234567890ABCDEF and r["tree_id"] is None
    assert r["status"] == "STATUS_PENDING" and r["credit_grant"] == 5 and r["credit_request"] is None
    assert r["error_body"] is True and r["io_length"] is None
    assert one(resp(8, 9, status=0xC0DEC0DE) + error_body())["status"] == "0xc0dec0de"
    assert one(resp(5, 9, status=0xC0000043) + error_body())["status"] == "STATUS_SHARING_VIOLATION"
    assert not one(header(13, 1) + struct.pack("<HH", 4, 0))["has_signature"]


# --- commands ------------------------------------------------------------------------------------------

def test_negotiate():
    dialects = [0x0202, 0x0210, 0x0300, 0x0302, 0x0311]
    req = header(0, 0) + struct.pack("<HHHHI16sQ", 36, len(dialects), 1, 0, 0x7F, b"G" * 16, 0) + \
        struct.pack(f"<{len(dialects)}H", *dialects)
    r = one(req)
    assert r["command"] == "NEGOTIATE" and r["dialect_count"] == 5 and r["dialects"] == dialects
    assert r["capabilities"] == 0x7F and r["dialect"] is None
    body = struct.pack("<HHHH16sIIIIQQHHI", 65, 1, 0x0311, 0, b"S" * 16, 0x2F, 1 << 20, 1 << 20, 1 << 20, 0, 0,
                       128, 0, 0) + b"\0"
    r = one(resp(0, 0) + body)
    assert r["dialect"] == 0x0311 and r["capabilities"] == 0x2F and r["dialects"] is None


def test_session_setup():
    r = one(header(1, 2, sid=0) + struct.pack("<HBBIIHHQ", 25, 1, 1, 0, 0, 88, 0, 0))
    assert r["command"] == "SESSION_SETUP" and r["session_flags"] == 1
    # STATUS_MORE_PROCESSING_REQUIRED: a regular response body (2.2.6), not an error
    r = one(resp(1, 2, status=0xC0000016, sid=0x55) + struct.pack("<HHHH", 9, 0, 72, 0) + b"\0")
    assert r["status"] == "STATUS_MORE_PROCESSING_REQUIRED" and r["error_body"] is None
    assert r["session_flags"] == 0 and r["session_id"] == 0x55
    r = one(resp(1, 3, status=0) + struct.pack("<HHHH", 9, 1, 72, 0) + b"\0")
    assert r["session_flags"] == 1  # SMB2_SESSION_FLAG_IS_GUEST
    r = one(resp(1, 3, status=0xC000006D) + error_body())
    assert r["status"] == "STATUS_LOGON_FAILURE" and r["error_body"] and r["session_flags"] is None


def test_tree_connect():
    path = u16("\\\\fs1\\Share$")
    r = one(header(3, 4, tid=0) + struct.pack("<HHHH", 9, 0, 72, len(path)) + path)
    assert r["command"] == "TREE_CONNECT" and r["tree"] == "\\\\fs1\\Share$"
    r = one(resp(3, 4, tid=9) + struct.pack("<HBBIII", 16, 1, 0, 0x30, 0, 0x1F01FF))
    assert r["share_type"] == "disk" and r["share_flags"] == 0x30 and r["tree_id"] == 9
    assert one(resp(3, 4) + struct.pack("<HBBIII", 16, 2, 0, 0, 0, 0))["share_type"] == "pipe"


def test_create_request_with_contexts():
    ctx = contexts((b"RqLs", lease_v2(KEY, 7, PARENT, 3)), (b"DH2Q", b"\0" * 32), (b"MxAc", b""),
                   (b"QFid", b""))
    r = one(header(5, 10) + create_request("dir\\report.xlsx", oplock=0xFF, disposition=3, options=0x1040,
                                           ctx=ctx))
    assert r["command"] == "CREATE" and r["filename"] == "dir\\report.xlsx"
    assert r["oplock_level"] == 0xFF and r["oplock"] == "lease"
    assert r["desired_access"] == 0x12019F and r["file_attributes"] == 0x80 and r["share_access"] == 7
    assert r["create_disposition"] == "OPEN_IF" and r["create_options"] == 0x1040
    assert r["create_contexts"] == "RqLs,DH2Q,MxAc,QFid"
    assert r["lease_key"] == KEY_GUID and r["lease_state"] == 7 and r["lease_version"] == 2
    assert r["lease_flags"] == 4 and r["lease_epoch"] == 3
    assert r["parent_lease_key"] == "13121110-1514-1716-1819-1a1b1c1d1e1f"
    assert r["decode_error"] is None


def test_create_request_lease_v1_and_plain():
    r = one(header(5, 10) + create_request("a.txt", oplock=0xFF, ctx=contexts((b"RqLs", lease_v1(KEY, 3)))))
    assert r["lease_version"] == 1 and r["lease_state"] == 3 and r["parent_lease_key"] is None
    assert r["lease_epoch"] is None
    r = one(header(5, 10) + create_request("", oplock=1))
    assert r["filename"] == "" and r["oplock"] == "level2" and r["create_contexts"] is None
    assert r["lease_key"] is None


def test_create_response():
    ctx = contexts((b"RqLs", lease_v2(KEY, 5, b"\0" * 16, 4, flags=0)), (b"MxAc", b"\0" * 8))
    r = one(resp(5, 10) + create_response(0x11, 0x22, oplock=0xFF, action=2, eof=1 << 40, ctx=ctx))
    assert r["fid_persistent"] == 0x11 and r["fid_volatile"] == 0x22
    assert r["oplock"] == "lease" and r["create_action"] == "CREATED" and r["end_of_file"] == 1 << 40
    assert r["file_attributes"] == 0x20 and r["lease_key"] == KEY_GUID and r["lease_state"] == 5
    assert r["create_contexts"] == "RqLs,MxAc"
    r = one(resp(5, 10, status=0xC0000034) + error_body())
    assert r["error_body"] and r["fid_persistent"] is None and r["status"] == "STATUS_OBJECT_NAME_NOT_FOUND"


def test_file_operations():
    f = fid(0xA, 0xB)
    rows = decode(
        header(6, 1) + struct.pack("<HHI", 24, 1, 0) + f,                                          # CLOSE 2.2.15
        resp(6, 1) + struct.pack("<HHIQQQQQQII", 60, 1, 0, 1, 2, 3, 4, 8192, 77, 0x20, 0),        # 2.2.16
        header(7, 2) + struct.pack("<HHI", 24, 0, 0) + f,                                          # FLUSH 2.2.17
        header(8, 3) + struct.pack("<HBBIQ", 49, 0, 0, 65536, 1 << 33) + f + b"\0" * 17,          # READ 2.2.19
        resp(8, 3) + struct.pack("<HBBIII", 17, 80, 0, 4096, 0, 0) + b"x",                          # 2.2.20
        header(9, 4) + struct.pack("<HHIQ", 49, 112, 10, 5) + f + struct.pack("<IIHHI", 0, 0, 0, 0, 0) + b"0123456789",
        resp(9, 4) + struct.pack("<HHIIHH", 17, 0, 10, 0, 0, 0),                                   # 2.2.22
        header(10, 5) + struct.pack("<HHI", 48, 2, 0) + f + struct.pack("<QQII", 100, 10, 2, 0)
        + struct.pack("<QQII", 200, 10, 0x12, 0),                                                  # LOCK 2.2.26
        header(11, 6) + struct.pack("<HHI", 57, 0, 0x0011C017) + f
        + struct.pack("<IIIIIIII", 0, 0, 0, 0, 0, 1024, 1, 0),
        resp(11, 6) + struct.pack("<HHI", 49, 0, 0x00140204) + f + struct.pack("<IIIIII", 0, 0, 0, 0, 0, 0),
        header(14, 7) + struct.pack("<HBBI", 33, 37, 1, 0) + f + struct.pack("<HHI", 96, 10, 65536) + u16("*.doc"),
        header(15, 8) + struct.pack("<HHI", 32, 1, 4096) + f + struct.pack("<II", 0x17, 0),      # CHANGE_NOTIFY
        header(16, 9) + struct.pack("<HBBIHHIII", 41, 1, 34, 4096, 0, 0, 0, 0, 0) + f,           # QUERY_INFO
        header(12, 10, async_id=77) + struct.pack("<HH", 4, 0),                                    # CANCEL
        header(2, 11) + struct.pack("<HH", 4, 0),                                                   # LOGOFF
        header(4, 12) + struct.pack("<HH", 4, 0),                                                   # TREE_DISCONNECT
    )
    by = {(r["command"], r["is_response"]): r for r in rows.iter_rows(named=True)}
    assert by[("CLOSE", False)]["fid_persistent"] == 0xA and by[("CLOSE", False)]["fid_volatile"] == 0xB
    assert by[("CLOSE", True)]["end_of_file"] == 77 and by[("CLOSE", True)]["file_attributes"] == 0x20
    assert by[("FLUSH", False)]["fid_volatile"] == 0xB
    rd = by[("READ", False)]
    assert rd["file_offset"] == 1 << 33 and rd["io_length"] == 65536 and rd["fid_persistent"] == 0xA
    assert by[("READ", True)]["io_length"] == 4096
    wr = by[("WRITE", False)]
    assert wr["file_offset"] == 5 and wr["io_length"] == 10 and by[("WRITE", True)]["io_length"] == 10
    lk = by[("LOCK", False)]
    assert lk["lock_count"] == 2 and lk["lock_offset"] == 100 and lk["lock_length"] == 10 and lk["lock_flags"] == 2
    assert lk["decode_error"] is None
    assert by[("IOCTL", False)]["ioctl"] == "FSCTL_PIPE_TRANSCEIVE"
    assert by[("IOCTL", True)]["ioctl"] == "FSCTL_VALIDATE_NEGOTIATE_INFO"
    assert by[("IOCTL", True)]["fid_volatile"] == 0xB
    qd = by[("QUERY_DIRECTORY", False)]
    assert qd["pattern"] == "*.doc" and qd["info_class"] == 37
    assert qd["info_class_name"] == "FileIdBothDirectoryInformation"
    cn = by[("CHANGE_NOTIFY", False)]
    assert cn["notify_flags"] == 1 and cn["completion_filter"] == 0x17
    qi = by[("QUERY_INFO", False)]
    assert qi["info_type"] == "FILE" and qi["info_class_name"] == "FileNetworkOpenInformation"
    assert by[("CANCEL", False)]["async_id"] == 77 and by[("CANCEL", False)]["is_async"]
    assert by[("LOGOFF", False)]["decode_error"] is None and by[("TREE_DISCONNECT", False)]["structure_size"] == 4
    assert rows["decode_error"].null_count() == rows.height


def set_info(info_type, info_class, data: bytes) -> bytes:
    """2.2.39: the buffer at 0x60 (64 + 32)."""
    return struct.pack("<HBBIHHI", 33, info_type, info_class, len(data), 96, 0, 0) + fid(1, 2) + data


def test_set_info_classes():
    target = u16("new\\name.txt")
    rename = struct.pack("<B7xQI", 1, 0, len(target)) + target                      # MS-FSCC 2.4.37.2
    rows = decode(
        header(17, 1) + set_info(1, 10, rename),
        header(17, 2) + set_info(1, 13, b"\x01"),
        header(17, 3) + set_info(1, 64, struct.pack("<I", 0x11)),
        header(17, 4) + set_info(1, 20, struct.pack("<Q", 999)),
        header(17, 5) + set_info(1, 4, struct.pack("<QQQQI", 1, 2, 3, 4, 0x21) + b"\0" * 4),
        header(17, 6) + set_info(3, 0, b"\0" * 20),
        header(17, 7) + set_info(2, 2, b"\0" * 8),
    )
    r = rows.to_dicts()
    assert r[0]["info_class_name"] == "FileRenameInformation" and r[0]["target_name"] == "new\\name.txt"
    assert r[1]["info_class_name"] == "FileDispositionInformation" and r[1]["delete_pending"] is True
    assert r[2]["info_class_name"] == "FileDispositionInformationEx" and r[2]["delete_pending"] is True
    assert r[3]["info_class_name"] == "FileEndOfFileInformation" and r[3]["end_of_file"] == 999
    assert r[4]["info_class_name"] == "FileBasicInformation" and r[4]["file_attributes"] == 0x21
    assert r[5]["info_type"] == "SECURITY" and r[5]["info_class_name"] == "SecurityInformation"
    assert r[6]["info_type"] == "FILESYSTEM" and r[6]["info_class_name"] == "FileFsLabelInformation"
    assert all(x["fid_persistent"] == 1 and x["fid_volatile"] == 2 for x in r)
    assert rows["decode_error"].null_count() == rows.height


# --- oplock / lease breaks (2.2.23 - 2.2.25) -----------------------------------------------------------

def oplock_break_body(level):
    return struct.pack("<HBBI", 24, level, 0, 0) + fid(0x10, 0x20)


def test_break_forms():
    rows = decode(
        resp(18, UNSOLICITED, tid=0, sid=0) + oplock_break_body(1),                         # 2.2.23.1
        header(18, 30) + oplock_break_body(1),                                              # 2.2.24.1
        resp(18, 30) + oplock_break_body(1),                                                # 2.2.25.1
        resp(18, UNSOLICITED, tid=0, sid=0) + struct.pack("<HHI", 44, 5, 1) + KEY
        + struct.pack("<IIIII", 7, 1, 0, 0, 0),                                            # 2.2.23.2
        header(18, 31) + struct.pack("<HHI", 36, 0, 0) + KEY + struct.pack("<IQ", 1, 0),    # 2.2.24.2
        resp(18, 31) + struct.pack("<HHI", 36, 0, 0) + KEY + struct.pack("<IQ", 1, 0),      # 2.2.25.2
    ).to_dicts()
    assert [r["break_kind"] for r in rows] == ["oplock_break_notification", "oplock_break_ack",
                                                "oplock_break_response", "lease_break_notification",
                                                "lease_break_ack", "lease_break_response"]
    assert rows[0]["message_id"] == UNSOLICITED and rows[0]["oplock"] == "level2"
    assert rows[0]["fid_persistent"] == 0x10 and rows[1]["fid_volatile"] == 0x20
    n = rows[3]
    assert n["lease_key"] == KEY_GUID and n["lease_state"] == 7 and n["new_lease_state"] == 1
    assert n["lease_flags"] == 1 and n["lease_epoch"] == 5 and n["break_reason"] == 0
    assert rows[4]["lease_state"] == 1 and rows[4]["lease_key"] == KEY_GUID and rows[5]["lease_state"] == 1
    bad = one(header(18, 32) + struct.pack("<HH", 30, 0) + b"\0" * 28)
    assert bad["break_kind"] is None and bad["decode_error"] == "bad structure size"


# --- compounds, other protocols ---------------------------------------------------------------------

def test_compound_rows():
    msg = chain(header(5, 20) + create_request("x.txt"),
                header(16, 21, flags=RELATED) + struct.pack("<HBBIHHIII", 41, 1, 5, 24, 0, 0, 0, 0, 0)
                + fid(*ALL_ONES_FID),
                header(6, 22, flags=RELATED) + struct.pack("<HHI", 24, 0, 0) + fid(*ALL_ONES_FID))
    df = decode(msg)
    assert df["command"].to_list() == ["CREATE", "QUERY_INFO", "CLOSE"]
    assert df["message"].n_unique() == 1 and df["chain_index"].to_list() == [0, 1, 2]
    assert df["message_id"].to_list() == [20, 21, 22] and df["is_related"].to_list() == [False, True, True]
    offs = df["chain_offset"].to_list()
    assert offs[0] == 0 and offs[1] % 8 == 0 and offs[1] < offs[2] < len(msg)
    assert df["decode_error"].null_count() == 3


def test_transform_compression_smb1_unknown():
    transform = struct.pack("<4s16s16sIHHQ", b"\xfdSMB", b"s" * 16, b"n" * 16, 300, 0, 1, 0xABCDEF) + b"\xaa" * 300
    compressed = struct.pack("<4sIHHI", b"\xfcSMB", 4096, 1, 0, 0) + b"\xbb" * 40
    smb1 = struct.pack("<4sBIBHH8sHHHHH", b"\xffSMB", 0x72, 0, 0x18, 0xC853, 0, b"\0" * 8, 0, 0xFFFF, 0xFEFF, 0, 7) + \
        b"\x00\x02\x00"
    df = decode(transform, compressed, smb1, b"GET / HTTP/1.1\r\n")
    r = df.to_dicts()
    assert [x["kind"] for x in r] == ["transform", "compressed", "smb1", "unknown"]
    assert r[0]["session_id"] == 0xABCDEF and r[0]["original_size"] == 300 and r[0]["command"] is None
    assert r[1]["original_size"] == 4096
    assert r[2]["command_code"] == 0x72 and r[2]["is_response"] is False and r[2]["message_id"] == 7
    assert r[2]["status_code"] == 0  # SMB_FLAGS2_NT_STATUS set
    assert r[3]["decode_error"] == "unknown protocol"
    assert decode(b"").height == 0  # empty NBSS message: no row


# --- malformed ------------------------------------------------------------------------------------------

def test_next_command_bogus_values():
    good = header(13, 1) + struct.pack("<HH", 4, 0) + b"\0" * 4
    # shorter than a header: bogus (and could not loop, a row is still produced)
    short = bytearray(good * 2)
    struct.pack_into("<I", short, 20, 8)
    r = decode(bytes(short))
    assert r.height == 1 and r["decode_error"][0] == "bad next command"
    # past the end of the message
    past = bytearray(good * 2)
    struct.pack_into("<I", past, 20, 4096)
    r = decode(bytes(past))
    assert r.height == 1 and r["decode_error"][0] == "bad next command"
    # past the captured bytes but inside the wire length: truncated, not bogus
    r = decode(bytes(past), wire=[5000])
    assert r["decode_error"][0] == "truncated"
    # NextCommand = 0 on every element but the first is chained forward only: a second element whose
    # NextCommand points back at the first cannot loop
    back = bytearray(good * 2)
    struct.pack_into("<I", back, 20, 72)
    struct.pack_into("<I", back, 72 + 20, 2**32 - 72)
    r = decode(bytes(back))
    assert r.height == 2 and r["decode_error"].to_list() == [None, "bad next command"]


def test_name_out_of_bounds_and_odd_length():
    body = bytearray(create_request("abc"))
    struct.pack_into("<H", body, 46, 200)  # NameLength past the end
    r = one(header(5, 1) + bytes(body))
    assert r["decode_error"] == "bad offset" and r["filename"] is None and r["create_options"] == 0x40
    body = bytearray(create_request("abc"))
    struct.pack_into("<H", body, 44, 10)  # NameOffset inside the header
    assert one(header(5, 1) + bytes(body))["decode_error"] == "bad offset"
    body = bytearray(create_request("abc"))
    struct.pack_into("<H", body, 46, 5)  # odd length: the dangling byte is escaped
    r = one(header(5, 1) + bytes(body))
    assert r["filename"] == "ab\\x63" and r["decode_error"] is None  # the odd byte is the "c"
    path = u16("\\\\srv\\s")
    r = one(header(3, 1) + struct.pack("<HHHH", 9, 0, 72, len(path) + 64) + path)
    assert r["decode_error"] == "bad offset" and r["tree"] is None


def test_create_context_loops_and_bounds():
    ctx = bytearray(contexts((b"MxAc", b""), (b"QFid", b"")))
    first_len = struct.unpack_from("<I", ctx, 0)[0]
    struct.pack_into("<I", ctx, first_len, 2**32 - first_len)  # second points back to the first
    r = one(header(5, 1) + create_request("a", ctx=bytes(ctx)))
    assert r["decode_error"] == "bad create context" and r["create_contexts"] == "MxAc,QFid"
    ctx = bytearray(contexts((b"MxAc", b"")))
    struct.pack_into("<I", ctx, 0, 0)
    struct.pack_into("<I", ctx, 12, 1000)  # DataLength past the contexts
    assert one(header(5, 1) + create_request("a", ctx=bytes(ctx)))["decode_error"] == "bad create context"
    body = bytearray(create_request("a", ctx=contexts((b"MxAc", b""))))
    struct.pack_into("<I", body, 52, 5000)  # CreateContextsLength past the end
    assert one(header(5, 1) + bytes(body))["decode_error"] == "bad offset"
    # a self-pointing Next (0) ends the chain; Next smaller than a context header is bogus
    ctx = bytearray(contexts((b"MxAc", b""), (b"QFid", b"")))
    struct.pack_into("<I", ctx, 0, 4)
    assert one(header(5, 1) + create_request("a", ctx=bytes(ctx)))["decode_error"] == "bad create context"


def test_truncations():
    full = header(5, 1) + create_request("abc")
    for cut in (3, 10, 40, 64, 65, 70, 100):
        r = decode(full[:cut], wire=[len(full)])
        assert r.height == 1 and r["decode_error"][0] in ("truncated", "unknown protocol"), cut
    r = one(header(5, 1)[:30])
    assert r["decode_error"] == "truncated" and r["command_code"] == 5 and r["is_response"] is False
    assert one(header(10, 1) + struct.pack("<HHI", 48, 3, 0) + fid(1, 2) + b"\0" * 24)["decode_error"] == \
        "bad lock count"
    assert one(header(10, 1) + struct.pack("<HHI", 48, 0, 0) + fid(1, 2))["decode_error"] == "bad lock count"
    huge = header(0, 0) + struct.pack("<HHHHI16sQ", 36, 60000, 1, 0, 0, b"G" * 16, 0) + b"\x02\x02" * 3
    r = one(huge)
    assert r["dialect_count"] == 60000 and r["dialects"] == [0x0202] * 3 and r["decode_error"] == "truncated"
    bad_header = bytearray(header(13, 1) + struct.pack("<HH", 4, 0))
    struct.pack_into("<H", bad_header, 4, 65)
    assert one(bytes(bad_header))["decode_error"] == "bad header"


# --- text ------------------------------------------------------------------------------------------------

def test_utf16_transcoder():
    name = "caf\u00e9\\\u65e5\u672c\\\U0001F600.txt"
    r = one(header(5, 1) + create_request(name))
    assert r["filename"] == name
    lone = b"a\x00" + struct.pack("<H", 0xD800) + b"b\x00" + struct.pack("<H", 0xDC01) + b"\x01\x00"
    body = bytearray(create_request("x" * (len(lone) // 2)))
    body[56:56 + len(lone)] = lone
    r = one(header(5, 1) + bytes(body))
    assert r["filename"] == "a\\ud800b\\udc01\\x01"


def test_guid_rendering():
    arena = np.zeros(64, np.uint8)
    src = np.frombuffer(bytes.fromhex("fbbc791fc3034c0986cc6e8b2d018097"), np.uint8)
    end = kern.put_guid(arena, 0, src, 0)
    assert bytes(arena[:end]).decode() == "1f79bcfb-03c3-094c-86cc-6e8b2d018097"
    assert kern.put_guid(np.zeros(10, np.uint8), 0, src, 0) == -1


def test_arena_grows_and_resumes():
    long_names = [header(5, k) + create_request(f"{k:04d}" + "n" * 30000) for k in range(12)]
    df = decode(*long_names)
    assert df.height == 12
    assert df["filename"].str.len_chars().to_list() == [30004] * 12
    assert df["filename"].str.slice(0, 4).to_list() == [f"{k:04d}" for k in range(12)]


def test_multiple_sets_and_nbss_type_filter():
    a = message_set([header(13, 1) + struct.pack("<HH", 4, 0)])
    b = message_set([header(13, 2) + struct.pack("<HH", 4, 0)], frames=[7])
    df = smb2.decode_messages([a, b])
    assert df["message_id"].to_list() == [1, 2] and df["message"].to_list() == [0, 1]
    c = message_set([header(13, 3) + struct.pack("<HH", 4, 0), b""])
    c.frame = c.frame.with_columns(pl.Series("nbss_type", [0, 0x85], dtype=pl.UInt8))
    assert smb2.decode_messages([c]).height == 1
    assert smb2.decode_messages([]).columns == list(smb2.MESSAGE_NAMES)
    with pytest.raises(TypeError):
        smb2.decode_messages([object()])


def test_schema_matches_frame():
    df = decode(header(13, 1) + struct.pack("<HH", 4, 0))
    assert df.columns == list(smb2.MESSAGE_NAMES)
    assert df.schema == smb2.empty_messages().schema
    for c in smb2.MESSAGE_COLUMNS:
        assert c.description and len(c.description) > 5, c.name


# --- Hypothesis ------------------------------------------------------------------------------------------

SAMPLES = [
    header(5, 10) + create_request("dir\\f.txt", oplock=0xFF, ctx=contexts((b"RqLs", lease_v2(KEY, 7, PARENT, 1)),
                                                                             (b"MxAc", b""))),
    resp(5, 10) + create_response(1, 2, ctx=contexts((b"RqLs", lease_v1(KEY, 5)))),
    chain(header(5, 20) + create_request("x"), header(6, 21, flags=RELATED) + struct.pack("<HHI", 24, 0, 0)
          + fid(*ALL_ONES_FID)),
    resp(18, UNSOLICITED) + struct.pack("<HHI", 44, 5, 1) + KEY + struct.pack("<IIIII", 7, 1, 0, 0, 0),
    header(17, 1) + set_info(1, 10, struct.pack("<B7xQI", 1, 0, 4) + u16("ab")),
    header(0, 0) + struct.pack("<HHHHI16sQ", 36, 2, 1, 0, 0, b"G" * 16, 0) + struct.pack("<2H", 0x202, 0x311),
    header(3, 4) + struct.pack("<HHHH", 9, 0, 72, 4) + u16("\\\\"),
    header(10, 5) + struct.pack("<HHI", 48, 1, 0) + fid(1, 2) + struct.pack("<QQII", 100, 10, 2, 0),
]


def _check(messages):
    df = decode(*messages)
    nonempty = [m for m in messages if m]
    assert df.height >= len(nonempty)
    per = df.group_by("message").len()
    lengths = [len(m) for m in nonempty]
    assert per["len"].max() is None or per["len"].max() <= max(lengths) // 64 + 1
    assert df.columns == list(smb2.MESSAGE_NAMES)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=0, max_size=400), min_size=1, max_size=6))
def test_random_bytes_never_raise(messages):
    _check([b"\xfeSMB" + m if k % 2 else m for k, m in enumerate(messages)])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(SAMPLES))), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                       max_size=12), st.integers(0, 600))
def test_mutated_messages_never_raise(which, edits, cut):
    m = bytearray(SAMPLES[which])
    for pos, value in edits:
        m[pos % len(m)] = value
    _check([bytes(m[:max(cut, 1)]), bytes(m)])


# --- pairing -------------------------------------------------------------------------------------------

def exchange(items):
    """items: (frame, flow, message bytes); ts = frame ms. Returns the decoded messages frame."""
    items = sorted(items)
    return smb2.decode_messages([message_set([m for _, _, m in items], frames=[f for f, _, _ in items],
                                             flows=[fl for _, fl, _ in items])])


def session(flow, tid, base_frame, sid=0x100):
    path = u16("\\\\FS1\\data")
    return [
        (base_frame, flow, header(3, 1, tid=0, sid=sid) + struct.pack("<HHHH", 9, 0, 72, len(path)) + path),
        (base_frame + 1, flow, resp(3, 1, tid=tid, sid=sid) + struct.pack("<HBBIII", 16, 1, 0, 0, 0, 0x1F01FF)),
    ]


def test_pending_then_final_and_latency():
    f = fid(5, 6)
    m = exchange(session(0, 9, 1) + [
        (10, 0, header(5, 2, tid=9, sid=0x100) + create_request("a.txt")),
        (11, 0, resp(5, 2, tid=9, sid=0x100) + create_response(5, 6)),
        (20, 0, header(8, 3, tid=9, sid=0x100) + struct.pack("<HBBIQ", 49, 0, 0, 10, 0) + f + b"\0" * 17),
        (21, 0, resp(8, 3, status=0x103, async_id=0x77, sid=0x100) + error_body()),
        (50, 0, resp(8, 3, async_id=0x77, sid=0x100) + struct.pack("<HBBIII", 17, 80, 0, 10, 0, 0) + b"x"),
    ])
    tx = pair_transactions(m)
    assert tx.columns[:17] == ["protocol", "transport", "flow", "client", "client_port", "server", "server_port",
                               "operation", "resource", "request_frame", "response_frame", "request_ts_ns",
                               "response_ts_ns", "latency_ns", "status", "is_error", "answered"]
    read = tx.filter(pl.col("operation") == "READ").row(0, named=True)
    assert read["interim_frame"] == 21 and read["response_frame"] == 50 and read["async_id"] == 0x77
    assert read["pending_ns"] == 29_000_000 and read["latency_ns"] == 30_000_000
    assert read["status"] == "STATUS_SUCCESS" and read["path"] == "\\\\FS1\\data\\a.txt"
    assert read["resource"] == read["path"] and read["share"] == "\\\\FS1\\data"
    assert not read["pending_by_design"] and read["answered"] and not read["is_error"]
    create = tx.filter(pl.col("operation") == "CREATE").row(0, named=True)
    assert create["fid_persistent"] == 5 and create["fid_volatile"] == 6 and create["granted_oplock"] == "batch"
    assert create["create_action"] == "OPENED" and create["interim_frame"] is None
    tc = tx.filter(pl.col("operation") == "TREE_CONNECT").row(0, named=True)
    assert tc["resource"] == "\\\\FS1\\data" and tc["latency_ns"] == 1_000_000


def test_compound_related_inherits_fid_and_path():
    req = chain(header(5, 20, tid=9, sid=0x100) + create_request("d\\x.txt"),
                header(16, 21, flags=RELATED, tid=0xFFFFFFFF, sid=UNSOLICITED)
                + struct.pack("<HBBIHHIII", 41, 1, 5, 24, 0, 0, 0, 0, 0) + fid(*ALL_ONES_FID),
                header(6, 22, flags=RELATED, tid=0xFFFFFFFF, sid=UNSOLICITED) + struct.pack("<HHI", 24, 0, 0)
                + fid(*ALL_ONES_FID))
    rsp = chain(resp(5, 20, tid=9, sid=0x100) + create_response(0x41, 0x42),
                resp(16, 21, flags=RELATED, tid=9, sid=0x100) + struct.pack("<HHI", 9, 72, 0) + b"\0",
                resp(6, 22, flags=RELATED, tid=9, sid=0x100)
                + struct.pack("<HHIQQQQQQII", 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    m = exchange(session(0, 9, 1) + [(10, 0, req), (11, 0, rsp)])
    tx = pair_transactions(m).filter(pl.col("request_frame") == 10).sort("chain_index")
    assert tx["operation"].to_list() == ["CREATE", "QUERY_INFO", "CLOSE"]
    assert tx["response_frame"].to_list() == [11, 11, 11] and tx["compound_size"].to_list() == [3, 3, 3]
    assert tx["path"].to_list() == ["\\\\FS1\\data\\d\\x.txt"] * 3
    assert tx["fid_persistent"].to_list() == [0x41] * 3 and tx["fid_volatile"].to_list() == [0x42] * 3
    assert tx["session_id"].to_list() == [0x100] * 3 and tx["tree_id"].to_list() == [9] * 3


def test_cancel_and_change_notify():
    f = fid(5, 6)
    notify = header(15, 3, tid=9, sid=0x100) + struct.pack("<HHI", 32, 1, 4096) + f + struct.pack("<II", 0x17, 0)
    m = exchange(session(0, 9, 1) + [
        (10, 0, header(5, 2, tid=9, sid=0x100) + create_request("")),
        (11, 0, resp(5, 2, tid=9, sid=0x100) + create_response(5, 6)),
        (12, 0, notify),
        (13, 0, resp(15, 3, status=0x103, async_id=0x99, sid=0x100) + error_body()),
        (40, 0, header(12, 0, async_id=0x99, sid=0x100) + struct.pack("<HH", 4, 0)),
        (41, 0, resp(15, 3, status=0xC0000120, async_id=0x99, sid=0x100) + error_body()),
        # a sync CANCEL of a request that never went pending
        (50, 0, header(8, 4, tid=9, sid=0x100) + struct.pack("<HBBIQ", 49, 0, 0, 10, 0) + f + b"\0" * 17),
        (51, 0, header(12, 4, tid=9, sid=0x100) + struct.pack("<HH", 4, 0)),
    ])
    tx = pair_transactions(m)
    cn = tx.filter(pl.col("operation") == "CHANGE_NOTIFY").row(0, named=True)
    assert cn["pending_by_design"] and cn["interim_frame"] == 13 and cn["response_frame"] == 41
    assert cn["status"] == "STATUS_CANCELLED" and cn["cancel_frame"] == 40 and cn["async_id"] == 0x99
    assert cn["path"] == "\\\\FS1\\data"
    cancels = tx.filter(pl.col("operation") == "CANCEL").sort("request_frame")
    assert cancels["cancels_frame"].to_list() == [12, 50]
    assert cancels["expects_response"].to_list() == [False, False]
    assert cancels["answered"].to_list() == [False, False] and cancels["is_error"].to_list() == [False, False]
    read = tx.filter(pl.col("operation") == "READ").row(0, named=True)
    assert read["cancel_frame"] == 51 and not read["answered"] and read["response_frame"] is None


def test_response_before_any_request_is_not_paired():
    # an SMB2 NEGOTIATE response to an SMB1 negotiate (MessageId 0), then the SMB2 NEGOTIATE
    neg = header(0, 0) + struct.pack("<HHHHI16sQ", 36, 1, 1, 0, 0, b"G" * 16, 0) + struct.pack("<H", 0x311)
    body = struct.pack("<HHHH16sIIIIQQHHI", 65, 1, 0x0311, 0, b"S" * 16, 0, 1, 1, 1, 0, 0, 128, 0, 0) + b"\0"
    m = exchange([(1, 0, resp(0, 0) + body), (2, 0, neg), (3, 0, resp(0, 0) + body)])
    tx = pair_transactions(m)
    assert tx.height == 1 and tx["response_frame"][0] == 3


def lease_create(mid, name, key, tid, sid):
    return header(5, mid, tid=tid, sid=sid) + create_request(name, oplock=0xFF,
                                                             ctx=contexts((b"RqLs", lease_v1(key, 7))))


def test_lease_break_ack_and_blocked_trigger():
    key_b = bytes(range(100, 116))
    note = resp(18, UNSOLICITED, tid=0, sid=0) + struct.pack("<HHI", 44, 2, 1) + KEY + \
        struct.pack("<IIIII", 7, 3, 0, 0, 0)
    ack = header(18, 3, tid=9, sid=0x100) + struct.pack("<HHI", 36, 0, 0) + KEY + struct.pack("<IQ", 3, 0)
    ack_resp = resp(18, 3, tid=9, sid=0x100) + struct.pack("<HHI", 36, 0, 0) + KEY + struct.pack("<IQ", 3, 0)
    m = exchange(session(0, 9, 1) + session(1, 4, 3, sid=0x200) + [
        (10, 0, lease_create(2, "doc.docx", KEY, 9, 0x100)),
        (11, 0, resp(5, 2, tid=9, sid=0x100) + create_response(0x51, 0x52, oplock=0xFF,
                                                               ctx=contexts((b"RqLs", lease_v1(KEY, 7))))),
        # client 2 opens the same file (named through another server name, other case)
        (20, 1, header(5, 2, tid=4, sid=0x200) + create_request("DOC.docx", oplock=0xFF,
                                                               ctx=contexts((b"RqLs", lease_v1(key_b, 7))))),
        (21, 0, note),
        (22, 1, resp(5, 2, status=0x103, async_id=5, sid=0x200) + error_body()),
        (30, 0, ack),
        (31, 0, ack_resp),
        (32, 1, resp(5, 2, async_id=5, sid=0x200) + create_response(0x61, 0x62, oplock=0xFF)),
    ])
    # the second client's share path names the server differently
    m = m.with_columns(pl.when(pl.col("tree") == "\\\\FS1\\data").then(
        pl.when(pl.col("flow") == 1).then(pl.lit("\\\\10.0.0.1\\DATA")).otherwise(pl.col("tree")))
        .otherwise(pl.col("tree")).alias("tree"))
    tx = pair_transactions(m)
    ack_tx = tx.filter(pl.col("break_kind") == "lease_break_ack").row(0, named=True)
    assert ack_tx["path"] == "\\\\FS1\\data\\doc.docx" and ack_tx["response_frame"] == 31
    br = break_frame(m, tx)
    assert br.height == 1
    b = br.row(0, named=True)
    assert b["kind"] == "lease" and b["lease_key"] == KEY_GUID and b["path"] == "\\\\FS1\\data\\doc.docx"
    assert b["lease_paths"] == ["\\\\FS1\\data\\doc.docx"] and b["owner_flow"] == 0 and b["owner_frame"] == 10
    assert b["old_state"] == "RWH" and b["new_state"] == "RH" and b["ack_required"] and b["lease_epoch"] == 2
    assert b["ack_frame"] == 30 and b["ack_latency_ns"] == 9_000_000 and b["ack_state"] == "RH"
    assert b["ack_response_frame"] == 31 and b["ack_response_status"] == "STATUS_SUCCESS"
    assert b["trigger_frame"] == 20 and b["trigger_flow"] == 1 and b["trigger_match"] == "blocked"
    assert b["trigger_operation"] == "CREATE" and b["trigger_wait_ns"] == 12_000_000
    assert b["trigger_client"] == "10.0.0.11"


def test_oplock_break_never_acknowledged():
    note = resp(18, UNSOLICITED, tid=0, sid=0) + oplock_break_body(0)
    m = exchange(session(0, 9, 1) + session(1, 4, 3, sid=0x200) + [
        (10, 0, header(5, 2, tid=9, sid=0x100) + create_request("f.txt", oplock=9)),
        (11, 0, resp(5, 2, tid=9, sid=0x100) + create_response(0x10, 0x20, oplock=8)),
        (20, 1, header(5, 2, tid=4, sid=0x200) + create_request("f.txt", oplock=9)),
        (21, 0, note),
    ])
    br = break_frame(m)
    b = br.row(0, named=True)
    assert b["kind"] == "oplock" and b["old_state"] == "exclusive" and b["new_state"] == "none"
    assert b["path"] == "\\\\FS1\\data\\f.txt" and b["ack_frame"] is None and b["ack_latency_ns"] is None
    assert b["trigger_frame"] == 20 and b["trigger_match"] == "blocked" and b["trigger_wait_ns"] is None
    # outside the window: no trigger
    br = break_frame(m, params=Params(trigger_window_ns=100))
    assert br["trigger_frame"][0] is None


def test_directory_lease_break_by_child_operation():
    note = resp(18, UNSOLICITED, tid=0, sid=0) + struct.pack("<HHI", 44, 1, 1) + KEY + \
        struct.pack("<IIIII", 3, 0, 0, 0, 0)
    m = exchange(session(0, 9, 1) + [
        (10, 0, lease_create(2, "", KEY, 9, 0x100)),
        (11, 0, resp(5, 2, tid=9, sid=0x100) + create_response(0x10, 0x20, oplock=0xFF)),
        (20, 0, header(5, 3, tid=9, sid=0x100) + create_request("new.txt", disposition=2)),
        (21, 0, resp(5, 3, tid=9, sid=0x100) + create_response(0x11, 0x21)),
        (22, 0, note),
    ])
    b = break_frame(m).row(0, named=True)
    assert b["path"] == "\\\\FS1\\data" and b["old_state"] == "RH" and b["new_state"] == "none"
    assert b["trigger_frame"] == 20 and b["trigger_match"] == "preceding"
    assert b["trigger_path"] == "\\\\FS1\\data\\new.txt"


def test_empty_inputs():
    empty = smb2.empty_messages()
    assert pair_transactions(empty).height == 0 and break_frame(empty).height == 0
    m = exchange([(1, 0, header(13, 1) + struct.pack("<HH", 4, 0))])
    assert break_frame(m).height == 0
    tx = pair_transactions(m)
    assert tx.height == 1 and tx["answered"][0] is False and tx["expects_response"][0] is True


def test_frames_registered_on_capture():
    """cap.frame("smb2_messages" / "smb2_transactions" / "smb2_breaks") through analyzer.tcp, on a
    real capture of the corpus (no tshark needed)."""
    from pathlib import Path

    from analyzer import open_capture
    from analyzer.schema import FRAMES

    path = Path(__file__).parent / "data" / "corpus" / "suricata-verify" / "smb2-delete" / "input.pcap"
    with open_capture(path) as cap:
        m = cap.frame("smb2_messages")
        tx = cap.frame("smb2_transactions")
        br = cap.frame("smb2_breaks")
    assert m.columns == list(smb2.MESSAGE_NAMES) and m.filter(pl.col("kind") == "smb2").height == 168
    assert tx.columns == [c.name for c in smb2.TRANSACTION_COLUMNS]
    assert br.columns == [c.name for c in smb2.BREAK_COLUMNS] and br.height == 1
    for name, columns in [("smb2_messages", smb2.MESSAGE_COLUMNS), ("smb2_transactions", smb2.TRANSACTION_COLUMNS),
                          ("smb2_breaks", smb2.BREAK_COLUMNS)]:
        assert FRAMES[name] == columns
        frame = {"smb2_messages": m, "smb2_transactions": tx, "smb2_breaks": br}[name]
        expected = {c.name: polars_type(c) for c in columns}
        for col, dtype in frame.schema.items():
            if col not in ("src", "dst"):  # the message set's address type, passed through
                assert dtype == expected[col], (name, col, dtype, expected[col])
        assert all(c.description for c in columns)
    assert (tx["protocol"] == "smb2").all() and tx["answered"].sum() == tx.filter(pl.col("expects_response")).height


@pytest.mark.parametrize("sample", ["smb2-oplock-lease-break.pcap", "smb2-break-queue.pcap"])
def test_transactions_of_messages_in_any_order_are_the_same(sample):
    """pair_transactions relies on its header rows' order (MESSAGE_ORDER: a compound's elements
    contiguous and in chain order); smb2_messages leaves them so, and any other order is sorted first."""
    from pathlib import Path

    from analyzer import open_capture

    with open_capture(Path(__file__).parent.parent / "samples" / sample) as cap:
        m = cap.frame("smb2_messages")
        tx = cap.frame("smb2_transactions")
    assert tx.height > 20 and tx["path"].is_not_null().any() and tx["response_frame"].is_not_null().all()
    assert pair_transactions(m.sample(fraction=1.0, shuffle=True, seed=7)).equals(tx)
    assert pair_transactions(m.reverse()).equals(tx)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.integers(-5, 60)), max_size=40),
       st.lists(st.one_of(st.none(), st.integers(-5, 60)), max_size=6), st.integers(0, 20))
def test_trigger_candidates_are_those_in_a_notifications_window(times, notes, window):
    """smb2_breaks._in_a_window keeps exactly the requests _pick_triggers can look at: at most the window
    before a notification, at it included (null times read as -1 by both)."""
    from analyzer.decoders.smb2_breaks import _in_a_window

    kept = _in_a_window(pl.Series(times, dtype=pl.Int64), pl.Series(notes, dtype=pl.Int64), window).to_list()
    as_read = [-1 if t is None else t for t in times]
    note_ts = [-1 if t is None else t for t in notes]
    assert kept == [any(n - window <= t <= n for n in note_ts) for t in as_read]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.integers(-5, 60)), max_size=40),
       st.lists(st.tuples(st.one_of(st.none(), st.integers(-5, 60)), st.one_of(st.none(), st.integers(-5, 60))),
                max_size=6))
def test_waiter_candidates_are_those_sent_within_a_breaks_span(times, spans):
    """smb_break_queue._within_any keeps exactly the requests whose time lies in some break's closed span
    (what _waiter_pairs' filter asks of a pair): a null time or bound, or a span that ends before it
    starts, holds none."""
    from detectors.smb_break_queue import _within_any

    starts = pl.Series([s for s, _ in spans], dtype=pl.Int64)
    ends = pl.Series([e for _, e in spans], dtype=pl.Int64)
    kept = _within_any(pl.Series(times, dtype=pl.Int64), starts, ends).to_list()
    assert kept == [t is not None and any(s is not None and e is not None and s <= t <= e for s, e in spans)
                    for t in times]
