"""SMB2/3 message encoders (MS-SMB2 §2.2) and the NetBIOS session service framing (RFC 1002 §4.3.1)
they travel in over TCP 445 (MS-SMB2 §2.1)."""
from __future__ import annotations

import struct

from .ntlm import filetime, spnego_init, utf16

# Command codes (MS-SMB2 §2.2.1.2)
SMB2_NEGOTIATE, SMB2_SESSION_SETUP, SMB2_LOGOFF, SMB2_TREE_CONNECT, SMB2_TREE_DISCONNECT = 0, 1, 2, 3, 4
SMB2_CREATE, SMB2_CLOSE, SMB2_READ, SMB2_WRITE, SMB2_OPLOCK_BREAK = 5, 6, 8, 9, 0x12
# Header (MS-SMB2 §2.2.1): ProtocolId, StructureSize 64, Flags
PROTOCOL_ID = b"\xfeSMB"
HEADER_SIZE = 64
FL_RESPONSE, FL_ASYNC = 0x1, 0x2              # SMB2_FLAGS_SERVER_TO_REDIR, SMB2_FLAGS_ASYNC_COMMAND
RESERVED_PROCESS_ID = 0xFEFF                  # the sync header's Reserved field as Windows sends it
UNSOLICITED_MESSAGE_ID = 0xFFFFFFFFFFFFFFFF   # MessageId of an oplock / lease break notification (§3.3.4.6)
# NTSTATUS (MS-ERREF §2.3)
ST_OK, ST_PENDING, ST_MORE = 0, 0x00000103, 0xC0000016      # SUCCESS, PENDING, MORE_PROCESSING_REQUIRED
# RequestedOplockLevel (MS-SMB2 §2.2.13) and lease states (§2.2.13.2.8)
OPLOCK_NONE, OPLOCK_II, OPLOCK_EXCL, OPLOCK_BATCH, OPLOCK_LEASE = 0, 1, 8, 9, 0xFF
LEASE_R, LEASE_H, LEASE_W = 1, 2, 4
# StructureSize of each request / response body (MS-SMB2 §2.2.3-§2.2.24)
SZ_NEGOTIATE_REQ, SZ_NEGOTIATE_RSP = 36, 65
SZ_SESSION_SETUP_REQ, SZ_SESSION_SETUP_RSP = 25, 9
SZ_TREE_CONNECT_REQ, SZ_TREE_CONNECT_RSP = 9, 16
SZ_EMPTY = 4                                  # LOGOFF, TREE_DISCONNECT request and response
SZ_CREATE_REQ, SZ_CREATE_RSP = 57, 89
SZ_CLOSE_REQ, SZ_CLOSE_RSP = 24, 60
SZ_READ_REQ, SZ_READ_RSP = 49, 17
SZ_WRITE_REQ, SZ_WRITE_RSP = 49, 17
SZ_OPLOCK_BREAK = 24                          # notification, acknowledgment and response (§2.2.23.1)
SZ_LEASE_BREAK_NOTIFY, SZ_LEASE_BREAK_ACK = 44, 36   # §2.2.23.2, §2.2.24.2
SZ_ERROR = 9                                  # SMB2 ERROR Response (§2.2.2)
# NEGOTIATE (MS-SMB2 §2.2.3, §2.2.4)
DIALECTS = (0x202, 0x210, 0x300, 0x302)       # SMB 2.0.2, 2.1, 3.0, 3.0.2
DIALECT_302 = 0x302
NEG_SIGNING_ENABLED = 1
CLIENT_CAPABILITIES = 0x7F                    # DFS, LEASING, LARGE_MTU, MULTI_CHANNEL, ... ENCRYPTION
SERVER_CAPABILITIES = 0x2F
MAX_TRANSACT = MAX_READ = MAX_WRITE = 8388608
SECURITY_BUFFER_OFFSET = HEADER_SIZE + SZ_NEGOTIATE_RSP - 1     # 128: the blob right after the body
SESSION_SETUP_BUFFER_OFFSET = HEADER_SIZE + SZ_SESSION_SETUP_REQ - 1     # 88
SESSION_SETUP_RSP_BUFFER_OFFSET = HEADER_SIZE + SZ_SESSION_SETUP_RSP - 1  # 72
TREE_CONNECT_PATH_OFFSET = HEADER_SIZE + SZ_TREE_CONNECT_REQ - 1         # 72
CAP_DFS = 1                                   # SESSION_SETUP Capabilities (§2.2.5)
SHARE_TYPE_DISK = 1                           # TREE_CONNECT response ShareType (§2.2.10)
SHARE_FULL_ACCESS = 0x001F01FF                # MaximalAccess: all file access rights
# CREATE (MS-SMB2 §2.2.13, §2.2.14)
IMPERSONATION = 2                             # ImpersonationLevel Impersonation
# DesiredAccess (§2.2.13.1.1): read data, EA and attributes, SYNCHRONIZE, READ_CONTROL / and write
ACCESS_READ, ACCESS_WRITE = 0x00120089, 0x0012019F
FILE_NON_DIRECTORY_FILE = 0x00000040          # CreateOptions
# CreateDisposition (§2.2.13)
FILE_SUPERSEDE, FILE_OPEN, FILE_CREATE, FILE_OPEN_IF, FILE_OVERWRITE, FILE_OVERWRITE_IF = 0, 1, 2, 3, 4, 5
FILE_OPENED = 1                               # CreateAction (§2.2.14)
FILE_ATTRIBUTE_NORMAL, FILE_ATTRIBUTE_ARCHIVE = 0x80, 0x20
SHARE_READ_WRITE_DELETE = 7
CREATE_FIXED = HEADER_SIZE + SZ_CREATE_REQ - 1           # 120: where the name buffer starts
CREATE_RSP_CONTEXTS_OFFSET = HEADER_SIZE + SZ_CREATE_RSP - 1   # 152
LEASE_CONTEXT_TAG = b"RqLs"                   # SMB2_CREATE_REQUEST_LEASE (§2.2.13.2)
CREATE_CONTEXT_ALIGN = 8                      # create contexts are 8-byte aligned (§2.2.13.2)
ALLOCATION_UNIT = 4096
# CLOSE (MS-SMB2 §2.2.15, §2.2.16)
CLOSE_FLAG_POSTQUERY_ATTRIB = 1
# READ / WRITE (MS-SMB2 §2.2.19-§2.2.22): the data right after the 64-byte header and the body
READ_DATA_OFFSET = 0x50
WRITE_DATA_OFFSET = 0x70
MAX_CREDIT_CHARGE_UNIT = 65536                # one credit per 64 KiB (§3.1.5.2)
ZERO16 = b"\0" * 16
_SMB2H = struct.Struct("<4sHHIHHIIQIIQ16s")    # sync header (§2.2.1.2)
_SMB2A = struct.Struct("<4sHHIHHIIQQQ16s")     # async header (§2.2.1.1)


