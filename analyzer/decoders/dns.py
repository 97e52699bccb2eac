"""DNS: messages (RFC 1035 §4.1, RFC 6891 EDNS(0), RFC 2308 negative caching) and transactions.

``dns_messages`` has one row per DNS message over UDP or TCP port 53; ``dns_transactions`` one row per
query with its response. The byte work is in :mod:`.dns_kernels`; this module holds the code
tables, the schemas and the Polars side.

Decisions (each one is tested in ``tests/test_dns_decoder.py``):

- **Ports.** UDP and TCP port 53 only. mDNS (5353) and LLMNR (5355) are multicast protocols with
  no request/response pairing in the unicast sense (many responders, ``id`` 0): left out.
- **Names** are rendered like Wireshark's ``dns.qry.name``: labels joined by '.', the root as
  ``<Root>``. Bytes outside printable ASCII, and the backslash, are written ``\\xNN``
  (:func:`.text.put_escaped`); Wireshark writes ``\\000`` octal escapes for control bytes, leaves
  the backslash alone and shows non-ASCII as UTF-8. A '.' inside a label is not escaped (neither
  does Wireshark). Case is kept as on the wire.
- **Compression pointers** in the question name must point strictly before the run of labels they
  end (RFC 1035 §4.1.4 "a prior occurrence"): a pointer at or after its own position is a
  ``forward pointer``, one back into its own run a ``pointer loop``, one past the message a
  ``pointer out of bounds``. Wireshark accepts forward pointers; none of the corpus captures has
  one.
- **Unknown codes** are named in RFC 3597 §5 style: ``TYPE65280``; rcodes and opcodes the same way
  (``RCODE4000``, ``OPCODE9``). Wireshark writes "Unknown (65280)".
- **rcode** is the full 12-bit RCODE (RFC 6891 §6.1.3): the header's 4 bits plus, when an OPT RR
  is present, its 8 extended bits above them (BADCOOKIE = 23 needs them). Wireshark's
  ``dns.flags.rcode`` is the low 4 bits; ``dns.resp.ext_rcode`` the high 8.
- **TTLs** are the raw 32-bit values, as Wireshark shows them (RFC 2181 §8 says a TTL with the top
  bit set means 0; no reinterpretation here). ``answer_ttl_min`` is over the answer section's RRs
  (OPT excluded), counting an RR as soon as its fixed part was read. ``negative_ttl`` (RFC 2308 §5)
  is min(SOA TTL, SOA MINIMUM) of the first SOA of the authority section of a negative response:
  NXDOMAIN, or NOERROR without an answer RR of the question's type (NODATA, a CNAME chain ending
  nowhere included). A referral (no SOA) has none.
- **Errors.** A message that cannot be fully walked keeps what was decoded before the problem and
  says why in ``decode_error`` (first fatal problem wins; ``misplaced opt``/``multiple opt`` are
  reported but the walk goes on). RR owner names and RDATA are skipped, not followed: only the
  question name's pointers are checked.

Transactions (``pair_transactions``; ``mark_messages`` adds the per-message flags):

- **Key.** A query and a response pair when they have the same transport, client address and port,
  server address and port, id, question name (exactly, case included) and qtype. The client is
  the source of a query (QR=0) and the destination of a response, so port-53-to-port-53 traffic
  pairs too. Wireshark keys on the conversation and id only: a response with another question is
  its own (unsolicited) row here.
- **Time order.** Messages are taken in ``ts_last_ns`` order (then frame), not file order: a
  capture whose timestamps go backwards still pairs (Wireshark, in frame order, does not).
- **Retransmission** (Wireshark's ``dns.retransmission`` on queries): the same query again while
  the key's current transaction is unanswered and began less than
  ``Params.retransmission_window_ns`` (5 s, as ``dns.retransmission_timer``) before. It joins
  that transaction (``retries``), flagged ``retransmission`` on the message. Later than that, it
  opens a new transaction and the old one stays unanswered.
- **Responses.** The first response to the key's current transaction is its answer, however late
  (as tshark, whose ``dns.time`` and ``-z dns,tree`` count an answer after 7.6 s: the server did
  answer that query, whether or not the client still waited; ``Params.timeout_ns`` sets a limit
  after the transaction's latest query, none by default). ``request_*`` is the *first* query, so
  ``latency_ns`` is what the client waited (Wireshark's ``dns.time``). Further responses, however
  late, are ``duplicate_response`` (``dns.retransmit_response``) until a new query opens the next
  transaction; a response with no open transaction (or later than a set ``timeout_ns``) is
  ``unsolicited`` (``dns.unsolicited``) and belongs to no transaction. A query stays unanswered
  when no response came before the key's next transaction (a repeat after the retransmission
  window) or the end of the capture.
  A response without a question (some FORMERR/NOTIMP answers) answers the latest unanswered
  transaction with the same addresses, ports and id.
- **Outcome.** ``status`` is the rcode name. ``is_error`` is True for any rcode but NOERROR and
  NXDOMAIN (NXDOMAIN is an answer: the name does not exist), null when unanswered.
  ``operation`` is the qtype name for standard queries (opcode 0) and the opcode name otherwise
  (NOTIFY, UPDATE, ...).
- **Truncation.** A UDP answer with TC=1 followed, within ``Params.tc_retry_window_ns``, by a TCP query for
  the same question from the same client address to the same server address gives
  ``tc_retry_frame`` (that query's frame).

Frames: ``cap.frame("dns_messages")`` = ``mark_messages(decode_messages(message_sets(cap)))`` and
``cap.frame("dns_transactions")``; one pairing pass builds both (``messages_and_transactions``).
Pairing is one Numba pass in time order over a hash table keyed exactly (the question name's bytes
are compared, not only hashed): no sort on the string key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import polars as pl

from ..capture import frame_builder
from ..columns import enum_from_codes, series
from ..messages import KEPT_COLUMNS, protocol_message_sets
from ..messages import TRANSPORTS, MessageSet
from ..schema import FRAMES, Column, column, empty_frame
from . import dns_resends
from .protocol import Protocol
from . import dns_kernels as k
from .common import TRANSACTION_COMMON, named_codes, unbroken_duration
from .text import arena_strings

PROTOCOL = Protocol(
    name="dns", title="DNS", spec="RFC 1035", udp_ports=(53,), tcp_ports=(53,),
    tcp_framing="length16",  # RFC 1035 §4.2.2: a two-octet length before each message
    frames=("dns_messages", "dns_transactions"), transactions="dns_transactions",
    requests_noun="DNS queries", services={53: "dns"},
    request_verb="queried", repeat_verb="re-queried", request_word="queries", operation_after_resource=True,
    # queries re-sent with their id and question: folded into one transaction (RFC 1035 §4.2.1)
    resends="analyzer.decoders.dns_resends:resends", resends_frame="dns_messages", resends_count="retries",
    resends_columns=tuple(sorted(dns_resends.MESSAGE_COLUMNS)), resends_rows=dns_resends.MESSAGE_ROWS,
)

# --- code tables ----------------------------------------------------------------------------------

# RFC 1035 §4.1.1 (0-5), RFC 2136 §2.2 (6-10), RFC 8490 §10.3 (11), RFC 6891 §9 (16, BADVERS; TSIG's
# BADSIG shares the value), RFC 8945 / RFC 2930 (17-22), RFC 7873 §8 (23): the IANA DNS RCODE registry.
RCODES = {
    0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED",
    6: "YXDOMAIN", 7: "YXRRSET", 8: "NXRRSET", 9: "NOTAUTH", 10: "NOTZONE", 11: "DSOTYPENI",
    16: "BADVERS", 17: "BADKEY", 18: "BADTIME", 19: "BADMODE", 20: "BADNAME", 21: "BADALG",
    22: "BADTRUNC", 23: "BADCOOKIE",
}
# Not failures of the server: the answer (NXDOMAIN = "this name does not exist") is the outcome.
NON_ERROR_RCODES = (0, 3)

# RFC 1035 §4.1.1 (0-2), RFC 1996 (4), RFC 2136 (5), RFC 8490 (6).
OPCODES = {0: "QUERY", 1: "IQUERY", 2: "STATUS", 4: "NOTIFY", 5: "UPDATE", 6: "DSO"}

# RFC 1035 §3.2.2-3.2.3 and the IANA "Resource Record (RR) TYPEs" registry (mnemonics as there;
# 255 is "ANY", Wireshark's spelling of IANA's "*").
QTYPES = {
    1: "A", 2: "NS", 3: "MD", 4: "MF", 5: "CNAME", 6: "SOA", 7: "MB", 8: "MG", 9: "MR", 10: "NULL",
    11: "WKS", 12: "PTR", 13: "HINFO", 14: "MINFO", 15: "MX", 16: "TXT", 17: "RP", 18: "AFSDB",
    19: "X25", 20: "ISDN", 21: "RT", 22: "NSAP", 23: "NSAP-PTR", 24: "SIG", 25: "KEY", 26: "PX",
    27: "GPOS", 28: "AAAA", 29: "LOC", 30: "NXT", 31: "EID", 32: "NIMLOC", 33: "SRV", 34: "ATMA",
    35: "NAPTR", 36: "KX", 37: "CERT", 38: "A6", 39: "DNAME", 40: "SINK", 41: "OPT", 42: "APL",
    43: "DS", 44: "SSHFP", 45: "IPSECKEY", 46: "RRSIG", 47: "NSEC", 48: "DNSKEY", 49: "DHCID",
    50: "NSEC3", 51: "NSEC3PARAM", 52: "TLSA", 53: "SMIMEA", 55: "HIP", 56: "NINFO", 57: "RKEY",
    58: "TALINK", 59: "CDS", 60: "CDNSKEY", 61: "OPENPGPKEY", 62: "CSYNC", 63: "ZONEMD", 64: "SVCB",
    65: "HTTPS", 99: "SPF", 100: "UINFO", 101: "UID", 102: "GID", 103: "UNSPEC", 104: "NID",
    105: "L32", 106: "L64", 107: "LP", 108: "EUI48", 109: "EUI64", 249: "TKEY", 250: "TSIG",
    251: "IXFR", 252: "AXFR", 253: "MAILB", 254: "MAILA", 255: "ANY", 256: "URI", 257: "CAA",
    258: "AVC", 259: "DOA", 260: "AMTRELAY", 32768: "TA", 32769: "DLV",
}

# decode_error values; index = dns_kernels.E_* (0 = decoded without a problem, null in the frame).
DECODE_ERRORS = (
    "truncated header",  # fewer than the 12 header octets (RFC 1035 §4.1.1)
    "truncated question",  # the question section runs past the message
    "truncated rr",  # an RR's fixed part or RDATA runs past the message
    "pointer loop",  # a compression pointer back into its own label run, or too many pointers
    "forward pointer",  # a compression pointer at or after itself
    "pointer out of bounds",  # a compression pointer past the end of the message
    "bad label type",  # label octet 01xxxxxx / 10xxxxxx (RFC 6891 §5: not supported)
    "name too long",  # more than 255 octets (RFC 1035 §2.3.4)
    "misplaced opt",  # OPT in the answer or authority section (RFC 6891 §6.1.1)
    "multiple opt",  # more than one OPT (RFC 6891 §6.1.1: FORMERR)
)
DECODE_ERROR_ENUM = pl.Enum(DECODE_ERRORS)

# --- schemas --------------------------------------------------------------------------------------

_STR = pl.String

DECODED_COLUMNS: tuple[Column, ...] = (
    column("id", np.uint16, "ID (RFC 1035 §4.1.1); null when the header is cut"),
    column("qr", np.bool_, "QR: the message is a response (§4.1.1)"),
    column("opcode", np.uint8, "OPCODE (§4.1.1): 0 QUERY, 4 NOTIFY, 5 UPDATE ..."),
    column("opcode_name", object, "OPCODE name (OPCODES; OPCODEn when unknown)", polars=_STR),
    column("aa", np.bool_, "AA: authoritative answer (§4.1.1)"),
    column("tc", np.bool_, "TC: truncated, the answer did not fit (§4.1.1)"),
    column("rd", np.bool_, "RD: recursion desired (§4.1.1)"),
    column("ra", np.bool_, "RA: recursion available (§4.1.1)"),
    column("z", np.bool_, "Z: the reserved flag bit (§4.1.1)"),
    column("ad", np.bool_, "AD: authentic data (RFC 4035 §3.2.3)"),
    column("cd", np.bool_, "CD: checking disabled (RFC 4035 §3.2.2)"),
    column("rcode", np.uint16, "full 12-bit RCODE: header RCODE (§4.1.1) | OPT extended RCODE << 4 "
         "(RFC 6891 §6.1.3)"),
    column("rcode_name", object, "RCODE name (RCODES: NOERROR, NXDOMAIN, SERVFAIL ...; RCODEn when "
         "unknown)", polars=_STR),
    column("qdcount", np.uint16, "QDCOUNT: entries in the question section (§4.1.1)"),
    column("ancount", np.uint16, "ANCOUNT: RRs in the answer section (§4.1.1)"),
    column("nscount", np.uint16, "NSCOUNT: RRs in the authority section (§4.1.1)"),
    column("arcount", np.uint16, "ARCOUNT: RRs in the additional section (§4.1.1)"),
    column("qname", object, "QNAME of the first question (§4.1.2), as Wireshark's dns.qry.name "
         "(<Root> for the root; unprintable bytes \\xNN)", polars=_STR),
    column("qtype", np.uint16, "QTYPE of the first question (§4.1.2, §3.2.3)"),
    column("qtype_name", object, "QTYPE name (QTYPES: A, AAAA, PTR, ANY ...; TYPEn, RFC 3597 §5, when "
         "unknown)", polars=_STR),
    column("qclass", np.uint16, "QCLASS of the first question (§4.1.2, §3.2.5; 1 = IN)"),
    column("answer_ttl_min", np.uint32, "smallest TTL (§4.1.3) of the answer-section RRs; null when "
         "none"),
    column("answers_of_qtype", np.uint16, "answer-section RRs whose TYPE is the question's (every RR "
         "for ANY)"),
    column("negative_ttl", np.uint32, "negative-caching TTL of an NXDOMAIN/NODATA response: "
         "min(SOA TTL, SOA MINIMUM) of the authority section's SOA (RFC 2308 §5); null otherwise"),
    column("edns", np.bool_, "an OPT pseudo-RR is in the additional section (RFC 6891 §6.1.1)"),
    column("edns_udp_size", np.uint16, "OPT CLASS: requestor's UDP payload size (RFC 6891 §6.1.2)"),
    column("edns_version", np.uint8, "OPT TTL bits 16-23: EDNS version (RFC 6891 §6.1.3)"),
    column("edns_do", np.bool_, "OPT DO bit: DNSSEC OK (RFC 3225 §3)"),
    column("decode_error", object, "null when the message decoded; otherwise the first problem "
         "(DECODE_ERRORS)", polars=DECODE_ERROR_ENUM),
)

PAIRING_COLUMNS: tuple[Column, ...] = (
    column("retransmission", np.bool_, "query repeated while unanswered, within the retransmission "
         "window (Wireshark's dns.retransmission on a query); null for responses"),
    column("duplicate_response", np.bool_, "a further response to an answered query "
         "(dns.retransmit_response); null for queries"),
    column("unsolicited", np.bool_, "a response matching no open query (dns.unsolicited), or later "
         "than Params.timeout_ns when one is set; null for queries"),
)

MESSAGE_COLUMNS: tuple[Column, ...] = KEPT_COLUMNS + DECODED_COLUMNS + PAIRING_COLUMNS

TRANSACTION_COLUMNS: tuple[Column, ...] = TRANSACTION_COMMON + (
    column("id", np.uint16, "ID of the query (RFC 1035 §4.1.1)"),
    column("qtype", np.uint16, "QTYPE of the question (§4.1.2)"),
    column("rcode", np.uint16, "full RCODE of the answer (RFC 6891 §6.1.3); null when unanswered"),
    column("retries", np.uint32, "retransmissions of the query before the answer (or the timeout)"),
    column("duplicate_responses", np.uint32, "responses after the first one"),
    column("truncated", np.bool_, "the answer had TC=1 (§4.1.1); null when unanswered"),
    column("tc_retry_frame", np.uint32, "frame of the TCP query that retried a truncated UDP answer; "
         "null when none"),
    column("ancount", np.uint16, "ANCOUNT of the answer"),
    column("answer_ttl_min", np.uint32, "smallest answer TTL of the answer (§4.1.3)"),
    column("negative_ttl", np.uint32, "negative-caching TTL of the answer (RFC 2308 §5)"),
)
FRAMES.setdefault("dns_messages", MESSAGE_COLUMNS)  # descriptions for ``herdscope export``
FRAMES.setdefault("dns_transactions", TRANSACTION_COLUMNS)


@dataclass(frozen=True)
class Params:
    """Pairing parameters (nanoseconds)."""

    # a response later than this after the transaction's latest query is not its answer; None: no
    # limit, as tshark pairs a response with its query however late
    timeout_ns: int | None = None
    retransmission_window_ns: int = 5_000_000_000  # Wireshark's dns.retransmission_timer default
    # a TCP query at most this long after a truncated UDP answer is its retry over TCP
    tc_retry_window_ns: int = 5_000_000_000


def _answer_limit(params: Params) -> int:
    """``Params.timeout_ns`` for the pairing kernel (no limit: the largest int64)."""
    return np.iinfo(np.int64).max if params.timeout_ns is None else int(params.timeout_ns)


# --- messages -------------------------------------------------------------------------------------

_ARENA_MIN = 1 << 12


def _readonly_view(a: np.ndarray) -> np.ndarray:
    v = np.ascontiguousarray(a).view()
    v.flags.writeable = False
    return v


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only uint8 view: the kernels then compile once for every buffer a set can carry."""
    return _readonly_view(np.asarray(a, dtype=np.uint8))


