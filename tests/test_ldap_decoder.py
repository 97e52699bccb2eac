"""LDAP decoder (analyzer.decoders.ldap): byte-literal LDAPMessages for every protocolOp (RFC 4511
§4), RFC 4515 filter rendering, SASL/TLS framing, malformed variants, random input, and the
transaction pairing on small constructed message sets."""
from __future__ import annotations

import random
import struct

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from analyzer.decoders import ldap
from builders import integer, octets, seq, tlv
from fakes import message_set
from fuzzing import mutate

# --- RFC 4511 builders -------------------------------------------------------------------------------


def enum(v: int) -> bytes:
    return integer(v, tag=0x0A)


def boolean(v: bool) -> bytes:
    return tlv(0x01, b"\xff" if v else b"\x00")


def msg(mid: int, op: bytes, controls: bytes | None = None) -> bytes:
    return seq(integer(mid), op, *([tlv(0xA0, controls)] if controls is not None else []))


def control(oid: str, critical: bool | None = None, value: bytes | None = None) -> bytes:
    return seq(octets(oid), *([boolean(critical)] if critical is not None else []),
               *([octets(value)] if value is not None else []))


def bind_simple(name="cn=admin,dc=example,dc=com", password=b"secret", version=3) -> bytes:
    return tlv(0x60, integer(version), octets(name), tlv(0x80, password))


def bind_sasl(mechanism="GSS-SPNEGO", credentials: bytes | None = b"\x60\x01\x00", name="") -> bytes:
    creds = [octets(credentials)] if credentials is not None else []
    return tlv(0x60, integer(3), octets(name), tlv(0xA3, octets(mechanism), *creds))


def result(app: int, code=0, matched="", diag="", *extra: bytes) -> bytes:
    return tlv(0x60 | app, enum(code), octets(matched), octets(diag), *extra)


def search(base="dc=example,dc=com", scope=2, deref=0, size=0, time=0, types_only=False, flt=None,
           attrs=()) -> bytes:
    flt = flt if flt is not None else present("objectClass")
    return tlv(0x63, octets(base), enum(scope), enum(deref), integer(size), integer(time), boolean(types_only),
               flt, seq(*[octets(a) for a in attrs]))


# filters (RFC 4511 §4.5.1.7)
def f_and(*items): return tlv(0xA0, *items)
def f_or(*items): return tlv(0xA1, *items)
def f_not(item): return tlv(0xA2, item)
def ava(tag, attr, value): return tlv(tag, octets(attr), octets(value))
def eq(a, v): return ava(0xA3, a, v)
def ge(a, v): return ava(0xA5, a, v)
def le(a, v): return ava(0xA6, a, v)
def approx(a, v): return ava(0xA8, a, v)
def present(a): return tlv(0x87, a.encode())


def substrings(attr, initial=None, any_=(), final=None, order=None):
    items = []
    if initial is not None:
        items.append(tlv(0x80, initial.encode()))
    items += [tlv(0x81, a.encode()) for a in any_]
    if final is not None:
        items.append(tlv(0x82, final.encode()))
    if order is not None:
        items = [items[k] for k in order]
    return tlv(0xA4, octets(attr), seq(*items))


def extensible(value, attr=None, rule=None, dn=False):
    parts = []
    if rule is not None:
        parts.append(tlv(0x81, rule.encode()))
    if attr is not None:
        parts.append(tlv(0x82, attr.encode()))
    parts.append(tlv(0x83, value.encode() if isinstance(value, str) else value))
    if dn:
        parts.append(tlv(0x84, b"\xff"))
    return tlv(0xA9, *parts)


def entry(dn, *attrs) -> bytes:
    return tlv(0x64, octets(dn), seq(*[seq(octets(a), tlv(0x31, octets("v"))) for a in attrs]))


def reference(*uris) -> bytes:
    return tlv(0x73, *[octets(u) for u in uris])


def modify(dn, *changes) -> bytes:
    return tlv(0x66, octets(dn), seq(*[seq(enum(op), seq(octets(attr), tlv(0x31, octets("x"))))
                                       for op, attr in changes]))


def add(dn, *attrs) -> bytes:
    return tlv(0x68, octets(dn), seq(*[seq(octets(a), tlv(0x31, octets("v"))) for a in attrs]))


