"""Walking, decoding and address interning in one pass: the record walkers (records.py), the header
decoder (headers.py) and the address table (intern.py) take turns on batches of :data:`WALK_BATCH`
records.

Walking is a chain of dependent reads through the file (each record's length says where the next one
starts); the walkers prefetch the bytes ahead of them, and decoding the records right after walking
them reads their headers from cache instead of from memory a second time. The 128-bit addresses only
live in a batch-sized scratch until they are interned, instead of 33 bytes a packet for the chunk.

**Reading in part** (``partial``: one partition of a capture, ``analyzer.partitions``): every record is
walked (its length leads to the next, and the walkers' counts and state are the whole file's), but
only the records ``keep`` names become rows, moved down over the others before anything is decoded or
interned (:func:`_kept_rows`); each row's frame number goes to ``row_frames``, and (frame, ts_ns) of
every record ``timed`` names to ``timed_frames`` / ``timed_ts``. A chunk then ends after ``capacity``
records walked, however few rows they left. ``keep`` and ``timed`` are indexed by the record's number
in the file - 1 (``first_record`` at row ``first``); a record beyond their ends is neither.
"""
import numpy as np

from ..jit import njit
from . import records as rk
from .headers import LINKTYPE_NOT_PACKET, N_FIELDS, AddressScratch, decode_block
from .intern import intern_both_kernel

WALK_BATCH = 256  # records walked before they are decoded: their bytes (~256 x 1.5 KB at most) stay in L2
STOP_TABLE_FULL = 100  # the address table may not hold another batch: grow it and call again from the row returned


@njit(cache=True)
def _address_scratch():
    """A batch's addresses until they are interned (headers.ADDRESS_FIELDS)."""
    return AddressScratch(np.empty(WALK_BATCH, np.uint64), np.empty(WALK_BATCH, np.uint64),
                          np.empty(WALK_BATCH, np.uint64), np.empty(WALK_BATCH, np.uint64),
                          np.empty(WALK_BATCH, np.uint8))


@njit(cache=True)
def _intern_batch(scratch, lo, hi, table, src_ids, dst_ids):
    intern_both_kernel(scratch.src_hi, scratch.src_lo, scratch.dst_hi, scratch.dst_lo, scratch.family, 0, hi - lo,
                       table.slots, table.addr_hi, table.addr_lo, table.addr_fam, table.count,
                       src_ids[lo:hi], dst_ids[lo:hi])


@njit(cache=True)
def _kept_rows(recs, lo, hi, record, keep, timed, row_frames, timed_frames, timed_ts, n_timed):
    """Rows ``lo``..``hi`` of ``recs`` (just walked; the first is record number ``record`` - 1 of the
    file): the timed ones noted, the kept ones moved down to ``lo``.. in order. Returns (the row after
    the last kept, the timed count)."""
    j = lo
    for i in range(lo, hi):
        r = record + (i - lo)
        if r < timed.shape[0] and timed[r]:
            timed_frames[n_timed] = r + 1
            timed_ts[n_timed] = recs.ts_ns[i]
            n_timed += 1
        if r < keep.shape[0] and keep[r]:
            if j != i:
                recs.data_off[j] = recs.data_off[i]
                recs.caplen[j] = recs.caplen[i]
                recs.wirelen[j] = recs.wirelen[i]
                recs.ts_ns[j] = recs.ts_ns[i]
                recs.iface[j] = recs.iface[i]
                recs.kind[j] = recs.kind[i]
            row_frames[j] = r + 1
            j += 1
    return j, n_timed


@njit(cache=True, inline="always")
def _table_full(table):
    return table.count[0] + 2 * WALK_BATCH > table.addr_hi.shape[0]