def _names(name: str, codes: np.ndarray, valid: np.ndarray, table: dict[int, str], prefix: str) -> pl.Series:
    """Code → name through ``table`` (``prefix`` + number when unknown): a name per distinct code,
    then one gather."""
    present = np.flatnonzero(np.bincount(codes[valid], minlength=1)) if valid.any() else np.empty(0, np.int64)
    lut = np.zeros(max(int(codes.max(initial=0)) + 1, 1), np.uint32)
    lut[present] = np.arange(len(present), dtype=np.uint32)
    names = pl.Series(name, [table.get(int(c), f"{prefix}{int(c)}") for c in present], dtype=pl.String)
    return names.gather(series(name, lut[codes], valid))


def _decode_set(ms: MessageSet) -> pl.DataFrame:
    fr = ms.frame
    n = fr.height
    buf = _readonly(ms.buf)
    offset = fr["offset"].to_numpy().astype(np.int64)
    length = fr["length"].to_numpy().astype(np.int64)
    wire = fr["wire_length"].to_numpy().astype(np.int64)
    if n and (offset.min() < 0 or length.min() < 0 or int((offset + length).max()) > buf.shape[0]):
        raise ValueError("message set offsets/lengths fall outside its buffer")
    arrays, out = k.allocate_output(n)  # out: each column by name
    # Names are rarely longer rendered than on the wire: start at that size, grow when needed.
    arena = np.empty(max(_ARENA_MIN, int(np.minimum(length, 256).sum()) + 8 * n), np.uint8)
    first, apos = 0, 0
    while True:
        first, apos = k.decode_all(buf, offset, length, wire, first, arena, apos, *arrays)
        if first >= n:
            break
        grown = np.empty(arena.shape[0] * 2, np.uint8)
        grown[:apos] = arena[:apos]
        arena = grown

    present = out["present"]
    header = (present & k.P_HEADER) != 0
    has_q = (present & k.P_QTYPE) != 0
    edns = (present & k.P_EDNS) != 0
    soa = (present & k.P_SOA) != 0
    flags = out["flags"].astype(np.int32)
    edns_ttl = out["edns_ttl"].astype(np.int64)
    qr = (flags >> 15) & 1 == 1
    opcode = ((flags >> 11) & 0xF).astype(np.uint8)
    rcode = np.where(edns, ((edns_ttl >> 24) << 4) | (flags & 0xF), flags & 0xF).astype(np.uint16)
    negative = header & qr & soa & ((rcode == 3) | ((rcode == 0) & (out["an_qtype"] == 0)))
    error = out["error"]

    def bit(name, b):
        return series(name, ((flags >> b) & 1).astype(np.bool_), header)

    columns = [
        series("id", out["id"], header), series("qr", qr, header), series("opcode", opcode, header),
        _names("opcode_name", opcode, header, OPCODES, "OPCODE"),
        bit("aa", 10), bit("tc", 9), bit("rd", 8), bit("ra", 7), bit("z", 6), bit("ad", 5), bit("cd", 4),
        series("rcode", rcode, header), _names("rcode_name", rcode, header, RCODES, "RCODE"),
        series("qdcount", out["qd"], header), series("ancount", out["an"], header),
        series("nscount", out["ns"], header), series("arcount", out["ar"], header),
        arena_strings("qname", arena, out["qname_start"], out["qname_len"], (present & k.P_QNAME) != 0),
        series("qtype", out["qtype"], has_q), _names("qtype_name", out["qtype"], has_q, QTYPES, "TYPE"),
        series("qclass", out["qclass"], has_q),
        series("answer_ttl_min", out["ttl_min"], (present & k.P_TTL_MIN) != 0),
        series("answers_of_qtype", out["an_qtype"], has_q),
        series("negative_ttl", np.minimum(out["soa_ttl"], out["soa_min"]), negative),
        series("edns", edns, header), series("edns_udp_size", out["edns_size"], edns),
        series("edns_version", ((edns_ttl >> 16) & 0xFF).astype(np.uint8), edns),
        series("edns_do", ((edns_ttl >> 15) & 1).astype(np.bool_), edns),
        enum_from_codes(series("decode_error", (error.astype(np.int64) - 1).clip(0).astype(np.uint32), error > 0),
                        DECODE_ERROR_ENUM),
    ]
    return fr.select([c.name for c in KEPT_COLUMNS]).hstack(columns)