def delete(dn) -> bytes:
    return tlv(0x4A, dn.encode())


def moddn(dn, newrdn, delete_old=True, new_superior=None) -> bytes:
    return tlv(0x6C, octets(dn), octets(newrdn), boolean(delete_old),
               *([tlv(0x80, new_superior.encode())] if new_superior else []))


def compare(dn, attr, value) -> bytes:
    return tlv(0x6E, octets(dn), seq(octets(attr), octets(value)))


def abandon(mid: int) -> bytes:
    return integer(mid, tag=0x50)


def extended(oid, value: bytes | None = None) -> bytes:
    return tlv(0x77, tlv(0x80, oid.encode()), *([tlv(0x81, value)] if value is not None else []))


def extended_resp(code=0, name=None) -> bytes:
    return result(24, code, "", "", *([tlv(0x8A, name.encode())] if name else []))


def intermediate(name=None) -> bytes:
    return tlv(0x79, *([tlv(0x80, name.encode())] if name else []))


UNBIND = tlv(0x42, b"")


# SASL security layers (RFC 4422 §3.7: 4-octet length + the mechanism's output)
def sasl(token: bytes) -> bytes:
    return struct.pack(">I", len(token)) + token


def krb5_wrap(data: bytes, sealed=False, ec=12, rrc=12) -> bytes:
    """RFC 4121 §4.2.6.2 wrap token; without Sealed, {data | checksum(ec)} rotated right by rrc."""
    body = data + b"\xCC" * ec
    r = rrc % len(body)
    rotated = body[-r:] + body[:-r] if r else body
    return bytes([0x05, 0x04, 0x06 if sealed else 0x04, 0xFF]) + struct.pack(">HH", ec, rrc) + b"\x00" * 8 + rotated


def rfc1964_wrap(data: bytes, seal_alg=b"\xff\xff", sgn_alg=b"\x11\x00", pad=b"\x01") -> bytes:
    inner = bytes.fromhex("06092a864886f712010202") + b"\x02\x01" + sgn_alg + seal_alg + b"\xff\xff" \
        + b"\x00" * 8 + b"\xAA" * (20 if sgn_alg == b"\x04\x00" else 8) + b"\xBB" * 8 + data + pad
    return tlv(0x60, inner)


def decode(*messages: bytes, **kw) -> pl.DataFrame:
    kw.setdefault("dport", 389)
    return ldap.decode_messages([message_set(list(messages), **kw)])


def row(message: bytes, **kw) -> dict:
    out = decode(message, **kw)
    assert out.height == 1, out
    return out.row(0, named=True)


# --- every protocolOp ------------------------------------------------------------------------------------

def test_bind_simple():
    r = row(msg(1, bind_simple()))
    assert (r["message_id"], r["op_code"], r["op"]) == (1, 0, "bindRequest")
    assert (r["version"], r["dn"], r["auth"], r["credentials_len"]) == (3, "cn=admin,dc=example,dc=com", "simple", 6)
    assert r["sasl_mechanism"] is None and r["decode_error"] is None and r["opaque"] is None
    assert r["sasl"] is False and r["unit"] == 0


def test_anonymous_bind_and_sasl_bind():
    r = row(msg(1, bind_simple(name="", password=b"")))
    assert (r["dn"], r["credentials_len"]) == ("", 0)
    r = row(msg(2, bind_sasl("GSSAPI", b"\x01" * 40)))
    assert (r["auth"], r["sasl_mechanism"], r["credentials_len"]) == ("sasl", "GSSAPI", 40)
    r = row(msg(3, bind_sasl("EXTERNAL", None)))
    assert (r["sasl_mechanism"], r["credentials_len"]) == ("EXTERNAL", 0)
    r = row(msg(4, tlv(0x60, integer(3), octets(""), tlv(0x8A, b"NTLMSSP\x00"))))  # MS sicilyNegotiate
    assert r["auth"] == "sicilyNegotiate"


def test_bind_response():
    r = row(msg(1, result(1, 14, "", "SASL(0): successful result: ", tlv(0x87, b"creds"))))
    assert (r["op"], r["result_code"], r["result"]) == ("bindResponse", 14, "saslBindInProgress")
    assert r["diagnostic_message"] == "SASL(0): successful result: " and r["matched_dn"] == ""
    r = row(msg(1, result(1, 49, "", "80090308: LdapErr: DSID-0C09044E")))
    assert r["result"] == "invalidCredentials"


