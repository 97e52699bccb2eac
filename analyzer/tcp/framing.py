"""Message framing over reassembled TCP streams, and :func:`tcp_messages` for the decoders.

Framings (the ``framing`` argument):
- ``"nbss"``: NetBIOS session service header, 1-byte type + 3-byte length (RFC 1002 §4.3.1; SMB2 over
  direct TCP, MS-SMB2 §2.1). Session messages (type 0) are messages; keep-alives and session
  request/response packets are skipped. The message starts after the 4-byte header.
- ``"record_mark"``: Kerberos over TCP, 4-byte length whose high bit is reserved (RFC 4120 §7.2.2).
  The message starts after the mark.
- ``"length16"``: DNS over TCP, 2-byte length prefix (RFC 1035 §4.2.2). The message starts after it.
- ``"ber"``: LDAP, one BER TLV per LDAPMessage (RFC 4511 §5.1). The message includes its tag and length.
  Streams that are not BER are framed too so the decoder can count them as opaque: TLS records (5-byte
  header, content types 20-23) and SASL security-layer buffers (4-byte length, RFC 4422 §3.7); those messages start at
  their own header.
- ``"rpc_record_mark"``: ONC-RPC over TCP (RFC 5531 §11): a record is one or more fragments, each a
  4-byte mark (high bit: last fragment of the record; low 31 bits: fragment length) and its bytes; the
  message is the concatenation of the fragments' bytes, assembled into a contiguous copy (the marks
  left out). ``frame_first`` is the segment of the first mark, ``frame_last`` that of the record's last
  byte. Hostile input: a fragment longer than :data:`MAX_RPC_FRAGMENT`, a record longer than
  :data:`MAX_RPC_MESSAGE` or with more than :data:`MAX_RPC_FRAGMENTS` fragments (zero-length ones
  count) ends the record there; a record whose last fragment never comes (the stream ends, or a mark
  falls into a gap) is a message with ``complete`` False, and framing goes on after it only where an
  RPC call or reply plausibly starts (RFC 5531 §9: msg_type CALL with rpcvers 2, or REPLY): right
  after it, or else it resynchronises at the next segment that starts like one. Kerberos's
  ``"record_mark"`` (one fragment, the high bit reserved) is a framing of its own.
- ``"http"``: HTTP/1.x (RFC 9112): a message is its start line, header fields, the empty line and
  the body (§6.3: chunked, Content-Length, none for 1xx/204/304 and for requests without either, to
  the end of the stream for other responses); see :func:`analyzer.tcp.framing_http.http_message` for the bounds.

Messages split over many segments and many messages in one segment both work. Only the first
``max_copy`` bytes of a message are copied into the message buffer (``length``); ``wire_length`` keeps
the full size, so a 1 MiB SMB2 WRITE costs the decoder its header, not its data. After a gap (bytes
never captured) framing goes on where the lengths say the next message starts; when a header itself is
missing or makes no sense, it resynchronises at the next segment that looks like a message start for
the protocol, or gives up on the rest of that direction (counted in the direction stats).
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ..jit import njit
from ..message_set import TRANSPORTS, MessageSet
from .framing_http import http_message, http_start
from .reassembly import build_pieces
from .stream_bytes import byte_at, captured_until, locate, read_be

FRAMINGS = {"nbss": 0, "record_mark": 1, "length16": 2, "ber": 3, "rpc_record_mark": 4, "http": 5}
RPC_RECORD_MARK = FRAMINGS["rpc_record_mark"]
HTTP = FRAMINGS["http"]
# Bytes copied per message. SMB2: headers, create contexts and compound elements fit in 8 KiB; the
# data of READ/WRITE does not need copying (a compound element past 8 KiB is decoded as truncated).
# ONC-RPC: the call/reply header (credentials and verifier at most 400 bytes each, RFC 5531 §8.2) and
# the procedure's arguments fit in 64 KiB; NFS READ/WRITE data past it is not copied.
# HTTP: the header block (Apache's default limits: 100 fields of at most 8190 bytes) and a body's start.
DEFAULT_MAX_COPY = {"nbss": 8192, "record_mark": 1 << 20, "length16": 65537, "ber": 1 << 20,
                    "rpc_record_mark": 64 << 10, "http": 64 << 10}
MAX_RECORD = 16 << 20  # largest Kerberos record / SASL buffer / BER message taken as plausible
# ONC-RPC record marking (RFC 5531 §11)
RPC_LAST_FRAGMENT = 0x80000000  # the mark's high bit: this fragment ends the record
RPC_FRAGMENT_LENGTH = 0x7FFFFFFF  # the mark's low 31 bits: the fragment's length
MAX_RPC_FRAGMENT = MAX_RECORD  # longest fragment taken as plausible
MAX_RPC_MESSAGE = MAX_RECORD  # longest record (sum of its fragments) taken as plausible
MAX_RPC_FRAGMENTS = 4096  # most fragments in one record (1 MiB NFS WRITEs in 8 KiB fragments are 128)
RPC_CALL, RPC_REPLY = 0, 1  # RFC 5531 §9 msg_type
RPC_VERSION = 2  # RFC 5531 §9 rpcvers of a CALL
# why frame_messages stopped early (the caller retries with more room)
FULL_NONE, FULL_BUFFER, FULL_MESSAGES = 0, 1, 2

NBSS_SESSION_MESSAGE = 0x00
NBSS_KEEP_ALIVE = 0x85


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _header(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
    """(header length, body length, message offset from pos, emit) or hdr < 0 when not a header."""
    if kind == 0:  # nbss
        t = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos)
        length = read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 1, 3)
        if t < 0 or length < 0:
            return -1, 0, 0, False
        if t == NBSS_SESSION_MESSAGE:
            return 4, length, 4, True
        if t == NBSS_KEEP_ALIVE or 0x81 <= t <= 0x84:
            return 4, length & 0x1FFFF, 4, False
        return -1, 0, 0, False
    if kind == 1:  # record mark
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 4)
        if v < 0 or v & 0x80000000 or v > MAX_RECORD:
            return -1, 0, 0, False
        return 4, v, 4, True
    if kind == 2:  # length16
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 2)
        if v < 12:
            return -1, 0, 0, False
        return 2, v, 2, True
    # ber
    b0 = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos)
    b1 = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 1)
    if b0 < 0 or b1 < 0:
        return -1, 0, 0, False
    if b0 == 0x30:
        if b1 < 0x80:
            return 2, b1, 0, True
        nlen = b1 & 0x7F
        if nlen == 0 or nlen > 4:
            return -1, 0, 0, False
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 2, nlen)
        if v < 0 or v > MAX_RECORD:
            return -1, 0, 0, False
        return 2 + nlen, v, 0, True
    if 0x14 <= b0 <= 0x17 and b1 == 0x03:  # TLS record (StartTLS or LDAPS): CCS, alert, handshake, data
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 3, 2)
        if v < 0:
            return -1, 0, 0, False
        return 5, v, 0, True
    v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 4)  # SASL security layer buffer
    if v <= 0 or v > MAX_RECORD:
        return -1, 0, 0, False
    return 4, v, 0, True


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
    """A stricter test used to resynchronise: does a message plausibly start at pos?"""
    if kind == 0:
        if byte_at(buf, p_start, p_avail, p_off, lo, hi, pos) != 0:
            return False
        m = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        return ((m == 0xFE or m == 0xFF or m == 0xFD or m == 0xFC)
                and read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 5, 3) == 0x534D42)
    if kind == 1:
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 4)
        t = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        return 0 <= v <= MAX_RECORD and (0x6A <= t <= 0x6E or t == 0x7E)
    if kind == 2:
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 2)
        flags_hi = byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        qd = read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 6, 2)
        return v >= 12 and flags_hi >= 0 and ((flags_hi >> 3) & 0xF) in (0, 4, 5) and 0 <= qd <= 1
    if kind == RPC_RECORD_MARK:  # a first fragment holding at least xid and msg_type (RFC 5531 §9)
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, pos, 4)
        if v < 0 or not 8 <= (v & RPC_FRAGMENT_LENGTH) <= MAX_RPC_FRAGMENT:
            return False
        mtype = read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 8, 4)
        if mtype == RPC_CALL:
            return (v & RPC_FRAGMENT_LENGTH) >= 12 and read_be(buf, p_start, p_avail, p_off, lo, hi, pos + 12,
                                                               4) == RPC_VERSION
        return mtype == RPC_REPLY
    if kind == HTTP:
        return http_start(buf, p_start, p_avail, p_off, lo, hi, pos) != 0
    hdr, body, _, _ = _header(3, buf, p_start, p_avail, p_off, lo, hi, pos)
    if hdr < 0:
        return False
    if byte_at(buf, p_start, p_avail, p_off, lo, hi, pos) != 0x30:
        return True  # TLS / SASL candidates are accepted as they are
    return byte_at(buf, p_start, p_avail, p_off, lo, hi, pos + hdr) == 0x02  # messageID INTEGER


@njit(cache=True)  # a slice copy may need the runtime (a temporary when source and target could overlap)
def _copy_span(buf, p_start, p_avail, p_off, lo, hi, x, limit, out_buf, at):
    """Copy the stream bytes [x, limit) to out_buf[at:] while they are captured; the position reached
    (limit, or the first byte missing)."""
    while x < limit:
        k = locate(p_start, lo, hi, x)
        if k < lo or x >= p_avail[k]:
            break
        y = min(p_avail[k], limit)
        src = p_off[k] + (x - p_start[k])
        out_buf[at:at + (y - x)] = buf[src:src + (y - x)]
        at += y - x
        x = y
    return x


@njit(cache=True)
def _rpc_record(buf, p_start, p_avail, p_off, lo, hi, pos, end, max_copy, out_buf, at):
    """One ONC-RPC record starting at stream position pos (RFC 5531 §11), its fragments' bytes copied
    to out_buf[at:] (at most max_copy, and only while contiguous). Returns (stream bytes the record
    spans, -1 when no record mark starts at pos; message bytes on the wire; bytes copied; every byte
    captured and the last fragment seen; the last fragment seen (False: the record stopped unfinished,
    so what follows is not known to start a record); out of room in out_buf)."""
    x = pos
    wire = np.int64(0)
    copied = np.int64(0)
    whole = True
    copying = True
    ended = False
    n_frag = 0
    while x < end:
        v = read_be(buf, p_start, p_avail, p_off, lo, hi, x, 4)
        flen = v & RPC_FRAGMENT_LENGTH
        if v < 0 or flen > MAX_RPC_FRAGMENT or wire + flen > MAX_RPC_MESSAGE or n_frag >= MAX_RPC_FRAGMENTS:
            break  # a mark lost in a gap or implausible: the record ends unfinished here
        body = x + 4
        reached = body
        if copying and copied < max_copy:
            limit = body + min(flen, max_copy - copied)
            if at + copied + (limit - body) > out_buf.shape[0]:
                return 0, 0, 0, False, False, True
            reached = _copy_span(buf, p_start, p_avail, p_off, lo, hi, body, limit, out_buf, at + copied)
            copied += reached - body
            copying = reached >= limit  # after a hole later bytes cannot follow contiguously
        if whole:  # past the copy limit (reached == body) only whether it was captured matters
            whole = captured_until(p_start, p_avail, lo, hi, reached, body + flen) >= body + flen
        wire += flen
        n_frag += 1
        x = body + flen
        if v & RPC_LAST_FRAGMENT:
            ended = True
            break
    if n_frag == 0:
        return -1, 0, 0, False, False, False
    return x - pos, wire, copied, whole and ended, ended, False


@njit(cache=True)
def frame_messages(kind, buf, p_start, p_avail, p_off, p_frame, p_ts, dir_lo, dir_hi, stream_end, verify_first,
                   max_copy, out_buf, msg_cap):
    """Frame every direction. dir_lo/dir_hi: piece index range per direction (sorted by start). Room for
    msg_cap messages and out_buf's bytes; when either runs out framing stops and ``full`` says which
    (FULL_BUFFER / FULL_MESSAGES) so the caller can retry with more."""
    n_dirs = dir_lo.shape[0]
    cap = msg_cap
    m_dir = np.empty(cap, np.int64)
    m_stream = np.empty(cap, np.int64)
    m_off = np.empty(cap, np.int64)
    m_len = np.empty(cap, np.int64)
    m_wire = np.empty(cap, np.int64)
    m_ff = np.empty(cap, np.int64)
    m_fl = np.empty(cap, np.int64)
    m_tf = np.empty(cap, np.int64)
    m_tl = np.empty(cap, np.int64)
    m_all = np.empty(cap, np.bool_)
    resyncs = np.zeros(n_dirs, np.int64)
    skipped = np.zeros(n_dirs, np.int64)
    gave_up = np.zeros(n_dirs, np.bool_)
    nm = 0
    used = np.int64(0)
    full = FULL_NONE
    for d in range(n_dirs):
        lo, hi = dir_lo[d], dir_hi[d]
        if lo >= hi:
            continue
        end = stream_end[d]
        pos = p_start[lo]
        need_check = verify_first[d]
        while pos < end:
            total, mstart, mlen, copied, whole, emit = np.int64(-1), np.int64(0), np.int64(0), np.int64(0), False, False
            ended = True  # the message found ends where its framing says (an RPC record may stop unfinished)
            if not need_check or _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
                if kind == RPC_RECORD_MARK:
                    if nm >= cap:
                        full = FULL_MESSAGES
                        break
                    total, mlen, copied, whole, ended, out_of_room = _rpc_record(
                        buf, p_start, p_avail, p_off, lo, hi, pos, end, max_copy, out_buf, used)
                    if out_of_room:
                        full = FULL_BUFFER
                        break
                    mstart, emit = pos, True
                elif kind == HTTP:
                    total = http_message(buf, p_start, p_avail, p_off, lo, hi, pos, end)
                    mstart, mlen, emit = pos, total, total >= 0
                else:
                    hdr, body, moff, emit = _header(kind, buf, p_start, p_avail, p_off, lo, hi, pos)
                    if hdr >= 0:
                        total, mstart, mlen = hdr + body, pos + moff, hdr + body - moff
            # after an RPC record that stopped unfinished (a fragment or message bound, or a lost mark)
            # its remaining bytes are not known to start a record: the next one must look like a start
            need_check = not ended
            if total < 0:
                # resynchronise at the next piece that starts a plausible message
                k = locate(p_start, lo, hi, pos) + 1
                while k < hi and not _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, p_start[k]):
                    k += 1
                if k >= hi:
                    skipped[d] += end - pos
                    gave_up[d] = True
                    break
                skipped[d] += p_start[k] - pos
                resyncs[d] += 1
                pos = p_start[k]
                need_check = False  # it was just checked
                continue
            if emit:
                if nm >= cap:
                    full = FULL_MESSAGES
                    break
                if kind != RPC_RECORD_MARK:
                    # copy the available prefix, at most max_copy bytes
                    limit = mstart + min(mlen, max_copy)
                    if used + (limit - mstart) > out_buf.shape[0]:
                        full = FULL_BUFFER
                        break
                    x = _copy_span(buf, p_start, p_avail, p_off, lo, hi, mstart, limit, out_buf, used)
                    copied = x - mstart
                    # every byte captured? (checked past the copy limit without copying)
                    whole = x >= limit and captured_until(p_start, p_avail, lo, hi, x, mstart + mlen) >= mstart + mlen
                kf = locate(p_start, lo, hi, pos)
                last = min(pos + total, end) - 1
                kl = locate(p_start, lo, hi, last)
                m_dir[nm] = d
                m_stream[nm] = pos
                m_off[nm] = used
                m_len[nm] = copied
                m_wire[nm] = mlen
                m_ff[nm] = p_frame[kf]
                m_fl[nm] = p_frame[kl]
                m_tf[nm] = p_ts[kf]
                m_tl[nm] = p_ts[kl]
                m_all[nm] = whole
                used += copied
                nm += 1
            pos += total
        if full != FULL_NONE:
            break
    return (m_dir[:nm], m_stream[:nm], m_off[:nm], m_len[:nm], m_wire[:nm], m_ff[:nm], m_fl[:nm], m_tf[:nm],
            m_tl[:nm], m_all[:nm], resyncs, skipped, gave_up, used, full)


def _flipped(ports) -> pl.Expr:
    """Per connection: the "service_port" rule names analyzer.tcp's server the client (it sends to the
    service port and the connection's client does not)."""
    to_server = pl.col("server_port").is_in(ports) & ~(pl.col("client_port").is_in(ports)
                                                      & (pl.col("client_port") < pl.col("server_port")))
    to_client = pl.col("client_port").is_in(ports) & ~(pl.col("server_port").is_in(ports)
                                                      & (pl.col("server_port") < pl.col("client_port")))
    return ~to_server & to_client


