"""Kerberos V5 message encoders (RFC 4120 §5, ASN.1 module in §5 / Appendix A)."""
from __future__ import annotations

from .der import app, ctx, der_bits32, der_gstring, der_gtime, der_int, der_octets, der_seq, der_time

KRB5_PVNO = 5                   # pvno (RFC 4120 §5.4.1, §5.3)
# msg-type (RFC 4120 §7.5.7); each is also the APPLICATION tag of its message
KRB_AS_REQ = 10                 # RFC 4120 §5.4.1
KRB_AS_REP = 11                 # RFC 4120 §5.4.2
KRB_TGS_REQ = 12                # RFC 4120 §5.4.1
KRB_TGS_REP = 13                # RFC 4120 §5.4.2
KRB_AP_REQ = 14                 # RFC 4120 §5.5.1
KRB_ERROR = 30                  # RFC 4120 §5.9.1
APP_TICKET = 1                  # Ticket ::= [APPLICATION 1] (RFC 4120 §5.3)
# name-type (RFC 4120 §6.2)
NT_PRINCIPAL, NT_SRV_INST, NT_SRV_HST = 1, 2, 3
# etype (RFC 3962 §7 AES, RFC 4757 §4 RC4-HMAC and its export / old-export variants)
ETYPE_AES256, ETYPE_AES128, ETYPE_RC4 = 18, 17, 23
ETYPE_RC4_EXP, ETYPE_RC4_OLD_EXP = 24, -135
# error-code (RFC 4120 §7.5.9)
KDC_ERR_C_PRINCIPAL_UNKNOWN = 6
KDC_ERR_PREAUTH_FAILED = 24
KDC_ERR_PREAUTH_REQUIRED = 25
# padata-type (RFC 4120 §7.5.2; PA-PK-AS-* RFC 4556 §3.2; PA-PAC-REQUEST MS-KILE §2.2.3)
PA_TGS_REQ, PA_ENC_TIMESTAMP, PA_ETYPE_INFO2, PA_PAC_REQUEST = 1, 2, 19, 128
PA_PK_AS_REP_OLD, PA_PK_AS_REQ = 15, 16
ADDRTYPE_NETBIOS = 20           # HostAddress addr-type (RFC 4120 §7.5.3)
NETBIOS_NAME_LEN = 16           # a NetBIOS address is the 16-octet padded name (RFC 4120 §7.5.3)
# KDCOptions bits (RFC 4120 §5.4.1): forwardable(1) renewable(8) canonicalize(15) renewable-ok(27)
KDC_OPT_AS = 0x40810010
KDC_OPT_TGS = 0x40810000        # forwardable, renewable, canonicalize
KRB_TILL = "20370913024805Z"    # till / rtime: the end of 32-bit time, as Windows clients ask
TICKET_KVNO = 2                 # key version of the krbtgt key in tickets and AS-REP enc-part


def krb_principal(name_type: int, *names: str) -> bytes:
    """PrincipalName (RFC 4120 §5.2.2)."""
    return der_seq(ctx(0, der_int(name_type)), ctx(1, der_seq(*(der_gstring(n) for n in names))))


def krb_enc(etype: int, cipher: bytes, kvno: int | None = None) -> bytes:
    """EncryptedData (RFC 4120 §5.2.9)."""
    parts = [ctx(0, der_int(etype))]
    if kvno is not None:
        parts.append(ctx(1, der_int(kvno)))
    parts.append(ctx(2, der_octets(cipher)))
    return der_seq(*parts)


def krb_padata(pa_type: int, value: bytes) -> bytes:
    """PA-DATA (RFC 4120 §5.2.7)."""
    return der_seq(ctx(1, der_int(pa_type)), ctx(2, der_octets(value)))


def krb_ticket(realm: str, sname: bytes, cipher: bytes, kvno: int = TICKET_KVNO) -> bytes:
    """Ticket (RFC 4120 §5.3)."""
    return app(APP_TICKET, der_seq(ctx(0, der_int(KRB5_PVNO)), ctx(1, der_gstring(realm)), ctx(2, sname),
                                   ctx(3, krb_enc(ETYPE_AES256, cipher, kvno))))


