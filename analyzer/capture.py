"""The ``Capture``: one capture file's bytes and the named frames derived from it.

Frames are computed on first use and kept: ``cap.packets`` reads the file; later layers (TCP
analysis, decoders) add their frames through :meth:`Capture.frame` and a registry of builders, so a
detector asks for ``cap.frame("dns_transactions")`` without knowing what it takes to build it.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from typing import Callable

import numpy as np
import polars as pl

from . import progress
from .ingest import DEFAULT_CHUNK_RECORDS, ChunkReduction, IndexedPart, PacketTables, ReadReport, read_tables
from .joined_map import join
from .kernels.silences import KEEP_EVERY_TIME, thinned_times
from .source import CaptureBytes
from .wide_frames import columns_among

# frame name -> function(capture) -> DataFrame. Later layers register theirs at import time; they are
# imported on the first request for a frame the reader does not make, so reading only packets (export
# --frames packets) pays for neither their import nor their Numba cache loading.
FRAME_BUILDERS: dict[str, Callable[["Capture"], pl.DataFrame]] = {}
# the frames the reader makes (release() keeps them)
READER_FRAMES = ("packets", "tcp_sack", "icmp_errors", "interfaces")
_BUILDER_MODULES = ("analyzer.tcp", "analyzer.decoders.registry", "analyzer.mac_control")


def _load_builders() -> None:
    for module in _BUILDER_MODULES:
        importlib.import_module(module)


def builder_of(name: str) -> Callable[["Capture"], pl.DataFrame]:
    """The function that builds frame ``name`` (KeyError for a name no layer registers)."""
    if name not in FRAME_BUILDERS:
        _load_builders()
    return FRAME_BUILDERS[name]


def frame_builder(name: str):
    """Decorator: register the function that builds frame ``name`` from a Capture."""
    def register(fn):
        FRAME_BUILDERS[name] = fn
        return fn
    return register


class Capture:
    """A capture file read into frames. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike, *, chunk_records: int = DEFAULT_CHUNK_RECORDS,
                 progress: bool | None = None, kept=None, packet_columns: tuple[str, ...] | None = None,
                 silence_ns: int | None = KEEP_EVERY_TIME, reduce: ChunkReduction | None = None,
                 indexed: IndexedPart | None = None, _parts=None):
        self.path = os.fspath(path)
        if _parts is None:
            data, tables = read_tables(self.path, chunk_records=chunk_records, progress=progress, kept=kept,
                                       packet_columns=packet_columns, silence_ns=silence_ns, reduce=reduce,
                                       indexed=indexed)
        else:
            data, tables = _parts
        self._data: CaptureBytes = data
        self._tables: PacketTables = tables
        self._frames: dict[str, pl.DataFrame] = {
            "packets": tables.packets, "tcp_sack": tables.tcp_sack,
            "icmp_errors": tables.icmp_errors, "interfaces": tables.interfaces,
        }
        self._memo: dict[str, object] = {}  # intermediate tables shared by builders (not frames)
        # what builds a frame or memo holds its key's lock meanwhile, so that steps run at once
        # (analyzer.threads) asking for the same one build it once ("frame:NAME" / "memo:KEY" -> lock)
        self._building: dict[str, threading.RLock] = {}
        self._building_lock = threading.Lock()  # held while a key's lock is looked up or made
        self._narrowed: tuple[str, ...] | None = None  # the packet columns narrow_packets kept
        self._released = False  # release() narrowed packets: nothing more can be built
        # read with only these packet columns (read_tables(columns=)): nothing can be built either
        self.columns: tuple[str, ...] | None = tuple(self._frames["packets"].columns) if packet_columns else None
        self._freed: set[str] = set()  # frames built, then freed by release() / drop()
        self._planned: dict[str, frozenset[str]] = {}  # frame -> what will be read of it (plan_columns)
        self._when_built: dict[str, list[Callable[[pl.DataFrame], None]]] = {}  # frame -> calls (when_built)
        # the packets read, when ``packets`` holds fewer rows: thinned (thin_packets) or read through a
        # reduction (None: neither)
        self._packet_count: int | None = tables.rows
        # what decided, as the packets were read, what to keep of each chunk of them (read_tables(reduce=));
        # nothing can be built of such a capture: its packets are what the reduction made of them
        self.reduction: ChunkReduction | None = reduce
        if reduce is not None:
            self._released = True
        self.reports: list[tuple[str, ReadReport]] = [(self.path, tables.report)]
        self.files: list[str] = [self.path]
        # what a reader of the results should know about how the files were joined (open_captures)
        self.warnings: list[str] = []
        self.selection: dict | None = None  # what --start/--end/--host/--port kept (analyzer/selection.py)
        # (file, frames before it in this capture's numbering, its frame count), in numbering order
        self.pieces: list[tuple[str, int, int]] = [(self.path, 0, self.packet_count)]
        # read in part (ReadPart): (frame, ts_ns) of the selected packets of the whole capture, every
        # one, or as many as its span and silences of ReadPart.silence_ns need (analyzer.kernels.silences)
        self.whole_times: pl.DataFrame | None = tables.times

    # -- bytes ---------------------------------------------------------------------------------
    @property
    def buf(self) -> np.ndarray:
        """The capture's bytes (uint8, read-only); ``payload_offset`` columns index into it."""
        return self._data.buf

    def bytes_at(self, offset: int, length: int) -> bytes:
        end = min(len(self.buf), offset + max(0, length))
        return bytes(self.buf[offset:end])

    # -- frames --------------------------------------------------------------------------------
    @property
    def packets(self) -> pl.DataFrame:
        return self._frames["packets"]

    @property
    def packet_count(self) -> int:
        """How many packets the capture holds (after a selection, the selected ones): the rows of
        ``packets``, or as many as it had before :meth:`thin_packets` or as were read through a
        reduction (``read_tables(reduce=)``)."""
        return self.packets.height if self._packet_count is None else self._packet_count

    @property
    def address_dtype(self) -> pl.DataType:
        """The Enum the capture's addresses are in (``src`` and ``dst`` of ``packets``, when it has them;
        else the reader's, which every reading and joining of files sets)."""
        return self._tables.address_dtype if "src" not in self.packets.columns else self.packets.schema["src"]

    @property
    def report(self) -> ReadReport:
        return self._tables.report

    @property
    def file_format(self):
        return self._tables.format

    @property
    def section_info(self) -> dict[str, str]:
        return self._tables.section_info

    def _lock_of(self, key: str) -> threading.RLock:
        """The lock held while the frame or memo ``key`` is built (made on first use)."""
        with self._building_lock:
            return self._building.setdefault(key, threading.RLock())

    def frame(self, name: str) -> pl.DataFrame:
        """A named frame, built on first request (once, when threads ask for it at once)."""
        built = self._frames.get(name)
        if built is not None:
            return built
        with self._lock_of(f"frame:{name}"):
            return self._build(name)

    def _build(self, name: str) -> pl.DataFrame:
        """:meth:`frame`'s work, its lock held."""
        if name not in self._frames:
            if self._released:
                raise RuntimeError(f"frame {name!r} asked for after Capture.release() freed what builds it")
            if self.columns is not None:
                raise RuntimeError(f"frame {name!r} asked of a capture read with only the packet columns "
                                   f"{', '.join(self.columns)}")
            if name not in FRAME_BUILDERS:
                _load_builders()
            builder = FRAME_BUILDERS.get(name)
            if builder is None:
                raise KeyError(f"no frame named {name!r}; known: {', '.join(self.frame_names())}")
            progress.frame_stage(name)
            try:
                self._frames[name] = builder(self)
            except pl.exceptions.ColumnNotFoundError as exc:
                if self._narrowed is None:
                    raise
                raise RuntimeError(f"frame {name!r} reads columns narrowed away ({exc}; packets kept "
                                   f"{', '.join(self._narrowed)}): analyzer.packet_readers must build what "
                                   f"reads them first") from exc
            for call in self._when_built.pop(name, ()):
                call(self._frames[name])
        return self._frames[name]

    def when_built(self, name: str, call: Callable[[pl.DataFrame], None]) -> None:
        """``call(frame)`` with frame ``name`` as its builder made it, whole, in the thread that built it
        (a frame is never changed in place: what narrows or drops it later leaves this one whole); at
        once, with the frame as it is now, if it is built already. What a reader takes of a frame built
        among the others (a scan's incident linker, of the DNS transactions)."""
        with self._lock_of(f"frame:{name}"):
            if name not in self._frames:
                self._when_built.setdefault(name, []).append(call)
                return
        call(self._frames[name])

    def built(self, name: str) -> bool:
        """Whether frame ``name`` is built (or was set) already."""
        return name in self._frames

    def memo(self, key: str, build: Callable[[], object]):
        """An intermediate result built once per capture (e.g. the TCP payload segments every framing
        starts from); not a frame, so export and frame_names() do not see it. Built once when threads
        ask for it at once."""
        if key in self._memo:
            return self._memo[key]
        with self._lock_of(f"memo:{key}"):
            if key not in self._memo:
                self._memo[key] = build()
            return self._memo[key]

    def set_frame(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame

    def restrict_packets(self, kept: pl.DataFrame) -> None:
        """Keep only these rows of ``packets`` (and their SACK blocks and ICMP errors) before anything
        is derived from them: the selection of analyzer/selection.py. Frame numbers stay the file's."""
        derived = set(self._frames) - set(READER_FRAMES)
        if derived or self._memo:
            raise RuntimeError(f"restrict_packets after frames were derived ({', '.join(sorted(derived))})")
        frames = kept.select("frame")
        self._frames["packets"] = kept
        for name in ("tcp_sack", "icmp_errors"):
            self._frames[name] = self._frames[name].join(frames, on="frame", how="semi")
        # the reader's tables let go of the rows left out too (they are most of a server partition's)
        self._tables = dataclasses.replace(self._tables, packets=kept, tcp_sack=self._frames["tcp_sack"],
                                           icmp_errors=self._frames["icmp_errors"])

    def release(self, keep, packet_columns) -> None:
        """Free what nothing will read any more, once every frame in ``keep`` is built: the other
        derived frames, the builders' memos (payload segments, UDP messages) and every column of
        ``packets`` but ``packet_columns`` (in the frame and in the reader's tables, which hold it
        too). What a scan does between building its detectors' frames and running them (issue 13:
        the packets frame alone is ~90 B per packet). Later requests for a frame not kept raise."""
        keep = set(keep) | set(READER_FRAMES)
        missing = sorted(n for n in keep if n not in self._frames)
        if missing:
            raise RuntimeError(f"release before these frames were built: {', '.join(missing)}")
        for name in set(self._frames) - keep:
            del self._frames[name]
            self._freed.add(name)
        self.forget_memos()
        self.narrow_packets(packet_columns)
        self._released = True

    def forget_memos(self) -> None:
        """Let go of the builders' memos (the TCP payload segments, the UDP packets) before what is built
        without them (``Protocol.from_frames``; :meth:`release` lets go of them too)."""
        self._memo.clear()

    def narrow_packets(self, packet_columns) -> None:
        """Keep only ``packet_columns`` of ``packets`` (in the frame and in the reader's tables, which
        hold it too), once nothing still to be built reads the others (``analyzer.packet_readers``
        builds what does first). A builder that reads a column narrowed away raises saying so."""
        narrow = self._frames["packets"].select(list(packet_columns))
        self._frames["packets"] = narrow
        self._tables = dataclasses.replace(self._tables, packets=narrow)
        self._narrowed = tuple(packet_columns)

    def thin_packets(self, silence_ns: int) -> None:
        """Keep of ``packets`` only (frame, ts_ns) of the rows its span and silences of ``silence_ns``
        need (``analyzer.kernels.silences``; ``SPAN_ONLY_NS``: the first and last), after
        :meth:`release`: what the caller of a scan in partitions keeps of every packet while they
        decode, besides their partitions (issue 13: 20 bytes a packet were 2 GB at 100M packets).
        :attr:`packet_count` still says how many there were."""
        if not self._released:
            raise RuntimeError("thin_packets before release(): the builders read every packet")
        count = self.packet_count
        self.narrow_packets(("frame", "ts_ns"))
        thinned = thinned_times(self._frames["packets"], silence_ns)
        self._frames["packets"] = thinned
        self._tables = dataclasses.replace(self._tables, packets=thinned)
        self._packet_count = count

    def plan_columns(self, frame_columns: dict) -> None:
        """Say, before they are built, what anything will read of some frames (frame -> its columns): a
        builder may build those alone (TCP analysis, ``tcp_segments``: ``analyzer.tcp``); a frame not
        named is built whole. What a scan knows from its readers' declarations (``detectors.run``, a
        partition's task), which narrow the frames to the same columns once built (:meth:`narrow_frame`)."""
        self._planned.update({name: frozenset(columns) for name, columns in frame_columns.items()})

    def planned_columns(self, name: str) -> frozenset[str] | None:
        """What :meth:`plan_columns` said will be read of frame ``name`` (None: all of it)."""
        return self._planned.get(name)

    def narrow_frame(self, name: str, columns) -> None:
        """Keep of the built frame ``name`` only its columns among ``columns``, in its own order (a scan,
        once its readers' declared columns are known: detectors.narrow_to_declared)."""
        self._frames[name] = columns_among(self._frames[name], columns)

    def drop(self, names) -> None:
        """Forget these frames (a scan, after the last detector that reads them)."""
        for name in names:
            if name not in READER_FRAMES and self._frames.pop(name, None) is not None:
                self._freed.add(name)

    def frame_names(self) -> list[str]:
        _load_builders()
        return sorted(set(self._frames) | set(FRAME_BUILDERS))

    def built_frames(self) -> dict[str, pl.DataFrame]:
        return dict(self._frames)

    def built_names(self) -> set[str]:
        """Every frame this capture has held, those a scan has since freed (release, drop) included."""
        return set(self._frames) | self._freed

    # -- lifetime ------------------------------------------------------------------------------
    def frames_by_file(self, frames) -> list[dict]:
        """This capture's frame numbers as ``[{"file": path, "frames": [numbers in that file]}]``,
        one entry per file that has any, in file order: what opens the right packets in Wireshark
        when several files were read as one capture."""
        numbers = np.asarray(frames, dtype=np.int64)
        if len(self.pieces) == 1:
            return [{"file": self.pieces[0][0], "frames": numbers.tolist()}] if numbers.size else []
        bases = np.array([base for _, base, _ in self.pieces], dtype=np.int64)
        piece = np.searchsorted(bases, numbers - 1, side="right") - 1
        out = []
        for k in np.unique(piece):
            path, base, _ = self.pieces[int(k)]
            out.append({"file": path, "frames": (numbers[piece == k] - base).tolist()})
        return out

    def forget_pages(self) -> None:
        """Give back the resident pages of the mapped files (:meth:`CaptureBytes.forget_pages`)."""
        self._data.forget_pages()

    def close(self) -> None:
        self._data.close()
        if self.reduction is not None:
            self.reduction.close()  # what it kept on disk (a record index)

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Capture({self.path!r}, {self.packet_count} packets, {self.report.format})"


def open_capture(path: str | os.PathLike, **options) -> Capture:
    """Read ``path`` (pcap, pcapng, optionally gzip-compressed) into a :class:`Capture`."""
    return Capture(path, **options)


def _merge_enum(frames: list[pl.DataFrame], columns: tuple[str, ...], enum: pl.DataType | None = None
                ) -> list[pl.DataFrame]:
    """``columns`` of ``frames`` cast to one Enum: ``enum``, or the sorted union of the values present."""
    if enum is not None:
        return [f.with_columns(pl.col(c).cast(pl.String).cast(enum) for c in columns) for f in frames]
    texts = set()
    for f in frames:
        for c in columns:
            texts.update(v for v in f[c].cast(pl.String).unique().to_list() if v is not None)
    enum = pl.Enum(sorted(texts))
    return [f.with_columns(pl.col(c).cast(pl.String).cast(enum) for c in columns) for f in frames]


# Two pieces further apart in time than this, and than the longest silence inside either of them, are
# reported as a gap: the files of a ring buffer follow one another, a missing file leaves a hole.
GAP_MIN_NS = 1_000_000_000


def _identity(path: str):
    """What makes two names the same file: device and inode (hard and symbolic links, ./x and x)."""
    if path == "-":
        return ("stdin",)
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.abspath(path))
    return (st.st_dev, st.st_ino)


