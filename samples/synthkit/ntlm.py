"""NTLMSSP messages (MS-NLMP §2.2) wrapped in SPNEGO (RFC 4178 §4.2), as SMB2 SESSION_SETUP carries
them; plus the FILETIME and UTF-16 helpers the SMB2 encoders share."""
from __future__ import annotations

import random
import struct

from .base import DOMAIN
from .der import app, ctx, der_enum, der_octets, der_oid, der_seq

OID_SPNEGO = "1.3.6.1.5.5.2"                  # RFC 4178 §3
OID_NTLMSSP = "1.3.6.1.4.1.311.2.2.10"        # MS-NLMP §1.9
NTLM_SIGNATURE = b"NTLMSSP\0"                 # MS-NLMP §2.2.1
# MessageType (MS-NLMP §2.2.1.1-§2.2.1.3)
NTLM_NEGOTIATE, NTLM_CHALLENGE, NTLM_AUTHENTICATE = 1, 2, 3
NTLM_FLAGS = 0xE2088297                       # NegotiateFlags (MS-NLMP §2.2.2.5) of a Windows 10 client
# AV_PAIR AvId (MS-NLMP §2.2.2.1)
AV_NB_COMPUTER, AV_NB_DOMAIN, AV_DNS_COMPUTER, AV_DNS_DOMAIN, AV_DNS_TREE = 1, 2, 3, 4, 5
AV_FLAGS, AV_TIMESTAMP, AV_TARGET_NAME = 6, 7, 9
AV_FLAG_MIC = 2                               # MsvAvFlags: the message carries a MIC
CHALLENGE_PAYLOAD_OFFSET = 56                 # fixed part of CHALLENGE_MESSAGE with Version
AUTHENTICATE_PAYLOAD_OFFSET = 88              # fixed part of AUTHENTICATE_MESSAGE with Version and MIC
# SPNEGO negState (RFC 4178 §4.2.2)
NEG_ACCEPT_COMPLETED, NEG_ACCEPT_INCOMPLETE = 0, 1
FILETIME_EPOCH_OFFSET = 116_444_736_000_000_000   # 100 ns ticks from 1601-01-01 to 1970-01-01 (MS-DTYP §2.3.3)


def filetime(epoch_ns: int) -> int:
    return epoch_ns // 100 + FILETIME_EPOCH_OFFSET


def utf16(s: str) -> bytes:
    return s.encode("utf-16-le")


# VERSION (MS-NLMP §2.2.2.10): Windows 10.0 build 19041, NTLMSSP_REVISION_W2K3 (15)
NTLM_VERSION = struct.pack("<BBH3xB", 10, 0, 19041, 15)


def ntlm_negotiate() -> bytes:
    return NTLM_SIGNATURE + struct.pack("<II", NTLM_NEGOTIATE, NTLM_FLAGS) \
        + struct.pack("<HHIHHI", 0, 0, 0, 0, 0, 0) + NTLM_VERSION


def _av_pairs(pairs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(struct.pack("<HH", i, len(v)) + v for i, v in pairs) + b"\0\0\0\0"   # MsvAvEOL


def ntlm_challenge(challenge: bytes, now_ns: int) -> bytes:
    target = utf16("CORP")
    info = _av_pairs([(AV_NB_DOMAIN, utf16("CORP")), (AV_NB_COMPUTER, utf16("FS01")),
                      (AV_DNS_DOMAIN, utf16(DOMAIN)), (AV_DNS_COMPUTER, utf16("fs01." + DOMAIN)),
                      (AV_DNS_TREE, utf16(DOMAIN)), (AV_TIMESTAMP, struct.pack("<Q", filetime(now_ns)))])
    off = CHALLENGE_PAYLOAD_OFFSET
    return (NTLM_SIGNATURE + struct.pack("<I", NTLM_CHALLENGE)
            + struct.pack("<HHI", len(target), len(target), off)
            + struct.pack("<I", NTLM_FLAGS) + challenge + b"\0" * 8
            + struct.pack("<HHI", len(info), len(info), off + len(target)) + NTLM_VERSION
            + target + info)


def ntlm_authenticate(user: str, host: str, now_ns: int, rnd: random.Random) -> bytes:
    domain, username, ws = utf16("CORP"), utf16(user), utf16(host.upper())
    # NTLMv2_CLIENT_CHALLENGE (MS-NLMP §2.2.2.7): RespType 1, HiRespType 1
    blob = (struct.pack("<BBHI", 1, 1, 0, 0) + struct.pack("<Q", filetime(now_ns)) + rnd.randbytes(8)
            + b"\0" * 4 + _av_pairs([(AV_NB_DOMAIN, utf16("CORP")), (AV_NB_COMPUTER, utf16("FS01")),
                                     (AV_FLAGS, struct.pack("<I", AV_FLAG_MIC)),
                                     (AV_TARGET_NAME, utf16("cifs/fs01." + DOMAIN))]) + b"\0" * 4)
    nt = rnd.randbytes(16) + blob
    lm = b"\0" * 24
    key = rnd.randbytes(16)
    off = AUTHENTICATE_PAYLOAD_OFFSET
    fields, payload = [], b""
    for item in (lm, nt, domain, username, ws, key):
        fields.append(struct.pack("<HHI", len(item), len(item), off + len(payload)))
        payload += item
    return (NTLM_SIGNATURE + struct.pack("<I", NTLM_AUTHENTICATE) + b"".join(fields)
            + struct.pack("<I", NTLM_FLAGS) + NTLM_VERSION + rnd.randbytes(16) + payload)


def spnego_init(mech_token: bytes | None) -> bytes:
    """GSS InitialContextToken (RFC 2743 §3.1) with NegTokenInit (RFC 4178 §4.2.1)."""
    inner = [ctx(0, der_seq(der_oid(OID_NTLMSSP)))]
    if mech_token is not None:
        inner.append(ctx(2, der_octets(mech_token)))
    return app(0, der_oid(OID_SPNEGO) + ctx(0, der_seq(*inner)))


def spnego_resp(state: int | None, token: bytes | None, mech: bool = False, mic: bytes | None = None):
    """NegTokenResp (RFC 4178 §4.2.2) as the [1] choice of NegotiationToken."""
    inner = []
    if state is not None:
        inner.append(ctx(0, der_enum(state)))
    if mech:
        inner.append(ctx(1, der_oid(OID_NTLMSSP)))
    if token is not None:
        inner.append(ctx(2, der_octets(token)))
    if mic is not None:
        inner.append(ctx(3, der_octets(mic)))
    return ctx(1, der_seq(*inner))
