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
from numba import njit

from ..messages import TRANSPORTS, MessageSet
from .reassembly import build_pieces

FRAMINGS = {"nbss": 0, "record_mark": 1, "length16": 2, "ber": 3}
# Bytes copied per message. SMB2: headers, create contexts and compound elements fit in 8 KiB; the
# data of READ/WRITE does not need copying (a compound element past 8 KiB is decoded as truncated).
DEFAULT_MAX_COPY = {"nbss": 8192, "record_mark": 1 << 20, "length16": 65537, "ber": 1 << 20}
MAX_RECORD = 16 << 20  # largest Kerberos record / SASL buffer / BER message taken as plausible

NBSS_SESSION_MESSAGE = 0x00
NBSS_KEEP_ALIVE = 0x85


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _locate(p_start, lo, hi, x):
    """Largest k in [lo, hi) with p_start[k] <= x, or lo - 1."""
    a, b = lo, hi
    while a < b:
        m = (a + b) // 2
        if p_start[m] <= x:
            a = m + 1
        else:
            b = m
    return a - 1


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _byte(buf, p_start, p_avail, p_off, lo, hi, x):
    k = _locate(p_start, lo, hi, x)
    if k < lo or x >= p_avail[k]:
        return -1
    return np.int64(buf[p_off[k] + (x - p_start[k])])


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _read(buf, p_start, p_avail, p_off, lo, hi, x, n):
    """n bytes at x as a big-endian integer, or -1 when any is missing."""
    v = np.int64(0)
    for k in range(n):
        b = _byte(buf, p_start, p_avail, p_off, lo, hi, x + k)
        if b < 0:
            return -1
        v = (v << 8) | b
    return v


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _header(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
    """(header length, body length, message offset from pos, emit) or hdr < 0 when not a header."""
    if kind == 0:  # nbss
        t = _byte(buf, p_start, p_avail, p_off, lo, hi, pos)
        length = _read(buf, p_start, p_avail, p_off, lo, hi, pos + 1, 3)
        if t < 0 or length < 0:
            return -1, 0, 0, False
        if t == NBSS_SESSION_MESSAGE:
            return 4, length, 4, True
        if t == NBSS_KEEP_ALIVE or 0x81 <= t <= 0x84:
            return 4, length & 0x1FFFF, 4, False
        return -1, 0, 0, False
    if kind == 1:  # record mark
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos, 4)
        if v < 0 or v & 0x80000000 or v > MAX_RECORD:
            return -1, 0, 0, False
        return 4, v, 4, True
    if kind == 2:  # length16
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos, 2)
        if v < 12:
            return -1, 0, 0, False
        return 2, v, 2, True
    # ber
    b0 = _byte(buf, p_start, p_avail, p_off, lo, hi, pos)
    b1 = _byte(buf, p_start, p_avail, p_off, lo, hi, pos + 1)
    if b0 < 0 or b1 < 0:
        return -1, 0, 0, False
    if b0 == 0x30:
        if b1 < 0x80:
            return 2, b1, 0, True
        nlen = b1 & 0x7F
        if nlen == 0 or nlen > 4:
            return -1, 0, 0, False
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos + 2, nlen)
        if v < 0 or v > MAX_RECORD:
            return -1, 0, 0, False
        return 2 + nlen, v, 0, True
    if 0x14 <= b0 <= 0x17 and b1 == 0x03:  # TLS record (StartTLS or LDAPS): CCS, alert, handshake, data
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos + 3, 2)
        if v < 0:
            return -1, 0, 0, False
        return 5, v, 0, True
    v = _read(buf, p_start, p_avail, p_off, lo, hi, pos, 4)  # SASL security layer buffer
    if v <= 0 or v > MAX_RECORD:
        return -1, 0, 0, False
    return 4, v, 0, True


