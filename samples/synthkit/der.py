"""ASN.1 DER / BER encoding (ITU-T X.690), the subset Kerberos, LDAP and SPNEGO use."""
from __future__ import annotations

import time

from .base import SEC

# Universal tags (X.680 §8.4, Table 1) with the constructed bit where X.690 §8.9/§8.11 set it
TAG_BOOLEAN = 0x01
TAG_INTEGER = 0x02
TAG_BIT_STRING = 0x03
TAG_OCTET_STRING = 0x04
TAG_OID = 0x06
TAG_ENUMERATED = 0x0A
TAG_GENERALIZED_TIME = 0x18
TAG_GENERAL_STRING = 0x1B
TAG_SEQUENCE = 0x30             # SEQUENCE, constructed (X.690 §8.9)
TAG_SET = 0x31                  # SET, constructed (X.690 §8.11)
# Identifier octet classes (X.690 §8.1.2.2, Table 1) and the constructed bit (§8.1.2.5)
CLASS_APPLICATION = 0x40
CLASS_CONTEXT = 0x80
CONSTRUCTED = 0x20
LONG_LENGTH = 0x80              # long form length: 0x80 | number of length octets (X.690 §8.1.3.5)
BOOLEAN_TRUE = 0xFF             # DER encodes TRUE as all ones (X.690 §11.1)


def der_len(n: int) -> bytes:
    if n < LONG_LENGTH:
        return bytes((n,))
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((LONG_LENGTH | len(b),)) + b


def tlv(tag: int, content: bytes) -> bytes:
    return bytes((tag,)) + der_len(len(content)) + content


def der_seq(*items: bytes) -> bytes:
    return tlv(TAG_SEQUENCE, b"".join(items))


def der_set(*items: bytes) -> bytes:
    return tlv(TAG_SET, b"".join(items))


def ctx(n: int, content: bytes) -> bytes:
    """[n] EXPLICIT (constructed context tag)."""
    return tlv(CLASS_CONTEXT | CONSTRUCTED | n, content)


def app(n: int, content: bytes) -> bytes:
    """[APPLICATION n] constructed."""
    return tlv(CLASS_APPLICATION | CONSTRUCTED | n, content)


def der_int(v: int, tag: int = TAG_INTEGER) -> bytes:
    n = ((v if v >= 0 else ~v).bit_length() + 8) // 8
    return tlv(tag, v.to_bytes(n, "big", signed=True))


def der_enum(v: int) -> bytes:
    return der_int(v, TAG_ENUMERATED)


def der_octets(b: bytes | str) -> bytes:
    return tlv(TAG_OCTET_STRING, b.encode() if isinstance(b, str) else b)


def der_bool(v: bool) -> bytes:
    return tlv(TAG_BOOLEAN, bytes((BOOLEAN_TRUE,)) if v else b"\x00")


def der_gstring(s: str) -> bytes:
    return tlv(TAG_GENERAL_STRING, s.encode())


def der_bits32(v: int) -> bytes:
    """A 32-bit BIT STRING (no unused bits in the last octet: X.690 §8.6.2.2)."""
    return tlv(TAG_BIT_STRING, b"\x00" + v.to_bytes(4, "big"))


def der_oid(dotted: str) -> bytes:
    """OBJECT IDENTIFIER (X.690 §8.19): the first two arcs in one octet, base-128 subidentifiers."""
    parts = [int(p) for p in dotted.split(".")]
    out = bytearray((40 * parts[0] + parts[1],))
    for p in parts[2:]:
        enc = [p & 0x7F]
        p >>= 7
        while p:
            enc.append(0x80 | (p & 0x7F))
            p >>= 7
        out += bytes(reversed(enc))
    return tlv(TAG_OID, bytes(out))


def der_gtime(text: str) -> bytes:
    """GeneralizedTime (X.680 §46) from its ``YYYYMMDDHHMMSSZ`` text."""
    return tlv(TAG_GENERALIZED_TIME, text.encode())


def der_time(epoch_ns: int) -> bytes:
    return der_gtime(time.strftime("%Y%m%d%H%M%SZ", time.gmtime(epoch_ns // SEC)))