def _distinct_files(paths) -> tuple[list[str], list[str]]:
    """The paths without repeats of a file already given, and a warning for each repeat."""
    first: dict[object, str] = {}
    kept, warnings = [], []
    for p in map(os.fspath, paths):
        key = _identity(p)
        if key in first:
            same = "given twice" if first[key] == p else f"the same file as {first[key]}"
            warnings.append(f"{p}: {same}; read once")
            continue
        first[key] = p
        kept.append(p)
    return kept, warnings


# what _drop_copies compares of two pieces' packets (read of several files whatever packet_columns says)
COPY_COLUMNS = ("ts_ns", "caplen", "wirelen")


def _drop_copies(caps: list[Capture], warnings: list[str]) -> list[Capture]:
    """Drop a piece whose packets (times and lengths) are those of an earlier piece: a copy."""
    kept: list[Capture] = []
    for c in caps:
        cols = COPY_COLUMNS
        twin = next((k for k in kept if k.packets.height == c.packets.height and c.packets.height
                     and k.packets.select(cols).equals(c.packets.select(cols))), None)
        if twin is None:
            kept.append(c)
        else:
            warnings.append(f"{c.path}: the same packets as {twin.path} (a copy?); read once")
            c.close()
    return kept


def _span(ns: int) -> str:
    return f"{ns / 1e9:,.3f} s" if ns >= 1_000_000 else f"{ns / 1e3:,.0f} µs"