@njit(cache=True, _nrt=False)  # allocates nothing: no refcounting of array args
def _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
    """A stricter test used to resynchronise: does a message plausibly start at pos?"""
    if kind == 0:
        if _byte(buf, p_start, p_avail, p_off, lo, hi, pos) != 0:
            return False
        m = _byte(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        return ((m == 0xFE or m == 0xFF or m == 0xFD or m == 0xFC)
                and _read(buf, p_start, p_avail, p_off, lo, hi, pos + 5, 3) == 0x534D42)
    if kind == 1:
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos, 4)
        t = _byte(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        return 0 <= v <= MAX_RECORD and (0x6A <= t <= 0x6E or t == 0x7E)
    if kind == 2:
        v = _read(buf, p_start, p_avail, p_off, lo, hi, pos, 2)
        flags_hi = _byte(buf, p_start, p_avail, p_off, lo, hi, pos + 4)
        qd = _read(buf, p_start, p_avail, p_off, lo, hi, pos + 6, 2)
        return v >= 12 and flags_hi >= 0 and ((flags_hi >> 3) & 0xF) in (0, 4, 5) and 0 <= qd <= 1
    hdr, body, _, _ = _header(3, buf, p_start, p_avail, p_off, lo, hi, pos)
    if hdr < 0:
        return False
    if _byte(buf, p_start, p_avail, p_off, lo, hi, pos) != 0x30:
        return True  # TLS / SASL candidates are accepted as they are
    return _byte(buf, p_start, p_avail, p_off, lo, hi, pos + hdr) == 0x02  # messageID INTEGER


@njit(cache=True)
def frame_messages(kind, buf, p_dir, p_start, p_end, p_avail, p_off, p_frame, p_ts, dir_lo, dir_hi,
                   stream_end, verify_first, max_copy, out_buf):
    """Frame every direction. dir_lo/dir_hi: piece index range per direction (sorted by start)."""
    n_dirs = dir_lo.shape[0]
    cap = p_dir.shape[0] * 2 + 16
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
    for d in range(n_dirs):
        lo, hi = dir_lo[d], dir_hi[d]
        if lo >= hi:
            continue
        end = stream_end[d]
        pos = p_start[lo]
        need_check = verify_first[d]
        while pos < end:
            hdr, body, moff, emit = np.int64(-1), np.int64(0), np.int64(0), False
            if not need_check or _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, pos):
                hdr, body, moff, emit = _header(kind, buf, p_start, p_avail, p_off, lo, hi, pos)
            need_check = False
            if hdr < 0:
                # resynchronise at the next piece that starts a plausible message
                k = _locate(p_start, lo, hi, pos) + 1
                while k < hi and not _looks_like_start(kind, buf, p_start, p_avail, p_off, lo, hi, p_start[k]):
                    k += 1
                if k >= hi:
                    skipped[d] += end - pos
                    gave_up[d] = True
                    break
                skipped[d] += p_start[k] - pos
                resyncs[d] += 1
                pos = p_start[k]
                continue
            total = hdr + body
            if emit:
                if nm >= cap:
                    break
                mstart = pos + moff
                mlen = total - moff
                # copy the available prefix, at most max_copy bytes
                copied = np.int64(0)
                x = mstart
                limit = mstart + min(mlen, max_copy)
                while x < limit:
                    k = _locate(p_start, lo, hi, x)
                    if k < lo or x >= p_avail[k]:
                        break
                    y = min(p_avail[k], limit)
                    src = p_off[k] + (x - p_start[k])
                    out_buf[used + copied:used + copied + (y - x)] = buf[src:src + (y - x)]
                    copied += y - x
                    x = y
                # every byte captured? (checked past the copy limit without copying)
                whole = x >= mstart + mlen or x >= limit
                while whole and x < mstart + mlen:
                    k = _locate(p_start, lo, hi, x)
                    if k < lo or x >= p_avail[k]:
                        whole = False
                    else:
                        x = p_avail[k]
                kf = _locate(p_start, lo, hi, pos)
                last = min(pos + total, end) - 1
                kl = _locate(p_start, lo, hi, last)
                m_dir[nm] = d
                m_stream[nm] = pos
                m_off[nm] = used
                m_len[nm] = copied
                m_wire[nm] = mlen
                m_ff[nm] = p_frame[kf]
                m_fl[nm] = p_frame[kl]
                m_tf[nm] = p_ts[kf]
                m_tl[nm] = p_ts[kl]
                m_all[nm] = whole and x >= mstart + mlen
                used += copied
                nm += 1
            pos += total
    return (m_dir[:nm], m_stream[:nm], m_off[:nm], m_len[:nm], m_wire[:nm], m_ff[:nm], m_fl[:nm], m_tf[:nm],
            m_tl[:nm], m_all[:nm], resyncs, skipped, gave_up, used)