def payload_segments(cap) -> pl.DataFrame:
    """Segments that can carry stream bytes (payload, or a SYN: it fixes the stream origin), with the
    packet columns reassembly needs, sorted by direction then capture order. Built once per capture
    and shared by every framing."""
    def build():
        seg = cap.frame("tcp_segments")
        seg = seg.filter((pl.col("seglen") > 0) | ((pl.col("tcp_flags") & 0x02) != 0)).select(
            "frame", "ts_ns", "conn", "from_client", "tcp_flags",
            (pl.col("conn").cast(pl.Int64) * 2 + (~pl.col("from_client")).cast(pl.Int64)).alias("dir"))
        # a gather, not a join: packets is in frame order, so a segment's row is where its frame number
        # sorts in packets' frame column (frame - 1 on a whole capture; not after a --start/--host/--port
        # selection, which keeps some rows only)
        packets = cap.packets
        rows = np.searchsorted(packets["frame"].to_numpy(), seg["frame"].to_numpy())
        cols = packets.select("seq", "payload_len", "payload_caplen", "payload_offset")[rows]
        return pl.concat([seg, cols], how="horizontal").sort("dir", "frame")
    return cap.memo("tcp_payload_segments", build)


TCP_CLIENT_SIDE_RULES = ("service_port", "connection_initiator")  # what TCP can tell without the bytes


