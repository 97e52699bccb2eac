"""SMB2/3 wire layout: byte offsets and sizes of the structures the kernels read, with the spec section
beside each (MS-SMB2, MS-FSCC, MS-CIFS), as dpkt's ``__hdr__`` tables and scapy's fields do.

Offsets of a command body count from the body's first byte (the StructureSize field, right after the
64-byte header); ``*_SIZE`` is the fixed part the kernel needs before it reads any field of that body.
The kernels read these as ``L.NAME``: Numba freezes module-level ints as compile-time constants, so a
name costs nothing at run time. (Numba's cache is keyed on the kernel's own source file: after
changing a value here, touch the kernel modules or clear the cache.)

``HEADER_LAYOUT`` lists the header's fields as (name, offset, size) rows. ``tests/test_decoder_layout.py``
checks it against a struct format written from the spec, and the fixed parts against the fields read
from them, so a mistyped offset fails a test rather than a capture.
"""
from __future__ import annotations

# --- MS-SMB2 2.2.1 SMB2 Packet Header (2.2.1.1 ASYNC, 2.2.1.2 SYNC) -----------------------------------
HDR_PROTOCOL_ID = 0  # 4 bytes: 0xFE 'S' 'M' 'B'
HDR_STRUCTURE_SIZE = 4  # 2 bytes, always 64
HDR_CREDIT_CHARGE = 6
HDR_STATUS = 8  # responses: NTSTATUS (4 bytes)
HDR_CHANNEL_SEQUENCE = 8  # requests (3.x dialects): ChannelSequence (2 bytes) + Reserved
HDR_COMMAND = 12
HDR_CREDIT = 14  # CreditRequest / CreditResponse
HDR_FLAGS = 16
HDR_NEXT_COMMAND = 20
HDR_MESSAGE_ID = 24
HDR_ASYNC_ID = 32  # async form (SMB2_FLAGS_ASYNC_COMMAND): 8 bytes
HDR_PROCESS_ID = 32  # sync form: Reserved / ProcessId (4 bytes) ...
HDR_TREE_ID = 36  # ... then TreeId
HDR_SESSION_ID = 40
HDR_SIGNATURE = 48  # 16 bytes
HDR_SIGNATURE_SIZE = 16
HEADER = 64  # StructureSize of the header; the body starts here
HEADER_LAYOUT = (("protocol_id", HDR_PROTOCOL_ID, 4), ("structure_size", HDR_STRUCTURE_SIZE, 2),
                 ("credit_charge", HDR_CREDIT_CHARGE, 2), ("status", HDR_STATUS, 4), ("command", HDR_COMMAND, 2),
                 ("credit", HDR_CREDIT, 2), ("flags", HDR_FLAGS, 4), ("next_command", HDR_NEXT_COMMAND, 4),
                 ("message_id", HDR_MESSAGE_ID, 8), ("process_id", HDR_PROCESS_ID, 4), ("tree_id", HDR_TREE_ID, 4),
                 ("session_id", HDR_SESSION_ID, 8), ("signature", HDR_SIGNATURE, HDR_SIGNATURE_SIZE))

# ProtocolId first octets (MS-SMB2 2.2.1, 2.2.41, 2.2.42; MS-CIFS 2.2.3.1), then 'S' 'M' 'B'
PROTOCOL_SMB2 = 0xFE
PROTOCOL_TRANSFORM = 0xFD
PROTOCOL_COMPRESSED = 0xFC
PROTOCOL_SMB1 = 0xFF
PROTOCOL_S, PROTOCOL_M, PROTOCOL_B = 0x53, 0x4D, 0x42
PROTOCOL_ID_SIZE = 4

# Every body starts with its StructureSize (2 bytes); the ERROR response's is 9 (2.2.2).
BODY_STRUCTURE_SIZE = 0
ERROR_STRUCTURE_SIZE = 9

# --- NEGOTIATE (2.2.3 request, 2.2.4 response) ----------------------------------------------------------
NEG_REQ_DIALECT_COUNT = 2
NEG_REQ_CAPABILITIES = 8
NEG_REQ_DIALECTS = 36  # DialectCount uint16s follow the fixed part
NEG_REQ_SIZE = 36
NEG_RESP_DIALECT = 4
NEG_RESP_CAPABILITIES = 24
NEG_RESP_SIZE = 64

# --- SESSION_SETUP (2.2.5 request, 2.2.6 response) ------------------------------------------------------
SS_REQ_FLAGS = 2  # 1 byte
SS_REQ_CAPABILITIES = 4
SS_REQ_SECURITY_OFFSET = 12  # SecurityBufferOffset (2 bytes, from the SMB2 header's first byte)
SS_REQ_SECURITY_LENGTH = 14  # SecurityBufferLength (2 bytes); the buffer: a GSS-API token (kerberos_ap)
SS_REQ_SIZE = 24
SS_RESP_SESSION_FLAGS = 2
SS_RESP_SECURITY_OFFSET = 4  # SecurityBufferOffset / Length (2 bytes each), as in the request
SS_RESP_SECURITY_LENGTH = 6
SS_RESP_SIZE = 8