def test_search_request_fields():
    flt = f_and(eq("objectClass", "user"), eq("sAMAccountName", "bob"))
    r = row(msg(5, search("DC=corp,DC=local", 1, 3, 500, 30, True, flt, ("cn", "memberOf"))))
    assert r["op"] == "searchRequest" and r["dn"] == "DC=corp,DC=local"
    assert (r["scope"], r["deref_aliases"]) == ("singleLevel", "derefAlways")
    assert (r["size_limit"], r["time_limit"], r["types_only"]) == (500, 30, True)
    assert r["filter"] == "(&(objectClass=user)(sAMAccountName=bob))"
    assert (r["attributes"], r["attribute_count"]) == ("cn,memberOf", 2)
    r = row(msg(6, search(attrs=())))
    assert (r["attributes"], r["attribute_count"]) == ("", 0)


def test_search_results():
    r = row(msg(5, entry("cn=bob,dc=example,dc=com", "cn", "mail", "memberOf")))
    assert (r["op"], r["dn"], r["attribute_count"]) == ("searchResEntry", "cn=bob,dc=example,dc=com", 3)
    r = row(msg(5, reference("ldap://a.example.com/dc=a", "ldap://b/dc=b")))
    assert (r["op"], r["referrals"]) == ("searchResRef", "ldap://a.example.com/dc=a ldap://b/dc=b")
    r = row(msg(5, result(5, 32, "dc=example,dc=com", "no such", tlv(0xA3, octets("ldap://x/")))))
    assert (r["op"], r["result"], r["matched_dn"], r["referrals"]) == (
        "searchResDone", "noSuchObject", "dc=example,dc=com", "ldap://x/")


def test_writes():
    r = row(msg(7, modify("cn=pc,dc=x", (2, "msDS-SupportedEncryptionTypes"), (0, "member"), (1, "x"), (3, "n"))))
    assert (r["op"], r["dn"]) == ("modifyRequest", "cn=pc,dc=x")
    assert r["changes"] == "replace(msDS-SupportedEncryptionTypes),add(member),delete(x),increment(n)"
    assert r["attribute_count"] == 4
    r = row(msg(8, add("cn=new,dc=x", "objectClass", "cn", "sn")))
    assert (r["op"], r["dn"], r["attributes"], r["attribute_count"]) == ("addRequest", "cn=new,dc=x",
                                                                         "objectClass,cn,sn", 3)
    r = row(msg(9, delete("cn=old,dc=x")))
    assert (r["op"], r["op_code"], r["dn"]) == ("delRequest", 10, "cn=old,dc=x")
    r = row(msg(10, moddn("cn=b,ou=a,dc=x", "cn=c", True, "ou=moved,dc=x")))
    assert (r["op"], r["dn"], r["new_rdn"], r["delete_old_rdn"], r["new_superior"]) == (
        "modDNRequest", "cn=b,ou=a,dc=x", "cn=c", True, "ou=moved,dc=x")
    r = row(msg(11, moddn("cn=b,dc=x", "cn=d", False)))
    assert (r["delete_old_rdn"], r["new_superior"]) == (False, None)
    r = row(msg(12, compare("cn=b,dc=x", "userPassword", "hunter2")))
    assert (r["op"], r["dn"], r["attributes"], r["attribute_count"]) == ("compareRequest", "cn=b,dc=x",
                                                                         "userPassword", 1)
    for app, name in [(7, "modifyResponse"), (9, "addResponse"), (11, "delResponse"), (13, "modDNResponse"),
                      (15, "compareResponse")]:
        r = row(msg(12, result(app, 6 if app == 15 else 0)))
        assert r["op"] == name and r["decode_error"] is None