def _longest_silence(cap: Capture) -> int:
    gaps = cap.packets["ts_ns"].sort().diff().max()
    return int(gaps) if gaps is not None else 0


def _time_warnings(caps: list[Capture]) -> list[str]:
    """Pieces (in time order) that overlap or leave a gap between them."""
    warnings = []
    timed = [c for c in caps if c.packets.height]
    for prev, nxt in zip(timed, timed[1:]):
        prev_last, next_first = int(prev.packets["ts_ns"].max()), int(nxt.packets["ts_ns"].min())
        if next_first < prev_last:
            warnings.append(f"{nxt.path} starts {_span(prev_last - next_first)} before {prev.path} ends: the "
                            f"pieces overlap in time (joined file after file, not interleaved)")
            continue
        gap = next_first - prev_last
        if gap > max(GAP_MIN_NS, _longest_silence(prev), _longest_silence(nxt)):
            warnings.append(f"no packets for {_span(gap)} between {prev.path} and {nxt.path}, longer than any "
                            f"silence inside them: a piece may be missing")
    return warnings


UNSELECTED = np.uint16(0xFFFF)  # ReadPart.ids of a packet the selection left out


@dataclasses.dataclass(frozen=True)
class ReadPart:
    """What reading one partition of a capture needs from a whole reading of it (``scan --partitions``,
    ``--workers``: the caller reads the files once, each partition's task then keeps only its packets; built by
    ``analyzer.partitions.read_part``). The part is the whole reading restricted to its packets: the
    same frame numbers, payload offsets, address Enums and interfaces."""

    pieces: tuple[tuple[str, int, int], ...]  # the whole reading's Capture.pieces, in its order
    ids: np.ndarray  # uint16 per frame of the whole reading (frame - 1): its partition, or UNSELECTED
    index: int  # the partition to keep
    interfaces: pl.DataFrame  # the whole reading's (its tick is inferred from every packet)
    address_types: dict[str, dict[str, pl.DataType]]  # frame -> column -> the whole reading's Enum
    # of the whole reading's packet times, keep those its span and silences this long need
    # (analyzer.kernels.silences: SPAN_ONLY_NS, the ends; None, every time)
    silence_ns: int | None = KEEP_EVERY_TIME
    # the whole reading's record index of its one file (analyzer.record_index): the part's rows are read
    # from it instead of walking the file (None: walked)
    record_index: object | None = None
    # False: the reader reads none of the whole reading's times (whole_times empty), so a part read from
    # the record index does not work them out (its ts_ns column: 800 MB at 100M packets)
    whole_times: bool = True
    # the partitions this process reads after this one, in order: their records are copied in the same
    # pass as this one's when the file is large (analyzer.packed_part)
    following: tuple[int, ...] = ()