# --- TREE_CONNECT (2.2.9 request, 2.2.10 response) ------------------------------------------------------
TC_REQ_PATH_OFFSET = 4
TC_REQ_PATH_LENGTH = 6
TC_REQ_SIZE = 8
TC_RESP_SHARE_TYPE = 2  # 1 byte
TC_RESP_SHARE_FLAGS = 4
TC_RESP_SIZE = 16

# --- CREATE (2.2.13 request, 2.2.14 response) ------------------------------------------------------------
CREATE_REQ_OPLOCK_LEVEL = 3  # RequestedOplockLevel, 1 byte
CREATE_REQ_DESIRED_ACCESS = 24
CREATE_REQ_FILE_ATTRIBUTES = 28
CREATE_REQ_SHARE_ACCESS = 32
CREATE_REQ_DISPOSITION = 36
CREATE_REQ_OPTIONS = 40
CREATE_REQ_NAME_OFFSET = 44
CREATE_REQ_NAME_LENGTH = 46
CREATE_REQ_CONTEXTS_OFFSET = 48
CREATE_REQ_CONTEXTS_LENGTH = 52
CREATE_REQ_SIZE = 56
CREATE_RESP_OPLOCK_LEVEL = 2  # 1 byte
CREATE_RESP_ACTION = 4
CREATE_RESP_END_OF_FILE = 48
CREATE_RESP_FILE_ATTRIBUTES = 56
CREATE_RESP_FILE_ID = 64
CREATE_RESP_CONTEXTS_OFFSET = 80
CREATE_RESP_CONTEXTS_LENGTH = 84
CREATE_RESP_SIZE = 88

# SMB2_CREATE_CONTEXT (2.2.13.2): offsets from the context's start
CTX_NEXT = 0
CTX_NAME_OFFSET = 4
CTX_NAME_LENGTH = 6
CTX_DATA_OFFSET = 10
CTX_DATA_LENGTH = 12
CTX_HEADER = 16
CTX_GUID_NAME_LENGTH = 16  # a context named by a GUID (2.2.13.2: e.g. SVHDX_OPEN_DEVICE_CONTEXT)
CTX_NAME_SHOWN = 32  # name bytes listed in create_contexts (tags are 4 bytes; longer ones are cut)
CTX_TAG_LENGTH = 4  # the names the spec defines are 4 ASCII bytes (2.2.13.2)
CTX_LEASE_NAME = b"RqLs"  # SMB2_CREATE_REQUEST_LEASE(_V2) (2.2.13.2.8, 2.2.13.2.10)
LEASE_NAME_0, LEASE_NAME_1, LEASE_NAME_2, LEASE_NAME_3 = CTX_LEASE_NAME
# SMB2_CREATE_REQUEST_LEASE (2.2.13.2.8) / _V2 (2.2.13.2.10); the responses (2.2.14.2.10/11) alike
LEASE_KEY = 0  # 16 bytes
LEASE_STATE = 16
LEASE_FLAGS = 20
LEASE_V1_SIZE = 32
LEASE_PARENT_KEY = 32  # v2 only, 16 bytes
LEASE_EPOCH = 48  # v2 only
LEASE_V2_SIZE = 52
GUID_SIZE = 16  # MS-DTYP 2.3.4
GUID_TEXT_SIZE = 36  # 8-4-4-4-12 hex digits and dashes

# --- CLOSE (2.2.15 / 2.2.16), FLUSH (2.2.17) -----------------------------------------------------------
CLOSE_FLAGS = 2
CLOSE_FLAG_POSTQUERY_ATTRIB = 0x0001
CLOSE_REQ_FILE_ID = 8
CLOSE_REQ_SIZE = 24
CLOSE_RESP_END_OF_FILE = 48
CLOSE_RESP_FILE_ATTRIBUTES = 56
CLOSE_RESP_SIZE = 60
FLUSH_REQ_FILE_ID = 8
FLUSH_REQ_SIZE = 24
FILE_ID_PERSISTENT = 0  # SMB2_FILEID (2.2.14.1), 8 bytes each
FILE_ID_VOLATILE = 8
FILE_ID_SIZE = 16

# --- READ (2.2.19 / 2.2.20), WRITE (2.2.21 / 2.2.22) ---------------------------------------------------------
RW_REQ_LENGTH = 4
RW_REQ_OFFSET = 8
RW_REQ_FILE_ID = 16
RW_REQ_SIZE = 48
RW_RESP_LENGTH = 4  # READ DataLength, WRITE Count
RW_RESP_SIZE = 8

