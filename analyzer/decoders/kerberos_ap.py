"""The ``kerberos_ap`` frame: Kerberos AP-REQ, AP-REP and KRB-ERROR messages found inside carriers.

One row per Kerberos message of those three kinds that a carrier holds, and one per damaged token
(``decode_error``). Carriers (``carrier``):

- ``kdc``: the AP-REQ in the PA-TGS-REQ padata of a TGS-REQ on port 88 (RFC 4120 §5.4.1, §7.5.2),
  from the ``kerberos`` decoder's message sets (registered by :mod:`.kerberos`);
- ``smb2``: the GSS-API token of SESSION_SETUP requests and responses (MS-SMB2 2.2.5, 2.2.6
  SecurityBufferOffset / SecurityBufferLength), from the ``smb2`` decoder's message sets;
- ``ldap``: SASL bind credentials and bindResponse serverSaslCreds (RFC 4511 §4.2, §4.2.2), GSSAPI
  (RFC 4752) and GSS-SPNEGO, from the ``ldap`` decoder's message sets;
- ``http``: ``Authorization`` / ``WWW-Authenticate: Negotiate`` tokens (RFC 4559), fed by the HTTP
  decoder through :func:`register_token_source`.

The tokens are unwrapped by :mod:`.gssapi` (GSS-API framing, SPNEGO NegTokenInit / NegTokenResp) and
the Kerberos message decoded by the Kerberos kernels (:mod:`.kerberos_kernels`), all column-wise.

**Token sources.** Every carrier is a function ``source(cap) -> list[MessageSet]`` registered with
:func:`register_token_source`: its frames have the message-set columns of the carrier's messages,
with ``offset`` / ``length`` locating the token in the set's buffer (and an optional Int64
``carrier_status``: a ``ber`` status when the carrier's token field ran past the message). The frame
builder collects them all, in :data:`CARRIERS` order; :func:`decode_tokens` turns one carrier's sets
into rows (the HTTP decoder and the tests call it directly). This module registers the ``smb2`` and
``ldap`` carriers; the ``kerberos`` decoder registers ``kdc`` and the HTTP decoder ``http`` (both
import this module, so it imports neither of them); :func:`carrier_source` makes a source from a
carrier's message sets and one of :mod:`.kerberos_ap_carriers`' kernels.

**The replay-cache tag** (``rc_tag``): MIT krb5 >= 1.18 stores in its replay cache the last
``krb5_c_crypto_length(enctype, KRB5_CRYPTO_TYPE_CHECKSUM)`` bytes of the authenticator's ciphertext
(``src/lib/krb5/rcache/rc_base.c`` ``k5_rc_tag_from_ciphertext``), which a passive observer can
compute without keys: :data:`RC_TAG_LENGTHS` per enctype, from ``src/lib/crypto/krb/etypes.c`` and
the ``crypto_length`` functions of ``enc_dk_hmac.c`` / ``enc_rc4.c`` / ``enc_dk_cmac.c`` /
``enc_etm.c``. Null for an enctype not in the table or a ciphertext shorter than the tag or not
wholly captured.

``frame`` is the carrier message's first frame (``frame_first`` of its row in the carrier's messages
frame), ``frame_last`` its last (where the carriers' transaction frames put ``request_frame`` /
``response_frame`` for a message spanning several segments).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from ..capture import frame_builder
from ..columns import arrow_series
from ..message_set import TRANSPORTS, MessageSet
from ..messages import protocol_message_sets
from ..schema import FRAMES, Column, column, empty_frame, polars_type
from . import ber
from . import gssapi as G
from . import kerberos_ap_carriers as K
from . import kerberos_ap_tokens
from . import ldap, smb2
from .kerberos_codes import ERROR_CODES
from .kerberos_layout import (I_AP_OPTIONS, I_APP, I_AUTH_CIPHER_END, I_AUTH_CIPHER_START, I_ENC_ETYPE,
                              I_ENC_KVNO, I_ERROR_CODE, I_PVNO, I_STATUS, I_TICKET_ETYPE, I_TICKET_KVNO,
                              N_INTS, N_STRS, STR_NAMES)
from .protocol import Protocol

CARRIERS = ("kdc", "smb2", "ldap", "http")
CARRIER_ENUM = pl.Enum(list(CARRIERS))
# RFC 4120 §7.5.7 msg-type -> the message value of this frame
MESSAGES = {14: "ap_req", 15: "ap_rep", 30: "krb_error"}
MESSAGE_ENUM = pl.Enum(list(MESSAGES.values()))

# krb5_c_crypto_length(enctype, KRB5_CRYPTO_TYPE_CHECKSUM) of MIT krb5 (etypes.c + enc_*.c): the length
# of the replay-cache tag. RFC 3961 §7 / RFC 8009 / RFC 6803 / RFC 4757 etype numbers.
RC_TAG_LENGTHS = {
    16: 20,  # des3-cbc-sha1: dk, HMAC-SHA1 hashsize
    17: 12,  # aes128-cts-hmac-sha1-96: 96 bits
    18: 12,  # aes256-cts-hmac-sha1-96
    19: 16,  # aes128-cts-hmac-sha256-128: etm, SHA-256 / 2
    20: 24,  # aes256-cts-hmac-sha384-192: etm, SHA-384 / 2
    23: 16,  # arcfour-hmac: MD5 hashsize
    24: 16,  # arcfour-hmac-exp
    25: 16,  # camellia128-cts-cmac: CMAC, the block size
    26: 16,  # camellia256-cts-cmac
}

COLUMNS: tuple[Column, ...] = (
    column("carrier", object, "where the message travelled: kdc (PA-TGS-REQ of a TGS-REQ, RFC 4120 §5.4.1), "
           "smb2 (SESSION_SETUP security buffer, MS-SMB2 2.2.5/2.2.6), ldap (SASL bind, RFC 4511 §4.2), "
           "http (Negotiate, RFC 4559)", polars=CARRIER_ENUM),
    column("frame", np.uint32, "first frame of the carrier message (its frame_first; kdc: the TGS-REQ's)"),
    column("frame_last", np.uint32, "last frame of the carrier message (its frame_last)"),
    column("ts_ns", np.int64, "time of the carrier message's first packet"),
    column("src", object, "source address"),
    column("dst", object, "destination address"),
    column("sport", np.uint16, "source port"),
    column("dport", np.uint16, "destination port"),
    column("transport", object, "udp or tcp", polars=TRANSPORTS),
    column("flow", np.uint32, "the carrier message's flow (UDP flow id / TCP connection id)"),
    column("from_client", np.bool_, "sent by the carrier's client"),
    column("message", object, "ap_req (RFC 4120 §5.5.1), ap_rep (§5.5.2) or krb_error (§5.9.1); null when the "
           "token is damaged before the message could be told", polars=MESSAGE_ENUM),
    column("mech", object, "GSS-API mechanism as seen: krb5 (1.2.840.113554.1.2.2), ms-krb5 "
           "(1.2.840.48018.1.2.2), krb5-u2u, spnego (SPNEGO named no mechanism), other; null for a bare "
           "Kerberos message (kdc)", polars=pl.String),
    column("spnego", np.bool_, "the token was SPNEGO (RFC 4178) around the mechanism token"),
    column("pvno", np.int32, "pvno (5)"),
    column("ap_options", np.uint32, "AP-REQ ap-options, bit 0 the most significant as tshark prints "
           "kerberos.ap_options: 0x40000000 use-session-key, 0x20000000 mutual-required (§5.5.1)"),
    column("realm", object, "AP-REQ: the ticket's realm (§5.3); KRB-ERROR: realm (§5.9.1)", polars=pl.String),
    column("sname", object, "AP-REQ: the ticket's sname joined with '/'; KRB-ERROR: sname", polars=pl.String),
    column("ticket_etype", np.int32, "AP-REQ: etype of the ticket's enc-part (§5.3)"),
    column("ticket_kvno", np.int64, "AP-REQ: kvno of the ticket's enc-part (the service key's version)"),
    column("authenticator_etype", np.int32, "AP-REQ: etype of the authenticator EncryptedData (§5.5.1)"),
    column("authenticator_kvno", np.int64, "AP-REQ: kvno of the authenticator (normally absent)"),
    column("rc_tag", object, "AP-REQ: MIT krb5's replay-cache tag, the last checksum-length bytes of the "
           "authenticator ciphertext (module doc); null when unknown", polars=pl.Binary),
    column("error_code", np.int32, "KRB-ERROR error-code (§5.9.1, §7.5.9)"),
    column("error_name", object, "error-code by name (§7.5.9)", polars=pl.String),
    column("e_text", object, "KRB-ERROR e-text", polars=pl.String),
    column("decode_error", object, "null when the token and its message decoded; else the first problem: of the "
           "carrier's token field, the GSS/SPNEGO framing, or the Kerberos message (truncated, bad length, "
           "unexpected tag, bad value: TOK_ID and message disagree ...)", polars=pl.String),
)
FRAMES.setdefault("kerberos_ap", COLUMNS)

# --- token sources ----------------------------------------------------------------------------------

_SOURCES: dict[str, Callable] = {}


def register_token_source(carrier: str, source: Callable) -> None:
    """Register ``source(cap) -> list[MessageSet]`` (token ranges, module doc) for ``carrier``."""
    if carrier not in CARRIERS:
        raise ValueError(f"carrier {carrier!r} is not one of {', '.join(CARRIERS)}")
    _SOURCES[carrier] = source


def token_sources() -> dict[str, Callable]:
    """The registered token sources, carrier -> source, in :data:`CARRIERS` order."""
    return {carrier: _SOURCES[carrier] for carrier in CARRIERS if carrier in _SOURCES}


# --- decoding -----------------------------------------------------------------------------------------

def _first_error(*statuses: np.ndarray) -> np.ndarray:
    out = np.zeros_like(statuses[0])
    for st in statuses:
        out = np.where(out != ber.OK, out, st)
    return out


def _binary(name: str, buf: np.ndarray, start: np.ndarray, length: np.ndarray, valid: np.ndarray) -> pl.Series:
    lens = np.where(valid, length, 0).astype(np.int64)
    offsets = np.zeros(lens.shape[0] + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], lens)
    data = buf[np.repeat(np.where(valid, start, 0), lens) + within] if offsets[-1] else np.zeros(0, np.uint8)
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    arr = pa.Array.from_buffers(pa.large_binary(), lens.shape[0],
                                [bitmap, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])
    return arrow_series(name, arr).cast(pl.Binary)


def _decode_set(carrier: str, ms: MessageSet) -> pl.DataFrame | None:
    from .kerberos_kernels import decode_all  # lazy: Numba kernels load only when there are tokens to decode
    fr = ms.frame
    off = fr["offset"].to_numpy().astype(np.int64)
    ln = fr["length"].to_numpy().astype(np.int64)
    if fr.height and (off.min() < 0 or (off + ln).max() > ms.buf.shape[0]):
        raise ValueError("token set offsets/lengths outside its buffer")
    cst = (fr["carrier_status"].fill_null(0).to_numpy().astype(np.int64) if "carrier_status" in fr.columns
           else np.zeros(fr.height, np.int64))
    g = G.unwrap_all(ms.buf, off, ln)
    rows = np.flatnonzero((g[G.G_EMIT] == 1) | (cst != ber.OK))
    if rows.shape[0] == 0:
        return None
    g = g[:, rows]
    cst = cst[rows]
    k_s = g[G.G_K_START]
    has = k_s >= 0
    k_off = np.where(has, k_s, 0)
    k_len = np.where(has, g[G.G_K_END] - k_s, 0)
    n = rows.shape[0]
    ints = np.empty((N_INTS, n), np.int64)
    spans = np.empty((2 * N_STRS, n), np.int64)
    size = int(k_len.sum()) * 2 + 64 * n + 1024
    while True:
        arena = np.empty(size, np.uint8)
        used = decode_all(ms.buf, k_off, k_len, ints, spans, arena)
        if used >= 0:
            break
        size *= 2
    app = np.where(has, ints[I_APP], ber.NULL)
    known = np.isin(app, list(MESSAGES))
    tok = g[G.G_TOK_ID]
    want = np.select([tok == t for t in G.TOK_MESSAGE], list(G.TOK_MESSAGE.values()), -1)
    mismatch = has & (want >= 0) & (app != ber.NULL) & (app != want)
    k_status = np.where(has, ints[I_STATUS], ber.OK)
    status = _first_error(cst, g[G.G_STATUS], k_status,
                          np.where(has & (app != ber.NULL) & ~known, ber.UNEXPECTED, ber.OK),
                          np.where(mismatch, ber.BAD_VALUE, ber.OK))
    ap_req = app == 14
    # rc_tag: the ciphertext's last RC_TAG_LENGTHS[etype] bytes
    etype = np.where(ap_req, ints[I_ENC_ETYPE], ber.NULL)
    tag_len = np.zeros(n, np.int64)
    for et, k in RC_TAG_LENGTHS.items():
        tag_len[etype == et] = k
    c_s, c_e = ints[I_AUTH_CIPHER_START], ints[I_AUTH_CIPHER_END]
    tag_ok = ap_req & (tag_len > 0) & (c_s != ber.NULL) & (c_s >= 0) & (c_e - c_s >= tag_len)
    base = fr[rows]
    only = lambda col, mask: np.where(mask, ints[col], ber.NULL)  # noqa: E731
    strs = {s.name: s for s in ber.string_columns(STR_NAMES, arena[:used], spans)}
    out = pl.DataFrame([
        pl.Series("carrier", [carrier] * n, dtype=CARRIER_ENUM),
        base["frame_first"].alias("frame"), base["frame_last"], base["ts_first_ns"].alias("ts_ns"),
        base["src"], base["dst"], base["sport"], base["dport"], base["transport"], base["flow"], base["from_client"],
        ber.int_column("message", app, pl.Int64).replace_strict(MESSAGES, default=None, return_dtype=MESSAGE_ENUM),
        pl.Series("mech", g[G.G_MECH]).replace_strict(G.MECH_NAMES, default=None, return_dtype=pl.String),
        pl.Series("spnego", g[G.G_SPNEGO] == 1),
        ber.int_column("pvno", np.where(has, ints[I_PVNO], ber.NULL), pl.Int32),
        ber.int_column("ap_options", only(I_AP_OPTIONS, ap_req), pl.UInt32),
        strs["realm"].set(pl.Series(~has), None), strs["sname"].set(pl.Series(~has), None),
        ber.int_column("ticket_etype", only(I_TICKET_ETYPE, ap_req), pl.Int32),
        ber.int_column("ticket_kvno", only(I_TICKET_KVNO, ap_req), pl.Int64),
        ber.int_column("authenticator_etype", etype, pl.Int32),
        ber.int_column("authenticator_kvno", only(I_ENC_KVNO, ap_req), pl.Int64),
        _binary("rc_tag", ms.buf, c_e - tag_len, tag_len, tag_ok),
        ber.int_column("error_code", only(I_ERROR_CODE, app == 30), pl.Int32),
        strs["e_text"].set(pl.Series(~has), None),
        ber.status_column("decode_error", status),
    ])
    out = out.with_columns(
        pl.col("error_code").cast(pl.Int64).replace_strict(ERROR_CODES, default=None, return_dtype=pl.String)
        .fill_null(pl.format("KRB_ERROR_{}", pl.col("error_code"))).alias("error_name"))
    return out.select([pl.col(c.name).cast(polars_type(c)) if c.name not in ("src", "dst") else pl.col(c.name)
                       for c in COLUMNS])


def decode_tokens(carrier: str, sets: list[MessageSet]) -> pl.DataFrame:
    """Token sets of one carrier (module doc) → kerberos_ap rows, in time order."""
    if carrier not in CARRIERS:
        raise ValueError(f"carrier {carrier!r} is not one of {', '.join(CARRIERS)}")
    parts = [p for p in (_decode_set(carrier, ms) for ms in sets if ms.height) if p is not None]
    return _concat(parts)


def _concat(parts: list[pl.DataFrame]) -> pl.DataFrame:
    if not parts:
        return empty_frame(COLUMNS)
    try:
        out = pl.concat(parts, how="vertical_relaxed")
    except Exception:  # address columns of different Enums: fall back to text
        out = pl.concat([p.with_columns(pl.col("src").cast(pl.String), pl.col("dst").cast(pl.String))
                         for p in parts], how="vertical_relaxed")
    return out.sort("ts_ns", "frame", maintain_order=True)


@frame_builder("kerberos_ap")
def build(cap) -> pl.DataFrame:
    """The kerberos_ap frame of a capture: every registered carrier's tokens."""
    cap.frame_names()  # loads every decoder, so every carrier has registered its source
    return _concat([decode_tokens(carrier, source(cap)) for carrier, source in token_sources().items()])