@njit(cache=True)
def read_pcap(buf, off, big_endian, nanosecond, record_header_len, snaplen, linktype, recs, hdr, first, table,
              src_ids, dst_ids, state, counts, part):
    """Walk and decode classic pcap records from ``off`` into rows ``first``.. of ``recs``, ``hdr`` and the
    address ids. Returns (index after the last row filled, next_offset, stop, records walked in the
    chunk, timed count) as :func:`records.walk_pcap`, or with :data:`STOP_TABLE_FULL`. ``part``:
    :func:`part_arrays` (reading in part, module doc)."""
    capacity = recs.data_off.shape[0]
    linktype_of = np.full(capacity, linktype, np.int32)
    scratch = _address_scratch()
    fields = np.zeros(N_FIELDS, np.int64)
    partial, keep, timed, first_record, walked, row_frames, timed_frames, timed_ts, n_timed = part
    n = first
    stop = rk.STOP_FULL
    while (walked if partial else n) < capacity:
        if _table_full(table):
            return n, off, STOP_TABLE_FULL, walked, n_timed
        m, off, stop = rk.walk_pcap(buf, off, big_endian, nanosecond, record_header_len, snaplen, recs, n,
                                    n + min(WALK_BATCH, capacity - (walked if partial else n)), state, counts)
        if partial:
            record, walked = first_record + walked, walked + (m - n)
            m, n_timed = _kept_rows(recs, n, m, record, keep, timed, row_frames, timed_frames, timed_ts, n_timed)
        decode_block(buf, recs, n, m, linktype_of, hdr, scratch, fields)
        _intern_batch(scratch, n, m, table, src_ids, dst_ids)
        n = m
        if stop != rk.STOP_FULL:
            break
    return n, off, stop, (walked if partial else n), n_timed


@njit(cache=True)
def read_pcapng(buf, off, recs, hdr, first, table, src_ids, dst_ids, ifaces, state, counts, part):
    """Walk and decode pcapng blocks from ``off`` as :func:`read_pcap`; a record that is not a packet
    (custom block, journal entry) gets a row that decodes as NOT_PACKET."""
    capacity = recs.data_off.shape[0]
    linktype_of = np.empty(capacity, np.int32)
    scratch = _address_scratch()
    fields = np.zeros(N_FIELDS, np.int64)
    partial, keep, timed, first_record, walked, row_frames, timed_frames, timed_ts, n_timed = part
    n = first
    stop = rk.STOP_FULL
    while (walked if partial else n) < capacity:
        if _table_full(table):
            return n, off, STOP_TABLE_FULL, walked, n_timed
        m, off, stop = rk.walk_pcapng(buf, off, recs, n, n + min(WALK_BATCH, capacity - (walked if partial else n)),
                                      ifaces, state, counts)
        if partial:
            record, walked = first_record + walked, walked + (m - n)
            m, n_timed = _kept_rows(recs, n, m, record, keep, timed, row_frames, timed_frames, timed_ts, n_timed)
        for i in range(n, m):
            if recs.kind[i] == rk.KIND_PACKET:
                linktype_of[i] = ifaces.linktype[recs.iface[i]]
            else:
                linktype_of[i] = LINKTYPE_NOT_PACKET
        decode_block(buf, recs, n, m, linktype_of, hdr, scratch, fields)
        _intern_batch(scratch, n, m, table, src_ids, dst_ids)
        n = m
        if stop != rk.STOP_FULL:
            break
    return n, off, stop, (walked if partial else n), n_timed


@njit(cache=True)
def read_rows(buf, recs, hdr, first, end, linktype_of, table, src_ids, dst_ids):
    """Decode rows ``first``..``end`` of ``recs``, records walked already (a part read from a record
    index, ``analyzer.record_index``: no walk), as :func:`read_pcap` decodes what it walks. Returns
    (the row after the last decoded, :data:`records.STOP_FULL` or :data:`STOP_TABLE_FULL`: grow the
    address table and call again from that row). The caller checked every row's bytes lie in ``buf``."""
    scratch = _address_scratch()
    fields = np.zeros(N_FIELDS, np.int64)
    n = first
    while n < end:
        if _table_full(table):
            return n, STOP_TABLE_FULL
        m = min(n + WALK_BATCH, end)
        decode_block(buf, recs, n, m, linktype_of, hdr, scratch, fields)
        _intern_batch(scratch, n, m, table, src_ids, dst_ids)
        n = m
    return n, rk.STOP_FULL