def test_unbind_abandon_extended_intermediate():
    r = row(msg(4, UNBIND))
    assert (r["op"], r["op_code"], r["decode_error"]) == ("unbindRequest", 2, None)
    r = row(msg(9, abandon(5)))
    assert (r["op"], r["abandon_id"]) == ("abandonRequest", 5)
    r = row(msg(1, extended(ldap.STARTTLS_OID)))
    assert (r["op"], r["oid"]) == ("extendedReq", "1.3.6.1.4.1.1466.20037")
    r = row(msg(2, extended("1.3.6.1.4.1.4203.1.11.3", b"\x00")))  # whoami with a value
    assert r["oid"] == "1.3.6.1.4.1.4203.1.11.3"
    r = row(msg(1, extended_resp(0, ldap.STARTTLS_OID)))
    assert (r["op"], r["result"], r["oid"]) == ("extendedResp", "success", ldap.STARTTLS_OID)
    r = row(msg(0, extended_resp(52, "1.3.6.1.4.1.1466.20036")))  # notice of disconnection (§4.4.1)
    assert (r["message_id"], r["result"]) == (0, "unavailable")
    r = row(msg(3, intermediate("1.3.6.1.4.1.4203.1.9.1.4")))
    assert (r["op"], r["oid"]) == ("intermediateResponse", "1.3.6.1.4.1.4203.1.9.1.4")
    assert row(msg(3, intermediate()))["oid"] is None


def test_controls():
    controls = control("1.2.840.113556.1.4.319", True, seq(integer(500), octets(""))) + control("1.2.840.113556.1.4.801")
    r = row(msg(6, search(), controls))
    assert r["controls"] == "1.2.840.113556.1.4.319,1.2.840.113556.1.4.801" and r["decode_error"] is None
    r = row(msg(6, search(), b""))
    assert r["controls"] == ""


def test_unknown_result_code_and_utf8():
    assert row(msg(1, result(7, 999)))["result"] == "resultCode999"
    r = row(msg(1, delete("cn=Jürgen Müller,dc=x")))
    assert r["dn"] == "cn=Jürgen Müller,dc=x"
    r = row(msg(1, tlv(0x4A, b"cn=a\x00\xff")))
    assert r["dn"] == "cn=a\\x00\\xff"


# --- filters (RFC 4515) -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flt,text", [
    (present("objectClass"), "(objectClass=*)"),
    (eq("cn", "Babs Jensen"), "(cn=Babs Jensen)"),
    (f_not(eq("cn", "Tim Howes")), "(!(cn=Tim Howes))"),
    (f_and(eq("objectClass", "Person"), f_or(eq("sn", "Jensen"), substrings("cn", "Babs J"))),
     "(&(objectClass=Person)(|(sn=Jensen)(cn=Babs J*)))"),
    (substrings("o", "univ", ("of",), "mich"), "(o=univ*of*mich)"),
    (substrings("mail", final="@example.com"), "(mail=*@example.com)"),
    (substrings("cn", any_=("a", "b")), "(cn=*a*b*)"),
    (substrings("cn", initial="a"), "(cn=a*)"),
    (ge("uSNChanged", "100"), "(uSNChanged>=100)"),
    (le("age", "7"), "(age<=7)"),
    (approx("sn", "jensen"), "(sn~=jensen)"),
    (extensible("Fred Flintstone", "cn", "2.4.6.8.10", dn=True), "(cn:dn:2.4.6.8.10:=Fred Flintstone)"),
    (extensible("Barney Rubble", "sn", None), "(sn:=Barney Rubble)"),
    (extensible("John", None, "2.4.6.8.10"), "(:2.4.6.8.10:=John)"),
    (extensible("x", "o", None, dn=True), "(o:dn:=x)"),
    (extensible("512", "userAccountControl", "1.2.840.113556.1.4.803"),
     "(userAccountControl:1.2.840.113556.1.4.803:=512)"),
    (f_and(), "(&)"), (f_or(), "(|)"),  # RFC 4526 absolute true / false
    (f_and(present("a"), present("b"), present("c")), "(&(a=*)(b=*)(c=*))"),  # n-ary, as on the wire
    # RFC 4515 §3 escaping, §4 examples
    (eq("o", "Parens R Us (for all your parenthetical needs)"), "(o=Parens R Us \\28for all your parenthetical needs\\29)"),
    (eq("cn", "*"), "(cn=\\2a)"),
    (eq("filename", "C:\\MyFile"), "(filename=C:\\5cMyFile)"),
    (ava(0xA3, "bin", b"\x00\x00\x00\x04"), "(bin=\\00\\00\\00\\04)"),
    (eq("sn", "Lučić"), "(sn=Lučić)"),  # well-formed UTF-8 stays
    (ava(0xA3, "objectGUID", b"\xff\x10\x80"), "(objectGUID=\\ff\\10\\80)"),
])
def test_filter_rendering(flt, text):
    r = row(msg(2, search(flt=flt)))
    assert r["filter"] == text and r["decode_error"] is None


