"""LDAP v3 (RFC 4511) and CLDAP messages and operations.

Transport: TCP ports 389 and 3268 (the Global Catalog), framed by ``analyzer.tcp.tcp_messages(cap,
"ber", {389, 3268})``: one framed message is one LDAPMessage TLV, one SASL buffer (RFC 4422 §3.7: a
4-octet length, then the security layer's output) or one TLS record; and UDP port 389 (CLDAP,
RFC 1798 / MS-ADTS 6.3.3), where a datagram may hold several LDAPMessages (Active Directory answers a
netlogon ping with searchResEntry and searchResDone in one datagram).

A row of ``ldap_messages`` is one LDAPMessage, or one framed message that holds no readable
LDAPMessage (``opaque`` says why: ``tls``, ``sasl`` for a security layer herdscope cannot open,
``sasl-sealed`` for a GSS-API token with confidentiality), or one that failed to decode
(``decode_error``). SASL buffers of GSS-API Kerberos with integrity only (RFC 4121 §4.2.6.2 wrap
tokens without the Sealed flag; RFC 1964 §1.2.2 tokens with SEAL_ALG none, what Active Directory
sends for "sign" without "seal") are opened: the LDAPMessages inside (often several per buffer) get
rows with ``sasl`` True. ``unit`` numbers the rows of one framed message.

Fields (RFC 4511 §4): messageID, protocolOp, controls (OIDs), bind name, version and authentication
choice (simple, SASL with its mechanism, and Microsoft's sicily choices), the search request
(baseObject, scope, derefAliases, sizeLimit, timeLimit, typesOnly, the filter rendered as RFC 4515
text, the attribute selection), the DN of entries and of every write, LDAPResult (resultCode,
matchedDN, diagnosticMessage, referral URIs), abandon's messageID, the OIDs of extended and
intermediate operations. Passwords and SASL credentials are not kept, only their length.

The filter renderer follows RFC 4515 §3: values escape ``NUL ( ) * \\`` as ``\\NN`` (lower-case hex,
as Zeek); non-printable bytes and bytes that are not well-formed UTF-8 are escaped the same way;
well-formed UTF-8 is kept. Attribute names get the same escaping (RFC 4515 has none for them: it
only matters for hostile input). The text follows the structure on the wire: an AND of three
filters is ``(&(a)(b)(c))`` (Wireshark and Zeek fold it into ``(&(&(a)(b))(c))``). Nesting is
capped at :data:`MAX_FILTER_DEPTH` (``too deep``); the renderer keeps its own stack, no recursion.

Transactions (``pair_transactions``): one row per request (bind, unbind, search, modify, add,
delete, modDN, compare, abandon, extended) on its connection (TCP) or 4-tuple (CLDAP), paired with
the response carrying the same messageID (RFC 4511 §4.1.1.1: unique among outstanding requests)
that comes after it; searchResEntry/searchResRef are counted and the time to the first one kept;
intermediateResponse does not end an operation. unbind and abandon have no response by design
(``expects_response`` False: not answered, not an error). An operation named by a later
abandonRequest (or by the Cancel extended operation, RFC 3909) is ``abandoned``. There is no
response timeout: persistent and paged searches legitimately run for minutes or hours.
``is_error``: resultCode other than success (0), compareFalse (5), compareTrue (6), referral (10)
and saslBindInProgress (14), which report outcomes rather than failures (RFC 4511 §4.1.9, A.1).

Replication: the ``ldap_sync`` frame (:mod:`analyzer.decoders.ldap_sync`) keeps what content
synchronisation needs from the same LDAPMessages (RFC 4533 controls and Sync Info, entryCSN /
entryUUID, attribute value digests of entries and writes, Active Directory CNF DNs); its builder is
here with the other LDAP frames'. :func:`units` (pass 1, :mod:`.ldap_message_units`) is shared by both
frames.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..capture import frame_builder
from ..messages import FRAMING_BATCH_BYTES, KEPT_COLUMNS, MessageSet, message_set_batches, protocol_message_sets
from ..wide_frames import concat_in_order
from ..schema import FRAMES, Column, column, empty_frame, polars_type
from .protocol import Protocol
from . import ber, kerberos_ap_tokens
from . import ldap_sync
from .common import TRANSACTION_COMMON, named_codes
from .ldap_filter import MAX_FILTER_DEPTH  # noqa: F401  (public here too)
from .ldap_layout import (  # noqa: F401  (the field layout; the kernels load with the first message)
    I_ABANDON_ID, I_ATTR_COUNT, I_AUTH, I_CRED_LEN, I_DELETE_OLD_RDN, I_DEREF,
    I_MSGID, I_OP, I_OPAQUE, I_RESULT, I_SASL, I_SCOPE,
    I_SIZE_LIMIT, I_STATUS, I_TIME_LIMIT, I_TYPES_ONLY, I_UNIT, I_VERSION,
    N_INTS, N_STRS)
from .ldap_message_units import units  # noqa: F401  (public here too)

PROTOCOL = Protocol(
    name="ldap", title="LDAP", spec="RFC 4511", udp_ports=(389,), tcp_ports=(389, 3268),
    tcp_framing="ber",  # RFC 4511 §5.1: one BER LDAPMessage after another
    frames=("ldap_messages", "ldap_transactions", "ldap_sync"), transactions="ldap_transactions",
    setup_operations=("bindRequest", "unbindRequest", "abandonRequest"), setup_words="bind",  # RFC 4511 §4.2, §4.3, §4.11
    requests_noun="LDAP requests", work_noun="LDAP operations",
    services={389: "ldap", 636: "ldaps", 3268: "ldap-gc", 3269: "ldaps-gc"},
    operation_words={"searchRequest": "search"},
)

# RFC 4511 §4.2 - §4.14 and Appendix B: protocolOp [APPLICATION n] -> name (the ASN.1 identifiers,
# as tshark's ldap.protocolOp shows them)
# RFC 4511 §4.2 - §4.14
OPERATIONS = {
    0: "bindRequest", 1: "bindResponse", 2: "unbindRequest", 3: "searchRequest", 4: "searchResEntry",
    5: "searchResDone", 6: "modifyRequest", 7: "modifyResponse", 8: "addRequest", 9: "addResponse",
    10: "delRequest", 11: "delResponse", 12: "modDNRequest", 13: "modDNResponse", 14: "compareRequest",
    15: "compareResponse", 16: "abandonRequest", 19: "searchResRef", 23: "extendedReq",
    24: "extendedResp", 25: "intermediateResponse",
}
OPERATION_ENUM = pl.Enum(list(OPERATIONS.values()))
REQUEST_OPS = (0, 2, 3, 6, 8, 10, 12, 14, 16, 23)
FINAL_RESPONSE_OPS = {1: 0, 5: 3, 7: 6, 9: 8, 11: 10, 13: 12, 15: 14, 24: 23}  # response -> request
NO_RESPONSE_OPS = (2, 16)  # unbind, abandon

# RFC 4511 §4.1.9 and Appendix A (names as in the ASN.1), with the IANA LDAP result-code registry
# entries seen from Active Directory and OpenLDAP (RFC 3909 cancel, RFC 4533 sync, RFC 6171 ...)
# RFC 4511 §4.1.9
RESULT_CODES = {
    0: "success", 1: "operationsError", 2: "protocolError", 3: "timeLimitExceeded", 4: "sizeLimitExceeded",
    5: "compareFalse", 6: "compareTrue", 7: "authMethodNotSupported", 8: "strongerAuthRequired",
    10: "referral", 11: "adminLimitExceeded", 12: "unavailableCriticalExtension",
    13: "confidentialityRequired", 14: "saslBindInProgress", 16: "noSuchAttribute",
    17: "undefinedAttributeType", 18: "inappropriateMatching", 19: "constraintViolation",
    20: "attributeOrValueExists", 21: "invalidAttributeSyntax", 32: "noSuchObject", 33: "aliasProblem",
    34: "invalidDNSyntax", 36: "aliasDereferencingProblem", 48: "inappropriateAuthentication",
    49: "invalidCredentials", 50: "insufficientAccessRights", 51: "busy", 52: "unavailable",
    53: "unwillingToPerform", 54: "loopDetect", 64: "namingViolation", 65: "objectClassViolation",
    66: "notAllowedOnNonLeaf", 67: "notAllowedOnRDN", 68: "entryAlreadyExists",
    69: "objectClassModsProhibited", 71: "affectsMultipleDSAs", 80: "other",
    118: "canceled", 119: "noSuchOperation", 120: "tooLate", 121: "cannotCancel",
    122: "assertionFailed", 123: "authorizationDenied", 4096: "e-syncRefreshRequired",
}
NOT_ERRORS = (0, 5, 6, 10, 14)

# RFC 4511 §4.5.1.2 / §4.5.1.3
SCOPES = {0: "baseObject", 1: "singleLevel", 2: "wholeSubtree", 3: "subordinateSubtree"}
DEREF = {0: "neverDerefAliases", 1: "derefInSearching", 2: "derefFindingBaseObj", 3: "derefAlways"}
# RFC 4511 §4.2 AuthenticationChoice; 9-11: MS-ADTS 5.1.1.1.3 (sicily)
AUTH_CHOICES = {0: "simple", 3: "sasl", 9: "sicilyPackageDiscovery", 10: "sicilyNegotiate",
                11: "sicilyResponse"}
# RFC 4511 §4.6
MODIFY_OPS = {0: "add", 1: "delete", 2: "replace", 3: "increment"}
CANCEL_OID = "1.3.6.1.1.8"  # RFC 3909
STARTTLS_OID = "1.3.6.1.4.1.1466.20037"  # RFC 4511 §4.14.1

OPAQUE_REASONS = {1: "tls", 2: "sasl", 3: "sasl-sealed"}
OPAQUE_ENUM = pl.Enum(list(OPAQUE_REASONS.values()))

# --- columns -------------------------------------------------------------------------------------

MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + (
    column("unit", np.uint32, "index of this row among the rows of its framed message (several LDAPMessages "
         "in one SASL buffer or CLDAP datagram)"),
    column("sasl", np.bool_, "carried in a SASL buffer (RFC 4422 §3.7) whose integrity-only GSS-API token was "
         "opened"),
    column("opaque", object, "why the framed message has no readable LDAPMessage: tls (a TLS record, "
         "RFC 8446 §5.1, after StartTLS or on LDAPS), sasl (a SASL security layer herdscope cannot open), "
         "sasl-sealed (GSS-API wrap token with confidentiality); null otherwise", polars=OPAQUE_ENUM),
    column("message_id", np.int64, "messageID (RFC 4511 §4.1.1.1); tshark ldap.messageID"),
    column("op_code", np.uint8, "protocolOp [APPLICATION n] number (§4.2 - §4.14); tshark ldap.protocolOp"),
    column("op", object, "protocolOp by name (bindRequest, searchResEntry ...)", polars=OPERATION_ENUM),
    column("dn", object, "the operation's DN (§4.1.3): bind name (§4.2), search baseObject (§4.5.1.1), entry "
         "objectName (§4.5.2), modify object (§4.6), add/del/modDN/compare entry (§4.7-§4.10); tshark "
         "ldap.name / baseObject / objectName / object / entry / delRequest", polars=pl.String),
    column("version", np.int32, "bindRequest version (§4.2)"),
    column("auth", object, "bindRequest authentication choice: simple, sasl, sicily* (§4.2; MS-ADTS 5.1.1.1.3)",
         polars=pl.String),
    column("sasl_mechanism", object, "SaslCredentials mechanism (§4.2), e.g. GSS-SPNEGO, GSSAPI, NTLM, "
         "EXTERNAL; tshark ldap.mechanism", polars=pl.String),
    column("credentials_len", np.int64, "bytes of the simple password or of the SASL credentials (the "
         "credentials themselves are not kept; 0 with an empty DN = anonymous bind, §4.2)"),
    column("scope", object, "searchRequest scope (§4.5.1.2)", polars=pl.String),
    column("deref_aliases", object, "searchRequest derefAliases (§4.5.1.3)", polars=pl.String),
    column("size_limit", np.int64, "searchRequest sizeLimit (§4.5.1.4), 0 = none"),
    column("time_limit", np.int64, "searchRequest timeLimit in seconds (§4.5.1.5), 0 = none"),
    column("types_only", np.bool_, "searchRequest typesOnly (§4.5.1.6)"),
    column("filter", object, "searchRequest filter as RFC 4515 text (§4.5.1.7)", polars=pl.String),
    column("attributes", object, "attribute descriptions, comma-separated: searchRequest selection (§4.5.1.8), "
         "addRequest attribute types (§4.7), compareRequest attribute (§4.10)", polars=pl.String),
    column("attribute_count", np.int64, "number of those attributes; for a searchResEntry its attributes (§4.5.2)"),
    column("changes", object, "modifyRequest changes as operation(attribute), comma-separated (§4.6; values "
         "not kept)", polars=pl.String),
    column("new_rdn", object, "modDNRequest newrdn (§4.9)", polars=pl.String),
    column("delete_old_rdn", np.bool_, "modDNRequest deleteoldrdn (§4.9)"),
    column("new_superior", object, "modDNRequest newSuperior (§4.9)", polars=pl.String),
    column("abandon_id", np.int64, "abandonRequest: the messageID abandoned (§4.11); Cancel extendedReq "
         "(1.3.6.1.1.8): its cancelID (RFC 3909 §2)"),
    column("oid", object, "extendedReq requestName, extendedResp / intermediateResponse responseName "
         "(§4.12, §4.13)", polars=pl.String),
    column("result_code", np.int32, "LDAPResult resultCode (§4.1.9); tshark ldap.resultCode"),
    column("result", object, "resultCode by name (RFC 4511 Appendix A)", polars=pl.String),
    column("matched_dn", object, "LDAPResult matchedDN (§4.1.9)", polars=pl.String),
    column("diagnostic_message", object, "LDAPResult diagnosticMessage (§4.1.9)", polars=pl.String),
    column("referrals", object, "LDAPResult referral URIs or searchResRef URIs, space-separated (§4.1.10, "
         "§4.5.3)", polars=pl.String),
    column("controls", object, "controlType OIDs of the message's controls, comma-separated (§4.1.11)",
         polars=pl.String),
    column("decode_error", object, "null when the LDAPMessage decoded; else why not (truncated, bad length, "
         "unexpected tag, too deep, indefinite length ...); fields read before the problem are kept",
         polars=pl.String),
)

TRANSACTION_COLUMNS: tuple[Column, ...] = TRANSACTION_COMMON + (
    column("message_id", np.int64, "messageID of the request"),
    column("dn", object, "the request's DN (bind name, search base, target of a write)", polars=pl.String),
    column("auth", object, "bind: authentication choice", polars=pl.String),
    column("sasl_mechanism", object, "bind: SASL mechanism", polars=pl.String),
    column("scope", object, "search scope", polars=pl.String),
    column("deref_aliases", object, "search derefAliases", polars=pl.String),
    column("filter", object, "search filter (RFC 4515)", polars=pl.String),
    column("attributes", object, "requested attributes", polars=pl.String),
    column("oid", object, "extended operation OID", polars=pl.String),
    column("abandon_id", np.int64, "abandonRequest / Cancel: the messageID it abandons"),
    column("expects_response", np.bool_, "False for unbind and abandon, which have no response (§4.3, §4.11)"),
    column("entries", np.uint32, "search: searchResEntry messages"),
    column("references", np.uint32, "search: searchResRef messages"),
    column("intermediates", np.uint32, "intermediateResponse messages"),
    column("first_entry_ns", np.int64, "search: time from the request to the first entry or reference"),
    column("result_code", np.int32, "final response resultCode"),
    column("matched_dn", object, "final response matchedDN", polars=pl.String),
    column("diagnostic_message", object, "final response diagnosticMessage", polars=pl.String),
    column("abandoned", np.bool_, "a later abandonRequest (or Cancel extended request) on the connection named "
         "this messageID"),
    column("abandon_frame", np.uint32, "frame of that abandon/cancel request"),
    column("sasl", np.bool_, "the request travelled inside a SASL security layer"),
)

FRAMES.setdefault("ldap_messages", MESSAGE_COLUMNS)  # descriptions for ``herdscope export``
FRAMES.setdefault("ldap_transactions", TRANSACTION_COLUMNS)


@dataclass(frozen=True)
class Params:
    pass  # pairing needs no window: messageIDs identify outstanding requests (RFC 4511 §4.1.1.1)


# --- Python side ------------------------------------------------------------------------------------

def _kernel(ms: MessageSet, set_units=None):
    from .ldap_kernels import decode_all  # lazy: Numba kernels, only with LDAP messages

    u_start, u_end, u_kind, u_msg, u_index = units(ms) if set_units is None else set_units
    total = u_start.shape[0]
    ints = np.empty((N_INTS, total), np.int64)
    spans = np.empty((2 * N_STRS, total), np.int64)
    size = int((u_end - u_start).sum()) * 2 + 64 * total + 1024
    while True:  # strings need at most ~4x their bytes (escapes); grow on the rare overflow
        arena = np.empty(size, np.uint8)
        used = decode_all(ms.buf, u_start, u_end, u_kind, u_index, ints, spans, arena)
        if used >= 0:
            break
        size *= 2
    return u_msg, ints, spans, arena[:used]


_STR_NAMES = ("dn", "sasl_mechanism", "filter", "attributes", "changes", "new_rdn", "new_superior", "oid",
              "matched_dn", "diagnostic_message", "referrals", "controls")
_INT_COLUMNS = {  # column -> (field, dtype)
    "unit": (I_UNIT, pl.UInt32), "sasl": (I_SASL, pl.Boolean), "message_id": (I_MSGID, pl.Int64),
    "version": (I_VERSION, pl.Int32), "credentials_len": (I_CRED_LEN, pl.Int64),
    "size_limit": (I_SIZE_LIMIT, pl.Int64), "time_limit": (I_TIME_LIMIT, pl.Int64),
    "types_only": (I_TYPES_ONLY, pl.Boolean), "attribute_count": (I_ATTR_COUNT, pl.Int64),
    "delete_old_rdn": (I_DELETE_OLD_RDN, pl.Boolean), "abandon_id": (I_ABANDON_ID, pl.Int64),
    "result_code": (I_RESULT, pl.Int32),
}
_NAMED_COLUMNS = {  # column -> (field, names)
    "opaque": (I_OPAQUE, OPAQUE_REASONS, OPAQUE_ENUM), "op": (I_OP, OPERATIONS, OPERATION_ENUM),
    "auth": (I_AUTH, AUTH_CHOICES, pl.String), "scope": (I_SCOPE, SCOPES, pl.String),
    "deref_aliases": (I_DEREF, DEREF, pl.String),
}


def decode_messages(sets: list[MessageSet], set_units=None) -> pl.DataFrame:
    """LDAP message sets (BER-framed TCP messages, CLDAP datagrams) → ldap_messages, one row per
    LDAPMessage (or per opaque / undecodable framed message), in time order. ``set_units``: each set's
    :func:`units`, when the caller has them (the builder shares them with ``ldap_sync``)."""
    if set_units is None:
        set_units = [None] * len(sets)
    pairs = [(ms, u) for ms, u in zip(sets, set_units) if ms.height]
    if not pairs:
        return empty_frame(MESSAGE_COLUMNS)
    sets = [ms for ms, _ in pairs]
    base, ints, spans, arena = ber.stack_sets(sets, [_kernel(ms, u) for ms, u in pairs])
    decoded = pl.DataFrame([
        *[ber.int_column(name, ints[k], dtype) for name, (k, dtype) in _INT_COLUMNS.items()],
        ber.int_column("op_code", ints[I_OP], pl.UInt8),
        *[ber.int_column(name, ints[k], pl.Int64).replace_strict(names, default=None, return_dtype=dtype)
          for name, (k, names, dtype) in _NAMED_COLUMNS.items()],
        *ber.string_columns(_STR_NAMES, arena, spans),
        ber.status_column("decode_error", ints[I_STATUS]),
    ])
    decoded = decoded.with_columns(
        pl.col("result_code").cast(pl.Int64).replace_strict(RESULT_CODES, default=None, return_dtype=pl.String)
        .fill_null(pl.format("resultCode{}", pl.col("result_code"))).alias("result"))
    return pl.concat([base, decoded], how="horizontal").select([c.name for c in MESSAGE_COLUMNS])


# --- transactions -------------------------------------------------------------------------------------

_REQUEST_COLUMNS = ("transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "sasl",
                    "message_id", "op_code", "op", "dn", "auth", "sasl_mechanism", "scope", "deref_aliases",
                    "filter", "attributes", "oid", "abandon_id")  # what a transaction keeps of its request
_RESPONSE_COLUMNS = ("transport", "flow", "message_id", "ts_last_ns", "frame_last", "op_code", "result_code",
                     "result", "matched_dn", "diagnostic_message")  # and of its responses


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """ldap_messages → ldap_transactions (rules in the module docstring)."""
    m = messages.filter(pl.col("op_code").is_not_null() & pl.col("message_id").is_not_null()) \
        .with_row_index("_row")
    # only the columns each side reads are filtered and sorted (not every message column)
    req = m.filter(pl.col("op_code").is_in(list(REQUEST_OPS))).select("_row", *_REQUEST_COLUMNS) \
        .sort("ts_last_ns", "_row")
    if req.height == 0:
        return empty_frame(TRANSACTION_COLUMNS)
    req = req.with_row_index("_req")
    resp = m.filter(~pl.col("op_code").is_in(list(REQUEST_OPS))).select("_row", *_RESPONSE_COLUMNS)
    # CLDAP flow ids and TCP connection ids are separate numberings: key by transport too
    key = ["_transport", "flow", "message_id"]
    req = req.with_columns(pl.col("transport").cast(pl.String).alias("_transport"))
    resp = resp.with_columns(pl.col("transport").cast(pl.String).alias("_transport"))
    right = req.select(*key, "_req", pl.col("ts_last_ns").alias("_req_ts")).sort("_req_ts")
    paired = resp.sort("ts_last_ns").join_asof(
        right, left_on="ts_last_ns", right_on="_req_ts", by=key, strategy="backward",
        check_sortedness=False).filter(pl.col("_req").is_not_null())
    final_ops = list(FINAL_RESPONSE_OPS)
    finals = paired.filter(pl.col("op_code").is_in(final_ops)).sort("ts_last_ns", "_row") \
        .group_by("_req", maintain_order=True).first().select(
            "_req", pl.col("frame_last").alias("response_frame"), pl.col("ts_last_ns").alias("response_ts_ns"),
            "result_code", pl.col("result").alias("_result"), "matched_dn", "diagnostic_message")
    interim = paired.group_by("_req").agg(
        (pl.col("op_code") == 4).sum().cast(pl.UInt32).alias("entries"),
        (pl.col("op_code") == 19).sum().cast(pl.UInt32).alias("references"),
        (pl.col("op_code") == 25).sum().cast(pl.UInt32).alias("intermediates"),
        pl.col("ts_last_ns").filter(pl.col("op_code").is_in([4, 19])).min().alias("_first_entry_ts"),
    )
    # abandon (§4.11) and Cancel (RFC 3909): both carry the messageID they name in abandon_id
    abandons = req.filter(pl.col("abandon_id").is_not_null()).select(
        "_transport", "flow", pl.col("abandon_id").alias("message_id"), pl.col("ts_last_ns").alias("_ab_ts"),
        pl.col("frame_last").alias("abandon_frame"))
    tx = req.select("_req", "_transport", "transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "sasl",
                    "message_id", "op_code", "op", "dn", "auth", "sasl_mechanism", "scope", "deref_aliases", "filter",
                    "attributes", "oid", "abandon_id") \
        .join(finals, on="_req", how="left", maintain_order="left") \
        .join(interim, on="_req", how="left", maintain_order="left")
    if abandons.height:
        ab = tx.select("_req", *key, "ts_last_ns").join(abandons, on=key) \
            .filter(pl.col("_ab_ts") >= pl.col("ts_last_ns")).sort("_ab_ts").group_by("_req").first() \
            .select("_req", "abandon_frame")
        tx = tx.join(ab, on="_req", how="left", maintain_order="left")
    else:
        tx = tx.with_columns(pl.lit(None, pl.UInt32).alias("abandon_frame"))
    expects = ~pl.col("op_code").is_in(list(NO_RESPONSE_OPS))
    resource = pl.when(pl.col("op_code") == 23).then(pl.col("oid")).otherwise(pl.col("dn"))
    tx = tx.with_columns(
        pl.lit("ldap").alias("protocol"),
        pl.col("src").alias("client"), pl.col("sport").alias("client_port"),
        pl.col("dst").alias("server"), pl.col("dport").alias("server_port"),
        pl.col("op").cast(pl.String).alias("operation"),
        resource.alias("resource"),
        pl.col("frame_last").alias("request_frame"), pl.col("ts_last_ns").alias("request_ts_ns"),
        (pl.col("response_ts_ns") - pl.col("ts_last_ns")).alias("latency_ns"),
        pl.col("_result").alias("status"),
        (pl.col("response_frame").is_not_null() & ~pl.col("result_code").is_in(list(NOT_ERRORS)))
        .fill_null(False).alias("is_error"),
        pl.col("response_frame").is_not_null().alias("answered"),
        expects.alias("expects_response"),
        pl.col("entries").fill_null(0), pl.col("references").fill_null(0), pl.col("intermediates").fill_null(0),
        (pl.col("_first_entry_ts") - pl.col("ts_last_ns")).alias("first_entry_ns"),
        pl.col("abandon_frame").is_not_null().alias("abandoned"),
    )
    return tx.sort("request_ts_ns", "request_frame").select(
        [pl.col(c.name).cast(polars_type(c)) if c.name not in ("client", "server", "transport")
         else pl.col(c.name) for c in TRANSACTION_COLUMNS])


# --- frames ---------------------------------------------------------------------------------------------

def message_sets(cap) -> list[MessageSet]:
    """LDAP message sets of a capture: CLDAP (UDP/389) and TCP/389, 3268 (BER-framed)."""
    return protocol_message_sets(cap, PROTOCOL)


@frame_builder("ldap_messages")
def _build_messages(cap) -> pl.DataFrame:
    """Decoded a batch of connections at a time (CLDAP with the first; :data:`FRAMING_BATCH_BYTES`,
    ``analyzer.messages.message_set_batches``), each batch's copied bytes dropped before the next.
    ldap_sync reads the same LDAPMessages, so one framing and one pass 1 give both frames, and
    kerberos_ap's tokens are gathered on the way (not framed again). Both frames are in time order
    with equal times in set order, so the batches' rows sorted again (stably) are those of the whole."""
    sync = "ldap_sync" not in cap.built_frames()
    frames, syncs, tokens = [], [], []
    for sets in message_set_batches(cap, PROTOCOL, FRAMING_BATCH_BYTES):
        sets = [ms for ms in sets if ms.height]
        set_units = [units(ms) for ms in sets]
        if sync:
            syncs.append(ldap_sync.decode_sync(sets, set_units))
        frame = decode_messages(sets, set_units)
        found = kerberos_ap_tokens.carried("ldap_messages", sets, frame)
        tokens = None if found is None else tokens + found
        frames.append(frame)
        del sets, set_units  # this batch's copies, before the generator frames the next
    kerberos_ap_tokens.keep(cap, "ldap_messages", tokens)
    if sync:  # a batch without rows gives a frame of the schema's types, not the capture's
        cap.set_frame("ldap_sync", concat_in_order([f for f in syncs if f.height], ("ts_ns", "frame"),
                                                   empty_frame(ldap_sync.SYNC_COLUMNS)))
    return concat_in_order([f for f in frames if f.height], ("ts_last_ns", "frame_last"), empty_frame(MESSAGE_COLUMNS))


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a request counts as unanswered), from the code tables:
    ``herdscope stats --help`` and the README (analyzer.stats.outcome_rules)."""
    no_reply = [OPERATIONS[c] for c in NO_RESPONSE_OPS]
    return (f"a resultCode other than {named_codes(RESULT_CODES, NOT_ERRORS)}: noSuchObject, "
            f"invalidCredentials, busy and the rest are errors.",
            f"no response with the request's messageID on its connection before the capture ends (no time "
            f"limit: persistent and paged searches run for hours); {' and '.join(no_reply)} expect no response "
            f"and are not counted.")


@frame_builder("ldap_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    return pair_transactions(cap.frame("ldap_messages"))


@frame_builder("ldap_sync")
def _build_sync(cap) -> pl.DataFrame:
    """RFC 4533 content synchronisation and replicated entry states (:mod:`.ldap_sync`); built with
    ``ldap_messages`` (its builder), or on its own when that frame came from elsewhere."""
    built = cap.built_frames()
    if "ldap_sync" in built:
        return built["ldap_sync"]
    if "ldap_messages" in built:
        return ldap_sync.decode_sync(message_sets(cap))
    cap.frame("ldap_messages")
    return cap.built_frames()["ldap_sync"]