def krb_req_body(options: int, realm: str, sname: bytes, nonce: int, cname: bytes | None = None,
                 etypes=(ETYPE_AES256, ETYPE_AES128, ETYPE_RC4), addresses: bytes | None = None,
                 rtime: bool = False) -> bytes:
    """KDC-REQ-BODY (RFC 4120 §5.4.1)."""
    parts = [ctx(0, der_bits32(options))]
    if cname is not None:
        parts.append(ctx(1, cname))
    parts.append(ctx(2, der_gstring(realm)))
    parts.append(ctx(3, sname))
    parts.append(ctx(5, der_gtime(KRB_TILL)))
    if rtime:
        parts.append(ctx(6, der_gtime(KRB_TILL)))
    parts.append(ctx(7, der_int(nonce)))
    parts.append(ctx(8, der_seq(*(der_int(e) for e in etypes))))
    if addresses is not None:
        parts.append(ctx(9, addresses))
    return der_seq(*parts)


def krb_netbios_addresses(name: str) -> bytes:
    """HostAddresses with one NetBIOS address (RFC 4120 §5.2.5, §7.5.3)."""
    nb = name.upper().ljust(NETBIOS_NAME_LEN)[:NETBIOS_NAME_LEN]
    return der_seq(der_seq(ctx(0, der_int(ADDRTYPE_NETBIOS)), ctx(1, der_octets(nb))))


def krb_kdc_req(msg_type: int, padata: list[bytes], body: bytes) -> bytes:
    """AS-REQ / TGS-REQ (KDC-REQ, RFC 4120 §5.4.1)."""
    parts = [ctx(1, der_int(KRB5_PVNO)), ctx(2, der_int(msg_type))]
    if padata:
        parts.append(ctx(3, der_seq(*padata)))
    parts.append(ctx(4, body))
    return app(msg_type, der_seq(*parts))


def krb_kdc_rep(msg_type: int, crealm: str, cname: bytes, ticket: bytes, enc_cipher: bytes,
                padata: list[bytes] | None = None) -> bytes:
    """AS-REP / TGS-REP (KDC-REP, RFC 4120 §5.4.2)."""
    parts = [ctx(0, der_int(KRB5_PVNO)), ctx(1, der_int(msg_type))]
    if padata:
        parts.append(ctx(2, der_seq(*padata)))
    parts += [ctx(3, der_gstring(crealm)), ctx(4, cname), ctx(5, ticket),
              ctx(6, krb_enc(ETYPE_AES256, enc_cipher, TICKET_KVNO if msg_type == KRB_AS_REP else None))]
    return app(msg_type, der_seq(*parts))


def krb_error(code: int, stime_ns: int, realm: str, sname: bytes, cname: bytes | None = None,
              edata: bytes | None = None, etext: str | None = None) -> bytes:
    """KRB-ERROR (RFC 4120 §5.9.1); ``susec`` is the microseconds of ``stime_ns``."""
    parts = [ctx(0, der_int(KRB5_PVNO)), ctx(1, der_int(KRB_ERROR)), ctx(4, der_time(stime_ns)),
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
    """ETYPE-INFO2 (RFC 4120 §5.2.7.5): AES256 with the salt, then RC4 (no salt)."""
    return der_seq(der_seq(ctx(0, der_int(ETYPE_AES256)), ctx(1, der_gstring(salt))),
                   der_seq(ctx(0, der_int(ETYPE_RC4))))


def krb_ap_req(ticket: bytes, authenticator: bytes) -> bytes:
    """AP-REQ (RFC 4120 §5.5.1) with no ap-options."""
    return app(KRB_AP_REQ, der_seq(ctx(0, der_int(KRB5_PVNO)), ctx(1, der_int(KRB_AP_REQ)),
                                   ctx(2, der_bits32(0)), ctx(3, ticket),
                                   ctx(4, krb_enc(ETYPE_AES256, authenticator))))