@pytest.mark.parametrize("flt,reason", [
    (f_not(present("a") + present("b")), "bad value"),  # not: exactly one filter
    (f_not(b""), "bad value"),
    (substrings("cn", "a", ("b",), order=[1, 0]), "unexpected tag"),  # initial after any
    (tlv(0xA4, octets("cn"), seq(tlv(0x82, b"x"), tlv(0x81, b"y"))), "unexpected tag"),  # any after final
    (tlv(0xA4, octets("cn"), seq()), "missing field"),
    (tlv(0xAA, b""), "unexpected tag"),  # [10]: no such filter
    (tlv(0xA9, tlv(0x81, b"rule")), "missing field"),  # extensible without matchValue
    (tlv(0xA3, octets("a")), "missing field"),  # AVA without its value
])
def test_bad_filters(flt, reason):
    r = row(msg(2, search(flt=flt)))
    assert r["decode_error"] == reason and r["filter"] is None
    assert r["dn"] == "dc=example,dc=com" and r["scope"] == "wholeSubtree"  # read before the filter


def test_filter_depth_is_capped():
    deep = present("x")
    for _ in range(ldap.MAX_FILTER_DEPTH):
        deep = f_and(deep)
    r = row(msg(2, search(flt=deep)))
    assert r["decode_error"] is None and r["filter"].count("(&") == ldap.MAX_FILTER_DEPTH
    r = row(msg(2, search(flt=f_not(deep))))
    assert r["decode_error"] == "too deep" and r["filter"] is None
    very = present("x")
    for _ in range(3000):  # far deeper than any stack: the renderer has no recursion
        very = f_or(very)
    assert row(msg(2, search(flt=very)))["decode_error"] == "too deep"


# --- several messages, SASL, TLS ----------------------------------------------------------------------------

def test_cldap_datagram_with_two_messages():
    out = decode(msg(1, entry("", "netlogon")) + msg(1, result(5, 0)), from_client=[False])
    assert out.select("unit", "op", "message_id").rows() == [(0, "searchResEntry", 1), (1, "searchResDone", 1)]
    assert out["frame_last"].to_list() == [1, 1]


def test_trailing_garbage_gets_its_own_row():
    out = decode(msg(1, UNBIND) + b"\x01\x01\x00")
    assert out.select("unit", "op", "decode_error").rows() == [(0, "unbindRequest", None), (1, None, "not this protocol")]


@pytest.mark.parametrize("rrc", [12, 0, 5])
def test_sasl_krb5_integrity_only(rrc):
    inner = msg(4, search("", 0, flt=present("objectClass"))) + msg(5, UNBIND)
    out = decode(sasl(krb5_wrap(inner, rrc=rrc)))
    assert out.select("unit", "sasl", "opaque", "message_id", "op").rows() == [
        (0, True, None, 4, "searchRequest"), (1, True, None, 5, "unbindRequest")]
    assert out["decode_error"].null_count() == 2


def test_sasl_krb5_rotation_wrapping_the_data_is_opaque():
    out = decode(sasl(krb5_wrap(msg(4, UNBIND), ec=4, rrc=6)))  # rrc > ec: the data wraps around
    assert out.select("opaque", "op").rows() == [("sasl", None)]


def test_sasl_sealed_tls_and_unknown_are_opaque():
    assert row(sasl(krb5_wrap(b"\x99" * 40, sealed=True)))["opaque"] == "sasl-sealed"
    assert row(sasl(rfc1964_wrap(b"\x99" * 40, seal_alg=b"\x10\x00")))["opaque"] == "sasl-sealed"
    r = row(sasl(b"\x00\x01\x02\x03SRP-integrity"))
    assert (r["opaque"], r["op"], r["decode_error"]) == ("sasl", None, None)
    for record in (b"\x17\x03\x03\x00\x05hello", b"\x16\x03\x01\x00\x02\x01\x00", b"\x15\x03\x03\x00\x02\x02\x28"):
        r = row(record)
        assert (r["opaque"], r["op"], r["decode_error"]) == ("tls", None, None)