def _payload_segments(cap) -> pl.DataFrame:
    """Segments that can carry stream bytes (payload, or a SYN: it fixes the stream origin), with the
    packet columns reassembly needs, sorted by direction then capture order. Built once per capture
    and shared by every framing."""
    def build():
        seg = cap.frame("tcp_segments")
        seg = seg.filter((pl.col("seglen") > 0) | ((pl.col("tcp_flags") & 0x02) != 0)).select(
            "frame", "ts_ns", "conn", "from_client", "tcp_flags",
            (pl.col("conn").cast(pl.Int64) * 2 + (~pl.col("from_client")).cast(pl.Int64)).alias("dir"))
        # frame numbers are row positions in packets (1-based): a gather, not a join
        cols = cap.packets.select("seq", "payload_len", "payload_caplen",
                                  "payload_offset")[(seg["frame"].cast(pl.Int64) - 1).to_numpy()]
        return pl.concat([seg, cols], how="horizontal").sort("dir", "frame")
    return cap.memo("tcp_payload_segments", build)


def tcp_messages(cap, framing: str, service_ports: set[int], *, max_copy: int | None = None) -> list[MessageSet]:
    """Messages of the TCP connections to or from ``service_ports``, framed with ``framing``."""
    kind = FRAMINGS[framing]
    max_copy = DEFAULT_MAX_COPY[framing] if max_copy is None else max_copy
    conns = cap.frame("connections")
    ports = pl.Series(sorted(service_ports), dtype=pl.UInt16).implode()
    wanted = conns.filter(pl.col("server_port").is_in(ports) | pl.col("client_port").is_in(ports))
    if wanted.height == 0:
        return []
    conn_ids = wanted["conn"].implode()
    segs = _payload_segments(cap).filter(pl.col("conn").is_in(conn_ids))
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
    p_dir, p_start, p_end, p_avail, p_off, p_frame, p_ts, stream_end, hole_bytes, uncaptured, dup, conflict = built
    order = np.lexsort((p_start, p_dir))
    p_dir, p_start, p_end, p_avail, p_off, p_frame, p_ts = (a[order] for a in
                                                            (p_dir, p_start, p_end, p_avail, p_off, p_frame, p_ts))
    dir_lo = np.searchsorted(p_dir, np.arange(n_dirs), side="left").astype(np.int64)
    dir_hi = np.searchsorted(p_dir, np.arange(n_dirs), side="right").astype(np.int64)
    saw_syn = segs.group_by("dir").agg(((pl.col("tcp_flags") & 0x02) != 0).any().alias("syn"))
    syn_by_dir = dict(zip(saw_syn["dir"].to_list(), saw_syn["syn"].to_list()))
    verify_first = np.array([not syn_by_dir.get(int(d), False) for d in dirs.to_list()], np.bool_)
    capacity = int(np.minimum(p_avail - p_start, max_copy).clip(min=0).sum()) + 16
    out_buf = np.empty(capacity, np.uint8)
    (m_dir, m_stream, m_off, m_len, m_wire, m_ff, m_fl, m_tf, m_tl, m_all, resyncs, skipped, gave_up,
     used) = frame_messages(kind, cap.buf, p_dir, p_start, p_end, p_avail, p_off, p_frame, p_ts, dir_lo, dir_hi,
                            stream_end, verify_first, max_copy, out_buf)
    dir_values = dirs.to_numpy()[m_dir]
    msgs = pl.DataFrame({
        "conn": (dir_values // 2).astype(np.uint32), "from_client": (dir_values % 2) == 0,
        "frame_first": m_ff.astype(np.uint32), "frame_last": m_fl.astype(np.uint32),
        "ts_first_ns": m_tf, "ts_last_ns": m_tl, "offset": m_off,
        "length": m_len.astype(np.uint32), "wire_length": m_wire.astype(np.uint32),
        "stream_offset": m_stream, "complete": m_all,
    })
    msgs = msgs.join(wanted.select("conn", "client", "client_port", "server", "server_port"), on="conn", how="left")
    frame = msgs.select(
        pl.lit("tcp").cast(TRANSPORTS).alias("transport"), pl.col("conn").alias("flow"), "from_client",
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
    })
    return [MessageSet(frame, out_buf[:used], stats)] if frame.height else []