def _port_list(service_ports) -> pl.Series:
    """The ports as one list value, what ``is_in`` compares a port column with."""
    return pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()


def _wanted_connections(cap, service_ports, only_conns=None, also_conns=None) -> pl.DataFrame:
    """The rows of ``connections`` :func:`tcp_messages` frames (its ports and connection options)."""
    conns = cap.frame("connections")
    ports = _port_list(service_ports)
    on_port = pl.col("server_port").is_in(ports) | pl.col("client_port").is_in(ports)
    if also_conns is not None:
        on_port = on_port | pl.col("conn").is_in(pl.Series(also_conns, dtype=conns["conn"].dtype).implode())
    wanted = conns.filter(on_port)
    if only_conns is not None:
        wanted = wanted.filter(pl.col("conn").is_in(pl.Series(only_conns, dtype=wanted["conn"].dtype).implode()))
    return wanted


def connection_batches(cap, service_ports: set[int], batch_bytes: int) -> list[np.ndarray]:
    """The connections :func:`tcp_messages` frames for ``service_ports``, in batches (ascending
    connection ids) cut where the running total of their captured payload passes a multiple of
    ``batch_bytes``: the connections of a batch after its first hold less than ``batch_bytes`` (the
    first may hold more); a connection without payload has no messages and joins the batch before
    it. A decoder that frames and decodes batch by batch (``only_conns``), dropping each batch's
    copied bytes before the next, holds one batch's copies at a time, and its messages are the same
    as framed at once (each connection is framed on its own)."""
    wanted = _wanted_connections(cap, service_ports)
    if wanted.height == 0:
        return []
    # lazily, so that of the payload segments only the two columns read are gathered
    per_conn = (payload_segments(cap).lazy().select("conn", "payload_caplen")
                .filter(pl.col("conn").is_in(wanted["conn"].implode()))
                .group_by("conn").agg(pl.col("payload_caplen").fill_null(0).cast(pl.Int64).sum().alias("bytes"))
                .sort("conn").collect())
    ids, sizes = per_conn["conn"].to_numpy(), per_conn["bytes"].to_numpy()
    batch = np.cumsum(sizes) // max(1, batch_bytes)  # a batch per batch_bytes of running total
    cuts = np.flatnonzero(np.diff(batch)) + 1
    return np.split(ids, cuts) if ids.shape[0] else []