def test_sasl_rfc1964_integrity_only():
    inner = msg(7, result(1, 0)) + msg(8, result(5, 0))
    out = decode(sasl(rfc1964_wrap(inner)), from_client=[False])
    assert out.select("sasl", "op").rows() == [(True, "bindResponse"), (True, "searchResDone")]
    out = decode(sasl(rfc1964_wrap(msg(9, UNBIND), sgn_alg=b"\x04\x00", pad=b"\x03\x03\x03")))
    assert out.select("sasl", "op").rows() == [(True, "unbindRequest")]


def test_sasl_wrap_of_non_ldap_is_opaque():
    assert row(sasl(krb5_wrap(b"\x01\x02\x03\x04\x05\x06\x07\x08")))["opaque"] == "sasl"


# --- malformed ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data,reason", [
    (b"", "truncated"),
    (b"\x30", "truncated"),
    (b"\x30\x80\x02\x01\x01\x42\x00\x00\x00", "indefinite length"),  # RFC 4511 §5.1: definite only
    (seq(octets("x")), "not this protocol"),  # messageID must be an INTEGER
    (seq(integer(1)), "truncated"),  # no protocolOp
    (seq(integer(1), tlv(0x71, b"")), "unexpected tag"),  # [APPLICATION 17]: no such op
    (seq(integer(1), tlv(0x62, b"")), "unexpected tag"),  # unbind must be primitive
    (seq(integer(1), tlv(0x42, b"\x00")), "bad value"),  # unbind is NULL
    (seq(integer(1), tlv(0x43, b"")), "unexpected tag"),  # searchRequest must be constructed
    (msg(1, UNBIND, b"") + b"", None),
    (seq(integer(1), UNBIND, tlv(0xA1, b"")), "unexpected tag"),  # controls are [0]
    (seq(integer(1), UNBIND, tlv(0xA0, b""), b"\x05\x00"), "trailing bytes"),
    (seq(integer(1), tlv(0x60, integer(3), octets("x"))), "truncated"),  # bind without authentication
    (seq(integer(1), tlv(0x60, integer(3), octets("x"), tlv(0x00, b""))), "unexpected tag"),
    (seq(integer(1), tlv(0x65, enum(0), octets(""))), "truncated"),  # LDAPResult without diagnosticMessage
    (seq(integer(1), tlv(0x65, enum(0), octets(""), octets(""), octets("z"))), "unexpected tag"),
    (seq(integer(1), tlv(0x64, octets("dn"), seq(octets("notasequence")))), "unexpected tag"),
    (bytes.fromhex("3007020101420000ff"), "bad length"),  # messageID INTEGER past the SEQUENCE: no
    (b"\x02\x01\x01", "not this protocol"),
])
def test_malformed(data, reason):
    out = decode(data)
    assert out["decode_error"][0] == reason


def test_truncated_search_keeps_the_first_fields():
    m = msg(3, search("dc=example,dc=com", 2, flt=f_and(eq("a", "1"), eq("b", "2")), attrs=("cn",)))
    r = row(m[:-12], wire_lengths=[len(m)])
    assert r["decode_error"] == "truncated" and r["complete"] is False
    assert (r["message_id"], r["op"], r["dn"], r["scope"]) == (3, "searchRequest", "dc=example,dc=com", "wholeSubtree")
    assert r["filter"] is None


def test_arena_growth_with_escapes():
    big = "(" * 3000
    out = decode(*[msg(k, search(flt=eq("cn", big))) for k in range(3)])
    assert out["filter"].str.len_bytes().to_list() == [len("(cn=)") + 3 * 3000] * 3


def test_schema():
    out = decode(msg(1, UNBIND))
    assert out.columns == [c.name for c in ldap.MESSAGE_COLUMNS]
    assert all(c.description for c in ldap.MESSAGE_COLUMNS)
    empty = ldap.decode_messages([])
    assert empty.height == 0 and empty.columns == out.columns


# --- random input: never raises, every framed message has rows ------------------------------------------