def smb2_hdr(cmd: int, mid: int, status: int = 0, flags: int = 0, tree: int = 0, sess: int = 0,
             credits: int = 1, charge: int = 1, async_id: int | None = None) -> bytes:
    if async_id is not None:
        return _SMB2A.pack(PROTOCOL_ID, HEADER_SIZE, charge, status, cmd, credits, flags | FL_ASYNC, 0, mid,
                           async_id, sess, ZERO16)
    return _SMB2H.pack(PROTOCOL_ID, HEADER_SIZE, charge, status, cmd, credits, flags, 0, mid,
                       RESERVED_PROCESS_ID, tree, sess, ZERO16)


def smb2_notify_hdr(cmd: int, sess: int = 0) -> bytes:
    """Header of an unsolicited server message (break notification, MS-SMB2 §3.3.4.6)."""
    return _SMB2H.pack(PROTOCOL_ID, HEADER_SIZE, 0, 0, cmd, 0, FL_RESPONSE, 0, UNSOLICITED_MESSAGE_ID, 0, 0,
                       sess, ZERO16)


def nbss(msg: bytes) -> bytes:
    """Session message: type 0 and a 24-bit length, i.e. a 32-bit big-endian length (RFC 1002 §4.3.1)."""
    return struct.pack("!I", len(msg)) + msg


def smb2_negotiate_req(client_guid: bytes) -> bytes:
    dialects = DIALECTS
    return struct.pack("<HHHHI16sQ", SZ_NEGOTIATE_REQ, len(dialects), NEG_SIGNING_ENABLED, 0,
                       CLIENT_CAPABILITIES, client_guid, 0) \
        + struct.pack("<%dH" % len(dialects), *dialects)


def smb2_negotiate_rsp(server_guid: bytes, now_ns: int, boot_ns: int) -> bytes:
    blob = spnego_init(None)
    return struct.pack("<HHHH16sIIIIQQHHI", SZ_NEGOTIATE_RSP, NEG_SIGNING_ENABLED, DIALECT_302, 0, server_guid,
                       SERVER_CAPABILITIES, MAX_TRANSACT, MAX_READ, MAX_WRITE, filetime(now_ns),
                       filetime(boot_ns), SECURITY_BUFFER_OFFSET, len(blob), 0) + blob


def smb2_session_setup_req(blob: bytes) -> bytes:
    return struct.pack("<HBBIIHHQ", SZ_SESSION_SETUP_REQ, 0, NEG_SIGNING_ENABLED, CAP_DFS, 0,
                       SESSION_SETUP_BUFFER_OFFSET, len(blob), 0) + blob


def smb2_session_setup_rsp(blob: bytes, flags: int = 0) -> bytes:
    return struct.pack("<HHHH", SZ_SESSION_SETUP_RSP, flags, SESSION_SETUP_RSP_BUFFER_OFFSET if blob else 0,
                       len(blob)) + (blob or b"\0")


def smb2_tree_connect_req(path: str) -> bytes:
    p = utf16(path)
    return struct.pack("<HHHH", SZ_TREE_CONNECT_REQ, 0, TREE_CONNECT_PATH_OFFSET, len(p)) + p


def smb2_tree_connect_rsp() -> bytes:
    return struct.pack("<HBBIII", SZ_TREE_CONNECT_RSP, SHARE_TYPE_DISK, 0, 0x0, 0, SHARE_FULL_ACCESS)