def tcp_messages(cap, framing: str, service_ports: set[int], *, max_copy: int | None = None,
                 client_side: str = "service_port", only_conns=None, also_conns=None) -> list[MessageSet]:
    """Messages of the TCP connections to or from ``service_ports``, framed with ``framing``; with
    ``only_conns`` (connection ids), of those connections only (each is framed on its own, so its
    messages are the same either way); ``also_conns``: these connections too, whatever their ports (ones
    a decoder learned from the capture, e.g. an RPC callback channel).

    ``client_side`` decides ``from_client``: "service_port", the side sending to a service port (the
    lower one when both ends use one; the same port at both ends: as "connection_initiator");
    "connection_initiator", the connection's client as analyzer.tcp decides it (the SYN sender; without
    the handshake the receiver of the SYN/ACK, else the higher port)."""
    if client_side not in TCP_CLIENT_SIDE_RULES:
        raise ValueError(f"client_side {client_side!r}: expected one of {', '.join(TCP_CLIENT_SIDE_RULES)}")
    kind = FRAMINGS[framing]
    max_copy = DEFAULT_MAX_COPY[framing] if max_copy is None else max_copy
    wanted = _wanted_connections(cap, service_ports, only_conns, also_conns)
    if wanted.height == 0:
        return []
    conn_ids = wanted["conn"].implode()
    segs = payload_segments(cap).filter(pl.col("conn").is_in(conn_ids))
    if segs.height == 0:
        return []
    dirs = segs["dir"].unique().sort()
    dir_index = {int(d): k for k, d in enumerate(dirs.to_list())}
    dir_id = segs["dir"].replace_strict(dir_index, return_dtype=pl.Int64).to_numpy()
    n_dirs = len(dir_index)
    syn = ((segs["tcp_flags"].to_numpy() & 0x02) != 0)
    built = build_pieces(cap.buf, dir_id, segs["seq"].to_numpy().astype(np.int64), syn,
                         segs["payload_len"].fill_null(0).to_numpy().astype(np.int64),
                         segs["payload_caplen"].fill_null(0).to_numpy().astype(np.int64),
                         segs["payload_offset"].fill_null(0).to_numpy().astype(np.int64),
                         segs["frame"].to_numpy().astype(np.int64), segs["ts_ns"].to_numpy(), n_dirs)
    p_dir, p_start, _, p_avail, p_off, p_frame, p_ts, stream_end, hole_bytes, uncaptured, dup, conflict = built
    order = np.lexsort((p_start, p_dir))
    p_dir, p_start, p_avail, p_off, p_frame, p_ts = (a[order] for a in (p_dir, p_start, p_avail, p_off, p_frame, p_ts))
    dir_lo = np.searchsorted(p_dir, np.arange(n_dirs), side="left").astype(np.int64)
    dir_hi = np.searchsorted(p_dir, np.arange(n_dirs), side="right").astype(np.int64)
    saw_syn = segs.group_by("dir").agg(((pl.col("tcp_flags") & 0x02) != 0).any().alias("syn"))
    syn_by_dir = dict(zip(saw_syn["dir"].to_list(), saw_syn["syn"].to_list()))
    verify_first = np.array([not syn_by_dir.get(int(d), False) for d in dirs.to_list()], np.bool_)
    # room for the usual case (a message or two per segment); when many small messages share a segment
    # it runs out and framing is redone with more: bytes, at once every captured byte plus max_copy (a
    # stream byte is copied at most once, and the room check asks for up to max_copy bytes before the
    # copy finds how many were captured), so one retry always suffices; messages, doubled up to one per
    # 2 captured bytes (the shortest header, BER's, is 2 bytes and every message's header was captured)
    # plus one per segment
    captured = int((p_avail - p_start).clip(min=0).sum())
    most_messages = captured // 2 + p_dir.shape[0] + 16
    most_bytes = captured + max_copy + 16
    capacity = int(np.minimum(p_avail - p_start, max_copy).clip(min=0).sum()) + 16
    msg_cap = p_dir.shape[0] * 2 + 16
    while True:
        out_buf = np.empty(capacity, np.uint8)
        (m_dir, m_stream, m_off, m_len, m_wire, m_ff, m_fl, m_tf, m_tl, m_all, resyncs, skipped, gave_up,
         used, full) = frame_messages(kind, cap.buf, p_start, p_avail, p_off, p_frame, p_ts, dir_lo, dir_hi,
                                      stream_end, verify_first, max_copy, out_buf, msg_cap)
        if full == FULL_BUFFER:
            if capacity >= most_bytes:
                raise AssertionError("framing: more bytes copied than captured")  # cannot happen
            capacity = most_bytes
        elif full == FULL_MESSAGES:
            if msg_cap >= most_messages:
                raise AssertionError("framing: more messages than captured headers")  # cannot happen
            msg_cap = min(msg_cap * 2, most_messages)
        else:
            break
    dir_values = dirs.to_numpy()[m_dir]
    msgs = pl.DataFrame({
        "conn": (dir_values // 2).astype(np.uint32), "from_client": (dir_values % 2) == 0,
        "frame_first": m_ff.astype(np.uint32), "frame_last": m_fl.astype(np.uint32),
        "ts_first_ns": m_tf, "ts_last_ns": m_tl, "offset": m_off,
        "length": m_len.astype(np.uint32), "wire_length": m_wire.astype(np.uint32),
        "stream_offset": m_stream, "complete": m_all,
    })
    flip = _flipped(_port_list(service_ports)) if client_side == "service_port" else pl.lit(False)
    sides = wanted.select("conn", "client", "client_port", "server", "server_port", flip.alias("flip"))
    msgs = msgs.join(sides, on="conn", how="left")
    frame = msgs.select(
        pl.lit("tcp").cast(TRANSPORTS).alias("transport"), pl.col("conn").alias("flow"),
        (pl.col("from_client") != pl.col("flip")).alias("from_client"),
        pl.when(pl.col("from_client")).then(pl.col("client")).otherwise(pl.col("server")).alias("src"),
        pl.when(pl.col("from_client")).then(pl.col("server")).otherwise(pl.col("client")).alias("dst"),
        pl.when(pl.col("from_client")).then(pl.col("client_port")).otherwise(pl.col("server_port")).alias("sport"),
        pl.when(pl.col("from_client")).then(pl.col("server_port")).otherwise(pl.col("client_port")).alias("dport"),
        "frame_first", "frame_last", "ts_first_ns", "ts_last_ns", "offset", "length", "wire_length", "complete",
    )
    stats = pl.DataFrame({
        "conn": (dirs.to_numpy() // 2).astype(np.uint32), "from_client": (dirs.to_numpy() % 2) == 0,
        "stream_bytes": stream_end, "hole_bytes": hole_bytes, "uncaptured_bytes": uncaptured,
        "duplicate_bytes": dup, "conflict_bytes": conflict, "resyncs": resyncs, "skipped_bytes": skipped,
        "gave_up": gave_up,
    }).join(sides.select("conn", "flip"), on="conn", how="left").with_columns(
        (pl.col("from_client") != pl.col("flip")).alias("from_client")).drop("flip")
    return [MessageSet(frame, out_buf[:used], stats)] if frame.height else []