# --- LOCK (2.2.26, SMB2_LOCK_ELEMENT 2.2.26.1) -------------------------------------------------------------
LOCK_COUNT = 2
LOCK_FILE_ID = 8
LOCK_ELEMENTS = 24
LOCK_REQ_SIZE = 24  # up to the first element
LOCK_ELEMENT_OFFSET = 0
LOCK_ELEMENT_LENGTH = 8
LOCK_ELEMENT_FLAGS = 16
LOCK_ELEMENT_SIZE = 24

# --- IOCTL (2.2.31 / 2.2.32) ---------------------------------------------------------------------------------
IOCTL_CTL_CODE = 4
IOCTL_FILE_ID = 8
IOCTL_SIZE = 24

# --- QUERY_DIRECTORY (2.2.33), CHANGE_NOTIFY (2.2.35) -------------------------------------------------------
QD_INFO_CLASS = 2  # 1 byte
QD_FILE_ID = 8
QD_NAME_OFFSET = 24
QD_NAME_LENGTH = 26
QD_SIZE = 32
CN_FLAGS = 2
CN_FILE_ID = 8
CN_COMPLETION_FILTER = 24
CN_SIZE = 32

# --- QUERY_INFO (2.2.37), SET_INFO (2.2.39) ----------------------------------------------------------------
QI_INFO_TYPE = 2  # 1 byte
QI_INFO_CLASS = 3  # 1 byte
QI_FILE_ID = 24
QI_SIZE = 40
SI_INFO_TYPE = 2  # 1 byte
SI_INFO_CLASS = 3  # 1 byte
SI_BUFFER_LENGTH = 4
SI_BUFFER_OFFSET = 8  # from the SMB2 header
SI_FILE_ID = 16
SI_SIZE = 32
INFO_FILE = 0x01  # SMB2_0_INFO_FILE (2.2.37 InfoType)

# SET_INFO buffers (MS-FSCC 2.4): offsets from the buffer's start
RENAME_NAME_LENGTH = 16  # FILE_RENAME_INFORMATION, SMB2 form (2.4.37.2); FILE_LINK_INFORMATION alike (2.4.27.2)
RENAME_NAME = 20
RENAME_SIZE = 20
DISPOSITION_DELETE_PENDING = 0  # FILE_DISPOSITION_INFORMATION (2.4.11), 1 byte
DISPOSITION_EX_FLAGS = 0  # FILE_DISPOSITION_INFORMATION_EX (2.4.12)
DISPOSITION_EX_SIZE = 4
FILE_DISPOSITION_DELETE = 0x00000001  # 2.4.12 Flags
END_OF_FILE = 0  # FILE_END_OF_FILE_INFORMATION (2.4.14)
END_OF_FILE_SIZE = 8
BASIC_FILE_ATTRIBUTES = 32  # FILE_BASIC_INFORMATION (2.4.7)
BASIC_SIZE = 36  # up to and including FileAttributes

# --- OPLOCK_BREAK (2.2.23 - 2.2.25), told apart by StructureSize ---------------------------------------------
OPLOCK_BREAK_SIZE = 24  # oplock notification / ack / response (2.2.23.1, 2.2.24.1, 2.2.25.1)
OPLOCK_BREAK_LEVEL = 2  # 1 byte
OPLOCK_BREAK_FILE_ID = 8
LEASE_BREAK_NOTIFICATION_SIZE = 44  # 2.2.23.2
LEASE_BREAK_ACK_SIZE = 36  # ack (2.2.24.2) and response (2.2.25.2)
LEASE_BREAK_EPOCH = 2  # notification: NewEpoch
LEASE_BREAK_FLAGS = 4
LEASE_BREAK_KEY = 8  # 16 bytes
LEASE_BREAK_STATE = 24  # notification: CurrentLeaseState; ack / response: LeaseState
LEASE_BREAK_NEW_STATE = 28  # notification only
LEASE_BREAK_REASON = 32  # notification only
UNSOLICITED = -1  # MessageId 0xFFFFFFFFFFFFFFFF (3.3.4.6, 3.3.4.7) as an int64 bit pattern

# --- SMB2 TRANSFORM_HEADER (2.2.41), COMPRESSION_TRANSFORM_HEADER (2.2.42) -----------------------------
TRANSFORM_ORIGINAL_SIZE = 36
TRANSFORM_SESSION_ID = 44
TRANSFORM_SIZE = 52
COMPRESSED_ORIGINAL_SIZE = 4
COMPRESSED_SIZE = 16

# --- SMB1 header (MS-CIFS 2.2.3.1) ---------------------------------------------------------------------------
SMB1_COMMAND = 4  # 1 byte
SMB1_STATUS = 5
SMB1_FLAGS = 9  # 1 byte
SMB1_FLAGS_REPLY = 0x80
SMB1_FLAGS2 = 10
SMB1_FLAGS2_NT_STATUS = 0x4000
SMB1_TID = 24
SMB1_UID = 28
SMB1_MID = 30
SMB1_SIZE = 32