def smb2_empty4() -> bytes:
    return struct.pack("<HH", SZ_EMPTY, 0)


def lease_ctx(key: bytes, state: int, flags: int = 0) -> bytes:
    """SMB2_CREATE_CONTEXT (§2.2.13.2) carrying SMB2_CREATE_REQUEST_LEASE (§2.2.13.2.8): Next 0,
    NameOffset 16, NameLength 4, DataOffset 24, DataLength 32."""
    return struct.pack("<IHHHHI", 0, 16, 4, 0, 24, 32) + LEASE_CONTEXT_TAG + b"\0" * 4 \
        + key + struct.pack("<IIQ", state, flags, 0)


def smb2_create_req(name: str, oplock: int, access: int, disposition: int, options: int,
                    lease: tuple[bytes, int] | None = None, share: int = SHARE_READ_WRITE_DELETE) -> bytes:
    nm = utf16(name)
    ctxs = lease_ctx(*lease) if lease else b""
    fixed_end = CREATE_FIXED
    buf = nm if nm else b"\0"
    ctx_off = 0
    if ctxs:
        pad = (-(fixed_end + len(buf))) % CREATE_CONTEXT_ALIGN
        ctx_off = fixed_end + len(buf) + pad
        buf = buf + b"\0" * pad + ctxs
    return struct.pack("<HBBIQQIIIIIHHII", SZ_CREATE_REQ, 0, oplock, IMPERSONATION, 0, 0, access,
                       FILE_ATTRIBUTE_NORMAL, share, disposition, options, CREATE_FIXED, len(nm), ctx_off,
                       len(ctxs)) + buf


def _allocation(size: int) -> int:
    return (size + ALLOCATION_UNIT - 1) // ALLOCATION_UNIT * ALLOCATION_UNIT


def smb2_create_rsp(oplock: int, action: int, fid: bytes, ft: int, size: int,
                    lease: tuple[bytes, int] | None = None, attrs: int = FILE_ATTRIBUTE_ARCHIVE) -> bytes:
    """CreationTime is 100 s (10**9 ticks of 100 ns) before the other three times."""
    ctxs = lease_ctx(*lease) if lease else b""
    return struct.pack("<HBBIQQQQQQII16sII", SZ_CREATE_RSP, oplock, 0, action, ft - 10**9, ft, ft, ft,
                       _allocation(size), size, attrs, 0, fid, CREATE_RSP_CONTEXTS_OFFSET if ctxs else 0,
                       len(ctxs)) + (ctxs or b"\0" * 8)


def smb2_close_req(fid: bytes, flags: int = 0) -> bytes:
    return struct.pack("<HHI16s", SZ_CLOSE_REQ, flags, 0, fid)


def smb2_close_rsp(ft: int, size: int, flags: int = 0) -> bytes:
    if not flags:
        return struct.pack("<HHI", SZ_CLOSE_RSP, 0, 0) + b"\0" * 52
    return struct.pack("<HHIQQQQQQI", SZ_CLOSE_RSP, flags, 0, ft - 10**9, ft, ft, ft, _allocation(size), size,
                       FILE_ATTRIBUTE_ARCHIVE)


def smb2_read_req(fid: bytes, length: int, offset: int) -> bytes:
    """MinimumCount 1, no channel; one byte of Buffer as MS-SMB2 §2.2.19 requires."""
    return struct.pack("<HBBIQ16sIIIHH", SZ_READ_REQ, READ_DATA_OFFSET, 0, length, offset, fid, 1, 0, 0, 0,
                       0) + b"\0"


def smb2_read_rsp(data: bytes) -> bytes:
    return struct.pack("<HBBIII", SZ_READ_RSP, READ_DATA_OFFSET, 0, len(data), 0, 0) + data


def smb2_write_req(fid: bytes, data: bytes, offset: int) -> bytes:
    return struct.pack("<HHIQ16sIIHHI", SZ_WRITE_REQ, WRITE_DATA_OFFSET, len(data), offset, fid, 0, 0, 0, 0,
                       0) + data


def smb2_write_rsp(count: int) -> bytes:
    return struct.pack("<HHIIHH", SZ_WRITE_RSP, 0, count, 0, 0, 0)


def smb2_oplock_break(level: int, fid: bytes) -> bytes:
    return struct.pack("<HBBI16s", SZ_OPLOCK_BREAK, level, 0, 0, fid)


def smb2_lease_break_notify(key: bytes, cur: int, new: int, epoch: int = 0) -> bytes:
    """Flags 1: SMB2_NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED (§2.2.23.2)."""
    return struct.pack("<HHI16sIIIII", SZ_LEASE_BREAK_NOTIFY, epoch, 1, key, cur, new, 0, 0, 0)


def smb2_lease_break_ack(key: bytes, state: int) -> bytes:
    return struct.pack("<HHI16sIQ", SZ_LEASE_BREAK_ACK, 0, 0, key, state, 0)


def smb2_error_body() -> bytes:
    return struct.pack("<HBBI", SZ_ERROR, 0, 0, 0) + b"\0"