SAMPLES = [msg(1, bind_simple()), msg(2, search(flt=f_and(eq("a", "b"), f_not(substrings("c", "d", ("e",), "f"))))),
           msg(2, entry("cn=x", "a", "b")), msg(2, result(5, 0, "", "", tlv(0xA3, octets("ldap://x")))),
           msg(3, modify("cn=x", (2, "a"))), msg(4, moddn("a", "b", True, "c")), msg(5, extended("1.2.3")),
           sasl(krb5_wrap(msg(6, UNBIND) + msg(7, abandon(3)))), sasl(rfc1964_wrap(msg(8, delete("x"))))]


# Bytes that matter to LDAP's BER: long-form lengths, SEQUENCE, [0] and the [7] present filter.
LDAP_SPECIAL = (0x80, 0x84, 0xFF, 0x00, 0x30, 0xA0, 0x87)


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    return mutate(data, rnd, LDAP_SPECIAL)


def _check_rows(out: pl.DataFrame, n: int):
    frames = out["frame_last"].to_list()
    assert set(frames) == set(range(1, n + 1))  # every framed message has at least one row
    for f in range(1, n + 1):
        units = out.filter(pl.col("frame_last") == f)["unit"].to_list()
        assert units == list(range(len(units)))
    assert set(out["decode_error"].drop_nulls()) <= set(ldap.ber.STATUS_NAMES.values())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=120), min_size=1, max_size=8))
def test_random_bytes_never_raise(messages):
    _check_rows(decode(*messages), len(messages))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_mutated_messages_never_raise(seed):
    rnd = random.Random(seed)
    messages = [_mutate(rnd.choice(SAMPLES), rnd) for _ in range(6)]
    _check_rows(decode(*messages), 6)


# --- transactions --------------------------------------------------------------------------------------------

S = 1_000_000_000


def tx_of(messages, from_client, flows=None, ts=None, **kw):
    s = message_set(messages, from_client=from_client, flows=flows, ts=ts, dport=389, **kw)
    return ldap.pair_transactions(ldap.decode_messages([s]))


def test_bind_search_unbind():
    msgs = [msg(1, bind_simple()), msg(1, result(1, 0)),
            msg(2, search(flt=eq("cn", "x"))), msg(2, entry("cn=a")), msg(2, reference("ldap://r")),
            msg(2, entry("cn=b")), msg(2, result(5, 0)), msg(3, UNBIND)]
    tx = tx_of(msgs, [True, False, True, False, False, False, False, True],
               ts=[1 * S, 2 * S, 3 * S, 4 * S, 5 * S, 6 * S, 10 * S, 11 * S])
    assert tx.select("operation", "resource", "message_id", "status", "answered", "is_error",
                     "expects_response").rows() == [
        ("bindRequest", "cn=admin,dc=example,dc=com", 1, "success", True, False, True),
        ("searchRequest", "dc=example,dc=com", 2, "success", True, False, True),
        ("unbindRequest", None, 3, None, False, False, False)]
    search_tx = tx.row(1, named=True)
    assert (search_tx["entries"], search_tx["references"], search_tx["first_entry_ns"], search_tx["latency_ns"]) == (
        2, 1, 1 * S, 7 * S)
    assert search_tx["filter"] == "(cn=x)" and search_tx["response_frame"] == 7
    assert tx["protocol"].to_list() == ["ldap"] * 3
    assert tx.columns == [c.name for c in ldap.TRANSACTION_COLUMNS]


def test_pairing_by_connection_and_message_id():
    # two connections using the same messageIDs, answered out of order
    msgs = [msg(1, search("a")), msg(1, search("b")), msg(1, result(5, 32)), msg(1, result(5, 0))]
    tx = tx_of(msgs, [True, True, False, False], flows=[0, 1, 1, 0])
    assert tx.select("flow", "resource", "status", "is_error", "response_frame").rows() == [
        (0, "a", "success", False, 4), (1, "b", "noSuchObject", True, 3)]


def test_message_id_reuse_on_a_connection():
    msgs = [msg(1, delete("a")), msg(1, result(11, 0)), msg(1, delete("b")), msg(1, result(11, 50))]
    tx = tx_of(msgs, [True, False, True, False])
    assert tx.select("resource", "status", "response_frame").rows() == [
        ("a", "success", 2), ("b", "insufficientAccessRights", 4)]