def _frames_of(ids: np.ndarray, index: int) -> np.ndarray:
    """The frame numbers (1-based, ascending) of partition ``index``'s packets."""
    return np.flatnonzero(ids == index).astype(np.uint32) + 1


def _open_part(part: ReadPart, **options) -> Capture:
    """The files of ``part.pieces`` read keeping only partition ``part.index`` (``open_captures(part=)``)."""
    caps: list[Capture] = []
    try:
        for path, base, count in part.pieces:
            ids = part.ids[base:base + count]
            if part.record_index is not None and len(part.pieces) == 1:
                indexed = IndexedPart(part.record_index, _frames_of(ids, part.index), ids != UNSELECTED,
                                      part.whole_times, (path, part.index),
                                      lambda: (((path, k), _frames_of(ids, k)) for k in part.following))
                caps.append(open_capture(path, indexed=indexed, silence_ns=part.silence_ns, **options))
                continue
            caps.append(open_capture(path, kept=(ids == part.index, ids != UNSELECTED), silence_ns=part.silence_ns,
                                     **options))
    except BaseException:
        for c in caps:
            c.close()
        raise
    times = [c.whole_times.with_columns(pl.col("frame") + base) for c, (_, base, _) in zip(caps, part.pieces)]
    cap = caps[0] if len(caps) == 1 else _joined(caps, [base for _, base, _ in part.pieces], [], part.address_types)
    for name, types in part.address_types.items():  # the part interned only its own rows' addresses
        frame = cap.frame(name)
        recast = [pl.col(c).cast(pl.String).cast(t) for c, t in types.items() if frame.schema[c] != t]
        if recast and name == "packets":
            cap.restrict_packets(frame.with_columns(recast))
        elif recast:
            cap.set_frame(name, frame.with_columns(recast))
    cap.set_frame("interfaces", part.interfaces)
    cap.pieces = [tuple(p) for p in part.pieces]
    cap.whole_times = thinned_times(pl.concat(times), part.silence_ns)
    return cap


