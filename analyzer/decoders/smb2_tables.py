"""SMB2/3 code tables (MS-SMB2, MS-FSCC), as named dicts in the order the specs list them.

The kernels return numbers; :mod:`analyzer.decoders.smb2` turns them into names with vectorised
``replace_strict``. NTSTATUS lives in :mod:`analyzer.decoders.ntstatus`.
"""
from __future__ import annotations

# MS-SMB2 2.2.1.2 (Command)
COMMANDS: dict[int, str] = {
    0x0000: "NEGOTIATE",
    0x0001: "SESSION_SETUP",
    0x0002: "LOGOFF",
    0x0003: "TREE_CONNECT",
    0x0004: "TREE_DISCONNECT",
    0x0005: "CREATE",
    0x0006: "CLOSE",
    0x0007: "FLUSH",
    0x0008: "READ",
    0x0009: "WRITE",
    0x000A: "LOCK",
    0x000B: "IOCTL",
    0x000C: "CANCEL",
    0x000D: "ECHO",
    0x000E: "QUERY_DIRECTORY",
    0x000F: "CHANGE_NOTIFY",
    0x0010: "QUERY_INFO",
    0x0011: "SET_INFO",
    0x0012: "OPLOCK_BREAK",
    0x0013: "SERVER_TO_CLIENT_NOTIFICATION",
}
UNKNOWN_COMMAND = "UNKNOWN"
COMMAND_NAMES = [*COMMANDS.values(), UNKNOWN_COMMAND]

# Command codes the kernel and the pairing use.
NEGOTIATE, SESSION_SETUP, LOGOFF, TREE_CONNECT, TREE_DISCONNECT, CREATE, CLOSE, FLUSH, READ, WRITE, \
    LOCK, IOCTL, CANCEL, ECHO, QUERY_DIRECTORY, CHANGE_NOTIFY, QUERY_INFO, SET_INFO, OPLOCK_BREAK, \
    SERVER_TO_CLIENT_NOTIFICATION = range(20)

# MS-SMB2 2.2.1.2 (Flags)
FLAGS_SERVER_TO_REDIR = 0x00000001
FLAGS_ASYNC_COMMAND = 0x00000002
FLAGS_RELATED_OPERATIONS = 0x00000004
FLAGS_SIGNED = 0x00000008
FLAGS_PRIORITY_MASK = 0x00000070
FLAGS_DFS_OPERATIONS = 0x10000000
FLAGS_REPLAY_OPERATION = 0x20000000

# What an NBSS message holds (MS-SMB2 2.2.1 ProtocolId, 2.2.41, 2.2.42; MS-CIFS 2.2.3.1).
KINDS = ["smb2", "transform", "compressed", "smb1", "unknown"]
KIND_SMB2, KIND_TRANSFORM, KIND_COMPRESSED, KIND_SMB1, KIND_UNKNOWN = range(5)

# MS-SMB2 2.2.3 / 2.2.4 (DialectRevision); 0x02FF is the wildcard of a multi-protocol negotiate.
DIALECTS: dict[int, str] = {
    0x0202: "2.0.2",
    0x0210: "2.1",
    0x02FF: "2.???",
    0x0300: "3.0",
    0x0302: "3.0.2",
    0x0311: "3.1.1",
}

# MS-SMB2 2.2.10 (ShareType)
SHARE_TYPES: dict[int, str] = {0x01: "disk", 0x02: "pipe", 0x03: "print"}

# MS-SMB2 2.2.13 (RequestedOplockLevel), 2.2.14 (OplockLevel), 2.2.23.1 / 2.2.24.1 (OplockLevel)
OPLOCK_LEVELS: dict[int, str] = {0x00: "none", 0x01: "level2", 0x08: "exclusive", 0x09: "batch", 0xFF: "lease"}
OPLOCK_NAMES = [*OPLOCK_LEVELS.values(), "invalid"]

# MS-SMB2 2.2.13 (CreateDisposition)
CREATE_DISPOSITIONS: dict[int, str] = {
    0: "SUPERSEDE", 1: "OPEN", 2: "CREATE", 3: "OPEN_IF", 4: "OVERWRITE", 5: "OVERWRITE_IF",
}
DISPOSITION_NAMES = [*CREATE_DISPOSITIONS.values(), "invalid"]

# MS-SMB2 2.2.14 (CreateAction)
CREATE_ACTIONS: dict[int, str] = {0: "SUPERSEDED", 1: "OPENED", 2: "CREATED", 3: "OVERWRITTEN"}
ACTION_NAMES = [*CREATE_ACTIONS.values(), "invalid"]

