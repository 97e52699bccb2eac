"""The row layout of the SMB2 kernels, shared by the kernels and the frame builder in
:mod:`analyzer.decoders.smb2`: the field vector (``F_*``, ``FIELDS``, their dtypes), the presence
masks (``M_*``), the string slots (``S_*``) and the output arrays (:class:`RowColumns`); plus the
little-endian readers and the small helpers that write one field group into a row.

Per row the command decoders fill an int64 field vector ``f`` (indexes ``F_*``, with a presence bit
mask in ``f[F_PRESENT]``) and a string vector ``s`` (``(start, length)`` pairs into the byte arena;
length -1 = null); :func:`analyzer.decoders.smb2_kernel.decode` stores both once per row (see
``analyzer/kernels/headers.py`` for why) into four 2-D arrays by element size.
64-bit unsigned fields travel as int64 bit patterns and are viewed as uint64 by the caller.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from . import smb2_layout as L

FIELDS = (
    "kind", "chain_index", "chain_offset", "command_code", "status_code", "flags", "is_response",
    "credit_charge", "credit_request", "credit_grant", "message_id", "async_id", "tree_id", "session_id",
    "has_signature", "structure_size", "error_body", "channel_sequence", "dialect", "dialect_count",
    "capabilities", "session_flags", "share_type", "share_flags", "desired_access", "file_attributes",
    "share_access", "create_disposition", "create_options", "oplock_level", "lease_state",
    "new_lease_state", "lease_flags", "lease_version", "lease_epoch", "break_reason", "break_kind",
    "create_action", "end_of_file", "fid_persistent", "fid_volatile", "file_offset", "io_length",
    "lock_count", "lock_offset", "lock_length", "lock_flags", "ctl_code", "info_type", "info_class",
    "delete_pending", "notify_flags", "completion_filter", "original_size", "decode_error",
)
(F_KIND, F_CHAIN_INDEX, F_CHAIN_OFFSET, F_COMMAND_CODE, F_STATUS_CODE, F_FLAGS, F_IS_RESPONSE,
 F_CREDIT_CHARGE, F_CREDIT_REQUEST, F_CREDIT_GRANT, F_MESSAGE_ID, F_ASYNC_ID, F_TREE_ID, F_SESSION_ID,
 F_HAS_SIGNATURE, F_STRUCTURE_SIZE, F_ERROR_BODY, F_CHANNEL_SEQUENCE, F_DIALECT, F_DIALECT_COUNT,
 F_CAPABILITIES, F_SESSION_FLAGS, F_SHARE_TYPE, F_SHARE_FLAGS, F_DESIRED_ACCESS, F_FILE_ATTRIBUTES,
 F_SHARE_ACCESS, F_CREATE_DISPOSITION, F_CREATE_OPTIONS, F_OPLOCK_LEVEL, F_LEASE_STATE,
 F_NEW_LEASE_STATE, F_LEASE_FLAGS, F_LEASE_VERSION, F_LEASE_EPOCH, F_BREAK_REASON, F_BREAK_KIND,
 F_CREATE_ACTION, F_END_OF_FILE, F_FID_PERSISTENT, F_FID_VOLATILE, F_FILE_OFFSET, F_IO_LENGTH,
 F_LOCK_COUNT, F_LOCK_OFFSET, F_LOCK_LENGTH, F_LOCK_FLAGS, F_CTL_CODE, F_INFO_TYPE, F_INFO_CLASS,
 F_DELETE_PENDING, F_NOTIFY_FLAGS, F_COMPLETION_FILTER, F_ORIGINAL_SIZE, F_DECODE_ERROR) = range(55)
N_FIELDS = len(FIELDS)
F_PRESENT = N_FIELDS  # one more slot: bit k set = field k present
assert all(FIELDS[value] == name[2:].lower() for name, value in dict(globals()).items()
           if name.startswith("F_") and name != "F_PRESENT") and N_FIELDS == 55 < 63, \
    "field constants out of step with FIELDS"


def _mask(*fields: int) -> int:
    m = 0
    for field in fields:
        m |= 1 << field
    return m


# Presence masks: which fields a decoding step fills (Numba freezes these module ints as constants).
M_ALWAYS = _mask(F_KIND, F_CHAIN_INDEX, F_CHAIN_OFFSET)
M_DECODE_ERROR = _mask(F_DECODE_ERROR)
M_COMMAND_CODE = _mask(F_COMMAND_CODE)
M_IS_RESPONSE = _mask(F_IS_RESPONSE)
M_HEADER = _mask(F_COMMAND_CODE, F_FLAGS, F_IS_RESPONSE, F_CREDIT_CHARGE, F_MESSAGE_ID, F_SESSION_ID,
                 F_HAS_SIGNATURE)
M_RESPONSE_HEADER = _mask(F_STATUS_CODE, F_CREDIT_GRANT)
M_REQUEST_HEADER = _mask(F_CHANNEL_SEQUENCE, F_CREDIT_REQUEST)
M_ASYNC_ID = _mask(F_ASYNC_ID)
M_TREE_ID = _mask(F_TREE_ID)
M_STRUCTURE_SIZE = _mask(F_STRUCTURE_SIZE)
M_ERROR_BODY = _mask(F_ERROR_BODY)
M_NEGOTIATE_REQUEST = _mask(F_DIALECT_COUNT, F_CAPABILITIES)
M_NEGOTIATE_RESPONSE = _mask(F_DIALECT, F_CAPABILITIES)
M_SESSION_FLAGS = _mask(F_SESSION_FLAGS)
M_CAPABILITIES = _mask(F_CAPABILITIES)
M_TREE_CONNECT_RESPONSE = _mask(F_SHARE_TYPE, F_SHARE_FLAGS)
M_CREATE_REQUEST = _mask(F_OPLOCK_LEVEL, F_DESIRED_ACCESS, F_FILE_ATTRIBUTES, F_SHARE_ACCESS,
                         F_CREATE_DISPOSITION, F_CREATE_OPTIONS)
M_CREATE_RESPONSE = _mask(F_CREATE_ACTION)
M_OPLOCK_LEVEL = _mask(F_OPLOCK_LEVEL)
M_EOF_ATTRIBUTES = _mask(F_END_OF_FILE, F_FILE_ATTRIBUTES)
M_END_OF_FILE = _mask(F_END_OF_FILE)
M_FILE_ATTRIBUTES = _mask(F_FILE_ATTRIBUTES)
M_LEASE = _mask(F_LEASE_STATE, F_LEASE_FLAGS, F_LEASE_VERSION)
M_LEASE_EPOCH = _mask(F_LEASE_EPOCH)
M_FID = _mask(F_FID_PERSISTENT, F_FID_VOLATILE)
M_IO_LENGTH = _mask(F_IO_LENGTH)
M_FILE_OFFSET = _mask(F_FILE_OFFSET)
M_LOCK_COUNT = _mask(F_LOCK_COUNT)
M_LOCK_RANGE = _mask(F_LOCK_OFFSET, F_LOCK_LENGTH, F_LOCK_FLAGS)
M_CTL_CODE = _mask(F_CTL_CODE)
M_INFO_CLASS = _mask(F_INFO_CLASS)
M_INFO_TYPE_CLASS = _mask(F_INFO_TYPE, F_INFO_CLASS)
M_CHANGE_NOTIFY = _mask(F_NOTIFY_FLAGS, F_COMPLETION_FILTER)
M_DELETE_PENDING = _mask(F_DELETE_PENDING)
M_BREAK_KIND = _mask(F_BREAK_KIND)
M_LEASE_BREAK_NOTIFICATION = _mask(F_BREAK_KIND, F_LEASE_EPOCH, F_LEASE_FLAGS, F_LEASE_STATE,
                                   F_NEW_LEASE_STATE, F_BREAK_REASON)
M_LEASE_BREAK_ACK = _mask(F_BREAK_KIND, F_LEASE_FLAGS, F_LEASE_STATE)
M_ORIGINAL_SIZE = _mask(F_ORIGINAL_SIZE)
M_TRANSFORM = _mask(F_ORIGINAL_SIZE, F_SESSION_ID)
M_STATUS_CODE = _mask(F_STATUS_CODE)
M_SMB1 = _mask(F_COMMAND_CODE, F_IS_RESPONSE, F_TREE_ID, F_SESSION_ID, F_MESSAGE_ID)


# Kernel dtypes; uint64 fields are int64 here (bit patterns) and viewed as uint64 by the caller.
U64_FIELDS = ("message_id", "async_id", "session_id", "end_of_file", "fid_persistent", "fid_volatile",
        "file_offset", "lock_offset", "lock_length")
_DTYPES = {name: np.int64 for name in U64_FIELDS} | {
    "kind": np.uint8, "chain_index": np.uint32, "chain_offset": np.uint32, "command_code": np.uint16,
    "status_code": np.uint32, "flags": np.uint32, "is_response": np.bool_, "credit_charge": np.uint16,
    "credit_request": np.uint16, "credit_grant": np.uint16, "tree_id": np.uint32,
    "has_signature": np.bool_, "structure_size": np.uint16, "error_body": np.bool_,
    "channel_sequence": np.uint16, "dialect": np.uint16, "dialect_count": np.uint16,
    "capabilities": np.uint32, "session_flags": np.uint16, "share_type": np.uint8,
    "share_flags": np.uint32, "desired_access": np.uint32, "file_attributes": np.uint32,
    "share_access": np.uint32, "create_disposition": np.uint32, "create_options": np.uint32,
    "oplock_level": np.uint8, "lease_state": np.uint32, "new_lease_state": np.uint32,
    "lease_flags": np.uint32, "lease_version": np.uint8, "lease_epoch": np.uint16,
    "break_reason": np.uint32, "break_kind": np.uint8, "create_action": np.uint32, "io_length": np.uint32,
    "lock_count": np.uint16, "lock_flags": np.uint32, "ctl_code": np.uint32, "info_type": np.uint8,
    "info_class": np.uint8, "delete_pending": np.bool_, "notify_flags": np.uint16,
    "completion_filter": np.uint32, "original_size": np.uint32, "decode_error": np.uint8,
}
FIELD_DTYPES = {name: _DTYPES[name] for name in FIELDS}

# String columns: (start, length) pairs in the string vector.
STRINGS = ("tree", "filename", "pattern", "target_name", "lease_key", "parent_lease_key",
           "create_contexts", "dialects")
S_TREE, S_FILENAME, S_PATTERN, S_TARGET_NAME, S_LEASE_KEY, S_PARENT_LEASE_KEY, S_CREATE_CONTEXTS, \
    S_DIALECTS = range(8)
N_STRINGS = len(STRINGS)  # "dialects" holds raw little-endian uint16s, not text (a List column)

# The output: one 2-D array per element size, [column, row], so each column is a contiguous row of
# its array (a namedtuple of ~70 typed arrays cost Numba seconds more compile time). The kernel
# stores only the fields a row has (about 15 of 55): each column is a separate memory stream, and
# writing all of them for every row made the store the slowest part of the loop.
GROUPS = {8: np.int64, 4: np.uint32, 2: np.uint16, 1: np.uint8}
_GROUP_OF = {name: np.dtype(dtype).itemsize for name, dtype in FIELD_DTYPES.items()}
GROUP_FIELDS = {size: tuple(n for n in FIELDS if _GROUP_OF[n] == size) for size in GROUPS}
# Extra int64 rows after the fields of group 8: presence mask, message index, string starts/lengths.
EXTRA = ("present", "msg") + tuple(f"{n}_{part}" for n in STRINGS for part in ("start", "len"))


class RowColumns:
    """The kernel's output arrays and named access to their rows (one per column)."""

    def __init__(self, n: int):
        n8 = len(GROUP_FIELDS[8]) + len(EXTRA)
        self.o8 = np.zeros((n8, n), np.int64)
        self.o4 = np.zeros((len(GROUP_FIELDS[4]), n), np.uint32)
        self.o2 = np.zeros((len(GROUP_FIELDS[2]), n), np.uint16)
        self.o1 = np.zeros((len(GROUP_FIELDS[1]), n), np.uint8)
        self._where = {}
        for size, arr in ((8, self.o8), (4, self.o4), (2, self.o2), (1, self.o1)):
            for j, name in enumerate(GROUP_FIELDS[size]):
                self._where[name] = (arr, j)
        base = len(GROUP_FIELDS[8])
        for j, name in enumerate(EXTRA):
            self._where[name] = (self.o8, base + j)

    def __getattr__(self, name):
        try:
            arr, j = self.__dict__["_where"][name]
        except KeyError:
            raise AttributeError(name) from None
        return arr[j]