def test_abandon_and_unanswered():
    msgs = [msg(5, search("dc=big")), msg(5, entry("cn=1")), msg(6, abandon(5)), msg(7, search("dc=other"))]
    tx = tx_of(msgs, [True, False, True, True])
    assert tx.select("operation", "message_id", "answered", "abandoned", "abandon_frame", "entries",
                     "expects_response", "is_error").rows() == [
        ("searchRequest", 5, False, True, 3, 1, True, False),
        ("abandonRequest", 6, False, False, None, 0, False, False),
        ("searchRequest", 7, False, False, None, 0, True, False)]
    assert tx["abandon_id"].to_list() == [None, 5, None]


def test_cancel_extended_operation():
    cancel = extended(ldap.CANCEL_OID, seq(integer(5)))
    r = row(msg(6, cancel))
    assert (r["op"], r["oid"], r["abandon_id"]) == ("extendedReq", "1.3.6.1.1.8", 5)
    assert row(msg(6, extended(ldap.CANCEL_OID, integer(5))))["decode_error"] == "unexpected tag"
    msgs = [msg(5, search("dc=big")), msg(6, cancel), msg(5, result(5, 118)), msg(6, extended_resp(0))]
    tx = tx_of(msgs, [True, True, False, False])
    assert tx.select("operation", "abandoned", "status", "is_error").rows() == [
        ("searchRequest", True, "canceled", True), ("extendedReq", False, "success", False)]


def test_cldap_and_tcp_flows_are_distinct():
    udp = message_set([msg(1, search("u"))], flows=[0], dport=389)
    tcp = message_set([msg(1, result(5, 0))], transport="tcp", flows=[0], from_client=[False], dport=389,
                      ts=[5 * S])
    tx = ldap.pair_transactions(ldap.decode_messages([udp, tcp]))
    assert tx["answered"].to_list() == [False]


def test_abandon_before_the_request_does_not_count():
    msgs = [msg(6, abandon(5)), msg(5, search("x")), msg(5, result(5, 0))]
    tx = tx_of(msgs, [True, True, False])
    assert tx.filter(pl.col("message_id") == 5)["abandoned"].to_list() == [False]


def test_not_errors_and_intermediate():
    msgs = [msg(1, compare("cn=a", "x", "y")), msg(1, result(15, 5)),
            msg(2, bind_sasl()), msg(2, result(1, 14)),
            msg(3, extended("1.3.6.1.4.1.4203.1.9.1.1")), msg(3, intermediate("1.2")), msg(3, intermediate("1.2")),
            msg(3, extended_resp(0)), msg(4, search()), msg(4, result(5, 10, "", "", tlv(0xA3, octets("ldap://r"))))]
    tx = tx_of(msgs, [True, False, True, False, True, False, False, False, True, False])
    assert tx.select("operation", "status", "is_error", "intermediates").rows() == [
        ("compareRequest", "compareFalse", False, 0), ("bindRequest", "saslBindInProgress", False, 0),
        ("extendedReq", "success", False, 2), ("searchRequest", "referral", False, 0)]
    assert tx["resource"].to_list()[2] == "1.3.6.1.4.1.4203.1.9.1.1"
    assert tx["auth"].to_list()[1] == "sasl" and tx["sasl_mechanism"].to_list()[1] == "GSS-SPNEGO"


def test_responses_without_request_and_opaque_rows_are_ignored():
    msgs = [msg(9, result(5, 0)), b"\x17\x03\x03\x00\x01x", msg(1, UNBIND)]
    tx = tx_of(msgs, [False, True, True])
    assert tx["operation"].to_list() == ["unbindRequest"]
    assert ldap.pair_transactions(decode(b"\x17\x03\x03\x00\x01x")).height == 0


def test_sasl_flag_in_transactions():
    s = message_set([sasl(krb5_wrap(msg(4, delete("cn=x")))), sasl(krb5_wrap(msg(4, result(11, 0))))],
                    from_client=[True, False], dport=389)
    tx = ldap.pair_transactions(ldap.decode_messages([s]))
    assert tx.select("operation", "status", "sasl").rows() == [("delRequest", "success", True)]


def test_values_too_big_for_their_column_are_null():
    r = row(msg(1, result(5, 51558482988)))  # resultCode is an int32 column
    assert r["result_code"] is None and r["op"] == "searchResDone"
