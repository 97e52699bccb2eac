#!/usr/bin/env python3
"""Deterministic synthetic captures: normal mixed traffic with labelled pathologies.

    python samples/synth.py --packets 1000000 --seed 1 --out big.pcap [--format pcap|pcapng] [--nanosecond]

writes ``big.pcap`` and ``big.pcap.labels.json``. The same arguments always give byte-identical
files (the randomness is one ``random.Random(seed)``; nothing depends on hash order, the clock or
the platform's byte order).

What is in it
-------------
A capture taken on a switch port next to the servers of a small Windows/Linux site:

* TCP: full handshakes with MSS/wscale/SACK-permitted/timestamp options (Linux- and
  Windows-style), data both ways with delayed ACKs and window-limited bursts, FIN teardown, some
  RSTs (aborts, SYN to a closed port), RTO retransmissions (~200 ms, on WAN paths), duplicate
  ACKs with SACK blocks and fast retransmits, an occasional zero window + probe + window update.
* DNS over UDP (A/AAAA/CNAME answers, NXDOMAIN with SOA, EDNS OPT) and a little over TCP.
* Kerberos over UDP and TCP 88: AS-REQ -> KRB-ERROR 25 -> AS-REQ with PA-ENC-TIMESTAMP -> AS-REP,
  TGS-REQ -> TGS-REP, some KRB-ERROR 6/24.
* LDAP over TCP 389: simple bind, searches with filters, modifies, unbind; messages split across
  segments and several messages per segment.
* SMB2 over TCP 445: NEGOTIATE, SESSION_SETUP (SPNEGO/NTLMSSP), TREE_CONNECT, CREATE with oplocks
  and leases, READ, WRITE, CLOSE, oplock and lease breaks with acks, STATUS_PENDING + async final.
* HTTP/1.1 request/response traffic (the bulk of the bytes) and one-way syslog.
* IPv4 and some IPv6.

Pathologies (one label each, see ``LABEL_KEYS``): a DNS TTL-expiry herd, a DNS retry storm, a
Kerberos AS herd, an SMB2 lease-break queue, a TCP RTO stall on a LAN path, LDAP connection
churn and an SMB2 check-then-use (TOCTOU) window. Normal traffic also contains benign versions
of some of the same mechanics (RTO retransmissions on WAN paths with tens of ms of RTT, quick
oplock/lease breaks, short LDAP connections); those are not labelled.

Labels: ``<capture>.labels.json`` is a JSON list of objects with keys ``detector`` (herd,
retry_storm, smb_break_queue, tcp_stall, toctou, conn_churn), ``start_ns``/``end_ns`` (epoch ns
of the first and last packet of the episode, as written in the capture, i.e. truncated to µs in
µs captures), ``clients`` (list of IP strings), ``server`` (IP string), ``server_port``,
``protocol``, ``resource``, ``description`` and ``parameters`` (detector-specific details).

Speed: every frame is packed with ``struct`` from per-flow precomputed pieces; checksums use the
identity "ones'-complement sum of 16-bit words == value mod 0xFFFF", so one ``int.from_bytes`` per
header/payload replaces a per-word loop: the checksum is ``-sum % 0xFFFF`` (0x0000 rather than
0xFFFF when the sum is "negative zero", as RFC 1624 asks; UDP sends 0xFFFF for a computed 0). dpkt builds the reference templates that the tests
compare against (see ``dpkt_reference_frame``).
"""
from __future__ import annotations

import argparse
import bisect
import ipaddress
import json
import math
import random
import struct
import sys
import time
from dataclasses import dataclass

GENERATOR_VERSION = "1"
BASE_EPOCH_NS = 1_709_542_800 * 1_000_000_000     # 2024-03-04 09:00:00 UTC, a Monday morning
DETECTORS = ("herd", "retry_storm", "smb_break_queue", "tcp_stall", "toctou", "conn_churn")
LABEL_KEYS = ("detector", "start_ns", "end_ns", "clients", "server", "server_port", "protocol",
              "resource", "description", "parameters")
MIN_PACKETS = 1500

US = 1_000
MS = 1_000_000
SEC = 1_000_000_000
MASK32 = 0xFFFFFFFF

REALM = "CORP.EXAMPLE.COM"
DOMAIN = "corp.example.com"

# ================================================================================================
# ASN.1 DER / BER
# ================================================================================================


def der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((0x80 | len(b),)) + b


def tlv(tag: int, content: bytes) -> bytes:
    return bytes((tag,)) + der_len(len(content)) + content


def der_seq(*items: bytes) -> bytes:
    return tlv(0x30, b"".join(items))


def der_set(*items: bytes) -> bytes:
    return tlv(0x31, b"".join(items))


def ctx(n: int, content: bytes) -> bytes:
    """[n] EXPLICIT (constructed context tag)."""
    return tlv(0xA0 | n, content)


def app(n: int, content: bytes) -> bytes:
    """[APPLICATION n] constructed."""
    return tlv(0x60 | n, content)


def der_int(v: int, tag: int = 0x02) -> bytes:
    n = ((v if v >= 0 else ~v).bit_length() + 8) // 8
    return tlv(tag, v.to_bytes(n, "big", signed=True))


def der_enum(v: int) -> bytes:
    return der_int(v, 0x0A)


def der_octets(b: bytes | str) -> bytes:
    return tlv(0x04, b.encode() if isinstance(b, str) else b)


def der_bool(v: bool) -> bytes:
    return tlv(0x01, b"\xff" if v else b"\x00")


def der_gstring(s: str) -> bytes:
    return tlv(0x1B, s.encode())


def der_bits32(v: int) -> bytes:
    return tlv(0x03, b"\x00" + v.to_bytes(4, "big"))


def der_oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    out = bytearray((40 * parts[0] + parts[1],))
    for p in parts[2:]:
        enc = [p & 0x7F]
        p >>= 7
        while p:
            enc.append(0x80 | (p & 0x7F))
            p >>= 7
        out += bytes(reversed(enc))
    return tlv(0x06, bytes(out))