def decode_messages(sets: Sequence[MessageSet]) -> pl.DataFrame:
    """One row per DNS message of ``sets`` (columns: the message-set columns but offset/length,
    then DECODED_COLUMNS), ordered by ``frame_last`` (stream order within a frame)."""
    frames = [_decode_set(s) for s in sets if s.height]
    if not frames:
        return empty_frame(KEPT_COLUMNS + DECODED_COLUMNS)
    if len({tuple(f.schema.items()) for f in frames}) > 1:  # addresses of different captures
        frames = [f.with_columns(pl.col("src", "dst").cast(pl.String)) for f in frames]
    frame = pl.concat(frames, rechunk=False) if len(frames) > 1 else frames[0]
    del frames  # the sets' decoded chunks go once rechunked, not while the rows are gathered
    last = frame["frame_last"].to_numpy()
    if len(last) > 1 and (np.diff(last.astype(np.int64)) < 0).any():
        # one chunk: half the gather's time; in two steps so that the chunks are freed before the gather
        # (on the 10M synth capture's DNS server, 1.5M messages: +380 -> +244-281 MB over the decoding's start)
        frame = frame.rechunk()
        frame = frame[np.argsort(last, kind="stable")]
    return frame


# --- pairing --------------------------------------------------------------------------------------

ROLES = ("request", "retransmission", "answer", "duplicate", "unsolicited")  # dns_kernels.R_*