# MS-SMB2 2.2.13 (CreateOptions), the bit that matters for breaks and TOCTOU
FILE_DIRECTORY_FILE = 0x00000001
FILE_DELETE_ON_CLOSE = 0x00001000

# MS-SMB2 2.2.13.2.8 (LeaseState), 2.2.23.2 (Flags)
LEASE_READ_CACHING = 0x01
LEASE_HANDLE_CACHING = 0x02
LEASE_WRITE_CACHING = 0x04
NOTIFY_BREAK_LEASE_FLAG_ACK_REQUIRED = 0x01
LEASE_FLAG_PARENT_LEASE_KEY_SET = 0x04

# The forms of OPLOCK_BREAK, told apart by StructureSize, direction and MessageId
# (MS-SMB2 2.2.23.1, 2.2.23.2, 2.2.24.1, 2.2.24.2, 2.2.25.1, 2.2.25.2).
BREAK_KINDS = ["oplock_break_notification", "oplock_break_ack", "oplock_break_response",
               "lease_break_notification", "lease_break_ack", "lease_break_response"]
(BREAK_NONE, BREAK_OPLOCK_NOTIFICATION, BREAK_OPLOCK_ACK, BREAK_OPLOCK_RESPONSE, BREAK_LEASE_NOTIFICATION,
 BREAK_LEASE_ACK, BREAK_LEASE_RESPONSE) = range(7)
UNSOLICITED_MESSAGE_ID = 0xFFFFFFFFFFFFFFFF  # MS-SMB2 3.3.4.6, 3.3.4.7

# MS-SMB2 2.2.37 (InfoType)
INFO_TYPES: dict[int, str] = {0x01: "FILE", 0x02: "FILESYSTEM", 0x03: "SECURITY", 0x04: "QUOTA"}

# MS-FSCC 2.4 (file information classes)
FILE_INFO_CLASSES: dict[int, str] = {
    1: "FileDirectoryInformation",
    2: "FileFullDirectoryInformation",
    3: "FileBothDirectoryInformation",
    4: "FileBasicInformation",
    5: "FileStandardInformation",
    6: "FileInternalInformation",
    7: "FileEaInformation",
    8: "FileAccessInformation",
    9: "FileNameInformation",
    10: "FileRenameInformation",
    11: "FileLinkInformation",
    12: "FileNamesInformation",
    13: "FileDispositionInformation",
    14: "FilePositionInformation",
    15: "FileFullEaInformation",
    16: "FileModeInformation",
    17: "FileAlignmentInformation",
    18: "FileAllInformation",
    19: "FileAllocationInformation",
    20: "FileEndOfFileInformation",
    21: "FileAlternateNameInformation",
    22: "FileStreamInformation",
    23: "FilePipeInformation",
    24: "FilePipeLocalInformation",
    25: "FilePipeRemoteInformation",
    26: "FileMailslotQueryInformation",
    27: "FileMailslotSetInformation",
    28: "FileCompressionInformation",
    29: "FileObjectIdInformation",
    31: "FileMoveClusterInformation",
    32: "FileQuotaInformation",
    33: "FileReparsePointInformation",
    34: "FileNetworkOpenInformation",
    35: "FileAttributeTagInformation",
    36: "FileTrackingInformation",
    37: "FileIdBothDirectoryInformation",
    38: "FileIdFullDirectoryInformation",
    39: "FileValidDataLengthInformation",
    40: "FileShortNameInformation",
    44: "FileSfioReserveInformation",
    45: "FileSfioVolumeInformation",
    46: "FileHardLinkInformation",
    48: "FileNormalizedNameInformation",
    50: "FileIdGlobalTxDirectoryInformation",
    54: "FileStandardLinkInformation",
    59: "FileIdInformation",
    60: "FileIdExtdDirectoryInformation",
    64: "FileDispositionInformationEx",
    65: "FileRenameInformationEx",
}
FILE_BASIC_INFORMATION = 4
FILE_RENAME_INFORMATION = 10
FILE_LINK_INFORMATION = 11
FILE_DISPOSITION_INFORMATION = 13
FILE_END_OF_FILE_INFORMATION = 20
FILE_DISPOSITION_INFORMATION_EX = 64
FILE_RENAME_INFORMATION_EX = 65

# MS-FSCC 2.5 (file system information classes)
FS_INFO_CLASSES: dict[int, str] = {
    1: "FileFsVolumeInformation",
    2: "FileFsLabelInformation",
    3: "FileFsSizeInformation",
    4: "FileFsDeviceInformation",
    5: "FileFsAttributeInformation",
    6: "FileFsControlInformation",
    7: "FileFsFullSizeInformation",
    8: "FileFsObjectIdInformation",
    9: "FileFsDriverPathInformation",
    10: "FileFsVolumeFlagsInformation",
    11: "FileFsSectorSizeInformation",
}