def der_time(epoch_ns: int) -> bytes:
    return tlv(0x18, time.strftime("%Y%m%d%H%M%SZ", time.gmtime(epoch_ns // SEC)).encode())


# ================================================================================================
# Kerberos (RFC 4120)
# ================================================================================================

KRB_AS_REQ, KRB_AS_REP, KRB_TGS_REQ, KRB_TGS_REP, KRB_AP_REQ, KRB_ERROR = 10, 11, 12, 13, 14, 30
NT_PRINCIPAL, NT_SRV_INST, NT_SRV_HST = 1, 2, 3
ETYPE_AES256, ETYPE_AES128, ETYPE_RC4 = 18, 17, 23
KRB_TILL = "20370913024805Z"


def krb_principal(name_type: int, *names: str) -> bytes:
    return der_seq(ctx(0, der_int(name_type)), ctx(1, der_seq(*(der_gstring(n) for n in names))))


def krb_enc(etype: int, cipher: bytes, kvno: int | None = None) -> bytes:
    parts = [ctx(0, der_int(etype))]
    if kvno is not None:
        parts.append(ctx(1, der_int(kvno)))
    parts.append(ctx(2, der_octets(cipher)))
    return der_seq(*parts)


def krb_padata(pa_type: int, value: bytes) -> bytes:
    return der_seq(ctx(1, der_int(pa_type)), ctx(2, der_octets(value)))


def krb_ticket(realm: str, sname: bytes, cipher: bytes, kvno: int = 2) -> bytes:
    return app(1, der_seq(ctx(0, der_int(5)), ctx(1, der_gstring(realm)), ctx(2, sname),
                          ctx(3, krb_enc(ETYPE_AES256, cipher, kvno))))


def krb_req_body(options: int, realm: str, sname: bytes, nonce: int, cname: bytes | None = None,
                 etypes=(ETYPE_AES256, ETYPE_AES128, ETYPE_RC4), addresses: bytes | None = None,
                 rtime: bool = False) -> bytes:
    parts = [ctx(0, der_bits32(options))]
    if cname is not None:
        parts.append(ctx(1, cname))
    parts.append(ctx(2, der_gstring(realm)))
    parts.append(ctx(3, sname))
    parts.append(ctx(5, tlv(0x18, KRB_TILL.encode())))
    if rtime:
        parts.append(ctx(6, tlv(0x18, KRB_TILL.encode())))
    parts.append(ctx(7, der_int(nonce)))
    parts.append(ctx(8, der_seq(*(der_int(e) for e in etypes))))
    if addresses is not None:
        parts.append(ctx(9, addresses))
    return der_seq(*parts)


def krb_kdc_req(msg_type: int, padata: list[bytes], body: bytes) -> bytes:
    parts = [ctx(1, der_int(5)), ctx(2, der_int(msg_type))]
    if padata:
        parts.append(ctx(3, der_seq(*padata)))
    parts.append(ctx(4, body))
    return app(msg_type, der_seq(*parts))


def krb_kdc_rep(msg_type: int, crealm: str, cname: bytes, ticket: bytes, enc_cipher: bytes,
                padata: list[bytes] | None = None) -> bytes:
    parts = [ctx(0, der_int(5)), ctx(1, der_int(msg_type))]
    if padata:
        parts.append(ctx(2, der_seq(*padata)))
    parts += [ctx(3, der_gstring(crealm)), ctx(4, cname), ctx(5, ticket),
              ctx(6, krb_enc(ETYPE_AES256, enc_cipher, 2 if msg_type == KRB_AS_REP else None))]
    return app(msg_type, der_seq(*parts))


def krb_error(code: int, stime_ns: int, realm: str, sname: bytes, cname: bytes | None = None,
              edata: bytes | None = None, etext: str | None = None) -> bytes:
    parts = [ctx(0, der_int(5)), ctx(1, der_int(KRB_ERROR)), ctx(4, der_time(stime_ns)),
             ctx(5, der_int((stime_ns // 1000) % 1_000_000)), ctx(6, der_int(code))]
    if cname is not None:
        parts += [ctx(7, der_gstring(realm)), ctx(8, cname)]
    parts += [ctx(9, der_gstring(realm)), ctx(10, sname)]
    if etext is not None:
        parts.append(ctx(11, der_gstring(etext)))
    if edata is not None:
        parts.append(ctx(12, der_octets(edata)))
    return app(KRB_ERROR, der_seq(*parts))


def krb_etype_info2(salt: str) -> bytes:
    return der_seq(der_seq(ctx(0, der_int(ETYPE_AES256)), ctx(1, der_gstring(salt))),
                   der_seq(ctx(0, der_int(ETYPE_RC4))))


def krb_ap_req(ticket: bytes, authenticator: bytes) -> bytes:
    return app(KRB_AP_REQ, der_seq(ctx(0, der_int(5)), ctx(1, der_int(KRB_AP_REQ)),
                                   ctx(2, der_bits32(0)), ctx(3, ticket),
                                   ctx(4, krb_enc(ETYPE_AES256, authenticator))))


PA_TGS_REQ, PA_ENC_TIMESTAMP, PA_ETYPE_INFO2, PA_PAC_REQUEST = 1, 2, 19, 128
PA_PK_AS_REP_OLD, PA_PK_AS_REQ = 15, 16
KDC_OPT_AS = 0x40810010     # forwardable, renewable, canonicalize, renewable-ok
KDC_OPT_TGS = 0x40810000


# ================================================================================================
# LDAP (RFC 4511)
# ================================================================================================

def ldap_msg(msgid: int, op: bytes) -> bytes:
    return der_seq(der_int(msgid), op)


def ldap_result(app_tag: int, code: int = 0, matched: str = "", diag: str = "") -> bytes:
    return app(app_tag, der_enum(code) + der_octets(matched) + der_octets(diag))


def ldap_bind_req(dn: str, password: str) -> bytes:
    return app(0, der_int(3) + der_octets(dn) + tlv(0x80, password.encode()))


def ldap_search_req(base: str, scope: int, filt: bytes, attrs: list[str], size_limit=0) -> bytes:
    return app(3, der_octets(base) + der_enum(scope) + der_enum(0) + der_int(size_limit)
               + der_int(120) + der_bool(False) + filt
               + der_seq(*(der_octets(a) for a in attrs)))


def ldap_search_entry(dn: str, attrs: list[tuple[str, list[bytes | str]]]) -> bytes:
    return app(4, der_octets(dn) + der_seq(*(
        der_seq(der_octets(t), der_set(*(der_octets(v) for v in vals))) for t, vals in attrs)))


def ldap_modify_req(dn: str, changes: list[tuple[int, str, list[str]]]) -> bytes:
    return app(6, der_octets(dn) + der_seq(*(
        der_seq(der_enum(op), der_seq(der_octets(t), der_set(*(der_octets(v) for v in vals))))
        for op, t, vals in changes)))


LDAP_UNBIND = tlv(0x42, b"")


def f_and(*fs: bytes) -> bytes:
    return tlv(0xA0, b"".join(fs))


def f_or(*fs: bytes) -> bytes:
    return tlv(0xA1, b"".join(fs))


def f_eq(attr: str, value: str) -> bytes:
    return tlv(0xA3, der_octets(attr) + der_octets(value))


def f_present(attr: str) -> bytes:
    return tlv(0x87, attr.encode())


def f_substr(attr: str, initial: str) -> bytes:
    return tlv(0xA4, der_octets(attr) + der_seq(tlv(0x80, initial.encode())))


# ================================================================================================
# DNS
# ================================================================================================

T_A, T_NS, T_CNAME, T_SOA, T_AAAA, T_OPT = 1, 2, 5, 6, 28, 41


class DnsBuilder:
    """Builds one DNS message with name compression."""

    def __init__(self, txid: int, flags: int):
        self.buf = bytearray(12)
        self.txid, self.flags = txid, flags
        self.counts = [0, 0, 0, 0]
        self.names: dict[str, int] = {}

    def name(self, name: str) -> None:
        labels = name.rstrip(".").split(".") if name not in ("", ".") else []
        for i in range(len(labels)):
            suffix = ".".join(labels[i:]).lower()
            off = self.names.get(suffix)
            if off is not None:
                self.buf += struct.pack("!H", 0xC000 | off)
                return
            if len(self.buf) < 0x3FFF:
                self.names[suffix] = len(self.buf)
            lab = labels[i].encode()
            self.buf.append(len(lab))
            self.buf += lab
        self.buf.append(0)

    def question(self, name: str, qtype: int) -> "DnsBuilder":
        self.name(name)
        self.buf += struct.pack("!HH", qtype, 1)
        self.counts[0] += 1
        return self

    def rr(self, section: int, name: str, rtype: int, ttl: int, rdata) -> "DnsBuilder":
        self.name(name)
        self.buf += struct.pack("!HHI", rtype, 1, ttl)
        at = len(self.buf)
        self.buf += b"\0\0"
        if rtype in (T_CNAME, T_NS):
            self.name(rdata)
        elif rtype == T_SOA:
            mname, rname, serial = rdata
            self.name(mname)
            self.name(rname)
            self.buf += struct.pack("!IIIII", serial, 900, 600, 86400, 60)
        elif rtype == T_A:
            self.buf += ipaddress.IPv4Address(rdata).packed
        elif rtype == T_AAAA:
            self.buf += ipaddress.IPv6Address(rdata).packed
        else:
            self.buf += rdata
        struct.pack_into("!H", self.buf, at, len(self.buf) - at - 2)
        self.counts[section] += 1
        return self

    def opt(self, udp_size: int = 1232, do: bool = False, cookie: bytes | None = None):
        self.buf += b"\x00" + struct.pack("!HHI", T_OPT, udp_size, 0x8000 if do else 0)
        rdata = b"" if cookie is None else struct.pack("!HH", 10, len(cookie)) + cookie
        self.buf += struct.pack("!H", len(rdata)) + rdata
        self.counts[3] += 1
        return self

    def bytes(self) -> bytes:
        struct.pack_into("!HHHHHH", self.buf, 0, self.txid, self.flags, *self.counts)
        return bytes(self.buf)


DNS_Q = 0x0100                  # RD
DNS_R = 0x8180                  # QR RD RA
DNS_NX = 0x8183


# ================================================================================================
# NTLMSSP / SPNEGO / SMB2
# ================================================================================================

OID_SPNEGO = "1.3.6.1.5.5.2"
OID_NTLMSSP = "1.3.6.1.4.1.311.2.2.10"
NTLM_FLAGS = 0xE2088297


def filetime(epoch_ns: int) -> int:
    return epoch_ns // 100 + 116_444_736_000_000_000


def utf16(s: str) -> bytes:
    return s.encode("utf-16-le")


NTLM_VERSION = struct.pack("<BBH3xB", 10, 0, 19041, 15)


def ntlm_negotiate() -> bytes:
    return b"NTLMSSP\0" + struct.pack("<II", 1, NTLM_FLAGS) + struct.pack("<HHIHHI", 0, 0, 0, 0, 0, 0) \
        + NTLM_VERSION


def _av_pairs(pairs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(struct.pack("<HH", i, len(v)) + v for i, v in pairs) + b"\0\0\0\0"


def ntlm_challenge(challenge: bytes, now_ns: int) -> bytes:
    target = utf16("CORP")
    info = _av_pairs([(2, utf16("CORP")), (1, utf16("FS01")), (4, utf16(DOMAIN)),
                      (3, utf16("fs01." + DOMAIN)), (5, utf16(DOMAIN)),
                      (7, struct.pack("<Q", filetime(now_ns)))])
    off = 56
    return (b"NTLMSSP\0" + struct.pack("<I", 2) + struct.pack("<HHI", len(target), len(target), off)
            + struct.pack("<I", NTLM_FLAGS) + challenge + b"\0" * 8
            + struct.pack("<HHI", len(info), len(info), off + len(target)) + NTLM_VERSION
            + target + info)


def ntlm_authenticate(user: str, host: str, now_ns: int, rnd: random.Random) -> bytes:
    domain, username, ws = utf16("CORP"), utf16(user), utf16(host.upper())
    blob = (struct.pack("<BBHI", 1, 1, 0, 0) + struct.pack("<Q", filetime(now_ns)) + rnd.randbytes(8)
            + b"\0" * 4 + _av_pairs([(2, utf16("CORP")), (1, utf16("FS01")), (6, struct.pack("<I", 2)),
                                     (9, utf16("cifs/fs01." + DOMAIN))]) + b"\0" * 4)
    nt = rnd.randbytes(16) + blob
    lm = b"\0" * 24
    key = rnd.randbytes(16)
    off = 88
    fields, payload = [], b""
    for item in (lm, nt, domain, username, ws, key):
        fields.append(struct.pack("<HHI", len(item), len(item), off + len(payload)))
        payload += item
    return (b"NTLMSSP\0" + struct.pack("<I", 3) + b"".join(fields) + struct.pack("<I", NTLM_FLAGS)
            + NTLM_VERSION + rnd.randbytes(16) + payload)


def spnego_init(mech_token: bytes | None) -> bytes:
    inner = [ctx(0, der_seq(der_oid(OID_NTLMSSP)))]
    if mech_token is not None:
        inner.append(ctx(2, der_octets(mech_token)))
    return app(0, der_oid(OID_SPNEGO) + ctx(0, der_seq(*inner)))


def spnego_resp(state: int | None, token: bytes | None, mech: bool = False, mic: bytes | None = None):
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


SMB2_NEGOTIATE, SMB2_SESSION_SETUP, SMB2_LOGOFF, SMB2_TREE_CONNECT, SMB2_TREE_DISCONNECT = 0, 1, 2, 3, 4
SMB2_CREATE, SMB2_CLOSE, SMB2_READ, SMB2_WRITE, SMB2_OPLOCK_BREAK = 5, 6, 8, 9, 0x12
FL_RESPONSE, FL_ASYNC = 0x1, 0x2
ST_OK, ST_PENDING, ST_MORE = 0, 0x00000103, 0xC0000016
OPLOCK_NONE, OPLOCK_II, OPLOCK_EXCL, OPLOCK_BATCH, OPLOCK_LEASE = 0, 1, 8, 9, 0xFF
LEASE_R, LEASE_H, LEASE_W = 1, 2, 4
_SMB2H = struct.Struct("<4sHHIHHIIQIIQ16s")
_SMB2A = struct.Struct("<4sHHIHHIIQQQ16s")
ZERO16 = b"\0" * 16


def smb2_hdr(cmd: int, mid: int, status: int = 0, flags: int = 0, tree: int = 0, sess: int = 0,
             credits: int = 1, charge: int = 1, async_id: int | None = None) -> bytes:
    if async_id is not None:
        return _SMB2A.pack(b"\xfeSMB", 64, charge, status, cmd, credits, flags | FL_ASYNC, 0, mid,
                           async_id, sess, ZERO16)
    return _SMB2H.pack(b"\xfeSMB", 64, charge, status, cmd, credits, flags, 0, mid, 0xFEFF, tree, sess,
                       ZERO16)


def nbss(msg: bytes) -> bytes:
    return struct.pack("!I", len(msg)) + msg


def smb2_negotiate_req(client_guid: bytes) -> bytes:
    dialects = (0x202, 0x210, 0x300, 0x302)
    return struct.pack("<HHHHI16sQ", 36, len(dialects), 1, 0, 0x7F, client_guid, 0) \
        + struct.pack("<%dH" % len(dialects), *dialects)


def smb2_negotiate_rsp(server_guid: bytes, now_ns: int, boot_ns: int) -> bytes:
    blob = spnego_init(None)
    return struct.pack("<HHHH16sIIIIQQHHI", 65, 1, 0x302, 0, server_guid, 0x2F, 8388608, 8388608,
                       8388608, filetime(now_ns), filetime(boot_ns), 128, len(blob), 0) + blob


def smb2_session_setup_req(blob: bytes) -> bytes:
    return struct.pack("<HBBIIHHQ", 25, 0, 1, 1, 0, 88, len(blob), 0) + blob


def smb2_session_setup_rsp(blob: bytes, flags: int = 0) -> bytes:
    return struct.pack("<HHHH", 9, flags, 72 if blob else 0, len(blob)) + (blob or b"\0")


def smb2_tree_connect_req(path: str) -> bytes:
    p = utf16(path)
    return struct.pack("<HHHH", 9, 0, 72, len(p)) + p


def smb2_tree_connect_rsp() -> bytes:
    return struct.pack("<HBBIII", 16, 1, 0, 0x0, 0, 0x001F01FF)


def smb2_empty4() -> bytes:
    return struct.pack("<HH", 4, 0)


def lease_ctx(key: bytes, state: int, flags: int = 0) -> bytes:
    return struct.pack("<IHHHHI", 0, 16, 4, 0, 24, 32) + b"RqLs" + b"\0" * 4 \
        + key + struct.pack("<IIQ", state, flags, 0)


def smb2_create_req(name: str, oplock: int, access: int, disposition: int, options: int,
                    lease: tuple[bytes, int] | None = None, share: int = 7) -> bytes:
    nm = utf16(name)
    ctxs = lease_ctx(*lease) if lease else b""
    fixed_end = 64 + 56
    buf = nm if nm else b"\0"
    ctx_off = 0
    if ctxs:
        pad = (-(fixed_end + len(buf))) % 8
        ctx_off = fixed_end + len(buf) + pad
        buf = buf + b"\0" * pad + ctxs
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, oplock, 2, 0, 0, access, 0x80, share, disposition,
                       options, 120, len(nm), ctx_off, len(ctxs)) + buf


def smb2_create_rsp(oplock: int, action: int, fid: bytes, ft: int, size: int,
                    lease: tuple[bytes, int] | None = None, attrs: int = 0x20) -> bytes:
    ctxs = lease_ctx(*lease) if lease else b""
    alloc = (size + 4095) // 4096 * 4096
    return struct.pack("<HBBIQQQQQQII16sII", 89, oplock, 0, action, ft - 10**9, ft, ft, ft, alloc,
                       size, attrs, 0, fid, 152 if ctxs else 0, len(ctxs)) + (ctxs or b"\0" * 8)


def smb2_close_req(fid: bytes, flags: int = 0) -> bytes:
    return struct.pack("<HHI16s", 24, flags, 0, fid)


def smb2_close_rsp(ft: int, size: int, flags: int = 0) -> bytes:
    if not flags:
        return struct.pack("<HHI", 60, 0, 0) + b"\0" * 52
    alloc = (size + 4095) // 4096 * 4096
    return struct.pack("<HHIQQQQQQI", 60, flags, 0, ft - 10**9, ft, ft, ft, alloc, size, 0x20)


def smb2_read_req(fid: bytes, length: int, offset: int) -> bytes:
    return struct.pack("<HBBIQ16sIIIHH", 49, 0x50, 0, length, offset, fid, 1, 0, 0, 0, 0) + b"\0"


def smb2_read_rsp(data: bytes) -> bytes:
    return struct.pack("<HBBIII", 17, 0x50, 0, len(data), 0, 0) + data


def smb2_write_req(fid: bytes, data: bytes, offset: int) -> bytes:
    return struct.pack("<HHIQ16sIIHHI", 49, 0x70, len(data), offset, fid, 0, 0, 0, 0, 0) + data


def smb2_write_rsp(count: int) -> bytes:
    return struct.pack("<HHIIHH", 17, 0, count, 0, 0, 0)


def smb2_oplock_break(level: int, fid: bytes) -> bytes:
    return struct.pack("<HBBI16s", 24, level, 0, 0, fid)


def smb2_lease_break_notify(key: bytes, cur: int, new: int, epoch: int = 0) -> bytes:
    return struct.pack("<HHI16sIIIII", 44, epoch, 1, key, cur, new, 0, 0, 0)


def smb2_lease_break_ack(key: bytes, state: int) -> bytes:
    return struct.pack("<HHI16sIQ", 36, 0, 0, key, state, 0)


def smb2_error_body() -> bytes:
    return struct.pack("<HBBI", 9, 0, 0, 0) + b"\0"


# ================================================================================================
# Frames: hosts, one-direction paths, the packet store
# ================================================================================================

_IP4 = struct.Struct("!BBHHHBBH4s4s").pack
_IP6 = struct.Struct("!IHBB16s16s").pack
_TCP = struct.Struct("!HHIIBBHHH").pack
_UDP = struct.Struct("!HHHH").pack
_TSOPT = struct.Struct("!BBBBII").pack
FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
PROTO_TCP, PROTO_UDP = 6, 17
ROUTER_MAC = bytes.fromhex("00005e000101")


class Host:
    """An endpoint. ``local`` hosts sit on the capture's segment; others come through the router."""
    __slots__ = ("ip", "addr", "v6", "mac", "ttl", "windows", "local", "rtt", "port", "name")

    def __init__(self, ip: str, *, windows: bool, local: bool, rtt: int, port: int, name: str = ""):
        a = ipaddress.ip_address(ip)
        self.ip, self.addr, self.v6 = str(a), a.packed, a.version == 6
        self.mac = b"\x02" + a.packed[-5:] if self.v6 else b"\x02\x00" + a.packed
        self.windows, self.local, self.rtt, self.port = windows, local, rtt, port
        # TTL as seen at the capture point: routed hosts have crossed one hop
        self.ttl = (128 if windows else 64) - (0 if local else 1)
        self.name = name or ip

    def ephemeral(self) -> int:
        p = self.port
        self.port = p + 1 if p < 65535 else 49152
        return p


class Path:
    """One direction of one flow with everything that does not change per packet."""
    __slots__ = ("eth", "src", "dst", "sport", "dport", "psum", "ttl", "v6", "ipid", "proto")

    def __init__(self, a: Host, b: Host, sport: int, dport: int, proto: int, ipid: int):
        if a.v6 != b.v6:
            raise ValueError("mixed address families")
        src_mac = a.mac if a.local else ROUTER_MAC
        dst_mac = b.mac if b.local else ROUTER_MAC
        self.eth = dst_mac + src_mac + (b"\x86\xdd" if a.v6 else b"\x08\x00")
        self.src, self.dst, self.sport, self.dport = a.addr, b.addr, sport, dport
        self.psum = int.from_bytes(a.addr + b.addr, "big") + proto
        self.ttl, self.v6, self.ipid, self.proto = a.ttl, a.v6, ipid, proto


class Store:
    """Timestamps (ns from capture start) and frames in creation order; sorted when written."""

    def __init__(self):
        self.ts: list[int] = []
        self.frames: list[bytes] = []

    def __len__(self) -> int:
        return len(self.ts)

    def rollback(self, mark: int) -> None:
        del self.ts[mark:]
        del self.frames[mark:]

    def _ip(self, t: int, p: Path, l4: bytes, n: int) -> None:
        if p.v6:
            hdr = _IP6(0x60000000, n, p.proto, p.ttl, p.src, p.dst)
        else:
            ipid = p.ipid = (p.ipid + 1) & 0xFFFF
            hdr = _IP4(0x45, 0, 20 + n, ipid, 0x4000, p.ttl, p.proto, 0, p.src, p.dst)
            hdr = _IP4(0x45, 0, 20 + n, ipid, 0x4000, p.ttl, p.proto,
                       -int.from_bytes(hdr, "big") % 0xFFFF, p.src, p.dst)
        self.ts.append(t)
        self.frames.append(p.eth + hdr + l4)

    def tcp(self, t: int, p: Path, seq: int, ack: int, flags: int, win: int, opts: bytes,
            payload: bytes) -> None:
        hl = 20 + len(opts)
        n = hl + len(payload)
        v = int.from_bytes(payload, "big")
        if n & 1:
            v <<= 8
        off = hl << 2
        h = _TCP(p.sport, p.dport, seq, ack, off, flags, win, 0, 0)
        s = p.psum + n + int.from_bytes(h, "big") + int.from_bytes(opts, "big") + v
        h = _TCP(p.sport, p.dport, seq, ack, off, flags, win, -s % 0xFFFF, 0)
        self._ip(t, p, h + opts + payload, n)

    def udp(self, t: int, p: Path, payload: bytes) -> None:
        n = 8 + len(payload)
        v = int.from_bytes(payload, "big")
        if n & 1:
            v <<= 8
        s = p.psum + n + n + (p.sport << 16) + p.dport + v
        self._ip(t, p, _UDP(p.sport, p.dport, n, -s % 0xFFFF or 0xFFFF) + payload, n)   # 0 = "none"


def dpkt_reference_frame(frame: bytes) -> bytes:
    """Re-encode ``frame`` with dpkt, letting dpkt compute every checksum (for tests)."""
    import dpkt
    eth = dpkt.ethernet.Ethernet(frame)
    ip = eth.data
    l4 = ip.data
    if isinstance(l4, (dpkt.tcp.TCP, dpkt.udp.UDP)):
        l4.sum = 0
    if isinstance(ip, dpkt.ip.IP):
        ip.sum = 0
    return bytes(eth)


# ================================================================================================
# TCP connections as seen next to the server
# ================================================================================================

SYN_RTO = 1 * SEC      # the initial retransmission timeout of a SYN (RFC 6298 2.1; Linux, Windows)


class Tcp:
    """A TCP connection seen at a capture point next to the server (side 1).

    Times are capture times in ns. ``rtt`` is the capture point <-> client round trip; the server
    answers ``near`` ns after a segment passes the capture point. ``send`` returns the capture
    time at which the receiver can first be seen reacting to the data.
    """

    def __init__(self, g: "Gen", cli: Host, srv: Host, dport: int, *, sport: int | None = None,
                 ts: bool | None = None, sack: bool = True):
        self.g = g
        r = g.rng
        self.cli, self.srv = cli, srv
        sport = cli.ephemeral() if sport is None else sport
        self.sport, self.dport = sport, dport
        self.p = (Path(cli, srv, sport, dport, PROTO_TCP, r.getrandbits(16)),
                  Path(srv, cli, dport, sport, PROTO_TCP, r.getrandbits(16)))
        self.rtt = cli.rtt + r.randrange(0, max(1, cli.rtt // 20))
        self.near = r.randrange(6 * US, 30 * US)
        self.ts_on = (not cli.windows) if ts is None else ts
        self.sack = sack
        self.mss = 1440 if cli.v6 else 1460
        if self.ts_on:
            self.mss -= 12
        self.nxt = [r.getrandbits(32), r.getrandbits(32)]
        self.tsoff = [r.getrandbits(32), r.getrandbits(32)]
        self.ws = [8, 7]
        self.rwin = [256 * 1024 if cli.windows else 64128, 65160 * 4]
        self.cwnd = [10, 10]
        self.pend: list[int | None] = [None, None]
        self.delack = 40 * MS
        self.last_loss: tuple[int, int] | None = None
        self.gap = (r.randrange(1200, 2500), r.randrange(1100, 1400))   # per-segment spacing
        # "syn" / "tail": this connection loses its first SYN / first server tail segment (Gen's
        # loss hook, drawn from g.loss_rng so that the main random stream stays as it is)
        self.forced_loss = None
        if g.syn_loss_share or g.tail_loss_share:
            if g.loss_rng is None:
                g.loss_rng, g.losses = random.Random(g.seed * 7919 + 17), []
            x = g.loss_rng.random()
            self.forced_loss = ("syn" if x < g.syn_loss_share else
                                "tail" if x < g.syn_loss_share + g.tail_loss_share else None)

    # -- options ----------------------------------------------------------------------------
    def _tsval(self, side: int, t: int) -> int:
        return (self.tsoff[side] + t // MS) & MASK32

    def _opts(self, side: int, t: int, sack_blocks=None) -> bytes:
        o = b""
        if self.ts_on:
            o = _TSOPT(1, 1, 8, 10, self._tsval(side, t), self._tsval(1 - side, t - self.rtt))
        if sack_blocks:
            o += b"\x01\x01" + bytes((5, 2 + 8 * len(sack_blocks))) + b"".join(
                struct.pack("!II", a & MASK32, b & MASK32) for a, b in sack_blocks)
        return o

    def _syn_opts(self, side: int, t: int) -> bytes:
        mss = struct.pack("!BBH", 2, 4, self.mss + (12 if self.ts_on else 0))
        ws = bytes((3, 3, self.ws[side]))
        if self.ts_on:
            tsecr = 0 if side == 0 else self._tsval(0, t - self.rtt)
            ts = struct.pack("!BBII", 8, 10, self._tsval(side, t), tsecr)
            return mss + (b"\x04\x02" if self.sack else b"\x01\x01") + ts + b"\x01" + ws
        if side == 0:
            return mss + b"\x01" + ws + b"\x01\x01" + (b"\x04\x02" if self.sack else b"\x01\x01")
        return mss + b"\x01\x01" + (b"\x04\x02" if self.sack else b"\x01\x01") + b"\x01" + ws

    # -- raw segments ---------------------------------------------------------------------------
    def seg(self, t: int, side: int, flags: int, payload: bytes = b"", *, seq: int | None = None,
            ack: int | None = None, win: int | None = None, sack_blocks=None, opts=None) -> int:
        if seq is None:
            seq = self.nxt[side]
            self.nxt[side] = (seq + len(payload) + (1 if flags & (SYN | FIN) else 0)) & MASK32
        if ack is None:
            ack = self.nxt[1 - side] if flags & ACK else 0
        if win is None:
            win = min(65535, self.rwin[side] >> self.ws[side])
        if opts is None:
            opts = self._opts(side, t, sack_blocks)
        self.g.store.tcp(t, self.p[side], seq & MASK32, ack & MASK32, flags, win, opts,
                         payload)
        return t

    def lat(self, side: int) -> int:
        """Capture-time delay from a segment sent towards ``side`` to ``side``'s reaction."""
        return self.near if side == 1 else self.rtt

    # -- connection life ------------------------------------------------------------------------
    def open(self, t: int, syn_rto: int | None = None) -> int:
        """Three-way handshake starting at ``t``; returns the time of the client's final ACK.
        ``syn_rto``: the first SYN is lost after the capture point and resent this much later."""
        win0 = 64240 if not self.cli.windows else 64240
        if syn_rto is None and self.forced_loss == "syn":
            syn_rto = SYN_RTO + self.g.loss_rng.randrange(0, 2 * MS)
            self.g.losses.append(("syn", self.cli.ip, self.sport, self.srv.ip, self.dport, t))
        if syn_rto is not None:          # the same SYN (explicit seq: nxt does not move), then again
            self.seg(t, 0, SYN, seq=self.nxt[0], win=win0, opts=self._syn_opts(0, t))
            t += syn_rto
        self.seg(t, 0, SYN, win=win0, opts=self._syn_opts(0, t))
        t1 = t + self.near
        self.seg(t1, 1, SYN | ACK, win=65160, opts=self._syn_opts(1, t1))
        t2 = t1 + self.rtt
        self.seg(t2, 0, ACK)
        return t2

    def refuse(self, t: int) -> int:
        """SYN answered by RST (closed port)."""
        self.seg(t, 0, SYN, win=64240, opts=self._syn_opts(0, t))
        t1 = t + self.near
        self.seg(t1, 1, RST | ACK, seq=0, win=0, opts=b"")
        return t1

    def flush(self, side: int, t: int) -> None:
        """Emit ``side``'s delayed ACK if its timer fires before ``t``; otherwise it piggybacks."""
        due = self.pend[side]
        if due is not None:
            if due + self.delack < t:
                self.seg(due + self.delack, side, ACK)
            self.pend[side] = None

    def close(self, t: int, side: int = 0, four_way: bool | None = None) -> int:
        """FIN from ``side`` at ``t`` (or later if it owes a delayed ACK); returns the last time."""
        other = 1 - side
        self.flush(side, t)
        self.flush(other, t)
        self.seg(t, side, FIN | ACK)
        t1 = t + self.lat(other)
        if four_way is None:
            four_way = self.g.rng.random() < 0.4
        if four_way:
            self.seg(t1, other, ACK)
            t1 += self.g.rng.randrange(20 * US, 400 * US)
        self.seg(t1, other, FIN | ACK)
        t2 = t1 + self.lat(side)
        self.seg(t2, side, ACK)
        return t2

    def abort(self, t: int, side: int = 0) -> int:
        self.pend = [None, None]
        self.seg(t, side, RST | ACK, win=0)
        return t

    # -- data -----------------------------------------------------------------------------------
    def send(self, t: int, side: int, data: bytes, *, split: list[int] | None = None,
             loss=None, rto: int | None = None) -> int:
        """``side`` sends ``data`` starting at ``t``; the receiver ACKs every second segment.

        ``split``: explicit segment sizes. ``loss``: ``"rto"`` (the last segment is lost after the
        capture point and resent after an RTO) or ``("fast", k)`` (segment k is lost; duplicate
        ACKs with SACK blocks follow and a fast retransmit). Returns the receiver's reaction time.
        """
        rcv = 1 - side
        if loss is None and side == 1 and self.forced_loss == "tail":     # Gen's loss hook
            self.forced_loss = None
            loss, rto = "rto", max(200 * MS, self.rtt * 3) + self.g.loss_rng.randrange(2 * MS, 12 * MS)
            self.g.losses.append(("tail", self.cli.ip, self.sport, self.srv.ip, self.dport, t))
        self.flush(side, t)
        mss = self.mss
        if split is None:
            sizes = [mss] * (len(data) // mss)
            if len(data) % mss:
                sizes.append(len(data) % mss)
        else:
            sizes = split
        n = len(sizes)
        lat_ack = self.lat(rcv)
        lat_go = self.lat(side)
        gap = self.gap[side]
        wnd = max(2, min(self.cwnd[side], self.rwin[rcv] // mss))
        times: list[int] = []
        ti = t
        for i in range(n):
            if i:
                ti += gap
                j = i - wnd
                if j >= 0:
                    k = j | 1
                    lim = times[k] + lat_ack + lat_go
                    if lim > ti:
                        ti = lim
            times.append(ti)
        self.cwnd[side] = min(self.cwnd[side] + n, 400)
        seq0 = self.nxt[side]
        starts = [seq0]
        for s in sizes:
            starts.append(starts[-1] + s)
        lost = -1
        if loss == "rto" and n:
            lost = n - 1
        elif isinstance(loss, tuple) and loss[0] == "fast" and loss[1] + 4 < n:
            lost = loss[1]
        r = self.g.rng
        t_retx = None
        if lost >= 0:
            if loss == "rto":
                t_retx = times[lost] + (rto if rto is not None else self.rto())
            else:
                # the third duplicate ACK is caused by segment lost+3; the sender is window-limited
                # at the end of the burst, so its last segment leaves after the retransmission
                t_retx = times[lost + 3] + lat_ack + lat_go + r.randrange(1 * US, 8 * US)
                if t_retx >= times[-1]:
                    times[-1] = t_retx + gap
        # receiver side: arrivals in order of time
        arrivals = [(times[i] + lat_ack, i) for i in range(n) if i != lost]
        if t_retx is not None:
            arrivals.append((t_retx + lat_ack, -1))
            arrivals.sort()
        acks: list[tuple[int, int, list | None]] = []      # (time, ack seq, sack blocks)
        unacked = 0
        last_unacked = None
        if self.pend[rcv] is not None:
            unacked, last_unacked = 1, self.pend[rcv]
            self.pend[rcv] = None
        have = set()
        contiguous = 0          # number of leading segments received
        prev = 0
        for a, i in arrivals:
            a = prev = max(a + r.randrange(0, 3 * US), prev)   # the receiver's ACKs keep their order
            if unacked and last_unacked + self.delack < a:
                acks.append((last_unacked + self.delack, starts[contiguous], None))
                unacked = 0
            if i == -1:
                i = lost
            have.add(i)
            if i == contiguous:
                while contiguous in have:
                    contiguous += 1
                if lost >= 0 and i == lost:
                    acks.append((a, starts[contiguous], None))
                    unacked = 0
                    continue
                unacked += 1
                last_unacked = a
                if unacked >= 2 or (lost >= 0 and contiguous == n):
                    acks.append((a, starts[contiguous], None))
                    unacked = 0
            else:      # out of order: immediate duplicate ACK
                hi = max(x for x in have if x > contiguous)
                blocks = [(starts[lost + 1], starts[hi + 1])] if self.sack else None
                acks.append((a, starts[contiguous], blocks))
                unacked = 0
        if unacked:
            self.pend[rcv] = last_unacked
        # emit in time order: data first on ties
        out = [(times[i], 0, i) for i in range(n)]
        if t_retx is not None:
            out.append((t_retx, 1, lost))
        out += [(acks[j][0], 2, j) for j in range(len(acks))]
        out.sort()
        rwin = self.rwin[rcv]
        for tt, kind, i in out:
            if kind == 2:
                _, ackno, blocks = acks[i]
                self.seg(tt, rcv, ACK, ack=ackno, sack_blocks=blocks)
            else:
                payload = data[starts[i] - seq0:starts[i + 1] - seq0]
                fl = ACK | PSH if i == n - 1 or kind == 1 else ACK
                self.seg(tt, side, fl, payload, seq=starts[i], ack=self.nxt[rcv])
        self.nxt[side] = starts[n] & MASK32
        self.rwin[rcv] = rwin
        if t_retx is not None:
            self.last_loss = (times[lost], t_retx)
        last = max(arrivals)[0] if arrivals else t
        return last

    def rto(self) -> int:
        return max(200 * MS, self.rtt * 3) + self.g.rng.randrange(2 * MS, 12 * MS)

    def zero_window(self, t: int, n_before: int = 6, stall: int = 350 * MS) -> int:
        """Server -> client transfer into a receiver that stops reading: the client's window shrinks
        to zero, the server probes, the client later opens the window and the transfer resumes."""
        mss = self.mss
        self.flush(1, t)
        self.pend[0] = None          # the client's ACKs below cover anything it owed
        win_bytes = n_before * mss
        shift = self.ws[0]
        ti = t
        for i in range(n_before):
            self.seg(ti, 1, ACK | PSH, self.g.payload(mss))
            if i % 2 == 1:
                win_bytes -= 2 * mss
                self.seg(ti + self.rtt, 0, ACK, win=max(0, win_bytes) >> shift)
            ti += self.gap[1]
        last_ack_t = ti - self.gap[1] + self.rtt
        probe_t = last_ack_t + self.rto()
        self.seg(probe_t, 1, ACK, self.g.payload(1), seq=self.nxt[1])      # zero window probe
        self.seg(probe_t + self.rtt, 0, ACK, win=0)
        upd = probe_t + stall
        self.seg(upd, 0, ACK, win=self.rwin[0] >> shift)               # window update
        t2 = upd + self.near
        tail = self.g.payload(3 * mss)
        return self.send(t2, 1, tail)


# ================================================================================================
# SMB2 and LDAP conversations on top of Tcp
# ================================================================================================

@dataclass
class SmbOpen:
    name: str
    fid: bytes
    size: int
    lease_key: bytes | None
    oplock: int


class Smb:
    """One SMB2 client connection to the file server (NBSS over TCP 445)."""

    def __init__(self, g: "Gen", cli: Host, srv: Host, user: str, share: str = "projects"):
        self.g, self.cli, self.srv, self.user, self.share = g, cli, srv, user, share
        self.c = Tcp(g, cli, srv, 445)
        self.mid = 0
        self.sess = 0
        self.tree = 0
        self.async_next = g.rng.getrandbits(20) + 1

    # -- messages -------------------------------------------------------------------------------
    def req(self, t: int, cmd: int, body: bytes, charge: int = 1, split=None) -> tuple[int, int]:
        """Client request; returns (server reaction time, message id)."""
        mid = self.mid
        self.mid += charge
        hdr = smb2_hdr(cmd, mid, tree=self.tree, sess=self.sess, credits=max(charge, 1) + 1,
                       charge=charge)
        return self.c.send(t, 0, nbss(hdr + body), split=split), mid

    def rsp(self, t: int, cmd: int, mid: int, body: bytes, status: int = ST_OK, charge: int = 1,
            async_id: int | None = None, loss=None) -> int:
        hdr = smb2_hdr(cmd, mid, status=status, flags=FL_RESPONSE, tree=self.tree, sess=self.sess,
                       credits=charge if async_id is None or status == ST_PENDING else 0,
                       charge=charge, async_id=async_id)
        return self.c.send(t, 1, nbss(hdr + body), loss=loss)

    def push(self, t: int, cmd: int, body: bytes, sess: int = 0) -> int:
        """Unsolicited server message (break notification)."""
        hdr = _SMB2H.pack(b"\xfeSMB", 64, 0, 0, cmd, 0, FL_RESPONSE, 0, 0xFFFFFFFFFFFFFFFF, 0, 0,
                          sess, ZERO16)
        return self.c.send(t, 1, nbss(hdr + body))

    def call(self, t: int, cmd: int, body: bytes, rsp_body: bytes, svc: int, status: int = ST_OK,
             charge: int = 1, loss=None) -> int:
        a, mid = self.req(t, cmd, body, charge)
        return self.rsp(a + svc, cmd, mid, rsp_body, status, charge, loss=loss)

    def think(self) -> int:
        return self.g.rng.randrange(30 * US, 400 * US)

    # -- conversation ---------------------------------------------------------------------------
    def setup(self, t: int) -> int:
        g, r = self.g, self.g.rng
        t = self.c.open(t) + r.randrange(5 * US, 40 * US)
        t = self.call(t, SMB2_NEGOTIATE, smb2_negotiate_req(r.randbytes(16)),
                      smb2_negotiate_rsp(g.fs_guid, g.abs(t), g.abs(0) - 86400 * 3 * SEC),
                      r.randrange(50 * US, 200 * US))
        t += self.think()
        a, mid = self.req(t, SMB2_SESSION_SETUP, smb2_session_setup_req(spnego_init(ntlm_negotiate())))
        self.sess = g.next_session_id()
        chal = spnego_resp(1, ntlm_challenge(r.randbytes(8), g.abs(a)), mech=True)
        t = self.rsp(a + r.randrange(100 * US, 400 * US), SMB2_SESSION_SETUP, mid,
                     smb2_session_setup_rsp(chal), status=ST_MORE)
        t += self.think()
        auth = spnego_resp(None, ntlm_authenticate(self.user, self.cli.name, g.abs(t), r),
                           mic=b"\x01\0\0\0" + r.randbytes(8) + b"\0\0\0\0")   # NTLMSSP verifier
        t = self.call(t, SMB2_SESSION_SETUP, smb2_session_setup_req(auth),
                      smb2_session_setup_rsp(spnego_resp(0, None)), r.randrange(1 * MS, 4 * MS))
        t += self.think()
        a, mid = self.req(t, SMB2_TREE_CONNECT,
                          smb2_tree_connect_req(f"\\\\fs01.{DOMAIN}\\{self.share}"))
        self.tree = r.randrange(1, 16)
        return self.rsp(a + r.randrange(60 * US, 300 * US), SMB2_TREE_CONNECT, mid,
                        smb2_tree_connect_rsp())

    def create_req(self, t: int, name: str, oplock: int = OPLOCK_BATCH, lease_state: int = 0,
                   write: bool = False, disposition: int = 1) -> tuple[int, int, bytes | None]:
        key = self.g.rng.randbytes(16) if oplock == OPLOCK_LEASE else None
        access = 0x0012019F if write else 0x00120089
        body = smb2_create_req(name, oplock, access, disposition, 0x00000040,
                               lease=(key, lease_state) if key else None)
        a, mid = self.req(t, SMB2_CREATE, body)
        return a, mid, key

    def create_rsp(self, t: int, mid: int, name: str, oplock: int, key: bytes | None,
                   lease_state: int, size: int, async_id: int | None = None,
                   action: int = 1) -> tuple[int, SmbOpen]:
        fid = self.g.rng.randbytes(16)
        granted = oplock
        body = smb2_create_rsp(granted, action, fid, filetime(self.g.abs(t)) - 3600 * 10**7, size,
                               lease=(key, lease_state) if key else None)
        t = self.rsp(t, SMB2_CREATE, mid, body, async_id=async_id)
        return t, SmbOpen(name, fid, size, key, granted)

    def open(self, t: int, name: str, size: int, oplock: int = OPLOCK_BATCH,
             lease_state: int = LEASE_R | LEASE_H | LEASE_W, write: bool = False,
             disposition: int = 1) -> tuple[int, SmbOpen]:
        a, mid, key = self.create_req(t, name, oplock, lease_state if oplock == OPLOCK_LEASE else 0,
                                      write, disposition)
        svc = self.g.rng.randrange(80 * US, 600 * US)
        return self.create_rsp(a + svc, mid, name, oplock, key, lease_state, size)

    def read(self, t: int, f: SmbOpen, nbytes: int | None = None, chunk: int = 65536,
             loss=None) -> int:
        r = self.g.rng
        nbytes = f.size if nbytes is None else nbytes
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            charge = max(1, (n + 65535) // 65536)
            a, mid = self.req(t, SMB2_READ, smb2_read_req(f.fid, n, off), charge)
            svc = r.randrange(40 * US, 250 * US) if r.random() < 0.9 else r.randrange(1 * MS, 8 * MS)
            t = self.rsp(a + svc, SMB2_READ, mid, smb2_read_rsp(self.g.payload(n)), charge=charge,
                         loss=loss if off + n >= nbytes else None)
            t += r.randrange(10 * US, 80 * US)
            off += n
        return t

    def write(self, t: int, f: SmbOpen, nbytes: int, chunk: int = 65536) -> int:
        r = self.g.rng
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            charge = max(1, (n + 65535) // 65536)
            a, mid = self.req(t, SMB2_WRITE, smb2_write_req(f.fid, self.g.payload(n), off), charge)
            t = self.rsp(a + r.randrange(60 * US, 700 * US), SMB2_WRITE, mid, smb2_write_rsp(n),
                         charge=charge)
            t += r.randrange(10 * US, 80 * US)
            off += n
        f.size = max(f.size, nbytes)
        return t

    def close(self, t: int, f: SmbOpen, postquery: bool = False) -> int:
        fl = 1 if postquery else 0
        return self.call(t, SMB2_CLOSE, smb2_close_req(f.fid, fl),
                         smb2_close_rsp(filetime(self.g.abs(t)), f.size, fl),
                         self.g.rng.randrange(40 * US, 250 * US))

    def logoff(self, t: int) -> int:
        r = self.g.rng
        t = self.call(t, SMB2_TREE_DISCONNECT, smb2_empty4(), smb2_empty4(), r.randrange(30 * US, 100 * US))
        t += self.think()
        t = self.call(t, SMB2_LOGOFF, smb2_empty4(), smb2_empty4(), r.randrange(30 * US, 100 * US))
        return self.c.close(t + self.think(), 0)


class Ldap:
    """One LDAP client connection (TCP 389)."""

    def __init__(self, g: "Gen", cli: Host, srv: Host):
        self.g, self.cli, self.srv = g, cli, srv
        self.c = Tcp(g, cli, srv, 389)
        self.msgid = 0

    def _id(self) -> int:
        self.msgid += 1
        return self.msgid

    def call(self, t: int, req: bytes, rsp: bytes | list[bytes], svc: int, split=None) -> int:
        a = self.c.send(t, 0, req, split=split)
        if isinstance(rsp, list):
            rsp_split = self.segment_sizes([len(m) for m in rsp], self.c.mss)
            rsp = b"".join(rsp)
        else:
            rsp_split = None
        return self.c.send(a + svc, 1, rsp, split=rsp_split)

    @staticmethod
    def segment_sizes(msg_lens: list[int], mss: int, sliver: int = 8) -> list[int]:
        """MSS-sized segments, except that a segment never ends with the first few bytes of the next
        message (Wireshark's LDAP dissector reports a one-byte BER header tail as malformed)."""
        bounds, acc = [], 0
        for n in msg_lens:
            acc += n
            bounds.append(acc)
        total, sizes, s, j = acc, [], 0, 0
        while s < total:
            e = min(s + mss, total)
            if e < total:
                while j < len(bounds) and bounds[j] <= s:
                    j += 1
                k = j
                best = None
                while k < len(bounds) and bounds[k] < e:
                    best = bounds[k]
                    k += 1
                if best is not None and e - best < sliver:
                    e = best
            sizes.append(e - s)
            s = e
        return sizes

    def bind(self, t: int, dn: str) -> int:
        m = self._id()
        r = self.g.rng
        return self.call(t, ldap_msg(m, ldap_bind_req(dn, "S3cret-" + str(r.randrange(1000)))),
                         ldap_msg(m, ldap_result(1)), r.randrange(300 * US, 1500 * US))

    def search(self, t: int, base: str, filt: bytes, attrs: list[str], entries: list[bytes],
               split_req: bool = False, scope: int = 2) -> int:
        m = self._id()
        r = self.g.rng
        req = ldap_msg(m, ldap_search_req(base, scope, filt, attrs))
        rsp = [ldap_msg(m, e) for e in entries] + [ldap_msg(m, ldap_result(5))]
        split = None
        if split_req:             # header and body in two segments (never a few-byte sliver)
            k = r.randrange(min(8, len(req) // 2), max(9, len(req) - 8))
            split = [k, len(req) - k]
        return self.call(t, req, rsp, r.randrange(150 * US, 2 * MS) + 40 * US * len(entries),
                         split=split)

    def modify(self, t: int, dn: str, changes) -> int:
        m = self._id()
        return self.call(t, ldap_msg(m, ldap_modify_req(dn, changes)), ldap_msg(m, ldap_result(7)),
                         self.g.rng.randrange(1 * MS, 6 * MS))

    def unbind_close(self, t: int) -> int:
        self.c.flush(0, t)
        self.c.pend[0] = None
        self.c.seg(t, 0, ACK | PSH, ldap_msg(self._id(), LDAP_UNBIND))
        return self.c.close(t + self.g.rng.randrange(5 * US, 30 * US), 0, four_way=False)


# ================================================================================================
# The site: hosts, names, users
# ================================================================================================

FIRST = ["anna", "ben", "carla", "dev", "emma", "farid", "gina", "hugo", "ines", "jon", "kai", "lena",
         "mario", "nina", "omar", "paula", "quinn", "rosa", "sam", "tara", "umar", "vera", "will", "yara"]
LAST = ["adams", "berg", "costa", "diaz", "evans", "fischer", "garcia", "hall", "ito", "jensen", "khan",
        "lopez", "meyer", "novak", "olsen", "patel", "quist", "rossi", "smith", "tanaka", "weber", "young"]
SHARE_DIRS = ["finance", "hr", "eng\\src", "eng\\docs", "sales", "q1", "q2", "scripts"]
FILE_NAMES = ["report.docx", "budget.xlsx", "notes.txt", "design.pdf", "main.c", "build.log", "data.csv",
              "slides.pptx", "setup.ps1", "readme.md", "archive.zip", "image.png"]
LDAP_BASE = "DC=corp,DC=example,DC=com"


@dataclass
class Zone:
    name: str
    v4: list[str]
    v6: list[str]
    ttl: int
    cname: str | None = None
    nx: bool = False
    remote: bool = False       # answered after recursion (slow) on a cache miss


class Gen:
    """Builds the whole capture into a :class:`Store` plus labels."""

    # Loss hook (samples/synth_scenarios.py): the share of TCP connections whose first SYN, or whose
    # first server tail segment, is lost after the capture point (resent after the initial RTO /
    # an RTO). 0, the default, draws nothing and changes nothing.
    syn_loss_share = 0.0
    tail_loss_share = 0.0
    loss_rng: random.Random | None = None
    losses: list | None = None          # (kind, client, client port, server, server port, time)

    def __init__(self, seed: int, packets: int):
        if packets < MIN_PACKETS:
            raise ValueError(f"--packets must be at least {MIN_PACKETS} (got {packets})")
        self.rng = r = random.Random(seed)
        self.seed, self.packets = seed, packets
        self.store = Store()
        self.labels: list[dict] = []
        self.duration = max(30 * SEC, packets * SEC // 8000)
        self.scale = min(1.0, packets / 1_000_000)
        self.pool = r.randbytes(1 << 22)
        self.fs_guid = r.randbytes(16)
        self._sess_id = 0x0000_1000_0000_0041 + (r.getrandbits(16) << 8)

        def server(ip, windows=False, name=""):
            return Host(ip, windows=windows, local=True, rtt=20 * US, port=49152, name=name)

        self.dns = server("10.0.0.53", name="ns1")
        self.dns6 = server("fd00::53", name="ns1")
        self.dc1 = server("10.0.0.10", True, "DC01")
        self.dc2 = server("10.0.0.11", True, "DC02")
        self.fs = server("10.0.1.20", True, "FS01")
        self.apps = [server(f"10.0.2.{11 + i}", name=f"app{i + 1:02d}") for i in range(8)]
        self.web = server("10.0.2.30", name="web01")
        self.web6 = server("fd00::80", name="web01")
        self.log = server("10.0.3.5", name="log01")

        def client(ip, windows, lo, hi, name=""):
            return Host(ip, windows=windows, local=False, rtt=r.randrange(lo, hi),
                        port=r.randrange(49152, 60000) if windows else r.randrange(32768, 55000),
                        name=name)

        self.ws = [client(f"10.1.{1 + i // 250}.{1 + i % 250}", True, 60 * US, 400 * US,
                          f"WS-{1000 + i}") for i in range(2400)]
        self.lnx = [client(f"10.2.{i // 250}.{1 + i % 250}", False, 30 * US, 150 * US, f"lnx{i:03d}")
                    for i in range(300)]
        self.wan = [client(f"172.20.{i // 200}.{1 + i % 200}", r.random() < 0.6, 12 * MS, 45 * MS)
                    for i in range(500)]
        self.v6 = [client(f"fd00:1::{0x100 + i:x}", False, 40 * US, 200 * US) for i in range(200)]
        self.users = [f"{f}.{l}" for f in FIRST for l in LAST]
        self.zone = self._make_zone()
        self._names = self.lookup_names()
        self._ldap_cache: dict[tuple, bytes] = {}
        self.herd_name = "config.svc." + DOMAIN
        self.storm_name = "api.partner-broken.example"

    # -- helpers --------------------------------------------------------------------------------
    def abs(self, t: int) -> int:
        return BASE_EPOCH_NS + t

    def payload(self, n: int) -> bytes:
        o = self.rng.randrange(0, len(self.pool) - n)
        return self.pool[o:o + n]

    def next_session_id(self) -> int:
        self._sess_id += 0x1_0000_0009
        return self._sess_id

    def user_for(self, h: Host) -> str:
        return self.users[(int.from_bytes(h.addr[-2:], "big") * 2654435761 >> 7) % len(self.users)]

    def udp_pair(self, a: Host, b: Host, sport: int, dport: int) -> tuple[Path, Path]:
        r = self.rng
        return (Path(a, b, sport, dport, PROTO_UDP, r.getrandbits(16)),
                Path(b, a, dport, sport, PROTO_UDP, r.getrandbits(16)))

    def label(self, detector: str, start: int, end: int, clients: list[str], server: Host, port: int,
              protocol: str, resource: str, description: str, **parameters) -> None:
        assert detector in DETECTORS
        self.labels.append(dict(detector=detector, start_ns=start, end_ns=end, clients=clients,
                                server=server.ip, server_port=port, protocol=protocol,
                                resource=resource, description=description, parameters=parameters))

    def n(self, full: int, least: int) -> int:
        """Pathology size: ``full`` at 1M packets, shrinking with sqrt(scale), at least ``least``."""
        return max(least, round(full * math.sqrt(self.scale)))

    def _make_zone(self) -> dict[str, Zone]:
        r = self.rng
        z: dict[str, Zone] = {}

        def add(name, v4=(), v6=(), ttl=300, **kw):
            z[name] = Zone(name, list(v4), list(v6), ttl, **kw)

        for h in ["fs01", "dc01", "dc02", "mail", "intranet", "wiki", "git", "jira", "build", "print01",
                  "vpn", "proxy", "sso", "metrics", "grafana", "nexus", "ci", "backup"]:
            add(f"{h}.{DOMAIN}", [f"10.0.{r.randrange(0, 4)}.{r.randrange(2, 250)}"],
                [f"fd00::{r.randrange(0x100, 0xfff):x}"] if r.random() < 0.4 else [], ttl=1200)
        for i in range(8):
            add(f"app{i + 1:02d}.{DOMAIN}", [f"10.0.2.{11 + i}"], ttl=300)
        add(f"www.{DOMAIN}", [], ttl=300, cname=f"web01.{DOMAIN}")
        add(f"web01.{DOMAIN}", ["10.0.2.30"], ["fd00::80"], ttl=300)
        for name in ["www.example.com", "portal.example.org", "login.example.net", "updates.vendor.example",
                     "api.weather.example", "static.example.net", "telemetry.vendor.example",
                     "ocsp.ca.example", "time.example.org", "news.example.com"]:
            if r.random() < 0.5:
                edge = name.replace(".", "-") + ".edge.cdn.example"
                add(name, [], ttl=r.choice([60, 300, 3600]), cname=edge, remote=True)
                add(edge, [f"198.51.100.{r.randrange(1, 254)}" for _ in range(r.randrange(1, 4))],
                    [f"2001:db8:100::{r.randrange(1, 0xffff):x}"], ttl=20, remote=True)
            else:
                add(name, [f"203.0.113.{r.randrange(1, 254)}" for _ in range(r.randrange(1, 3))],
                    [f"2001:db8:200::{r.randrange(1, 0xffff):x}"] if r.random() < 0.5 else [],
                    ttl=r.choice([300, 600, 3600]), remote=True)
        for name in ["wpad." + DOMAIN, "isatap." + DOMAIN, "oldprinter." + DOMAIN, "tracker.example.invalid",
                     "fileserver2." + DOMAIN]:
            add(name, nx=True, ttl=60)
        add("big.records." + DOMAIN, [f"10.0.9.{i}" for i in range(1, 61)], ttl=120)
        return z

    def lookup_names(self) -> list[str]:
        return [n for n in self.zone if not n.startswith("big.") and ".edge." not in n]

    # -- DNS ------------------------------------------------------------------------------------
    def _soa_for(self, name: str) -> tuple[str, tuple]:
        if name.endswith(DOMAIN):
            return DOMAIN, (f"dc01.{DOMAIN}", f"hostmaster.{DOMAIN}", 2024030401)
        apex = ".".join(name.split(".")[-2:])
        return apex, (f"ns1.{apex}", f"hostmaster.{apex}", 2024022901)

    def dns_query(self, txid: int, name: str, qtype: int, edns: bool) -> bytes:
        b = DnsBuilder(txid, DNS_Q).question(name, qtype)
        if edns:
            b.opt(1232 if self.rng.random() < 0.7 else 4096)
        return b.bytes()

    def dns_answer(self, txid: int, name: str, qtype: int, edns: bool, ttl: int | None = None,
                   tc: bool = False) -> bytes:
        z = self.zone[name]
        flags = DNS_NX if z.nx else DNS_R
        if tc:
            flags |= 0x0200
        b = DnsBuilder(txid, flags).question(name, qtype)
        if z.nx:
            apex, soa = self._soa_for(name)
            b.rr(2, apex, T_SOA, 60, soa)
        elif not tc:
            owner, cur = name, z
            while cur.cname:
                b.rr(1, owner, T_CNAME, cur.ttl if ttl is None else ttl, cur.cname)
                owner, cur = cur.cname, self.zone[cur.cname]
            addrs = cur.v4 if qtype == T_A else cur.v6
            for a in addrs:
                b.rr(1, owner, qtype, cur.ttl if ttl is None else ttl, a)
            if not addrs:
                apex, soa = self._soa_for(owner)
                b.rr(2, apex, T_SOA, 60, soa)
        if edns:
            b.opt(1232)
        return b.bytes()

    def dns_udp(self, t: int, cli: Host, name: str | None = None, qtypes=None,
                slow: bool | None = None) -> int:
        r = self.rng
        srv = self.dns6 if cli.v6 else self.dns
        if name is None:
            name = r.choice(self._names)
        if qtypes is None:
            qtypes = (T_A, T_AAAA) if (not cli.windows or r.random() < 0.25) else (T_A,)
        z = self.zone[name]
        edns = (not cli.windows) or r.random() < 0.5
        q, a = self.udp_pair(cli, srv, r.randrange(49152, 65536), 53)
        if slow is None:
            slow = z.remote and r.random() < 0.3
        end = t
        for qt in qtypes:
            txid = r.getrandbits(16)
            self.store.udp(t, q, self.dns_query(txid, name, qt, edns))
            svc = r.randrange(3 * MS, 40 * MS) if slow else r.randrange(25 * US, 250 * US)
            ttl = None if slow else max(1, z.ttl - r.randrange(0, z.ttl))
            self.store.udp(t + svc, a, self.dns_answer(txid, name, qt, edns, ttl))
            end = max(end, t + svc)
            t += r.randrange(4 * US, 40 * US)
        return end

    def dns_tc_fallback(self, t: int, cli: Host) -> int:
        """A large answer: UDP reply truncated (TC) -> the same query over TCP."""
        r = self.rng
        name = "big.records." + DOMAIN
        q, a = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), 53)
        txid = r.getrandbits(16)
        self.store.udp(t, q, self.dns_query(txid, name, T_A, False))
        t1 = t + r.randrange(40 * US, 120 * US)
        self.store.udp(t1, a, self.dns_answer(txid, name, T_A, False, tc=True))
        c = Tcp(self, cli, self.dns, 53)
        t2 = c.open(t1 + cli.rtt + r.randrange(50 * US, 200 * US))
        qry = self.dns_query(txid, name, T_A, False)
        ans = self.dns_answer(txid, name, T_A, False)
        t3 = c.send(t2 + r.randrange(5 * US, 30 * US), 0, struct.pack("!H", len(qry)) + qry)
        t4 = c.send(t3 + r.randrange(40 * US, 200 * US), 1, struct.pack("!H", len(ans)) + ans)
        return c.close(t4 + r.randrange(10 * US, 50 * US), 0)

    # -- Kerberos -------------------------------------------------------------------------------
    def krb_xchg(self, t: int, cli: Host, kdc: Host, req: bytes, rsp_fn, svc: int, tcp: bool) -> int:
        r = self.rng
        if tcp:
            c = Tcp(self, cli, kdc, 88)
            t = c.open(t) + r.randrange(10 * US, 60 * US)
            a = c.send(t, 0, struct.pack("!I", len(req)) + req)
            rsp = rsp_fn(a + svc)
            b = c.send(a + svc, 1, struct.pack("!I", len(rsp)) + rsp)
            c.close(b + r.randrange(20 * US, 100 * US), 0)
            return b
        q, a = self.udp_pair(cli, kdc, cli.ephemeral(), 88)
        self.store.udp(t, q, req)
        self.store.udp(t + svc, a, rsp_fn(t + svc))
        return t + svc + cli.rtt

    def krb_as_req(self, cli: Host, user: str, nonce: int, preauth: bool) -> bytes:
        pad = [krb_padata(PA_PAC_REQUEST, der_seq(ctx(0, der_bool(True))))]
        if preauth:
            pad.insert(0, krb_padata(PA_ENC_TIMESTAMP, krb_enc(ETYPE_AES256, self.rng.randbytes(56))))
        addrs = der_seq(der_seq(ctx(0, der_int(20)), ctx(1, der_octets(cli.name.upper().ljust(16)[:16]))))
        body = krb_req_body(KDC_OPT_AS, REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM), nonce,
                            krb_principal(NT_PRINCIPAL, user), (18, 17, 23, 24, -135), addrs, rtime=True)
        return krb_kdc_req(KRB_AS_REQ, pad, body)

    def krb_preauth_required(self, user: str, t: int) -> bytes:
        salt = REALM + user.replace(".", "")
        edata = der_seq(krb_padata(PA_ETYPE_INFO2, krb_etype_info2(salt)),
                        krb_padata(PA_ENC_TIMESTAMP, b""), krb_padata(PA_PK_AS_REQ, b""),
                        krb_padata(PA_PK_AS_REP_OLD, b""))
        return krb_error(25, self.abs(t), REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM),
                         edata=edata)

    def krb_as_rep(self, user: str, tcp: bool) -> bytes:
        r = self.rng
        salt = REALM + user.replace(".", "")
        tl = r.randrange(1100, 1500) if tcp else r.randrange(700, 860)
        tgt = krb_ticket(REALM, krb_principal(NT_SRV_INST, "krbtgt", REALM), r.randbytes(tl))
        pad = [krb_padata(PA_ETYPE_INFO2, der_seq(der_seq(ctx(0, der_int(ETYPE_AES256)),
                                                          ctx(1, der_gstring(salt)))))]
        return krb_kdc_rep(KRB_AS_REP, REALM, krb_principal(NT_PRINCIPAL, user), tgt,
                           r.randbytes(r.randrange(250, 300)), pad)

    def krb_logon(self, t: int, cli: Host, *, tcp: bool | None = None, outcome: str = "ok",
                  services: list[tuple[str, str]] | None = None, kdc: Host | None = None,
                  user: str | None = None) -> int:
        r = self.rng
        kdc = kdc or (self.dc1 if r.random() < 0.6 else self.dc2)
        tcp = (r.random() < 0.35) if tcp is None else tcp
        user = user or ("svc_legacy" if outcome == "unknown" else self.user_for(cli))
        cname = krb_principal(NT_PRINCIPAL, user)
        tgt_sname = krb_principal(NT_SRV_INST, "krbtgt", REALM)
        think = lambda: r.randrange(150 * US, 900 * US)   # noqa: E731
        t = self.krb_xchg(t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False),
                          (lambda tt: krb_error(6, self.abs(tt), REALM, tgt_sname, cname=cname))
                          if outcome == "unknown" else (lambda tt: self.krb_preauth_required(user, tt)),
                          r.randrange(80 * US, 400 * US), tcp)
        if outcome == "unknown":
            return t
        t += think()
        if outcome == "badpw":
            salt = REALM + user.replace(".", "")
            return self.krb_xchg(
                t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True),
                lambda tt: krb_error(24, self.abs(tt), REALM, tgt_sname, cname=cname,
                                     edata=der_seq(krb_padata(PA_ETYPE_INFO2, krb_etype_info2(salt)))),
                r.randrange(1 * MS, 3 * MS), tcp)
        t = self.krb_xchg(t, cli, kdc, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True),
                          lambda tt: self.krb_as_rep(user, tcp), r.randrange(1 * MS, 4 * MS), tcp)
        if services is None:
            services = r.sample([("cifs", "fs01"), ("ldap", "dc01"), ("host", cli.name.lower()),
                                 ("HTTP", "intranet"), ("ldap", "dc02")], r.randrange(1, 4))
        tgt_len = r.randrange(1100, 1500) if tcp else r.randrange(700, 860)
        tgt = krb_ticket(REALM, tgt_sname, r.randbytes(tgt_len))
        for svc, host in services:
            t += think()
            sname = krb_principal(NT_SRV_INST, svc, f"{host}.{DOMAIN}")
            req = krb_kdc_req(KRB_TGS_REQ,
                              [krb_padata(PA_TGS_REQ, krb_ap_req(tgt, r.randbytes(r.randrange(160, 200))))],
                              krb_req_body(KDC_OPT_TGS, REALM, sname, r.randrange(1 << 24, 1 << 31),
                                           etypes=(18, 17, 23)))
            tl = r.randrange(1000, 1400) if tcp else r.randrange(650, 800)
            rep = krb_kdc_rep(KRB_TGS_REP, REALM, cname, krb_ticket(REALM, sname, r.randbytes(tl), 5),
                              r.randbytes(r.randrange(240, 300)))
            t = self.krb_xchg(t, cli, kdc, req, lambda tt, rep=rep: rep, r.randrange(500 * US, 2500 * US),
                              tcp)
        return t

    # -- LDAP -----------------------------------------------------------------------------------
    def ldap_user_entry(self, user: str) -> bytes:
        e = self._ldap_cache.get(("u", user))
        if e is None:           # one directory entry per user, built the first time it is read
            e = self._ldap_cache[("u", user)] = self._ldap_user_entry(user)
        return e

    def _ldap_user_entry(self, user: str) -> bytes:
        r = self.rng
        first, last = user.split(".")
        cn = f"{first.title()} {last.title()}"
        groups = r.sample(["eng", "finance", "hr", "sales", "vpn-users", "all-staff", "build", "wifi"],
                          r.randrange(1, 6))
        return ldap_search_entry(f"CN={cn},OU=Users,{LDAP_BASE}", [
            ("objectClass", ["top", "person", "organizationalPerson", "user"]), ("cn", [cn]),
            ("sAMAccountName", [user]), ("userPrincipalName", [f"{user}@{DOMAIN}"]),
            ("mail", [f"{user}@example.com"]), ("userAccountControl", ["512"]),
            ("memberOf", [f"CN={g},OU=Groups,{LDAP_BASE}" for g in groups]),
            ("objectGUID", [r.randbytes(16)])])

    def ldap_group_entry(self, name: str, members: int) -> bytes:
        e = self._ldap_cache.get(("g", name, members))
        if e is None:
            e = self._ldap_cache[("g", name, members)] = self._ldap_group_entry(name, members)
        return e

    def _ldap_group_entry(self, name: str, members: int) -> bytes:
        us = [self.users[i % len(self.users)] for i in range(members)]
        return ldap_search_entry(f"CN={name},OU=Groups,{LDAP_BASE}", [
            ("objectClass", ["top", "group"]), ("cn", [name]),
            ("member", [f"CN={u.split('.')[0].title()} {u.split('.')[1].title()},OU=Users,{LDAP_BASE}"
                        for u in us])])

    def ldap_computer_entry(self, h: Host) -> bytes:
        return ldap_search_entry(f"CN={h.name},OU=Workstations,{LDAP_BASE}", [
            ("objectClass", ["top", "computer"]), ("dNSHostName", [f"{h.name.lower()}.{DOMAIN}"]),
            ("operatingSystem", ["Windows 10 Enterprise"])])

    def ldap_op(self, L: Ldap, t: int, split_req: bool = False) -> int:
        r = self.rng
        x = r.random()
        if x < 0.45:
            u = r.choice(self.users)
            return L.search(t, LDAP_BASE, f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                            ["cn", "mail", "memberOf", "userAccountControl"], [self.ldap_user_entry(u)],
                            split_req)
        if x < 0.6:
            g = r.choice(["eng", "finance", "all-staff", "vpn-users"])
            return L.search(t, f"OU=Groups,{LDAP_BASE}", f_and(f_eq("objectClass", "group"), f_substr("cn", g)),
                            ["member", "cn"], [self.ldap_group_entry(g, r.randrange(5, 120))], split_req)
        if x < 0.72:
            hs = r.sample(self.ws, r.randrange(2, 9))
            return L.search(t, f"OU=Workstations,{LDAP_BASE}",
                            f_and(f_eq("objectCategory", "computer"), f_substr("dNSHostName", "ws-1")),
                            ["dNSHostName", "operatingSystem"], [self.ldap_computer_entry(h) for h in hs],
                            split_req)
        if x < 0.8:
            a, b = r.sample(self.users, 2)
            return L.search(t, LDAP_BASE, f_or(f_eq("mail", a + "@example.com"), f_eq("mail", b + "@example.com")),
                            ["sAMAccountName"], [], split_req)
        if x < 0.87:
            return L.search(t, "", f_present("objectClass"), ["defaultNamingContext", "dnsHostName"],
                            [ldap_search_entry("", [("defaultNamingContext", [LDAP_BASE]),
                                                    ("dnsHostName", [f"dc01.{DOMAIN}"])])], split_req, 0)
        u = r.choice(self.users)
        first, last = u.split(".")
        return L.modify(t, f"CN={first.title()} {last.title()},OU=Users,{LDAP_BASE}",
                        [(2, "telephoneNumber", [f"+1 555 {r.randrange(1000, 9999)}"]),
                         (2, "description", ["updated by synth"])])

    def ldap_session(self, t: int, cli: Host, n_ops: int, think: tuple[int, int]) -> int:
        r = self.rng
        L = Ldap(self, cli, self.dc1 if r.random() < 0.7 else self.dc2)
        t = L.c.open(t) + r.randrange(5 * US, 40 * US)
        dn = (f"CN=svc-{cli.name},OU=Service Accounts,{LDAP_BASE}" if not cli.windows
              else f"CN={cli.name},OU=Workstations,{LDAP_BASE}")
        t = L.bind(t, dn)
        for _ in range(n_ops):
            t = self.ldap_op(L, t + r.randrange(*think), split_req=r.random() < 0.08)
        return L.unbind_close(t + r.randrange(*think))

    # -- SMB2 -----------------------------------------------------------------------------------
    def smb_file_op(self, s: Smb, t: int) -> int:
        r = self.rng
        name = f"{r.choice(SHARE_DIRS)}\\{r.choice(FILE_NAMES)}"
        size = int(min(4 << 20, r.lognormvariate(9.2, 1.4)))
        x = r.random()
        oplock = OPLOCK_BATCH if x < 0.4 else OPLOCK_LEASE if x < 0.7 else OPLOCK_II if x < 0.8 else OPLOCK_NONE
        y = r.random()
        write = y >= 0.65 and y < 0.9
        t, f = s.open(t, name, size, oplock, write=write, disposition=1 if not write else 3)
        t += r.randrange(15 * US, 200 * US)
        if y < 0.65:
            t = s.read(t, f, min(size, 4 << 20))
        elif write:
            t = s.write(t, f, max(1, min(size, 1 << 20)))
        return s.close(t + r.randrange(15 * US, 200 * US), f)

    def smb_session(self, t: int, cli: Host, n_ops: int, think: tuple[int, int],
                    logoff: bool | None = None) -> int:
        r = self.rng
        s = Smb(self, cli, self.fs, self.user_for(cli))
        t = s.setup(t)
        for _ in range(n_ops):
            t = self.smb_file_op(s, t + r.randrange(*think))
        if logoff if logoff is not None else r.random() < 0.5:
            t = s.logoff(t + r.randrange(*think))
        return t

    # -- HTTP -----------------------------------------------------------------------------------
    def http_session(self, t: int, cli: Host, srv: Host, port: int, n_req: int, think: tuple[int, int],
                     losses: bool = True, end: str | None = None) -> int:
        r = self.rng
        c = Tcp(self, cli, srv, port)
        t = c.open(t) + r.randrange(5 * US, 50 * US)
        host = f"{srv.name}.{DOMAIN}"
        for i in range(n_req):
            x = r.random()
            size = (r.randrange(200, 3000) if x < 0.65 else r.randrange(3000, 30000) if x < 0.92
                    else r.randrange(30000, 150000) if x < 0.995 else r.randrange(150000, 1 << 20))
            if r.random() < 0.85:
                req = (f"GET /api/v1/items/{r.randrange(100000)}?fields=all HTTP/1.1\r\nHost: {host}\r\n"
                       f"User-Agent: synth-client/1.0\r\nAccept: */*\r\n\r\n").encode()
            else:
                body = self.payload(r.randrange(100, 20000))
                req = (f"POST /api/v1/upload HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            status = "200 OK" if r.random() < 0.95 else "404 Not Found"
            if status != "200 OK":
                size = 0
            rsp = (f"HTTP/1.1 {status}\r\nServer: synth/1.0\r\nContent-Type: application/octet-stream\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode() + (self.payload(size) if size else b"")
            nseg = (len(rsp) + c.mss - 1) // c.mss
            loss = None
            if losses:
                y = r.random()
                if cli.rtt > 5 * MS and y < 0.04:
                    loss = "rto"
                elif nseg >= 10 and y < 0.03:
                    loss = ("fast", r.randrange(1, nseg - 5))
            a = c.send(t, 0, req)
            t = c.send(a + r.randrange(150 * US, 6 * MS), 1, rsp, loss=loss)
            if i + 1 < n_req:
                t += r.randrange(*think)
        end = end or ("close" if r.random() < 0.75 else "server_close" if r.random() < 0.6 else "rst")
        if end == "rst":
            return c.abort(t + r.randrange(50 * US, 2 * MS), 0)
        if end == "server_close":
            return c.close(t + r.randrange(5 * SEC, 15 * SEC), 1)
        return c.close(t + r.randrange(20 * US, 5 * MS), 0)

    # -- misc -----------------------------------------------------------------------------------
    def syslog(self, t: int, h: Host, count: int = 1) -> int:
        r = self.rng
        p = Path(h, self.log, r.randrange(32768, 60999), 514, PROTO_UDP, r.getrandbits(16))
        for _ in range(count):
            stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(self.abs(t) // SEC))
            app_, pid = r.choice([("sshd", 811), ("cron", 1202), ("app", 4410), ("kernel", 0), ("nginx", 990)])
            text = r.choice(["session opened for user deploy", "connection from 10.2.0.7 closed",
                             "request completed in 12 ms", "disk usage at 71%", "config reloaded",
                             "worker 3 restarted", "health check ok"])
            msg = f"<{r.choice([13, 14, 30, 38, 86, 134])}>{stamp} {h.name} {app_}[{pid}]: {text}"
            self.store.udp(t, p, msg.encode())
            t += r.randrange(50 * US, 20 * MS)
        return t

    def refused(self, t: int, cli: Host) -> int:
        srv = self.rng.choice(self.apps)
        c = Tcp(self, cli, srv, self.rng.choice([9000, 3389, 5432]))
        return c.refuse(t)

    # ============================================================================================
    # Pathologies (each writes one label)
    # ============================================================================================
    def patho_dns_herd(self, T: int) -> None:
        r = self.rng
        n = self.n(400, 12)
        ttl = 10
        name = self.herd_name
        self.zone[name] = Zone(name, ["10.0.2.50"], [], ttl)
        # the answer everybody cached: primed ttl seconds before the herd
        primer = r.choice(self.lnx)
        t_prime = T - ttl * SEC
        self.dns_udp(t_prime, primer, name, (T_A,), slow=False)
        clients = r.sample(self.ws[:1200] + self.lnx[:200], n)
        window = 4 * MS
        arrivals = sorted(T + int(window * r.random() ** 2) + r.randrange(0, 200 * US) for _ in clients)
        # the resolver coalesces: one upstream refresh, then answers in a burst
        upstream_done = arrivals[0] + r.randrange(8 * MS, 15 * MS)
        busy = 0
        first, last = arrivals[0], 0
        for cli, ta in zip(clients, arrivals):
            q, a = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), 53)
            txid = r.getrandbits(16)
            edns = r.random() < 0.5
            self.store.udp(ta, q, self.dns_query(txid, name, T_A, edns))
            busy = max(busy, upstream_done, ta) + r.randrange(6 * US, 14 * US)
            self.store.udp(busy, a, self.dns_answer(txid, name, T_A, edns, ttl))
            last = busy
        self.label("herd", first, last, [c.ip for c in clients], self.dns, 53, "dns", name,
                   f"{n} clients query {name} within {(arrivals[-1] - first) / MS:.1f} ms after the "
                   f"{ttl} s TTL of the answer they all cached expired",
                   ttl_s=ttl, primed_ns=t_prime, expiry_ns=T, n_clients=n, qtype="A",
                   query_window_ms=round((arrivals[-1] - first) / MS, 3),
                   episode_ms=round((last - first) / MS, 3))

    def patho_retry_storm(self, T: int) -> None:
        r = self.rng
        n = self.n(150, 8)
        attempts = 5
        name = self.storm_name
        clients = r.sample(self.ws[1200:] + self.lnx[200:], n)
        first, last = None, 0
        for cli in clients:
            q, _ = self.udp_pair(cli, self.dns, r.randrange(49152, 65536), 53)
            txid = r.getrandbits(16)
            edns = not cli.windows
            t = T + r.randrange(0, 400 * MS)
            payload = self.dns_query(txid, name, T_A, edns)
            for k in range(attempts):
                tk = t + k * SEC + r.randrange(0, 3 * MS)
                self.store.udp(tk, q, payload)
                first = tk if first is None else min(first, tk)
                last = max(last, tk)
        self.label("retry_storm", first, last, [c.ip for c in clients], self.dns, 53, "dns", name,
                   f"{n} clients retry an unanswered query for {name} every 1 s ({attempts} attempts each)",
                   retry_interval_s=1.0, attempts=attempts, n_clients=n, answered=False, qtype="A")

    def patho_krb_herd(self, T: int) -> None:
        r = self.rng
        n = self.n(300, 10)
        kdc = self.dc1
        clients = r.sample(self.ws, n)
        arrivals = sorted(T + int(5 * MS * r.random() ** 1.5) for _ in clients)
        q_busy = 0
        workers = [0, 0, 0, 0]
        first, last = arrivals[0], 0
        for cli, ta in zip(clients, arrivals):
            user = self.user_for(cli)
            q, a = self.udp_pair(cli, kdc, cli.ephemeral(), 88)
            self.store.udp(ta, q, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), False))
            q_busy = max(q_busy, ta) + r.randrange(40 * US, 90 * US)
            self.store.udp(q_busy, a, self.krb_preauth_required(user, q_busy))
            t2 = q_busy + cli.rtt + r.randrange(200 * US, 700 * US)
            q2, a2 = self.udp_pair(cli, kdc, cli.ephemeral(), 88)
            self.store.udp(t2, q2, self.krb_as_req(cli, user, r.randrange(1 << 24, 1 << 31), True))
            workers.sort()
            done = max(workers[0], t2) + r.randrange(600 * US, 1400 * US)
            workers[0] = done
            self.store.udp(done, a2, self.krb_as_rep(user, False))
            last = max(last, done)
        self.label("herd", first, last, [c.ip for c in clients], kdc, 88, "kerberos", f"krbtgt/{REALM}",
                   f"{n} workstations send AS-REQs to {kdc.name} within {(arrivals[-1] - first) / MS:.1f} ms",
                   n_clients=n, request_window_ms=round((arrivals[-1] - first) / MS, 3),
                   msg_type="AS-REQ", realm=REALM, kdc_workers=len(workers))

    def patho_lease_break_queue(self, T: int) -> None:
        r = self.rng
        k = self.n(8, 3)
        holder_h, *waiter_hs = r.sample(self.ws, k + 1)
        path = "q1\\forecast.xlsx"
        holder = Smb(self, holder_h, self.fs, self.user_for(holder_h))
        t = holder.setup(T - 8 * SEC - r.randrange(0, SEC))
        big = self.scale >= 0.1
        t, f = holder.open(t + 2 * MS, path, 420_000, OPLOCK_LEASE, LEASE_R | LEASE_W | LEASE_H, write=True)
        t = holder.write(t + 3 * MS, f, 131072 if big else 16384)    # dirty data cached under the W lease
        waiters = []
        for h in waiter_hs:
            w = Smb(self, h, self.fs, self.user_for(h))
            w.setup(T - r.randrange(1 * SEC, 6 * SEC))
            waiters.append(w)
        arrivals = sorted(T + r.randrange(0, 60 * MS) for _ in waiters)
        pending = []
        for w, ta in zip(waiters, arrivals):
            a, mid, key = w.create_req(ta, path, OPLOCK_LEASE, LEASE_R | LEASE_H, write=True)
            aid = w.async_next
            w.async_next += 1
            w.rsp(a + r.randrange(30 * US, 80 * US), SMB2_CREATE, mid, smb2_error_body(), ST_PENDING,
                  async_id=aid)
            pending.append((w, mid, key, aid))
        t_break = arrivals[0] + r.randrange(60 * US, 150 * US)
        t_cli = holder.push(t_break, SMB2_OPLOCK_BREAK,
                            smb2_lease_break_notify(f.lease_key, LEASE_R | LEASE_W | LEASE_H, LEASE_R | LEASE_H, 1))
        delay = r.randrange(700 * MS, 1400 * MS)
        t = holder.write(t_cli + delay, f, 262144 if big else 32768)      # flush before acknowledging
        a, mid = holder.req(t + r.randrange(50 * US, 200 * US), SMB2_OPLOCK_BREAK,
                            smb2_lease_break_ack(f.lease_key, LEASE_R | LEASE_H))
        t_ack = a - holder.c.near
        holder.rsp(a + r.randrange(40 * US, 120 * US), SMB2_OPLOCK_BREAK, mid,
                   smb2_lease_break_ack(f.lease_key, LEASE_R | LEASE_H))
        tf = a + r.randrange(150 * US, 300 * US)
        last = 0
        for w, mid, key, aid in pending:
            w_t, wf = w.create_rsp(tf, mid, path, OPLOCK_LEASE, key, LEASE_R, 420_000 + 262144, async_id=aid)
            last = tf
            tf += r.randrange(30 * US, 90 * US)
            tt = w.read(w_t + r.randrange(20 * US, 200 * US), wf, 65536 if big else 8192)
            w.close(tt + r.randrange(20 * US, 200 * US), wf)
        holder.close(t_ack + r.randrange(2 * SEC, 4 * SEC), f)
        self.label("smb_break_queue", arrivals[0], last, [w.cli.ip for w in waiters], self.fs, 445, "smb2",
                   f"\\\\fs01.{DOMAIN}\\projects\\{path}",
                   f"{k} CREATEs wait (STATUS_PENDING) behind a lease break that {holder_h.ip} acknowledges "
                   f"{(t_ack - t_break) / MS:.0f} ms late",
                   holder=holder_h.ip, break_notify_ns=t_break, break_ack_ns=t_ack,
                   ack_delay_ms=round((t_ack - t_break) / MS, 3), waiters=k,
                   lease_state_from="RWH", lease_state_to="RH")

    def patho_tcp_stall(self, T: int) -> None:
        r = self.rng
        cli = r.choice(self.lnx)
        srv = self.apps[0]
        c = Tcp(self, cli, srv, 8080)
        t = c.open(T - 300 * MS)
        host = f"{srv.name}.{DOMAIN}"

        def exchange(t, size, loss=None):
            req = (f"GET /api/v1/report/{r.randrange(10000)} HTTP/1.1\r\nHost: {host}\r\n"
                   f"User-Agent: synth-client/1.0\r\n\r\n").encode()
            rsp = (f"HTTP/1.1 200 OK\r\nServer: synth/1.0\r\nContent-Type: application/octet-stream\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode() + self.payload(size)
            a = c.send(t, 0, req)
            return c.send(a + r.randrange(100 * US, 400 * US), 1, rsp, loss=loss)

        while t < T - 60 * MS:          # a few quick exchanges establish the µs RTT
            t = exchange(t, r.randrange(1000, 12000)) + r.randrange(20 * MS, 60 * MS)
        rsp_size = 20000
        t_end = exchange(T, rsp_size, loss="rto")
        orig_t, retx_t = c.last_loss
        t = t_end + r.randrange(1 * MS, 20 * MS)
        for _ in range(3):
            t = exchange(t, r.randrange(1000, 12000)) + r.randrange(5 * MS, 60 * MS)
        c.close(t, 0)
        self.label("tcp_stall", orig_t, retx_t, [cli.ip], srv, 8080, "tcp",
                   f"{cli.ip}:{c.sport}->{srv.ip}:8080",
                   f"tail segment of a response lost; retransmitted after an RTO of "
                   f"{(retx_t - orig_t) / MS:.0f} ms on a path with {c.rtt / US:.0f} us RTT",
                   gap_ms=round((retx_t - orig_t) / MS, 3), rtt_us=round(c.rtt / US, 1),
                   original_ns=orig_t, retransmission_ns=retx_t, direction="server->client",
                   client_port=c.sport, retransmissions=1)

    def patho_ldap_churn(self, T: int) -> None:
        r = self.rng
        n = self.n(300, 10)
        cli = self.lnx[7]
        srv = self.dc1
        rate = 80.0
        t = T
        first = T
        last = T
        lifetimes = []
        for _ in range(n):
            L = Ldap(self, cli, srv)
            t0 = t
            tt = L.c.open(t) + r.randrange(5 * US, 30 * US)
            tt = L.bind(tt, f"CN=svc-{cli.name},OU=Service Accounts,{LDAP_BASE}")
            u = r.choice(self.users)
            tt = L.search(tt + r.randrange(5 * US, 30 * US), LDAP_BASE,
                          f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                          ["cn", "mail", "memberOf"], [self.ldap_user_entry(u)])
            tt = L.unbind_close(tt + r.randrange(5 * US, 30 * US))
            lifetimes.append(tt - t0)
            last = max(last, tt)
            t += int(r.expovariate(rate) * SEC) + 200 * US
        self.label("conn_churn", first, last, [cli.ip], srv, 389, "ldap", f"ldap://dc01.{DOMAIN}",
                   f"{cli.ip} opens a new LDAP connection (connect, bind, one search, unbind) for each of "
                   f"{n} operations",
                   connections=n, rate_per_s=rate, ops_per_connection=1,
                   mean_lifetime_ms=round(sum(lifetimes) / n / MS, 3))

    def patho_toctou(self, T: int) -> None:
        r = self.rng
        a_h, b_h = r.sample(self.ws, 2)
        path = "scripts\\deploy.ps1"
        A = Smb(self, a_h, self.fs, self.user_for(a_h), "it")
        B = Smb(self, b_h, self.fs, self.user_for(b_h), "it")
        A.setup(T - 3 * SEC)
        B.setup(T - 2 * SEC)
        # A checks (open for attributes, close with post-query attributes) ...
        t, fa = A.open(T, path, 5120, OPLOCK_NONE)
        t = A.close(t + r.randrange(50 * US, 300 * US), fa, postquery=True)
        check_end = t
        # ... B replaces the file ...
        tb = t + r.randrange(2 * MS, 6 * MS)
        t2, fb = B.open(tb, path, 0, OPLOCK_NONE, write=True, disposition=5)
        t2 = B.write(t2 + r.randrange(30 * US, 200 * US), fb, 7300)
        t2 = B.close(t2 + r.randrange(30 * US, 200 * US), fb)
        # ... then A uses what it checked
        tu = t2 + r.randrange(1 * MS, 4 * MS)
        mark = len(self.store)
        t3, fa2 = A.open(tu, path, 7300, OPLOCK_BATCH)
        use_rsp = max(self.store.ts[mark:])
        t3 = A.read(t3 + r.randrange(30 * US, 200 * US), fa2)
        A.close(t3 + r.randrange(30 * US, 200 * US), fa2)
        self.label("toctou", T, use_rsp, [a_h.ip, b_h.ip], self.fs, 445, "smb2",
                   f"\\\\fs01.{DOMAIN}\\it\\{path}",
                   f"{a_h.ip} checks {path}, {b_h.ip} overwrites it, then {a_h.ip} opens it for use",
                   checker=a_h.ip, modifier=b_h.ip, check_ns=T, check_done_ns=check_end, modify_ns=tb,
                   use_ns=tu, window_ms=round((tu - T) / MS, 3))

    # ============================================================================================
    # Normal traffic
    # ============================================================================================
    def smb_break_demo(self, t: int, h1: Host, h2: Host, lease: bool) -> int:
        """h1 holds a batch oplock / RWH lease; h2's open breaks it quickly (STATUS_PENDING meanwhile)."""
        r = self.rng
        name = "finance\\ledger.xlsx" if lease else "eng\\docs\\spec.docx"
        s1 = Smb(self, h1, self.fs, self.user_for(h1))
        t1 = s1.setup(t)
        t1, f1 = s1.open(t1 + r.randrange(20 * US, 90 * US), name, 20_000,
                         OPLOCK_LEASE if lease else OPLOCK_BATCH, LEASE_R | LEASE_W | LEASE_H)
        t1 = s1.read(t1 + r.randrange(20 * US, 90 * US), f1)
        s2 = Smb(self, h2, self.fs, self.user_for(h2))
        t2 = s2.setup(t + 30 * MS)
        tc = max(t1, t2) + r.randrange(2 * MS, 8 * MS)
        a, mid, key = s2.create_req(tc, name, OPLOCK_LEASE if lease else OPLOCK_BATCH,
                                    LEASE_R | LEASE_H if lease else 0)
        aid = s2.async_next
        s2.async_next += 1
        s2.rsp(a + r.randrange(30 * US, 70 * US), SMB2_CREATE, mid, smb2_error_body(), ST_PENDING,
               async_id=aid)
        tb = a + r.randrange(50 * US, 120 * US)
        if lease:
            react = s1.push(tb, SMB2_OPLOCK_BREAK, smb2_lease_break_notify(
                f1.lease_key, LEASE_R | LEASE_W | LEASE_H, LEASE_R | LEASE_H, 1))
            body = smb2_lease_break_ack(f1.lease_key, LEASE_R | LEASE_H)
        else:
            react = s1.push(tb, SMB2_OPLOCK_BREAK, smb2_oplock_break(OPLOCK_II, f1.fid), s1.sess)
            body = smb2_oplock_break(OPLOCK_II, f1.fid)
        a2, mid2 = s1.req(react + r.randrange(200 * US, 900 * US), SMB2_OPLOCK_BREAK, body)
        s1.rsp(a2 + r.randrange(30 * US, 90 * US), SMB2_OPLOCK_BREAK, mid2, body)
        t2, f2 = s2.create_rsp(a2 + r.randrange(100 * US, 250 * US), mid, name,
                               OPLOCK_LEASE if lease else OPLOCK_II, key, LEASE_R | LEASE_H, 20_000,
                               async_id=aid)
        t2 = s2.read(t2 + r.randrange(20 * US, 90 * US), f2)
        t2 = s2.close(t2 + r.randrange(20 * US, 90 * US), f2)
        s1.close(a2 + r.randrange(5 * MS, 50 * MS), f1)
        return t2

    def showcase(self, t: int) -> None:
        """One of every normal feature, so that even small captures contain them all."""
        ws, lnx = self.ws, self.lnx
        self.dns_udp(t, lnx[0], f"www.{DOMAIN}", (T_A, T_AAAA), slow=False)      # CNAME chain
        self.dns_udp(t + 2 * MS, ws[0], "wpad." + DOMAIN, (T_A,))                 # NXDOMAIN + SOA
        self.dns_udp(t + 4 * MS, self.v6[0], f"web01.{DOMAIN}", (T_AAAA, T_A))    # over IPv6
        self.dns_udp(t + 6 * MS, lnx[1], "www.example.com", (T_A,), slow=True)
        self.dns_tc_fallback(t + 9 * MS, lnx[2])                                  # DNS over TCP
        self.krb_logon(t + 20 * MS, ws[1], tcp=False)
        self.krb_logon(t + 40 * MS, ws[2], tcp=True)
        self.krb_logon(t + 60 * MS, ws[3], tcp=False, outcome="unknown")          # KRB-ERROR 6
        self.krb_logon(t + 80 * MS, ws[4], tcp=False, outcome="badpw")            # KRB-ERROR 24
        self.krb_logon(t + 90 * MS, ws[9], tcp=True, outcome="badpw")
        # LDAP: split request, several messages per segment, multi-segment entry, modify
        L = Ldap(self, lnx[3], self.dc1)
        tl = L.bind(L.c.open(t + 100 * MS) + 20 * US, f"CN=svc-{lnx[3].name},OU=Service Accounts,{LDAP_BASE}")
        u = self.users[5]
        tl = L.search(tl + 50 * US, LDAP_BASE, f_and(f_eq("objectClass", "user"), f_eq("sAMAccountName", u)),
                      ["cn", "mail"], [self.ldap_user_entry(u)], split_req=True)
        tl = L.search(tl + 2 * MS, f"OU=Workstations,{LDAP_BASE}",
                      f_and(f_eq("objectCategory", "computer"), f_substr("dNSHostName", "ws-1")),
                      ["dNSHostName"], [self.ldap_computer_entry(h) for h in ws[10:16]])
        tl = L.search(tl + 2 * MS, f"OU=Groups,{LDAP_BASE}", f_substr("cn", "all-staff"), ["member"],
                      [self.ldap_group_entry("all-staff", 60)])
        tl = L.modify(tl + 3 * MS, f"CN=Anna Adams,OU=Users,{LDAP_BASE}", [(2, "description", ["on leave"])])
        L.unbind_close(tl + 5 * MS)
        # SMB2: plain session, oplock break, lease break (both with STATUS_PENDING + async final)
        s = Smb(self, ws[20], self.fs, self.user_for(ws[20]))
        ts = s.setup(t + 150 * MS)
        ts, f = s.open(ts + 100 * US, "eng\\src\\main.c", 12000, OPLOCK_BATCH)
        ts = s.close(s.read(ts + 50 * US, f) + 50 * US, f)
        ts, f = s.open(ts + 2 * MS, "eng\\src\\build.log", 0, OPLOCK_LEASE, write=True, disposition=5)
        ts = s.close(s.write(ts + 50 * US, f, 9000) + 50 * US, f)
        s.logoff(ts + 3 * MS)
        self.smb_break_demo(t + 200 * MS, ws[21], ws[22], lease=False)
        self.smb_break_demo(t + 350 * MS, ws[23], ws[24], lease=True)
        # TCP: RTO on a WAN path, fast retransmit, zero window, RST abort, refused connection
        c = Tcp(self, self.wan[0], self.web, 80)
        tc = c.open(t + 500 * MS)
        req = f"GET /index.html HTTP/1.1\r\nHost: web01.{DOMAIN}\r\n\r\n".encode()
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 6000\r\n\r\n" \
            + self.payload(6000)
        tc = c.send(c.send(tc, 0, req) + 300 * US, 1, rsp, loss="rto")
        c.close(tc + 2 * MS, 0)
        c = Tcp(self, lnx[4], self.apps[1], 8080)
        tc = c.open(t + 520 * MS)
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 40000\r\n\r\n" \
            + self.payload(40000)
        tc = c.send(c.send(tc, 0, req) + 200 * US, 1, rsp, loss=("fast", 8))
        c.close(tc + 1 * MS, 0)
        c = Tcp(self, lnx[5], self.apps[2], 8080)
        tc = c.open(t + 540 * MS)
        rsp = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 14504\r\n\r\n"
        tc = c.send(tc, 0, req)
        c.send(tc + 200 * US, 1, rsp, split=[len(rsp)])
        tc = c.zero_window(tc + 400 * US)
        c.close(tc + 1 * MS, 0)
        self.http_session(t + 560 * MS, ws[30], self.apps[3], 8080, 2, (1 * MS, 5 * MS), losses=False, end="rst")
        self.http_session(t + 580 * MS, self.v6[1], self.web6, 80, 2, (1 * MS, 5 * MS), losses=False)
        self.refused(t + 600 * MS, ws[31])
        self.syslog(t + 610 * MS, lnx[6], 3)

    # session kind -> probability per draw; tuned so that packets split roughly as HTTP 8080 30%,
    # SMB2 25%, DNS 12%, LDAP 10%, HTTP 80 8%, Kerberos 6%, syslog 2% (see tests/test_synth.py)
    MIX = (("dns", 0.700), ("http", 0.031), ("http_wan", 0.009), ("smb", 0.0076), ("ldap", 0.027),
           ("krb", 0.060), ("syslog", 0.160), ("dns_tcp", 0.001), ("refused", 0.003))

    def random_session(self, t: int, small: bool = False) -> None:
        r = self.rng
        kind = "dns" if small else self._pick()
        if kind == "dns":
            pool = self.v6 if r.random() < 0.08 else self.ws if r.random() < 0.6 else self.lnx
            self.dns_udp(t, r.choice(pool))
        elif kind == "http":
            self.http_session(t, r.choice(self.lnx if r.random() < 0.7 else self.ws), r.choice(self.apps),
                              8080, r.randrange(1, 13), (1 * MS, 800 * MS))
        elif kind == "http_wan":
            if r.random() < 0.15:
                self.http_session(t, r.choice(self.v6), self.web6, 80, r.randrange(1, 10), (5 * MS, 2 * SEC))
            else:
                self.http_session(t, r.choice(self.wan), self.web, 80, r.randrange(1, 12), (5 * MS, 2 * SEC))
        elif kind == "smb":
            self.smb_session(t, r.choice(self.ws), r.randrange(1, 30), (2 * MS, 3 * SEC))
        elif kind == "ldap":
            cli = r.choice(self.lnx if r.random() < 0.6 else self.ws)
            if cli.windows:
                self.ldap_session(t, cli, r.randrange(1, 4), (100 * US, 20 * MS))
            else:
                self.ldap_session(t, cli, r.randrange(5, 40), (1 * MS, 1500 * MS))
        elif kind == "krb":
            y = r.random()
            self.krb_logon(t, r.choice(self.ws), outcome="unknown" if y < 0.03 else "badpw" if y < 0.06 else "ok")
        elif kind == "syslog":
            self.syslog(t, r.choice(self.lnx), r.randrange(1, 5))
        elif kind == "dns_tcp":
            self.dns_tc_fallback(t, r.choice(self.lnx))
        else:
            self.refused(t, r.choice(self.ws + self.lnx))

    def _pick(self) -> str:
        if not hasattr(self, "_mix_cum"):
            acc, self._mix_cum = 0.0, []
            for _, p in self.MIX:
                acc += p
                self._mix_cum.append(acc)
        i = bisect.bisect_right(self._mix_cum, self.rng.random() * self._mix_cum[-1])
        return self.MIX[min(i, len(self.MIX) - 1)][0]

    # ============================================================================================
    # The whole capture
    # ============================================================================================
    def build(self) -> None:
        D, r, st = self.duration, self.rng, self.store
        at = lambda f: int(D * f)   # noqa: E731
        self.patho_dns_herd(max(at(0.42), 11 * SEC))
        self.patho_retry_storm(at(0.53))
        self.patho_krb_herd(at(0.70))
        self.patho_lease_break_queue(at(0.77))
        self.patho_tcp_stall(at(0.85))
        self.patho_ldap_churn(at(0.88))
        self.patho_toctou(at(0.95))
        self.showcase(500 * MS)
        if len(st) > self.packets:
            raise ValueError(f"--packets {self.packets} is too small for the pathologies and the protocol "
                             f"showcase ({len(st)} packets); use at least {len(st)}")
        misses = 0
        while len(st) < self.packets:
            rem = self.packets - len(st)
            t = r.randrange(0, D)
            if rem == 1:
                self.syslog(t, r.choice(self.lnx), 1)
                break
            mark = len(st)
            self.random_session(t, small=misses >= 20 or rem < 40)
            if len(st) > self.packets:
                st.rollback(mark)
                misses += 1
        assert len(st) == self.packets, (len(st), self.packets)
        self.labels.sort(key=lambda l: (l["start_ns"], l["detector"]))


# ================================================================================================
# Writing
# ================================================================================================

def _abs_times(gen: Gen, nanosecond: bool):
    import numpy as np
    ts = np.asarray(gen.store.ts, dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    abs_ns = ts[order] + BASE_EPOCH_NS
    if not nanosecond:
        abs_ns -= abs_ns % 1000
    return order, abs_ns


def write_capture(gen: Gen, path: str, fmt: str = "pcap", nanosecond: bool = False) -> int:
    """Write the frames sorted by time; returns the number of bytes written."""
    order, abs_ns = _abs_times(gen, nanosecond)
    frames = gen.store.frames
    chunk = 65536
    with open(path, "wb") as f:
        if fmt == "pcap":
            f.write(struct.pack("<IHHiIII", 0xA1B23C4D if nanosecond else 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
            secs = (abs_ns // SEC).tolist()
            frac = (abs_ns % SEC if nanosecond else (abs_ns % SEC) // 1000).tolist()
            rec = struct.Struct("<IIII").pack
            idx = order.tolist()
            for lo in range(0, len(idx), chunk):
                parts = []
                for j in range(lo, min(lo + chunk, len(idx))):
                    fr = frames[idx[j]]
                    n = len(fr)
                    parts.append(rec(secs[j], frac[j], n, n))
                    parts.append(fr)
                f.write(b"".join(parts))
        elif fmt == "pcapng":
            def opt(code, value: bytes):
                return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)

            def block(btype, body):
                n = 12 + len(body)
                return struct.pack("<II", btype, n) + body + struct.pack("<I", n)

            shb = struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + opt(4, f"herdscope synth.py v{GENERATOR_VERSION} "
                                                                    f"seed={gen.seed}".encode()) + opt(0, b"")
            idb_opts = opt(2, b"synth0") + (opt(9, b"\x09") if nanosecond else b"") + opt(0, b"")
            f.write(block(0x0A0D0D0A, shb) + block(1, struct.pack("<HHI", 1, 0, 262144) + idb_opts))
            units = abs_ns if nanosecond else abs_ns // 1000
            hi = (units >> 32).tolist()
            lo_ = (units & MASK32).tolist()
            epb = struct.Struct("<IIIIIII").pack
            idx = order.tolist()
            pads = [b"", b"\0\0\0", b"\0\0", b"\0"]
            for lo in range(0, len(idx), chunk):
                parts = []
                for j in range(lo, min(lo + chunk, len(idx))):
                    fr = frames[idx[j]]
                    n = len(fr)
                    total = 32 + n + (-n % 4)
                    parts.append(epb(6, total, 0, hi[j], lo_[j], n, n))
                    parts.append(fr)
                    parts.append(pads[n % 4] + struct.pack("<I", total))
                f.write(b"".join(parts))
        else:
            raise ValueError(f"unknown format {fmt!r}")
        return f.tell()


def labels_json(gen: Gen, nanosecond: bool) -> list[dict]:
    def conv(t: int) -> int:
        a = BASE_EPOCH_NS + t
        return a if nanosecond else a - a % 1000

    out = []
    for l in gen.labels:
        d = dict(l)
        d["start_ns"], d["end_ns"] = conv(l["start_ns"]), conv(l["end_ns"])
        d["parameters"] = {k: (conv(v) if k.endswith("_ns") else v) for k, v in l["parameters"].items()}
        out.append({k: d[k] for k in LABEL_KEYS})
    return out


def generate(out: str, packets: int = 1_000_000, seed: int = 1, fmt: str = "pcap",
             nanosecond: bool = False) -> dict:
    """Generate ``out`` and ``out.labels.json``; returns a small summary dict."""
    t0 = time.perf_counter()
    gen = Gen(seed, packets)
    gen.build()
    t1 = time.perf_counter()
    size = write_capture(gen, out, fmt, nanosecond)
    labels = labels_json(gen, nanosecond)
    with open(out + ".labels.json", "w") as f:
        json.dump(labels, f, indent=1)
        f.write("\n")
    t2 = time.perf_counter()
    ts = gen.store.ts
    return {"path": out, "packets": len(ts), "bytes": size, "labels": len(labels),
            "span_s": round((max(ts) - min(ts)) / SEC, 3), "build_s": round(t1 - t0, 3),
            "write_s": round(t2 - t1, 3), "seed": seed, "format": fmt, "nanosecond": nanosecond}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=1_000_000, help="exact number of records (default 1,000,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="capture file to write; labels go to OUT.labels.json")
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcap")
    ap.add_argument("--nanosecond", action="store_true", help="ns timestamps (pcap ns magic / if_tsresol=9)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        summary = generate(a.out, a.packets, a.seed, a.format, a.nanosecond)
    except ValueError as e:
        print(f"synth.py: {e}", file=sys.stderr)
        return 2
    if not a.quiet:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