# --- carriers whose kernels are in kerberos_ap_carriers (kdc and http register themselves) ---------------

_token_sets = kerberos_ap_tokens.token_sets  # (the tests call it by this name)


def carrier_source(protocol: Protocol, messages_frame: str, wanted: pl.Expr, kernel) -> Callable:
    """A token source (module doc) for a carrier: the message sets of ``protocol`` and ``kernel`` (one of
    :mod:`.kerberos_ap_carriers`') finds the tokens in them; a capture none of whose ``messages_frame``
    rows match ``wanted`` (the messages that can carry a token) has none. Of TCP only the connections
    with such a message count (a capture's SMB2 or LDAP streams are mostly not binds): their tokens
    as the decoder found them when it built ``messages_frame`` (:mod:`.kerberos_ap_tokens`), else
    those connections framed again. Each connection is framed on its own and UDP always whole, so
    both give the same token rows in the same order."""
    kerberos_ap_tokens.register_kernel(messages_frame, kernel, wanted)

    def source(cap) -> list[MessageSet]:
        candidates = cap.frame(messages_frame).filter(wanted)
        if candidates.height == 0:
            return []
        conns = candidates.filter(pl.col("transport") == "tcp")["flow"].unique()
        kept = kerberos_ap_tokens.remembered(cap, messages_frame)
        if kept is None:
            return _token_sets(protocol_message_sets(cap, protocol, only_conns=conns), kernel)
        mine = (pl.col("transport") == "udp") | pl.col("flow").is_in(conns.implode())
        sets = [MessageSet(ms.frame.filter(mine), ms.buf) for ms in kept]
        return [ms for ms in sets if ms.height]
    return source


register_token_source("smb2", carrier_source(smb2.PROTOCOL, "smb2_messages",
                                              pl.col("command") == "SESSION_SETUP", K.smb2_tokens))
register_token_source("ldap", carrier_source(ldap.PROTOCOL, "ldap_messages",
                                              (pl.col("auth") == "sasl") | (pl.col("op") == "bindResponse"),
                                              K.ldap_tokens))
