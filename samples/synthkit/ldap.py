"""LDAPv3 message encoders (RFC 4511 §4, ASN.1 in Appendix B)."""
from __future__ import annotations

from .der import (CLASS_APPLICATION, CLASS_CONTEXT, CONSTRUCTED, app, der_bool, der_enum, der_int,
                  der_octets, der_seq, der_set, tlv)

LDAP_VERSION = 3                # BindRequest version (RFC 4511 §4.2)
# protocolOp APPLICATION tags (RFC 4511 §4.2-§4.6)
OP_BIND_REQUEST = 0             # RFC 4511 §4.2
OP_BIND_RESPONSE = 1            # RFC 4511 §4.2.2
OP_UNBIND_REQUEST = 2           # RFC 4511 §4.3
OP_SEARCH_REQUEST = 3           # RFC 4511 §4.5.1
OP_SEARCH_RESULT_ENTRY = 4      # RFC 4511 §4.5.2
OP_SEARCH_RESULT_DONE = 5       # RFC 4511 §4.5.2
OP_MODIFY_REQUEST = 6           # RFC 4511 §4.6
OP_MODIFY_RESPONSE = 7          # RFC 4511 §4.6
AUTH_SIMPLE = 0                 # AuthenticationChoice simple [0] OCTET STRING (RFC 4511 §4.2)
SCOPE_BASE, SCOPE_ONE, SCOPE_SUBTREE = 0, 1, 2          # SearchRequest scope (RFC 4511 §4.5.1.2)
DEREF_NEVER = 0                 # derefAliases neverDerefAliases (RFC 4511 §4.5.1.3)
SEARCH_TIME_LIMIT_S = 120       # timeLimit the clients ask for (RFC 4511 §4.5.1.5)
MOD_ADD, MOD_DELETE, MOD_REPLACE = 0, 1, 2              # ModifyRequest operation (RFC 4511 §4.6)
RESULT_SUCCESS = 0              # resultCode (RFC 4511 §4.1.9)
# Filter CHOICE tags (RFC 4511 §4.5.1.7): and [0] / or [1] SET, equalityMatch [3] and substrings [4]
# SEQUENCE (constructed), present [7] primitive; SubstringFilter initial [0] primitive
FILTER_AND, FILTER_OR, FILTER_EQUALITY, FILTER_SUBSTRINGS, FILTER_PRESENT = 0, 1, 3, 4, 7
SUBSTRING_INITIAL = 0


def ldap_msg(msgid: int, op: bytes) -> bytes:
    """LDAPMessage (RFC 4511 §4.1.1) without controls."""
    return der_seq(der_int(msgid), op)


def ldap_result(app_tag: int, code: int = RESULT_SUCCESS, matched: str = "", diag: str = "") -> bytes:
    """LDAPResult (RFC 4511 §4.1.9) under the response's APPLICATION tag."""
    return app(app_tag, der_enum(code) + der_octets(matched) + der_octets(diag))


def ldap_bind_req(dn: str, password: str) -> bytes:
    return app(OP_BIND_REQUEST, der_int(LDAP_VERSION) + der_octets(dn)
               + tlv(CLASS_CONTEXT | AUTH_SIMPLE, password.encode()))


def ldap_search_req(base: str, scope: int, filt: bytes, attrs: list[str], size_limit=0) -> bytes:
    return app(OP_SEARCH_REQUEST, der_octets(base) + der_enum(scope) + der_enum(DEREF_NEVER)
               + der_int(size_limit) + der_int(SEARCH_TIME_LIMIT_S) + der_bool(False) + filt
               + der_seq(*(der_octets(a) for a in attrs)))


def ldap_search_entry(dn: str, attrs: list[tuple[str, list[bytes | str]]]) -> bytes:
    return app(OP_SEARCH_RESULT_ENTRY, der_octets(dn) + der_seq(*(
        der_seq(der_octets(t), der_set(*(der_octets(v) for v in vals))) for t, vals in attrs)))


def ldap_modify_req(dn: str, changes: list[tuple[int, str, list[str]]]) -> bytes:
    return app(OP_MODIFY_REQUEST, der_octets(dn) + der_seq(*(
        der_seq(der_enum(op), der_seq(der_octets(t), der_set(*(der_octets(v) for v in vals))))
        for op, t, vals in changes)))


LDAP_UNBIND = tlv(CLASS_APPLICATION | OP_UNBIND_REQUEST, b"")      # UnbindRequest ::= [APPLICATION 2] NULL


def f_and(*fs: bytes) -> bytes:
    return tlv(CLASS_CONTEXT | CONSTRUCTED | FILTER_AND, b"".join(fs))


def f_or(*fs: bytes) -> bytes:
    return tlv(CLASS_CONTEXT | CONSTRUCTED | FILTER_OR, b"".join(fs))


def f_eq(attr: str, value: str) -> bytes:
    return tlv(CLASS_CONTEXT | CONSTRUCTED | FILTER_EQUALITY, der_octets(attr) + der_octets(value))


def f_present(attr: str) -> bytes:
    return tlv(CLASS_CONTEXT | FILTER_PRESENT, attr.encode())


def f_substr(attr: str, initial: str) -> bytes:
    return tlv(CLASS_CONTEXT | CONSTRUCTED | FILTER_SUBSTRINGS,
               der_octets(attr) + der_seq(tlv(CLASS_CONTEXT | SUBSTRING_INITIAL, initial.encode())))