@dataclass
class _Pairing:
    role: np.ndarray  # per message row: R_* (R_NONE without a header)
    txn: np.ndarray  # per message row: transaction number, -1 for none
    req_row: np.ndarray  # per transaction: row of its first query
    ans_row: np.ndarray  # per transaction: row of its answer, -1 when unanswered
    retries: np.ndarray
    duplicates: np.ndarray


def _address_codes(m: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of src and dst, equal for equal addresses."""
    src, dst = m["src"], m["dst"]
    if not (isinstance(src.dtype, pl.Enum) and src.dtype == dst.dtype):
        values = pl.concat([src.cast(pl.String), dst.cast(pl.String)]).drop_nulls().unique().sort()
        enum = pl.Enum(values)
        src, dst = src.cast(pl.String).cast(enum), dst.cast(pl.String).cast(enum)
    return (src.to_physical().fill_null(-1).to_numpy().astype(np.int64),
            dst.to_physical().fill_null(-1).to_numpy().astype(np.int64))


def _string_buffers(s: pl.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrow offsets (int64, len+1), bytes and validity of a String series."""
    # Arrow's large_string from Polars itself (its oldest compatibility level): pyarrow's cast would
    # import pyarrow.compute (~20 ms of every process that decodes DNS)
    a = s.rechunk().to_arrow(compat_level=pl.CompatLevel.oldest())  # one Array
    _, offsets, data = a.buffers()
    off = np.frombuffer(offsets, np.int64)[a.offset:a.offset + len(a) + 1]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    valid = s.is_not_null().to_numpy()
    # read-only views whatever Arrow handed over, so the kernel has one signature
    return _readonly_view(off), _readonly(raw), np.ascontiguousarray(valid, np.bool_)


def _pair(messages: pl.DataFrame, params: Params) -> _Pairing:
    n = messages.height
    qr_s = messages["qr"]
    has_header = qr_s.is_not_null().to_numpy()
    qr = qr_s.fill_null(False).to_numpy()
    src, dst = _address_codes(messages)
    sport = messages["sport"].to_numpy().astype(np.int64)
    dport = messages["dport"].to_numpy().astype(np.int64)
    keys = np.empty((n, 7), np.int64)  # row-major: one row's key is one cache line in the kernel
    transport = messages["transport"]
    keys[:, 0] = (transport if transport.dtype == TRANSPORTS else transport.cast(pl.String).cast(TRANSPORTS)
                  ).to_physical().to_numpy()
    keys[:, 1] = np.where(qr, dst, src)  # client
    keys[:, 2] = np.where(qr, dport, sport)  # client port
    keys[:, 3] = np.where(qr, src, dst)  # server
    keys[:, 4] = np.where(qr, sport, dport)  # server port
    keys[:, 5] = messages["id"].fill_null(0).to_numpy()
    keys[:, 6] = messages["qtype"].cast(pl.Int64).fill_null(-1).to_numpy()
    del src, dst, sport, dport  # in keys now: 32 bytes a message less while the pairing's own arrays live
    ts = messages["ts_last_ns"].to_numpy().astype(np.int64)
    frame_last = messages["frame_last"].to_numpy().astype(np.int64)
    rows = np.flatnonzero(has_header)
    d_ts, d_fr = np.diff(ts[rows]), np.diff(frame_last[rows])
    if not ((d_ts > 0) | ((d_ts == 0) & (d_fr >= 0))).all():
        rows = rows[np.lexsort((rows, frame_last[rows], ts[rows]))]
    q_off, q_data, q_valid = _string_buffers(messages["qname"])
    role = np.full(n, k.R_NONE, np.int8)
    txn = np.full(n, -1, np.int64)
    m = len(rows)
    txns = np.zeros((k.N_TX, m), np.int64)  # rows k.TX_*: one column per transaction
    n_txn = k.assign_roles(rows.astype(np.int64), keys, q_off, q_data, q_valid, ~qr, ts,
                           int(params.retransmission_window_ns), _answer_limit(params), txn, role, txns)
    p = _Pairing(role, txn, txns[k.TX_REQ_ROW, :n_txn], txns[k.TX_ANS_ROW, :n_txn], txns[k.TX_RETRIES, :n_txn],
                 txns[k.TX_DUPLICATES, :n_txn])
    _answer_questionless(p, keys, ts, txns[k.TX_LAST_QUERY, :n_txn], ~q_valid & (keys[:, 6] < 0), params)
    return p


def _answer_questionless(p: _Pairing, keys, ts, last_query, no_question, params: Params) -> None:
    """A response without a question answers the latest unanswered transaction of its endpoints and
    id (whose latest query is at most ``Params.timeout_ns`` before it, when set)."""
    orphans = np.flatnonzero((p.role == k.R_UNSOLICITED) & no_question)
    open_txns = np.flatnonzero(p.ans_row < 0)
    if len(orphans) == 0 or len(open_txns) == 0:
        return
    by = [f"k{c}" for c in range(6)]
    left = pl.DataFrame({"row": orphans, "ts": ts[orphans], **{b: keys[orphans, c] for c, b in enumerate(by)}})
    req = p.req_row[open_txns]
    right = pl.DataFrame({"txn": open_txns, "ts": last_query[open_txns],
                          **{b: keys[req, c] for c, b in enumerate(by)}})
    hits = (left.sort("ts").join_asof(right.sort("ts"), on="ts", by=by, strategy="backward",
                                      tolerance=params.timeout_ns, check_sortedness=False)
            .filter(pl.col("txn").is_not_null()).unique("txn", keep="first", maintain_order=True))
    rows, txns = hits["row"].to_numpy(), hits["txn"].to_numpy()
    p.role[rows] = k.R_ANSWER
    p.txn[rows] = txns
    p.ans_row[txns] = rows


def _marked(messages: pl.DataFrame, p: _Pairing) -> pl.DataFrame:
    qr = messages["qr"]
    is_query = (qr == False).fill_null(False).to_numpy()  # noqa: E712 (null-aware)
    is_response = qr.fill_null(False).to_numpy()
    return messages.hstack([
        series("retransmission", p.role == k.R_RETRANSMISSION, is_query),
        series("duplicate_response", p.role == k.R_DUPLICATE, is_response),
        series("unsolicited", p.role == k.R_UNSOLICITED, is_response),
    ])


def _transactions(messages: pl.DataFrame, p: _Pairing, params: Params) -> pl.DataFrame:
    answered = p.ans_row >= 0
    req = messages.select(  # the columns first, then the gather (not every message column)
        pl.lit("dns").alias("protocol"), "transport", "flow", pl.col("src").alias("client"),
        pl.col("sport").alias("client_port"), pl.col("dst").alias("server"), pl.col("dport").alias("server_port"),
        pl.when(pl.col("opcode") == 0).then(pl.col("qtype_name")).otherwise(None)
        .fill_null(pl.col("opcode_name")).alias("operation"),
        pl.col("qname").alias("resource"),
        pl.col("frame_last").alias("request_frame"), pl.col("ts_last_ns").alias("request_ts_ns"),
        "id", "qtype")[p.req_row]
    ans = messages.select(
        pl.col("frame_last").alias("response_frame"), pl.col("ts_last_ns").alias("response_ts_ns"),
        pl.col("rcode_name").alias("status"), "rcode", pl.col("tc").alias("truncated"), "ancount",
        "answer_ttl_min", "negative_ttl",
    ).gather(series("ans_row", np.where(answered, p.ans_row, 0), answered))
    t = req.hstack(ans).with_columns(
        (pl.col("response_ts_ns") - pl.col("request_ts_ns")).alias("latency_ns"),
        pl.when(pl.col("rcode").is_not_null()).then(~pl.col("rcode").is_in(list(NON_ERROR_RCODES)))
        .alias("is_error"),
        pl.Series("answered", answered),
        pl.Series("retries", p.retries.astype(np.uint32)),
        pl.Series("duplicate_responses", p.duplicates.astype(np.uint32)),
        pl.Series("_txn", np.arange(len(p.req_row))),
    )
    t = _tc_retries(t, params)
    names = [c.name for c in TRANSACTION_COLUMNS]
    return t.sort("request_ts_ns", "request_frame").select(names)


def mark_messages(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """``messages`` (from :func:`decode_messages`) with PAIRING_COLUMNS added."""
    if messages.height == 0:
        return messages.with_columns(pl.lit(None, pl.Boolean).alias(c.name) for c in PAIRING_COLUMNS)
    return _marked(messages, _pair(messages, params))


def pair_transactions(messages: pl.DataFrame, params: Params = Params()) -> pl.DataFrame:
    """One row per transaction (TRANSACTION_COLUMNS), in order of the first query."""
    if messages.height == 0:
        return empty_frame(TRANSACTION_COLUMNS)
    return _transactions(messages, _pair(messages, params), params)


def messages_and_transactions(messages: pl.DataFrame, params: Params = Params()
                              ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`mark_messages` and :func:`pair_transactions` of ``messages`` with one pairing pass."""
    if messages.height == 0:
        return mark_messages(messages, params), pair_transactions(messages, params)
    p = _pair(messages, params)
    return _marked(messages, p), _transactions(messages, p, params)


def _tc_retries(t: pl.DataFrame, params: Params) -> pl.DataFrame:
    by = ["client", "server", "resource", "qtype"]
    truncated = t.filter(pl.col("truncated").fill_null(False) & (pl.col("transport") == "udp")
                         & pl.col("resource").is_not_null() & pl.col("qtype").is_not_null())
    tcp = t.filter((pl.col("transport") == "tcp") & pl.col("resource").is_not_null()
                   & pl.col("qtype").is_not_null())
    if truncated.height == 0 or tcp.height == 0:
        return t.with_columns(pl.lit(None, pl.UInt32).alias("tc_retry_frame"))
    hits = (truncated.select("_txn", "response_ts_ns", *by).sort("response_ts_ns")
            .join_asof(tcp.select(*by, "request_ts_ns", pl.col("request_frame").alias("tc_retry_frame"))
                       .sort("request_ts_ns"),
                       left_on="response_ts_ns", right_on="request_ts_ns", by=by, strategy="forward",
                       tolerance=int(params.tc_retry_window_ns), check_sortedness=False)
            .select("_txn", "tc_retry_frame"))
    return t.join(hits, on="_txn", how="left")


# --- frames ---------------------------------------------------------------------------------------


def message_sets(cap) -> list[MessageSet]:
    """DNS message sets of a capture: UDP and TCP port 53 (TCP framed by the length prefix)."""
    return protocol_message_sets(cap, PROTOCOL)


@frame_builder("dns_messages")
def _build_messages(cap) -> pl.DataFrame:
    # one pairing pass gives both frames: the transactions are kept for their builder
    messages, transactions = messages_and_transactions(decode_messages(message_sets(cap)))
    cap.set_frame("dns_transactions", transactions)
    return messages


def outcome_rules() -> tuple[str, str]:
    """(what counts as an error, when a query counts as unanswered), from the code tables and Params:
    ``herdscope stats --help`` and the README (analyzer.stats.outcome_rules)."""
    dp = Params()
    late = (f"a response more than {unbroken_duration(dp.timeout_ns)} after the latest query does not count"
            if dp.timeout_ns else
            "an answer counts however late it comes, as in tshark's dns.time and -z\u00a0dns,tree")
    return (f"an answer whose RCODE is not {named_codes(RCODES, NON_ERROR_RCODES)}: NXDOMAIN is an answer "
            f"(the name does not exist), while SERVFAIL, REFUSED, FORMERR, NOTIMP and the rest are errors.",
            f"no response with the query's transport, addresses, ports, id and question before the capture "
            f"ends or the same query opens a new transaction (sent again "
            f"{unbroken_duration(dp.retransmission_window_ns)} or more after the first, Wireshark's "
            f"dns.retransmission_timer; repeats sooner are retries of the same request); {late}.")


@frame_builder("dns_transactions")
def _build_transactions(cap) -> pl.DataFrame:
    built = cap.built_frames()
    if "dns_transactions" in built:
        return built["dns_transactions"]
    if "dns_messages" in built:  # set by someone else: pair it
        return pair_transactions(built["dns_messages"])
    cap.frame("dns_messages")
    return cap.built_frames()["dns_transactions"]
