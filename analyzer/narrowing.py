"""When a scan may narrow a decoder's frame to the columns read of it: as soon as nothing still to be
built reads the others.

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
"""
from __future__ import annotations

from typing import Callable

from .decoders.kerberos_ap_tokens import carrier_columns
from .decoders.registry import protocol_of_frame


def narrowing_as_built(cap, frames, frame_columns) -> Callable[[], None]:
    """A call that narrows each of ``frames`` named in ``frame_columns`` (frame -> the columns read of
    it) to those columns, what kerberos_ap's token sources and its protocol's server-state frames read of
    it, once it and every other frame of its protocol among ``frames`` that may read it whole are built
    (module doc); each frame once. Call it as the frames are built (``detectors.build_frames``), from
    one thread."""
    waiting: dict[str, list[str]] = {}  # frame -> the frames to be built first
    kept: dict[str, frozenset[str]] = {}  # frame -> the columns it keeps
    for name in frames:
        protocol = protocol_of_frame(name)
        if name not in frame_columns or protocol is None:
            continue
        kept[name] = frozenset(frame_columns[name]) | carrier_columns(name)
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
