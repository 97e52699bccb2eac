"""Kerberos V5 (RFC 4120) messages and KDC transactions.

Messages: AS-REQ/TGS-REQ ([APPLICATION 10]/[12], KDC-REQ §5.4.1), AS-REP/TGS-REP ([11]/[13], KDC-REP
§5.4.2), KRB-ERROR ([30], §5.9.1) and AP-REQ ([14], §5.5.1) both alone and inside the PA-TGS-REQ
padata of a TGS-REQ; AP-REP, KRB-SAFE, KRB-PRIV and KRB-CRED are recognised (pvno, msg-type).
Encrypted parts stay opaque: only their etype and kvno are read (EncryptedData §5.2.9).
``request_digest`` hashes each message's bytes (FNV-1a 64), so identical messages (a replayed
TGS-REQ, the KDC's lookaside answer to it) are equal keys.

The ``kerberos_ap`` frame (:mod:`.kerberos_ap`) is declared here too: the AP-REQ / AP-REP /
KRB-ERROR messages inside TGS-REQs, SMB2 SESSION_SETUP security buffers, LDAP SASL binds and HTTP
Negotiate tokens (GSS-API / SPNEGO framing in :mod:`.gssapi`), with MIT's replay-cache tag. Its
builder is in that module; this one registers its ``kdc`` carrier (the TGS-REQs' PA-TGS-REQ).

Transport: UDP port 88, one message per datagram (IP-fragmented datagrams reassembled by
``analyzer.messages``); TCP port 88 with the 4-byte record mark of §7.2.2, which
``analyzer.tcp.tcp_messages(cap, "record_mark", {88})`` strips: every message handed here starts at
the [APPLICATION n] tag.

Transactions (``pair_transactions``): one row per AS-REQ/TGS-REQ. Rules:

- A KRB-ERROR carries no nonce: it answers the latest request before it on the same flow (UDP
  4-tuple / TCP connection) that is still unanswered. A KDC-REP carries its nonce only inside the
  encrypted EncKDCRepPart (§5.4.2), so it is paired the same way, restricted to requests of its
  kind (AS-REP answers AS-REQ). Requests older than ``Params.timeout_ns`` are not candidates. A
  response that finds only answered requests counts as an ``extra_responses`` of the latest one.
  The request nonce marks UDP retries (``retransmission``: same flow and nonce as an earlier one).
- ``login``: AS-REQs of one client address, cname and realm (realm compared case-insensitively)
  form one login when each one but the last was answered by KDC_ERR_PREAUTH_REQUIRED (25) and the
  next carries pre-authentication padata (``preauth``), or by KRB_ERR_RESPONSE_TOO_BIG (52) and the
  next goes over TCP (§7.2.1), and the next is sent within ``Params.login_window_ns`` of that
  error. TGS-REQs are grouped the same way (same client address and sname, RESPONSE_TOO_BIG → TCP).
  ``login`` numbers those groups (dense, per transaction frame); ``login_step`` counts from 1.
- ``is_error``: the reply is a KRB-ERROR, except the PREAUTH_REQUIRED / RESPONSE_TOO_BIG step of a
  login that went on with a next request: that step is the protocol working as designed (RFC 4120
  §3.1.1, §7.2.1), so only a login's last step can count as a failure. A PREAUTH_REQUIRED nobody
  followed up (user enumeration, AS-REP roasting probes, a cancelled prompt) stays an error.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..jit import njit
from ..capture import frame_builder
from ..messages import KEPT_COLUMNS, MessageSet, protocol_message_sets
from ..schema import FRAMES, Column, column, empty_frame, polars_type
from .protocol import Protocol
from . import ber, kerberos_ap_tokens
from .common import TRANSACTION_COMMON, named_codes, unbroken_duration
from .kerberos_ap import carrier_source, register_token_source
from .kerberos_ap_carriers import kdc_tokens
from .kerberos_codes import (  # noqa: F401  (public here too)
    ERROR_CODES, KDC_ERR_PREAUTH_REQUIRED, KRB_ERR_RESPONSE_TOO_BIG)
from .kerberos_layout import (  # noqa: F401  (the field layout; the kernels load with the first message)
    I_APP, I_CTIME, I_ENC_ETYPE, I_ENC_KVNO, I_ERROR_CODE, I_KDC_OPTIONS,
    I_MSG_TYPE, I_NONCE, I_PREAUTH, I_PREAUTH_ETYPE, I_PVNO, I_STATUS,
    I_STIME, I_TICKET_ETYPE, I_TICKET_KVNO, I_TILL, N_INTS, N_STRS,
    STR_NAMES)

PROTOCOL = Protocol(
    name="kerberos", title="Kerberos", spec="RFC 4120", udp_ports=(88,), tcp_ports=(88,),
    tcp_framing="record_mark",  # RFC 4120 §7.2.2: a 4-octet record mark
    frames=("kerberos_messages", "kerberos_transactions", "kerberos_ap"), transactions="kerberos_transactions",
    requests_noun="Kerberos requests", services={88: "kerberos", 464: "kpasswd", 749: "kerberos-adm"},
    plural_operations=("AS-REQ", "TGS-REQ"),
)

# RFC 4120 §7.5.7 (msg-type values; §5.10: the [APPLICATION n] tag of each message is the same n)
MESSAGE_TYPES = {
    10: "AS-REQ", 11: "AS-REP", 12: "TGS-REQ", 13: "TGS-REP", 14: "AP-REQ", 15: "AP-REP",
    16: "KRB-RESERVED16", 17: "KRB-RESERVED17", 20: "KRB-SAFE", 21: "KRB-PRIV", 22: "KRB-CRED",
    30: "KRB-ERROR",
}
MESSAGE_ENUM = pl.Enum(list(dict.fromkeys(MESSAGE_TYPES.values())))
# ERROR_CODES (RFC 4120 §7.5.9), KDC_ERR_PREAUTH_REQUIRED, KRB_ERR_RESPONSE_TOO_BIG: in kerberos_codes

# RFC 4120 §7.5.2, RFC 6113 §7.2, RFC 4556 §3.1.3, MS-KILE 2.2: PA-DATA types that carry
# pre-authentication (what a client sends after KDC_ERR_PREAUTH_REQUIRED)
PREAUTH_PADATA = {2: "PA-ENC-TIMESTAMP", 14: "PA-PK-AS-REQ_OLD", 16: "PA-PK-AS-REQ",
                  136: "PA-FX-FAST", 138: "PA-ENCRYPTED-CHALLENGE"}

# --- columns -------------------------------------------------------------------------------------

MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + (
    column("message", object, "message kind from the [APPLICATION n] tag (RFC 4120 §5.10): AS-REQ, AS-REP, "
         "TGS-REQ, TGS-REP, AP-REQ, AP-REP, KRB-SAFE, KRB-PRIV, KRB-CRED, KRB-ERROR", polars=MESSAGE_ENUM),
    column("msg_type", np.int32, "msg-type field (RFC 4120 §5.4.1, §7.5.7); tshark kerberos.msg_type"),
    column("pvno", np.int32, "protocol version number, 5 (RFC 4120 §5.4.1)"),
    column("realm", object, "realm field: KDC-REQ-BODY realm (§5.4.1; the client's realm in an AS-REQ), the "
         "issued ticket's realm in a KDC-REP (§5.3), the service realm of a KRB-ERROR (§5.9.1), the "
         "ticket realm of an AP-REQ; tshark kerberos.realm (first occurrence)", polars=pl.String),
    column("crealm", object, "client realm of a KDC-REP or KRB-ERROR (§5.4.2, §5.9.1)", polars=pl.String),
    column("cname", object, "client name-string components joined with '/' (§5.2.2 PrincipalName): KDC-REQ-BODY "
         "cname, KDC-REP cname, KRB-ERROR cname; tshark kerberos.CNameString", polars=pl.String),
    column("sname", object, "service name-string joined with '/': KDC-REQ-BODY sname, the issued ticket's sname "
         "in a KDC-REP, KRB-ERROR sname, the ticket's sname in an AP-REQ; tshark kerberos.SNameString",
         polars=pl.String),
    column("nonce", np.int64, "KDC-REQ-BODY nonce (§5.4.1); requests only, a reply's nonce is inside its encrypted "
         "part (§5.4.2); tshark kerberos.nonce"),
    column("etypes", object, "requested encryption types, in the client's order of preference, comma-separated "
         "(KDC-REQ-BODY etype §5.4.1; tshark kerberos.ENCTYPE)", polars=pl.String),
    column("padata_types", object, "padata-type of every PA-DATA, comma-separated (§5.2.7): request and reply "
         "padata; for a KRB-ERROR the METHOD-DATA in e-data (§5.9.1; types the KDC accepts)",
         polars=pl.String),
    column("preauth", np.bool_, "the request carries pre-authentication: PA-ENC-TIMESTAMP (2), PA-PK-AS-REQ "
         "(14, 16), PA-FX-FAST (136) or PA-ENCRYPTED-CHALLENGE (138)"),
    column("preauth_etype", np.int32, "etype of the PA-ENC-TIMESTAMP EncryptedData (§5.2.7.2)"),
    column("kdc_options", np.uint32, "KDCOptions flags, bit 0 (reserved) the most significant, as tshark prints "
         "kerberos.kdc_options (§5.4.1): 0x40000000 forwardable, 0x00800000 renewable, 0x00010000 canonicalize, "
         "0x00000010 renewable-ok"),
    column("till_ns", np.int64, "KDC-REQ-BODY till (§5.4.1), ns since the epoch; null past 2262"),
    column("tgs_ticket_realm", object, "TGS-REQ: realm of the ticket in the PA-TGS-REQ AP-REQ (§5.4.1, §5.5.1), "
         "normally the TGT's", polars=pl.String),
    column("tgs_ticket_sname", object, "TGS-REQ: sname of the ticket in the PA-TGS-REQ AP-REQ (krbtgt/REALM for "
         "a TGT)", polars=pl.String),
    column("ticket_etype", np.int32, "etype of the enc-part of the ticket the message carries (§5.3): the issued "
         "ticket of a KDC-REP, the PA-TGS-REQ ticket of a TGS-REQ, the ticket of an AP-REQ"),
    column("ticket_kvno", np.int64, "kvno of that ticket's enc-part (§5.2.9), null when absent"),
    column("enc_etype", np.int32, "etype of the KDC-REP enc-part (§5.4.2), or the AP-REQ authenticator"),
    column("enc_kvno", np.int64, "kvno of that enc-part, null when absent"),
    column("error_code", np.int32, "KRB-ERROR error-code (§5.9.1, §7.5.9); tshark kerberos.error_code"),
    column("error_name", object, "error-code by name (§7.5.9)", polars=pl.String),
    column("e_text", object, "KRB-ERROR e-text (§5.9.1)", polars=pl.String),
    column("stime_ns", np.int64, "KRB-ERROR stime + susec (§5.9.1), ns since the epoch"),
    column("ctime_ns", np.int64, "KRB-ERROR ctime + cusec when present (§5.9.1), ns since the epoch"),
    column("decode_error", object, "null when the message decoded; else why not (truncated, bad length, "
         "unexpected tag, missing field, indefinite length, not this protocol ...). Fields read before "
         "the problem are kept", polars=pl.String),
    column("request_digest", np.uint64, "FNV-1a 64-bit hash of the whole message's captured bytes (every "
         "message, not only requests): byte-identical messages share it, e.g. a replayed TGS-REQ that a "
         "KDC answers from its lookaside cache"),
)

TRANSACTION_COLUMNS: tuple[Column, ...] = TRANSACTION_COMMON + (
    column("login", np.uint32, "id of the login (AS) or ticket request (TGS) this exchange belongs to: "
         "PREAUTH_REQUIRED / RESPONSE_TOO_BIG retries chained (see module doc)"),
    column("login_step", np.uint16, "1 for the first request of its login, 2 for the retry ..."),
    column("login_status", object, "status of the login's last step (AS-REP, TGS-REP, an error name; null "
         "when unanswered)", polars=pl.String),
    column("msg_type", np.int32, "10 AS-REQ or 12 TGS-REQ"),
    column("cname", object, "client name of the request (AS) or of the reply", polars=pl.String),
    column("realm", object, "request realm (KDC-REQ-BODY realm)", polars=pl.String),
    column("sname", object, "requested service name", polars=pl.String),
    column("nonce", np.int64, "request nonce"),
    column("etypes", object, "requested etypes", polars=pl.String),
    column("padata_types", object, "request padata types", polars=pl.String),
    column("preauth", np.bool_, "the request carries pre-authentication"),
    column("kdc_options", np.uint32, "request KDCOptions"),
    column("tgs_ticket_sname", object, "TGS-REQ: sname of the presented ticket", polars=pl.String),
    column("response", object, "KDC-REP kind or KRB-ERROR", polars=MESSAGE_ENUM),
    column("error_code", np.int32, "KRB-ERROR error-code"),
    column("e_text", object, "KRB-ERROR e-text", polars=pl.String),
    column("ticket_etype", np.int32, "reply: etype of the issued ticket (23 = RC4: Kerberoasting material)"),
    column("enc_etype", np.int32, "reply: etype of the enc-part (the client key's etype)"),
    column("extra_responses", np.uint16, "further replies paired to this request after the first"),
    column("retransmission", np.bool_, "an earlier request on the same flow had the same nonce (UDP retry)"),
)

I_DIGEST = N_INTS  # the row after the kernel's fields (see _kernel)

FRAMES.setdefault("kerberos_messages", MESSAGE_COLUMNS)  # descriptions for ``herdscope export``
FRAMES.setdefault("kerberos_transactions", TRANSACTION_COLUMNS)


@dataclass(frozen=True)
class Params:
    # a reply more than this after the request does not answer it (MIT's and Windows' KDC timeouts
    # are 1-10 s per try; a UDP 4-tuple can be reused later)
    timeout_ns: int = 30_000_000_000
    # a retry after PREAUTH_REQUIRED / RESPONSE_TOO_BIG within this belongs to the same login
    login_window_ns: int = 30_000_000_000


# --- Python side ----------------------------------------------------------------------------------

def _kernel(ms: MessageSet):
    """Run the kernel over one set: (row -> message index, ints, spans, arena)."""
    from .kerberos_kernels import decode_all, digest_all  # lazy: Numba kernels load only when there are Kerberos messages
    n = ms.height
    offsets = ms.frame["offset"].to_numpy().astype(np.int64)
    lengths = ms.frame["length"].to_numpy().astype(np.int64)
    if n and (offsets.min() < 0 or (offsets + lengths).max() > ms.buf.shape[0]):
        raise ValueError("message set offsets/lengths outside its buffer")
    ints = np.empty((N_INTS, n), np.int64)
    spans = np.empty((2 * N_STRS, n), np.int64)
    size = int(lengths.sum()) * 2 + 64 * n + 1024
    while True:  # strings need at most 4x their bytes (escapes); grow on the rare overflow
        arena = np.empty(size, np.uint8)
        used = decode_all(ms.buf, offsets, lengths, ints, spans, arena)
        if used >= 0:
            break
        size *= 2
    # one more row after the kernel's fields: request_digest (uint64 bit patterns)
    ints = np.vstack([ints, digest_all(ms.buf, offsets, lengths).view(np.int64)[None, :]])
    return np.arange(n, dtype=np.int64), ints, spans, arena[:used]


_INT_COLUMNS = {  # column -> (field, dtype)
    "msg_type": (I_MSG_TYPE, pl.Int32), "pvno": (I_PVNO, pl.Int32), "nonce": (I_NONCE, pl.Int64),
    "preauth": (I_PREAUTH, pl.Boolean), "preauth_etype": (I_PREAUTH_ETYPE, pl.Int32),
    "kdc_options": (I_KDC_OPTIONS, pl.UInt32), "till_ns": (I_TILL, pl.Int64),
    "ticket_etype": (I_TICKET_ETYPE, pl.Int32), "ticket_kvno": (I_TICKET_KVNO, pl.Int64),
    "enc_etype": (I_ENC_ETYPE, pl.Int32), "enc_kvno": (I_ENC_KVNO, pl.Int64),
    "error_code": (I_ERROR_CODE, pl.Int32), "stime_ns": (I_STIME, pl.Int64), "ctime_ns": (I_CTIME, pl.Int64),
}


def decode_messages(sets: list[MessageSet]) -> pl.DataFrame:
    """Kerberos message sets (UDP datagrams / record-mark-framed TCP messages) → kerberos_messages,
    one row per message, in time order."""
    sets = [ms for ms in sets if ms.height]
    if not sets:
        return empty_frame(MESSAGE_COLUMNS)
    base, ints, spans, arena = ber.stack_sets(sets, [_kernel(ms) for ms in sets])
    decoded = pl.DataFrame([
        ber.int_column("message", ints[I_APP], pl.Int64)
        .replace_strict(MESSAGE_TYPES, default=None, return_dtype=MESSAGE_ENUM),
        *[ber.int_column(name, ints[k], dtype) for name, (k, dtype) in _INT_COLUMNS.items()],
        *ber.string_columns(STR_NAMES, arena, spans),
        ber.status_column("decode_error", ints[I_STATUS]),
        pl.Series("request_digest", np.ascontiguousarray(ints[I_DIGEST]).view(np.uint64)),
    ])
    decoded = decoded.with_columns(
        pl.col("error_code").cast(pl.Int64).replace_strict(ERROR_CODES, default=None, return_dtype=pl.String)
        .fill_null(pl.format("KRB_ERROR_{}", pl.col("error_code"))).alias("error_name"),
        # preauth is a request property: null on other messages
        pl.when(pl.col("message").is_in(["AS-REQ", "TGS-REQ"])).then(pl.col("preauth")).alias("preauth"),
    )
    return pl.concat([base, decoded], how="horizontal").select([c.name for c in MESSAGE_COLUMNS])


# --- transactions ----------------------------------------------------------------------------------

_CONTINUE_ERRORS = (KDC_ERR_PREAUTH_REQUIRED, KRB_ERR_RESPONSE_TOO_BIG)
_REQUEST_KINDS = ("AS-REQ", "TGS-REQ")
_REPLY_KIND = {"AS-REP": 10, "TGS-REP": 12}
_MATCH_SCAN = 256  # how far back on one flow a response looks for its request


@njit(cache=True)
def _match(flow, ts, is_request, kind, ref, req_kind, req_ts, n_resp, timeout):
    """Events sorted by (flow, time, requests first). Each response takes the latest unanswered
    request of its flow before it, sent at most ``timeout`` earlier (a KDC-REP only a request of
    its kind: ``kind`` is the request msg-type it answers, 0 for KRB-ERROR). A response finding only
    answered requests points at the latest one with ``dup`` set. Returns (request index per
    response or -1, dup per response)."""
    resp_req = np.full(n_resp, -1, np.int64)
    dup = np.zeros(n_resp, np.bool_)
    answered = np.zeros(req_kind.shape[0], np.bool_)
    stack = np.empty(flow.shape[0], np.int64)
    top = 0
    cur = np.int64(-1)
    for e in range(flow.shape[0]):
        if flow[e] != cur:
            cur = flow[e]
            top = 0
        if is_request[e]:
            stack[top] = ref[e]
            top += 1
            continue
        want = kind[e]
        found = -1
        latest = -1
        lo = max(-1, top - 1 - _MATCH_SCAN)
        for j in range(top - 1, lo, -1):
            r = stack[j]
            if ts[e] - req_ts[r] > timeout:
                break  # older requests are older still
            if want != 0 and req_kind[r] != want:
                continue
            if latest < 0:
                latest = r
            if not answered[r]:
                found = r
                break
        if found >= 0:
            answered[found] = True
            resp_req[ref[e]] = found
        elif latest >= 0:
            resp_req[ref[e]] = latest
            dup[ref[e]] = True
    return resp_req, dup


_REQUEST_COLUMNS = ("transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns", "message",
                    "msg_type", "cname", "realm", "sname", "nonce", "etypes", "padata_types", "preauth",
                    "kdc_options", "tgs_ticket_sname")  # what a transaction keeps of its request
_RESPONSE_COLUMNS = ("transport", "flow", "frame_last", "ts_last_ns", "message", "error_code", "error_name",
                     "e_text", "ticket_etype", "enc_etype", "cname")  # and of its reply


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """kerberos_messages → kerberos_transactions (rules in the module docstring).

    Deliberate difference from the brief's "pair by nonce": a KDC-REP's nonce is inside its
    encrypted part (EncKDCRepPart, RFC 4120 §5.4.2), so a reply is paired like an error, by flow
    and order (the latest unanswered request of its kind on the flow); the request nonce still tells
    retransmissions apart."""
    m = messages.with_row_index("_row")
    # only the columns each side reads are filtered and sorted (not every message column)
    req = m.filter(pl.col("message").is_in(_REQUEST_KINDS)).select("_row", *_REQUEST_COLUMNS) \
        .sort("ts_last_ns", "_row")
    resp = m.filter(pl.col("message").is_in(["AS-REP", "TGS-REP", "KRB-ERROR"])) \
        .select("_row", *_RESPONSE_COLUMNS).sort("ts_last_ns", "_row")
    if req.height == 0:
        return empty_frame(TRANSACTION_COLUMNS)
    req = req.with_row_index("_req")
    resp = resp.with_row_index("_resp")
    # UDP flow ids and TCP connection ids are separate numberings: key flows by transport too
    flow_key = (pl.col("flow").cast(pl.Int64) * 2 + (pl.col("transport").cast(pl.String) == "tcp").cast(pl.Int64))
    events = pl.concat([
        req.select(flow_key.alias("flow"), pl.col("ts_last_ns"), pl.lit(True).alias("_is_req"),
                   pl.col("msg_type").fill_null(0).cast(pl.Int64).alias("_kind"),
                   pl.col("_req").cast(pl.Int64).alias("_ref")),
        resp.select(flow_key.alias("flow"), pl.col("ts_last_ns"), pl.lit(False).alias("_is_req"),
                    pl.col("message").cast(pl.String).replace_strict(_REPLY_KIND, default=0, return_dtype=pl.Int64)
                    .alias("_kind"),
                    pl.col("_resp").cast(pl.Int64).alias("_ref")),
    ]).sort("flow", "ts_last_ns", pl.col("_is_req").not_())
    req_kind = req["msg_type"].fill_null(0).cast(pl.Int64).to_numpy()
    resp_req, dup = _match(events["flow"].to_numpy(), events["ts_last_ns"].to_numpy(), events["_is_req"].to_numpy(),
                           events["_kind"].to_numpy(), events["_ref"].to_numpy(), req_kind,
                           req["ts_last_ns"].to_numpy(), resp.height, np.int64(params.timeout_ns))
    resp = resp.with_columns(pl.Series("_req", resp_req), pl.Series("_dup", dup))
    answers = resp.filter((pl.col("_req") >= 0) & ~pl.col("_dup")).select(
        pl.col("_req").cast(pl.UInt32), pl.col("frame_last").alias("response_frame"),
        pl.col("ts_last_ns").alias("response_ts_ns"), pl.col("message").alias("response"),
        "error_code", pl.col("error_name").alias("_error_name"), "e_text", "ticket_etype", "enc_etype",
        pl.col("cname").alias("_resp_cname"))
    extra = resp.filter(pl.col("_dup")).group_by("_req").agg(pl.len().cast(pl.UInt16).alias("extra_responses")) \
        .with_columns(pl.col("_req").cast(pl.UInt32))
    tx = req.select("_req", "transport", "flow", "src", "dst", "sport", "dport", "frame_last", "ts_last_ns",
                    "message", "msg_type", "cname", "realm", "sname", "nonce", "etypes", "padata_types",
                    "preauth", "kdc_options", "tgs_ticket_sname") \
        .join(answers, on="_req", how="left", maintain_order="left") \
        .join(extra, on="_req", how="left", maintain_order="left")
    is_as = pl.col("msg_type") == 10
    status = pl.when(pl.col("response") == "KRB-ERROR").then(pl.col("_error_name")) \
        .otherwise(pl.col("response").cast(pl.String))
    tx = tx.with_columns(
        pl.lit("kerberos").alias("protocol"),
        pl.col("src").alias("client"), pl.col("sport").alias("client_port"),
        pl.col("dst").alias("server"), pl.col("dport").alias("server_port"),
        pl.col("message").cast(pl.String).alias("operation"),
        pl.when(is_as).then(pl.concat_str(pl.col("cname").fill_null(pl.col("_resp_cname")), pl.lit("@"),
                                          pl.col("realm")))
        .otherwise(pl.concat_str(pl.col("sname"), pl.lit("@"), pl.col("realm"))).alias("resource"),
        pl.col("frame_last").alias("request_frame"), pl.col("ts_last_ns").alias("request_ts_ns"),
        (pl.col("response_ts_ns") - pl.col("ts_last_ns")).alias("latency_ns"),
        status.alias("status"),
        pl.col("response_frame").is_not_null().alias("answered"),
        pl.col("extra_responses").fill_null(0),
        pl.col("cname").fill_null(pl.col("_resp_cname")),
        (pl.int_range(pl.len()).over("transport", "flow", "nonce") > 0).alias("retransmission"),
    )
    tx = _logins(tx, params)
    return tx.sort("request_ts_ns", "request_frame").select(
        [pl.col(c.name).cast(polars_type(c)) if c.name not in ("client", "server", "transport") else pl.col(c.name)
         for c in TRANSACTION_COLUMNS])


def _logins(tx: pl.DataFrame, params: Params) -> pl.DataFrame:
    """login / login_step / login_status / is_error (rules in the module docstring)."""
    key = [pl.col("client").cast(pl.String).alias("_c"), pl.col("msg_type").alias("_k"),
           pl.when(pl.col("msg_type") == 10).then(pl.col("cname")).otherwise(pl.col("sname")).alias("_p"),
           pl.col("realm").str.to_uppercase().alias("_r")]
    t = tx.with_columns(key).sort("_c", "_k", "_p", "_r", "request_ts_ns", "request_frame")
    same = [(pl.col(c) == pl.col(c).shift(1)).fill_null(False) for c in ("_c", "_k", "_p", "_r")]
    prev_code = pl.col("error_code").shift(1)
    prev_answered_ts = pl.col("response_ts_ns").shift(1)
    continues = (
        same[0] & same[1] & same[2] & same[3]
        & (pl.col("response").shift(1) == "KRB-ERROR")
        & (((prev_code == KDC_ERR_PREAUTH_REQUIRED) & pl.col("preauth").fill_null(False))
           | ((prev_code == KRB_ERR_RESPONSE_TOO_BIG) & (pl.col("transport").cast(pl.String) == "tcp")))
        & (pl.col("request_ts_ns") >= prev_answered_ts)
        & (pl.col("request_ts_ns") - prev_answered_ts <= params.login_window_ns)
    ).fill_null(False)
    t = t.with_columns(continues.alias("_cont"))
    t = t.with_columns((~pl.col("_cont")).cast(pl.UInt32).cum_sum().alias("login"))
    t = t.with_columns(
        (pl.int_range(pl.len()).over("login") + 1).cast(pl.UInt16).alias("login_step"),
        pl.col("status").last().over("login").alias("login_status"),
        (pl.col("login") == pl.col("login").shift(-1)).fill_null(False).alias("_followed"),
    )
    is_error = (pl.col("response") == "KRB-ERROR") & ~(
        pl.col("_followed") & pl.col("error_code").is_in(list(_CONTINUE_ERRORS)))
    # dense login ids in time order of the login's first request
    t = t.with_columns(is_error.fill_null(False).alias("is_error"))
    first = t.group_by("login").agg(pl.col("_req").min().alias("_r0")).sort("_r0").with_row_index("_login")
    t = t.join(first.select("login", "_login"), on="login", how="left", maintain_order="left").with_columns(
        pl.col("_login").cast(pl.UInt32).alias("login"))
    return t


# --- frames ------------------------------------------------------------------------------------------

def message_sets(cap) -> list[MessageSet]:
    """Kerberos message sets of a capture: UDP/88 and TCP/88 (record-marked)."""
    return protocol_message_sets(cap, PROTOCOL)


@frame_builder("kerberos_messages")
def _build_messages(cap) -> pl.DataFrame:
    sets = message_sets(cap)
    frame = decode_messages(sets)
    kerberos_ap_tokens.remember(cap, "kerberos_messages", sets, frame)  # kerberos_ap's tokens: not framed again
    return frame


# kerberos_ap's kdc carrier: the AP-REQ in the PA-TGS-REQ padata of each TGS-REQ (RFC 4120 §5.4.1)
register_token_source("kdc", carrier_source(PROTOCOL, "kerberos_messages", pl.col("message") == "TGS-REQ",
                                            kdc_tokens))


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a request counts as unanswered), from the code tables and Params:
    ``herdscope stats --help`` and the README (analyzer.stats.outcome_rules)."""
    kp = Params()
    return (f"a KRB-ERROR reply, except {named_codes(ERROR_CODES, _CONTINUE_ERRORS, 'and')} when the client "
            f"goes on with the next step (pre-authentication, TCP) within {unbroken_duration(kp.login_window_ns)}: "
            f"that step is the protocol working. A PREAUTH_REQUIRED nobody follows up is an error.",
            f"no AS-REP, TGS-REP or KRB-ERROR on the request's flow within {unbroken_duration(kp.timeout_ns)} of it.")


@frame_builder("kerberos_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    return pair_transactions(cap.frame("kerberos_messages"))