def open_captures(paths: list[str | os.PathLike], *, part: ReadPart | None = None, **options) -> Capture:
    """Several files read as one capture: the pieces of a ring buffer, joined in time order.

    The files are put in the order of their first timestamps and concatenated, not interleaved: frame
    numbers run on across files as in the output of ``mergecap -a`` on the files in that order, and
    :meth:`Capture.frames_by_file` turns them back into each file's own numbers;
    payload offsets index one buffer holding the files' bytes one after the other: the files mapped
    side by side (``analyzer.joined_map``: nothing copied, each file at a page boundary), or where that
    cannot be done a copy.

    A file named twice (or through another link) and a piece holding the same packets as another are
    read once; pieces that overlap in time, or leave a gap longer than :data:`GAP_MIN_NS` and than the
    longest silence inside them, are noted. Each case adds a line to the capture's ``warnings``.

    ``part``: read only one partition of files a whole reading already ordered and checked
    (:class:`ReadPart`; ``paths`` are then its pieces').
    """
    if part is not None:
        return _open_part(part, **options)
    paths, warnings = _distinct_files(paths)
    if options.get("reduce") is not None and len(paths) > 1:
        raise ValueError("a reduced reading (read_tables(reduce=)) is of one file: the joining of several "
                         "compares and renumbers their whole packets")
    if options.get("packet_columns") is not None and len(paths) > 1:  # what _drop_copies compares of the pieces
        options = {**options, "packet_columns": tuple(dict.fromkeys((*options["packet_columns"], *COPY_COLUMNS)))}
    caps: list[Capture] = []
    try:
        for p in paths:
            caps.append(open_capture(p, **options))
    except BaseException:
        for c in caps:
            c.close()
        raise
    caps = _drop_copies(caps, warnings)
    caps.sort(key=lambda c: (c.packets["ts_ns"].min() if c.packets.height else 0) or 0)
    warnings += _time_warnings(caps)
    if len(caps) == 1:
        caps[0].warnings = warnings
        return caps[0]
    return _joined(caps, None, warnings)