# MS-SMB2 2.2.31 (CtlCode) and MS-FSCC 2.3 (FSCTL codes)
FSCTLS: dict[int, str] = {
    0x00060194: "FSCTL_DFS_GET_REFERRALS",
    0x000601B0: "FSCTL_DFS_GET_REFERRALS_EX",
    0x00090018: "FSCTL_LOCK_VOLUME",
    0x0009001C: "FSCTL_UNLOCK_VOLUME",
    0x0009002C: "FSCTL_IS_PATHNAME_VALID",
    0x0009003C: "FSCTL_GET_COMPRESSION",
    0x00090060: "FSCTL_FILESYSTEM_GET_STATISTICS",
    0x00090064: "FSCTL_GET_NTFS_VOLUME_DATA",
    0x00090073: "FSCTL_GET_RETRIEVAL_POINTERS",
    0x0009008F: "FSCTL_FIND_FILES_BY_SID",
    0x00090098: "FSCTL_SET_OBJECT_ID",
    0x0009009C: "FSCTL_GET_OBJECT_ID",
    0x000900A0: "FSCTL_DELETE_OBJECT_ID",
    0x000900A4: "FSCTL_SET_REPARSE_POINT",
    0x000900A8: "FSCTL_GET_REPARSE_POINT",
    0x000900AC: "FSCTL_DELETE_REPARSE_POINT",
    0x000900C0: "FSCTL_CREATE_OR_GET_OBJECT_ID",
    0x000900C4: "FSCTL_SET_SPARSE",
    0x000900EB: "FSCTL_READ_FILE_USN_DATA",
    0x0009013C: "FSCTL_QUERY_ON_DISK_VOLUME_INFO",
    0x00090194: "FSCTL_SET_ZERO_ON_DEALLOCATION",
    0x0009027C: "FSCTL_GET_INTEGRITY_INFORMATION",
    0x00090284: "FSCTL_QUERY_FILE_REGIONS",
    0x00090300: "FSCTL_QUERY_SHARED_VIRTUAL_DISK_SUPPORT",
    0x00090304: "FSCTL_SVHDX_SYNC_TUNNEL_REQUEST",
    0x00090350: "FSCTL_STORAGE_QOS_CONTROL",
    0x000940CF: "FSCTL_QUERY_ALLOCATED_RANGES",
    0x00094264: "FSCTL_OFFLOAD_READ",
    0x000980C8: "FSCTL_SET_ZERO_DATA",
    0x00098208: "FSCTL_FILE_LEVEL_TRIM",
    0x00098268: "FSCTL_OFFLOAD_WRITE",
    0x00098344: "FSCTL_DUPLICATE_EXTENTS_TO_FILE",
    0x0009C040: "FSCTL_SET_COMPRESSION",
    0x0009C280: "FSCTL_SET_INTEGRITY_INFORMATION",
    0x0011400C: "FSCTL_PIPE_PEEK",
    0x00110018: "FSCTL_PIPE_WAIT",
    0x0011C017: "FSCTL_PIPE_TRANSCEIVE",
    0x00140078: "FSCTL_SRV_REQUEST_RESUME_KEY",
    0x001401D4: "FSCTL_LMR_REQUEST_RESILIENCY",
    0x001401FC: "FSCTL_QUERY_NETWORK_INTERFACE_INFO",
    0x00140204: "FSCTL_VALIDATE_NEGOTIATE_INFO",
    0x00144064: "FSCTL_SRV_ENUMERATE_SNAPSHOTS",
    0x001440F2: "FSCTL_SRV_COPYCHUNK",
    0x001441BB: "FSCTL_SRV_READ_HASH",
    0x001480F2: "FSCTL_SRV_COPYCHUNK_WRITE",
}

# Why a message row did not decode fully (the kernel's codes, in order; 0 = decoded).
DECODE_ERRORS = ["truncated", "bad header", "bad structure size", "bad next command", "bad offset",
                 "bad create context", "unknown protocol", "bad lock count"]
(E_NONE, E_TRUNCATED, E_BAD_HEADER, E_BAD_STRUCTURE_SIZE, E_BAD_NEXT_COMMAND, E_BAD_OFFSET,
 E_BAD_CREATE_CONTEXT, E_UNKNOWN_PROTOCOL, E_BAD_LOCK_COUNT) = range(9)

# MS-SMB2 2.2.35 (Flags)
WATCH_TREE = 0x0001
