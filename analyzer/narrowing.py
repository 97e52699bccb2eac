"""When a scan (or ``stats``) may narrow a decoder's frame to the columns read of it: as soon as nothing
still to be built reads the others.

A scan narrows each frame to what its readers (the detectors, the population step) declare
(``detectors.narrow_to_declared``), and used to do it once every frame was built. A decoder's messages
frame is wide (``dns_messages``: 45 columns, of which the detectors read 12) because its transactions
are paired from it; the other decoders' frames were built meanwhile, several at once
(``analyzer.threads``), with it held whole. Of the builders, only a protocol's own read its frames
(``Protocol.frames``), and kerberos_ap, which reads its carriers' messages frames through a token
source that keeps the columns it reads (:func:`analyzer.decoders.kerberos_ap_tokens.carrier_columns`).
A protocol's frame built from its frames alone that declares what it reads of one
(``Protocol.server_frame_columns``: SMB2's breaks, of ``smb2_messages``) need not be waited for
either: those columns are kept. So a frame may be narrowed once every other frame of its protocol that
is to be built, and reads it whole, is built, keeping those columns too (:func:`narrowing_as_built`).
On the 1M synth capture the scan's peak anonymous memory fell from 403-410 to 381-387 MB on 2 threads
and from 396-402 to 358-369 MB on one (``dns_messages`` and ``ldap_messages`` narrowed while SMB2 and
kerberos_ap are built; README, "Speed and memory"); the findings are the same.

A caller that frees what it did not ask for once the frames are built (``Capture.release``) may have the
frames of their protocols it did not ask for, built as what those are built of, narrowed by the same
rule to what the others read of them (``others``): ``stats`` asks for the transactions frames alone,
and ``dns_messages`` (45 columns) is then let go of once ``dns_transactions`` is built, not held while
LDAP and SMB2 are decoded (``analyzer.stats.decode_at_once``).
"""
from __future__ import annotations

import functools
from typing import Callable

from .decoders.kerberos_ap_tokens import carrier_columns
from .decoders.registry import protocol_of_frame
from .packet_readers import build_packet_readers, narrow_after_readers
from .threads import run_each


def narrowing_as_built(cap, frames, frame_columns, others: bool = False) -> Callable[[], None]:
    """A call that narrows each of ``frames`` named in ``frame_columns`` (frame -> the columns read of
    it) to those columns, what kerberos_ap's token sources and its protocol's server-state frames read of
    it, once it and every other frame of its protocol among ``frames`` that may read it whole are built
    (module doc); each frame once. ``others``: the frames of those protocols not among ``frames`` too, as
    if named with no column (what kerberos_ap and the server-state frames read of them is kept), for a
    caller that frees them afterwards (module doc). Call it as the frames are built
    (:func:`build_frames`), from one thread."""
    waiting: dict[str, list[str]] = {}  # frame -> the frames to be built first
    kept: dict[str, frozenset[str]] = {}  # frame -> the columns it keeps
    extras = [f for p in dict.fromkeys(filter(None, map(protocol_of_frame, frames))) for f in p.frames
              if f not in frames] if others else []
    read_of = {**dict.fromkeys(extras, ()), **frame_columns}
    for name in (*frames, *extras):
        protocol = protocol_of_frame(name)
        if name not in read_of or protocol is None:
            continue
        kept[name] = frozenset(read_of[name]) | carrier_columns(name)
        waiting[name] = []
        for other in (f for f in frames if f in protocol.frames and f != name):
            if name in protocol.server_frames.get(other, ()) and name in protocol.server_frame_columns:
                kept[name] |= frozenset(protocol.server_frame_columns[name])  # what other reads of it
            else:
                waiting[name].append(other)

    def narrow_built() -> None:
        for name, builds in list(waiting.items()):
            if cap.built(name) and all(cap.built(f) for f in builds):
                cap.narrow_frame(name, kept[name])
                del waiting[name]
    return narrow_built


def build_frames(capture, names, narrow: dict[str, frozenset[str]] | None = None, others: bool = False) -> None:
    """Build the frames ``names`` (a scan's or ``stats``'s, before ``Capture.release``), several at once
    (``analyzer.threads``): those a decoder makes from its other frames alone (``Protocol.from_frames``)
    last, once the others are built and the builders' memos let go of (``Capture.forget_memos``), so
    that they are not held while those are built (the TCP payload segments: 80 MB of the SMB2 server's
    partition of the 10M synth capture while its breaks pair, the partition's peak). ``narrow`` (frame
    -> the columns read of it: ``detectors.declared_columns_of``): each of those frames narrowed to them
    as soon as nothing still to be built reads the others, and with ``others`` the frames of their
    protocols not among ``names`` too, for a caller that frees those afterwards (:func:`narrowing_as_built`)."""
    last = [n for n in names if (p := protocol_of_frame(n)) is not None and n in p.from_frames]
    narrow_built = narrowing_as_built(capture, names, narrow or {}, others)
    narrow_built()  # what was built before (a caller's own frames: a test's, the dashboard's)
    run_each([functools.partial(capture.frame, n) for n in names if n not in last], done=lambda _: narrow_built())
    if last:
        capture.forget_memos()
        run_each([functools.partial(capture.frame, n) for n in last], done=lambda _: narrow_built())


def build_and_release(capture, names, packet_columns, frame_columns, others: bool = False) -> None:
    """Build the frames ``names`` and free the rest of ``capture``, holding as little as it goes (issue
    13; a scan's detectors' frames, ``stats``'s transactions): what reads ``packets`` first
    (``analyzer.packet_readers``: TCP analysis told what is read of ``tcp_segments``), then ``packets``
    narrowed to ``packet_columns`` and those frames to their entries in ``frame_columns`` (frame -> the
    columns read of it); the frames several at once, each narrowed to its entry as soon as nothing still
    to be built reads the rest (:func:`build_frames`, with ``others``); then the other frames, the
    builders' memos and the other columns of ``packets`` freed (``Capture.release``)."""
    build_packet_readers(capture, names, frame_columns)
    narrow_after_readers(capture, packet_columns, frame_columns)
    build_frames(capture, names, frame_columns, others)
    capture.release(names, packet_columns)