def _joined(caps: list[Capture], frame_bases: list[int] | None, warnings: list[str],
            address_types: dict[str, dict[str, pl.DataType]] | None = None) -> Capture:
    """``caps`` (closed here) as one capture: frames numbered on from piece to piece (from
    ``frame_bases``, or by each piece's packets), the bytes side by side, the addresses in one Enum
    (``address_types``' (ReadPart), or the values present) (open_captures)."""
    joined = join([c._data for c in caps])  # the files side by side in one mapping, or None: a copy
    bases = joined[1] if joined is not None else np.cumsum([0] + [len(c.buf) for c in caps[:-1]]).tolist()
    if frame_bases is None:
        frame_bases = np.cumsum([0] + [c.packets.height for c in caps[:-1]]).tolist()
    iface_base = 0
    packets, sacks, icmps, ifaces = [], [], [], []
    for k, c in enumerate(caps):
        buf_base, frame_base = bases[k], frame_bases[k]
        p = c.packets
        packets.append(p.with_columns(pl.col("frame") + frame_base, pl.col("payload_offset") + buf_base,
                                      pl.col("iface") + iface_base))
        sacks.append(c.frame("tcp_sack").with_columns(pl.col("frame") + frame_base))
        icmps.append(c.frame("icmp_errors").with_columns(pl.col("frame") + frame_base))
        ifaces.append(c.frame("interfaces").with_columns(pl.col("iface") + iface_base))
        iface_base += c.frame("interfaces").height
    types = address_types or {}
    packets = pl.concat(_merge_enum(packets, ("src", "dst"), types.get("packets", {}).get("src")))
    icmps = pl.concat(_merge_enum(icmps, ("inner_src", "inner_dst"), types.get("icmp_errors", {}).get("inner_src")))
    buf = joined[0] if joined is not None else np.concatenate([c.buf for c in caps])
    first = caps[0]
    report = ReadReport(format=" + ".join(c.report.format for c in caps), records=packets.height,
                        counts={}, parse_status={})
    for c in caps:
        for key, n in c.report.counts.items():
            report.counts[key] = report.counts.get(key, 0) + n
        for key, n in c.report.parse_status.items():
            report.parse_status[key] = report.parse_status.get(key, 0) + n
    tables = PacketTables(packets, pl.concat(sacks), icmps, pl.concat(ifaces), report, first.file_format,
                          first.section_info, address_dtype=packets.schema["src"])
    data = CaptureBytes("+".join(c.path for c in caps), buf, False, sum(c._data.file_size for c in caps),
                        mapped=joined is not None)
    merged = Capture(data.path, _parts=(data, tables))
    merged.reports = [(c.path, c.report) for c in caps]
    merged.files = [c.path for c in caps]
    merged.pieces = [(c.path, int(frame_bases[k]), c.packets.height) for k, c in enumerate(caps)]
    merged.warnings = warnings
    merged.columns = first.columns
    for c in caps:
        c.close()
    return merged