def allocate_rows(n: int) -> RowColumns:
    return RowColumns(n)


# Where each field and string is stored (see decode).
FIELD_GROUP = np.array([(8, 4, 2, 1).index(_GROUP_OF[n]) for n in FIELDS], np.int64)
FIELD_POS = np.array([GROUP_FIELDS[_GROUP_OF[n]].index(n) for n in FIELDS], np.int64)
STRING_BIT = N_FIELDS  # presence bits of the strings follow those of the fields
assert STRING_BIT + N_STRINGS <= 63
X_PRESENT = len(GROUP_FIELDS[8])  # row of o8 holding the presence mask; then msg, then strings


# --- readers and row writers -------------------------------------------------------------------
# Plain (not inline="always") readers: LLVM inlines them anyway; Numba-level inlining of the ~70 call
# sites only cost compile time (measured: no run-time difference).

@njit(cache=True, _nrt=False)
def u16le(buf, off):
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@njit(cache=True, _nrt=False)
def u32le(buf, off):
    return (np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8) | (np.int64(buf[off + 2]) << 16)
            | (np.int64(buf[off + 3]) << 24))


@njit(cache=True, _nrt=False)
def u64le(buf, off):
    return (u32le(buf, off + 4) << 32) | u32le(buf, off)


@njit(cache=True, _nrt=False)
def set_error(f, code):
    """Record the first error of a row (later ones are consequences)."""
    if f[F_DECODE_ERROR] == 0:
        f[F_DECODE_ERROR] = code


@njit(cache=True, _nrt=False)
def put_fid(f, buf, off):
    """The SMB2_FILEID at ``off`` (MS-SMB2 2.2.14.1)."""
    f[F_FID_PERSISTENT] = u64le(buf, off + L.FILE_ID_PERSISTENT)
    f[F_FID_VOLATILE] = u64le(buf, off + L.FILE_ID_VOLATILE)
    f[F_PRESENT] |= M_FID
