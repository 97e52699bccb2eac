"""What is built from the wide columns of ``packets``, built first so that a scan can narrow ``packets``
before the decoders run (issue 13: on the 1M synth capture ``packets`` is 91 B a packet, held until
the detectors' frames are all built; the decoders read none of it).

Every frame is built from the capture's bytes and from these, which alone read ``packets`` beyond its
frame numbers and times:

- TCP analysis (``tcp_segments``, ``connections``, ``tcp_client_syns``) reads the TCP headers;
- the TCP framings read the payload segments, a memo of the TCP payloads' sequence numbers and
  places (``analyzer.tcp.framing``), whatever the ports (a decoder may frame connections to ports
  it learned);
- the UDP decoders read the UDP packets, a memo of their addresses, ports, fragments and places
  (``analyzer.messages``);
- :data:`PACKET_READING_FRAMES`' other frames read columns of their own (``pause_frames`` the MAC
  Control frames' lengths and interfaces, ``rocev2_packets`` the ECN bits).

:func:`build_packet_readers` builds those a set of frames depends on: a protocol's frames (the
decoder's declaration, ``analyzer.decoders.protocol``) on the TCP analysis and payload segments when
it has TCP ports, on the UDP packets when it has UDP ports, and on its own frames that read
``packets``. A frame builder that reads ``packets`` itself belongs in :data:`PACKET_READING_FRAMES`;
one that does not, and is narrowed away from, raises naming the frame (``Capture.frame``).
"""
from __future__ import annotations

from .decoders.registry import protocol_of_frame
from .messages import udp_packets
from .partitions import CONNECTION_FRAMES
from .tcp.framing import payload_segments

# frames whose builders read columns of packets beyond frame and ts_ns (module doc): TCP analysis's
# (the frames keyed by a connection) and two of their own
PACKET_READING_FRAMES = (*CONNECTION_FRAMES, "pause_frames", "rocev2_packets")


def packet_readers(frames) -> tuple[list[str], bool, bool]:
    """What ``frames`` depend on of what reads ``packets``: the frames of :data:`PACKET_READING_FRAMES`,
    and whether the TCP payload segments and the UDP packets are read."""
    wanted: dict[str, None] = {}
    payloads = udp = False
    for name in frames:
        if name in PACKET_READING_FRAMES:
            wanted[name] = None
        protocol = protocol_of_frame(name)
        if protocol is None:
            continue
        if protocol.tcp_ports or protocol.tcp_framing:
            wanted.update(dict.fromkeys(("connections", "tcp_segments")))
            payloads = True
        if protocol.udp_ports:
            udp = True
        wanted.update(dict.fromkeys(f for f in protocol.frames if f in PACKET_READING_FRAMES))
    return list(wanted), payloads, udp


def narrow_after_readers(cap, packet_columns, frame_columns) -> None:
    """Once :func:`build_packet_readers` has run: ``packets`` narrowed to ``packet_columns``, and each
    packet-reading frame built so far to its entry in ``frame_columns`` (frame -> the columns still
    read of it; a frame not named stays whole). Only those frames: what is built from them is built,
    while a frame built earlier may still be read whole by a builder to come (kerberos_ap reads
    smb2_messages)."""
    cap.narrow_packets(packet_columns)
    for name, kept in frame_columns.items():
        if name in PACKET_READING_FRAMES and cap.built(name):
            cap.narrow_frame(name, kept)


def build_packet_readers(cap, frames, frame_columns=None) -> None:
    """Build what the frames of ``frames`` not built yet depend on of what reads ``packets`` (module
    doc), so that ``cap.narrow_packets`` can drop the columns nothing else reads. ``frame_columns``:
    what :func:`narrow_after_readers` will keep of them (frame -> columns), said first to their
    builders (``Capture.plan_columns``), which may build no more."""
    if frame_columns:
        cap.plan_columns({name: kept for name, kept in frame_columns.items() if name in PACKET_READING_FRAMES})
    readers, payloads, udp = packet_readers([f for f in frames if not cap.built(f)])
    for name in readers:
        cap.frame(name)
    if payloads:
        payload_segments(cap)
    if udp:
        udp_packets(cap)
